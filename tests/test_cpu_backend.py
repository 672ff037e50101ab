"""The CPU backend (``ssmkit._cpu.selective_scan``) against the float64 reference.

Problems are built directly in the canonical form the public layer hands to a
backend (:class:`ssmkit._problem.SelectiveScanProblem`, NumPy, C-contiguous),
on fresh random inputs, and every output of the forward and of the backward is
compared with :func:`ssmkit.reference.selective_scan_vjp`. Tiny chunk sizes
make the checkpoint carries run on short sequences.

The first call of each dtype compiles the kernels (Numba caches them on disk),
hence ``deadline=None`` throughout.
"""

from __future__ import annotations

import dataclasses
import inspect

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ssmkit import reference
from ssmkit._cpu import selective_scan as cpu
from ssmkit._problem import SelectiveScanProblem

GRAD_FIELDS = ("u", "delta", "z", "A", "B", "C", "D", "delta_bias", "initial_state")
# norm-wise relative error allowed, by compute dtype
RTOL = {np.dtype(np.float64): 1e-9, np.dtype(np.float32): 1e-4}

CONST = 0  # B/C form: (dim, N); an integer G >= 1 means (batch, G, N, L)


def make_problem(seed, *, batch=2, dim=6, N=3, L=7, io=np.float64, compute=None,
                 bc=None, B_form=CONST, C_form=CONST, D=True, z=True, bias=True,
                 softplus=True, h0=True, chunk=3, big_delta=False):
    """A random SelectiveScanProblem in canonical layout.

    A is negative and dt moderate, so the states neither vanish nor blow up.
    ``big_delta`` puts some raw dt above the softplus threshold of 20.
    """
    rng = np.random.default_rng(seed)
    io = np.dtype(io)
    cd = np.dtype(compute) if compute is not None else io
    bc = np.dtype(bc) if bc is not None else cd

    def arr(shape, dtype, scale=1.0):
        return np.ascontiguousarray(scale * rng.standard_normal(shape), dtype=dtype)

    def bc_array(form):
        return arr((dim, N) if form == CONST else (batch, form, N, L), bc)

    if softplus:
        delta = 0.5 * rng.standard_normal((batch, dim, L))
        if big_delta:
            delta[rng.random(delta.shape) < 0.3] = 25.0 + rng.random()
            delta[..., 0] = 19.95  # just below the threshold, after a small bias
        bias_ = 0.3 * rng.standard_normal(dim)
    else:  # dt is delta + bias as it is: keep it positive
        delta = 0.05 + 0.5 * np.abs(rng.standard_normal((batch, dim, L)))
        bias_ = 0.1 * np.abs(rng.standard_normal(dim))
    if big_delta and bias:
        bias_ = 0.01 * np.abs(bias_)
    return SelectiveScanProblem(
        u=arr((batch, dim, L), io),
        delta=np.ascontiguousarray(delta, dtype=io),
        A=np.ascontiguousarray(-np.exp(rng.standard_normal((dim, N))), dtype=cd),
        B=bc_array(B_form),
        C=bc_array(C_form),
        D=arr(dim, cd) if D else None,
        z=arr((batch, dim, L), io) if z else None,
        delta_bias=np.ascontiguousarray(bias_, dtype=cd) if bias else None,
        delta_softplus=softplus,
        initial_state=arr((batch, dim, N), cd) if h0 else None,
        chunk_size=chunk,
        xp=np,
    )


def cotangents(p, seed, dfinal=True):
    rng = np.random.default_rng(seed + 1)
    dout = np.ascontiguousarray(rng.standard_normal(p.u.shape), dtype=p.io_dtype)
    dfin = (np.ascontiguousarray(rng.standard_normal((p.batch, p.dim, p.N)),
                                 dtype=p.compute_dtype) if dfinal else None)
    return dout, dfin


def run_cpu(p, dout, dfinal):
    y, final, ckpt = cpu.selective_scan_forward(p, save_checkpoints=True)
    grads = cpu.selective_scan_backward(p, ckpt, dout, dfinal)
    return y, final, ckpt, grads


def run_reference(p, dout, dfinal):
    (y, final), pullback = reference.selective_scan_vjp(
        p.u, p.delta, p.A, p.B, p.C, p.D, p.z, p.delta_bias, p.delta_softplus,
        initial_state=p.initial_state, return_final_state=True)
    return y, final, pullback(dout, dfinal)


