"""causal_conv1d, its VJP and its decoding step against the float64 reference, on every backend.

The reference itself is checked against an independent computation (numpy.convolve
per sequence segment) and its pullback against finite differences. GPU tests carry
the ``gpu`` marker; the NVRTC test compiles the CUDA kernels without a GPU.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import ssmkit
from ssmkit import _nvrtc_check, reference
from ssmkit._gpu import causal_conv1d as gpu_conv
from ssmkit._gpu import compiler
from helpers import (FORWARD_RTOL, GRAD_RTOL, as_dtype, backends, gpu_available, rel_err,
                     to_numpy, xp_for)

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
GRAD_FIELDS = ("x", "weight", "bias", "initial_state")
needs_gpu = [pytest.mark.gpu, pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")]


def make_inputs(rng, *, batch, dim, L, W, bias=True, init=False, cuts=(), seq_scale=1):
    """Fresh float64 inputs; ``cuts``: positions where seq_idx steps up (every row)."""
    seq = None
    if cuts is not None and len(cuts):
        seq = np.zeros((batch, L), dtype=np.int64)
        for c in cuts:
            seq[:, c:] += 1
        seq = seq * seq_scale + (2**40 if seq_scale > 1 else 0)
    return dict(
        x=rng.standard_normal((batch, dim, L)),
        weight=rng.standard_normal((dim, W)) / np.sqrt(W),
        bias=rng.standard_normal(dim) if bias else None,
        initial_state=rng.standard_normal((batch, dim, W - 1)) if init else None,
        seq_idx=seq,
    )


def cast(inputs, dtype, xp):
    """x in ``dtype``, the other floats in float32/float64; returns (cast, exact float64 values)."""
    param = "float64" if dtype == "float64" else "float32"
    out, exact = {}, {}
    for name, a in inputs.items():
        if a is None:
            out[name] = exact[name] = None
            continue
        if name == "seq_idx":
            out[name], exact[name] = xp.asarray(a), a
            continue
        low = as_dtype(a, dtype if name == "x" else param)
        exact[name] = low.astype(np.float64)
        out[name] = xp.asarray(low) if xp is not np else low
    return out, exact


def check_forward(backend, dtype, inputs, activation, seed=0):
    xp = xp_for(backend)
    args, exact = cast(inputs, dtype, xp)
    y, final = ssmkit.causal_conv1d(**args, activation=activation, return_final_state=True)
    y_ref, final_ref = reference.causal_conv1d(**exact, activation=activation,
                                               return_final_state=True)
    assert type(y) is type(args["x"]) and y.dtype == args["x"].dtype
    assert final.dtype == args["x"].dtype and final.shape == final_ref.shape
    assert rel_err(y, y_ref) <= FORWARD_RTOL[dtype]
    if final_ref.size:
        assert rel_err(final, final_ref) <= FORWARD_RTOL[dtype]


def check_vjp(backend, dtype, inputs, activation, seed=0):
    rng = np.random.default_rng(seed)
    xp = xp_for(backend)
    args, exact = cast(inputs, dtype, xp)
    (y, final), pullback = ssmkit.causal_conv1d_vjp(**args, activation=activation,
                                                    return_final_state=True)
    (y_ref, final_ref), pullback_ref = reference.causal_conv1d_vjp(
        **exact, activation=activation, return_final_state=True)
    assert rel_err(y, y_ref) <= FORWARD_RTOL[dtype]
    dy = as_dtype(rng.standard_normal(y_ref.shape), dtype)
    dfinal = rng.standard_normal(final_ref.shape).astype("float64" if dtype == "float64"
                                                         else "float32")
    grads = pullback(xp.asarray(dy), xp.asarray(dfinal))
    grads_ref = pullback_ref(dy.astype(np.float64), dfinal.astype(np.float64))
    # The same sums without the cotangents' signs: a gradient that cancels to near zero
    # (a bias gradient of three steps, say) is held to the size of what was summed, which is
    # what floating-point sums guarantee, not to its own tiny size.
    grads_abs = pullback_ref(np.abs(dy.astype(np.float64)), np.abs(dfinal.astype(np.float64)))
    for name in GRAD_FIELDS:
        g, g_ref = getattr(grads, name), getattr(grads_ref, name)
        if args[name] is None:
            assert g is None and g_ref is None, name
            continue
        assert g.shape == args[name].shape and g.dtype == args[name].dtype, name
        if g_ref.size:
            scale = max(np.linalg.norm(g_ref), np.linalg.norm(getattr(grads_abs, name)))
            err = np.linalg.norm(to_numpy(g).astype(np.float64) - g_ref)
            assert err <= GRAD_RTOL[dtype] * (scale if scale > 0 else 1.0), (name, err, scale)


# ------------------------------------------------------------------------------------------
# The reference against an independent computation, and its pullback against differences
# ------------------------------------------------------------------------------------------

def direct_conv(x, weight, bias, initial_state, seq_idx, activation):
    """numpy.convolve over each sequence segment of each row (no shared code with the reference)."""
    batch, dim, L = x.shape
    W = weight.shape[1]
    y = np.empty((batch, dim, L))
    for b in range(batch):
        seq = np.zeros(L, dtype=np.int64) if seq_idx is None else seq_idx[b]
        starts = [0] + [t for t in range(1, L) if seq[t] != seq[t - 1]] + [L]
        for i, (s, e) in enumerate(zip(starts[:-1], starts[1:])):
            for d in range(dim):
                past = (initial_state[b, d] if initial_state is not None and i == 0
                        else np.zeros(W - 1))
                seg = np.concatenate([past, x[b, d, s:e]])
                y[b, d, s:e] = np.convolve(seg, weight[d, ::-1], mode="valid")
    if bias is not None:
        y += bias[None, :, None]
    return y / (1 + np.exp(-y)) if activation == "silu" else y


@pytest.mark.parametrize("W", [1, 2, 3, 4, 5, 8, 11])
@pytest.mark.parametrize("L", [1, 2, 3, 7, 40])
def test_reference_matches_direct_convolution(W, L):
    rng = np.random.default_rng(W * 100 + L)
    cuts = [c for c in (1, L // 2, L - 1) if 0 < c < L]
    for kw in (dict(bias=False), dict(bias=True, init=True, cuts=cuts)):
        inputs = make_inputs(rng, batch=2, dim=3, L=L, W=W, **kw)
        for act in (None, "silu"):
            y = reference.causal_conv1d(**inputs, activation=act)
            np.testing.assert_allclose(y, direct_conv(**inputs, activation=act), rtol=1e-12,
                                       atol=1e-12)


def test_reference_final_state_is_last_inputs():
    rng = np.random.default_rng(1)
    inputs = make_inputs(rng, batch=2, dim=3, L=2, W=5, init=True)  # L < W-1
    _, final = reference.causal_conv1d(**inputs, return_final_state=True)
    expected = np.concatenate([inputs["initial_state"], inputs["x"]], axis=2)[:, :, -4:]
    np.testing.assert_array_equal(final, expected)


@pytest.mark.parametrize("act", [None, "silu"])
def test_reference_vjp_matches_finite_differences(act):
    rng = np.random.default_rng(5)
    for L, W, cuts in ((9, 4, (3, 5)), (2, 5, ()), (6, 1, (2,))):
        args = make_inputs(rng, batch=2, dim=3, L=L, W=W, init=True, cuts=cuts)
        (y, h), pullback = reference.causal_conv1d_vjp(**args, activation=act,
                                                       return_final_state=True)
        dy, dh = rng.standard_normal(y.shape), rng.standard_normal(h.shape)
        grads = pullback(dy, dh)
        for name in GRAD_FIELDS:
            if args[name].size == 0:
                continue
            v = rng.standard_normal(args[name].shape)
            f = [np.sum(yy * dy) + np.sum(hh * dh) for yy, hh in (
                reference.causal_conv1d(**dict(args, **{name: args[name] + s * 1e-6 * v}),
                                        activation=act, return_final_state=True)
                for s in (1, -1))]
            fd = (f[0] - f[1]) / 2e-6
            assert abs(fd - np.sum(getattr(grads, name) * v)) <= 1e-6 * (1 + abs(fd)), name


# ------------------------------------------------------------------------------------------
# Backends against the reference
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("W", [1, 2, 3, 4, 5, 6, 7, 8])
def test_every_width(backend, W):
    rng = np.random.default_rng(W)
    for i, L in enumerate(sorted({1, 2, max(1, W - 1), W, 129, 151})):
        inputs = make_inputs(rng, batch=2, dim=3, L=L, W=W, bias=i % 2 == 0, init=i % 3 != 0,
                             cuts=(L // 3,) if L > 3 and i % 2 else ())
        act = "silu" if i % 2 else None
        check_forward(backend, "float32", inputs, act)
        check_vjp(backend, "float64", inputs, act, seed=i)


def test_wide_filters_on_cpu():
    rng = np.random.default_rng(3)
    for W, L in ((9, 5), (16, 40), (33, 20)):
        inputs = make_inputs(rng, batch=2, dim=2, L=L, W=W, init=True, cuts=(L // 2,))
        check_forward("cpu", "float64", inputs, "silu")
        check_vjp("cpu", "float64", inputs, "silu")


@st.composite
def conv_cases(draw):
    W = draw(st.integers(1, 8))
    L = draw(st.one_of(st.sampled_from([1, 2, 3, 5, 8, 31, 33]), st.integers(1, 70)))
    n_cuts = draw(st.integers(0, 3)) if draw(st.booleans()) else None
    cuts = () if n_cuts is None else tuple(sorted(draw(st.lists(st.integers(0, L), min_size=n_cuts,
                                                                max_size=n_cuts))))
    return dict(batch=draw(st.integers(1, 3)), dim=draw(st.integers(1, 4)), L=L, W=W,
                bias=draw(st.booleans()), init=draw(st.booleans()), cuts=cuts,
                seq_scale=draw(st.sampled_from([1, 7]))), \
        draw(st.sampled_from([None, "silu"])), draw(st.integers(0, 2**32 - 1))


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@settings(max_examples=20, **SETTINGS)
@given(args=conv_cases())
# a bias gradient that cancels to 3e-4 over three steps (found by hypothesis in CI)
@example(args=(dict(batch=1, dim=1, L=3, W=6, bias=True, init=False, cuts=(2,), seq_scale=1),
               "silu", 2179))
def test_forward_and_vjp_match_reference(backend, dtype, args):
    case, act, seed = args
    inputs = make_inputs(np.random.default_rng(seed), **case)
    check_forward(backend, dtype, inputs, act)
    check_vjp(backend, dtype, inputs, act, seed)


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_lengths_and_boundaries_at_tile_edges(backend, dtype):
    """Lengths just around the GPU tiles, with sequence boundaries on and beside tile edges."""
    tile = gpu_conv.tile_steps(dtype)
    rng = np.random.default_rng(tile)
    for W, L, cuts in ((4, tile + 1, (tile - 1, tile)), (8, 2 * tile + 3, (tile, tile + 1, 2 * tile)),
                       (3, tile - 1, (tile - 2,)), (5, tile, ()), (2, 2 * tile, (1, tile + 2))):
        inputs = make_inputs(rng, batch=2, dim=2, L=L, W=W, init=True, cuts=cuts)
        check_forward(backend, dtype, inputs, "silu")
        check_vjp(backend, dtype, inputs, "silu")


@pytest.mark.parametrize("dtype", [pytest.param(d, marks=needs_gpu)
                                   for d in ("float64", "float32", "bfloat16", "float16")])
def test_gpu_warp_chunk_edges_every_width(dtype):
    """The GPU kernels pass neighbours between lanes by shuffles and between warps' chunks
    (32 vectors of 16 bytes) through shared memory: sequence boundaries and the final
    state on and beside chunk and tile edges, every width, with and without silu."""
    if dtype in ("bfloat16", "float16"):
        pytest.importorskip("ml_dtypes")
    chunk = 32 * (16 // np.dtype(dtype).itemsize)
    tile = gpu_conv.tile_steps(dtype)
    rng = np.random.default_rng(chunk + tile)
    for W in range(1, 9):
        L = tile + chunk + W + 1  # a second tile, past its first chunk edge
        cuts = (chunk - 1, chunk, 2 * chunk + 1, tile - 1, tile + chunk) if W % 2 else (chunk + 1,)
        inputs = make_inputs(rng, batch=2, dim=2, L=L, W=W, bias=W % 3 != 0, init=W % 4 != 1,
                             cuts=cuts)
        act = "silu" if W % 4 < 2 else None
        check_forward("gpu", dtype, inputs, act)
        check_vjp("gpu", dtype, inputs, act, seed=W)


@pytest.mark.parametrize("dtype", [pytest.param(d, marks=needs_gpu)
                                   for d in ("float32", "bfloat16", "float16")])
@pytest.mark.parametrize("tile_bytes", [256, 8192])
def test_gpu_forward_tile_kernel(dtype, tile_bytes, monkeypatch):
    """The forward through shared memory (cc1d_fwd_tile), with small and large tiles:
    lengths of one vector (many rows per block, the last group partial), one tile, just past
    a tile and several tiles with a partial last one; every width, with and without bias,
    silu, initial state; the final state. Against the reference, and against the register
    kernel (cc1d_fwd)."""
    import cupy

    if dtype in ("bfloat16", "float16"):
        pytest.importorskip("ml_dtypes")
    E = 16 // np.dtype(dtype).itemsize
    monkeypatch.setitem(gpu_conv.TUNING, "fwd_warp", ())
    monkeypatch.setitem(gpu_conv.TUNING, "fwd_tile", ("float16", "bfloat16", "float32"))
    monkeypatch.setitem(gpu_conv.TUNING, "fwd_tile_bytes", (tile_bytes, tile_bytes))
    monkeypatch.setitem(gpu_conv.TUNING, "fwd_tile_blocks_per_sm", 0)
    tile = tile_bytes // np.dtype(dtype).itemsize
    plan = gpu_conv.forward_tile_plan(rows=6, L=E, width=4, dtype=dtype)
    assert plan["rows_per_item"] > 1 and plan["rows_per_item"] * plan["n_items"] >= 6
    rng = np.random.default_rng(tile_bytes + E)
    for W in range(1, 9):
        for L in (E, tile, tile + E, 3 * tile - 2 * E):
            inputs = make_inputs(rng, batch=2, dim=3, L=L, W=W, bias=W % 3 != 0,
                                 init=W % 2 == 0, cuts=())
            act = "silu" if W % 4 < 2 else None
            check_forward("gpu", dtype, inputs, act)
            args, _ = cast(inputs, dtype, cupy)
            outs = []
            for kinds in (gpu_conv.TUNING["fwd_tile"], ()):
                monkeypatch.setitem(gpu_conv.TUNING, "fwd_tile", kinds)
                y, final = ssmkit.causal_conv1d(**args, activation=act, return_final_state=True)
                outs.append((to_numpy(y).astype(np.float64), to_numpy(final).astype(np.float64)))
            monkeypatch.setitem(gpu_conv.TUNING, "fwd_tile", ("float16", "bfloat16", "float32"))
            np.testing.assert_allclose(outs[0][0], outs[1][0], rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(outs[0][1], outs[1][1])


@pytest.mark.parametrize("dtype", [pytest.param(d, marks=needs_gpu)
                                   for d in ("bfloat16", "float16")])
@pytest.mark.parametrize("span", [128, 384])
def test_gpu_tensor_core_kernels(dtype, span, monkeypatch):
    """The forward and backward on tensor cores (cc1d_fwd_mma, cc1d_bwd_mma) with spans of
    one and three chunks: lengths of one word, at and around the 128-step chunk and the
    span, every width, with and without bias and silu, the final state and its cotangent;
    against the reference (the weight gradients to float32 accuracy, not the 16-bit one) and
    against cc1d_fwd_tile / cc1d_bwd. An initial state, seq_idx or an odd length take the
    other kernels, and so does a backward whose length is not a multiple of 8 (it copies
    16-byte vectors of whole rows)."""
    import cupy

    pytest.importorskip("ml_dtypes")
    both = ("bfloat16", "float16")
    monkeypatch.setitem(gpu_conv.TUNING, "mma_span", span)
    monkeypatch.setitem(gpu_conv.TUNING, "fwd_warp", ())  # the _warp kernels have their own test
    monkeypatch.setitem(gpu_conv.TUNING, "bwd_warp", ())
    monkeypatch.setitem(gpu_conv.TUNING, "bwd_mma_min_width", 1)
    monkeypatch.setitem(gpu_conv.TUNING, "fwd_mma_min_width", 1)
    monkeypatch.setitem(gpu_conv.TUNING, "mma_warps_per_sm", 0)
    rng = np.random.default_rng(span)
    for W in range(1, 9):
        for L in (2, 126, 128, 136, span + 2, span + 8, 3 * span - 6, 3 * span - 8, 1000):
            inputs = make_inputs(rng, batch=2, dim=3, L=L, W=W, bias=W % 3 != 0, cuts=())
            act = "silu" if (W + L) % 3 else None
            args, exact = cast(inputs, dtype, cupy)
            p, _ = gpu_conv_problem(args, act)
            dy = as_dtype(rng.standard_normal((2, 3, L)), dtype)
            dfinal = rng.standard_normal((2, 3, W - 1)).astype("float32") if L % 4 else None

            def use(on):
                kinds = both if on else ()
                monkeypatch.setitem(gpu_conv.TUNING, "fwd_mma", kinds)
                monkeypatch.setitem(gpu_conv.TUNING, "bwd_mma", kinds)
                assert (gpu_conv._mma_for("fwd", p, p.x) is not None) == on
                assert (gpu_conv._mma_for("bwd", p, p.x) is not None) == (on and L % 8 == 0)

            check_against_other_kernels(use, args, exact, act, dy, dfinal, dtype, (W, L))
    # the cases left to the other kernels
    monkeypatch.setitem(gpu_conv.TUNING, "fwd_mma", both)
    monkeypatch.setitem(gpu_conv.TUNING, "bwd_mma", both)
    assert_left_to_other_kernels(rng, dtype, 10, 9, lambda kind, p: gpu_conv._mma_for(kind, p, p.x))


@pytest.mark.parametrize("dtype", [pytest.param(d, marks=needs_gpu)
                                   for d in ("bfloat16", "float16", "float32")])
@pytest.mark.parametrize("span", [256, 768])
def test_gpu_warp_kernels(dtype, span, monkeypatch):
    """The forward and backward with a warp per span (cc1d_fwd_warp, cc1d_bwd_warp), spans of
    one and three 256-step chunks: lengths of one vector, at and around the chunk and the
    span, every width, with and without bias and silu, with and without the
    final state's cotangent; against the reference (the weight gradients to float32
    accuracy) and against cc1d_fwd / cc1d_bwd. An initial state, seq_idx or a length not a
    multiple of 8 take the other kernels."""
    import cupy

    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    monkeypatch.setitem(gpu_conv.TUNING, "warp_span", span)
    monkeypatch.setitem(gpu_conv.TUNING, "warp_warps_per_sm", 0)
    for name in ("fwd_mma", "bwd_mma", "fwd_tile"):
        monkeypatch.setitem(gpu_conv.TUNING, name, ())
    warp = ("float16", "bfloat16", "float32")
    rng = np.random.default_rng(span + len(dtype))
    for W in range(1, 9):
        for L in (8, 248, 256, 264, span + 8, 3 * span - 8, 1000):
            inputs = make_inputs(rng, batch=2, dim=3, L=L, W=W, bias=W % 3 != 0, cuts=())
            act = "silu" if (W + L // 8) % 3 else None
            args, exact = cast(inputs, dtype, cupy)
            dy = as_dtype(rng.standard_normal((2, 3, L)), dtype)
            dfinal = rng.standard_normal((2, 3, W - 1)).astype("float32") if (W + L) % 2 else None

            def use(on):
                kinds = warp if on else ()
                monkeypatch.setitem(gpu_conv.TUNING, "fwd_warp", kinds)
                monkeypatch.setitem(gpu_conv.TUNING, "bwd_warp", kinds)
                p, _ = gpu_conv_problem(args, act)
                assert (gpu_conv._warp_launch("fwd", p) is not None) == on
                assert (gpu_conv._warp_launch("bwd", p) is not None) == on

            check_against_other_kernels(use, args, exact, act, dy, dfinal, dtype, (W, L))
    # the cases left to the other kernels
    monkeypatch.setitem(gpu_conv.TUNING, "fwd_warp", warp)
    monkeypatch.setitem(gpu_conv.TUNING, "bwd_warp", warp)
    assert_left_to_other_kernels(rng, dtype, 16, 12, gpu_conv._warp_launch)


def assert_left_to_other_kernels(rng, dtype, L, odd_L, launch):
    """With the kernels under test selected, ``launch(kind, problem)`` is None (the other
    kernels run) for an initial state, for seq_idx, and for length ``odd_L`` instead of
    ``L``, forward and backward."""
    import cupy

    for kw in (dict(init=True), dict(cuts=(3,)), dict(L=odd_L)):
        inputs = make_inputs(rng, batch=1, dim=2, W=4, **{"L": L, **kw})
        args, _ = cast(inputs, dtype, cupy)
        p, _ = gpu_conv_problem(args, "silu")
        assert launch("fwd", p) is None, kw
        assert launch("bwd", p) is None, kw


def check_against_other_kernels(use, args, exact, act, dy, dfinal, dtype, case):
    """The forward and VJP with the kernels under test (``use(True)`` selects them) against
    the reference (the weight gradients to float32 accuracy) and against the other kernels
    (``use(False)``); ``case`` names the case in the messages."""
    import cupy

    runs = []
    for on in (True, False):
        use(on)
        (y, final), pullback = ssmkit.causal_conv1d_vjp(**args, activation=act,
                                                        return_final_state=True)
        grads = pullback(cupy.asarray(dy), None if dfinal is None else cupy.asarray(dfinal))
        runs.append((to_numpy(y).astype(np.float64), to_numpy(final), grads))
    (y_ref, final_ref), pullback_ref = reference.causal_conv1d_vjp(
        **exact, activation=act, return_final_state=True)
    g_ref = pullback_ref(dy.astype(np.float64),
                         None if dfinal is None else dfinal.astype(np.float64))
    (y, final, g), (y_old, final_old, old) = runs
    assert rel_err(y, y_ref) <= FORWARD_RTOL[dtype], case
    assert rel_err(y, y_old) <= FORWARD_RTOL[dtype], case
    np.testing.assert_array_equal(final, final_old)
    assert rel_err(g.x, g_ref.x) <= GRAD_RTOL[dtype], case
    assert rel_err(g.x, to_numpy(old.x).astype(np.float64)) <= GRAD_RTOL[dtype], case
    assert rel_err(g.weight, g_ref.weight) <= 1e-4, case
    if args["bias"] is not None:
        assert rel_err(g.bias, g_ref.bias) <= 1e-4, case


def gpu_conv_problem(args, act):
    """The backend's problem for ``args`` (as the public functions prepare it)."""
    from ssmkit import _causal_conv1d

    return _causal_conv1d._prepare("causal_conv1d", args["x"], args["weight"], args["bias"],
                                   act, args["initial_state"], args["seq_idx"])


