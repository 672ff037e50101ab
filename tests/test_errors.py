"""Bad input gets a TypeError or ValueError naming the argument, what was seen and expected."""

from __future__ import annotations

import numpy as np
import pytest

import ssmkit
from helpers import gpu_available, random_scan_inputs

batch, dim, L, N = 2, 4, 6, 3


def good(**changes):
    args = random_scan_inputs(np.random.default_rng(0), batch=batch, dim=dim, L=L, N=N,
                              with_init=True)
    args.update(changes)
    return args


BAD_SHAPES = [
    ("u", np.zeros((batch, dim)), r"u must have shape \(batch, dim, L\); got 2-d"),
    ("delta", np.zeros((batch, dim, L + 1)), r"delta must have shape .*\(2, 4, 6\); got \(2, 4, 7\)"),
    ("z", np.zeros((1, dim, L)), r"z must have shape .*got \(1, 4, 6\)"),
    ("A", np.zeros((dim + 1, N)), r"A must have shape \(dim, N\) with dim = 4"),
    ("A", np.zeros((dim, 0)), r"A must have shape \(dim, N\) .*N >= 1"),
    ("A", np.zeros(dim), r"A must have shape \(dim, N\); got 1-d"),
    ("B", np.zeros((dim, N + 1)), r"B must have shape .*\(4, 3\) here; got \(4, 4\)"),
    ("B", np.zeros((batch, N, L - 1)), r"B must have shape .*\(2, 3, 6\) here"),
    ("C", np.zeros((batch, 3, N, L)), r"C has G = 3 groups .* does not divide dim = 4"),
    ("C", np.zeros((batch, 1, 1, N, L)), r"C must have shape \(dim, N\), \(batch, N, L\) or"),
    ("D", np.zeros(dim + 1), r"D must have shape \(dim,\) = \(4,\); got \(5,\)"),
    ("delta_bias", np.zeros((dim, 1)), r"delta_bias must have shape \(dim,\)"),
    ("initial_state", np.zeros((batch, dim, N + 1)),
     r"initial_state must have shape \(batch, dim, N\) = \(2, 4, 3\); got \(2, 4, 4\)"),
]


@pytest.mark.parametrize("fn", [ssmkit.selective_scan, ssmkit.selective_scan_vjp])
@pytest.mark.parametrize("name,value,message", BAD_SHAPES)
def test_bad_shapes_raise_value_error(fn, name, value, message):
    with pytest.raises(ValueError, match=message):
        fn(**good(**{name: value}))


@pytest.mark.parametrize("name", ["u", "delta", "A", "B", "C", "D", "z", "delta_bias",
                                  "initial_state"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_, np.complex64])
def test_non_real_float_raises_type_error(name, dtype):
    args = good()
    args[name] = args[name].astype(dtype)
    with pytest.raises(TypeError, match=rf"{name} .*(real floating|complex)"):
        ssmkit.selective_scan(**args)


def test_complex_A_is_refused_clearly():
    args = good(A=good()["A"].astype(np.complex128))
    with pytest.raises(TypeError, match="complex A .* not supported yet"):
        ssmkit.selective_scan(**args)


def test_mismatched_io_dtypes():
    args = good()
    args["delta"] = args["delta"].astype(np.float32)
    with pytest.raises(TypeError, match=r"delta must have the dtype of u \(float64\); got float32"):
        ssmkit.selective_scan(**args)


@pytest.mark.parametrize("value,exc,message", [
    (0, ValueError, "chunk_size must be >= 1; got 0"),
    (-3, ValueError, "chunk_size must be >= 1"),
    (2.5, TypeError, "chunk_size must be an int or None; got float"),
    (True, TypeError, "chunk_size must be an int or None; got bool"),
])
def test_bad_chunk_size(value, exc, message):
    with pytest.raises(exc, match=message):
        ssmkit.selective_scan(**good(), chunk_size=value)


def test_bad_softplus_flag():
    with pytest.raises(TypeError, match="delta_softplus must be a bool; got str"):
        ssmkit.selective_scan(**good(), delta_softplus="yes")


def test_missing_required_and_non_arrays():
    with pytest.raises(TypeError, match="B is required; got None"):
        ssmkit.selective_scan(**good(B=None))
    with pytest.raises(TypeError, match="u must be an array .*got object"):
        ssmkit.selective_scan(**good(u=object()))


def test_pullback_checks_cotangents():
    out, pullback = ssmkit.selective_scan_vjp(**good(), return_final_state=True)
    with pytest.raises(ValueError, match=r"dy must have shape \(batch, dim, L\) = \(2, 4, 6\)"):
        pullback(np.zeros((batch, dim, L + 1)))
    with pytest.raises(ValueError, match=r"dfinal_state must have shape \(batch, dim, N\)"):
        pullback(np.zeros((batch, dim, L)), np.zeros((batch, dim)))
    with pytest.raises(TypeError, match="dy must hold real floating-point data"):
        pullback(np.zeros((batch, dim, L), dtype=np.int64))


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")
def test_numpy_mixed_with_cupy_is_refused():
    import cupy

    args = good()
    args["B"] = cupy.asarray(args["B"])
    with pytest.raises(TypeError, match="all on the GPU; B is a GPU array .* u is a CPU array"):
        ssmkit.selective_scan(**args)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")
def test_foreign_gpu_arrays_are_taken_zero_copy():
    """An object exposing __cuda_array_interface__ (as PyTorch and Numba arrays do) is used
    in place, without a copy, and the result is a CuPy array."""
    import cupy

    from ssmkit import _arrays

    class Foreign:
        def __init__(self, a):
            self._a = a
            self.__cuda_array_interface__ = a.__cuda_array_interface__

    x = cupy.arange(12, dtype=cupy.float32).reshape(3, 4)
    xp, arrs = _arrays.array_namespace("t", {"x": Foreign(x)})
    assert xp is cupy and arrs["x"].data.ptr == x.data.ptr
    args = {k: (None if v is None else Foreign(cupy.asarray(v))) for k, v in good().items()}
    y = ssmkit.selective_scan(**args)
    assert isinstance(y, cupy.ndarray)
