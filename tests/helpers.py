"""Test helpers: the backends to run on, random inputs, and per-dtype tolerances (in one place)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

# Relative error ||x - ref|| / ||ref|| allowed against the float64 reference, per input dtype.
# 16-bit inputs compute in float32 but round their outputs (and input cotangents) to 16 bits.
FORWARD_RTOL = {"float64": 1e-10, "float32": 2e-5, "float16": 4e-3, "bfloat16": 2.5e-2}
GRAD_RTOL = {"float64": 1e-9, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}
# ssd's allow_tf32 (float32 products as single TF32 products, 11 significant bits): the
# outputs' and the gradients' bounds ("sums": the per-head gradients of A and dt_bias, sums
# over every step of terms that largely cancel, so their relative errors are some 100x the
# products'), and the error below which the products were not TF32
TF32_RTOL = {"forward": 4e-3, "grad": 1.6e-2, "sums": 1e-1, "at_least": 2e-5}
TF32_SUM_FIELDS = ("A", "dt_bias")


@functools.lru_cache(maxsize=None)
def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def backends():
    """pytest params: 'cpu' always, 'gpu' marked and skipped where no GPU is present."""
    return [
        pytest.param("cpu", id="cpu"),
        pytest.param("gpu", id="gpu", marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")]),
    ]


def xp_for(backend):
    if backend == "gpu":
        import cupy

        return cupy
    return np


def to_numpy(x):
    if x is None:
        return None
    if type(x).__module__.split(".")[0] == "cupy":
        x = x.get()
    return np.asarray(x)


def as_dtype(x, dtype_name):
    """A float64 NumPy array rounded to ``dtype_name`` (bfloat16 through ml_dtypes)."""
    if dtype_name == "bfloat16":
        import ml_dtypes

        return x.astype(ml_dtypes.bfloat16)
    return x.astype(dtype_name)


def rel_err(x, ref):
    x = to_numpy(x).astype(np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert x.shape == ref.shape, (x.shape, ref.shape)
    assert np.all(np.isfinite(x)), "non-finite values in the result"
    denom = np.linalg.norm(ref)
    return np.linalg.norm(x - ref) / (denom if denom > 0 else 1.0)


def random_scan_inputs(rng, *, batch, dim, L, N, b_form="step", c_form="step", groups=1,
                       with_D=True, with_z=True, with_bias=True, softplus=True,
                       with_init=False):
    """Fresh float64 inputs for a selective scan, in sane ranges (A < 0, dt > 0).

    ``b_form``/``c_form``: "const" (dim, N), "step" (batch, N, L), "group" (batch, G, N, L).
    """
    def bc(form):
        shape = {"const": (dim, N), "step": (batch, N, L), "group": (batch, groups, N, L)}[form]
        return rng.standard_normal(shape)

    if softplus:
        delta = rng.standard_normal((batch, dim, L)) * 0.7 - 1.0
    else:
        delta = rng.uniform(0.01, 0.4, (batch, dim, L))
    return dict(
        u=rng.standard_normal((batch, dim, L)),
        delta=delta,
        A=-np.exp(rng.standard_normal((dim, N)) * 0.5),
        B=bc(b_form),
        C=bc(c_form),
        D=rng.standard_normal(dim) if with_D else None,
        z=rng.standard_normal((batch, dim, L)) if with_z else None,
        delta_bias=rng.standard_normal(dim) * 0.1 if with_bias else None,
        initial_state=rng.standard_normal((batch, dim, N)) if with_init else None,
    )


def cast_inputs(inputs, dtype_name, xp):
    """Inputs for the fast path: u, delta, z, B, C in ``dtype_name``; parameters in float32/64.

    Returns the cast inputs and the float64 values they hold (what the reference sees).
    """
    param = "float64" if dtype_name == "float64" else "float32"
    cast, exact = {}, {}
    for name, x in inputs.items():
        if x is None:
            cast[name] = exact[name] = None
            continue
        dt = dtype_name if name in ("u", "delta", "z", "B", "C") else param
        low = as_dtype(x, dt)
        exact[name] = low.astype(np.float64)
        cast[name] = xp.asarray(low) if xp is not np else low
    return cast, exact


def ssd_walk_blob_outputs(blob, shape, chunk):
    """The outputs before D and the gate (batch, L, H, P) that the SSD forward's WALK form
    writes to its yblob (``_Layout.walk_blob``; chunks of ``chunk`` steps, no restarts), as
    ``ssd_mma_blob_at`` lays them: per block (b, h, 64 columns p) and 64-step tile of its
    row (tiles never cross a chunk's end), warp w, y^T tile j, lane (g, t4) and entry i, the
    value at p = 16 w + g + 8 (i >= 2) and step 8 j + 2 t4 + i % 2 of the tile."""
    blob = to_numpy(blob)
    batch, L, H, P = shape
    pt = -(-P // 64)
    v = blob.reshape(batch, H, pt, -1, 4, 8, 8, 4, 2, 2)  # (.., tile, w, j, g, t4, i // 2, i % 2)
    v = v.transpose(0, 3, 5, 7, 9, 1, 2, 4, 8, 6)  # b, tile, j, t4, i % 2 | h, pt, w, i // 2, g
    v = v.reshape(batch, v.shape[1], 64, H, pt * 64)
    y = np.empty(shape, np.float32)
    t0, k = 0, 0
    while t0 < L:
        t1 = min(t0 + 64, t0 // chunk * chunk + chunk, L)
        y[:, t0:t1] = v[:, k, :t1 - t0, :, :P]
        t0, k = t1, k + 1
    return y


def assert_directional_derivatives(objective, exact, grads, rng, fields, eps=1e-6, tol=1e-5):
    """<grads.field, v> equals the central difference of ``objective`` (float64 inputs
    ``exact`` -> scalar) along a random direction v, for every field present in ``exact``."""
    for name in fields:
        if exact[name] is None:
            continue
        v = rng.standard_normal(exact[name].shape)
        plus = objective(dict(exact, **{name: exact[name] + eps * v}))
        minus = objective(dict(exact, **{name: exact[name] - eps * v}))
        fd = (plus - minus) / (2 * eps)
        analytic = np.sum(to_numpy(getattr(grads, name)) * v)
        assert abs(fd - analytic) <= tol * (1 + abs(fd)), (name, fd, analytic)


def check_scan_vjp_against_fd(xp, case, chunk, seed, fields, fast=None, ref=None):
    """selective_scan_vjp's pullback of random cotangents (of y and the final state) against
    central differences of the float64 reference, for a ``random_scan_inputs`` case;
    ``fast`` / ``ref``: extra arguments of the call and of the reference."""
    import ssmkit
    from ssmkit import reference

    rng = np.random.default_rng(seed)
    inputs, exact = cast_inputs(random_scan_inputs(rng, **case), "float64", xp)
    kw = dict(delta_softplus=case.get("softplus", True), return_final_state=True)
    (y, h), pullback = ssmkit.selective_scan_vjp(**inputs, **kw, chunk_size=chunk, **(fast or {}))
    dy, dh = rng.standard_normal(y.shape), rng.standard_normal(h.shape)
    grads = pullback(xp.asarray(dy), xp.asarray(dh))

    def objective(args):
        y, h = reference.selective_scan(**args, **kw, **(ref or {}))
        return np.sum(y * dy) + np.sum(h * dh)

    assert_directional_derivatives(objective, exact, grads, rng, fields)