def test_mma_launch_rules(monkeypatch):
    """Which problems the tensor-core kernels take (without a GPU: the device, its limits and
    the compiler are stand-ins), and that a launch is prepared once per shape and TUNING."""
    import sys
    import types

    from ssmkit import _causal_conv1d

    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDevice=lambda: 0))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    limits = dict(sm_count=132, compute_capability=90)
    monkeypatch.setattr(compiler, "device_limits", lambda: limits)
    built = []
    monkeypatch.setattr(compiler, "get_kernel", lambda f, name: built.append(name) or name)
    monkeypatch.setattr(gpu_conv, "_span_launches", {})
    pytest.importorskip("ml_dtypes")
    import ml_dtypes

    def problem(L=2048, W=8, dtype=ml_dtypes.bfloat16, init=False, seq=False):
        return _causal_conv1d.CausalConv1dProblem(  # shapes and dtypes are all that matter
            x=np.zeros((2, 3, L), dtype=dtype), weight=np.zeros((3, W), np.float32),
            bias=np.zeros(3, np.float32), initial_state=np.zeros((2, 3, W - 1)) if init else None,
            seq_idx=np.zeros((2, L), np.int32) if seq else None, silu=True, xp=np)

    # six rows: spans of 128 steps, to have warps for the device
    kernel, grid, scalars, n_spans = gpu_conv._mma_launch("bwd", problem())
    assert kernel == "cc1d_bwd_mma<ssm_bf16, 8, true, true>" and n_spans == 16
    assert grid == (24,) and [int(v) for v in scalars] == [3, 2048, 128, 16, 96]
    for kind in ("fwd", "bwd"):  # below {kind}_mma_min_width
        assert gpu_conv._mma_launch(kind, problem(W=4)) is None
    monkeypatch.setitem(gpu_conv.TUNING, "fwd_mma_min_width", 1)
    assert gpu_conv._mma_launch("fwd", problem(W=5)) is not None
    # the backward copies 16-byte vectors of whole rows: L a multiple of 8
    assert gpu_conv._mma_launch("fwd", problem(L=2044)) is not None
    assert gpu_conv._mma_launch("bwd", problem(L=2044)) is None
    for kw in (dict(L=2047), dict(init=True), dict(seq=True), dict(dtype=np.float32),
               dict(dtype=np.float16)):
        assert gpu_conv._mma_launch("fwd", problem(**kw)) is None, kw
    # steps in 32 bits: a step plus two spans stays below 2**31 (shape only: nothing allocated)
    big = problem(L=2)
    object.__setattr__(big, "x", np.lib.stride_tricks.as_strided(big.x, (2, 3, 2**31 - 4096)))
    assert gpu_conv._mma_launch("fwd", big) is None
    limits["compute_capability"] = 75
    assert gpu_conv._mma_launch("fwd", problem(L=1000)) is None
    limits["compute_capability"] = 90
    n = len(built)
    gpu_conv._mma_launch("bwd", problem())  # cached: nothing prepared again
    assert len(built) == n
    monkeypatch.setitem(gpu_conv.TUNING, "mma_warps_per_sm", 0)  # TUNING is part of the key
    assert gpu_conv._mma_launch("bwd", problem())[3] == 1  # one span of 2048
    assert gpu_conv._mma_launch("fwd", problem(L=4098))[3] == 3


