"""GPU backend of the causal convolution: the host side of ``cuda_src/causal_conv1d.cu``.

Implements the backend contract of :mod:`ssmkit._causal_conv1d` for CuPy arrays
(``forward``, ``backward``, ``update``).

* The forward is one kernel: for the dtypes of ``TUNING["fwd_mma"]`` (bfloat16) without
  seq_idx or initial state, with L even, from ``TUNING["fwd_mma_min_width"]``,
  ``cc1d_fwd_mma`` on tensor cores (a warp per span of a row, :func:`mma_plan`); else for
  the dtypes of ``TUNING["fwd_warp"]`` (16-bit) without seq_idx or initial state, with L a
  multiple of 8 and 16-byte aligned rows, ``cc1d_fwd_warp`` (a warp per span with every
  neighbour in registers, :func:`warp_plan`); else on sm_90 for the dtypes of
  ``TUNING["fwd_tile"]`` (16-bit) without seq_idx and with whole 16-byte vectors
  ``cc1d_fwd_tile``, which brings each block's x (a tile of a row, or several whole short
  rows, :func:`forward_tile_plan`) into shared memory with one bulk asynchronous copy; else
  ``cc1d_fwd``.
* The backward is two: the convolution's backward (``cc1d_bwd_mma`` under the same
  conditions, but L a multiple of 8 and x, dy 16-byte aligned, with ``TUNING["bwd_mma"]``
  from ``TUNING["bwd_mma_min_width"]``; else, for the
  dtypes of ``TUNING["bwd_warp"]`` without seq_idx or initial state, with L a multiple of 8
  and 16-byte aligned rows, ``cc1d_bwd_warp``, a warp per span with every neighbour in
  registers, :func:`warp_plan`; else ``cc1d_bwd``), which writes per-item (tile or span)
  partial sums of ``dweight``/``dbias``, and ``cc1d_wsum``, which adds them up over batch
  and items in a fixed order (no atomics: results repeat bit for bit).

Kernel instantiations are named by :class:`KernelKey`; :func:`kernel_keys` lists
them and :func:`name_expression` spells one as the C++ template name that CuPy
(at run time) and the NVRTC check of the tests compile. CuPy is imported only
inside the launching functions.

Work split (see ``causal_conv1d.cu``): an item is one time tile of one channel row,
``tile_steps(dtype)`` steps, handled by a block of ``THREADS`` threads: four 16-byte vectors
per thread for 4-byte types, two for the others. There are ``batch * dim * ceil(L / tile)``
items (fewer than 2**31: the kernels divide item indices in 32 bits). For 16-bit types the
grid is at most the blocks that fit on the device at once (:func:`resident_blocks`) and each
block walks the items ``blockIdx.x + k * gridDim.x``; float32 and float64 launch one block
per item. Measured on the H200 (bench_causal_conv1d.py, both without read-ahead): float32
forward 0.98-1.05 of copy with one block per item against 0.87-0.92 with the resident grid;
bfloat16 backward 0.55-0.79 with the resident grid against 0.54-0.77, forward level.
``SSMKIT_CC1D_GRID=items`` or ``=resident`` in the environment (read at each launch) forces
either for every dtype but float64. Each thread keeps its
vectors in registers; neighbouring steps come from other lanes by warp shuffles and, at the
edges of each warp's 32-vector chunk, from a few words of shared memory.
"""

from __future__ import annotations

import collections
import itertools
import os

import numpy as np

from .. import _arrays
from . import compiler

__all__ = ["forward", "backward", "update", "KernelKey", "kernel_keys",
           "name_expression", "tile_steps", "resident_blocks", "mma_plan", "WIDTHS",
           "SOURCE_FILE"]

SOURCE_FILE = "causal_conv1d.cu"
THREADS = 128  # CC1D_THREADS in the source

WIDTHS = tuple(range(1, 9))  # the template values of W

