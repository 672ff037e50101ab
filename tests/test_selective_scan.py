"""ssmkit.selective_scan and selective_scan_vjp against the float64 reference, on every backend."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ssmkit
from ssmkit import reference
from helpers import (FORWARD_RTOL, GRAD_RTOL, backends, cast_inputs, check_scan_vjp_against_fd,
                     gpu_available, random_scan_inputs, rel_err, to_numpy, xp_for)

FIELDS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state")
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def scan_cases(draw, max_L=80):
    """Shapes and options of a selective scan, with a chunk size small enough to carry."""
    L = draw(st.one_of(st.sampled_from([1, 2, 3, 5, 7, 13, 31, 32, 33, 61]),
                       st.integers(1, max_L)))
    G = draw(st.sampled_from([1, 2, 3]))
    dim = G * draw(st.integers(1, 3))
    return dict(
        batch=draw(st.integers(1, 3)), dim=dim, L=L, N=draw(st.sampled_from([1, 2, 3, 4, 5, 8, 16])),
        b_form=draw(st.sampled_from(["const", "step", "group"])),
        c_form=draw(st.sampled_from(["const", "step", "group"])),
        groups=G,
        with_D=draw(st.booleans()), with_z=draw(st.booleans()),
        with_bias=draw(st.booleans()), softplus=draw(st.booleans()),
        with_init=draw(st.booleans()),
    ), draw(st.sampled_from([None, 1, 2, 3, 4, 7, 16])), draw(st.integers(0, 2**32 - 1))


def _check_forward(backend, dtype, case, chunk, seed):
    rng = np.random.default_rng(seed)
    inputs, exact = cast_inputs(random_scan_inputs(rng, **case), dtype, xp_for(backend))
    kw = dict(delta_softplus=case.get("softplus", True), return_final_state=True)
    y, final = ssmkit.selective_scan(**inputs, **kw, chunk_size=chunk)
    y_ref, final_ref = reference.selective_scan(**exact, **kw)
    assert y.dtype == inputs["u"].dtype and y.shape == y_ref.shape
    assert type(y) is type(inputs["u"])
    assert rel_err(y, y_ref) <= FORWARD_RTOL[dtype]
    assert rel_err(final, final_ref) <= FORWARD_RTOL[dtype]


def _check_vjp(backend, dtype, case, chunk, seed):
    rng = np.random.default_rng(seed)
    xp = xp_for(backend)
    inputs, exact = cast_inputs(random_scan_inputs(rng, **case), dtype, xp)
    kw = dict(delta_softplus=case.get("softplus", True), return_final_state=True)
    (y, final), pullback = ssmkit.selective_scan_vjp(**inputs, **kw, chunk_size=chunk)
    (y_ref, final_ref), pullback_ref = reference.selective_scan_vjp(**exact, **kw)
    dy64 = rng.standard_normal(y_ref.shape)
    dfinal64 = rng.standard_normal(final_ref.shape)
    dy = cast_inputs({"u": dy64}, dtype, xp)[0]["u"]
    grads = pullback(dy, xp.asarray(dfinal64.astype(final.dtype)))
    grads_ref = pullback_ref(to_numpy(dy).astype(np.float64), dfinal64)
    assert rel_err(y, y_ref) <= FORWARD_RTOL[dtype]
    for name in FIELDS:
        g, g_ref = getattr(grads, name), getattr(grads_ref, name)
        if inputs[name] is None:
            assert g is None and g_ref is None, name
            continue
        assert g.shape == inputs[name].shape and g.dtype == inputs[name].dtype, name
        assert rel_err(g, g_ref) <= GRAD_RTOL[dtype], name


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@settings(max_examples=30, **SETTINGS)
@given(args=scan_cases())
def test_forward_matches_reference(backend, dtype, args):
    _check_forward(backend, dtype, *args)


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@settings(max_examples=30, **SETTINGS)
@given(args=scan_cases())
def test_vjp_matches_reference(backend, dtype, args):
    _check_vjp(backend, dtype, *args)


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("L", [1, 2, 17, 31, 32, 33, 127, 255, 256, 257, 263, 600])
def test_lengths_across_default_chunks(backend, L):
    """Lengths around the default chunk (256) and primes, every option on."""
    case = dict(batch=2, dim=4, L=L, N=16, b_form="step", c_form="group", groups=2,
                with_init=True)
    _check_forward(backend, "float32", case, None, L)
    _check_vjp(backend, "float64", case, None, L)


@pytest.mark.parametrize("dtype", [
    pytest.param("float16", marks=[pytest.mark.gpu]),
    pytest.param("bfloat16", marks=[pytest.mark.gpu]),
])
@pytest.mark.parametrize("chunk", [None, 3])
def test_half_precision_on_gpu(dtype, chunk):
    pytest.importorskip("ml_dtypes")
    from helpers import gpu_available

    if not gpu_available():
        pytest.skip("needs a CUDA GPU and CuPy")
    for seed, (b_form, c_form) in enumerate([("step", "step"), ("group", "const"),
                                             ("const", "group")]):
        case = dict(batch=2, dim=6, L=77, N=16, b_form=b_form, c_form=c_form, groups=3,
                    with_init=True)
        _check_forward("gpu", dtype, case, chunk, seed)
        _check_vjp("gpu", dtype, case, chunk, seed)


def test_float16_on_cpu_computes_in_float32():
    case = dict(batch=2, dim=3, L=40, N=4)
    _check_forward("cpu", "float16", case, 8, 0)
    _check_vjp("cpu", "float16", case, 8, 1)


@pytest.mark.parametrize("backend", backends())
@settings(max_examples=20, **SETTINGS)
@given(args=scan_cases(max_L=60), split=st.floats(0.0, 1.0))
def test_split_with_carried_state_equals_whole(backend, args, split):
    """Scanning a prefix, then the rest from its final state, equals one scan."""
    case, chunk, seed = args
    rng = np.random.default_rng(seed)
    xp = xp_for(backend)
    inputs, _ = cast_inputs(random_scan_inputs(rng, **case), "float64", xp)
    kw = dict(delta_softplus=case.get("softplus", True), return_final_state=True, chunk_size=chunk)
    y, final = ssmkit.selective_scan(**inputs, **kw)
    k = int(round(split * case["L"]))

    def part(sl, init):
        out = dict(inputs, initial_state=init)
        for name in ("u", "delta", "z"):
            if out[name] is not None:
                out[name] = out[name][..., sl]
        for name in ("B", "C"):
            if out[name].ndim > 2:
                out[name] = out[name][..., sl]
        return out

    y1, h1 = ssmkit.selective_scan(**part(slice(0, k), inputs["initial_state"]), **kw)
    y2, h2 = ssmkit.selective_scan(**part(slice(k, None), h1), **kw)
    np.testing.assert_allclose(to_numpy(xp.concatenate([y1, y2], axis=-1)), to_numpy(y),
                               rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(to_numpy(h2), to_numpy(final), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", backends())
@settings(max_examples=15, **SETTINGS)
@given(args=scan_cases(max_L=40))
def test_vjp_matches_finite_differences(backend, args):
    """<pullback(dy, dh), v> equals the directional derivative of <y, dy> + <h, dh>."""
    case, chunk, seed = args
    check_scan_vjp_against_fd(xp_for(backend), case, chunk, seed, FIELDS)


@pytest.mark.parametrize("backend", backends())
def test_result_independent_of_chunk_size(backend):
    rng = np.random.default_rng(7)
    xp = xp_for(backend)
    case = dict(batch=2, dim=4, L=101, N=8, b_form="group", c_form="step", groups=2,
                with_init=True)
    inputs, _ = cast_inputs(random_scan_inputs(rng, **case), "float64", xp)
    dy = xp.asarray(rng.standard_normal((2, 4, 101)))
    results = []
    for chunk in (1, 2, 5, 32, 100, 101, 1000):
        out, pullback = ssmkit.selective_scan_vjp(**inputs, delta_softplus=True,
                                                  chunk_size=chunk)
        results.append((to_numpy(out), [to_numpy(g) for g in pullback(dy)]))
    for out, grads in results[1:]:
        np.testing.assert_allclose(out, results[0][0], rtol=1e-11, atol=1e-12)
        for g, g0 in zip(grads, results[0][1]):
            if g0 is not None:
                np.testing.assert_allclose(g, g0, rtol=1e-9, atol=1e-11)


def _held_nbytes(obj, xp, seen):
    """Bytes of every array reachable from ``obj`` through containers, dataclasses and the
    pullback's attributes (each array counted once)."""
    import dataclasses

    if isinstance(obj, (np.ndarray, xp.ndarray)):
        while obj.base is not None:  # a view holds its base's memory
            obj = obj.base
        if id(obj) in seen:
            return 0
        seen.add(id(obj))
        return obj.nbytes
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, dict):
        children = obj.values()
    elif isinstance(obj, (list, tuple)):
        children = obj
    elif dataclasses.is_dataclass(obj) or isinstance(obj, ssmkit.SelectiveScanPullback):
        children = vars(obj).values()
    else:
        return 0
    return sum(_held_nbytes(v, xp, seen) for v in children)


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("chunk", [8, 64])
def test_vjp_keeps_inputs_plus_chunk_states_only(backend, chunk):
    """What the pullback holds is the inputs plus batch*dim*N*ceil(L/chunk) floats."""
    rng = np.random.default_rng(3)
    xp = xp_for(backend)
    batch, dim, L, N = 2, 8, 500, 16
    case = dict(batch=batch, dim=dim, L=L, N=N, with_init=True)
    inputs, _ = cast_inputs(random_scan_inputs(rng, **case), "float32", xp)
    _, pullback = ssmkit.selective_scan_vjp(**inputs, delta_softplus=True, chunk_size=chunk)
    input_bytes = sum(x.nbytes for x in inputs.values() if x is not None)
    held = _held_nbytes(pullback, xp, set())
    chunk_states = batch * dim * N * -(-L // chunk) * 4
    assert held <= input_bytes + chunk_states
    assert held >= input_bytes  # it does keep what the backward needs
    per_step_states = batch * dim * N * L * 4
    assert held - input_bytes < per_step_states / 4
    ckpt = pullback.residuals["checkpoints"]
    assert ckpt.size == batch * dim * N * -(-L // chunk)


@pytest.mark.parametrize("backend", backends())
def test_empty_and_degenerate_sizes(backend):
    xp = xp_for(backend)
    rng = np.random.default_rng(0)
    for batch, dim, L in [(2, 3, 0), (0, 3, 5), (2, 0, 5)]:
        N = 4
        inputs = dict(u=rng.standard_normal((batch, dim, L)),
                      delta=rng.standard_normal((batch, dim, L)),
                      A=-np.ones((dim, N)), B=rng.standard_normal((batch, N, L)),
                      C=rng.standard_normal((batch, 1, N, L)),
                      initial_state=rng.standard_normal((batch, dim, N)))
        inputs = {k: xp.asarray(v) for k, v in inputs.items()}
        (y, h), pullback = ssmkit.selective_scan_vjp(**inputs, return_final_state=True)
        assert y.shape == (batch, dim, L)
        np.testing.assert_array_equal(to_numpy(h), to_numpy(inputs["initial_state"]))
        dh = xp.asarray(rng.standard_normal((batch, dim, N)))
        grads = pullback(xp.zeros((batch, dim, L)), dh)
        np.testing.assert_array_equal(to_numpy(grads.initial_state), to_numpy(dh))
        assert grads.B.shape == (batch, N, L) and float(abs(grads.A).sum()) == 0.0


@pytest.mark.parametrize("backend", backends())
def test_non_contiguous_inputs(backend):
    rng = np.random.default_rng(11)
    xp = xp_for(backend)
    case = dict(batch=2, dim=4, L=37, N=5, b_form="step", c_form="const", with_init=True)
    inputs, exact = cast_inputs(random_scan_inputs(rng, **case), "float64", xp)
    strided = {}
    for name, x in inputs.items():  # same values, non-contiguous layouts
        big = xp.zeros(x.shape[:-1] + (2 * x.shape[-1],), dtype=x.dtype)
        big[..., ::2] = x
        strided[name] = big[..., ::2]
    strided["u"] = xp.asfortranarray(inputs["u"])
    assert not strided["delta"].flags.c_contiguous
    y = ssmkit.selective_scan(**strided, delta_softplus=True)
    y_ref = reference.selective_scan(**exact, delta_softplus=True)
    assert rel_err(y, y_ref) <= FORWARD_RTOL["float64"]


def test_reference_vjp_matches_finite_differences():
    """The oracle itself: its pullback against central differences of its forward."""
    rng = np.random.default_rng(5)
    for b_form, c_form in [("const", "step"), ("group", "const"), ("step", "group")]:
        case = dict(batch=2, dim=4, L=9, N=3, b_form=b_form, c_form=c_form, groups=2,
                    with_init=True)
        args = random_scan_inputs(rng, **case)
        (y, h), pullback = reference.selective_scan_vjp(**args, delta_softplus=True,
                                                         return_final_state=True)
        dy, dh = rng.standard_normal(y.shape), rng.standard_normal(h.shape)
        grads = pullback(dy, dh)
        for name in FIELDS:
            v = rng.standard_normal(args[name].shape)
            f = [np.sum(yy * dy) + np.sum(hh * dh) for yy, hh in (
                reference.selective_scan(**dict(args, **{name: args[name] + s * 1e-6 * v}),
                                         delta_softplus=True, return_final_state=True)
                for s in (1, -1))]
            fd = (f[0] - f[1]) / 2e-6
            assert abs(fd - np.sum(getattr(grads, name) * v)) <= 1e-6 * (1 + abs(fd)), name


def test_softplus_threshold_matches_contract():
    x = np.array([-30.0, -1.0, 0.0, 19.9, 20.0, 20.1, 50.0])
    expected = np.where(x <= 20, np.log1p(np.exp(np.minimum(x, 20))), x)
    np.testing.assert_array_equal(reference.softplus(x), expected)


@pytest.mark.parametrize("backend", backends())
def test_float32_stays_accurate_over_long_sequences(backend):
    """float32 at L = 32768 stays within 1e-5 (relative, norm-wise) of the float64 reference."""
    rng = np.random.default_rng(2024)
    case = dict(batch=1, dim=4, L=32768, N=16, b_form="step", c_form="step", with_init=True)
    inputs, exact = cast_inputs(random_scan_inputs(rng, **case), "float32", xp_for(backend))
    y, final = ssmkit.selective_scan(**inputs, delta_softplus=True, return_final_state=True)
    y_ref, final_ref = reference.selective_scan(**exact, delta_softplus=True,
                                                return_final_state=True)
    assert rel_err(y, y_ref) <= 1e-5
    assert rel_err(final, final_ref) <= 1e-5


def _force_segments(monkeypatch, gpu_scan, segments):
    """Split time into ``segments`` (as far as the chunks allow) on inputs however small."""
    monkeypatch.setitem(gpu_scan.TUNING, "force_segments", segments)
    monkeypatch.setitem(gpu_scan.TUNING, "min_seg_steps", 1)
    monkeypatch.setitem(gpu_scan.TUNING, "bwd_min_seg_steps", 1)


def _record_launches(monkeypatch, gpu_scan, entry=lambda key, plan: key.kind):
    """``entry(key, plan)`` (the kind) of each GPU kernel launched from here on, in a list that
    grows."""
    kinds = []
    launch = gpu_scan._launch
    monkeypatch.setattr(gpu_scan, "_launch", lambda key, plan, args: (kinds.append(entry(key, plan)),
                                                                      launch(key, plan, args)))
    return kinds


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("npt8_min_n", [None, 9])
@pytest.mark.parametrize("segments", [1, 2])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_gpu_ring_forward_wide_blocks_match_reference(monkeypatch, segments, dtype, npt8_min_n):
    """The ring forward in blocks of more than 256 threads (ssm_scan_fwd_ring_wide): planned
    for one SM, so that the widest block wins, on shapes whose B/C groups hold 16 to 128
    channels (N 128 to 16, N past a multiple of 4, chunk carries, time segments), at 4 states
    per lane (blocks of 512 threads) and at 8 (TUNING["fwd_ring_npt8_min_n"]: 384 threads, 24
    and 48 channels, where the channels of a B/C group allow): outputs, final states and
    gradients equal the reference, and the kernel asked for ran."""
    from ssmkit._gpu import compiler
    from ssmkit._gpu import selective_scan as gpu_scan

    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    _force_segments(monkeypatch, gpu_scan, segments)
    monkeypatch.setitem(gpu_scan.TUNING, "fwd_ring_max_n", 128)
    monkeypatch.setitem(gpu_scan.TUNING, "fwd_ring_wide_min_n", 1)
    monkeypatch.setitem(gpu_scan.TUNING, "fwd_ring_npt8_min_n", npt8_min_n)
    monkeypatch.setitem(gpu_scan.TUNING, "fwd_ring_npt8_min_warps", 0)  # (one SM: thin grids)
    limits = compiler.device_limits()
    monkeypatch.setattr(compiler, "device_limits", lambda: dict(limits, sm_count=1))
    launches = _record_launches(monkeypatch, gpu_scan, lambda key, plan: (key.kind, plan["threads"], key.npt))
    # (case, chunk, the main pass's threads at 4 states per lane, at 8)
    cases = [
        (dict(batch=1, dim=48, L=72, N=128, b_form="step", c_form="step", with_init=True), 32, 512, 384),
        (dict(batch=2, dim=96, L=48, N=64, b_form="step", c_form="step", with_init=False), 16, 512, 384),
        (dict(batch=1, dim=64, L=56, N=61, b_form="step", c_form="group", groups=2, with_init=True,
              with_z=False, softplus=False), None, 512, 256),
        (dict(batch=1, dim=128, L=40, N=16, b_form="step", c_form="step", with_init=True), 8, 512, 256),
    ]
    for seed, (case, chunk, threads4, threads8) in enumerate(cases):
        launches.clear()
        _check_forward("gpu", dtype, case, chunk, 750 + seed)
        want = (threads8, 8) if npt8_min_n is not None else (threads4, 4)
        assert ("fwd_ring_wide", *want) in launches, launches
        _check_vjp("gpu", dtype, case, chunk, 750 + seed)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("segments", [1, 3])
@pytest.mark.parametrize("mode", [True, False, "auto"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_gpu_forward_staging_modes_match_reference(monkeypatch, segments, mode, dtype):
    """Both forwards (tile staging through cp.async copies, or straight from global memory)
    and the "auto" choice between them, with and without time segments, equal the reference;
    the two forwards agree bit for bit."""
    from ssmkit._gpu import selective_scan as gpu_scan

    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    monkeypatch.setitem(gpu_scan.TUNING, "fwd_async", mode)
    _force_segments(monkeypatch, gpu_scan, segments)
    cases = [
        (dict(batch=2, dim=5, L=203, N=16, b_form="step", c_form="group", groups=1,
              with_init=True), 64),
        (dict(batch=1, dim=3, L=77, N=40, b_form="group", c_form="step", groups=1,
              with_init=False), 16),
    ]
    for seed, (case, chunk) in enumerate(cases):
        _check_forward("gpu", dtype, case, chunk, 900 + seed)
        _check_vjp("gpu", dtype, case, chunk, 900 + seed)
        inputs, _ = cast_inputs(random_scan_inputs(np.random.default_rng(950 + seed), **case),
                                dtype, xp_for("gpu"))
        outs = []
        for m in (True, False):
            monkeypatch.setitem(gpu_scan.TUNING, "fwd_async", m)
            y = ssmkit.selective_scan(**inputs, delta_softplus=True, chunk_size=chunk)
            outs.append(to_numpy(y).astype(np.float64))
        assert np.array_equal(outs[0], outs[1])


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("segments", [1, 3])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_gpu_ring_forward_matches_reference(monkeypatch, segments, dtype):
    """The ring forward kernels (shapes they take: L and the chunk multiples of 8 steps, B and
    C per step, N <= 128; N from 1 to 128, tiny chunks so checkpoints and tiles carry, tiles with
    and without a 16-step block, with and without time segments) equal the reference, and
    they ran; a misaligned view falls back."""
    from ssmkit._gpu import selective_scan as gpu_scan

    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    _force_segments(monkeypatch, gpu_scan, segments)
    monkeypatch.setitem(gpu_scan.TUNING, "fwd_ring_max_n", 128)
    kinds = _record_launches(monkeypatch, gpu_scan)
    cases = [
        (dict(batch=2, dim=6, L=200, N=16, b_form="step", c_form="group", groups=2,
              with_init=True), 16),
        (dict(batch=1, dim=4, L=48, N=1, b_form="step", c_form="step", with_init=False), 8),
        (dict(batch=2, dim=3, L=40, N=5, b_form="group", c_form="step", groups=3,
              with_init=True, with_z=False, softplus=False), 8),
        (dict(batch=1, dim=2, L=72, N=3, b_form="step", c_form="step", with_init=True), 24),
        (dict(batch=2, dim=64, L=136, N=9, b_form="step", c_form="step", with_init=True), None),
        (dict(batch=3, dim=8, L=8, N=16, b_form="step", c_form="step", with_init=True), None),
        # N > 16: 8 to 32 lanes per channel (one channel per warp at N > 64)
        (dict(batch=2, dim=8, L=96, N=37, b_form="step", c_form="step", with_init=True), 16),
        (dict(batch=1, dim=4, L=64, N=128, b_form="step", c_form="group", groups=2,
              with_init=True), 24),
        (dict(batch=2, dim=6, L=48, N=64, b_form="group", c_form="step", groups=3,
              with_init=False, with_z=False), None),
    ]
    for seed, (case, chunk) in enumerate(cases):
        kinds.clear()
        _check_forward("gpu", dtype, case, chunk, 700 + seed)
        assert {"fwd_ring", "fwd_ring_wide"} & set(kinds), kinds
        _check_vjp("gpu", dtype, case, chunk, 700 + seed)
    # A view starting 2 elements into its buffer is not 16-byte aligned: the other kernels.
    case = dict(batch=1, dim=2, L=64, N=16, b_form="step", c_form="step")
    inputs, exact = cast_inputs(random_scan_inputs(np.random.default_rng(5), **case), dtype,
                                xp_for("gpu"))
    xp = xp_for("gpu")
    flat = xp.zeros(2 + inputs["u"].size, dtype=inputs["u"].dtype)
    flat[2:] = inputs["u"].ravel()
    inputs["u"] = flat[2:].reshape(inputs["u"].shape)  # contiguous, 2 elements off
    kinds.clear()
    y = ssmkit.selective_scan(**inputs, delta_softplus=True)
    assert not {"fwd_ring", "fwd_ring_wide"} & set(kinds) and kinds, kinds
    y_ref = reference.selective_scan(**exact, delta_softplus=True)
    assert rel_err(y, y_ref) <= FORWARD_RTOL[dtype]


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("segments", [1, 3])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_gpu_ring_backward_matches_reference(monkeypatch, segments, dtype):
    """The ring backward kernel (the ring forward's shapes with a warp of channels per B/C
    group: 32 / NSPLIT): N from 1 to 16, several tiles per chunk, chunks ending in half
    sub-blocks (float32), blocks of one and several warps, with and without time segments
    (then its summary pass through the ring, also turned off), equals the reference and ran;
    with too few channels per group the other kernel runs."""
    from ssmkit._gpu import selective_scan as gpu_scan

    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    _force_segments(monkeypatch, gpu_scan, segments)
    kinds = _record_launches(monkeypatch, gpu_scan)
    odd = 20 if dtype == "float32" else 24  # a chunk of 2.5 sub-blocks where 4 steps are whole
    cases = [
        (dict(batch=2, dim=16, L=200, N=16, b_form="step", c_form="group", groups=2,
              with_init=True), 96),
        (dict(batch=1, dim=32, L=48, N=1, b_form="step", c_form="step", with_init=False), 8),
        (dict(batch=2, dim=16, L=2 * odd, N=5, b_form="step", c_form="step", with_init=True,
              with_z=False, softplus=False), odd),
        (dict(batch=2, dim=64, L=136, N=9, b_form="step", c_form="step", with_init=True), None),
        (dict(batch=3, dim=8, L=8, N=16, b_form="step", c_form="step", with_init=True), None),
        (dict(batch=1, dim=256, L=264, N=16, b_form="group", c_form="group", groups=2,
              with_D=False, with_bias=False), 80),
    ]
    ring_summary = False
    for seed, (case, chunk) in enumerate(cases):
        kinds.clear()
        _check_vjp("gpu", dtype, case, chunk, 800 + seed)
        assert "bwd_ring" in kinds and "bwd" not in kinds and "bwd_sum" not in kinds, kinds
        ring_summary |= "bwd_sum_ring" in kinds
    assert ring_summary == (segments > 1)
    if segments > 1:  # the summary pass of before (ssm_scan_bwd_sum) on the ring backward
        monkeypatch.setitem(gpu_scan.TUNING, "bwd_sum_ring", False)
        kinds.clear()
        _check_vjp("gpu", dtype, *cases[0], 800)
        assert "bwd_sum" in kinds and "bwd_sum_ring" not in kinds, kinds
        monkeypatch.setitem(gpu_scan.TUNING, "bwd_sum_ring", True)
    # 3 channels per group: fewer than a warp's 8 at N = 16.
    kinds.clear()
    _check_vjp("gpu", dtype, dict(batch=1, dim=6, L=64, N=16, b_form="group", c_form="step",
                                  groups=2), 16, 850)
    assert "bwd" in kinds and "bwd_ring" not in kinds, kinds
    # Blocks of several warps (dB, dC summed over them): the planner spreads small grids over
    # the SMs in one-warp blocks, so plan for a device of one SM.
    limits = gpu_scan.compiler.device_limits
    gpu_scan.compiler.device_limits = lambda: dict(limits(), sm_count=1)
    gpu_scan._cached_plan.cache_clear()
    try:
        for seed in (0, 5):
            kinds.clear()
            _check_vjp("gpu", dtype, *cases[seed], 860 + seed)
            assert "bwd_ring" in kinds, kinds
    finally:
        gpu_scan.compiler.device_limits = limits
        gpu_scan._cached_plan.cache_clear()


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("width", [16, 32])
@pytest.mark.parametrize("segments", [1, 3])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_gpu_backward_by_state_slices_matches_reference(monkeypatch, segments, dtype, width):
    """The backward of N > ``width`` as slices of ``width`` states through the ring backward
    (``TUNING["bwd_ring_max_n"]`` 16, or 32: 8 lanes a channel, and N 17 to 32 in one pass;
    a last slice of 1 to ``width`` states; D, z, initial states and a final-state cotangent
    or not; several tiles per chunk; with and without time segments; 16-bit u on float32
    copies): each slice's ring backward ran, no other backward did, the gradients equal the
    reference and those of the backward over all states within rounding (float32's, or one
    rounding to u's 16 bits); without a chunk_size the VJP keeps a state every few slice
    tiles."""
    from ssmkit._gpu import selective_scan as gpu_scan

    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    _force_segments(monkeypatch, gpu_scan, segments)
    monkeypatch.setitem(gpu_scan.TUNING, "bwd_ring_max_n", width)
    monkeypatch.setitem(gpu_scan.TUNING, "bwd_state_slices_min_warps", 0)  # small grids too
    kinds = _record_launches(monkeypatch, gpu_scan)
    xp = xp_for("gpu")
    cases = [
        (dict(batch=2, dim=32, L=200, N=37, b_form="step", c_form="group", groups=2,
              with_init=True), 96),
        (dict(batch=1, dim=32, L=136, N=17, b_form="step", c_form="step", with_D=False,
              with_init=False, with_z=False), 8),
        (dict(batch=2, dim=64, L=264, N=64, b_form="group", c_form="step", groups=2,
              with_init=True, softplus=False), None),
        (dict(batch=1, dim=8, L=48, N=128, b_form="step", c_form="step", with_init=True), 16),
    ]
    for seed, (case, chunk) in enumerate(cases):
        monkeypatch.setitem(gpu_scan.TUNING, "bwd_state_slices_from", 17)
        kinds.clear()
        _check_vjp("gpu", dtype, case, chunk, 880 + seed)
        slices = -(-case["N"] // width)
        assert kinds.count("bwd_ring") == slices and "bwd" not in kinds, kinds
        inputs, _ = cast_inputs(random_scan_inputs(np.random.default_rng(seed), **case),
                                dtype, xp)
        kw = dict(delta_softplus=case.get("softplus", True), return_final_state=True)
        (y, final), pullback = ssmkit.selective_scan_vjp(**inputs, **kw, chunk_size=chunk)
        if chunk is None:  # checkpoints: the fewest whole slice tiles as large as u
            tl = gpu_scan._slice_plan(pullback._problem, width)["tl"]
            interval = pullback._problem.chunk_size
            least = case["N"] * 4 // inputs["u"].dtype.itemsize  # float32 states, u's bytes
            assert interval % tl == 0 and least <= interval < least + tl, (interval, tl)
        rng = np.random.default_rng(seed + 1)
        cot = [xp.asarray(rng.standard_normal(a.shape), dtype=np.float32) for a in (y, final)]
        grads = {}
        for on in (True, False):
            monkeypatch.setitem(gpu_scan.TUNING, "bwd_state_slices_from", 17 if on else None)
            g = pullback(*cot)
            grads[on] = {f: to_numpy(getattr(g, f)).astype(np.float64) for f in FIELDS
                         if getattr(g, f) is not None}
        tol = 1e-5 if dtype == "float32" else 8e-3
        # (float16's du may overflow where ssm_scan_bwd's does too: the same entries, then
        # the finite ones compared)
        live = np.isfinite(grads[False]["u"])
        for f, g0 in grads[False].items():
            g1 = grads[True][f]
            assert np.array_equal(np.isfinite(g1), np.isfinite(g0)), f
            g0, g1 = (np.where(np.isfinite(g0), g0, 0.0), np.where(np.isfinite(g1), g1, 0.0))
            scale = max(np.linalg.norm(g0), 1e-2 * np.linalg.norm(grads[False]["u"][live]))
            assert np.linalg.norm(g1 - g0) <= tol * scale, f


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_backward_by_state_slices_in_two_lanes(monkeypatch, dtype):
    """The slices in two lanes (odd slices on a second stream, adding into buffers of their
    own): the gradients equal the reference, those of one lane within rounding, and the same
    bit for bit from call to call (the lanes' work and sums fixed by the problem)."""
    from ssmkit._gpu import selective_scan as gpu_scan

    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    monkeypatch.setitem(gpu_scan.TUNING, "bwd_state_slices_from", 17)
    xp = xp_for("gpu")
    cases = [
        (dict(batch=2, dim=32, L=200, N=37, b_form="step", c_form="group", groups=2,
              with_init=True), 96),
        (dict(batch=1, dim=64, L=136, N=128, b_form="step", c_form="step", with_D=False,
              with_init=False), None),
    ]
    for seed, (case, chunk) in enumerate(cases):
        inputs, _ = cast_inputs(random_scan_inputs(np.random.default_rng(seed), **case), dtype, xp)
        kw = dict(delta_softplus=True, return_final_state=True)
        grads = {}
        for lanes in (2, 2, 1):
            monkeypatch.setitem(gpu_scan.TUNING, "bwd_state_slices_min_warps", 0)
            monkeypatch.setitem(gpu_scan.TUNING, "bwd_state_slices_lanes", lanes)
            (y, final), pullback = ssmkit.selective_scan_vjp(**inputs, **kw, chunk_size=chunk)
            assert gpu_scan._slice_lanes(pullback._problem) == lanes
            rng = np.random.default_rng(seed + 1)
            cot = [xp.asarray(rng.standard_normal(a.shape), dtype=np.float32) for a in (y, final)]
            g = pullback(*cot)
            grads.setdefault(lanes, []).append({f: to_numpy(getattr(g, f)).astype(np.float64)
                                                for f in FIELDS if getattr(g, f) is not None})
        for f, g2 in grads[2][0].items():
            assert np.array_equal(g2, grads[2][1][f]), f
            g1 = grads[1][0][f]
            scale = max(np.linalg.norm(g1), 1e-2 * np.linalg.norm(grads[1][0]["u"]))
            assert np.linalg.norm(g2 - g1) <= (1e-5 if dtype == "float32" else 8e-3) * scale, f
        monkeypatch.setitem(gpu_scan.TUNING, "bwd_state_slices_lanes", 2)
        _check_vjp("gpu", dtype, case, chunk, 890 + seed)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")
@settings(max_examples=12, **SETTINGS)
@given(N=st.integers(17, 80), groups=st.sampled_from([1, 2]), L=st.sampled_from([4, 8, 36, 132]),
       chunk=st.sampled_from([None, 4, 8, 20, 64]), options=st.fixed_dictionaries(dict(
           with_D=st.booleans(), with_z=st.booleans(), with_bias=st.booleans(),
           softplus=st.booleans(), with_init=st.booleans())),
       dtype=st.sampled_from(["float32", "bfloat16"]), width=st.sampled_from([16, 32]),
       seed=st.integers(0, 2**32 - 1))
def test_gpu_backward_by_state_slices_fuzzed(N, groups, L, chunk, options, dtype, width, seed):
    """The sliced backward (N > ``width``, every slice of ``width`` states through the ring
    backward, ``TUNING["bwd_ring_max_n"]``; N 17 to 32 at width 32: one pass; bfloat16 u on
    float32 copies) on fresh random problems: N 17 to 80 (last slices of 1 to ``width``
    states), lengths of one ring quantum to past a chunk, chunks of 4 steps up, every option:
    the VJP against the reference."""
    from ssmkit._gpu import selective_scan as gpu_scan

    case = dict(batch=2, dim=32 * groups, L=L, N=N, b_form="group", c_form="step",
                groups=groups, **options)
    saved = dict(gpu_scan.TUNING)
    kinds = []
    launch = gpu_scan._launch
    gpu_scan.TUNING.update(bwd_state_slices_from=17, bwd_state_slices_min_warps=0, bwd_ring_max_n=width)
    gpu_scan._launch = lambda key, plan, args: (kinds.append(key.kind), launch(key, plan, args))
    try:
        _check_vjp("gpu", dtype, case, chunk, seed)
    finally:
        gpu_scan._launch = launch
        gpu_scan.TUNING.clear()
        gpu_scan.TUNING.update(saved)
    # (one pass at N <= width where the ring's case holds: bfloat16 steps and chunks in 8s)
    if N > width or dtype == "float32" or (L % 8 == 0 and chunk in (None, 8, 64)):
        assert kinds.count("bwd_ring") == -(-N // width) and "bwd" not in kinds, kinds


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("segments", [1, 3])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_gpu_vjp_checkpoints_every_backward_tile(monkeypatch, segments, dtype):
    """Without a chunk_size, the GPU VJP of the ring kernels' shapes keeps a state every
    backward tile (16 to 64 steps), written by the ring forward between its longer tiles;
    gradients equal the reference, and a given chunk_size is kept."""
    from ssmkit._gpu import selective_scan as gpu_scan

    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    _force_segments(monkeypatch, gpu_scan, segments)
    kinds = _record_launches(monkeypatch, gpu_scan)
    xp = xp_for("gpu")
    for seed, (L, N) in enumerate([(1000, 16), (136, 9), (264, 1)]):
        case = dict(batch=2, dim=64, L=L, N=N, b_form="step", c_form="group", groups=2,
                    with_init=True)
        kinds.clear()
        _check_vjp("gpu", dtype, case, None, 900 + seed)
        assert {"fwd_ring", "fwd_ring_wide"} & set(kinds) and "bwd_ring" in kinds, kinds
        inputs, _ = cast_inputs(random_scan_inputs(np.random.default_rng(seed), **case), dtype, xp)
        _, pullback = ssmkit.selective_scan_vjp(**inputs, delta_softplus=True)
        problem = pullback._problem
        tl = gpu_scan._plan(problem, "bwd_ring")["tl"]
        assert tl % 16 == 0 and tl < 256 and problem.chunk_size == tl
        assert pullback.residuals["checkpoints"].size == 2 * 64 * N * -(-L // tl)
        _, pullback = ssmkit.selective_scan_vjp(**inputs, delta_softplus=True, chunk_size=256)
        assert pullback.residuals["checkpoints"].size == 2 * 64 * N * -(-L // 256)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("segments", [2, 3, 7])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_gpu_time_segments_match_reference(monkeypatch, segments, dtype):
    """Time split across blocks (segment summaries, carry, rescan; and in reverse for the
    backward), forced on small inputs with tiny chunks, equals the reference."""
    from ssmkit._gpu import selective_scan as gpu_scan

    _force_segments(monkeypatch, gpu_scan, segments)
    cases = [
        (dict(batch=2, dim=4, L=100, N=16, b_form="step", c_form="group", groups=2,
              with_init=True), 4),
        (dict(batch=1, dim=3, L=61, N=5, b_form="const", c_form="step", with_init=False), 3),
        (dict(batch=2, dim=2, L=37, N=8, b_form="group", c_form="const", groups=2,
              with_init=True, with_z=False, softplus=False), 1),
    ]
    for seed, (case, chunk) in enumerate(cases):
        _check_forward("gpu", dtype, case, chunk, seed)
        _check_vjp("gpu", dtype, case, chunk, seed)