def test_warp_launch_rules(monkeypatch):
    """Which problems the _warp kernels take (without a GPU: stand-ins for the device and the
    compiler), its spans, and that a launch is prepared once per shape and TUNING."""
    import sys
    import types

    from ssmkit import _causal_conv1d

    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDevice=lambda: 0))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(compiler, "device_limits", lambda: dict(sm_count=132,
                                                                compute_capability=90))
    built = []
    monkeypatch.setattr(compiler, "get_kernel", lambda f, name: built.append(name) or name)
    monkeypatch.setattr(gpu_conv, "_span_launches", {})

    def problem(L=2048, W=8, dtype=np.float32, init=False, seq=False, rows=3):
        return _causal_conv1d.CausalConv1dProblem(  # shapes and dtypes are all that matter
            x=np.zeros((2, rows, L), dtype=dtype), weight=np.zeros((rows, W), np.float32),
            bias=None, initial_state=np.zeros((2, rows, W - 1)) if init else None,
            seq_idx=np.zeros((2, L), np.int32) if seq else None, silu=True, xp=np)

    kernel, grid, scalars, n_spans = gpu_conv._warp_launch("bwd", problem())
    assert kernel == "cc1d_bwd_warp<float, 8, false, true>" and n_spans == 8
    assert grid == (12,) and [int(v) for v in scalars] == [3, 2048, 256, 8, 48]
    assert gpu_conv._warp_launch("fwd", problem()) is None  # float32: cc1d_fwd
    kernel, grid, scalars, n_spans = gpu_conv._warp_launch("fwd", problem(rows=3072 * 8,
                                                                          dtype=np.float16))
    assert kernel == "cc1d_fwd_warp<ssm_half, 8, false, true>"
    assert n_spans == 1 and grid == (3072 * 4,) and int(scalars[2]) == 2048
    for kw in (dict(L=2044), dict(init=True), dict(seq=True), dict(dtype=np.float64)):
        for kind in ("fwd", "bwd"):
            kw = dict(dict(dtype=np.float16), **kw)
            assert gpu_conv._warp_launch(kind, problem(**kw)) is None, (kind, kw)
    n = len(built)
    gpu_conv._warp_launch("bwd", problem())  # cached: nothing prepared again
    assert len(built) == n
    monkeypatch.setitem(gpu_conv.TUNING, "bwd_warp", ())  # TUNING is part of the key
    assert gpu_conv._warp_launch("bwd", problem()) is None
    assert gpu_conv._warp_launch("fwd", problem(dtype=np.float16)) is not None


