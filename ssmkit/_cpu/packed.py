"""Rows of packed sequences copied into the padded rows of a call of their own, and back
(the selective scan's ``seq_idx`` / ``cu_seqlens``; ``ssmkit._selective_scan_packed``).

Padded row r of a call holds steps ``off[r] + j`` of batch row ``row[r]`` at its columns
``lo[r] <= j < hi[r]`` and zeros elsewhere. Arrays are (rows, C, steps), C-contiguous, of
any one dtype (16-bit floats as their bits). ``cuda_src/packed_rows.cu`` does the same on
the GPU.
"""

from __future__ import annotations

from numba import njit, prange

_KERNEL_OPTIONS = dict(cache=True, parallel=True, error_model="numpy")


@njit(**_KERNEL_OPTIONS)
def pack_rows(src, dst, row, off, lo, hi):
    """dst[r, c, j] = src[row[r], c, off[r] + j] for lo[r] <= j < hi[r], else 0."""
    R, C, Lp = dst.shape
    # by line c: a batch row's line is read piece by piece from one place (lines are often
    # a few steps long); loops, not slices, for the same reason
    for c in prange(C):
        for r in range(R):
            a, b, s, q = lo[r], hi[r], off[r], row[r]
            for j in range(a):
                dst[r, c, j] = 0
            for j in range(a, b):
                dst[r, c, j] = src[q, c, s + j]
            for j in range(b, Lp):
                dst[r, c, j] = 0


@njit(**_KERNEL_OPTIONS)
def unpack_rows(src, dst, row, off, lo, hi):
    """dst[row[r], c, off[r] + j] = src[r, c, j] for lo[r] <= j < hi[r] (the inverse)."""
    R, C, Lp = src.shape
    for c in prange(C):
        for r in range(R):
            s, q = off[r], row[r]
            for j in range(lo[r], hi[r]):
                dst[q, c, s + j] = src[r, c, j]