#: Launch preferences (correctness does not depend on them).
TUNING = {
    "fwd_tile": ("float16", "bfloat16"),  # dtypes whose forward (no seq_idx, whole vectors,
                              # sm_90) runs cc1d_fwd_tile: bfloat16 W=8 0.75 / 0.82 of copy
                              # against 0.68 / 0.71 with cc1d_fwd, W=4 0.78 / 0.84 against
                              # 0.79 / 0.80; float32 slower (0.85-0.89 against 0.90-0.95),
                              # bench_causal_conv1d.py
    "fwd_tile_bytes": (8192, 16384),  # its bytes of x per block (a tile of a row, or whole
                              # rows) for W <= 4 and for wider filters (measured best of 4-32 KiB)
    "fwd_tile_blocks_per_sm": 8,  # fewer rows per block until the grid has this many blocks
    "fwd_mma": ("bfloat16",),  # dtypes whose forward runs cc1d_fwd_mma (no seq_idx or initial
                              # state, L even, sm_80): bfloat16 0.73-0.85 of copy against
                              # 0.68-0.85 with cc1d_fwd_tile (W = 8: 0.75 / 0.84 against
                              # 0.68 / 0.82), bench_causal_conv1d.py
    "fwd_mma_min_width": 8,   # ... for widths from this one (below, cc1d_fwd_warp: bfloat16
                              # 0.81-0.86 of copy at W 2-7 with 64 registers, cc1d_fwd_mma
                              # 0.78-0.84 at 4 and 8, cc1d_fwd_warp at 8 0.70 / 0.75 with the
                              # 72 registers it needs without silu; CAUSAL_CONV1D.md)
    "bwd_mma": ("bfloat16",),  # dtypes whose backward runs cc1d_bwd_mma (the same conditions,
                              # L a multiple of 8, x and dy 16-byte aligned)
    "bwd_mma_min_width": 5,   # ... for widths from this one: cc1d_bwd_mma costs the same at
                              # every width, cc1d_bwd_warp falls with it (bfloat16, kernel and
                              # cc1d_wsum, 8 x 3072 x 2048 / 4 x 5376 x 4096: cc1d_bwd_mma
                              # 0.86 / 0.85-0.89 of copy at W 4-7, cc1d_bwd_warp 0.87 / 0.87 at 4,
                              # 0.81 / 0.77 at 5, 0.76 / 0.74 at 6, 0.70 / 0.65 at 7;
                              # CAUSAL_CONV1D.md)
    "fwd_warp": ("float16", "bfloat16"),  # dtypes whose forward (the conditions of bwd_warp)
                              # runs cc1d_fwd_warp where cc1d_fwd_mma does not take it (float32:
                              # 0.86-0.94 of copy, as cc1d_fwd's 0.87-0.95, so cc1d_fwd stays)
    "bwd_warp": ("float16", "bfloat16", "float32"),  # dtypes whose backward (no seq_idx or
                              # initial state, L a multiple of 8, 16-byte aligned rows) runs
                              # cc1d_bwd_warp where cc1d_bwd_mma does not take it: float32 W = 8
                              # 0.88 / 0.90 of copy against 0.74 / 0.76 with cc1d_bwd,
                              # bfloat16 W = 4 0.72 / 0.77 against 0.67 / 0.72
    "warp_span": 2048,        # steps of a row per warp in the _warp kernels (a multiple of 256) ...
    "warp_warps_per_sm": 64,  # ... halved (to 256 at least) until there are this many spans
    "mma_span": 2048,         # steps of a row per warp in those (a multiple of 128) ...
    "mma_warps_per_sm": 64,   # ... halved (to 128 at least) until there are this many spans
}

_CXX = {"float16": "ssm_half", "bfloat16": "ssm_bf16", "float32": "float", "float64": "double"}

KernelKey = collections.namedtuple("KernelKey", ["kind", "io", "width", "has_bias", "silu",
                                                 "has_seq"])
KernelKey.__doc__ = """One kernel instantiation.

kind : "fwd", "fwd_tile", "fwd_mma", "fwd_warp", "bwd", "bwd_mma", "bwd_warp", "update" or
"wsum"; io : numpy dtype
name of x (for "wsum": of the compute type, float32 or float64); width : W (1..8; 0 for
"wsum", whose width is an argument);
has_bias, silu, has_seq : the template flags (has_seq is False for "update", "fwd_tile" and
the "_mma" and "_warp" kinds; all False for "wsum"); the "_mma" kinds are 16-bit only,
the "_warp" kinds 16-bit or float32."""

_NULL = np.uint64(0)


def _b(flag: bool) -> str:
    return "true" if flag else "false"