def test_mma_plan():
    """cc1d_bwd_mma's spans: whole 128-step chunks, TUNING's span at most, shorter while the
    rows alone give too few warps, and the items and blocks that follow."""
    plan = gpu_conv.mma_plan(rows=24576, L=4096, sm_count=132)
    assert plan == dict(span=2048, n_spans=2, n_items=49152, blocks=12288)
    plan = gpu_conv.mma_plan(rows=24576, L=130, sm_count=132)
    assert plan["span"] == 256 and plan["n_spans"] == 1
    plan = gpu_conv.mma_plan(rows=4, L=1 << 20, sm_count=132)
    assert plan["span"] == 256 and plan["n_items"] == 4 * 4096 and plan["blocks"] == 4096
    plan = gpu_conv.mma_plan(rows=64, L=4096, sm_count=132)  # 8448 warps wanted
    assert plan["span"] == 128 and plan["n_spans"] == 32
    for rows, L in ((1, 1), (3, 127), (5, 129), (1000, 5000)):
        plan = gpu_conv.mma_plan(rows=rows, L=L, sm_count=132)
        assert plan["span"] % 128 == 0 and plan["n_spans"] * plan["span"] >= L
        assert (plan["n_spans"] - 1) * plan["span"] < L
        assert plan["blocks"] * 4 >= plan["n_items"] == rows * plan["n_spans"]


