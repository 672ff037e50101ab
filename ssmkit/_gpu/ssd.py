"""GPU launcher for Mamba-2's SSD scan: the CUDA kernels of ``cuda_src/ssd.cu``.

Implements the backend contract of ``ssmkit._ssd`` (:func:`ssd_forward`,
:func:`ssd_backward`) with the chunked algorithm, per (batch row, head):

Forward
    1. ``ssd_chunk_dt``: the effective step dt' (and its derivative) and, per chunk,
       the cumulative sum of ``dt' A`` (log space, per chunk), in one pass;
    2. ``ssd_chunk_state``: each chunk's own contribution to the state at its end;
    3. ``ssd_state_passing``: the state at every chunk boundary (on the tensor-core
       path without checkpoints: only the final states, and the entering states in 16
       bits);
    4. ``ssd_chunk_mm``: the chunk-local outputs (the masked Q x Q diagonal block
       times X) plus the output correction from the entering state, D skip and
       gate, in one kernel; its q-tile sums C_t . B_s come from ``ssd_chunk_cb``, made
       once per chunk for all the heads that share B and C.
    ``ssd_chunk_state`` and ``ssd_chunk_mm`` are register-tiled matrix products on the
    CUDA cores (float, double, and 16-bit inputs with the tensor cores off); in float32
    arithmetic on sm_80 and later they run on tensor cores instead (``ssd_chunk_mm_tc``,
    ``ssd_chunk_state_tc``: 3 x TF32, operands kept to about 22 of float32's 24 bits;
    ``SSMKIT_SSD_TF32=0`` keeps them on the CUDA cores). For float32 x, B and C without
    restarts (N <= 128, heads sharing their B and C groups), steps 2 to 4 are one kernel
    instead where it is the faster (``TF32_FUSED_FWD``, :func:`tf32_fused_faster`):
    ``ssd_tf32_fwd`` in ``cuda_src/ssd_mma.cu``, one walk per (row, head, 64 columns p) in
    tiles of 32 steps, the state in registers, every product 3 x TF32, C B^T read from
    ``ssd_chunk_cb``.
    The chunks are cut every ``kernel_chunk(chunk_size)`` steps (at most
    ``F32_MAX_CHUNK`` for float32 x, else ``chunk_size``) and at every end of a packed
    sequence, so each final state is a boundary state from step 3.
    For float16/bfloat16 x with B, C of the same dtype and P <= 128, steps 2 to 4
    run on tensor cores instead (``cuda_src/ssd_mma.cu``): steps 2 and 3 in one walk
    along each row's chunks, the state in registers (``ssd_mma_state_walk``;
    ``MMA_STATE_WALK = False`` runs ``ssd_mma_chunk_state`` then ``ssd_state_passing``),
    step 4 in ``ssd_mma_chunk_out``, which reads each chunk's C B^T from ``ssd_mma_cb``,
    made once for all the heads that share B and C; every option supported. Without
    restarts (no ``seq_idx`` or ``cu_seqlens``), N <= 128 and 16-byte aligned rows, steps 2
    to 4 are one kernel instead, ``ssd_mma_fwd``: one walk per (row, head, 64 columns p),
    the state in registers, C B^T and the outputs made per 64-step tile; where it is the
    faster by the estimate of :func:`fused_faster` (``MMA_FUSED_FWD``).
    ``SSMKIT_SSD_MMA=0`` in the environment selects the CUDA-core kernels for every call
    (to compare the two). The per-chunk passes over (batch, L, H) arrays (``ssd_chunk_dt``
    and, in the backward, ``ssd_chunk_cumsum`` and ``ssd_bwd_dt``) take a block per (row,
    chunk, 32 heads), its warps runs of the chunk's steps.

Backward (from the boundary states the forward kept, nothing per step)
    the outputs are recomputed without gate (``ssd_chunk_mm``), the adjoint
    chunk sums and ``ssd_adjoint_passing`` give the adjoint leaving every chunk
    and the initial state's gradient, and three transposed ``ssd_chunk_mm``
    products give (G B)_s (for dx and ddt), dB and dC (in float32 on tensor cores, dB and
    dC summed over heads instead: ``ssd_chunk_hblocks_tc`` sums the heads' weighted
    blocks once for both, ``ssd_chunk_hsum_tc`` multiplies them by C or B once per class
    of heads); ``ssd_bwd_rows`` does the
    per-step work after them (dx, x . (G B), the chunk sums' cotangent, dD's partial
    sums) in one pass, and with z ``ssd_bwd_gate`` the gate's (dz, and dY from the
    recomputed output) in one pass before them; ddt through the decays
    is a suffix sum per chunk of ``dY_t . y_t - dt'_t x_t . (G B)_t`` (plus the
    boundary term ``<dHx, H>``), times A. For float32 x, B and C where the forward's one
    kernel could run, P <= 64 and at least one block per SM (``TF32_BWD_WALK``,
    :func:`tf32_bwd_walk_faster`), ``ssd_tf32_bwd`` replaces the adjoint chunk sums, their
    passing, (G B)_s and the per-step pass: the forward's walk run backwards in time, the
    adjoint in registers, beside the summed blocks and dC on a second stream.

    Unless ``SSMKIT_SSD_MMA_BWD=0`` is set in the environment, the backward runs on
    tensor cores for float16/bfloat16 x with B, C of the same dtype, P <= 128 and
    N <= 128 (``cuda_src/ssd_mma.cu``; dY enters every product rounded to the input
    dtype): the four chunk products (``ssd_mma_chunk_mm``; dB and dC summed over each
    group's heads inside the kernel, dB scaled by dt' there, so no per-head (batch, L,
    H, N) array exists), the adjoint chunk sums (``ssd_mma_chunk_state`` in its adjoint
    form, exp(cum_t) dY_t as a hi + lo pair of 16-bit values: float32-accurate to about
    16 bits; ``MMA_ADJOINT_STATE = False`` runs ``ssd_chunk_state`` instead), and the
    per-step element-wise work (z gate, D, dx, the chunk sums' cotangent, dD) in the
    epilogues of the recomputed output (ycore) and of (G B) (``FUSE`` of
    ``ssd_mma_chunk_mm``), so that their float32 rows never go to memory
    (``MMA_ROWS_FUSED = False``: written, then read back by ``ssd_mma_bwd_rows``, one pass
    before the products with z and one after). Every option is supported there (D, z,
    seq_idx, cu_seqlens, initial and final states); other shapes and dtypes use the
    CUDA-core products. On that path the
    (G B) product carries dt'_s, the diagonal terms (s = t) of the recomputed
    output and of (G B) are added in float32, ``x_s . (G B)_s`` comes from
    ``B_s . dB_s / dt'_s``, and the chunk-end term ``<dHx, S_c>`` is the sum of the
    boundary terms of ``dt'_s x_s . (G B)_s`` that the kernel writes per step: the
    terms that cancel in the chunk sums' cotangent then cancel up to float32 sums
    instead of through different 16-bit roundings. With softplus and B, C in the same
    groups (``MMA_SHARED_BLOCKS``), dB reads the heads' masked blocks that dC summed,
    and ``x_s . (G B)_s`` comes from GB's epilogue instead; without z as well
    (``MMA_DC_DCUM``), dC also gives the first half of the chunk sums' cotangent, from
    the recomputed output's own rounded block entries, and that product is not run.
    With z, where the VJP's forward ran as one kernel, it kept the output before the
    gate in the input dtype (``ssd_mma_fwd<T, NW, true>``): the backward then runs the
    gate's backward from it first (``ssd_bwd_gate``, dY rounded to the input dtype) and
    the rest as without z.

Arithmetic is float32 (float64 for float64 inputs) on CUDA cores, except the
tensor-core products (16-bit operands, or float32 operands as two TF32 parts; float32
sums).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os

import numpy as np

from .. import _arrays
from . import compiler
from .streams import fork, join

__all__ = ["ssd_forward", "ssd_backward", "warmup", "chunk_starts", "kernel_names", "MAX_DIM",
           "SOURCE_FILE", "DTYPE_PAIRS", "MMA_SOURCE_FILE", "mma_kernel_names", "uses_mma",
           "mma_bwd_kernel_names", "uses_mma_bwd"]

SOURCE_FILE = "ssd.cu"
THREADS = 256
CHUNK_THREADS = 1024  # SSD_CHUNK_THREADS: the per-chunk passes, a run of steps per warp
MMA_SOURCE_FILE = "ssd_mma.cu"
MMA_THREADS = 128  # SSD_MMA_THREADS
MMA_ROWS = 64      # SSD_MMA_ROWS: steps per tile of ssd_mma_chunk_out
MMA_WIDTHS = (32, 64, 128)  # PW of ssd_mma_chunk_out: P rounded up to one of these
MAX_DIM = 256  # SSD_MAXD in ssd.cu: the largest P and N
_NULL = np.uint64(0)  # a null device pointer for absent optional arrays

_CTYPE = {"float64": "double", "float32": "float", "float16": "ssm_half", "bfloat16": "ssm_bf16"}
_COMPUTE = {"float64": "float64", "float32": "float32", "float16": "float32",
            "bfloat16": "float32"}
# (x, B/C) dtype pairs: B and C in the dtype of x, or in the compute dtype.
DTYPE_PAIRS = (("float64", "float64"), ("float32", "float32"), ("float16", "float16"),
               ("float16", "float32"), ("bfloat16", "bfloat16"), ("bfloat16", "float32"))
# The chunk products: (U, W, Vv, output) roles, UPPER, MT, DTQ (see ssd_chunk_mm).
MM_KINDS = {
    "y": (("bc", "bc", "io", "io"), False, False, True),        # forward output
    "ycore": (("bc", "bc", "io", "ct"), False, False, True),    # recomputed, no D, no gate
    "GB": (("bc", "bc", "ct", "ct"), True, False, False),
    "dB": (("io", "ct", "bc", "ct"), True, True, False),
    "dC": (("ct", "io", "bc", "ct"), False, True, True),
}


def chunk_starts(L: int, chunk_size: int, seq_ends=None) -> np.ndarray:
    """Chunk boundaries: every ``chunk_size`` steps, and at every end of a packed sequence.

    Returns
    -------
    numpy.ndarray, int64
        ``0 = starts[0] < starts[1] < ... < starts[-1] = L``; chunk c is
        ``starts[c] .. starts[c + 1] - 1``. A final state is then always the
        state at a boundary, which the state passing computes anyway.
    """
    regular = np.minimum(np.arange(0, L + chunk_size, chunk_size, dtype=np.int64), L)
    ends = np.asarray([] if seq_ends is None else seq_ends, dtype=np.int64)
    # (sorted and deduplicated by hand: np.unique's hashing took 0.3 ms at 4096 ends)
    starts = np.sort(np.concatenate([regular, ends[(ends > 0) & (ends <= L)]]))
    return starts[np.concatenate(([True], starts[1:] != starts[:-1]))]


def tile_rows(compute: str) -> int:
    """Rows per tile of ``ssd_chunk_mm`` (ssd_mm_tile<CT>::R): 64 in float, 32 in double."""
    return 32 if compute == "float64" else 64


def column_groups(V: int, compute: str) -> int:
    """VM of ``ssd_chunk_mm``: each thread owns VM groups of columns, the groups
    ``tile_rows(compute)`` apart, VM = ceil(V / tile_rows) rounded up to a power of 2."""
    need = -(-V // tile_rows(compute))
    vm = 1
    while vm < need:
        vm *= 2
    return vm


def vm_values(compute: str) -> list:
    """Every VM of ``ssd_chunk_mm`` that some V <= MAX_DIM takes in this compute dtype."""
    return sorted({column_groups(V, compute) for V in range(1, MAX_DIM + 1)})


def _cbool(*flags) -> str:
    """C++ bool template arguments: ``true, false, ...``."""
    return ", ".join("true" if f else "false" for f in flags)


def _mm_args(kind: str, io: str, bc: str) -> tuple:
    """The U, W, Vv, output types and the UPPER, MT, DTQ flags of one chunk-product kind,
    as ``ssd_chunk_mm`` and ``ssd_chunk_mm_tc`` take them."""
    roles, upper, mt, dtq = MM_KINDS[kind]
    ct = _COMPUTE[io]
    types = ", ".join(_CTYPE[{"io": io, "bc": bc, "ct": ct}[r]] for r in roles)
    return types, _cbool(upper, mt, dtq)


def gate_name(io: str, kept: bool) -> str:
    """``ssd_bwd_gate``'s instance for x of dtype ``io``: from ycore in the compute dtype,
    dY in it too; with ``kept``, from the forward's output before the gate, dY in ``io``."""
    T, CT = _CTYPE[io], _CTYPE[_COMPUTE[io]]
    return f"ssd_bwd_gate<{T}, {T}, {T}, {CT}>" if kept else f"ssd_bwd_gate<{T}, {CT}, {CT}, {CT}>"


def mm_name(kind: str, io: str, bc: str, vm: int) -> str:
    types, flags = _mm_args(kind, io, bc)
    return f"ssd_chunk_mm<{types}, {_CTYPE[_COMPUTE[io]]}, {flags}, {vm}>"


# float32 x runs chunks of at most this many steps: its chunk products (3 x TF32, or the
# CUDA cores) cost in proportion to the chunk, the state passing and the boundary states in
# inverse proportion, and at the peer shape 128 beats 256 and 64 (SSD.md, "float32 at chunks
# of 128"). The result does not depend on the chunk beyond rounding; the VJP keeps a state
# every F32_MAX_CHUNK steps. The 16-bit paths are fastest at 256 and take the caller's chunk.
F32_MAX_CHUNK = 128


def kernel_chunk(chunk_size: int, io: str) -> int:
    """The chunk the kernels run for the caller's ``chunk_size`` and x's dtype ``io``."""
    return min(chunk_size, F32_MAX_CHUNK) if io == "float32" else chunk_size


# ssd_chunk_mm_tc: the float chunk products on tensor cores (3 x TF32); a block per 64 rows
# and 8 NT columns.
TC_THREADS = 128  # SSD_TC_THREADS
TC_NT = (8, 16)   # NT: n-tiles of 8 columns a block owns
# The kinds that run there ("state": the chunk states, ssd_chunk_state_tc; "hsum": dB and dC
# summed over heads by ssd_chunk_hsum_tc, else per head and then summed): all of them; a
# module switch so that one kind can be timed on the CUDA cores against the others.
TC_KINDS = ("y", "ycore", "GB", "dB", "dC", "state", "hsum")