def name_expression(key: KernelKey) -> str:
    """The C++ template instantiation of ``key``, e.g.
    ``cc1d_fwd<float, 4, true, false, false>``."""
    if key.kind == "wsum":
        return f"cc1d_wsum<{_CXX[key.io]}>"
    head = f"cc1d_{key.kind}<{_CXX[key.io]}, {key.width}, {_b(key.has_bias)}, {_b(key.silu)}"
    if key.kind in ("update", "fwd_tile", "fwd_mma", "fwd_warp", "bwd_mma", "bwd_warp"):
        return head + ">"
    return head + f", {_b(key.has_seq)}>"


def kernel_keys(full: bool = True) -> list:
    """Every instantiation (``full``), or a representative set covering every template value.

    The representative set: every width with float32 (bfloat16 for the "_mma" kinds) and the
    flags cycling through their combinations, and every dtype at width 4 with all flags off
    and all on; both ``cc1d_wsum`` instantiations (float and double) in either list.
    """
    keys = [KernelKey("wsum", io, 0, False, False, False) for io in ("float32", "float64")]
    for kind in ("fwd", "fwd_tile", "fwd_mma", "fwd_warp", "bwd", "bwd_mma", "bwd_warp",
                 "update"):
        seqs = (False, True) if kind in ("fwd", "bwd") else (False,)
        ios = (("float16", "bfloat16") if kind.endswith("_mma") else
               ("float16", "bfloat16", "float32") if kind.endswith("_warp") else tuple(_CXX))
        if full:
            for io, w, hb, si, sq in itertools.product(ios, WIDTHS, (False, True), (False, True),
                                                       seqs):
                keys.append(KernelKey(kind, io, w, hb, si, sq))
            continue
        combos = list(itertools.product((False, True), (False, True), seqs))
        for w in WIDTHS:
            hb, si, sq = combos[w % len(combos)]
            keys.append(KernelKey(kind, "float32" if "float32" in ios else ios[-1], w, hb, si, sq))
        for io in ios:
            for flag in (False, True):
                key = KernelKey(kind, io, 4, flag, flag, flag and kind in ("fwd", "bwd"))
                if key not in keys:
                    keys.append(key)
    return keys


def vectors_per_thread(dtype) -> int:
    """16-byte vectors per thread per tile (``cc1d_shape<T>::VPT`` in the source)."""
    return 4 if np.dtype(dtype).itemsize == 4 else 2


