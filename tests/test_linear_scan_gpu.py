"""The Numba CUDA linear scans on CuPy arrays against the float64 reference (GPU only)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.signal

import ssmkit
from helpers import gpu_available
from ssmkit import reference
from ssmkit._numba_cuda import scan_plan
from test_linear_scan import RTOL, rand, rand_a, rel

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")]

ALGORITHMS = ssmkit.linear_scan_algorithms()
DTYPES = ("float32", "float64", "complex64", "complex128")


def lengths(dtype):
    """Awkward lengths around the tile of the dtype's kernels."""
    T = scan_plan.tile_len(np.dtype(dtype).itemsize)
    return (1, 31, 32, 33, 333, T - 1, T + 1, 3 * T + 7)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_matches_reference(algorithm, dtype):
    import cupy

    rng = np.random.default_rng(0)
    for L in lengths(dtype):
        a, b = rand_a(rng, (3, L), dtype), rand(rng, (3, L), dtype)
        h0 = rand(rng, (3,), dtype)
        for rev in (False, True):
            h, f = ssmkit.linear_scan(cupy.asarray(a), cupy.asarray(b),
                                      initial_state=cupy.asarray(h0), reverse=rev,
                                      algorithm=algorithm, return_final_state=True)
            hr, fr = reference.linear_scan(a, b, initial_state=h0, reverse=rev,
                                           return_final_state=True)
            assert isinstance(h, cupy.ndarray) and h.dtype == np.dtype(dtype)
            assert rel(h.get(), hr) <= RTOL[dtype], (L, rev)
            assert rel(f.get(), fr) <= RTOL[dtype], (L, rev)


@pytest.mark.parametrize("dtype", ["float32", "complex128"])
def test_chunked_carries_across_many_chunks(dtype):
    """One tile per chunk, so phase 2 carries across every tile."""
    import cupy
    from ssmkit._numba_cuda import linear_scan as gpu

    rng = np.random.default_rng(1)
    T = scan_plan.tile_len(np.dtype(dtype).itemsize)
    for L in (T, 5 * T + 3):
        a, b, h0 = rand_a(rng, (2, L), dtype), rand(rng, (2, L), dtype), rand(rng, (2,), dtype)
        for rev in (False, True):
            h, f = gpu.linear_scan_rows(cupy.asarray(a), cupy.asarray(b), cupy.asarray(h0), rev,
                                        "chunked", chunk_tiles=1)
            assert rel(h.get(), reference.linear_scan(a, b, initial_state=h0, reverse=rev)) \
                <= RTOL[dtype]


TILE_ALGORITHMS = ("kogge_stone", "blelloch", "chunked", "lookback")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("algorithm", TILE_ALGORITHMS)
def test_blocked_and_staged_layouts_match_reference(algorithm, dtype):
    """Both tile layouts on lengths that allow 16-byte vectors, around the tile; rows
    strided inside a wider buffer (a 16-byte multiple), so the row stride is used."""
    import cupy
    from ssmkit._numba_cuda import linear_scan as gpu

    rng = np.random.default_rng(11)
    isz = np.dtype(dtype).itemsize
    T, V = scan_plan.tile_len(isz), scan_plan.vector_width(isz)
    for L in (V, 8 * V, T - V, T, T + V, 3 * T + 5 * V):
        a, b = rand_a(rng, (3, L), dtype), rand(rng, (3, L), dtype)
        h0 = rand(rng, (3,), dtype)
        wide_a = cupy.zeros((3, L + 4 * V), dtype)
        wide_b = cupy.zeros((3, L + 4 * V), dtype)
        wide_a[:, :L], wide_b[:, :L] = cupy.asarray(a), cupy.asarray(b)
        for rev in (False, True):
            hr, fr = reference.linear_scan(a, b, initial_state=h0, reverse=rev,
                                           return_final_state=True)
            for blocked in (True, False):
                h, f = gpu.linear_scan_rows(wide_a[:, :L], wide_b[:, :L], cupy.asarray(h0), rev,
                                            algorithm, chunk_tiles=1, blocked=blocked)
                assert rel(h.get(), hr) <= RTOL[dtype], (L, rev, blocked)
                assert rel(f.get(), fr) <= RTOL[dtype], (L, rev, blocked)


