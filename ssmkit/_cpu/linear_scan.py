"""Numba kernel for the first-order linear recurrence on NumPy arrays.

The public layer (``ssmkit._linear_scan``) moves the scanned axis last and
flattens the rest, so the kernel sees ``rows x L`` views (any strides: a
broadcast ``a`` arrives with stride 0, a reverse scan with a negative stride
along ``L``, and nothing is copied for either). Rows are independent and run in
parallel; each row is one sequential loop, the exact order of the definition,
so results match the float64 reference up to the rounding of the dtype.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import njit, prange, types

__all__ = ["linear_scan_rows"]


def _scan_rows(a, b, h0, out, final):
    """``out[r, t] = a[r, t] * out[r, t-1] + b[r, t]`` with ``out[r, -1] = h0[r]``."""
    rows, L = b.shape
    for r in prange(rows):
        h = h0[r]
        for t in range(L):
            h = a[r, t] * h + b[r, t]
            out[r, t] = h
        final[r] = h


@functools.lru_cache(maxsize=None)
def _kernel(dtype_name):
    """The kernel for one dtype, compiled on first use (and cached on disk).

    One signature with any-layout arrays per dtype: contiguous, broadcast and
    reversed views all convert to it, so each dtype compiles once.
    """
    t = numba.from_dtype(np.dtype(dtype_name))
    read2, read1 = types.Array(t, 2, "A", readonly=True), types.Array(t, 1, "A", readonly=True)
    out2, out1 = types.Array(t, 2, "A"), types.Array(t, 1, "A")
    sig = types.void(read2, read2, read1, out2, out1)
    return njit(sig, parallel=True, cache=True, fastmath=False)(_scan_rows)


def linear_scan_rows(a, b, h0, reverse):
    """Scan each row of ``b`` (rows, L) with coefficients ``a`` (rows, L).

    Parameters
    ----------
    a, b : ndarray, (rows, L)
        The compute dtype (float32, float64, complex64 or complex128), any strides.
    h0 : ndarray, (rows,)
        The state before the first step (of the compute dtype).
    reverse : bool
        Run from ``t = L-1`` down to 0.

    Returns
    -------
    h : ndarray, (rows, L)
        C-contiguous.
    final : ndarray, (rows,)
        The state after the last step.
    """
    out = np.empty(b.shape, dtype=b.dtype)
    final = np.empty(b.shape[0], dtype=b.dtype)
    kernel = _kernel(b.dtype.name)
    if reverse:
        kernel(a[:, ::-1], b[:, ::-1], h0, out[:, ::-1], final)
    else:
        kernel(a, b, h0, out, final)
    return out, final