def tile_steps(dtype) -> int:
    """Time steps per block: :func:`vectors_per_thread` 16-byte vectors per thread."""
    return THREADS * vectors_per_thread(dtype) * (16 // np.dtype(dtype).itemsize)


def _ptr(x):
    return _NULL if x is None else x


def _aligned(*arrays) -> bool:
    return all(a.data.ptr % 16 == 0 for a in arrays)


def _dtype_name(dtype) -> str:
    name = _arrays.dtype_name(dtype)
    if name not in _CXX:
        raise TypeError(f"ssmkit GPU causal_conv1d: unsupported dtype {name!r}; expected one of "
                        f"{sorted(_CXX)}")
    return name


def _launch(key, blocks, args):
    if blocks > 2**31 - 1:
        raise ValueError(f"ssmkit GPU causal_conv1d: {blocks} blocks is more than one launch takes")
    kernel = compiler.get_kernel(SOURCE_FILE, name_expression(key))
    kernel((int(blocks),), (THREADS,), args)


def resident_blocks(kernel) -> int:
    """Blocks of ``THREADS`` threads of ``kernel`` that fit on the current device at once.

    The driver's occupancy figure per multiprocessor, times the multiprocessors; where
    CuPy does not expose it, the same from the kernel's registers and static shared memory
    and the device's limits (registers are given out per warp in units of 256; each block
    also reserves 1 KiB of shared memory).
    """
    lim = compiler.device_limits()
    try:
        from cupy.cuda import driver

        per_sm = int(driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr,
                                                                       THREADS, 0))
    except Exception:  # a CuPy without it, or the driver refusing: the estimate below
        warps = THREADS // 32
        warp_regs = -(-max(int(kernel.num_regs), 1) * 32 // 256) * 256
        by_regs = (lim["regs_per_sm"] // warp_regs) // warps
        by_smem = lim["smem_per_sm"] // (int(kernel.shared_size_bytes) + 1024)
        per_sm = min(by_regs, by_smem, lim["max_warps_per_sm"] // warps, lim["max_blocks_per_sm"])
    return max(per_sm, 1) * lim["sm_count"]


def _launch_items(key, n_items, args):
    """Launch a streamed kernel over ``n_items`` items: one resident wave of blocks that
    walk the items (``SSMKIT_CC1D_GRID=items``: one block per item)."""
    if n_items > 2**31 - 1:
        raise ValueError(f"ssmkit GPU causal_conv1d: {n_items} tiles is more than the kernels "
                         "index (2**31 - 1)")
    import cupy

    name = name_expression(key)
    kernel = compiler.get_kernel(SOURCE_FILE, name)
    blocks = n_items  # float64: a block does one item (cc1d_shape<double>::WALK)
    forced = os.environ.get("SSMKIT_CC1D_GRID", "")
    walk = forced == "resident" if forced in ("items", "resident") else key.io in ("float16",
                                                                                 "bfloat16")
    if key.io != "float64" and walk:
        where = (cupy.cuda.runtime.getDevice(), name)
        wave = _resident.get(where)
        if wave is None:
            wave = _resident[where] = resident_blocks(kernel)
        blocks = min(n_items, wave)
    kernel((int(blocks),), (THREADS,), args)


_resident: dict = {}  # (device, kernel name) -> resident_blocks


def _grid(p):
    io = _dtype_name(p.io_dtype)
    if p.dim > 2**31 - 1 or p.batch > 2**31 - 1:
        raise ValueError("ssmkit GPU causal_conv1d: batch and dim must fit 32 bits")
    if p.width not in WIDTHS:
        raise ValueError(f"ssmkit GPU causal_conv1d: width {p.width} is not one of {WIDTHS}")
    tile = tile_steps(p.io_dtype)
    n_tiles = -(-p.L // tile)
    return io, n_tiles, p.batch * p.dim * n_tiles, 16 // np.dtype(p.io_dtype).itemsize


def forward_tile_plan(*, rows: int, L: int, width: int, dtype, sm_count: int = 132) -> dict:
    """Work split of ``cc1d_fwd_tile``: each block takes ``steps`` steps of ``rows_per_item``
    consecutive rows (several only when ``steps == L``), about ``TUNING["fwd_tile_bytes"]``
    bytes of x (the first entry for ``width`` <= 4, the second for wider filters).

    Returns
    -------
    dict
        ``steps``, ``rows_per_item``, ``n_tiles`` per row, ``n_items`` (blocks), ``smem``
        (dynamic shared memory bytes: the x tile, then per row the taps, bias and W-1 edge
        steps in the compute type).
    """
    item = np.dtype(dtype).itemsize
    vec = 16 // item
    nbytes = TUNING["fwd_tile_bytes"][0 if width <= 4 else 1]
    budget = max(vec, nbytes // item // vec * vec)  # steps, whole vectors
    steps = min(-(-L // vec) * vec, budget)
    per_item = max(1, min(rows, 64, budget // steps)) if steps >= L else 1
    n_tiles = -(-L // steps)
    while per_item > 1 and -(-rows // per_item) * n_tiles < TUNING["fwd_tile_blocks_per_sm"] * sm_count:
        per_item //= 2
    compute = 8 if item == 8 else 4
    return dict(steps=steps, rows_per_item=per_item, n_tiles=n_tiles,
                n_items=-(-rows // per_item) * n_tiles,
                smem=per_item * steps * item + per_item * (2 * width) * compute)


def forward(p):
    """y (batch, dim, L) and final_state (batch, dim, W-1), both ``p.io_dtype``."""
    cp = p.xp
    io, n_tiles, n_items, vec = _grid(p)
    H = p.width - 1
    y = cp.empty(p.x.shape, dtype=p.io_dtype)
    final = cp.empty((p.batch, p.dim, H), dtype=p.io_dtype)
    launch = _mma_for("fwd", p, p.x, y)
    if launch is None and _aligned(p.x, y):
        launch = _warp_launch("fwd", p)
    if launch is not None:  # a warp per span: cc1d_fwd_mma or cc1d_fwd_warp
        kernel, grid, scalars, _ = launch
        kernel(grid, (THREADS,), (p.x, p.weight, _ptr(p.bias), y, final if H else _NULL)
               + scalars)
        return y, final
    vec_ok = p.L % vec == 0 and _aligned(p.x, y)
    # the tile kernel: x through shared memory by bulk copies (sm_90), whole vectors only
    limits = compiler.device_limits()
    tile = (vec_ok and p.seq_idx is None and io in TUNING["fwd_tile"] and p.L > 0
            and limits["compute_capability"] >= 90)
    key = KernelKey("fwd_tile" if tile else "fwd", io, p.width, p.bias is not None, p.silu,
                    p.seq_idx is not None)
    if tile:
        rows = p.batch * p.dim
        plan = forward_tile_plan(rows=rows, L=p.L, width=p.width, dtype=p.io_dtype,
                                 sm_count=limits["sm_count"])
        if plan["n_items"] > 2**31 - 1:
            raise ValueError(f"ssmkit GPU causal_conv1d: {plan['n_items']} tiles is more than "
                             "the kernels index (2**31 - 1)")
        if plan["n_items"] == 0:
            return y, final
        kernel = compiler.get_kernel(SOURCE_FILE, name_expression(key))
        compiler.ensure_dynamic_smem(kernel, key, plan["smem"])
        args = (p.x, p.weight, _ptr(p.bias), _ptr(p.initial_state), y, final if H else _NULL,
                np.int32(p.dim), np.int64(p.L), np.int32(plan["steps"]),
                np.int32(plan["n_tiles"]), np.int32(plan["rows_per_item"]), np.int64(rows))
        kernel((int(plan["n_items"]),), (THREADS,), args, shared_mem=plan["smem"])
        return y, final
    args = (p.x, p.weight, _ptr(p.bias), _ptr(p.initial_state), _ptr(p.seq_idx), y,
            final if H else _NULL, np.int32(p.dim), np.int64(p.L), np.int32(n_tiles),
            np.int32(n_items), np.int32(vec_ok))
    _launch_items(key, n_items, args)
    return y, final


MMA_CHUNK = 128  # CC1D_MMA_CHUNK in the source: steps per warp and round of products


def _span_plan(rows, L, sm_count, chunk, span_max, warps_per_sm) -> dict:
    """Each warp walks ``span`` steps of one row: a multiple of ``chunk``, ``span_max`` at
    most, halved while there are fewer spans than ``warps_per_sm`` per multiprocessor."""
    span = max(chunk, min(-(-L // chunk), span_max // chunk) * chunk)
    while span > chunk and rows * -(-L // span) < warps_per_sm * sm_count:
        span = max(chunk, span // 2 // chunk * chunk)
    n_spans = -(-L // span)
    n_items = rows * n_spans
    return dict(span=span, n_spans=n_spans, n_items=n_items, blocks=-(-n_items // (THREADS // 32)))


def mma_plan(*, rows: int, L: int, sm_count: int = 132) -> dict:
    """Work split of ``cc1d_fwd_mma`` and ``cc1d_bwd_mma``: each warp walks ``span`` steps of
    one row (a multiple of 128, ``TUNING["mma_span"]`` at most, halved while there are fewer
    spans than ``TUNING["mma_warps_per_sm"]`` per multiprocessor).

    Returns
    -------
    dict
        ``span``, ``n_spans`` per row, ``n_items`` (rows x spans, one warp each) and
        ``blocks`` (of ``THREADS`` threads).
    """
    return _span_plan(rows, L, sm_count, MMA_CHUNK, TUNING["mma_span"],
                      TUNING["mma_warps_per_sm"])


WARP_CHUNK = 256  # CC1D_WARP_CHUNK in the source: steps per warp and round, 8 per lane


def warp_plan(*, rows: int, L: int, sm_count: int = 132) -> dict:
    """Work split of ``cc1d_fwd_warp`` and ``cc1d_bwd_warp``, as :func:`mma_plan` with chunks of 256 steps and
    ``TUNING["warp_span"]`` / ``TUNING["warp_warps_per_sm"]``."""
    return _span_plan(rows, L, sm_count, WARP_CHUNK, TUNING["warp_span"],
                      TUNING["warp_warps_per_sm"])


_span_launches: dict = {}  # (device, kernel kind, shape, flags, TUNING) -> _span_launch's answer


def _span_launch(kind, p, tune, applies, plan_of, int_steps):
    """The launch of the warp-per-span kernel ``cc1d_<kind>`` ("fwd_mma", "bwd_warp"...) for
    ``p``, cached per shape, flags and ``tune`` (the TUNING values it depends on): (kernel,
    grid, scalar arguments, spans per row), or None where ``applies()`` says no or there are
    2**31 spans or more (the kernels count warps in 32 bits). ``plan_of(rows, L, sm_count)``
    splits the rows; ``int_steps``: the steps go to the kernel as int32 (else int64)."""
    import cupy

    key = (cupy.cuda.runtime.getDevice(), kind, p.io_dtype, p.width, p.bias is not None, p.silu,
           p.seq_idx is None, p.initial_state is None, p.batch, p.dim, p.L, tune)
    if key in _span_launches:
        return _span_launches[key]
    entry = None
    if applies():
        plan = plan_of(rows=p.batch * p.dim, L=p.L, sm_count=compiler.device_limits()["sm_count"])
        if plan["n_items"] < 2**31:
            name = name_expression(KernelKey(kind, _dtype_name(p.io_dtype), p.width,
                                             p.bias is not None, p.silu, False))
            steps = np.int32 if int_steps else np.int64
            scalars = (np.int32(p.dim), steps(p.L), steps(plan["span"]),
                       np.int32(plan["n_spans"]), np.int32(plan["n_items"]))
            entry = (compiler.get_kernel(SOURCE_FILE, name), (int(plan["blocks"]),), scalars,
                     plan["n_spans"])
    if len(_span_launches) >= 256:  # a bound for programs that see many shapes
        _span_launches.clear()
    _span_launches[key] = entry
    return entry


def _mma_launch(kind, p):
    """How ``cc1d_<kind>_mma`` ("fwd" or "bwd") runs ``p`` (:func:`_span_launch`), or None
    where the other kernels take it (not in ``TUNING[kind + "_mma"]``, below
    ``TUNING[kind + "_mma_min_width"]``; seq_idx or an initial state; L odd, for the backward
    L not a multiple of 8, or so large that a step plus two spans would pass 2**31: the
    kernels count steps in 32 bits; before sm_80). The arrays' alignment (4 bytes; the
    backward's x and dy 16) is the caller's to check."""
    def applies():
        return (_arrays.dtype_name(p.io_dtype) in TUNING[kind + "_mma"]
                and p.width >= TUNING[kind + "_mma_min_width"]
                and p.seq_idx is None and p.initial_state is None
                and p.L % (2 if kind == "fwd" else 8) == 0
                and 0 < p.L < 2**31 - 2 * (TUNING["mma_span"] + MMA_CHUNK)
                and compiler.device_limits()["compute_capability"] >= 80)

    tune = (TUNING[kind + "_mma"], TUNING["mma_span"], TUNING["mma_warps_per_sm"],
            TUNING[kind + "_mma_min_width"])
    return _span_launch(kind + "_mma", p, tune, applies, mma_plan, int_steps=True)


def _mma_for(kind, p, *arrays):
    """:func:`_mma_launch`'s answer where ``kind`` ("fwd" or "bwd") runs on tensor cores for
    ``p`` and ``arrays`` (which must also be 4-byte aligned), else None."""
    launch = _mma_launch(kind, p)
    return launch if launch is not None and all(a.data.ptr % 4 == 0 for a in arrays) else None


def _warp_launch(kind, p):
    """How ``cc1d_<kind>_warp`` ("fwd" or "bwd") runs ``p`` (:func:`_span_launch`), or None
    where the other kernels take it (the dtype not in ``TUNING[kind + "_warp"]``; seq_idx or
    an initial state; L not a multiple of 8). The arrays' 16-byte alignment is the caller's
    to check."""
    def applies():
        return (_arrays.dtype_name(p.io_dtype) in TUNING[kind + "_warp"] and p.seq_idx is None
                and p.initial_state is None and p.L % 8 == 0 and p.L > 0)

    tune = (TUNING[kind + "_warp"], TUNING["warp_span"], TUNING["warp_warps_per_sm"])
    return _span_launch(kind + "_warp", p, tune, applies, warp_plan, int_steps=False)


def backward(p, dy, dfinal_state):
    """Gradients dict(x, weight, bias, initial_state) (see the backend contract)."""
    cp = p.xp
    io, n_tiles, n_items, vec = _grid(p)
    H, W = p.width - 1, p.width
    cd = p.compute_dtype
    dx = cp.empty(p.x.shape, dtype=p.io_dtype)
    dh0 = cp.empty((p.batch, p.dim, H), dtype=cd) if p.initial_state is not None else None
    launch = _mma_for("bwd", p, p.x, dy, dx) if _aligned(p.x, dy) else None
    if launch is None and _aligned(p.x, dy, dx):
        launch = _warp_launch("bwd", p)
    if launch is not None:  # a warp per span: cc1d_bwd_mma or cc1d_bwd_warp
        kernel, grid, scalars, n_tiles = launch
        partial = cp.empty((p.batch, p.dim, n_tiles, W + 1), dtype=cd)
        kernel(grid, (THREADS,), (p.x, p.weight, _ptr(p.bias), dy,
                                  _ptr(dfinal_state if H else None), dx, partial) + scalars)
    else:
        partial = cp.empty((p.batch, p.dim, n_tiles, W + 1), dtype=cd)
        vec_ok = p.L % vec == 0 and _aligned(p.x, dy, dx)
        key = KernelKey("bwd", io, W, p.bias is not None, p.silu, p.seq_idx is not None)
        args = (p.x, p.weight, _ptr(p.bias), _ptr(p.initial_state), _ptr(p.seq_idx), dy,
                _ptr(dfinal_state if H else None), dx, _ptr(dh0 if H else None), partial,
                np.int32(p.dim), np.int64(p.L), np.int32(n_tiles), np.int32(n_items),
                np.int32(vec_ok))
        _launch_items(key, n_items, args)
    dweight = cp.empty((p.dim, W), dtype=cd)
    dbias = cp.empty((p.dim,), dtype=cd) if p.bias is not None else None
    wsum = KernelKey("wsum", _arrays.dtype_name(cd), 0, False, False, False)
    _launch(wsum, -(-p.dim * (W + 1) // THREADS),
            (partial, dweight, _ptr(dbias), np.int32(p.batch), np.int32(p.dim),
             np.int32(n_tiles), np.int32(W)))
    return dict(x=dx, weight=dweight, bias=dbias, initial_state=dh0)


def update(x, conv_state, weight, bias, silu, rows):
    """Decoding steps on the GPU; ``conv_state`` is updated in place.

    Parameters
    ----------
    x : cupy.ndarray, (batch, dim, T), C-contiguous, the dtype of ``conv_state``
    conv_state : cupy.ndarray, (pool, dim, W-1), any strides
    weight : cupy.ndarray, (dim, W), compute dtype, C-contiguous
    bias : cupy.ndarray, (dim,), compute dtype, or None
    silu : bool
    rows : cupy.ndarray of int64, (batch,), or None
        Validated by the caller: indices < pool, no non-negative index twice.

    Returns
    -------
    y : cupy.ndarray, (batch, dim, T), the dtype of ``x``
    """
    import cupy as cp
    io = _dtype_name(x.dtype)
    if conv_state.dtype != x.dtype:
        raise TypeError(f"ssmkit GPU causal_conv1d_update: conv_state dtype {conv_state.dtype} "
                        f"differs from x's {x.dtype}")
    batch, dim, steps = x.shape
    W = weight.shape[1]
    if W not in WIDTHS:
        raise ValueError(f"ssmkit GPU causal_conv1d_update: width {W} is not one of {WIDTHS}")
    item = conv_state.dtype.itemsize
    strides = [s // item for s in conv_state.strides]
    y = cp.empty_like(x)
    key = KernelKey("update", io, W, bias is not None, bool(silu), False)
    blocks = -(-batch * dim // THREADS)
    args = (x, conv_state, weight, _ptr(bias), _ptr(rows), y, np.int32(batch), np.int32(dim),
            np.int64(steps), np.int64(strides[0]), np.int64(strides[1]), np.int64(strides[2]))
    _launch(key, blocks, args)
    return y