def test_blocked_layout_only_where_rows_are_aligned():
    """A view starting one element in is not 16-byte aligned: the staged layout runs."""
    import cupy
    from ssmkit._numba_cuda import linear_scan as gpu

    rng = np.random.default_rng(12)
    L = 4 * scan_plan.tile_len(4)
    x = cupy.asarray(rand(rng, (2, L + 1), "float32"))
    assert gpu._blocked_ok(x[:, :L], L) is False  # row stride L + 1 floats
    y = cupy.asarray(rand(rng, (2, L + 4), "float32"))
    assert gpu._blocked_ok(y[:, :L], L) and not gpu._blocked_ok(y[:, 1:L + 1], L)
    a = cupy.asarray(rand_a(rng, (2, L + 4), "float32"))
    for algorithm in TILE_ALGORITHMS:
        h, _ = gpu.linear_scan_rows(a[:, 1:L + 1], y[:, 1:L + 1], cupy.zeros(2, "float32"),
                                    False, algorithm)
        hr = reference.linear_scan(a[:, 1:L + 1].get(), y[:, 1:L + 1].get())
        assert rel(h.get(), hr) <= 2e-5, algorithm
    with pytest.raises(ValueError, match="blocked layout needs"):
        gpu.linear_scan_rows(a[:, 1:L + 1], y[:, 1:L + 1], cupy.zeros(2, "float32"), False,
                             "lookback", blocked=True)


@pytest.mark.parametrize("algorithm", ["lookback", "chunked", "kogge_stone"])
def test_long_sequences(algorithm):
    """Hundreds of tiles per row: look-back chains and chunk carries really run."""
    import cupy

    rng = np.random.default_rng(2)
    for L in (100_003, 100_002):  # staged, then blocked (an even length of float64)
        a, b = rand_a(rng, (2, L), "float64"), rand(rng, (2, L), "float64")
        for rev in (False, True):
            h = ssmkit.linear_scan(cupy.asarray(a), cupy.asarray(b), reverse=rev,
                                   algorithm=algorithm)
            assert rel(h.get(), reference.linear_scan(a, b, reverse=rev)) <= 1e-11


def test_many_short_rows_sequential():
    import cupy

    rng = np.random.default_rng(3)
    a, b = rand_a(rng, (1000, 37), "complex64"), rand(rng, (1000, 37), "complex64")
    h = ssmkit.linear_scan(cupy.asarray(a), cupy.asarray(b), algorithm="sequential")
    assert rel(h.get(), reference.linear_scan(a, b)) <= 2e-5


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_axis_broadcast_initial_state(algorithm):
    import cupy

    rng = np.random.default_rng(4)
    a = rand_a(rng, (1, 5, 1), "float32")  # broadcast against b
    b = rand(rng, (3, 5, 1100), "float32")
    for axis in (2, 1, 0):
        shape = list(b.shape)
        del shape[axis]
        h0 = rand(rng, tuple(shape), "float32")
        for rev in (False, True):
            h, f = ssmkit.linear_scan(cupy.asarray(a), cupy.asarray(b),
                                      initial_state=cupy.asarray(h0), axis=axis, reverse=rev,
                                      algorithm=algorithm, return_final_state=True)
            hr, fr = reference.linear_scan(a, b, initial_state=h0, axis=axis, reverse=rev,
                                           return_final_state=True)
            assert rel(h.get(), hr) <= 2e-5 and rel(f.get(), fr) <= 2e-5