def uses_tc(compute: str, kind: str) -> bool:
    """Whether the chunk product ``kind`` runs on ``ssd_chunk_mm_tc`` (``"state"``: the chunk
    states on ``ssd_chunk_state_tc``): one of TC_KINDS in float32 arithmetic, on a device of
    compute capability 8.0 or more, with ``SSMKIT_SSD_TF32`` not set to ``0``."""
    return (compute == "float32" and kind in TC_KINDS
            and os.environ.get("SSMKIT_SSD_TF32", "1") != "0"
            and compiler.device_limits()["compute_capability"] >= 80)


def tc_nt(V: int) -> int:
    """NT of ``ssd_chunk_mm_tc`` for V columns: 8 up to 64, else 16 (blocks of 128 columns)."""
    return TC_NT[0] if V <= 8 * TC_NT[0] else TC_NT[1]


def mm_tc_name(kind: str, io: str, bc: str, nt: int, gate: bool = False,
               rows: bool = False) -> str:
    """The ``ssd_chunk_mm_tc`` instance of one product kind with NT n-tiles per block;
    ``gate``: the instance for the output y with z (GATE: its epilogue's loads grouped);
    ``rows``: GB with the backward's per-step pass as its epilogue (ROWS, float32 x)."""
    types, flags = _mm_args(kind, io, bc)
    extra = ", false, true" if rows else (", true" if gate else "")
    return f"ssd_chunk_mm_tc<{types}, {flags}, {nt}{extra}>"


# The float32 backward's per-step pass (dx, x . (G B), dcum, dD's partial sums) as the
# epilogue of GB's product (ssd_chunk_mm_tc's ROWS) where a block holds whole rows; False:
# GB written, then ssd_bwd_rows. On: 2.8% off the float32 peer row's forward+backward on
# the H200 (6.47 -> 6.29 ms, benchmarks/results/ssd_gb_rows).
GB_ROWS = True


def uses_gb_rows(p, lay) -> bool:
    """Whether the float32 backward of ``p`` runs its per-step pass in GB's epilogue:
    float32 x on tensor cores and P within one block's columns (8 NT: P <= 128)."""
    return (GB_ROWS and lay.io == "float32" and uses_tc(lay.ct, "GB")
            and p.P <= 8 * TC_NT[-1])


# dB and dC summed over heads on tensor cores: the heads' weighted blocks summed per class of
# heads (ssd_chunk_hblocks_tc, once for both), then one product with C (or B) per class
# (ssd_chunk_hsum_tc). (U, Vv) roles, UPPER, ROWF (rows times dt') of ssd_chunk_hsum_tc.
HSUM_KINDS = {
    "dB": (("io", "bc"), True, True),    # U = x, Vv = C, M = dHx
    "dC": (("ct", "bc"), False, False),  # U = dY, Vv = B, M = states
}


def hblocks_name(io: str) -> str:
    """The ``ssd_chunk_hblocks_tc`` instance (dY in float, x in ``io``)."""
    return f"ssd_chunk_hblocks_tc<float, {_CTYPE[io]}>"


def hsum_name(kind: str, io: str, bc: str, nt: int) -> str:
    """The ``ssd_chunk_hsum_tc`` instance of dB or dC with NT n-tiles per block."""
    roles, upper, rowf = HSUM_KINDS[kind]
    tu, tv = (_CTYPE[{"io": io, "bc": bc, "ct": "float32"}[r]] for r in roles)
    return f"ssd_chunk_hsum_tc<{tu}, {tv}, {_cbool(upper, rowf)}, {nt}>"


def state_name(io: str, bc: str, adjoint: bool, *, nt: int = 0) -> str:
    """The chunk-state kernel: ``ssd_chunk_state`` or, with ``nt`` (NT), ``ssd_chunk_state_tc``;
    the adjoint form reads dY in the compute dtype."""
    ct = _COMPUTE[io]
    T = _CTYPE[ct] if adjoint else _CTYPE[io]
    adj = _cbool(adjoint)
    if nt:
        return f"ssd_chunk_state_tc<{T}, {_CTYPE[bc]}, {adj}, {nt}>"
    return f"ssd_chunk_state<{T}, {_CTYPE[bc]}, {_CTYPE[ct]}, {adj}>"


def kernel_names(io: str, bc: str, *, mm_kinds=tuple(MM_KINDS), vms=None) -> list:
    """Name expressions of the kernels for one dtype pair (every VM value by default)."""
    ct = _COMPUTE[io]
    T, TB, CT = _CTYPE[io], _CTYPE[bc], _CTYPE[ct]
    names = [f"ssd_chunk_cumsum<{CT}>", f"ssd_chunk_dt<{CT}>", f"ssd_state_passing<{CT}>",
             f"ssd_adjoint_passing<{CT}>",
             state_name(io, bc, False), state_name(io, bc, True),
             f"ssd_bwd_dt<{CT}>", f"ssd_sum_parts<{CT}, {CT}>", f"ssd_diag_cb<{TB}, {CT}>",
             f"ssd_chunk_cb<{TB}, {CT}>", f"ssd_bwd_rows<{T}, {CT}>", gate_name(io, False)]
    if TB != CT:  # dB, dC of the tensor-core backward, summed straight into B's dtype
        names.append(f"ssd_sum_parts<{CT}, {TB}>")
    if T != CT:  # the 16-bit backward's gate, from the forward's output before the gate
        names.append(gate_name(io, True))
    if ct == "float32":
        names += [state_name(io, bc, adj, nt=nt) for adj in (False, True) for nt in TC_NT]
    for kind in mm_kinds:
        names += [mm_name(kind, io, bc, vm) for vm in (vms or vm_values(ct))]
        if ct == "float32" and kind in TC_KINDS:  # the products on tensor cores
            names += [mm_tc_name(kind, io, bc, nt) for nt in TC_NT]
            if kind == "y":
                names += [mm_tc_name(kind, io, bc, nt, gate=True) for nt in TC_NT]
            if kind == "GB" and io == "float32":
                names += [mm_tc_name(kind, io, bc, nt, rows=True) for nt in TC_NT]
        if ct == "float32" and kind in HSUM_KINDS:  # summed over heads on tensor cores
            names += [hsum_name(kind, io, bc, nt) for nt in TC_NT]
    if ct == "float32":
        names.append(hblocks_name(io))
    return names


def mma_width(P: int) -> int:
    """PW of ``ssd_mma_chunk_out``: the smallest of MMA_WIDTHS that holds P columns."""
    return next(w for w in MMA_WIDTHS if w >= P)


def mma_out_name(io: str, P: int) -> str:
    """The ``ssd_mma_chunk_out`` instance for head dimension P: PW = mma_width(P) and the N
    slice KW = 128 (64 for PW = 128, to stay within 48 KiB of shared memory)."""
    pw = mma_width(P)
    return f"ssd_mma_chunk_out<{_CTYPE[io]}, {pw}, {128 if pw <= 64 else 64}>"


def mma_cb_name(io: str) -> str:
    """The ``ssd_mma_cb`` instance (N in slices of KW = 128)."""
    return f"ssd_mma_cb<{_CTYPE[io]}, 128>"


def head_classes(H: int, GB: int, GC: int) -> int:
    """Classes of heads that read the same B group and the same C group: runs of
    gcd(H / GB, H / GC) consecutive heads (one class for G = 1)."""
    return H // math.gcd(H // GB, H // GC)


def mma_state_width(N: int) -> int:
    """NW of ``ssd_mma_chunk_state``: the N columns of a block (64 or 128)."""
    return 64 if N <= 64 else 128


def mma_walk_name(io: str, nw: int | None = None) -> str:
    """The ``ssd_mma_state_walk`` instance (chunk states and their passing in one kernel)
    whose blocks own ``nw`` (default ``MMA_WALK_NW``) state columns n."""
    return f"ssd_mma_state_walk<{_CTYPE[io]}, {nw or MMA_WALK_NW}>"


def mma_fwd_name(io: str, N: int, keep: bool = False, walk: bool = False) -> str:
    """The ``ssd_mma_fwd`` instance (the whole forward in one walk) for state size N <= 128:
    NW = 64 (the state's columns in a warp) for N <= 64, else 128; with ``keep``, the one
    that also writes the output before the gate; with ``walk``, the form that a backward
    walk differentiates (its outputs before D and the gate in float32, per tile)."""
    flag = lambda v: "true" if v else "false"  # noqa: E731
    return f"ssd_mma_fwd<{_CTYPE[io]}, {mma_state_width(N)}, {flag(keep)}, {flag(walk)}>"


def mma_fwd_smem(N: int) -> int:
    """Dynamic shared memory of ``ssd_mma_fwd`` (``ssd_mma_fwd_layout<NW>::BYTES``): B (64 x
    (NW + 8) 16-bit values) and 132 floats in two stages, C, x and the weighted block
    (64 x 72) in one, and 132 floats (z, when given, is read from global memory)."""
    rows = 64 * 72 * 2
    b_bytes = 64 * (mma_state_width(N) + 8) * 2
    return 3 * b_bytes + 2 * 132 * 4 + 2 * rows + 132 * 4


def tf32_fwd_name(N: int, keep: bool = False) -> str:
    """The ``ssd_tf32_fwd`` instance (the float32 forward in one walk, 3 x TF32) for state
    size N <= 128: NW = 64 for N <= 64, else 128; with ``keep``, the one that also writes
    the outputs before D and the gate (KEEP_Y, for the backward)."""
    return f"ssd_tf32_fwd<{mma_state_width(N)}, {'true' if keep else 'false'}>"


def tf32_fwd_smem(N: int) -> int:
    """Dynamic shared memory of ``ssd_tf32_fwd`` (``ssd_tf32_fwd_layout<NW>::BYTES``), for
    tiles of 32 steps: B (32 x (NW + 4) floats), C B^T's block (32 x 36) and 72 values in two
    stages; C (32 x (NW + 8)), x (32 x 68), the weighted block (32 x 40) and 68 floats in one."""
    nw, ts = mma_state_width(N), 32
    floats = 2 * ts * (nw + 4) + 2 * ts * (ts + 4) + 2 * (2 * ts + 8)
    floats += ts * (nw + 8) + ts * 68 + ts * (ts + 8) + 2 * ts + 4
    return 4 * floats


def tf32_bwd_name(N: int) -> str:
    """The ``ssd_tf32_bwd`` instance (the float32 backward's adjoint walk, 3 x TF32) for
    state size N <= 128: NW = 64 for N <= 64, else 128."""
    return f"ssd_tf32_bwd<{mma_state_width(N)}>"


def mma_bwd_walk_name(io: str, N: int) -> str:
    """The ``ssd_mma_bwd`` instance (the 16-bit backward as one walk) for state size N <= 128."""
    return f"ssd_mma_bwd<{_CTYPE[io]}, {mma_state_width(N)}>"


def mma_bwd_walk_smem(N: int) -> int:
    """Dynamic shared memory of ``ssd_mma_bwd`` (``ssd_mma_bwd_layout<NW>::BYTES``): C (64 x
    (NW + 8) 16-bit values) and 132 floats in two stages, B, dY, x and the masked block (64 x
    72) in one, the decays and 1 / dt' (260 floats), the warps' two row sums of a tile (2 x 4 x 64) and
    its outputs before D from the yblob (64 x 64 floats)."""
    b_bytes = 64 * (mma_state_width(N) + 8) * 2
    return 3 * b_bytes + 2 * 132 * 4 + 3 * 64 * 72 * 2 + 260 * 4 + 2 * 4 * 64 * 4 + 4 * 8 * 128 * 4


def tf32_bwd_smem(N: int) -> int:
    """Dynamic shared memory of ``ssd_tf32_bwd`` (``ssd_tf32_bwd_layout<NW>::BYTES``): the
    forward's layout (C in B's place, B in C's, dY in x's) and the 4 warps' two row sums of
    a 32-step tile."""
    return tf32_fwd_smem(N) + 2 * 4 * 32 * 4


def mma_kernel_names(io: str) -> list:
    """Name expressions of the tensor-core kernels for 16-bit x, B, C of dtype ``io``."""
    return ([f"ssd_mma_chunk_state<{_CTYPE[io]}, {nw}, false>" for nw in (64, 128)]
            + [mma_out_name(io, pw) for pw in MMA_WIDTHS] + [mma_cb_name(io), mma_walk_name(io)]
            + [mma_fwd_name(io, n, keep) for n in (64, 128) for keep in (False, True)]
            + [mma_fwd_name(io, n, walk=True) for n in (64, 128)])


# Row tiles of a chunk that one block of ssd_mma_chunk_out walks in turn, without and with z:
# they share the block's set-up and, without z, the entering state's staging (with z the
# gate's rows take its buffer over).
MMA_OUT_TILES_PER_BLOCK = (4, 2)

# The tensor-core forward's chunk states and passing in one walk along the chunks
# (ssd_mma_state_walk); False: ssd_mma_chunk_state, then ssd_state_passing (to compare).
MMA_STATE_WALK = True
# The state columns n of a walk block: 64 (4 warps) or 128 (8 warps, x staged once for both
# halves); one block per 64 x MMA_WALK_NW tile of the state.
MMA_WALK_NW = 64


# The forward in one kernel (ssd_mma_fwd) where it applies (see uses_mma_fwd): "auto" where
# it is the faster (fused_faster), True wherever it applies, False never (the state walk,
# then the output kernel).
MMA_FUSED_FWD = "auto"
MMA_FWD_BLOCKS = 3  # SSD_MMA_FWD_BLOCKS: ssd_mma_fwd's register bound, in blocks per SM


def _address(a) -> int:
    return a.__array_interface__["data"][0] if isinstance(a, np.ndarray) else a.data.ptr


def fused_faster(blocks: int, per_sm: int, sms: int) -> bool:
    """Whether ``blocks`` blocks of ``ssd_mma_fwd``, ``per_sm`` of which fit a multiprocessor
    at once (3 on the H200), make it the faster forward on ``sms`` multiprocessors.
    Each block walks a whole row, so the kernel takes about one walk per wave of resident
    blocks, a last partial wave about 0.65 to 1 walk (the fewer its blocks, the less they
    share a multiprocessor); the two kernels' time grows with the work, about 0.69 walk per
    ``blocks / sms`` (their floor: the state walk's chain, about 0.6). Fitted to the 16
    shapes timed on the H200 in benchmarks/SSD.md (``ssd_fused_shapes.py``), it picks the
    faster kernel in 15 and is 4% off in the last."""
    waves = blocks / (per_sm * sms)
    whole = int(waves)
    last = waves - whole
    fused = whole + (0.65 + 0.35 * last if last > 0 else 0.0)
    two = max(0.6, 0.69 * blocks / sms)
    return fused < two


