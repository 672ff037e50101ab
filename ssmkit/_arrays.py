"""Argument handling shared by the public functions: where arrays live, dtypes, shapes.

Every check raises ``TypeError`` (wrong kind of thing, wrong dtype) or
``ValueError`` (wrong shape or value) with a message that names the function,
the argument, what was seen and what was expected.
"""

from __future__ import annotations

import functools

import numpy as np

# DLPack device types that hold CUDA memory (kDLCUDA, kDLCUDAHost, kDLCUDAManaged).
_DLPACK_CUDA_DEVICES = (2, 3, 13)


def _is_cupy(x) -> bool:
    return type(x).__module__.split(".")[0] == "cupy"


def _is_foreign_gpu(x) -> bool:
    """A GPU array of another framework (PyTorch, JAX, Numba...), taken zero-copy."""
    if hasattr(x, "__cuda_array_interface__"):
        return True
    dev = getattr(x, "__dlpack_device__", None)
    if dev is None:
        return False
    try:
        return int(dev()[0]) in _DLPACK_CUDA_DEVICES
    except Exception:  # an object whose __dlpack_device__ cannot answer is not a GPU array
        return False


def _to_cupy(x):
    import cupy

    if _is_cupy(x):
        return x
    if hasattr(x, "__cuda_array_interface__"):
        return cupy.asarray(x)
    return cupy.from_dlpack(x)


def array_namespace(fn: str, named: dict):
    """Decide where a call computes and bring every array there.

    Parameters
    ----------
    fn : str
        Name of the public function, for messages.
    named : dict
        Argument name -> array or None.

    Returns
    -------
    xp : module
        ``numpy`` or ``cupy``.
    arrays : dict
        The same names, NumPy or CuPy arrays (None kept).
    """
    kinds = {}
    for name, x in named.items():
        if x is None:
            continue
        if _is_cupy(x) or _is_foreign_gpu(x):
            kinds[name] = "gpu"
        elif isinstance(x, (np.ndarray, np.generic)) or hasattr(x, "__array__") \
                or isinstance(x, (list, tuple, int, float)):
            kinds[name] = "cpu"
        else:
            raise TypeError(f"{fn}: {name} must be an array (NumPy, CuPy or a GPU array "
                            f"with DLPack); got {type(x).__name__}")
    gpu = [n for n, k in kinds.items() if k == "gpu"]
    cpu = [n for n, k in kinds.items() if k == "cpu"]
    if gpu and cpu:
        raise TypeError(f"{fn}: arrays must all live on the CPU or all on the GPU; "
                        f"{gpu[0]} is a GPU array ({type(named[gpu[0]]).__name__}) but "
                        f"{cpu[0]} is a CPU array ({type(named[cpu[0]]).__name__})")
    if gpu:
        import cupy

        out = {n: (None if x is None else _to_cupy(x)) for n, x in named.items()}
        devices = {n: x.device.id for n, x in out.items() if x is not None}
        first = next(iter(devices))
        for n, dev in devices.items():
            if dev != devices[first]:
                raise ValueError(f"{fn}: arrays must be on one GPU; {first} is on device "
                                 f"{devices[first]} but {n} is on device {dev}")
        return cupy, out
    return np, {n: (None if x is None else np.asarray(x)) for n, x in named.items()}


@functools.lru_cache(maxsize=256)
def dtype_name(dtype) -> str:
    """``numpy.dtype(dtype).name``, cached: NumPy computes a dtype's name in Python each
    time, a few microseconds that the public calls paid several times over."""
    return np.dtype(dtype).name


def is_bfloat16(dtype) -> bool:
    return dtype_name(dtype) == "bfloat16"


def is_real_float(dtype) -> bool:
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or is_bfloat16(dtype)


def check_real_float(fn: str, name: str, x) -> None:
    """Raise TypeError unless ``x`` holds real floating-point data."""
    if not is_real_float(x.dtype):
        what = "complex" if x.dtype.kind == "c" else str(x.dtype)
        raise TypeError(f"{fn}: {name} must hold real floating-point data (float16, bfloat16, "
                        f"float32 or float64); got {what} ({x.dtype})")


def check_shape(fn: str, name: str, x, expected: tuple, labels: str) -> None:
    """Raise ValueError unless ``x.shape == expected``; ``labels`` names the axes."""
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{fn}: {name} must have shape {labels} = {tuple(expected)}; "
                         f"got {tuple(x.shape)}")