def rel_err(actual, expected):
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    scale = np.linalg.norm(expected)
    return np.linalg.norm(actual - expected) / (scale if scale > 0 else 1.0)


INPUT_FIELDS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state")


def perturbed(p, seed):
    """``p`` with every input entry moved by one unit of roundoff of its dtype, up or down."""
    rng = np.random.default_rng(seed)
    moved = {}
    for name in INPUT_FIELDS:
        a = getattr(p, name)
        if a is not None:
            sign = np.where(rng.random(a.shape) < 0.5, -1.0, 1.0)
            moved[name] = np.ascontiguousarray(a * (1.0 + sign * np.finfo(a.dtype).eps / 2),
                                               dtype=a.dtype)
    return dataclasses.replace(p, **moved)


def check_against_reference(p, dfinal=True, seed=0):
    """Forward and every gradient of the CPU backend against the reference.

    Each output may differ from the reference by RTOL, or by 4 times as much as the
    reference itself moves when the inputs move by roundoff, where that is more. The
    second bound is for sums that cancel: dA of one channel over a few steps can be
    a thousandth of its terms, and then no float32 computation gets within RTOL.
    """
    dout, dfin = cotangents(p, seed, dfinal)
    y, final, ckpt, grads = run_cpu(p, dout, dfin)
    y_ref, final_ref, grads_ref = run_reference(p, dout, dfin)
    y_mov, final_mov, grads_mov = run_reference(perturbed(p, seed), dout, dfin)
    rtol = RTOL[p.compute_dtype]

    assert y.shape == y_ref.shape and y.dtype == p.io_dtype
    assert final.shape == final_ref.shape and final.dtype == p.compute_dtype
    assert ckpt.shape == (p.batch, p.dim, p.n_chunks, p.N)
    assert ckpt.dtype == p.compute_dtype
    errors = {"y": rel_err(y, y_ref), "final_state": rel_err(final, final_ref)}
    tols = {"y": max(rtol, 4 * rel_err(y_mov, y_ref)),
            "final_state": max(rtol, 4 * rel_err(final_mov, final_ref))}
    for name in GRAD_FIELDS:
        given_arr = getattr(p, name)
        got, want = grads[name], getattr(grads_ref, name)
        if given_arr is None:
            assert got is None, name
            continue
        assert got.shape == given_arr.shape, name
        expected_dtype = p.io_dtype if name in ("u", "delta", "z") else p.compute_dtype
        assert got.dtype == expected_dtype, name
        errors[name] = rel_err(got, want)
        tols[name] = max(rtol, 4 * rel_err(getattr(grads_mov, name), want))
    bad = {k: (v, tols[k]) for k, v in errors.items() if not v <= tols[k]}
    assert not bad, f"relative errors above their bounds (error, bound): {bad}"


# --------------------------------------------------------------------------------------
# Against the reference
# --------------------------------------------------------------------------------------

@st.composite
def problems(draw):
    dim = draw(st.sampled_from([1, 2, 3, 4, 6, 12]))
    groups = [g for g in range(1, dim + 1) if dim % g == 0]
    forms = st.sampled_from([CONST] + groups)
    return dict(
        seed=draw(st.integers(0, 2**32 - 1)),
        io=draw(st.sampled_from([np.float32, np.float64])),
        batch=draw(st.integers(1, 2)),
        dim=dim,
        N=draw(st.integers(1, 5)),
        L=draw(st.sampled_from([1, 2, 3, 5, 7, 11, 13, 17, 31])),
        chunk=draw(st.sampled_from([1, 2, 3, 5, 8, 256])),
        B_form=draw(forms),
        C_form=draw(forms),
        D=draw(st.booleans()),
        z=draw(st.booleans()),
        bias=draw(st.booleans()),
        softplus=draw(st.booleans()),
        h0=draw(st.booleans()),
    )


@settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(kw=problems(), dfinal=st.booleans())
def test_matches_reference(kw, dfinal):
    check_against_reference(make_problem(**kw), dfinal=dfinal, seed=kw["seed"])


FORMS = [CONST, 1, 3]


@pytest.mark.parametrize("io", [np.float32, np.float64])
@pytest.mark.parametrize("C_form", FORMS)
@pytest.mark.parametrize("B_form", FORMS)
def test_every_bc_form(io, B_form, C_form):
    # every pairing of (dim, N), one group and several groups, B and C apart
    p = make_problem(10 * B_form + C_form, batch=2, dim=6, N=4, L=13, io=io,
                     B_form=B_form, C_form=C_form, chunk=3)
    check_against_reference(p)