def uses_mma_fwd(p, out) -> bool:
    """Whether the tensor-core forward of problem ``p`` (``uses_mma``) runs as one kernel,
    ``ssd_mma_fwd``: without restarts (no ``seq_idx`` or ``cu_seqlens``), N <= 128, P and N
    multiples of 8, and x, B, C, z and ``out`` 16-byte aligned (its copies and stores move
    16 bytes); with ``MMA_FUSED_FWD = "auto"`` on a GPU, also where it is the faster
    (:func:`fused_faster`; on the host emulation wherever it applies)."""
    if not MMA_FUSED_FWD or p.seq_idx is not None or p.N > MMA_WIDTHS[-1] or (p.P | p.N) % 8:
        return False
    if not all(_address(a) % 16 == 0 for a in (p.x, p.B, p.C, p.z, out) if a is not None):
        return False
    if MMA_FUSED_FWD != "auto" or p.xp is np:
        return True
    lim = compiler.device_limits()
    smem = mma_fwd_smem(p.N) + 1024  # (1 KiB reserved per block)
    per_sm = min(MMA_FWD_BLOCKS, lim["smem_per_sm"] // smem)
    return fused_faster(_fwd_blocks(p), per_sm, lim["sm_count"])


# The float32 forward in one kernel (ssd_tf32_fwd): "auto" where it applies and is the faster
# (tf32_fused_faster), True wherever it applies, False never (the chunked kernels).
TF32_FUSED_FWD = "auto"


def _tf32_walk_fits(p) -> bool:
    """Whether problem ``p`` has what both float32 walks (``ssd_tf32_fwd``, ``ssd_tf32_bwd``)
    need: float32 x, B and C, no restarts (no ``seq_idx`` or ``cu_seqlens``), N <= 128, P
    and N multiples of 4, and heads that share their B and C groups (C B^T from
    ``ssd_chunk_cb``)."""
    io, bc = _arrays.dtype_name(p.io_dtype), _arrays.dtype_name(p.bc_dtype)
    return (io == bc == "float32" and p.seq_idx is None and p.N <= MMA_WIDTHS[-1]
            and (p.P | p.N) % 4 == 0 and head_classes(p.H, p.B.shape[2], p.C.shape[2]) < p.H)


def uses_tf32_fwd(p, out) -> bool:
    """Whether the float32 forward of problem ``p`` runs as one kernel, ``ssd_tf32_fwd``:
    float32 x, B and C on tensor cores (``uses_tc``), no restarts (no ``seq_idx`` or
    ``cu_seqlens``), N <= 128, P and N multiples of 4, x, B, C and ``out`` 16-byte aligned,
    and heads that share their B and C groups (C B^T from ``ssd_chunk_cb``); with
    ``TF32_FUSED_FWD = "auto"`` on a GPU, also where it is the faster
    (:func:`tf32_fused_faster`; on the host emulation wherever it applies)."""
    if not (TF32_FUSED_FWD and _tf32_walk_fits(p) and uses_tc("float32", "y")):
        return False
    if not all(_address(a) % 16 == 0 for a in (p.x, p.B, p.C, out)):
        return False
    if TF32_FUSED_FWD != "auto" or p.xp is np:
        return True
    return tf32_fused_faster(_fwd_blocks(p), compiler.device_limits()["sm_count"])


def tf32_fused_faster(blocks: int, sms: int) -> bool:
    """Whether ``blocks`` blocks of ``ssd_tf32_fwd`` make it the faster float32 forward on
    ``sms`` multiprocessors: from 0.6 blocks per multiprocessor up. A block walks its whole
    row, about 0.6 ms per 4096 steps on the H200 (N 128), while the chunked kernels take
    about 1.05 ms per 4096 steps and ``blocks / sms`` (0.26 ms at least). Fitted to the 13
    shapes timed on the H200 in benchmarks/SSD.md (``ssd_fused_shapes.py ... float32``):
    right in all 13 (24 blocks: chunked 0.26 ms against 0.59; 80 blocks: one kernel 0.63
    against 0.68)."""
    return 5 * blocks >= 3 * sms


# The float32 backward's adjoint chunk states, their walk and GB with its per-step pass as
# one backward walk (ssd_tf32_bwd): "auto" where it applies (uses_tf32_bwd) and is the
# faster (tf32_bwd_walk_faster), True wherever it applies, False never (the chunked kernels
# ssd_chunk_state_tc, ssd_adjoint_passing, ssd_chunk_mm_tc).
TF32_BWD_WALK = "auto"


def uses_tf32_bwd(p, lay, arrays) -> bool:
    """Whether the float32 backward of problem ``p`` takes its adjoint states, dx, x . (G B),
    dcum and dD's partials from one backward walk, ``ssd_tf32_bwd``: float32 x, B and C with
    the head-summed dB and dC on tensor cores, no restarts, N <= 128, P <= 64 (a block
    holds whole rows), P and N multiples of 4, heads that share their B and C groups, and
    ``arrays`` (x, B, C, dY, ycore) 16-byte aligned; with ``TF32_BWD_WALK = "auto"`` on a
    GPU, also where it is the faster (:func:`tf32_bwd_walk_faster`; on the host emulation
    wherever it applies)."""
    if not (TF32_BWD_WALK and _tf32_walk_fits(p) and p.P <= 64
            and uses_tc(lay.ct, "GB") and uses_tc(lay.ct, "hsum")):
        return False
    if not all(_address(a) % 16 == 0 for a in arrays):
        return False
    if TF32_BWD_WALK != "auto" or p.xp is np:
        return True
    return tf32_bwd_walk_faster(_fwd_blocks(p), compiler.device_limits()["sm_count"])


def tf32_bwd_walk_faster(blocks: int, sms: int) -> bool:
    """Whether ``blocks`` blocks of ``ssd_tf32_bwd`` (one per (batch row, head, 64 columns
    p), each walking its whole row) make the backward walk the faster float32 backward on
    ``sms`` multiprocessors: from one block per multiprocessor up. Forward+backward on the
    H200 (``ssd_fused_shapes.py 2 noz float32 bwd``, benchmarks/SSD.md), walk against
    chunked: 24 blocks 1.95 / 1.31 ms, 80 blocks 2.51 / 2.10, 160 blocks 3.12 / 3.48, 320
    blocks 5.01 / 6.14; the one exception below, 8 blocks at N 64 (1.13 / 1.30), keeps the
    chunked backward it had."""
    return blocks >= sms


def _fwd_blocks(p) -> int:
    """``ssd_mma_fwd``'s grid: a block per (batch row, head, 64 columns p)."""
    return p.batch * p.H * -(-p.P // 64)


def uses_mma(p) -> bool:
    """Whether the forward of problem ``p`` runs on the tensor-core kernels: 16-bit x with B
    and C in the same dtype, P <= 128, and ``SSMKIT_SSD_MMA`` not set to ``0``."""
    io, bc = _arrays.dtype_name(p.io_dtype), _arrays.dtype_name(p.bc_dtype)
    return (io in ("float16", "bfloat16") and bc == io and p.P <= MMA_WIDTHS[-1]
            and os.environ.get("SSMKIT_SSD_MMA", "1") != "0")


# The backward's chunk products on tensor cores (ssd_mma_chunk_mm): UPPER, DTW, MT, HSUM
# (summed over each group's heads) per kind.
MMA_BWD_KINDS = {
    "ycore": (False, 1, False, False),  # U = C, W = B, Vv = x, M = states
    "GB": (True, 2, False, False),      # U = B, W = C, Vv = dY, M = dHx; times dt' (row)
    "dB": (True, 0, True, True),        # U = x, W = dY, Vv = C, M = dHx^T
    "dC": (False, 1, True, True),       # U = dY, W = x, Vv = B, M = states^T
}


# The products whose epilogue can take the per-step element-wise work (FUSE of
# ssd_mma_chunk_mm): ycore the part before the other products, GB the part after them.
MMA_FUSE = {"ycore": 1, "GB": 2}


def mma_mm_name(kind: str, io: str, V: int, fused: bool = False) -> str:
    """The ``ssd_mma_chunk_mm`` instance of a backward product with V output columns:
    VW = mma_width(V), the K slice KW = 128 (64 for VW = 128, to stay within 48 KiB);
    ``fused``: with the per-step work in its epilogue (``MMA_FUSE``, ycore and GB only)."""
    vw = mma_width(V)
    upper, dtw, mt, hsum = MMA_BWD_KINDS[kind]
    flags = f"{_cbool(upper)}, {dtw}, {_cbool(mt, hsum)}"
    fuse = MMA_FUSE[kind] if fused else 0
    return f"ssd_mma_chunk_mm<{_CTYPE[io]}, {flags}, {vw}, {128 if vw <= 64 else 64}, {fuse}>"


def mma_dc_name(io: str, keep: bool = False, dcum: bool = False) -> str:
    """The ``ssd_mma_chunk_dc`` instance (dC summed over heads, the heads' blocks summed first;
    ``keep``: those sums also written for dB, see :data:`MMA_SHARED_BLOCKS`; ``dcum``: the
    rows' first half of dcum too, see :data:`MMA_DC_DCUM`)."""
    return f"ssd_mma_chunk_dc<{_CTYPE[io]}, {_cbool(keep, dcum)}>"


def mma_db_name(io: str, shared: bool = False) -> str:
    """The ``ssd_mma_chunk_db`` instance (dB summed over heads, the heads' blocks summed first;
    ``shared``: those sums read from dC's, see :data:`MMA_SHARED_BLOCKS`)."""
    return f"ssd_mma_chunk_db<{_CTYPE[io]}, {_cbool(shared)}>"


def mma_bwd_kernel_names(io: str) -> list:
    """Name expressions of the backward's tensor-core kernels for 16-bit inputs of dtype ``io``:
    the four chunk products at every width (ycore and GB also with the per-step work
    fused), the adjoint chunk state at both widths NW, and the two passes of the per-step
    element-wise work."""
    return ([mma_mm_name(kind, io, vw) for kind in MMA_BWD_KINDS for vw in MMA_WIDTHS]
            + [mma_mm_name(kind, io, vw, fused=True) for kind in MMA_FUSE for vw in MMA_WIDTHS]
            + [f"ssd_mma_chunk_state<{_CTYPE[io]}, {nw}, true>" for nw in (64, 128)]
            + [f"ssd_mma_bwd_rows<{_CTYPE[io]}, {final}>" for final in ("false", "true")]
            + [mma_dc_name(io), mma_db_name(io)]
            + [mma_dc_name(io, keep=True), mma_dc_name(io, keep=True, dcum=True),
               mma_db_name(io, shared=True)]
            + [mma_bwd_walk_name(io, n) for n in (64, 128)])


# dB and dC stage the next head's operands while one computes (ssd_mma_heads_ahead), in
# MMA_AHEAD_BYTES of dynamic shared memory, where P <= 64 (one K slice); False: the loop that
# stages, lands and computes one head at a time (SSD.md).
MMA_HEADS_AHEAD = True
MMA_AHEAD_BYTES = (64 * (64 + 8) + 64 * (128 + 8)) * 2  # SSD_MMA_AHEAD_BYTES
MMA_DB_B_BYTES = 64 * (128 + 8) * 2  # SSD_MMA_DB_B_BYTES: dB's rows of B, before those
MMA_DC_PRE_BYTES = 2 * 5 * 64 * 4  # SSD_MMA_DC_PRE_BYTES: dC's fetched row values, before those


# dB takes the heads' summed masked blocks from dC (which writes them, gs) instead of making
# them again: dB's block entry (s, t) is dC's (t, s). Then dB no longer makes each head's
# block, so the per-head x_s . (G B)_s comes from GB's epilogue (a division by dt'_s, which
# is why this path needs dt_softplus: there dt'_s = 0 only where its derivative is 0).
# Needs B and C in the same groups and the per-step work fused; False: dB makes its own
# blocks (to compare).
MMA_SHARED_BLOCKS = True


# Without z, ycore's only output on the fused path is dcum's first half (its rows dotted with
# dY). dC, which makes each head's dY_t . x_s blocks anyway, then also takes those row dots
# with ycore's block entries (the same roundings) and with its boundary terms, and ycore is
# not run. Needs the shared blocks' conditions; False: ycore runs (to compare).
MMA_DC_DCUM = True


def _dc_dcum(p, shared):
    """Whether dC gives dcum's first half instead of ycore (see :data:`MMA_DC_DCUM`)."""
    return MMA_DC_DCUM and shared and p.z is None


def _shared_blocks(p, fused):
    """Whether dB reads dC's summed blocks (see :data:`MMA_SHARED_BLOCKS`)."""
    return (MMA_SHARED_BLOCKS and fused and p.dt_softplus
            and p.B.shape[2] == p.C.shape[2])


def _ahead_smem(p):
    """Dynamic shared memory for dB and dC's staging ahead, 0 where they stage one head at a
    time."""
    return MMA_AHEAD_BYTES if MMA_HEADS_AHEAD and p.P <= 64 else 0


# The backward's adjoint chunk sums on tensor cores (ssd_mma_chunk_state<T, NW, true>) on
# the tensor-core path; False: the CUDA-core ssd_chunk_state on float32 dY (to compare).
MMA_ADJOINT_STATE = True

# The per-step element-wise work in the epilogues of ycore and GB (FUSE of
# ssd_mma_chunk_mm), so that their float32 (batch, L, H, P) rows never go to memory; False:
# the products write them and ssd_mma_bwd_rows reads them back (to compare).
MMA_ROWS_FUSED = True

# Blocks a 16-bit head-summing product (dB, dC) aims for: about two waves of an H200 (132
# SMs, 2 blocks each), in runs of many heads. Since dB reads dC's summed blocks, fewer and
# longer runs win (fewer partials, one product with B or C per run): forward+backward at
# the peer bfloat16 shape 2.72-2.73 ms at 512 against 2.82 (256), 2.77-2.78 (1024),
# 2.88-2.93 (2048) and 3.11-3.12 (4096), two alternating rounds
# (benchmarks/results/ssd_sum_blocks/).
MMA_SUM_BLOCKS = 512
# The same for the float32 head sums (ssd_chunk_hblocks_tc, ssd_chunk_hsum_tc): 2048
# (forward+backward 10.29-10.30 ms against 10.34-10.35 at 1024 and 10.42-10.46 at 4096).
TC_SUM_BLOCKS = 2048
# The float32 backward's adjoint chain (adjoint chunk states, then their walk) on a second
# stream, the summed blocks and dC (which need no dHx) beside it on the caller's; False: one
# stream (GB, then dB and dC). Float32 peer row forward+backward 6.12-6.16 against
# 6.19-6.23 ms on one stream, three alternating rounds (ab_ssd_switch.py TC_STREAMS 3
# True,False 1; results/ssd_streams). test_float32_backward_streams runs both.
TC_STREAMS = True

# The backward's adjoint chunk states and passing (the passing is latency-bound) run on a
# second stream beside ycore (without z) and dC, which do not need them. Forward+backward at
# the peer bfloat16 shape: 4.20-4.30 against 4.28-4.35 ms on one stream, three alternating
# rounds (benchmarks/ab_ssd_switch.py MMA_STREAMS). The forward's C B^T beside the state walk
# measured no gain (0.739-0.805 against 0.731-0.790 ms) and stays on one stream. False:
# everything on the caller's stream, in the same order (to compare).
MMA_STREAMS = True


def head_splits(blocks_per_split: int, heads_per_out: int, target: int | None = None) -> int:
    """How many runs of consecutive heads (partial sums) a head-summing product uses: about
    ``target`` blocks in all (default MMA_SUM_BLOCKS), at most one run per head, and no run
    empty."""
    target = MMA_SUM_BLOCKS if target is None else target
    want = min(heads_per_out, max(1, -(-target // max(blocks_per_split, 1))))
    per_run = -(-heads_per_out // want)
    return -(-heads_per_out // per_run)


def uses_mma_bwd(p) -> bool:
    """Whether the backward of problem ``p`` runs its chunk products on tensor cores:
    ``SSMKIT_SSD_MMA_BWD`` not set to ``0``, 16-bit x with B and C in
    the same dtype, P <= 128 and N <= 128. Every option (D, z, seq_idx, cu_seqlens, initial
    and final states) is supported: they act outside the products or through the chunk
    boundaries and restart mask the kernels share with the CUDA-core ones."""
    io, bc = _arrays.dtype_name(p.io_dtype), _arrays.dtype_name(p.bc_dtype)
    return (os.environ.get("SSMKIT_SSD_MMA_BWD", "1") != "0" and io in ("float16", "bfloat16")
            and bc == io and max(p.P, p.N) <= MMA_WIDTHS[-1])


# The 16-bit backward as one walk (ssd_mma_bwd, from the VJP's forward in its WALK form):
# "auto" where it applies (uses_mma_bwd_walk) and is the faster, chunks of at least
# MMA_BWD_WALK_MIN_CHUNK steps; True wherever it applies; False never (the chunked
# tensor-core backward). ssd's forward is the plain form either way (the WALK form's outputs
# are the same bits). bfloat16 forward+backward on the H200, walk / chunked
# (benchmarks/ssd_walk_shapes.py, benchmarks/SSD.md): 0.82-0.97 at chunks of 256 over ten
# grids, 1.008 at 128 and 1.020 at 64 (more chunk ends per tile of 64 steps).
MMA_BWD_WALK = "auto"
MMA_BWD_WALK_MIN_CHUNK = 256


def uses_mma_bwd_walk(p, out) -> bool:
    """Whether the backward of problem ``p`` runs as one walk (``ssd_mma_bwd``), the VJP's
    forward then the WALK form of ``ssd_mma_fwd``: where the one-kernel forward runs
    (:func:`uses_mma_fwd`; ``out`` its output), without z (the walk reads the forward's
    outputs before D), P <= 64 (a block holds whole rows), dt_softplus and B and C in equal
    groups (dB reads dC's summed blocks, :func:`_shared_blocks`), and ``MMA_BWD_WALK`` (with
    "auto", chunks of at least ``MMA_BWD_WALK_MIN_CHUNK`` steps)."""
    if MMA_BWD_WALK == "auto" and p.chunk_size < MMA_BWD_WALK_MIN_CHUNK:
        return False
    return (bool(MMA_BWD_WALK) and uses_mma_bwd(p) and p.z is None and p.P <= 64
            and _shared_blocks(p, True) and uses_mma_fwd(p, out))


# The module variant of ssd's allow_tf32: every 3 x TF32 product as one TF32 product
# (cuda_src/ssm_tf32.cuh). Only the kernels built on ssm_tf32.cuh are launched from it.
TF32_ONE_PASS = ("SSM_TF32_PASSES=1",)


def on_tf32_header(name: str) -> bool:
    """Whether kernel ``name`` is built on ssm_tf32.cuh (3 x TF32 products): ssd.cu's
    ``*_tc`` kernels and ssd_mma.cu's ``ssd_tf32_*`` walks, the kernels that
    ``TF32_ONE_PASS`` changes."""
    return "_tc<" in name or name.startswith("ssd_tf32_")


def _launch(name, grid, args, *, source=SOURCE_FILE, threads=THREADS, smem=0, defines=()):
    kernel = compiler.get_kernel(source, name, defines)
    if smem:
        compiler.ensure_dynamic_smem(kernel, (source, name, defines), smem)
    kernel(grid, (threads,), args, shared_mem=smem)


def _ptr(x):
    return _NULL if x is None else x


def _check(p):
    io, ct, bc = (_arrays.dtype_name(d) for d in (p.io_dtype, p.compute_dtype, p.bc_dtype))
    if (io, bc) not in DTYPE_PAIRS or _COMPUTE[io] != ct:
        raise TypeError(f"ssd (GPU): dtypes x {io}, B/C {bc}, compute {ct} are not a supported "
                        f"combination")
    # The kernels reinterpret raw memory: a dtype off here would read garbage.
    for name, arr, want in (("z", p.z, p.io_dtype), ("C", p.C, p.bc_dtype),
                            ("D", p.D, p.compute_dtype), ("dt", p.dt, p.compute_dtype),
                            ("initial_state", p.initial_state, p.compute_dtype)):
        if arr is not None and arr.dtype != want:
            raise TypeError(f"ssd (GPU): {name} has dtype {arr.dtype}, expected {np.dtype(want)}")
    if p.P > MAX_DIM or p.N > MAX_DIM:
        raise ValueError(f"ssd: on the GPU the head dimension P and the state size N must be at "
                         f"most {MAX_DIM}; got P = {p.P}, N = {p.N}")
    if p.H > 65535:
        raise ValueError(f"ssd: on the GPU the number of heads H must be at most 65535; got {p.H}")
    return io, bc, ct


def _device_id(xp) -> int:
    """The current device, for keys of the per-device caches (-1 for NumPy: the host
    emulation of the kernels)."""
    return xp.cuda.Device().id if xp is not np else -1


_BOUNDARY_CACHE: dict = {}
_BOUNDARY_CACHE_SIZE = 64


def _boundaries(p, Q):
    """Chunk boundaries and where the final states sit, as device arrays, cached per problem
    layout: a copy from host memory waits for the GPU's queue to drain, so building them per
    call would keep the host and the GPU from overlapping.

    Returns ``nc, max_len, starts, bslot, rows, cols, slots, last``: ``bslot[b, j]`` the
    final state that is the state at boundary j (or -1); final state ``slots[i]`` is the state
    at boundary ``cols[i]`` of row ``rows[i]``; ``last``: every row's one final state is its
    state at the last boundary, in slot = row (no packed sequences). The arrays are read-only.
    """
    cp = p.xp
    slots = p.slot_steps  # host (k, 3): row, step, slot of every sequence end
    device = _device_id(cp)
    key = (device, p.batch, p.L, Q, slots.tobytes())
    hit = _BOUNDARY_CACHE.get(key)
    if hit is not None:
        return hit
    starts = chunk_starts(p.L, Q, slots[:, 1] + 1 if len(slots) else None)
    nc = len(starts) - 1
    bslot = np.full((p.batch, nc + 1), -1, dtype=np.int32)
    if len(slots):  # (one search for every sequence end: a loop over them took 9 ms at 4096)
        bslot[slots[:, 0], np.searchsorted(starts, slots[:, 1] + 1)] = slots[:, 2]
    rows, cols = np.nonzero(bslot >= 0)
    last = bool((bslot[:, -1] == np.arange(p.batch)).all() and (bslot[:, :-1] < 0).all())
    hit = (nc, int(np.max(np.diff(starts))), cp.asarray(starts), cp.asarray(bslot),
           cp.asarray(rows), cp.asarray(cols), cp.asarray(bslot[rows, cols]), last)
    if len(_BOUNDARY_CACHE) >= _BOUNDARY_CACHE_SIZE:
        _BOUNDARY_CACHE.pop(next(iter(_BOUNDARY_CACHE)))
    _BOUNDARY_CACHE[key] = hit
    return hit


class _Layout:
    """Chunk boundaries and per-chunk values shared by the forward and the backward."""

    def __init__(self, p, *, factor=True):
        """``factor``: also d dt' / d dt (the backward's), else ``self.factor`` is None."""
        cp = p.xp
        self.io, self.bc, self.ct = _check(p)
        # the float32 tensor-core kernels' variant: one TF32 product each with allow_tf32
        self.tf32 = TF32_ONE_PASS if p.allow_tf32 and self.io == "float32" else ()
        L = p.L
        self.Q = min(kernel_chunk(p.chunk_size, self.io), L)
        (self.nc, self.max_len, self.starts, self.bslot, self.final_rows, self.final_cols,
         self.final_slots, last) = _boundaries(p, self.Q)
        # each row's final state is its state at the last boundary, in slot = row, and there
        # are no other slots: a strided copy gathers them, not an indexed gather and scatter
        self.final_is_last = last and p.n_slots == p.batch
        self.mma_tiles = -(-self.max_len // MMA_ROWS)  # tiles of 64 steps per chunk (ssd_mma.cu)
        self.mm_tiles = -(-self.max_len // tile_rows(self.ct))  # ssd_chunk_mm's row tiles
        # dt', d dt' / d dt (as effective_dt) and the chunk sums of dt' A, in one kernel
        cp, cd = p.xp, p.compute_dtype
        self.dte = cp.empty((p.batch, L, p.H), dtype=cd)
        self.factor = cp.empty_like(self.dte) if factor else None
        self.cum = cp.empty_like(self.dte)
        ct = np.float64 if self.ct == "float64" else np.float32
        # the per-chunk passes (ssd_chunk_dt, ssd_chunk_cumsum, ssd_bwd_dt): a block per
        # (row, chunk, 32 heads)
        self.chunk_grid = (p.batch * self.nc, -(-p.H // 32))
        _launch(f"ssd_chunk_dt<{_CTYPE[self.ct]}>", self.chunk_grid,
                (cp.ascontiguousarray(p.dt), _ptr(p.dt_bias), p.A, self.starts, self.dte,
                 _ptr(self.factor), self.cum, np.int64(L), np.int32(p.H), np.int64(self.nc),
                 np.int32(1 if p.dt_softplus else 0),
                 np.int32(1 if p.dt_clip else 0), ct(p.dt_lo), ct(p.dt_hi)),
                threads=CHUNK_THREADS)

    def chunk_sums(self, p, a, *, reverse):
        out = p.xp.empty_like(a)
        _launch(f"ssd_chunk_cumsum<{_CTYPE[self.ct]}>", self.chunk_grid,
                (p.xp.ascontiguousarray(a), out, self.starts, np.int64(p.L), np.int32(p.H),
                 np.int64(self.nc), np.int32(1 if reverse else 0)), threads=CHUNK_THREADS)
        return out

    def chunk_state(self, p, X, Y, adjoint):
        """Per chunk: sum over its steps of w_s X_s (outer) Y_s, (batch, nc, H, P, N)."""
        cp = p.xp
        nt = tc_nt(p.N) if uses_tc(self.ct, "state") else 0
        name = state_name(self.io, self.bc, adjoint, nt=nt)
        out = cp.empty((p.batch, self.nc, p.H, p.P, p.N), dtype=p.compute_dtype)
        R = tile_rows(self.ct)  # a block's tile: R x 2R of the P x N result (R x 8 NT on tc)
        NR = 8 * nt if nt else 2 * R
        grid = (p.batch * self.nc, p.H, -(-p.P // R) * -(-p.N // NR))
        _launch(name, grid, (X, Y, self.dte, self.cum, _ptr(p.seq_idx), self.starts, out,
                             np.int64(p.L), np.int32(p.H), np.int32(p.P), np.int32(Y.shape[2]),
                             np.int32(p.N), np.int64(self.nc)),
                threads=TC_THREADS if nt else THREADS, defines=self.tf32 if nt else ())
        return out

    def mm(self, p, kind, U, W, Vv, M, out, *, D=None, z=None, cb=None, rows=None):
        """One chunk product (see ssd_chunk_mm); writes ``out`` (batch, L, H, V). ``cb``:
        the chunks' C B^T blocks from :meth:`cb_cuda`, read in place of U W^T (kinds y,
        ycore: U = C, W = B; GB: U = B, W = C). ``rows`` (GB where :func:`uses_gb_rows`):
        the per-step pass in the epilogue instead, ``out`` then dx, ``D`` the skip (H, V) or
        None, and ``rows`` a dict of x and ycore (batch, L, H, V) read, xGB and dcum
        (batch, L, H) written, and dD_part ((batch H nc tiles, V), zeroed) or None."""
        V = Vv.shape[3]
        K = U.shape[3]
        tc = uses_tc(self.ct, kind)
        name = (mm_tc_name(kind, self.io, self.bc, tc_nt(V), gate=kind == "y" and z is not None,
                           rows=rows is not None) if tc
                else mm_name(kind, self.io, self.bc, column_groups(V, self.ct)))
        tiles = self.mm_tiles
        m_chunks = M.shape[1]
        classes = 1 if cb is None else cb.shape[2]
        v_blocks = -(-V // (8 * tc_nt(V))) if tc else 1
        r = rows or {}
        tail = ((_ptr(r.get("x")), _ptr(r.get("ycore")), _ptr(r.get("xGB")), _ptr(r.get("dcum")),
                 _ptr(r.get("dD_part"))) if tc else ())
        _launch(name, (p.batch * p.H * self.nc * tiles * v_blocks,),
                (U, W, Vv, M, _ptr(D), _ptr(z), self.dte, self.cum, _ptr(p.seq_idx), self.starts,
                 out, np.int64(p.L), np.int32(p.H), np.int32(U.shape[2]), np.int32(W.shape[2]),
                 np.int32(Vv.shape[2]), np.int32(K), np.int32(V), np.int64(self.nc),
                 np.int64(m_chunks), np.int32(tiles), _ptr(cb)) + tail + (np.int32(classes),),
                threads=TC_THREADS if tc else THREADS, defines=self.tf32 if tc else ())
        return out

    def hsum_blocks(self, p, dY):
        """The weighted blocks of dB and dC summed over each class of heads (see
        head_classes), (batch, nc, classes, pairs, R * R) float32, in ``cb_cuda``'s layout:
        ``ssd_chunk_hblocks_tc`` in runs of heads, the runs' partials summed in order."""
        cp = p.xp
        classes = head_classes(p.H, p.B.shape[2], p.C.shape[2])
        T, R = self.mm_tiles, tile_rows(self.ct)
        pairs = T * (T + 1) // 2  # the blocks on and below the diagonal
        blocks = p.batch * self.nc * classes * pairs
        runs = head_splits(blocks, p.H // classes, TC_SUM_BLOCKS)
        gs = cp.empty((runs, p.batch, self.nc, classes, pairs, R * R), dtype=np.float32)
        _launch(hblocks_name(self.io), (blocks * runs,),
                (dY, p.x, self.dte, self.cum, _ptr(p.seq_idx), self.starts, gs, np.int64(p.L),
                 np.int32(p.H), np.int32(p.P), np.int64(self.nc), np.int32(T),
                 np.int32(classes), np.int32(runs), np.int64(gs[0].size)), threads=TC_THREADS,
                defines=self.tf32)
        return _sum_runs(cp, gs)

    def hsum(self, p, kind, U, Vv, M, gs):
        """dB (``kind`` "dB": U = x, Vv = C, M = dHx) or dC ("dC": U = dY, Vv = B, M = states)
        summed over the heads of each group, (batch, L, G, N) float32, on tensor cores from
        the summed blocks ``gs`` (:meth:`hsum_blocks`): their product with Vv and the heads'
        boundary terms in runs of heads (``ssd_chunk_hsum_tc``), the runs' partials summed
        in order and the classes of each group added."""
        cp = p.xp
        G = (p.B if kind == "dB" else p.C).shape[2]
        classes = gs.shape[2]
        V, K, T = Vv.shape[3], U.shape[3], self.mm_tiles
        nt = tc_nt(V)
        v_blocks = -(-V // (8 * nt))
        blocks = p.batch * self.nc * T * classes * v_blocks
        runs = head_splits(blocks, p.H // classes, TC_SUM_BLOCKS)
        part = cp.empty((runs, p.batch, p.L, classes, V), dtype=np.float32)
        _launch(hsum_name(kind, self.io, self.bc, nt), (blocks * runs,),
                (U, Vv, M, gs, self.dte, self.cum, _ptr(p.seq_idx), self.starts, part,
                 np.int64(p.L), np.int32(p.H), np.int32(U.shape[2]), np.int32(Vv.shape[2]),
                 np.int32(K), np.int32(V), np.int64(self.nc), np.int64(M.shape[1]), np.int32(T),
                 np.int32(classes), np.int32(runs), np.int64(p.batch * p.L * classes * V)),
                threads=TC_THREADS, defines=self.tf32)
        out = _sum_runs(cp, part)
        if classes > G:  # the classes of each group are consecutive
            out = out.reshape(p.batch, p.L, G, classes // G, V).sum(axis=3)
        return out

    def cb_cuda(self, p):
        """C B^T of every chunk for ``ssd_chunk_mm``, once per class of heads (see
        head_classes): (batch, nc, classes, pairs, R * R) in the compute dtype, the R x R
        blocks on and below the diagonal (``ssd_chunk_cb``); None when every head has its
        own B and C group pair, so that nothing is shared (``ssd_chunk_mm`` then sums the
        blocks itself)."""
        GB, GC = p.B.shape[2], p.C.shape[2]
        classes = head_classes(p.H, GB, GC)
        if classes == p.H:
            return None
        R = tile_rows(self.ct)
        pairs = self.mm_tiles * (self.mm_tiles + 1) // 2  # blocks on and below the diagonal
        cb = p.xp.empty((p.batch, self.nc, classes, pairs, R * R), dtype=p.compute_dtype)
        _launch(f"ssd_chunk_cb<{_CTYPE[self.bc]}, {_CTYPE[self.ct]}>",
                (p.batch * self.nc * classes * pairs,),
                (p.C, p.B, self.starts, cb, np.int64(p.L), np.int32(GB), np.int32(GC),
                 np.int32(p.N), np.int64(self.nc), np.int32(classes), np.int32(pairs)))
        return cb

    def chunk_state_mma(self, p, X=None, Y=None, *, adjoint=False):
        """Per chunk on tensor cores, (batch, nc, H, P, N) float32: the forward chunk states
        (X = x, Y = B by default) or, with ``adjoint``, the adjoint chunk sums
        sum_t [seq_t == seq_prev] exp(cum_t) X_t Y_t^T (X = dY in 16 bits, Y = C)."""
        X = p.x if X is None else X
        Y = p.B if Y is None else Y
        out = p.xp.empty((p.batch, self.nc, p.H, p.P, p.N), dtype=p.compute_dtype)
        nw = mma_state_width(p.N)
        grid = (p.batch * self.nc, p.H, -(-p.P // 64) * -(-p.N // nw))
        name = f"ssd_mma_chunk_state<{_CTYPE[self.io]}, {nw}, {'true' if adjoint else 'false'}>"
        _launch(name, grid, (X, Y, self.dte, self.cum, _ptr(p.seq_idx), self.starts, out,
                       np.int64(p.L), np.int32(p.H), np.int32(p.P), np.int32(Y.shape[2]),
                       np.int32(p.N), np.int64(self.nc)),
                source=MMA_SOURCE_FILE, threads=MMA_THREADS)
        return out

    def state_walk_mma(self, p, *, final=None):
        """The forward's chunk states and their passing on tensor cores in one kernel
        (``ssd_mma_state_walk``): returns ``(states, entering)``, the float32 boundary states
        (batch, nc + 1, H, P, N) and the states entering each chunk rounded to the 16-bit
        input dtype (batch, nc, H, P, N), as :meth:`passing` of :meth:`chunk_state_mma`
        does. With ``final`` (n_slots, H, P, N), only the final states are kept, there, and
        ``states`` is None."""
        cp = p.xp
        states = None
        if final is None:
            states = cp.empty((p.batch, self.nc + 1, p.H, p.P, p.N), dtype=p.compute_dtype)
        entering = cp.empty((p.batch, self.nc, p.H, p.P, p.N), dtype=p.io_dtype)
        tiles = -(-p.P // 64) * -(-p.N // MMA_WALK_NW)
        _launch(mma_walk_name(self.io), (p.batch * p.H * tiles,),
                (p.x, p.B, self.dte, self.cum, _ptr(p.seq_idx), self.starts,
                 _ptr(p.initial_state), _ptr(states), entering, self.bslot, _ptr(final),
                 np.int64(p.L), np.int32(p.H), np.int32(p.P), np.int32(p.B.shape[2]),
                 np.int32(p.N), np.int64(self.nc)),
                source=MMA_SOURCE_FILE, threads=MMA_THREADS * MMA_WALK_NW // 64)
        return states, entering

    def walk_blob(self, p):
        """A buffer for the WALK forward's outputs before D and the gate (``ssd_mma_fwd``
        with ``yblob``): per block of the forward's grid and 64-step tile of its row, the 4
        warps' 16 x 64 accumulators as they lie (``ssd_mma_blob_at``), float32."""
        tiles = (self.nc - 1) * self.mma_tiles + -(-(p.L - (self.nc - 1) * self.Q) // MMA_ROWS)
        return p.xp.empty((_fwd_blocks(p), tiles, 4096), dtype=np.float32)

    def fwd_mma(self, p, out, *, final=None, ypre=None, walk=False, yblob=None):
        """The whole tensor-core forward in one kernel (``ssd_mma_fwd``; see
        :func:`uses_mma_fwd`): the outputs into ``out`` (batch, L, H, P) and, as
        :meth:`state_walk_mma`, returns ``(states, entering)``; with ``final``, only the
        final states are kept, there, and both are None. ``ypre`` (batch, L, H, P), if
        given, receives the outputs before the gate. ``walk`` selects the form that the
        backward walk differentiates (:func:`uses_mma_bwd_walk`): its outputs are the plain
        form's, bit for bit, and ``yblob`` (from :meth:`walk_blob`, required with it)
        receives its outputs before D and the gate with the state's rounding residuals in
        their product; neither with ``ypre``."""
        assert not walk or ypre is None
        assert (yblob is not None) == walk
        cp = p.xp
        states = entering = None
        if final is None:
            states = cp.empty((p.batch, self.nc + 1, p.H, p.P, p.N), dtype=p.compute_dtype)
            entering = cp.empty((p.batch, self.nc, p.H, p.P, p.N), dtype=p.io_dtype)
        _launch(mma_fwd_name(self.io, p.N, ypre is not None, walk), (_fwd_blocks(p),),
                (p.x, p.B, p.C, _ptr(p.D), _ptr(p.z), self.dte, self.cum, self.starts,
                 _ptr(p.initial_state), _ptr(states), _ptr(entering), self.bslot, _ptr(final),
                 out, _ptr(ypre), _ptr(yblob), np.int64(p.L), np.int32(p.H), np.int32(p.P),
                 np.int32(p.B.shape[2]), np.int32(p.C.shape[2]), np.int32(p.N), np.int64(self.nc)),
                source=MMA_SOURCE_FILE, threads=MMA_THREADS, smem=mma_fwd_smem(p.N))
        return states, entering

    def fwd_tf32(self, p, out, *, final=None, ycore=None):
        """The float32 forward in one kernel (``ssd_tf32_fwd``): the outputs into ``out``
        (batch, L, H, P); returns the boundary states (batch, nc + 1, H, P, N), or with
        ``final`` given None, only the final states kept, there. ``ycore`` (batch, L, H, P),
        if given, receives the outputs before D and the gate (the backward's ycore)."""
        cb = self.cb_cuda(p)  # (not None: uses_tf32_fwd)
        states = None
        if final is None:
            states = p.xp.empty((p.batch, self.nc + 1, p.H, p.P, p.N), dtype=p.compute_dtype)
        _launch(tf32_fwd_name(p.N, ycore is not None), (_fwd_blocks(p),),
                (p.x, p.B, p.C, cb, _ptr(p.D), _ptr(p.z), self.dte, self.cum, self.starts,
                 _ptr(p.initial_state), _ptr(states), self.bslot, _ptr(final), out, _ptr(ycore),
                 np.int64(p.L), np.int32(p.H), np.int32(p.P), np.int32(p.B.shape[2]),
                 np.int32(p.C.shape[2]), np.int32(p.N), np.int64(self.nc),
                 np.int32(self.mm_tiles), np.int32(cb.shape[2])),
                source=MMA_SOURCE_FILE, threads=MMA_THREADS, smem=tf32_fwd_smem(p.N),
                defines=self.tf32)
        return states

    def _bwd_walk_outputs(self, p, dhx_dtype):
        """The outputs of a backward walk (:meth:`bwd_tf32`, :meth:`bwd_mma`): ``(rows, dHx,
        dinit, end_dot)`` as they return them, dHx in ``dhx_dtype``."""
        cp, cd = p.xp, p.compute_dtype
        batch, L, H, P, N = p.batch, p.L, p.H, p.P, p.N
        rows = dict(dx=cp.empty(p.x.shape, dtype=p.io_dtype),
                    xGB=cp.empty((batch, L, H), dtype=cd), dcum=cp.empty((batch, L, H), dtype=cd),
                    dD_part=None if p.D is None else cp.empty((batch, H, P), dtype=cd))
        dHx = cp.empty((batch, self.nc, H, P, N), dtype=dhx_dtype)
        dinit = cp.empty((batch, H, P, N), dtype=cd)
        end_dot = cp.empty((batch, self.nc, H, 4 * -(-P // 64)), dtype=cd)
        return rows, dHx, dinit, end_dot

    def bwd_tf32(self, p, dY, ycore, states, dfinal, cb):
        """The float32 backward's walk (``ssd_tf32_bwd``), from dY and the forward's ycore and
        boundary states (batch, nc + 1, H, P, N). Returns ``(rows, dHx, dinit, end_dot)``:
        rows a dict of dx (batch, L, H, P), xGB and dcum (batch, L, H) and dD_part (batch,
        H, P; None without D), dHx (batch, nc, H, P, N) the adjoint leaving each chunk, dinit
        (batch, H, P, N), end_dot (batch, nc, H, 4) the warps' parts of <dHx[c],
        states[c + 1]>."""
        L, H, P, N = p.L, p.H, p.P, p.N
        rows, dHx, dinit, end_dot = self._bwd_walk_outputs(p, p.compute_dtype)
        _launch(tf32_bwd_name(N), (_fwd_blocks(p),),
                (dY, p.B, p.C, cb, p.x, ycore, _ptr(p.D), self.dte, self.cum, self.starts, states,
                 self.bslot, _ptr(dfinal), rows["dx"], rows["xGB"], rows["dcum"],
                 _ptr(rows["dD_part"]), dHx, dinit, end_dot, np.int64(L), np.int32(H),
                 np.int32(P), np.int32(p.B.shape[2]), np.int32(p.C.shape[2]), np.int32(N),
                 np.int64(self.nc), np.int32(self.mm_tiles), np.int32(cb.shape[2])),
                source=MMA_SOURCE_FILE, threads=MMA_THREADS, smem=tf32_bwd_smem(N),
                defines=self.tf32)
        return rows, dHx, dinit, end_dot

    def bwd_mma(self, p, dY, yblob, states, dfinal):
        """The 16-bit backward's walk (``ssd_mma_bwd``), from dY (the input dtype), the WALK
        forward's ``yblob`` and boundary states (batch, nc + 1, H, P, N). Returns ``(rows,
        dHx, dinit, end_dot)`` as :meth:`bwd_tf32`, dHx (batch, nc, H, P, N) in the input
        dtype (dB's operand)."""
        L, H, P, N = p.L, p.H, p.P, p.N
        rows, dHx, dinit, end_dot = self._bwd_walk_outputs(p, p.io_dtype)
        _launch(mma_bwd_walk_name(self.io, N), (_fwd_blocks(p),),
                (dY, p.B, p.C, p.x, yblob, _ptr(p.D), self.dte, self.cum, self.starts, states,
                 self.bslot, _ptr(dfinal), rows["dx"], rows["xGB"], rows["dcum"],
                 _ptr(rows["dD_part"]), dHx, dinit, end_dot, np.int64(L), np.int32(H),
                 np.int32(P), np.int32(p.B.shape[2]), np.int32(p.C.shape[2]), np.int32(N),
                 np.int64(self.nc)),
                source=MMA_SOURCE_FILE, threads=MMA_THREADS, smem=mma_bwd_walk_smem(N))
        return rows, dHx, dinit, end_dot

    def cb_mma(self, p, *, transposed=False):
        """C B^T of every chunk on tensor cores, once per class of heads (see head_classes):
        the lower-triangle 64 x 64 blocks, (batch, nc, classes, pairs, 4096) float32 in the
        order ``ssd_mma_chunk_out`` reads them. pairs = T (T + 1) / 2 for T = ceil(chunk /
        64): 10 blocks (160 KiB) per chunk and class at the default chunk of 256, growing
        with the square of the chunk size. With ``transposed``, returns ``(cb, cbt)``, cbt
        holding each block transposed (B C^T) in the same order, for the backward's upper
        products."""
        tiles = self.mma_tiles
        pairs = tiles * (tiles + 1) // 2
        GB, GC = p.B.shape[2], p.C.shape[2]
        classes = head_classes(p.H, GB, GC)
        shape = (p.batch, self.nc, classes, pairs, MMA_ROWS * MMA_ROWS)
        cb = p.xp.empty(shape, dtype=np.float32)
        cbt = p.xp.empty(shape, dtype=np.float32) if transposed else None
        _launch(mma_cb_name(self.io), (p.batch * self.nc * classes * pairs,),
                (p.C, p.B, self.starts, cb, _ptr(cbt), np.int64(p.L), np.int32(GB),
                 np.int32(GC), np.int32(p.N), np.int64(self.nc), np.int32(classes),
                 np.int32(pairs)),
                source=MMA_SOURCE_FILE, threads=MMA_THREADS)
        return (cb, cbt) if transposed else cb

    def out_mma(self, p, entering, out, cb=None):
        """The forward outputs on tensor cores (with D and gate) into ``out`` (batch, L, H, P),
        from the states entering the chunks in 16 bits (``passing(..., entering=True)``)
        and the chunks' C B^T blocks ``cb`` (made by :meth:`cb_mma` when not given)."""
        cb = self.cb_mma(p) if cb is None else cb
        per_block = (1 if mma_width(p.P) < 64  # (PW = 32: one tile per block)
                     else min(MMA_OUT_TILES_PER_BLOCK[p.z is not None], self.mma_tiles))
        _launch(mma_out_name(self.io, p.P),
                (p.batch * p.H * self.nc * -(-self.mma_tiles // per_block),),
                (p.C, cb, p.x, entering, _ptr(p.D), _ptr(p.z), self.dte, self.cum,
                 _ptr(p.seq_idx), self.starts, out, np.int64(p.L), np.int32(p.H), np.int32(p.P),
                 np.int32(p.C.shape[2]), np.int32(p.N), np.int64(self.nc), np.int32(self.mma_tiles),
                 np.int32(cb.shape[2]), np.int32(per_block)),
                source=MMA_SOURCE_FILE, threads=MMA_THREADS)
        return out

    def mm_mma(self, p, kind, U, W, Vv, M, *, with_diag=True, Xd=None, bnd=None, groups=None,
               dt_out=False, Xr=None, rowdot=None, cb=None, rows=None):
        """One backward chunk product on tensor cores (see ssd_mma_chunk_mm): 16-bit U, W, Vv
        and M (a boundary state or adjoint rounded to 16 bits); returns float32 (batch, L, H,
        V), or with ``groups`` = G the sums over the heads of each of G groups, (batch, L, G,
        V). ``with_diag=False`` leaves the block's
        diagonal terms (q = r) out; ``bnd`` (batch, L, H), when given, receives each row's
        boundary term dotted with ``Xd`` (batch, L, H, V); ``rowdot`` (batch, L, H) each row
        dotted with ``Xr`` (batch, L, XR, V) per head; ``dt_out`` scales each head's row t by
        dt'_t (after ``rowdot``). ``cb``, for U = C, W = B (ycore) or U = B, W = C (GB): the
        blocks of U W^T from :meth:`cb_mma` (its ``cbt`` for GB), read instead of computed
        per head. ``rows`` (ycore and GB): a dict of :func:`_fused_rows`'s arrays; the
        product then does the per-step work in its epilogue (see ``ssd_mma_rows_epilogue``)
        and returns None, its rows never stored."""
        V, K = Vv.shape[3], U.shape[3]
        if (groups is not None) != MMA_BWD_KINDS[kind][3]:
            raise ValueError(f"ssd (GPU): the {kind} product sums over heads only with groups")
        XO = p.H if groups is None else groups
        if rows is not None and (kind not in MMA_FUSE or cb is None):
            raise ValueError(f"ssd (GPU): the per-step work fuses into ycore and GB only, "
                             f"reading the C B^T blocks (cb); got {kind}, "
                             f"cb={cb is not None}")
        if rows is None:
            blocks, splits, part = self._head_runs(p, XO, V)
        else:  # the per-step work in the epilogue: one head per block, nothing stored
            blocks, splits, part = p.batch * XO * self.nc * self.mma_tiles, 1, None
        r = rows or {}
        _launch(mma_mm_name(kind, self.io, V, fused=rows is not None), (blocks * splits,),
                (U, W, Vv, M, self.dte, self.cum, _ptr(p.seq_idx), self.starts, _ptr(part),
                 _ptr(Xd), _ptr(bnd), _ptr(Xr), _ptr(rowdot), np.int64(p.L), np.int32(p.H),
                 np.int32(U.shape[2]), np.int32(W.shape[2]), np.int32(Vv.shape[2]), np.int32(K),
                 np.int32(V), np.int64(self.nc), np.int64(M.shape[1]), np.int32(self.mma_tiles),
                 np.int32(1 if with_diag else 0), np.int32(XO), np.int32(splits),
                 np.int64(p.batch * p.L * XO * V), np.int32(1 if Xr is None else Xr.shape[2]),
                 np.int32(1 if dt_out else 0), _ptr(cb),
                 *(_ptr(r.get(k)) for k in ("dy", "z", "x", "D", "cbd", "dY16", "dz", "dx",
                                            "dcum", "dD_part")),
                 np.int32(1 if cb is None else cb.shape[2])),
                source=MMA_SOURCE_FILE, threads=MMA_THREADS)
        return None if part is None else _sum_runs(p.xp, part)

    def _runs(self, p, groups):
        """A product over each of ``groups`` groups' heads (one head per group when groups
        = H), in runs: blocks per run and runs (head_splits)."""
        blocks = p.batch * groups * self.nc * self.mma_tiles
        return blocks, head_splits(blocks, p.H // groups)

    def _head_runs(self, p, groups, V):
        """The launch of :meth:`_runs` and the runs' partials (splits, batch, L, groups, V)
        in the compute dtype, for :func:`_sum_runs`."""
        blocks, splits = self._runs(p, groups)
        part = p.xp.empty((splits, p.batch, p.L, groups, V), dtype=p.compute_dtype)
        return blocks, splits, part

    def dc_mma(self, p, dY, states, gs=None, dcum=None, cbl=None):
        """dC summed over each C group's heads on tensor cores (``ssd_mma_chunk_dc``: the
        heads' masked blocks summed before the one product with B), (batch, L, GC, N) in C's
        dtype (the float32 sums of the heads' runs rounded once). ``gs`` (or None, see
        :meth:`shared_blocks`) receives each run's summed blocks. ``dcum`` (batch, L, H), with
        ``gs`` and ``cbl`` (:meth:`cb_mma`'s lower blocks), receives the first half of the
        chunk sums' cotangent, sum_p dY_p (ycore's rows)_p (see :data:`MMA_DC_DCUM`).
        Needs every C group's heads to read one B group (GC a multiple of GB)."""
        GB, GC = p.B.shape[2], p.C.shape[2]
        blocks, splits, part = self._head_runs(p, GC, p.N)
        with_dcum = dcum is not None
        if with_dcum and (gs is None or cbl is None):
            raise ValueError("ssd (GPU): dC gives dcum only with its blocks kept (gs) and cbl")
        _launch(mma_dc_name(self.io, gs is not None, with_dcum), (blocks * splits,),
                (dY, p.x, p.B, states, self.dte, self.cum, _ptr(p.seq_idx), self.starts, part,
                 np.int64(p.L), np.int32(p.H), np.int32(p.P), np.int32(GB), np.int32(GC),
                 np.int32(p.N), np.int64(self.nc), np.int32(self.mma_tiles), np.int32(splits),
                 np.int64(p.batch * p.L * GC * p.N), _ptr(gs), p.C, _ptr(cbl), _ptr(dcum),
                 np.int32(1 if cbl is None else cbl.shape[2])),
                source=MMA_SOURCE_FILE, threads=MMA_THREADS,
                smem=(MMA_DB_B_BYTES if with_dcum else 0)
                + (MMA_DC_PRE_BYTES + _ahead_smem(p) if _ahead_smem(p) else 0))
        return _sum_runs(p.xp, part, p.bc_dtype)

    def shared_blocks(self, p):
        """The buffer of dC's summed blocks for dB (float32, per run of heads and tile pair,
        64 x 64 each; see ssd_mma_chunk_dc's gs)."""
        G = p.C.shape[2]
        _, splits = self._runs(p, G)
        pairs = self.mma_tiles * (self.mma_tiles + 1) // 2
        return p.xp.empty((p.batch, G, splits, self.nc, pairs, 64, 64), dtype=np.float32)

    def db_mma(self, p, dY, dHx, cbt, rowdot, gs=None):
        """dB summed over each B group's heads on tensor cores (``ssd_mma_chunk_db``: the
        heads' masked blocks, times dt', summed before the one product with C), (batch, L,
        GB, N) in B's dtype (the float32 sums of the heads' runs rounded once); ``rowdot``
        (batch, L, H) receives each head's row dot with B before
        the dt' scaling (x_s . (G B)_s). ``cbt``: the transposed blocks of :meth:`cb_mma`.
        With ``gs`` (dC's summed blocks, :meth:`shared_blocks`; GB = GC) the blocks are read
        from there, and ``cbt`` and ``rowdot`` are unused (None).
        Needs every B group's heads to read one C group (GB a multiple of GC)."""
        GB, GC = p.B.shape[2], p.C.shape[2]
        blocks, splits, part = self._head_runs(p, GB, p.N)
        shared = gs is not None
        if shared and gs.shape[2] != splits:
            raise ValueError(f"ssd (GPU): dC's blocks come in {gs.shape[2]} runs, dB's in {splits}")
        _launch(mma_db_name(self.io, shared), (blocks * splits,),
                (p.x, dY, p.C, dHx, p.B, self.dte, self.cum, _ptr(p.seq_idx), self.starts,
                 _ptr(cbt), part, _ptr(rowdot), np.int64(p.L), np.int32(p.H), np.int32(p.P),
                 np.int32(GB), np.int32(GC), np.int32(p.N), np.int64(self.nc),
                 np.int32(self.mma_tiles), np.int32(splits), np.int64(p.batch * p.L * GB * p.N),
                 np.int32(1 if shared else cbt.shape[2]), _ptr(gs)),
                source=MMA_SOURCE_FILE, threads=MMA_THREADS,
                smem=(0 if shared else MMA_DB_B_BYTES) + _ahead_smem(p))
        return _sum_runs(p.xp, part, p.bc_dtype)

    def passing(self, p, chunk_states, *, entering=False, final=None):
        """The boundary states (batch, nc + 1, H, P, N); with ``entering``, also the states
        entering each chunk rounded to the 16-bit input dtype, (batch, nc, H, P, N), for
        :meth:`out_mma`. With ``final`` (n_slots, H, P, N), the boundary states are not
        kept: only the final states are written there (and None is returned for them)."""
        cp = p.xp
        states = None
        if final is None:
            states = cp.empty((p.batch, self.nc + 1, p.H, p.P, p.N), dtype=p.compute_dtype)
        ent = cp.empty((p.batch, self.nc, p.H, p.P, p.N), dtype=p.io_dtype) if entering else None
        PN = p.P * p.N
        _launch(f"ssd_state_passing<{_CTYPE[self.ct]}>", (p.batch * p.H, -(-PN // THREADS)),
                (chunk_states, self.cum, _ptr(p.seq_idx), self.starts, _ptr(p.initial_state),
                 _ptr(states), np.int64(p.L), np.int32(p.H), np.int64(PN), np.int64(self.nc),
                 _ptr(ent), np.int32(1 if self.io == "bfloat16" else 0), self.bslot,
                 _ptr(final)))
        return (states, ent) if entering else states


def ssd_forward(p, *, save_checkpoints, final_states=True):
    """Forward SSD on the GPU. See the backend contract in ``ssmkit._ssd``.

    ``final_states`` False (with ``save_checkpoints``): no final state is gathered from the
    checkpoints, and None is returned for them.

    ``checkpoints`` (with ``save_checkpoints``) is ``(states, entering, ypre)``: the
    (batch, n_chunks + 1, H, P, N) boundary states, the states entering each chunk in the
    16-bit input dtype (tensor-core forward) or None, and, with z where the one-kernel
    forward ran and the backward runs on tensor cores, the outputs before the gate (batch,
    L, H, P) in the input dtype; where the float32 forward ran as one kernel, the outputs
    before D and the gate in float32 (the CUDA-core backward's ycore); else None (the
    backward then recomputes them).
    """
    cp = p.xp
    lay = _Layout(p, factor=False)
    y = cp.empty(p.x.shape, dtype=p.io_dtype)
    entering = None
    if not (final_states or save_checkpoints):
        raise ValueError("ssd_forward: final_states=False needs save_checkpoints")
    # every final state is written below unless a sequence has no steps (then it stays 0)
    fill = cp.empty if lay.final_rows.size == p.n_slots else cp.zeros
    final = fill((p.n_slots, p.H, p.P, p.N), dtype=p.compute_dtype) if final_states else None
    if uses_mma(p):
        # without checkpoints only the final states are kept (the outputs read the entering
        # states in 16 bits), not the float32 state at every boundary
        keep = None if save_checkpoints else final
        if uses_mma_fwd(p, y):
            ypre = (cp.empty(p.x.shape, dtype=p.io_dtype)
                    if save_checkpoints and p.z is not None and uses_mma_bwd(p) else None)
            # the VJP's forward in the form the backward walk differentiates: the same outputs
            # (ssd and ssd_vjp return the same), and the outputs before D for the walk
            walk = save_checkpoints and uses_mma_bwd_walk(p, y)
            yblob = lay.walk_blob(p) if walk else None
            states, entering = lay.fwd_mma(p, y, final=keep, ypre=ypre, walk=walk, yblob=yblob)
            return y, *_forward_result(lay, final, states, entering, save_checkpoints, ypre,
                                       yblob)
        if MMA_STATE_WALK:
            states, entering = lay.state_walk_mma(p, final=keep)
        else:
            states, entering = lay.passing(p, lay.chunk_state_mma(p), entering=True, final=keep)
        lay.out_mma(p, entering, y)
    elif uses_tf32_fwd(p, y):
        # with checkpoints, the outputs before D and the gate too: the backward's ycore
        ycore = cp.empty(p.x.shape, dtype=p.compute_dtype) if save_checkpoints else None
        states = lay.fwd_tf32(p, y, final=None if save_checkpoints else final, ycore=ycore)
        return y, *_forward_result(lay, final, states, None, save_checkpoints, ycore)
    else:
        states = lay.passing(p, lay.chunk_state(p, p.x, p.B, adjoint=False))
        lay.mm(p, "y", p.C, p.B, p.x, states, y, D=p.D, z=p.z, cb=lay.cb_cuda(p))
    return y, *_forward_result(lay, final, states, entering, save_checkpoints)


def _forward_result(lay, final, states, entering, save_checkpoints, ypre=None, yblob=None):
    """``(final, checkpoints)`` of :func:`ssd_forward`: the final states gathered from the
    boundary states when those were kept; checkpoints are the boundary states and, from the
    tensor-core forward, the states entering each chunk in 16 bits (the tensor-core
    backward's operand), ``ypre`` (see :func:`ssd_forward`) and the WALK forward's
    ``yblob`` (:meth:`_Layout.walk_blob`; None where the backward is not one walk)."""
    if final is None:  # (none asked for)
        pass
    elif states is not None and lay.final_is_last:
        final[...] = states[:, lay.nc]
    elif states is not None and lay.final_rows.size:
        final[lay.final_slots] = states[lay.final_rows, lay.final_cols]
    return final, ((states, entering, ypre, yblob) if save_checkpoints else None)


def _sum_runs(xp, part, dtype=None):
    """The sum of a head-summing product's run partials (the first axis), in run order
    (``ssd_sum_parts``: one pass over the partials), in ``dtype`` (default: the partials')."""
    dtype = part.dtype if dtype is None else np.dtype(dtype)
    if part.shape[0] == 1:
        return part[0] if dtype == part.dtype else part[0].astype(dtype)
    out = xp.empty(part.shape[1:], dtype=dtype)
    n = out.size
    CT, OT = (_CTYPE[_arrays.dtype_name(d)] for d in (part.dtype, dtype))
    _launch(f"ssd_sum_parts<{CT}, {OT}>", (max(1, min(-(-n // THREADS), 4096)),),
            (part, out, np.int64(n), np.int32(part.shape[0])))
    return out


def _diag_cb(p, cd):
    """C_t . B_t for every head, (batch, L, H) in the compute dtype: the diagonal of each
    head's C B^T block (head h reads group h / (H / G) of B and of C); ``ssd_diag_cb``, once
    per class of heads that read the same groups (``head_classes``)."""
    out = p.xp.empty((p.batch, p.L, p.H), dtype=cd)
    rows = p.batch * p.L
    GB, GC = p.B.shape[2], p.C.shape[2]
    tb, ct = _CTYPE[_arrays.dtype_name(p.bc_dtype)], _CTYPE[_arrays.dtype_name(cd)]
    _launch(f"ssd_diag_cb<{tb}, {ct}>",
            (max(1, -(-rows // (THREADS // 32))),),
            (p.B, p.C, out, np.int64(rows), np.int32(p.H), np.int32(GB), np.int32(GC),
             np.int32(p.N), np.int32(head_classes(p.H, GB, GC))))
    return out


def _adjoint_passing(p, lay, K, dfinal, *, rounded=False, dot_with=None, dot_shift=0):
    """The adjoint leaving every chunk, dHx (batch, nc, H, P, N), and the initial state's;
    with ``rounded``, dHx rounded to the 16-bit input dtype (the tensor-core products'
    operand) in its place, the float32 dHx not written (None); with ``dot_with`` (the
    boundary states, (batch, nc + 1, H, P, N)), also <dHx[c], dot_with[c + dot_shift]> as
    per-warp partial sums (batch, nc, H, parts), which ``_bwd_dt`` adds up. Returns
    ``(dHx or None, dinit[, dHx16][, dot parts])``."""
    cp = p.xp
    batch, H, P, N = p.batch, p.H, p.P, p.N
    shape = (batch, lay.nc, H, P, N)
    dHx = None if rounded else cp.empty(shape, dtype=p.compute_dtype)
    dinit = cp.empty((batch, H, P, N), dtype=p.compute_dtype)
    dHx16 = cp.empty(shape, dtype=p.io_dtype) if rounded else None
    PN = P * N
    blocks = -(-PN // THREADS)
    part = (None if dot_with is None  # one partial per warp
            else cp.empty((batch, lay.nc, H, blocks * (THREADS // 32)), dtype=p.compute_dtype))
    _launch(f"ssd_adjoint_passing<{_CTYPE[lay.ct]}>", (batch * H, blocks),
            (K, lay.cum, _ptr(p.seq_idx), lay.starts, lay.bslot, _ptr(dfinal), _ptr(dHx), dinit,
             np.int64(p.L), np.int32(H), np.int64(PN), np.int64(lay.nc), _ptr(dHx16),
             np.int32(1 if lay.io == "bfloat16" else 0), _ptr(dot_with), np.int32(dot_shift),
             _ptr(part)))
    out = (dHx, dinit) + ((dHx16,) if rounded else ())
    return out + ((part,) if dot_with is not None else ())


ROW_STEPS = 64  # steps per block of ssd_mma_bwd_rows and ssd_bwd_rows
ROW_THREADS = 128  # SSD_ROW_THREADS of ssd_bwd_rows


def _rows(p, lay, dy, final, cb, yo, go=None):
    """ssd_mma_bwd_rows: before the products (``final`` False) dY rounded to the input dtype
    and dz; after them dx, dcum (without its boundary term) and the partial sums of dD."""
    cp = p.xp
    steps = p.batch * p.L
    blocks = -(-steps // ROW_STEPS)
    io, cd = p.io_dtype, p.compute_dtype
    out = {}
    if final:
        out["dx"] = cp.empty(p.x.shape, dtype=io)
        out["dcum"] = cp.empty((p.batch, p.L, p.H), dtype=cd)
        out["dD_part"] = None if p.D is None else cp.empty((blocks, p.H, p.P), dtype=cd)
    else:
        out["dY16"] = cp.empty(p.x.shape, dtype=io)
        out["dz"] = cp.empty(p.x.shape, dtype=io)
    _launch(f"ssd_mma_bwd_rows<{_CTYPE[lay.io]}, {'true' if final else 'false'}>",
            (blocks, p.H),
            (dy, _ptr(p.z), p.x, yo, _ptr(go), _ptr(p.D), lay.dte, cb, _ptr(out.get("dY16")),
             _ptr(out.get("dz")), _ptr(out.get("dx")), _ptr(out.get("dcum")),
             _ptr(out.get("dD_part")), np.int64(steps), np.int32(p.H), np.int32(p.P),
             np.int32(ROW_STEPS)), source=MMA_SOURCE_FILE, threads=MMA_THREADS)
    return out


def _fused_rows(p, lay, dy, cb):
    """The arrays of the per-step work fused into ycore's and GB's epilogues (``rows`` of
    :meth:`_Layout.mm_mma`): inputs dy, z, x, D, cbd (C_t . B_t); outputs dY16 and dz
    (with z only; ycore), dx, dcum (ycore's half, then GB's) and dD_part (GB's per-block
    column sums, (blocks, H, P), zero for the tiles past a chunk's end)."""
    cp = p.xp
    io, cd = p.io_dtype, p.compute_dtype
    gate = p.z is not None
    return dict(dy=dy, z=p.z, x=p.x, D=p.D, cbd=cb,
                dY16=cp.empty(p.x.shape, dtype=io) if gate else None,
                dz=cp.empty(p.x.shape, dtype=io) if gate else None,
                dx=cp.empty(p.x.shape, dtype=io),
                dcum=cp.empty((p.batch, p.L, p.H), dtype=cd),
                dD_part=None if p.D is None else cp.zeros(
                    (p.batch * lay.nc * lay.mma_tiles, p.H, p.P), dtype=cd))


def _backward_mma(p, lay, states, entering, dy, dfinal):
    """The backward's products on tensor cores (see the module docstring): returns dx, dz,
    dD, dB, dC, xGB (x_s . (G B)_s), dcum (without its boundary term), bnd (each step's
    boundary term dotted with x), dinit and end_dot (<dHx_c, H_c> per chunk, as per-warp
    partial sums (batch, nc, H, parts)).
    ``entering``: the states entering the chunks in the 16-bit input dtype (batch, nc, H, P,
    N), or None to round ``states`` here."""
    cp = p.xp
    cd = p.compute_dtype
    if entering is None:
        entering = states[:, :-1].astype(p.io_dtype)
    # The tensor-core products leave the diagonal terms (s = t) out of the blocks; they
    # are added in float32 where needed (they cancel exactly in dcum).
    cb = _diag_cb(p, cd)
    # C B^T once per chunk for all heads, read by ycore and (transposed) by GB
    cbl, cbt = lay.cb_mma(p, transposed=True)
    # dY = dy silu'(z) enters every product rounded to the input dtype (the adjoint chunk
    # sums too, where exp(cum_t) dY_t is then split into hi + lo 16-bit parts, so K is not
    # rounded further); without z it is dy itself.
    rows = _fused_rows(p, lay, dy, cb) if MMA_ROWS_FUSED else None

    def adjoint(dY16):  # the adjoint chunk states and their passing: dinit, dHx16, end_dot
        if MMA_ADJOINT_STATE:
            K = lay.chunk_state_mma(p, dY16, p.C, adjoint=True)
        else:  # the CUDA-core kernel on float32 dY (dy silu(z), not rounded)
            dY = dy.astype(cd)
            if p.z is not None:
                zc = p.z.astype(cd)
                dY *= zc / (1 + cp.exp(-zc))
            K = lay.chunk_state(p, cp.ascontiguousarray(dY), p.C, adjoint=True)
        return _adjoint_passing(p, lay, K, dfinal, rounded=True, dot_with=states)[1:]

    # The adjoint chain (its passing is latency-bound) runs on a second stream beside ycore
    # (without z, where dY16 is dy itself) and dC; GB and dB wait for it.
    streams = MMA_STREAMS and cp.__name__ == "cupy"  # (the host emulation runs on NumPy)
    side = None

    def start_adjoint(dY16):
        nonlocal side
        if not streams:
            return adjoint(dY16)
        side = fork(cp)
        with side:
            return adjoint(dY16)

    early = streams and p.z is None
    if early:
        adj = start_adjoint(dy)
    shared = _shared_blocks(p, rows is not None)
    dc_dcum = _dc_dcum(p, shared)  # then dC gives rows["dcum"], not ycore
    ycore_off = None if dc_dcum else lay.mm_mma(p, "ycore", p.C, p.B, p.x, entering,
                                                with_diag=False, cb=cbl, rows=rows)
    if rows is not None:
        dY16, dz = (dy, None) if p.z is None else (rows["dY16"], rows["dz"])
    elif p.z is not None:
        pre = _rows(p, lay, dy, False, cb, ycore_off)
        dY16, dz = pre["dY16"], pre["dz"]
    else:
        dY16, dz = dy, None
    if not early:  # after ycore, which made dY16
        adj = start_adjoint(dY16)
    # dC (summed over each group's heads) needs dY16 and the entering states only; with
    # shared blocks it leaves its heads' summed blocks to dB
    gs = lay.shared_blocks(p) if shared else None
    if dc_dcum:
        dC = lay.dc_mma(p, dY16, entering, gs, dcum=rows["dcum"], cbl=cbl)
    elif p.C.shape[2] % p.B.shape[2] == 0:  # each C group's heads read one B group
        dC = lay.dc_mma(p, dY16, entering, gs)
    else:
        dC = lay.mm_mma(p, "dC", dY16, p.x, p.B, entering, groups=p.C.shape[2])
    if side is not None:
        join(cp, side)
    dinit, dHx16, end_dot = adj
    # "GB" gives dt'_s (G B)_s, its block entries equal to the recomputed output's (see
    # ssd_mma_chunk_mm), so that the pairs of terms that cancel in dcum are rounded alike.
    bnd = cp.empty((p.batch, p.L, p.H), dtype=cd)
    xGB = cp.empty((p.batch, p.L, p.H), dtype=cd)
    # with shared blocks, x_s . (G B)_s from GB's epilogue (its rows divided by dt'_s)
    dtGB_off = lay.mm_mma(p, "GB", p.B, p.C, dY16, dHx16, with_diag=False, Xd=p.x, bnd=bnd,
                          cb=cbt, rows=rows, rowdot=None if gs is None else xGB)
    # dB and dC summed over each group's heads in the kernels (no per-head (batch, L, H, N)
    # arrays); dB scaled by dt' there, after its rows' dots with B (without shared blocks):
    # x_s . (G B)_s = B_s . (dB_s / dt'_s), the same sum with no division by dt'.
    if gs is not None:
        dB = lay.db_mma(p, dY16, dHx16, None, None, gs)
    elif p.B.shape[2] % p.C.shape[2] == 0:  # each B group's heads read one C group
        dB = lay.db_mma(p, dY16, dHx16, cbt, xGB)
    else:
        dB = lay.mm_mma(p, "dB", p.x, dY16, p.C, dHx16, groups=p.B.shape[2], dt_out=True,
                        Xr=p.B, rowdot=xGB)
    post = rows if rows is not None else _rows(p, lay, dy, True, cb, ycore_off, dtGB_off)
    dD = None if p.D is None else _sum_runs(cp, post["dD_part"])  # (in block order)
    return dict(dx=post["dx"], dz=dz, dD=dD, dB=dB, dC=dC, xGB=xGB, dcum=post["dcum"],
                bnd=bnd, dinit=dinit, end_dot=end_dot)


def _backward_walk(p, lay, states, entering, yblob, dy, dfinal):
    """The 16-bit backward as one walk (``ssd_mma_bwd``; see :func:`uses_mma_bwd_walk`):
    dx, xGB, dcum (without its boundary term), dD's partials, the adjoint states leaving each
    chunk (16-bit), dinit and end_dot from the walk; dC (summed over each group's heads,
    keeping its summed blocks) on a second stream beside it, and dB from those blocks and
    the walk's adjoint states. Returns them as :func:`_backward_mma` does."""
    cp = p.xp
    gs = lay.shared_blocks(p)
    side = fork(cp) if MMA_STREAMS and cp.__name__ == "cupy" else None
    with side or contextlib.nullcontext():
        dC = lay.dc_mma(p, dy, entering, gs)
    rows, dHx16, dinit, end_dot = lay.bwd_mma(p, dy, yblob, states, dfinal)
    if side is not None:
        join(cp, side)
    dB = lay.db_mma(p, dy, dHx16, None, None, gs)
    dD = None if p.D is None else _sum_runs(cp, rows["dD_part"])
    return dict(dx=rows["dx"], dD=dD, dB=dB, dC=dC, xGB=rows["xGB"], dcum=rows["dcum"],
                dinit=dinit, end_dot=end_dot)


def ssd_backward(p, checkpoints, dy, dfinal):
    """Gradients of every argument on the GPU. See the backend contract in ``ssmkit._ssd``."""
    cp = p.xp
    lay = _Layout(p)
    states, entering, ypre, yblob = checkpoints
    batch, L, H, N = p.batch, p.L, p.H, p.N
    cd = p.compute_dtype
    dte = lay.dte
    if yblob is not None:  # the forward was the WALK form: the backward as one walk
        g = _backward_walk(p, lay, states, entering, yblob, dy, dfinal)
        dx, dz, dD, dB, dC, dinit = g["dx"], None, g["dD"], g["dB"], g["dC"], g["dinit"]
        ddt, dA, ddt_sum = _bwd_dt(p, lay, g["dcum"], g["xGB"], g["end_dot"])
    elif uses_mma_bwd(p):
        if ypre is None:
            g = _backward_mma(p, lay, states, entering, dy, dfinal)
        else:  # the forward kept the output before the gate: the gate's backward first, in
            # one pass, then the rest as without z, from dY = dLoss/d(output before the gate)
            dz, dY16 = _bwd_gate(p, lay, dy, ypre, kept=True)
            g = _backward_mma(dataclasses.replace(p, z=None), lay, states, entering, dY16,
                              dfinal)
            g["dz"] = dz
        dx, dz, dD, dB, dC = g["dx"], g["dz"], g["dD"], g["dB"], g["dC"]
        xGB, dcum, dinit = g["xGB"], g["dcum"], g["dinit"]
        # boundary term <dHx_c, H_{c+1}> at each chunk's last step. H_{c+1} = d_c H_c + S_c,
        # and <dHx_c, S_c> is the sum over the chunk of bnd_s, the boundary part of
        # dt'_s x_s . (G B)_s that dcum_s holds: taken from the same values, the two cancel
        # in the suffix sums of _bwd_dt up to float32 sums.
        ddt, dA, ddt_sum = _bwd_dt(p, lay, dcum, xGB, g["end_dot"], decayed=True, bnd=g["bnd"])
    else:
        cbc = lay.cb_cuda(p)  # C B^T once per chunk and class of heads: ycore and GB
        # kept by the float32 forward in one kernel (no 16-bit entering states: not the
        # 16-bit one-kernel forward's ypre, which holds D and is in the input dtype)
        ycore = ypre if entering is None else None
        if ycore is None:
            ycore = lay.mm(p, "ycore", p.C, p.B, p.x, states, cp.empty(p.x.shape, dtype=cd),
                           cb=cbc)
        if p.z is not None:
            dz, dY = _bwd_gate(p, lay, dy, ycore)
        else:
            dz, dY = None, cp.ascontiguousarray(dy, dtype=cd)
        hsum_tc = uses_tc(lay.ct, "hsum")
        if uses_tf32_bwd(p, lay, (p.x, p.B, p.C, dY, ycore)):
            # one backward walk gives the adjoint states, dx and the per-step sums; the blocks
            # summed over heads and dC (which need none of it) on a second stream beside it
            # (the walk launched first measured the same: 4.86-4.89 ms either way)
            side = fork(cp) if TC_STREAMS and cp.__name__ == "cupy" else None
            with side or contextlib.nullcontext():
                gs = lay.hsum_blocks(p, dY)
                dC = lay.hsum(p, "dC", dY, p.B, states, gs)
            rows, dHx, dinit, end_dot = lay.bwd_tf32(p, dY, ycore, states, dfinal, cbc)
            if side is not None:
                join(cp, side)
        else:  # the chunked kernels
            def adjoint():  # the adjoint chunk states and their walk: dHx, dinit, end_dot
                K = lay.chunk_state(p, dY, p.C, adjoint=True)
                return _adjoint_passing(p, lay, K, dfinal, dot_with=states, dot_shift=1)

            if hsum_tc and TC_STREAMS:
                # the adjoint chain on a second stream, dC (which needs no dHx) beside it (the
                # host emulation, on NumPy, runs them in this order on no stream)
                side = fork(cp) if cp.__name__ == "cupy" else None
                with side or contextlib.nullcontext():
                    dHx, dinit, end_dot = adjoint()
                gs = lay.hsum_blocks(p, dY)
                dC = lay.hsum(p, "dC", dY, p.B, states, gs)
                if side is not None:
                    join(cp, side)
            else:
                dHx, dinit, end_dot = adjoint()
                gs = dC = None
            if uses_gb_rows(p, lay):  # GB's epilogue is the per-step pass: GB is never written
                rows = dict(x=p.x, ycore=ycore, xGB=cp.empty((batch, L, H), dtype=cd),
                            dcum=cp.empty((batch, L, H), dtype=cd),
                            dD_part=None if p.D is None else cp.zeros(
                                (batch, H, lay.nc * lay.mm_tiles, p.P), dtype=cd))
                rows["dx"] = lay.mm(p, "GB", p.B, p.C, dY, dHx,
                                    cp.empty(p.x.shape, dtype=p.io_dtype), D=p.D, cb=cbc,
                                    rows=rows)
                if p.D is not None:  # (batch, H, P): summed over the tiles in order
                    rows["dD_part"] = rows["dD_part"].sum(axis=2)
            else:
                GB = lay.mm(p, "GB", p.B, p.C, dY, dHx, cp.empty(p.x.shape, dtype=cd), cb=cbc)
                rows = _bwd_rows(p, lay, GB, dY, ycore)
        GBg, GCg = p.B.shape[2], p.C.shape[2]
        if hsum_tc:
            if gs is None:
                gs = lay.hsum_blocks(p, dY)
            dB = lay.hsum(p, "dB", p.x, p.C, dHx, gs)
            if dC is None:
                dC = lay.hsum(p, "dC", dY, p.B, states, gs)
        else:
            dBh = lay.mm(p, "dB", p.x, dY, p.C, dHx, cp.empty((batch, L, H, N), dtype=cd))
            dCh = lay.mm(p, "dC", dY, p.x, p.B, states, cp.empty((batch, L, H, N), dtype=cd))
            # the sums over each group's heads as batched products (one pass over dBh, dCh)
            dB = cp.matmul(dte.reshape(batch, L, GBg, 1, H // GBg),
                           dBh.reshape(batch, L, GBg, H // GBg, N)).reshape(batch, L, GBg, N)
            dC = cp.matmul(cp.ones(H // GCg, dtype=cd),
                           dCh.reshape(batch, L, GCg, H // GCg, N))
        dx = rows["dx"]
        dD = None if p.D is None else _sum_runs(cp, rows["dD_part"])  # (in block order)
        # boundary term <dHx_c, H_{c+1}> at each chunk's last step
        ddt, dA, ddt_sum = _bwd_dt(p, lay, rows["dcum"], rows["xGB"], end_dot)
    return dict(
        x=dx,
        dt=ddt,
        A=dA,
        B=dB,
        C=dC,
        D=dD,
        z=dz,
        dt_bias=None if p.dt_bias is None else ddt_sum,
        initial_state=None if p.initial_state is None else dinit,
    )


def _bwd_rows(p, lay, GB, dY, ycore):
    """The CUDA-core backward's per-step work in one pass (``ssd_bwd_rows``): dx (the input
    dtype), xGB = x . (G B) and dcum (without its boundary term) per (batch, L, H), and the
    per-block partial sums of dY x for dD (blocks, H, P), when there is a D."""
    cp = p.xp
    cd = p.compute_dtype
    steps = p.batch * p.L
    blocks = -(-steps // ROW_STEPS)
    out = dict(dx=cp.empty(p.x.shape, dtype=p.io_dtype),
               xGB=cp.empty((p.batch, p.L, p.H), dtype=cd),
               dcum=cp.empty((p.batch, p.L, p.H), dtype=cd),
               dD_part=None if p.D is None else cp.empty((blocks, p.H, p.P), dtype=cd))
    _launch(f"ssd_bwd_rows<{_CTYPE[lay.io]}, {_CTYPE[lay.ct]}>", (blocks, p.H),
            (p.x, GB, dY, ycore, lay.dte, _ptr(p.D), out["dx"], out["xGB"], out["dcum"],
             _ptr(out["dD_part"]), np.int64(steps), np.int32(p.H), np.int32(p.P),
             np.int32(ROW_STEPS)), threads=ROW_THREADS)
    return out


def _bwd_gate(p, lay, dy, ycore, *, kept=False):
    """dz (the input dtype) and dY = dLoss/d(output before the gate), both (batch, L, H, P),
    in one pass (``ssd_bwd_gate``): from dy, z, x and ycore (the recomputed output without
    D and gate, in the compute dtype), dY in the compute dtype; or, with ``kept``, from dy,
    z and the forward's output before the gate (``ycore``, the input dtype), dY in the
    input dtype (the tensor-core products' operand)."""
    cp = p.xp
    dz = cp.empty(p.x.shape, dtype=p.io_dtype)
    dY = cp.empty(p.x.shape, dtype=p.io_dtype if kept else p.compute_dtype)
    rows, hp = p.batch * p.L, p.H * p.P
    # blocks of THREADS columns, enough for several waves of the GPU; each block walks its
    # rows gridDim.x apart (and its columns gridDim.y * THREADS apart)
    grid = (min(rows, 8192), min(-(-hp // THREADS), 65535))
    _launch(gate_name(lay.io, kept), grid,
            (dy, p.z, p.x, ycore, _NULL if kept else _ptr(p.D), dz, dY, np.int64(rows),
             np.int64(hp)))
    return dz, dY


def _bwd_dt(p, lay, dcum, xGB, end_part, *, decayed=False, bnd=None):
    """ddt = (xGB + A sdcum) d dt' / d dt, with sdcum the chunk suffix sums of dcum plus
    each chunk's boundary term (at its last step), and the sums over (batch, L) of dte
    sdcum (dA) and of ddt (d dt_bias): one kernel (``ssd_bwd_dt``: partial sums per chunk)
    and their sums in a fixed order (``ssd_sum_parts``). The boundary term of a chunk: the
    sum of its ``end_part`` (batch, nc, H, parts), times the chunk's decay with ``decayed``,
    plus the chunk's sum of ``bnd`` (batch, L, H) where given."""
    cp = p.xp
    ddt = cp.empty_like(lay.dte)
    part = cp.empty((p.batch * lay.nc, 2, p.H), dtype=p.compute_dtype)
    _launch(f"ssd_bwd_dt<{_CTYPE[lay.ct]}>", lay.chunk_grid,
            (cp.ascontiguousarray(dcum), cp.ascontiguousarray(xGB), p.A, lay.dte, lay.factor,
             lay.starts, ddt, part, lay.cum if decayed else _NULL,
             _ptr(p.seq_idx) if decayed else _NULL, end_part, _ptr(bnd), np.int64(p.L),
             np.int32(p.H), np.int64(lay.nc), np.int32(end_part.shape[-1])),
            threads=CHUNK_THREADS)
    sums = _sum_runs(cp, part)  # (2, H): over (batch, chunk) in order
    return ddt, sums[0], sums[1]


def _compile(names):
    for source, name in names:
        compiler.get_kernel(source, name)
    return len(names)


def warmup(pairs=DTYPE_PAIRS, *, processes=None) -> int:
    """Compile every kernel instantiation for the given (x, B/C) dtype pairs ahead of use.

    The compiles run in parallel worker processes, which leave the binaries in
    CuPy's on-disk kernel cache; later first calls in any process load them from
    there instead of compiling. Returns the number of instantiations.
    """
    import concurrent.futures
    import multiprocessing

    names = [(SOURCE_FILE, n) for io, bc in pairs for n in kernel_names(io, bc)]
    names += [(MMA_SOURCE_FILE, n) for io, bc in pairs if io == bc and io in ("float16", "bfloat16")
              for n in mma_kernel_names(io) + mma_bwd_kernel_names(io)]
    names += [(MMA_SOURCE_FILE, tf32_fwd_name(n, keep)) for io, bc in pairs
              if io == bc == "float32" for n in (64, 128) for keep in (False, True)]
    names += [(MMA_SOURCE_FILE, tf32_bwd_name(n)) for io, bc in pairs
              if io == bc == "float32" for n in (64, 128)]
    names = list(dict.fromkeys(names))
    processes = processes or os.cpu_count() or 1
    batches = [names[i::processes] for i in range(processes)]
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=processes, mp_context=ctx) as pool:
        return sum(pool.map(_compile, [b for b in batches if b]))
