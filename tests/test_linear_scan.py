"""ssmkit.linear_scan on the CPU, the float64 reference, and the GPU scans' plans.

The GPU kernels' index arithmetic and combine schedules are checked here through
``ssmkit._numba_cuda.scan_plan`` (plain NumPy, step for step the kernels' plan);
the kernels themselves run in tests/test_linear_scan_gpu.py.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import scipy.signal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ssmkit
from ssmkit import reference
from ssmkit._numba_cuda import scan_plan

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=25)
DTYPES = ("float32", "float64", "complex64", "complex128")
RTOL = {"float32": 2e-5, "complex64": 2e-5, "float64": 1e-11, "complex128": 1e-11}
LENGTHS = (1, 2, 31, 32, 33, 77, scan_plan.tile_len(4) + 1)


def rel(x, ref):
    x = np.asarray(x).astype(np.complex128)
    ref = np.asarray(ref).astype(np.complex128)
    assert x.shape == ref.shape, (x.shape, ref.shape)
    assert np.all(np.isfinite(x))
    d = np.linalg.norm(ref)
    return np.linalg.norm(x - ref) / (d if d > 0 else 1.0)


def rand(rng, shape, dtype, scale=1.0):
    x = rng.standard_normal(shape) * scale
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape) * scale
    return x.astype(dtype)


def rand_a(rng, shape, dtype):
    """Coefficients of modulus below 1 (stable), some near 1 (long memory)."""
    r = rng.uniform(0.3, 0.999, shape)
    if np.dtype(dtype).kind == "c":
        return (r * np.exp(1j * rng.uniform(-np.pi, np.pi, shape))).astype(dtype)
    return (r * rng.choice([-1.0, 1.0], shape)).astype(dtype)


# ----------------------------------------------------------------------------- reference
@pytest.mark.parametrize("L", [1, 5, 64])
def test_reference_is_lfilter_for_constant_a(L):
    rng = np.random.default_rng(L)
    b = rng.standard_normal((3, L))
    for a in (0.9, -0.5):
        np.testing.assert_allclose(reference.linear_scan(a, b),
                                   scipy.signal.lfilter([1.0], [1.0, -a], b, axis=-1), rtol=1e-12)


def test_reference_vjp_matches_finite_differences_complex():
    rng = np.random.default_rng(0)
    a, b = rand_a(rng, (2, 1, 6), "complex128"), rand(rng, (2, 3, 6), "complex128")
    h0 = rand(rng, (2, 3), "complex128")
    for rev in (False, True):
        (h, f), pb = reference.linear_scan_vjp(a, b, initial_state=h0, reverse=rev,
                                               return_final_state=True)
        dh, df = rand(rng, h.shape, "complex128"), rand(rng, f.shape, "complex128")
        g = pb(dh, df)

        def loss(a_, b_, h0_):
            hh, ff = reference.linear_scan(a_, b_, initial_state=h0_, reverse=rev,
                                           return_final_state=True)
            return np.real(np.vdot(dh, hh) + np.vdot(df, ff))

        for name, x, gx in (("a", a, g.a), ("b", b, g.b), ("h0", h0, g.initial_state)):
            for idx in [(0,) * x.ndim, tuple(s - 1 for s in x.shape)]:
                num = 0j
                for unit in (1.0, 1j):
                    e = np.zeros_like(x)
                    e[idx] = 1e-6 * unit
                    args = {"a": (a, b, h0), "b": (a, b, h0), "h0": (a, b, h0)}[name]
                    plus = [v + e if k == name else v for k, v in zip(("a", "b", "h0"), args)]
                    minus = [v - e if k == name else v for k, v in zip(("a", "b", "h0"), args)]
                    num += unit * (loss(*plus) - loss(*minus)) / 2e-6
                assert abs(num - gx[idx]) < 1e-6 * (1 + abs(num)), (name, idx, num, gx[idx])


# ----------------------------------------------------------------------------- CPU API
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("L", LENGTHS)
def test_cpu_matches_reference(dtype, L):
    rng = np.random.default_rng(L)
    a, b = rand_a(rng, (2, 3, L), dtype), rand(rng, (2, 3, L), dtype)
    h0 = rand(rng, (2, 3), dtype)
    for rev in (False, True):
        h, f = ssmkit.linear_scan(a, b, initial_state=h0, reverse=rev, return_final_state=True)
        hr, fr = reference.linear_scan(a, b, initial_state=h0, reverse=rev,
                                       return_final_state=True)
        assert h.dtype == np.dtype(dtype) and f.dtype == np.dtype(dtype)
        assert rel(h, hr) <= RTOL[dtype] and rel(f, fr) <= RTOL[dtype]


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2])
def test_axis_broadcast_and_initial_state(axis):
    rng = np.random.default_rng(7)
    a = rand_a(rng, (1, 5, 1), "float64")  # broadcast against b
    b = rand(rng, (4, 5, 33), "float64")
    shape = list(b.shape)
    del shape[axis]
    h0 = rand(rng, tuple(shape), "float64")
    for rev in (False, True):
        h, f = ssmkit.linear_scan(a, b, initial_state=h0, axis=axis, reverse=rev,
                                  return_final_state=True)
        hr, fr = reference.linear_scan(a, b, initial_state=h0, axis=axis, reverse=rev,
                                       return_final_state=True)
        assert h.shape == b.shape and f.shape == h0.shape
        assert rel(h, hr) <= 1e-12 and rel(f, fr) <= 1e-12


@pytest.mark.parametrize("a", [0.9, -0.3, 0.999])
def test_cpu_is_lfilter_for_constant_a(a):
    rng = np.random.default_rng(1)
    b = rng.standard_normal((4, 301))
    for axis in (0, 1):
        np.testing.assert_allclose(ssmkit.linear_scan(a, b, axis=axis),
                                   scipy.signal.lfilter([1.0], [1.0, -a], b, axis=axis),
                                   rtol=1e-10, atol=1e-12)
    assert ssmkit.linear_scan(a, b.astype(np.float32)).dtype == np.float32


def test_mixed_real_complex_and_16_bit():
    rng = np.random.default_rng(2)
    a, b = rand_a(rng, (3, 9), "float32"), rand(rng, (3, 9), "complex64")
    h = ssmkit.linear_scan(a, b)
    assert h.dtype == np.complex64
    assert rel(h, reference.linear_scan(a, b)) <= 2e-5
    a16, b16 = a.astype(np.float16), rng.standard_normal((3, 9)).astype(np.float16)
    h16 = ssmkit.linear_scan(a16, b16)
    assert h16.dtype == np.float16
    assert rel(h16, reference.linear_scan(a16, b16)) <= 4e-3


def test_empty_shapes():
    h, f = ssmkit.linear_scan(np.ones((2, 0)), np.ones((2, 0)), initial_state=np.ones(2),
                              return_final_state=True)
    assert h.shape == (2, 0) and np.array_equal(f, np.ones(2))
    assert ssmkit.linear_scan(np.ones((0, 5)), np.ones((0, 5))).shape == (0, 5)
    out, pb = ssmkit.linear_scan_vjp(np.ones((2, 0)), np.ones((2, 0)), initial_state=np.ones(2),
                                     return_final_state=True)
    g = pb(None, np.full(2, 3.0))
    assert g.a.shape == (2, 0) and np.array_equal(g.initial_state, np.full(2, 3.0))


@st.composite
def split_cases(draw):
    L = draw(st.integers(2, 90))
    return (draw(st.sampled_from(DTYPES)), L, draw(st.integers(1, L - 1)), draw(st.booleans()),
            draw(st.integers(0, 2**32 - 1)))


@settings(**SETTINGS)
@given(split_cases())
def test_split_with_carried_state_equals_whole(case):
    dtype, L, cut, rev, seed = case
    rng = np.random.default_rng(seed)
    a, b = rand_a(rng, (3, L), dtype), rand(rng, (3, L), dtype)
    whole, final = ssmkit.linear_scan(a, b, reverse=rev, return_final_state=True)
    first, second = (slice(cut, None), slice(None, cut)) if rev else (slice(None, cut),
                                                                    slice(cut, None))
    h1, f1 = ssmkit.linear_scan(a[:, first], b[:, first], reverse=rev, return_final_state=True)
    h2, f2 = ssmkit.linear_scan(a[:, second], b[:, second], initial_state=f1, reverse=rev,
                                return_final_state=True)
    tol = RTOL[dtype] * 10
    assert rel(np.concatenate([h1, h2] if not rev else [h2, h1], axis=1), whole) <= tol
    assert rel(f2, final) <= tol


@st.composite
def vjp_cases(draw):
    return (draw(st.sampled_from(["float64", "complex128"])), draw(st.integers(1, 40)),
            draw(st.sampled_from([0, 1, -1])), draw(st.booleans()), draw(st.booleans()),
            draw(st.booleans()), draw(st.integers(0, 2**32 - 1)))


@settings(**SETTINGS)
@given(vjp_cases())
def test_vjp_matches_reference(case):
    dtype, L, axis, rev, with_h0, broadcast_a, seed = case
    rng = np.random.default_rng(seed)
    shape = [3, 2, L]
    shape[axis], shape[-1] = shape[-1], shape[axis]
    a_shape = [1 if broadcast_a and i != axis % 3 else n for i, n in enumerate(shape)]
    a, b = rand_a(rng, tuple(a_shape), dtype), rand(rng, tuple(shape), dtype)
    state_shape = tuple(n for i, n in enumerate(shape) if i != axis % 3)
    h0 = rand(rng, state_shape, dtype) if with_h0 else None
    kw = dict(initial_state=h0, axis=axis, reverse=rev, return_final_state=True)
    (h, f), pb = ssmkit.linear_scan_vjp(a, b, **kw)
    (hr, fr), pbr = reference.linear_scan_vjp(a, b, **kw)
    assert rel(h, hr) <= 1e-11 and rel(f, fr) <= 1e-11
    dh, df = rand(rng, h.shape, dtype), rand(rng, f.shape, dtype)
    g, gr = pb(dh, df), pbr(dh, df)
    assert g.a.shape == a.shape and g.b.shape == b.shape and g.a.dtype == a.dtype
    assert rel(g.a, gr.a) <= 1e-10 and rel(g.b, gr.b) <= 1e-10
    if with_h0:
        assert rel(g.initial_state, gr.initial_state) <= 1e-10
    else:
        assert g.initial_state is None
    g_none = pb(None, df)  # a missing cotangent is zeros
    assert rel(g_none.b, pbr(np.zeros_like(dh), df).b) <= 1e-10


def test_vjp_real_arguments_of_a_complex_scan_get_real_gradients():
    rng = np.random.default_rng(3)
    a, b = rand_a(rng, (4, 10), "float64"), rand(rng, (4, 10), "complex128")
    _, pb = ssmkit.linear_scan_vjp(a, b)
    _, pbr = reference.linear_scan_vjp(a, b)
    dh = rand(rng, (4, 10), "complex128")
    g = pb(dh)
    assert g.a.dtype == np.float64 and rel(g.a, pbr(dh).a) <= 1e-10
    # finite difference of the real loss Re<dh, h> along a real a
    e = np.zeros_like(a)
    e[1, 3] = 1e-6
    loss = lambda a_: np.real(np.vdot(dh, reference.linear_scan(a_, b)))  # noqa: E731
    assert abs((loss(a + e) - loss(a - e)) / 2e-6 - g.a[1, 3]) < 1e-6


# ----------------------------------------------------------------------------- GPU plans
PLAN_ALGORITHMS = ("sequential", "kogge_stone", "blelloch", "chunked", "lookback")


@pytest.mark.parametrize("algorithm", PLAN_ALGORITHMS)
@pytest.mark.parametrize("itemsize", [4, 8, 16])  # the tile geometry of each kernel dtype
def test_gpu_plans_match_reference(algorithm, itemsize):
    rng = np.random.default_rng(11)
    dtype = "complex128" if itemsize == 16 else "float64"
    T = scan_plan.tile_len(itemsize)
    for L in (1, 31, 32, 33, 95, T - 1, T + 1, 2 * T + 5):
        rows = 3
        a, b = rand_a(rng, (rows, L), dtype), rand(rng, (rows, L), dtype)
        h0 = rand(rng, (rows,), dtype)
        for rev in (False, True):
            if algorithm == "lookback":  # blocks publishing and finishing in a random order
                n = rows * -(-L // T)
                h = scan_plan.lookback(a, b, h0, rev, order=rng.permutation(list(range(n)) * 2),
                                       itemsize=itemsize)
            else:
                h = scan_plan.run(algorithm, a, b, h0, rev, chunk_tiles=1, itemsize=itemsize)
            hr = reference.linear_scan(a, b, initial_state=h0, reverse=rev)
            assert rel(h, hr) <= 1e-12, (algorithm, L, rev)


@pytest.mark.parametrize("algorithm", PLAN_ALGORITHMS)
@pytest.mark.parametrize("itemsize", [4, 8, 16])
def test_gpu_blocked_plans_match_reference(algorithm, itemsize):
    """The kernels' 16-byte vector layout (tile kernels: a thread's steps in registers;
    sequential: vector-staged rounds): L a multiple of the vector width, around the tile."""
    rng = np.random.default_rng(14)
    dtype = "complex128" if itemsize == 16 else "float64"
    T, V = scan_plan.tile_len(itemsize), scan_plan.vector_width(itemsize)
    S = scan_plan.seq_steps(itemsize)
    lens = (V, 8 * V, T - V, T, T + V, 2 * T + 3 * V)
    if algorithm == "sequential":  # rounds of S steps; more rows than one block
        lens = (V, S - V, S, S + V, 3 * S + 5 * V)
    for L in lens:
        rows = 2 if algorithm != "sequential" else scan_plan.SEQ_ROWS + 3
        a, b = rand_a(rng, (rows, L), dtype), rand(rng, (rows, L), dtype)
        h0 = rand(rng, (rows,), dtype)
        for rev in (False, True):
            if algorithm == "lookback":
                n = rows * -(-L // T)
                h = scan_plan.lookback(a, b, h0, rev, order=rng.permutation(list(range(n)) * 2),
                                       itemsize=itemsize, blocked=True)
            else:
                h = scan_plan.run(algorithm, a, b, h0, rev, chunk_tiles=1, itemsize=itemsize,
                                  blocked=True)
            hr = reference.linear_scan(a, b, initial_state=h0, reverse=rev)
            assert rel(h, hr) <= 1e-12, (algorithm, L, rev)


@pytest.mark.parametrize("itemsize", [4, 8, 16])
@pytest.mark.parametrize("rev", [False, True])
def test_plan_blocked_vectors_are_aligned_and_cover_each_column_once(itemsize, rev):
    T, V = scan_plan.tile_len(itemsize), scan_plan.vector_width(itemsize)
    L = 3 * T - 5 * V  # a partial last tile
    seen = np.zeros(L, int)
    for start in range(0, L, T):
        end = min(L, start + T)
        col, p, j = scan_plan.vector_columns(start, rev, L, itemsize)
        inside = p < end
        assert np.all(col[inside] % V == 0)  # 16-byte aligned when a row starts aligned
        # the vector's items are the thread's consecutive steps, in scan order
        steps = p[:, :, None] + np.arange(V)
        cols = col[:, :, None] + np.arange(V)
        item_of_col = j[None, :, :]
        tid = np.arange(scan_plan.THREADS)[:, None, None]
        assert np.array_equal(np.broadcast_to(start + tid * scan_plan.items(itemsize)
                                              + item_of_col, cols.shape)[inside],
                              (L - 1 - cols if rev else cols)[inside])
        assert np.all(steps[inside] < end)
        np.add.at(seen, cols[inside].ravel(), 1)
    assert np.all(seen == 1)


def test_plan_lookback_walks_many_windows():
    """Rows of 70 tiles: look-back windows of 32 compose flag-1 pairs, then meet a flag 2."""
    rng = np.random.default_rng(12)
    T = scan_plan.tile_len(16)
    a, b = rand_a(rng, (2, 70 * T), "complex128"), rand(rng, (2, 70 * T), "complex128")
    h0 = rand(rng, (2,), "complex128")
    publish_all_first = list(range(140)) + list(range(140))[::-1]  # finishes newest first
    h = scan_plan.lookback(a, b, h0, False, order=publish_all_first, itemsize=16)
    assert rel(h, reference.linear_scan(a, b, initial_state=h0)) <= 1e-12


def test_plan_warp_reduction_is_ordered_composition():
    rng = np.random.default_rng(13)
    A, B = rng.standard_normal(32), rng.standard_normal(32)
    accA, accB = 1.0, 0.0
    for lane in range(31, -1, -1):  # lane 31 is the oldest tile: applied first
        accA, accB = scan_plan.compose((accA, accB), (A[lane], B[lane]))
    WA, WB = scan_plan.warp_reduce_older_first(A, B)
    assert np.isclose(WA, accA) and np.isclose(WB, accB)


def test_plan_kogge_stone_warp_scan_is_an_inclusive_scan():
    rng = np.random.default_rng(5)
    A, B = rng.standard_normal((2, 32)), rng.standard_normal((2, 32))
    Ai, Bi = scan_plan.warp_inclusive_kogge_stone(A, B)
    for w in range(2):
        accA, accB = 1.0, 0.0
        for lane in range(32):
            accA, accB = scan_plan.compose((accA, accB), (A[w, lane], B[w, lane]))
            assert np.isclose(Ai[w, lane], accA) and np.isclose(Bi[w, lane], accB)


def test_plan_blelloch_and_kogge_stone_agree_on_block_prefixes():
    rng = np.random.default_rng(6)
    A, B = rng.uniform(-1, 1, scan_plan.THREADS), rng.standard_normal(scan_plan.THREADS)
    (ka, kb), kt = scan_plan.block_scan_kogge_stone(A, B)
    (ba, bb), bt = scan_plan.block_scan_blelloch(A, B)
    np.testing.assert_allclose(ka, ba, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(kb, bb, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(kt, bt, rtol=1e-10)
    assert ka[0] == 1 and kb[0] == 0  # exclusive: thread 0 gets the identity


@pytest.mark.parametrize("itemsize", [4, 8, 16])
def test_plan_shared_memory_padding_has_no_bank_conflicts(itemsize):
    """A wavefront serves 128 bytes: 32 lanes of 4 bytes, 16 of 8, 8 of 16; the strided
    per-thread reads (slot ``tid ITEMS + j``) of each must fall in distinct 128-byte rows' banks."""
    lanes = 128 // itemsize
    n_items = scan_plan.items(itemsize)
    for first in range(0, scan_plan.WARP, lanes):
        tid = np.arange(first, first + lanes)
        for j in range(n_items):
            slots = scan_plan.pad(tid * n_items + j, itemsize) % lanes
            assert len(set(slots.tolist())) == lanes


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(a=np.ones((3, 4)), b=np.ones((2, 4))), ValueError, "must broadcast"),
    (dict(a=np.ones(4), b=np.ones(4), axis=1), ValueError, "axis 1 is out of range"),
    (dict(a=np.ones(4), b=np.ones(4), axis=-2), ValueError, "out of range"),
    (dict(a=np.ones(4), b=np.ones(4), axis=1.0), TypeError, "axis must be an int"),
    (dict(a=np.ones(4), b=np.ones(4), algorithm="fast"), ValueError, "unknown algorithm 'fast'"),
    (dict(a=np.ones(4), b=np.ones(4), algorithm=3), TypeError, "algorithm must be a str"),
    (dict(a=np.ones(4), b=np.ones(4), algorithm="lookback"), ValueError, "runs on the GPU"),
    (dict(a=np.ones((2, 4)), b=np.ones((2, 4)), initial_state=np.ones(4)), ValueError,
     "initial_state must have shape"),
    (dict(a=np.ones(4, np.int64), b=np.ones(4)), TypeError, "a must hold"),
    (dict(a=np.ones(4), b=np.ones(4, np.int32)), TypeError, "b must hold"),
    (dict(a=0.5, b=1.0), ValueError, "at least one axis"),
    (dict(a=np.ones(4), b=None), TypeError, "b is required"),
    (dict(a=True, b=np.ones(4)), TypeError, "got bool"),
    (dict(a=np.ones(4), b=np.ones(4), reverse=1), TypeError, "reverse must be a bool"),
    (dict(a=np.ones(4), b=np.ones(4), return_final_state="yes"), TypeError,
     "return_final_state must be a bool"),
])
def test_errors(kwargs, exc, message):
    a, b = kwargs.pop("a"), kwargs.pop("b")
    for fn in (ssmkit.linear_scan, ssmkit.linear_scan_vjp):
        with pytest.raises(exc, match=message):
            fn(a, b, **kwargs)