@pytest.mark.parametrize("io", [np.float32, np.float64])
@pytest.mark.parametrize("B_form, C_form", [(2, 3), (3, 2)])
def test_groups_of_b_and_c_not_nested(io, B_form, C_form):
    # groups of 3 channels in one, of 2 in the other: neither holds a group of the
    # other, so a backward unit must own all six channels
    p = make_problem(5, batch=2, dim=6, N=3, L=11, io=io, B_form=B_form,
                     C_form=C_form, chunk=2)
    check_against_reference(p)


@pytest.mark.parametrize("io", [np.float32, np.float64])
@pytest.mark.parametrize("batch, dim, B_form, C_form, L, chunk", [
    (1, 200, 1, 2, 37, 5),        # blocks of 64 + 36 lanes, four slices adding dB/dC
    (2, 130, CONST, CONST, 19, 4),  # a block of 2 lanes after two full ones
    (1, 96, 32, CONST, 23, 7),    # three lanes per group
    (3, 72, 1, 1, 29, 3),
])
def test_many_channels(io, batch, dim, B_form, C_form, L, chunk):
    p = make_problem(dim + L, batch=batch, dim=dim, N=5, L=L, io=io,
                     B_form=B_form, C_form=C_form, chunk=chunk)
    check_against_reference(p)


@pytest.mark.parametrize("io", [np.float32, np.float64])
@pytest.mark.parametrize("L, chunk", [(1, 1), (1, 256), (2, 1), (64, 64), (65, 64),
                                      (200, 64), (67, 5),
                                      (600, 512), (300, 4096)])  # tiles of 256 in a chunk
def test_lengths_and_chunks(io, L, chunk):
    p = make_problem(L * 1000 + chunk, batch=1, dim=5, N=4, L=L, io=io,
                     B_form=1, C_form=CONST, chunk=chunk)
    check_against_reference(p)


@pytest.mark.parametrize("io", [np.float32, np.float64])
def test_nothing_optional(io):
    p = make_problem(3, io=io, D=False, z=False, bias=False, softplus=False, h0=False,
                     B_form=1, C_form=2)
    check_against_reference(p, dfinal=False)


@pytest.mark.parametrize("io", [np.float32, np.float64])
def test_softplus_threshold(io):
    # raw dt above 20 passes through unchanged and has derivative 1
    p = make_problem(4, io=io, L=17, big_delta=True, B_form=1, C_form=CONST)
    check_against_reference(p)


@pytest.mark.parametrize("B_bc, C_bc", [(np.float32, np.float32), (np.float64, np.float32)])
def test_io_float32_compute_float64(B_bc, C_bc):
    # the contract allows a wider compute dtype than the io dtype, and B/C in either
    p = make_problem(6, io=np.float32, compute=np.float64, bc=B_bc, B_form=2, C_form=CONST)
    p = dataclasses.replace(p, C=p.C.astype(C_bc))
    dout, dfin = cotangents(p, 6)
    y, final, ckpt, grads = run_cpu(p, dout, dfin)
    assert y.dtype == np.float32 and final.dtype == np.float64 and ckpt.dtype == np.float64
    for name in GRAD_FIELDS:
        want = np.float32 if name in ("u", "delta", "z") else np.float64
        assert grads[name].dtype == want, name
    # computed in float64 from float32 inputs: only the final rounding to float32
    y_ref, final_ref, grads_ref = run_reference(p, dout, dfin)
    assert rel_err(y, y_ref) < 1e-6
    assert rel_err(final, final_ref) < 1e-9
    for name in GRAD_FIELDS:
        tol = 1e-6 if name in ("u", "delta", "z") else 1e-9
        assert rel_err(grads[name], getattr(grads_ref, name)) < tol, name


