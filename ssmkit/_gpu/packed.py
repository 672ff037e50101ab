"""The GPU's copies between packed sequences' rows and padded rows (``cuda_src/packed_rows.cu``);
the same arguments and meaning as :mod:`ssmkit._cpu.packed`."""

from __future__ import annotations

import numpy as np

from . import compiler

SOURCE_FILE = "packed_rows.cu"
THREADS = 128
_BITS = {2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}


def kernel_name(kind: str, itemsize: int) -> str:
    """``ssm_pack_rows<T>`` or ``ssm_unpack_rows<T>`` for elements of ``itemsize`` bytes."""
    return f"ssm_{kind}_rows<{_BITS[itemsize]}>"


def kernel_names() -> list:
    return [kernel_name(kind, size) for kind in ("pack", "unpack") for size in _BITS]


def _launch(kind, src, dst, padded, row, off, lo, hi):
    import cupy

    R, C, Lp = padded.shape
    L = (src if kind == "pack" else dst).shape[2]  # the batch rows' steps
    if R * C >= 2**31:
        raise ValueError(f"packed sequences: {R} padded rows of {C} lines exceed the grid")
    if R * C == 0:
        return
    kernel = compiler.get_kernel(SOURCE_FILE, kernel_name(kind, src.dtype.itemsize))
    index = (cupy.asarray(row, dtype=np.int64), cupy.asarray(off, dtype=np.int64),
             cupy.asarray(lo, dtype=np.int32), cupy.asarray(hi, dtype=np.int32))
    kernel((R * C,), (THREADS,), (src, dst) + index + (np.int32(C), np.int64(L), np.int32(Lp)))


def pack_rows(src, dst, row, off, lo, hi):
    """dst[r, c, j] = src[row[r], c, off[r] + j] for lo[r] <= j < hi[r], else 0."""
    _launch("pack", src, dst, dst, row, off, lo, hi)


def unpack_rows(src, dst, row, off, lo, hi):
    """dst[row[r], c, off[r] + j] = src[r, c, j] for lo[r] <= j < hi[r]."""
    _launch("unpack", src, dst, src, row, off, lo, hi)