def test_pullback_checks_cotangents():
    _, pb = ssmkit.linear_scan_vjp(np.ones((2, 3)), np.ones((2, 3)))
    with pytest.raises(ValueError, match="dh must have shape"):
        pb(np.ones((3, 2)))
    with pytest.raises(ValueError, match="dfinal_state must have shape"):
        pb(None, np.ones(3))
    with pytest.raises(TypeError, match="dh must hold"):
        pb(np.ones((2, 3), np.int64))


def test_algorithm_names_and_lazy_imports():
    assert ssmkit.linear_scan_algorithms()[0] == "auto"
    assert set(PLAN_ALGORITHMS) <= set(ssmkit.linear_scan_algorithms())
    code = ("import sys, ssmkit, numpy as np; ssmkit.linear_scan(np.ones(3), np.ones(3)); "
            "bad = [m for m in ('cupy', 'numba.cuda') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# ----------------------------------------------------------------------------- selective_scan
def _small_scan_inputs():
    rng = np.random.default_rng(8)
    return dict(u=rng.standard_normal((1, 2, 5)), delta=rng.uniform(0.1, 0.5, (1, 2, 5)),
                A=-np.ones((2, 3)), B=rng.standard_normal((1, 3, 5)),
                C=rng.standard_normal((1, 3, 5)))


def test_selective_scan_backend_option_on_the_cpu():
    x = _small_scan_inputs()
    np.testing.assert_array_equal(ssmkit.selective_scan(**x, backend="cpu"),
                                  ssmkit.selective_scan(**x))
    with pytest.raises(TypeError, match="computes on the GPU"):
        ssmkit.selective_scan(**x, backend="numba")
    with pytest.raises(TypeError, match="computes on the GPU"):
        ssmkit.selective_scan(**x, backend="cuda")
    with pytest.raises(ValueError, match="unknown backend 'numba:fast'"):
        ssmkit.selective_scan(**x, backend="numba:fast")
    with pytest.raises(ValueError, match="unknown backend 'gpu'"):
        ssmkit.selective_scan_vjp(**x, backend="gpu")
    with pytest.raises(TypeError, match="backend must be None or a str"):
        ssmkit.selective_scan(**x, backend=1)