# --------------------------------------------------------------------------------------
# Checkpoints, chunking, determinism
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("io", [np.float32, np.float64])
@pytest.mark.parametrize("h0", [False, True])
def test_checkpoints_are_states_at_chunk_starts(io, h0):
    p = make_problem(7, batch=2, dim=6, N=3, L=23, io=io, B_form=2, C_form=1,
                     h0=h0, chunk=5)
    _, final, ckpt = cpu.selective_scan_forward(p, save_checkpoints=True)
    assert ckpt.shape == (2, 6, 5, 3)
    rtol = RTOL[p.compute_dtype]
    for c in range(p.n_chunks):
        t = c * p.chunk_size
        if t == 0:
            want = p.initial_state if h0 else np.zeros((2, 6, 3))
        else:
            def prefix(X):
                return X[..., :t] if X.ndim == 4 else X
            _, want = reference.selective_scan(
                p.u[..., :t], p.delta[..., :t], p.A, prefix(p.B), prefix(p.C), p.D,
                p.z[..., :t], p.delta_bias, p.delta_softplus,
                initial_state=p.initial_state, return_final_state=True)
        assert rel_err(ckpt[:, :, c], want) <= rtol, c
    y, final_again, none = cpu.selective_scan_forward(p, save_checkpoints=False)
    assert none is None
    np.testing.assert_array_equal(final_again, final)


@pytest.mark.parametrize("io", [np.float32, np.float64])
def test_results_do_not_depend_on_chunk_size(io):
    L = 41
    base = make_problem(8, batch=2, dim=6, N=4, L=L, io=io, B_form=3, C_form=CONST)
    dout, dfin = cotangents(base, 8)
    results = []
    for chunk in (1, 2, 3, 5, 16, 40, 41, 256):
        p = dataclasses.replace(base, chunk_size=chunk)
        results.append((chunk, run_cpu(p, dout, dfin)))
    (_, (y0, f0, _, g0)) = results[0]
    tol = 1e-12 if io == np.float64 else 1e-5
    for chunk, (y, f, ckpt, g) in results[1:]:
        # each step's arithmetic is the same whatever the chunking: the forward
        # agrees to the bit; the backward only sums dD and ddelta_bias in another order
        np.testing.assert_array_equal(y, y0, err_msg=f"chunk {chunk}")
        np.testing.assert_array_equal(f, f0, err_msg=f"chunk {chunk}")
        for name in GRAD_FIELDS:
            assert rel_err(g[name], g0[name]) <= tol, (chunk, name)


@settings(deadline=None, max_examples=20, suppress_health_check=[HealthCheck.too_slow])
@given(kw=problems(), run=st.integers(1, 6), dfinal=st.booleans())
def test_backward_on_finer_checkpoints(kw, run, dfinal):
    """A chunk whose backward scratch would pass _WHOLE_CHUNK_BYTES runs on finer
    checkpoints (``run`` steps apart, forced here through the two byte limits): the same
    gradients as on the forward's own checkpoints."""
    p = make_problem(**kw)
    dout, dfin = cotangents(p, kw["seed"], dfinal)
    y, final, ckpt, whole = run_cpu(p, dout, dfin)
    lanes = cpu._blocking(p)[-1]
    per_step = cpu._scratch_step_bytes(p, lanes)
    launched = []  # the chunk size each backward launch was given
    kernel = cpu._backward_kernel
    at = list(inspect.signature(kernel.py_func).parameters).index("chunk")

    def spy(*args):
        launched.append(args[at])
        return kernel(*args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu, "_WHOLE_CHUNK_BYTES", 0)
        mp.setattr(cpu, "_RUN_BYTES", run * per_step)
        mp.setattr(cpu, "_backward_kernel", spy)
        finer = cpu.selective_scan_backward(p, ckpt, dout, dfin)
    assert len(launched) == 1 and min(launched[0], p.L) == min(run, p.chunk_size, p.L)
    tol = 1e-12 if p.compute_dtype == np.float64 else 1e-5
    for name in GRAD_FIELDS:
        if whole[name] is None:
            assert finer[name] is None, name
        else:
            assert rel_err(finer[name], whole[name]) <= tol, name


@pytest.mark.parametrize("B_form, C_form", [(1, 2), (CONST, CONST), (4, CONST)])
def test_deterministic_over_runs_and_thread_counts(B_form, C_form):
    p = make_problem(9, batch=1, dim=160, N=4, L=29, io=np.float32, B_form=B_form,
                     C_form=C_form, chunk=4)
    dout, dfin = cotangents(p, 9)
    before = numba.get_num_threads()
    outputs = []
    try:
        for threads in sorted({1, before}) * 2:
            numba.set_num_threads(threads)
            outputs.append(run_cpu(p, dout, dfin))
    finally:
        numba.set_num_threads(before)
    y0, f0, c0, g0 = outputs[0]
    for y, f, c, g in outputs[1:]:
        np.testing.assert_array_equal(y, y0)
        np.testing.assert_array_equal(f, f0)
        np.testing.assert_array_equal(c, c0)
        for name in GRAD_FIELDS:
            np.testing.assert_array_equal(g[name], g0[name], err_msg=name)