# ------------------------------------------------------------------------------------------
# Properties: carried state, decoding steps
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", backends())
@settings(max_examples=20, **SETTINGS)
@given(W=st.integers(1, 8), L=st.integers(1, 40), split=st.integers(0, 40), act=st.booleans(),
       init=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_split_with_carried_state_equals_whole(backend, W, L, split, act, init, seed):
    xp = xp_for(backend)
    split = min(split, L)
    args = {k: (None if v is None else xp.asarray(v)) for k, v in make_inputs(
        np.random.default_rng(seed), batch=2, dim=3, L=L, W=W, init=init).items()}
    act = "silu" if act else None
    y, final = ssmkit.causal_conv1d(**args, activation=act, return_final_state=True)
    kw = dict(weight=args["weight"], bias=args["bias"], activation=act, return_final_state=True)
    y1, mid = ssmkit.causal_conv1d(args["x"][:, :, :split], initial_state=args["initial_state"], **kw)
    y2, final2 = ssmkit.causal_conv1d(args["x"][:, :, split:], initial_state=mid, **kw)
    np.testing.assert_allclose(to_numpy(xp.concatenate([y1, y2], axis=2)), to_numpy(y),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(to_numpy(final2), to_numpy(final))


@pytest.mark.parametrize("backend", backends())
@settings(max_examples=15, **SETTINGS)
@given(W=st.integers(1, 8), L=st.integers(0, 12), T=st.integers(1, 9), act=st.booleans(),
       chunk=st.integers(1, 4), seed=st.integers(0, 2**32 - 1))
def test_update_steps_continue_the_convolution(backend, W, L, T, act, chunk, seed):
    """A prefix with return_final_state, then steps (one token, or chunks of tokens) from it."""
    xp = xp_for(backend)
    rng = np.random.default_rng(seed)
    args = {k: (None if v is None else xp.asarray(v)) for k, v in make_inputs(
        rng, batch=2, dim=3, L=L + T, W=W, init=True).items()}
    act = "silu" if act else None
    y = ssmkit.causal_conv1d(**args, activation=act)
    _, state = ssmkit.causal_conv1d(args["x"][:, :, :L], args["weight"], args["bias"],
                                    activation=act, initial_state=args["initial_state"],
                                    return_final_state=True)
    state2 = state.copy()
    steps = [ssmkit.causal_conv1d_update(args["x"][:, :, L + t], state, args["weight"],
                                         args["bias"], activation=act) for t in range(T)]
    np.testing.assert_allclose(to_numpy(xp.stack(steps, axis=2)), to_numpy(y[:, :, L:]),
                               rtol=1e-12, atol=1e-12)
    chunks = [ssmkit.causal_conv1d_update(args["x"][:, :, L + t:L + t + chunk], state2,
                                          args["weight"], args["bias"], activation=act)
              for t in range(0, T, chunk)]
    np.testing.assert_allclose(to_numpy(xp.concatenate(chunks, axis=2)), to_numpy(y[:, :, L:]),
                               rtol=1e-12, atol=1e-12)
    _, final = ssmkit.causal_conv1d(**args, activation=act, return_final_state=True)
    np.testing.assert_array_equal(to_numpy(state), to_numpy(final))
    np.testing.assert_array_equal(to_numpy(state2), to_numpy(final))


@pytest.mark.parametrize("backend", backends())
@settings(max_examples=10, **SETTINGS)
@given(W=st.integers(1, 6), L=st.integers(1, 12), act=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_vjp_matches_finite_differences(backend, W, L, act, seed):
    xp = xp_for(backend)
    rng = np.random.default_rng(seed)
    host = make_inputs(rng, batch=2, dim=2, L=L, W=W, init=True, cuts=(L // 2,) if L > 2 else ())
    args = {k: (None if v is None else xp.asarray(v)) for k, v in host.items()}
    act = "silu" if act else None
    (y, h), pullback = ssmkit.causal_conv1d_vjp(**args, activation=act, return_final_state=True)
    dy, dh = rng.standard_normal(y.shape), rng.standard_normal(h.shape)
    grads = pullback(xp.asarray(dy), xp.asarray(dh))
    for name in GRAD_FIELDS:
        if host[name].size == 0:
            continue
        v = rng.standard_normal(host[name].shape)
        f = []
        for s in (1, -1):
            moved = dict(args, **{name: xp.asarray(host[name] + s * 1e-6 * v)})
            yy, hh = ssmkit.causal_conv1d(**moved, activation=act, return_final_state=True)
            f.append(np.sum(to_numpy(yy) * dy) + np.sum(to_numpy(hh) * dh))
        fd = (f[0] - f[1]) / 2e-6
        assert abs(fd - np.sum(to_numpy(getattr(grads, name)) * v)) <= 1e-6 * (1 + abs(fd)), name


# ------------------------------------------------------------------------------------------
# Decoding steps: state indices
# ------------------------------------------------------------------------------------------

def _update_case(rng, xp, batch=4, dim=3, W=4, pool=6, T=None):
    shape = (batch, dim) if T is None else (batch, dim, T)
    return (xp.asarray(rng.standard_normal(shape)), xp.asarray(rng.standard_normal((pool, dim, W - 1))),
            xp.asarray(rng.standard_normal((dim, W))), xp.asarray(rng.standard_normal(dim)))


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("T", [None, 3])
def test_update_with_state_indices_and_padding(backend, T):
    xp = xp_for(backend)
    rng = np.random.default_rng(7)
    x, state, w, b = _update_case(rng, xp, T=T)
    idx = np.array([5, -1, 0, 2])
    before = to_numpy(state).copy()
    expected_state = before.copy()
    y_ref = reference.causal_conv1d_update(to_numpy(x), expected_state, to_numpy(w), to_numpy(b),
                                           activation="silu", conv_state_indices=idx)
    y = ssmkit.causal_conv1d_update(x, state, w, b, activation="silu",
                                    conv_state_indices=xp.asarray(idx.astype(np.int32)))
    np.testing.assert_allclose(to_numpy(y), y_ref, rtol=1e-12, atol=1e-12)
    assert not np.any(to_numpy(y)[1])  # padding row: zeros
    np.testing.assert_allclose(to_numpy(state), expected_state, rtol=0, atol=0)
    untouched = [1, 3, 4]
    np.testing.assert_array_equal(to_numpy(state)[untouched], before[untouched])


@pytest.mark.parametrize("backend", backends())
def test_update_refuses_bad_indices_and_writes_nothing(backend):
    xp = xp_for(backend)
    rng = np.random.default_rng(8)
    x, state, w, b = _update_case(rng, xp)
    before = to_numpy(state).copy()
    with pytest.raises(ValueError, match=r"conv_state_indices must be < pool = 6.*got 6"):
        ssmkit.causal_conv1d_update(x, state, w, b, conv_state_indices=xp.asarray([0, 1, 6, -1]))
    with pytest.raises(ValueError, match=r"names conv_state row 2 twice"):
        ssmkit.causal_conv1d_update(x, state, w, b, conv_state_indices=xp.asarray([2, -1, 2, 3]))
    with pytest.raises(TypeError, match=r"conv_state_indices must hold integers"):
        ssmkit.causal_conv1d_update(x, state, w, b, conv_state_indices=xp.asarray([0., 1., 2., 3.]))
    with pytest.raises(ValueError, match=r"pool = batch = 4; got pool = 6"):
        ssmkit.causal_conv1d_update(x, state, w, b)
    np.testing.assert_array_equal(to_numpy(state), before)
    # Repeated negative indices are padding, not a conflict.
    y = ssmkit.causal_conv1d_update(x, state, w, b, conv_state_indices=xp.asarray([-1, -1, 3, -5]))
    assert not np.any(to_numpy(y)[[0, 1, 3]])


@pytest.mark.parametrize("backend", backends())
def test_update_on_strided_state(backend):
    """conv_state as a non-contiguous view (a (pool, W-1, dim) buffer transposed) is updated in place."""
    xp = xp_for(backend)
    rng = np.random.default_rng(9)
    x, _, w, b = _update_case(rng, xp, batch=3, pool=3)
    buf = xp.asarray(rng.standard_normal((3, 3, 3)))  # (pool, W-1, dim)
    state = buf.transpose(0, 2, 1)
    assert not state.flags.c_contiguous
    expected = to_numpy(state).copy()
    y_ref = reference.causal_conv1d_update(to_numpy(x), expected, to_numpy(w), to_numpy(b))
    y = ssmkit.causal_conv1d_update(x, state, w, b)
    np.testing.assert_allclose(to_numpy(y), y_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(to_numpy(buf).transpose(0, 2, 1), expected)


# ------------------------------------------------------------------------------------------
# dtypes, degenerate sizes, errors
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [pytest.param("float16", marks=needs_gpu),
                                   pytest.param("bfloat16", marks=needs_gpu)])
def test_half_precision_on_gpu(dtype):
    pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(11)
    tile = gpu_conv.tile_steps(dtype)
    for W, L, cuts, act in ((4, 2048, (), "silu"), (4, tile + 37, (tile,), None), (7, 77, (5,), "silu"),
                            (1, 16, (), None)):
        inputs = make_inputs(rng, batch=2, dim=5, L=L, W=W, init=True, cuts=cuts)
        check_forward("gpu", dtype, inputs, act)
        check_vjp("gpu", dtype, inputs, act)


@pytest.mark.parametrize("dtype", [pytest.param(d, marks=needs_gpu)
                                   for d in ("float32", "bfloat16")])
def test_gpu_blocks_walking_many_items(dtype, monkeypatch):
    """More tiles than the device holds blocks at once: each block walks several items
    (SSMKIT_CC1D_GRID=resident; float64 launches one block per item). The results match, bit
    for bit, a launch with one block per item (SSMKIT_CC1D_GRID=items), and the reference
    (on a few rows; the weight gradients on the whole problem in the first case)."""
    import cupy

    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    tile = gpu_conv.tile_steps(dtype)
    param = "float32"
    rng = np.random.default_rng(21)
    batch, dim, L = 2, 400, 2 * tile + 9
    # (width 1: no halo, so no barrier of its own between one item's weight-gradient sums
    # and the next item's)
    for case, (W, act, cuts) in enumerate(((4, "silu", ()), (8, None, (tile - 3, tile + 1)),
                                           (3, "silu", (5,)), (1, "silu", ()))):
        inputs = make_inputs(rng, batch=batch, dim=dim, L=L, W=W, init=True, cuts=cuts)
        args, exact = cast(inputs, dtype, cupy)
        key = gpu_conv.KernelKey("bwd", dtype, W, True, act == "silu", bool(cuts))
        kernel = compiler.get_kernel(gpu_conv.SOURCE_FILE, gpu_conv.name_expression(key))
        assert gpu_conv.resident_blocks(kernel) < batch * dim * 3  # blocks walk several items
        dy = as_dtype(rng.standard_normal((batch, dim, L)), dtype)
        dfinal = rng.standard_normal((batch, dim, W - 1)).astype(param)
        runs = []
        for grid in ("resident", "items"):
            monkeypatch.setenv("SSMKIT_CC1D_GRID", grid)
            (y, final), pullback = ssmkit.causal_conv1d_vjp(**args, activation=act,
                                                            return_final_state=True)
            grads = pullback(cupy.asarray(dy), cupy.asarray(dfinal))
            runs.append([to_numpy(a) for a in (y, final) + tuple(grads)])
        for a, b in zip(*runs):
            np.testing.assert_array_equal(a, b)
        y, final, gx, gw, gb, gh0 = runs[0]
        rows = {k: (None if v is None else v[:1, :4] if k in ("x", "initial_state")
                    else v[:4] if k in ("weight", "bias") else v[:1]) for k, v in exact.items()}
        (y_ref, final_ref), pullback_ref = reference.causal_conv1d_vjp(
            **rows, activation=act, return_final_state=True)
        assert rel_err(y[:1, :4], y_ref) <= FORWARD_RTOL[dtype]
        assert rel_err(final[:1, :4], final_ref) <= FORWARD_RTOL[dtype]
        g_ref = pullback_ref(dy[:1, :4].astype(np.float64), dfinal[:1, :4].astype(np.float64))
        assert rel_err(gx[:1, :4], g_ref.x) <= GRAD_RTOL[dtype]
        assert rel_err(gh0[:1, :4], g_ref.initial_state) <= GRAD_RTOL[dtype]
        if case == 0:
            _, pullback_ref = reference.causal_conv1d_vjp(**exact, activation=act,
                                                          return_final_state=True)
            g_ref = pullback_ref(dy.astype(np.float64), dfinal.astype(np.float64))
            assert rel_err(gw, g_ref.weight) <= GRAD_RTOL[dtype]
            assert rel_err(gb, g_ref.bias) <= GRAD_RTOL[dtype]


def test_float16_on_cpu_computes_in_float32():
    rng = np.random.default_rng(12)
    inputs = make_inputs(rng, batch=2, dim=3, L=30, W=4, init=True, cuts=(10,))
    check_forward("cpu", "float16", inputs, "silu")
    check_vjp("cpu", "float16", inputs, "silu")
    x, state, w, b = _update_case(rng, np)
    x, state = x.astype(np.float16), state[:4].astype(np.float16)
    expected = state.astype(np.float64)
    y_ref = reference.causal_conv1d_update(x, expected, w, b)
    y = ssmkit.causal_conv1d_update(x, state, w, b)
    assert y.dtype == np.float16 and state.dtype == np.float16
    assert rel_err(y, y_ref) <= FORWARD_RTOL["float16"]
    np.testing.assert_array_equal(state, expected.astype(np.float16))


@pytest.mark.parametrize("backend", backends())
def test_empty_and_degenerate_sizes(backend):
    xp = xp_for(backend)
    rng = np.random.default_rng(13)
    for batch, dim, L in ((2, 3, 0), (0, 3, 5), (2, 0, 5)):
        W = 4
        x = xp.asarray(rng.standard_normal((batch, dim, L)))
        w = xp.asarray(rng.standard_normal((dim, W)))
        h0 = xp.asarray(rng.standard_normal((batch, dim, W - 1)))
        (y, h), pullback = ssmkit.causal_conv1d_vjp(x, w, initial_state=h0, return_final_state=True)
        assert y.shape == (batch, dim, L)
        np.testing.assert_array_equal(to_numpy(h), to_numpy(h0))
        dh = xp.asarray(rng.standard_normal((batch, dim, W - 1)))
        grads = pullback(None, dh)
        expected = to_numpy(dh) if L == 0 else np.zeros((batch, dim, W - 1))
        if L == 0:
            np.testing.assert_array_equal(to_numpy(grads.initial_state), expected)
        assert grads.weight.shape == (dim, W) and grads.bias is None
    y = ssmkit.causal_conv1d_update(xp.zeros((0, 3)), xp.zeros((0, 3, 3)), xp.ones((3, 4)))
    assert y.shape == (0, 3)


@pytest.mark.parametrize("backend", backends())
def test_pullback_without_cotangents_and_determinism(backend):
    xp = xp_for(backend)
    rng = np.random.default_rng(14)
    args = {k: (None if v is None else xp.asarray(v)) for k, v in make_inputs(
        rng, batch=3, dim=5, L=3000, W=4, init=True, cuts=(1500,)).items()}
    _, pullback = ssmkit.causal_conv1d_vjp(**args, activation="silu")
    zero = pullback()
    for name in GRAD_FIELDS:
        assert not np.any(to_numpy(getattr(zero, name))), name
    dy = xp.asarray(rng.standard_normal((3, 5, 3000)))
    g1, g2 = pullback(dy), pullback(dy)
    for name in GRAD_FIELDS:
        np.testing.assert_array_equal(to_numpy(getattr(g1, name)), to_numpy(getattr(g2, name)))


@pytest.mark.parametrize("backend", backends())
def test_non_contiguous_inputs(backend):
    xp = xp_for(backend)
    rng = np.random.default_rng(17)
    inputs = make_inputs(rng, batch=2, dim=3, L=37, W=4, init=True, cuts=(20,))
    args = {k: (None if v is None else xp.asarray(v)) for k, v in inputs.items()}
    strided = dict(args)
    big = xp.zeros((2, 3, 74))
    big[..., ::2] = args["x"]
    strided["x"] = big[..., ::2]
    strided["weight"] = xp.asfortranarray(args["weight"])
    strided["initial_state"] = xp.asarray(np.asfortranarray(inputs["initial_state"]))
    assert not strided["x"].flags.c_contiguous
    y, h = ssmkit.causal_conv1d(**strided, activation="silu", return_final_state=True)
    y_ref, h_ref = reference.causal_conv1d(**inputs, activation="silu", return_final_state=True)
    assert rel_err(y, y_ref) <= FORWARD_RTOL["float64"]
    assert rel_err(h, h_ref) <= FORWARD_RTOL["float64"]


def test_activation_aliases():
    rng = np.random.default_rng(15)
    x, w = rng.standard_normal((1, 2, 5)), rng.standard_normal((2, 3))
    silu = ssmkit.causal_conv1d(x, w, activation="silu")
    for alias in ("swish", True):
        np.testing.assert_array_equal(ssmkit.causal_conv1d(x, w, activation=alias), silu)
    np.testing.assert_array_equal(ssmkit.causal_conv1d(x, w, activation=False),
                                  ssmkit.causal_conv1d(x, w))


def _good(**changes):
    rng = np.random.default_rng(0)
    args = make_inputs(rng, batch=2, dim=3, L=6, W=4, init=True, cuts=(3,))
    args.update(changes)
    return args


BAD = [
    ("x", np.zeros((2, 3)), ValueError, r"causal_conv1d.*x must have shape \(batch, dim, L\); got 2-d"),
    ("weight", np.zeros((4, 4)), ValueError, r"weight must have shape \(dim, W\) with dim = 3"),
    ("weight", np.zeros((3, 0)), ValueError, r"W >= 1; got W = 0"),
    ("weight", np.zeros(3), ValueError, r"weight must have shape \(dim, W\); got 1-d"),
    ("bias", np.zeros(4), ValueError, r"bias must have shape \(dim,\) = \(3,\); got \(4,\)"),
    ("initial_state", np.zeros((2, 3, 4)), ValueError,
     r"initial_state must have shape \(batch, dim, W-1\) = \(2, 3, 3\); got \(2, 3, 4\)"),
    ("seq_idx", np.zeros((2, 5), dtype=np.int64), ValueError, r"seq_idx must have shape \(batch, L\)"),
    ("seq_idx", np.zeros((2, 6)), TypeError, r"seq_idx must hold integers; got float64"),
    ("seq_idx", np.array([[0, 0, 1, 1, 2, 2], [0, 1, 1, 0, 2, 2]]), ValueError,
     r"seq_idx must be non-decreasing along L; row 1 decreases at position 3"),
    ("x", np.zeros((2, 3, 6), dtype=np.int32), TypeError, r"x must hold real floating-point"),
    ("weight", np.zeros((3, 4), dtype=np.complex64), TypeError, r"weight must hold real floating"),
    ("activation", "relu", ValueError, r"activation must be None or 'silu'.*got 'relu'"),
    ("activation", 1.5, ValueError, r"activation must be None or 'silu'"),
    ("return_final_state", "yes", TypeError, r"return_final_state must be a bool"),
]


@pytest.mark.parametrize("fn", [ssmkit.causal_conv1d, ssmkit.causal_conv1d_vjp])
@pytest.mark.parametrize("name,value,error,message", BAD)
def test_bad_arguments_raise_clear_errors(fn, name, value, error, message):
    with pytest.raises(error, match=message):
        fn(**_good(**{name: value}))


def test_bad_pullback_and_update_arguments():
    rng = np.random.default_rng(16)
    _, pullback = ssmkit.causal_conv1d_vjp(**_good())
    with pytest.raises(ValueError, match=r"dy must have shape \(batch, dim, L\) = \(2, 3, 6\)"):
        pullback(np.zeros((2, 3, 5)))
    with pytest.raises(ValueError, match=r"dfinal_state must have shape \(batch, dim, W-1\)"):
        pullback(None, np.zeros((2, 3, 4)))
    x, state, w, b = _update_case(rng, np, pool=4)
    bad = [
        (dict(x=x[:, :, None, None]), ValueError, r"x must have shape \(batch, dim\) or"),
        (dict(conv_state=state[:, :, :2]), ValueError, r"conv_state must have shape \(pool, dim, W-1\)"),
        (dict(conv_state=state.astype(np.float32)), TypeError, r"conv_state must have the dtype of x"),
        (dict(weight=w[:2]), ValueError, r"weight must have shape \(dim, W\) with dim = 3"),
        (dict(bias=b[:2]), ValueError, r"bias must have shape \(dim,\)"),
        (dict(activation="gelu"), ValueError, r"causal_conv1d_update: activation must be"),
        (dict(conv_state_indices=np.zeros((4, 1), dtype=np.int64)), ValueError,
         r"conv_state_indices must have shape \(batch,\)"),
        (dict(conv_state=state.tolist()), TypeError, r"conv_state must be an array updated in place"),
    ]
    for change, error, message in bad:
        kw = dict(x=x, conv_state=state, weight=w, bias=b)
        kw.update(change)
        with pytest.raises(error, match=message):
            ssmkit.causal_conv1d_update(**kw)
    frozen = state.copy()
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="conv_state is read-only"):
        ssmkit.causal_conv1d_update(x, frozen, w, b)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")
def test_gpu_refuses_widths_past_its_templates_and_mixing():
    import cupy

    with pytest.raises(ValueError, match=r"GPU kernels take widths 1..8; got W = 9"):
        ssmkit.causal_conv1d(cupy.zeros((1, 2, 5)), cupy.zeros((2, 9)))
    with pytest.raises(TypeError, match="must all live on the CPU or all on the GPU"):
        ssmkit.causal_conv1d(cupy.zeros((1, 2, 5)), np.zeros((2, 4)))


# ------------------------------------------------------------------------------------------
# The CUDA source compiles (no GPU needed)
# ------------------------------------------------------------------------------------------

def test_kernel_keys_cover_every_template_value():
    full, rep = gpu_conv.kernel_keys(full=True), gpu_conv.kernel_keys(full=False)
    names = [gpu_conv.name_expression(k) for k in full]
    # fwd_warp, bwd_warp: 3 dtypes x 8 widths x bias x silu each
    assert len(set(names)) == len(names) == 642 + 128 + 128 + 2 * 96
    assert set(rep) <= set(full)
    for kind in ("fwd", "fwd_tile", "fwd_mma", "fwd_warp", "bwd", "bwd_mma", "bwd_warp", "update",
                 "wsum"):
        for field in gpu_conv.KernelKey._fields:
            values = {getattr(k, field) for k in full if k.kind == kind}
            assert {getattr(k, field) for k in rep if k.kind == kind} == values, (kind, field)


def test_resident_blocks_estimate(monkeypatch):
    """The grid of blocks that walk the items: the estimate from registers and shared memory
    (used where CuPy does not give the driver's occupancy figure)."""
    limits = dict(sm_count=132, smem_optin=232448, smem_per_sm=233472, max_warps_per_sm=64,
                  max_blocks_per_sm=32, regs_per_sm=65536)
    monkeypatch.setattr(compiler, "device_limits", lambda: limits)

    class FakeKernel:  # no ``kernel`` handle: the estimate
        def __init__(self, regs, smem):
            self.num_regs, self.shared_size_bytes = regs, smem

    assert gpu_conv.resident_blocks(FakeKernel(80, 320)) == 6 * 132  # 25 warps of 80 registers
    assert gpu_conv.resident_blocks(FakeKernel(32, 320)) == 16 * 132  # 64 warps
    assert gpu_conv.resident_blocks(FakeKernel(255, 320)) == 2 * 132  # 256 per thread: 8 warps
    assert gpu_conv.resident_blocks(FakeKernel(32, 60000)) == 3 * 132  # shared memory


def test_kernels_compile_for_sm90(nvrtc_path):
    keys = gpu_conv.kernel_keys(full=os.environ.get("SSMKIT_NVRTC_FULL") == "1")
    exprs = [gpu_conv.name_expression(k) for k in keys]
    report = _nvrtc_check.compile_kernels(gpu_conv.SOURCE_FILE, exprs, arch="sm_90",
                                          per_program=len(exprs), nvrtc_path=nvrtc_path)
    for key, e in zip(keys, exprs):
        r = report[e]
        assert "registers" in r, e
        if key.kind != "update":  # the streamed kernels keep everything in registers
            # (float64, which has no speed target, may park a value or two: at most 16 bytes,
            # as in cc1d_bwd<double, 5, false, true, true>)
            slack = 16 if "double" in e else 0
            assert r["stack"] <= slack and r["spill_stores"] <= slack, (e, r)