def test_constant_a_is_lfilter():
    """A Python number for a: it reaches every kernel as a stride-0 view, never materialised."""
    import cupy

    b = np.random.default_rng(5).standard_normal((4, 5000))
    for algorithm in ALGORITHMS:
        h = ssmkit.linear_scan(0.95, cupy.asarray(b), algorithm=algorithm)
        np.testing.assert_allclose(h.get(), scipy.signal.lfilter([1.0], [1.0, -0.95], b),
                                   rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("dtype", ["float32", "complex128"])
def test_vjp_on_gpu_matches_reference(dtype):
    import cupy

    rng = np.random.default_rng(6)
    a, b = rand_a(rng, (4, 1, 700), dtype), rand(rng, (4, 3, 700), dtype)
    h0 = rand(rng, (4, 3), dtype)
    for rev in (False, True):
        (h, f), pb = ssmkit.linear_scan_vjp(cupy.asarray(a), cupy.asarray(b),
                                            initial_state=cupy.asarray(h0), reverse=rev,
                                            return_final_state=True)
        (hr, fr), pbr = reference.linear_scan_vjp(a, b, initial_state=h0, reverse=rev,
                                                  return_final_state=True)
        dh, df = rand(rng, hr.shape, dtype), rand(rng, fr.shape, dtype)
        g, gr = pb(cupy.asarray(dh), cupy.asarray(df)), pbr(dh, df)
        tol = 1e-4 if dtype == "float32" else 1e-10
        for x, y in zip(g, gr):
            assert rel(x.get(), y) <= tol


def test_unknown_algorithm_on_gpu_is_refused():
    import cupy

    with pytest.raises(ValueError, match="unknown algorithm"):
        ssmkit.linear_scan(cupy.ones(4), cupy.ones(4), algorithm="warp")


# ----------------------------------------------------------------------------- selective_scan
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("forms", [("const", "step"), ("step", "group"), ("group", "const")])
def test_selective_scan_numba_backend_matches_reference(dtype, forms):
    import cupy
    from helpers import FORWARD_RTOL, cast_inputs, random_scan_inputs, rel_err

    rng = np.random.default_rng(9)
    for L, opts in ((1, True), (37, False), (1100, True)):
        inputs = random_scan_inputs(rng, batch=2, dim=4, L=L, N=3, b_form=forms[0],
                                    c_form=forms[1], groups=2, with_D=opts, with_z=opts,
                                    with_bias=opts, softplus=opts, with_init=opts)
        cast, exact = cast_inputs(inputs, dtype, cupy)
        kw = dict(delta_softplus=opts, return_final_state=True)
        for backend in ("numba", "numba:sequential", "numba:lookback"):
            y, final = ssmkit.selective_scan(**cast, **kw, backend=backend)
            y_ref, final_ref = reference.selective_scan(**exact, **kw)
            assert y.dtype == cast["u"].dtype
            assert rel_err(y, y_ref) <= FORWARD_RTOL[dtype], (L, backend)
            assert rel_err(final, final_ref) <= max(FORWARD_RTOL[dtype], 2e-5), (L, backend)


def test_selective_scan_backend_names_on_gpu():
    import cupy

    rng = np.random.default_rng(10)
    x = {k: (None if v is None else cupy.asarray(v)) for k, v in rand_inputs(rng).items()}
    y_cuda = ssmkit.selective_scan(**x, backend="cuda")
    cupy.testing.assert_array_equal(y_cuda, ssmkit.selective_scan(**x))
    cupy.testing.assert_allclose(ssmkit.selective_scan(**x, backend="numba:kogge_stone"), y_cuda,
                                 rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="has no backward"):
        ssmkit.selective_scan_vjp(**x, backend="numba")
    with pytest.raises(TypeError, match="computes on the CPU"):
        ssmkit.selective_scan(**x, backend="cpu")


def rand_inputs(rng):
    return dict(u=rng.standard_normal((2, 3, 40)), delta=rng.uniform(0.1, 0.5, (2, 3, 40)),
                A=-np.exp(rng.standard_normal((3, 4))), B=rng.standard_normal((2, 4, 40)),
                C=rng.standard_normal((2, 4, 40)), D=rng.standard_normal(3))