@pytest.mark.parametrize("batch, dim, B_form", [(1, 64, 1), (1, 40, CONST), (2, 16, 2)])
def test_forward_narrows_blocks_for_threads(batch, dim, B_form):
    # fewer blocks than threads: the forward halves its block width (_forward_lanes);
    # the results must not move by a bit
    p = make_problem(batch * dim, batch=batch, dim=dim, N=5, L=70, io=np.float32,
                     B_form=B_form, C_form=1, chunk=16)
    *_, fine, _, lanes = cpu._blocking(p)
    assert cpu._forward_lanes(batch, dim, fine, lanes, 1) == lanes
    assert cpu._forward_lanes(batch, dim, fine, lanes, 64) == 8
    before = numba.get_num_threads()
    outputs = []
    try:
        for threads in sorted({1, before}):
            numba.set_num_threads(threads)
            outputs.append(cpu.selective_scan_forward(p, save_checkpoints=True))
    finally:
        numba.set_num_threads(before)
    for out in outputs[1:]:
        for a, b in zip(out, outputs[0]):
            np.testing.assert_array_equal(a, b)
    check_against_reference(p)


def test_backward_without_checkpoints_recomputes_them():
    p = make_problem(11, B_form=1, C_form=2, L=13, chunk=4)
    dout, dfin = cotangents(p, 11)
    _, _, _, grads = run_cpu(p, dout, dfin)
    again = cpu.selective_scan_backward(p, None, dout, dfin)
    for name in GRAD_FIELDS:
        np.testing.assert_array_equal(again[name], grads[name], err_msg=name)


def test_zero_dfinal_state_equals_none():
    p = make_problem(12, B_form=CONST, C_form=1, L=9, chunk=2)
    dout, _ = cotangents(p, 12)
    _, _, ckpt = cpu.selective_scan_forward(p, save_checkpoints=True)
    with_none = cpu.selective_scan_backward(p, ckpt, dout, None)
    with_zero = cpu.selective_scan_backward(p, ckpt, dout, np.zeros((2, 6, 3)))
    for name in GRAD_FIELDS:
        np.testing.assert_array_equal(with_none[name], with_zero[name], err_msg=name)


# --------------------------------------------------------------------------------------
# The vectorisable elementary functions
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, ulps", [(np.float32, 3), (np.float64, 4)])
def test_elementary_functions(dtype, ulps):
    x = np.concatenate([
        np.linspace(-750.0, 720.0, 20001), np.linspace(-30.0, 30.0, 20001),
        [0.0, -0.0, 19.999, 20.0, 20.001, -104.0, 89.0, -746.0, 710.0],
    ]).astype(dtype)
    got = [np.empty_like(x) for _ in range(3)]
    cpu._elementary_check(x, *got)
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore"):
        want = [np.exp(x64), reference.softplus(x64), 1.0 / (1.0 + np.exp(-x64))]
        rounded = [w.astype(dtype) for w in want]  # inf where the true value overflows
    info = np.finfo(dtype)
    for name, g, w, w_rounded in zip(("exp", "softplus", "sigmoid"), got, want, rounded):
        normal = np.isfinite(w_rounded) & (np.abs(w) >= info.tiny)
        err = np.abs(g[normal] - w[normal]) / np.abs(w[normal])
        assert err.max() <= ulps * info.eps, name
        # overflow to inf, underflow to zero (or a denormal) where exp does; right at
        # the largest float either rounding is fine
        clear = np.abs(np.abs(w) / info.max - 1.0) > 1e-3
        np.testing.assert_array_equal(np.isinf(g[clear]), np.isinf(w_rounded[clear]),
                                      err_msg=name)
        assert np.all(np.abs(g[~normal & np.isfinite(w_rounded)]) <= 2 * info.tiny), name
    special = np.array([np.nan, np.inf, -np.inf], dtype=dtype)
    out = [np.empty_like(special) for _ in range(3)]
    cpu._elementary_check(special, *out)
    np.testing.assert_array_equal(out[0], [np.nan, np.inf, 0.0])
    np.testing.assert_array_equal(out[2], [np.nan, 1.0, 0.0])


# --------------------------------------------------------------------------------------
# The GPU backward's decomposition into slices of states, checked with CPU stand-ins
# --------------------------------------------------------------------------------------