def check_cotangents(fn: str, xp, inputs: dict, cotangents: dict) -> dict:
    """Check a pullback's cotangents and convert them like its inputs.

    Parameters
    ----------
    fn : str
        The pullback's name, for the errors.
    xp : module
        The namespace the forward ran in.
    inputs : dict
        One input array of the forward by name (it decides where the
        cotangents must live).
    cotangents : dict
        ``name -> (array or None, expected shape, axis labels)``.

    Returns
    -------
    dict
        ``name -> array or None``, each real floating and of its expected shape.
    """
    named = {name: c[0] for name, c in cotangents.items()}
    xp_c, arr = array_namespace(fn, dict(named, **inputs))
    if xp_c is not xp:
        raise TypeError(f"{fn}: cotangents must live where the inputs do ({xp.__name__}); "
                        f"got {xp_c.__name__} arrays")
    for name, (_, shape, labels) in cotangents.items():
        if arr[name] is not None:
            check_real_float(fn, name, arr[name])
            check_shape(fn, name, arr[name], shape, labels)
    return {name: arr[name] for name in cotangents}


def check_ndim(fn: str, name: str, x, ndims: tuple, labels: str) -> None:
    if x.ndim not in ndims:
        raise ValueError(f"{fn}: {name} must have shape {labels}; got {x.ndim}-d shape "
                         f"{tuple(x.shape)}")


def compute_dtype_for(dtype) -> np.dtype:
    """float64 for float64 data, float32 for everything narrower."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def offsets_sequences(cu) -> tuple:
    """For ``cu_seqlens`` on the host (checked by :func:`packed_sequences`): the indices of
    the sequences that have steps, and ``(index, 0)`` for each without steps at the row's
    start (its final state is row 0's initial state)."""
    held = np.flatnonzero(cu[1:] > cu[:-1])
    passthrough = [(int(i), 0) for i in np.flatnonzero((cu[:-1] == 0) & (cu[1:] == 0))]
    return held, passthrough


def packed_sequences(fn: str, xp, seq_idx, cu_seqlens, batch: int, L: int, on_device=True):
    """Check ``seq_idx`` / ``cu_seqlens`` (packed sequences).

    Parameters
    ----------
    seq_idx : array (batch, L) of ints, or None
        Non-decreasing along L in every row; the state restarts where it changes.
    cu_seqlens : array (num_sequences + 1,) of ints, or None
        Sequence boundaries in one row (batch 1): starts at 0, non-decreasing, ends at L.
    on_device : bool
        False: return ``seq`` on the host (a NumPy array) for a caller that plans there,
        sparing a copy to the device and back; with ``cu_seqlens`` alone, None (the caller
        plans from ``cu``).

    Returns
    -------
    seq : array (batch, L) of ints on ``xp`` (the host with ``on_device=False``), or None
        ``seq_idx``, or with ``cu_seqlens`` the sequence of each step (int32; see
        ``on_device``).
    cu : numpy.ndarray (num_sequences + 1,) int64, or None
        ``cu_seqlens`` on the host.
    """
    def host(a):
        return np.asarray(a if xp is np else xp.asnumpy(a), dtype=np.int64)

    for name, a in (("seq_idx", seq_idx), ("cu_seqlens", cu_seqlens)):
        if a is not None and a.dtype.kind not in "iu":
            raise TypeError(f"{fn}: {name} must hold integers; got {a.dtype}")
    seq = seq_idx
    if seq is not None:
        check_shape(fn, "seq_idx", seq, (batch, L), "(batch, L)")
        if not on_device:
            seq = host(seq)
        if L > 1 and bool((xp if on_device else np).any(seq[:, 1:] < seq[:, :-1])):
            raise ValueError(f"{fn}: seq_idx must be non-decreasing along L in every row")
    cu = None
    if cu_seqlens is not None:
        check_ndim(fn, "cu_seqlens", cu_seqlens, (1,), "(num_sequences + 1,)")
        if batch != 1:
            raise ValueError(f"{fn}: cu_seqlens packs sequences into one row, so the inputs "
                             f"must have batch 1; got batch {batch}")
        cu = host(cu_seqlens)
        if cu.size < 2 or cu[0] != 0 or cu[-1] != L or np.any(np.diff(cu) < 0):
            raise ValueError(f"{fn}: cu_seqlens must have at least 2 entries, start at 0, be "
                             f"non-decreasing and end at L = {L}; got {cu.tolist()}")
        if seq is None and not on_device:
            return None, cu
        from_cu = np.repeat(np.arange(cu.size - 1), np.diff(cu))[None]  # each step's sequence
        if seq is not None and not np.array_equal(np.diff(host(seq), axis=1) != 0,
                                                  np.diff(from_cu, axis=1) != 0):
            raise ValueError(f"{fn}: seq_idx must change exactly where the sequences of "
                             f"cu_seqlens begin")
        seq = from_cu.astype(np.int32)
        if on_device:
            seq = xp.asarray(seq)
    return seq, cu