@given(N=st.integers(17, 80), D=st.booleans(), z=st.booleans(), h0=st.booleans(),
       dfinal=st.booleans(), L=st.sampled_from([1, 5, 23]), chunk=st.sampled_from([1, 4, 16]),
       narrow=st.booleans(), lanes=st.sampled_from([1, 2]), width=st.sampled_from([16, 32]),
       seed=st.integers(0, 2**32 - 1))
@settings(deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
def test_backward_by_state_slices_adds_up(N, D, z, h0, dfinal, L, chunk, narrow, lanes, width, seed):
    """The GPU backward of N > 16 as slices of ``width`` states (16 or 32:
    ``TUNING["bwd_ring_max_n"]``; ``_backward_by_state_slices``:
    D in slice 0 only, du / ddelta / dz added up, dA, dB, dC and the initial state's
    gradient placed by state, d delta_bias summed), with the CPU backward standing in for
    each slice's ring backward: the whole problem's gradients. ``narrow``: float16 u, delta,
    z, B and C, which the slices take as float32 copies (their du, ddelta and dz rounded to
    float16 at the end): the float32 problem's gradients, those three rounded. ``lanes`` 2:
    odd slices add into a second set of du, ddelta and dz, summed into the first at the end."""
    from ssmkit._gpu import selective_scan as gpu_scan

    p = make_problem(seed, batch=2, dim=8, N=N, L=L, B_form=2, C_form=1, D=D, z=z, h0=h0,
                     chunk=chunk, **(dict(io=np.float16, compute=np.float32) if narrow else {}))
    dout, dfin = cotangents(p, seed, dfinal)
    if narrow:  # the stand-in: the CPU backward of the float32 problem the slices see
        f32 = (lambda X: None if X is None else X.astype(np.float32))  # noqa: E731
        wide = dataclasses.replace(p, u=f32(p.u), delta=f32(p.delta), z=f32(p.z), B=f32(p.B), C=f32(p.C))
        want = cpu.selective_scan_backward(wide, None, f32(dout), dfin)
        want.update({k: None if want[k] is None else want[k].astype(np.float16) for k in ("u", "delta", "z")})
    else:
        want = cpu.selective_scan_backward(p, None, dout, dfin)

    writes = []  # per slice: (whether it adds, its du buffer)

    def slice_backward(sp, checkpoints, dout, dfinal_state, du, ddelta, dz, accumulate=False,
                       ck_pitch=None, restart=None):
        assert restart is None  # (no packed sequences here)
        writes.append((accumulate, id(du)))
        assert sp.N <= width and checkpoints.shape[-1] == sp.N and ck_pitch == p.N
        assert sp.io_dtype == dout.dtype == du.dtype == (np.float32 if narrow else p.io_dtype)
        g = cpu.selective_scan_backward(sp, None, dout, dfinal_state)
        for name, out in (("u", du), ("delta", ddelta), ("z", dz)):
            if out is not None:
                out[...] = out + g[name] if accumulate else g[name]
        return dict(g, u=du, delta=ddelta, z=dz)

    class NaNEmpty:  # numpy, but empty() is NaN-filled: slice 0 must write every output
        def __getattr__(self, name):
            return getattr(np, name)

        def empty(self, shape, dtype=float):
            return np.full(shape, np.nan, dtype=dtype)

    p = dataclasses.replace(p, xp=NaNEmpty())
    checkpoints = np.zeros((p.n_chunks, p.batch, p.dim, p.N))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gpu_scan, "_backward_kernels", slice_backward)
        mp.setitem(gpu_scan.TUNING, "bwd_ring_max_n", width)
        got = gpu_scan._backward_by_state_slices(p, checkpoints, dout, dfin, lanes=lanes)
    # each lane's first slice writes its buffer, the later ones add into it; two lanes, two buffers
    assert len(writes) == -(-N // width)
    used = min(lanes, -(-N // width))
    assert [a for a, _ in writes] == [k >= used for k in range(len(writes))]
    assert len({b for _, b in writes}) == used
    assert narrow or writes[0][1] == id(got["u"])
    for name, w in want.items():
        if w is None:
            assert got[name] is None, name
        else:
            assert got[name].dtype == w.dtype, name
            tol = (1e-3 if w.dtype == np.float16 else 1e-5) if narrow else 1e-12
            np.testing.assert_allclose(got[name], w, rtol=tol, atol=tol * np.abs(w).max(), err_msg=name)
