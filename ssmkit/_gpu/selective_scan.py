"""GPU backend of the Mamba-1 selective scan: the host side of ``cuda_src/selective_scan.cu``.

Implements the backend contract of :mod:`ssmkit._problem` for CuPy arrays::

    selective_scan_forward(p, *, save_checkpoints) -> (y, final_state, checkpoints)
    selective_scan_backward(p, checkpoints, dout, dfinal_state) -> dict

and, for packed sequences that restart in place in the ring kernels,
``restarts_in_place`` and the ``sequences`` arguments of both.

Each call launches one fused kernel (forward or backward), then, in the
backward, sums per-block partial gradients with CuPy reductions in a fixed
order (no atomics anywhere, so results repeat bit for bit). When
``batch * dim`` channels alone cannot fill the GPU, three kernels run instead
of one and time is split into
segments of whole chunks run by separate blocks: a summary kernel gives each
segment's end state (backward: its outgoing adjoint) from zero, a small carry
kernel chains them over the segments, and the main kernel then runs every
segment from its entering state (see "Time segments" in ``selective_scan.cu``
and :func:`plan_forward`). The backward of a large state (N > 32, enough channels) runs
as slices of 32 states (``TUNING["bwd_ring_max_n"]``), one ring backward each, adding
their parts of du, ddelta and dz (:func:`_backward_by_state_slices`).

Kernel instantiations are named by :class:`KernelKey`; :func:`kernel_keys`
lists every key this module can ask for and :func:`name_expression` spells a
key as the C++ template name that CuPy (at run time) and
:mod:`ssmkit._nvrtc_check` (in CI) hand to NVRTC. This module imports CuPy only
inside the functions that launch kernels.

Notes
-----
Work split (see the comments in ``selective_scan.cu``): a block owns one batch
row and ``CH`` consecutive channels of one B group and one C group; a thread
owns ``NPT`` states of one channel, ``NSPLIT`` consecutive lanes cover the
``N`` states of a channel (``NPT * NSPLIT >= N``). Time goes in tiles of ``TL``
steps staged in shared memory. The host picks ``NPT``/``NSPLIT`` from ``N``
(:func:`state_split`; the ring kernels: :func:`ring_split`, and the ring forward 8 states per
lane from N 17 where its grid is large, :func:`_fwd_ring_split`) and ``CH``/``TL`` (``CH`` a
power of two, or 24 and 48 in the 8-state forward's blocks of 384 threads) from the shapes
and the device's limits
(:func:`plan_forward`, :func:`plan_backward`), and with them the number of
time segments ``nseg`` (block index ``(seg * batch + b) * (dim / CH) + tile``).

Checkpoints: the state entering chunk ``i`` (steps ``i*chunk_size ...``) of row
``b``, channel ``d`` is ``checkpoints[i, b, d, :]``, an array of shape
``(n_chunks, batch, dim, N)`` in the compute dtype.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import math
import os

import numpy as np

from .. import _arrays
from .. import _selective_scan_packed as _packed
from . import compiler
from .streams import fork, join

__all__ = [
    "selective_scan_forward",
    "selective_scan_backward",
    "warmup",
    "KernelKey",
    "kernel_keys",
    "name_expression",
    "state_split",
    "plan_forward",
    "plan_backward",
    "plan_backward_ring",
    "MAX_N",
]

SOURCE_FILE = "selective_scan.cu"

#: Largest state size N the kernels take, per compute dtype: 16 states per
#: thread x 32 lanes in float32; in float64 at most 8 states per thread (more
#: would spill registers in the backward), so 8 x 32.
MAX_N = {"float32": 512, "float64": 256}

# numpy dtype name -> C++ storage type, and -> compute dtype name.
_CXX = {"float16": "ssm_half", "bfloat16": "ssm_bf16", "float32": "float", "float64": "double"}
_COMPUTE = {"float16": "float32", "bfloat16": "float32", "float32": "float32", "float64": "float64"}
_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}

# Kernel flags (enum in selective_scan.cu).
_HAS_D, _HAS_Z, _HAS_BIAS, _SOFTPLUS, _HAS_H0, _SAVE_CKPT, _HAS_DFINAL = 1, 2, 4, 8, 16, 32, 64
_CKPT_INSIDE = 128  # the ring forward's tiles run across chunks (plan_forward_ring's "inside")
_ACCUMULATE = 256  # the ring backward adds du, ddelta and dz into its outputs
_RING_BLOCK = 16  # steps of the ring scan's blocks (ssm_ring_block<4>)

# Launch bounds of the kernels (selective_scan.cu): the most threads per block,
# and the backward's minimum resident blocks of that size per SM (which caps its
# registers: 168 per thread in float, 255 in double).
FWD_MAX_THREADS = 256
RING_FWD_WIDE_THREADS = 512  # ssm_scan_fwd_ring_wide's launch bound (SSM_RING_FWD_WIDE_THREADS)
RING_FWD_WIDE_THREADS_NPT8 = 384  # ... at 8 states per lane (SSM_RING_FWD_WIDE_THREADS_NPT8)
BWD_MAX_THREADS = 128
# The ring backward (ssm_scan_bwd_ring): at most 128 threads, 3 resident blocks asked of ptxas
# (at most 168 registers), sub-blocks of 8 steps (SSM_BRING_SUB).
BWD_RING_MAX_THREADS = 128
_BWD_RING_REGS = 168
_BRING_SUB = 8
_BWD_MIN_BLOCKS = {"float32": 3, "float64": 2}
# Registers per thread of the forward kernel, roughly (ptxas reports), by
# (compute, NPT); only used to estimate how many blocks share an SM. The
# cp.async kernels' are capped by their launch bounds (ssm_fwd_min_blocks).
_FWD_REGS = {("float32", 4): 64, ("float32", 8): 80, ("float32", 16): 128,
             ("float64", 4): 80, ("float64", 8): 255}
_FWD_REGS_ASYNC = {**_FWD_REGS, ("float64", 4): 128}

# Launch-shape preferences (tunable; correctness does not depend on them).
TUNING = {
    # Measured on the H200 (benchmarks/results/tune_tiles_b98a48e.log): 256 threads beat 128 by
    # ~10% at L 32768, N 64 and batch 64, and lose 3% at batch 8, L 2048; bwd_tl 64 wins 3%.
    "fwd_threads": 256,  # most threads per block the planner tries (CH <= this / NSPLIT)
    # From this N on (None: never), the ring forward's main pass may take blocks of up to
    # RING_FWD_WIDE_THREADS (ssm_scan_fwd_ring_wide): one block of 16 warps per SM shares its B
    # and C tiles among twice the channels. H100, forward ms (benchmarks/NOTES.md, version 21):
    # float32 8x1536x2048 N 128 2.033 -> 1.692, N 64 0.804 -> 0.781, bfloat16 N 128 1.783 ->
    # 1.546; at N 16 (64x1536x256) 0.244 -> 0.265, so not there. SSMKIT_FWD_RING_WIDE_MIN_N
    # (read at import; 0: never) sets it.
    "fwd_ring_wide_min_n": int(os.environ.get("SSMKIT_FWD_RING_WIDE_MIN_N", "33")) or None,
    # From this N on (None: never; at least 9), the ring forward's main pass keeps 8 states
    # per lane instead of 4, on half the lanes: per state half the output's reduce-scatter and
    # of the {dt, dt u} loads, twice the independent chains per lane, half the warps (wide
    # blocks of up to RING_FWD_WIDE_THREADS_NPT8). SSMKIT_FWD_RING_NPT8_MIN_N (read at import;
    # 0: never) sets it.
    "fwd_ring_npt8_min_n": int(os.environ.get("SSMKIT_FWD_RING_NPT8_MIN_N", "17")) or None,
    # ... where the grid at 8 states per lane has at least this many warps per SM (resident at
    # most 12: their registers). H100 forward ms, 4 -> 8 states per lane: float32 8x1536x2048
    # N 32 0.421 -> 0.381 (11.6 warps per SM at 8), N 64 0.782 -> 0.696 (23), N 128 1.692 ->
    # 1.519 (46), 2x1536x8192 N 128 2.142 -> 1.513 (11.6); 2x1536x32768 N 64 3.817 -> 4.707
    # (5.8) (benchmarks/NOTES.md, version 23); 6x1536x2048 N 32 0.398 -> 0.379 (8.7),
    # 3x1536x2048 N 64 0.484 -> 0.418 (8.7), but 5x1536x2048 N 32 0.270 -> 0.295 (7.3),
    # 4x1536x2048 N 32 0.222 -> 0.292 (5.8), 1x1536x8192 N 128 1.699 -> 1.739 (5.8)
    # (version 24's runs): so from 8.
    "fwd_ring_npt8_min_warps": 8,
    # ... and in the forward's summary pass (with time split), on its own: its results are one
    # value per state. At N 16 (2 lanes a channel) 2-4% slower on the long rows, and not timed
    # at N > 16: off. SSMKIT_FWD_SUM_NPT8_MIN_N (0: never).
    "fwd_sum_npt8_min_n": int(os.environ.get("SSMKIT_FWD_SUM_NPT8_MIN_N", "0")) or None,
    # ... and in the ring backward's summary pass (N <= 16: 2 lanes a channel at N 9-16): 1-2%
    # slower on the long rows (H100). SSMKIT_BWD_SUM_NPT8_MIN_N (0: never).
    "bwd_sum_npt8_min_n": int(os.environ.get("SSMKIT_BWD_SUM_NPT8_MIN_N", "0")) or None,
    "fwd_tl": 64,        # longest time tile (steps)
    "bwd_threads": 128,  # 64: 16-21% slower at N = 64 and 128 (more per-block dB/dC partials)
    "bwd_tl": 64,
    "fwd_min_tl": 16,    # time tiles are not shortened below these to fit more blocks per SM
    "bwd_min_tl": 8,
    "balance_slack": 1.15,  # see _choose_tiles
    # True: the forward copies each next tile into a second shared buffer with cp.async while
    # the current one is scanned (kernels ssm_scan_fwd, ssm_scan_fwd_sum); False: the kernels
    # that stage straight from global memory (ssm_scan_fwd_direct, ..._sum_direct); "auto":
    # cp.async for 16-bit u/delta/z when time is not split into segments, where it measured
    # faster (bf16 8x1536x2048 N 16: 0.503 against 0.646 ms), direct staging otherwise (bf16
    # 2x1536x32768, split: 3.42 against 2.69 ms; float32: 1-2% slower), benchmarks/NOTES.md.
    # SSMKIT_FWD_ASYNC=1 / 0 in the environment (read at import) sets True / False.
    "fwd_async": {"1": True, "0": False}.get(os.environ.get("SSMKIT_FWD_ASYNC", ""), "auto"),
    # True: where they apply (float compute, B and C per step, N <= fwd_ring_max_n, rows 16-byte aligned and
    # L and the chunk multiples of _ring_quantum), the forward kernels that scan tiles from a
    # ring of two shared stages with all staging and output done per warp
    # (ssm_scan_fwd_ring, ssm_scan_fwd_sum_ring; benchmarks/NOTES.md, version 5: 0.65 -> 0.36
    # ms at 8x1536x2048 N 16 in float32); False: always the kernels above.
    # SSMKIT_FWD_RING=0 in the environment (read at import) sets False.
    "fwd_ring": os.environ.get("SSMKIT_FWD_RING", "1") != "0",
    # The largest N the ring forward takes (4 states per lane, up to 32 lanes per channel:
    # 16 to 128). With N > 16 it runs 32 / NSPLIT channels per warp (one from N = 65) where
    # ssm_scan_fwd runs 8 states per lane on 16 lanes. Forward ms against ssm_scan_fwd
    # on an H100 (benchmarks/NOTES.md, version 20): float32 8x1536x2048 N 32
    # 0.896 -> 0.417, N 64 0.912 -> 0.798, N 128 2.003 -> 2.017 (the one loss, 0.7%);
    # float32 2x1536x2048 N 128 0.899 -> 0.549. SSMKIT_FWD_RING_MAX_N in the environment
    # (read at import) sets it (16: the ring for N <= 16 only).
    "fwd_ring_max_n": int(os.environ.get("SSMKIT_FWD_RING_MAX_N", "128")),
    # True: where it applies (the ring forward's case, and at least a warp of channels per B/C
    # group), the backward through a ring of tiles with per-warp staging (ssm_scan_bwd_ring,
    # benchmarks/NOTES.md); False: always ssm_scan_bwd. SSMKIT_BWD_RING=0 in the environment
    # (read at import) sets False.
    "bwd_ring": os.environ.get("SSMKIT_BWD_RING", "1") != "0",
    # The largest N the ring backward takes in one pass (4 states per lane: 16 on up to 4
    # lanes a channel, 8 channels a warp; or 32, on up to 8 lanes, 4 channels a warp), and the
    # width of the state slices below. H100 forward+backward ms at float32 8x1536x2048, 16 (and
    # slices from N 65) -> 32 (slices from N 33): N 32 2.724 -> 2.614 (ssm_scan_bwd -> one ring
    # pass), N 64 5.285 -> 5.166 (ssm_scan_bwd -> 2 slices), N 128 11.349 -> 10.776 (8 slices
    # -> 4) (benchmarks/NOTES.md, version 24). SSMKIT_BWD_RING_MAX_N in the environment (read
    # at import) sets it.
    "bwd_ring_max_n": int(os.environ.get("SSMKIT_BWD_RING_MAX_N", "32")),
    # True: a split ring backward's summary pass through the ring forward's staging
    # (ssm_scan_bwd_sum_ring, tiles of the ring forward's plan); False: ssm_scan_bwd_sum.
    "bwd_sum_ring": True,
    # The backward of N >= this (B and C per step; None: never) as slices of bwd_ring_max_n
    # states, each through the ring backward, which adds its part of du, ddelta and dz into
    # the outputs (_backward_by_state_slices), instead of ssm_scan_bwd over all N states.
    # Slices of 16, forward+backward at float32 8x1536x2048 (benchmarks/NOTES.md, version
    # 19): N 128 14.59 -> 12.1 ms (checkpoints every 128 steps) or 10.95 (every 16); N 64 5.42
    # against 5.46 at best (every 16 steps), so from N 65 at that width. Slices of 32: N 64
    # 5.285 -> 5.166 (H100, version 24), so from N 33, the first past one pass
    # (SSMKIT_BWD_RING_MAX_N=16 brings back 65 with the width).
    "bwd_state_slices_from": 65 if os.environ.get("SSMKIT_BWD_RING_MAX_N") == "16" else 33,
    # ... and only where a slice's ring backward has at least this many warps per SM. One
    # lane at a time (H200, NOTES.md version 19): N 96 and 128 at 8x1536x2048 (11.6 warps per
    # SM) 12.89 -> 9.21 and 14.59 -> 11.89 ms; N 128 at 4x1536x2048 (5.8) 7.33 -> 9.14 and N
    # 256 at 2x1536x2048 (2.9) 12.79 -> 17.63, slower. In two lanes (H100, version 22):
    # float32 N 128 at 4x1536x2048 7.719 -> 7.352, bfloat16 8.046 -> 7.970; at 2x1536x2048
    # 4.100 -> 6.418, slower: so from 4.
    "bwd_state_slices_min_warps": 4,
    # Slices at a time: 2, odd slices on a second stream beside the even ones, each lane
    # adding into its own du, ddelta and dz (the second lane's summed into the first at the
    # end), so that two slices' grids share the GPU: float32 8x1536x2048 N 128 11.984 ->
    # 11.506 ms against 1 (one after another; H100, version 22).
    "bwd_state_slices_lanes": 2,
    # True: 16-bit u takes the slices too, on float32 copies of u, delta, z, B, C and dout
    # (the slices add du, ddelta and dz in float32), its gradients rounded to u's dtype at the
    # end; False: 16-bit u keeps ssm_scan_bwd.
    "bwd_state_slices_16bit": True,
    # From this N on (None: never), float32 u takes the slices below bwd_state_slices_from too
    # where they are fewer than ssm_scan_bwd's states rounded up to its lanes (state_split),
    # in 16s: N 40-48, 3 slices against 64 padded states. H100 forward+backward ms at float32
    # 8x1536x2048 (NOTES.md, version 22): N 48 5.134 -> 4.258, N 40 5.070 -> 4.540, but N 33
    # (a last slice of one state) 5.004 -> 5.116; at N 64 (4 against 4) 5.376 -> 5.649, and
    # 16-bit u (float32 copies) 5.258 -> 5.352 at N 48: not there.
    "bwd_state_slices_padded_from": 40,
    # The ring summary passes (ssm_scan_fwd_sum_ring, ssm_scan_bwd_sum_ring) split each time
    # segment into this many sub-segments (each a summary of its own, all joined by the
    # carry): more, shorter blocks, so that the last wave of resident blocks is less of the
    # pass; sub-segments are whole multiples of the ring quantum (else no split).
    # fwd_sum_tiles: the forward's summary picks its own tiles for its grid (as the
    # backward's does), not the main pass's. Measured together (benchmarks/NOTES.md, version
    # 17): 2x1536x32768 N 16 forward 1.556 -> 1.478 ms in bfloat16, 1.649 -> 1.614 in float32
    # (split 4); with fewer, longer segments (fwd_ring_seg_waves, bwd_min_seg_steps below)
    # 8 beat 4: forward 1.341 -> 1.291 and 1.535 -> 1.483, forward+backward 5.400 -> 5.377
    # and 5.772 -> 5.664.
    "sum_split": 8,
    "fwd_sum_tiles": True,
    # True: the ring forward's tiles (and its summaries') of 32 steps or more, shorter than
    # the chunk, in whole 16-step blocks (_choose_ring_tiles); False: any multiple of the ring
    # quantum that fits (to compare).
    "ring_whole_blocks": True,
    "bwd_ring_threads": 128,
    "bwd_ring_tl": 64,
    # Time segments (see _split_time): split when the grid fills less than
    # seg_min_fill of one wave of resident blocks, aiming at seg_waves waves;
    # segments are whole chunks and at least min_seg_steps long (each costs a
    # summary pass and a carry).
    "seg_min_fill": 0.75,
    "seg_waves": 2.0,
    # the ring forward's (its main pass and summary): fewer, longer segments measured faster
    # (2x1536x32768 N 16 forward at 1.0 against 2.0: 1.476 -> 1.340 ms in bfloat16, 1.613 ->
    # 1.535 in float32; benchmarks/NOTES.md, version 17)
    "fwd_ring_seg_waves": 1.0,
    "min_seg_steps": 1024,  # 256 measured slower at L = 2048 (4 segments: 0.82 ms vs 0.64)
    # The backward's: 4096 measured faster than 1024 at L = 32768, N = 16 (forward+backward
    # 14.8 -> 13.7 ms in bfloat16, 14.5 -> 13.5 in float32), the same at L = 2048 and 256;
    # with the ring backward and its summary in sub-segments, 8192 faster than 4096 (6.004 ->
    # 5.405 ms in bfloat16, 5.837 -> 5.789 in float32; benchmarks/NOTES.md, version 17).
    "bwd_min_seg_steps": 8192,
    "max_segments": 1024,
    "force_segments": None,  # tests: an int forces this many segments (clamped as above)
}

KernelKey = collections.namedtuple(
    "KernelKey", ["kind", "io", "bc", "npt", "nsplit", "b_per_step", "c_per_step"])
KernelKey.__doc__ = """One kernel instantiation.

kind : "fwd", "bwd", their time-segment summary passes "fwd_sum", "bwd_sum",
"fwd_direct", "fwd_sum_direct" (the forward kernels staging straight from
global memory instead of through cp.async copies: ``TUNING["fwd_async"]``
False), "fwd_ring", "fwd_sum_ring" (the forward through a ring of tiles:
``TUNING["fwd_ring"]``; float compute, per-step B and C, NPT 4; the summary also 8:
``TUNING["fwd_sum_npt8_min_n"]``), "fwd_ring_wide"
(the same forward in blocks of more than FWD_MAX_THREADS: ``TUNING["fwd_ring_wide_min_n"]``;
and every ring forward at 8 states per lane: ``TUNING["fwd_ring_npt8_min_n"]``),
"bwd_ring" (the backward through a ring of tiles: ``TUNING["bwd_ring"]``; the
same case), "bwd_sum_ring" (its summary pass, staged as the ring forward:
``TUNING["bwd_sum_ring"]``), or
"carry" (the segment carry) or "tile_sum" (the backward's sum of per-step
dB/dC partials), both templated on the compute type only (io = bc = the
compute dtype, npt = nsplit = 0, b/c_per_step False), or "seq_states" (packed
sequences' final states after an in-place forward; float compute, per-step B, npt = nsplit
= 0, b/c_per_step True); io, bc : numpy
dtype names of u/delta/z and of B/C; npt, nsplit : states per thread and lanes
per channel; b_per_step, c_per_step : whether B / C are given per step
(batch, G, N, L)."""

_SCAN_KINDS = ("fwd", "fwd_sum", "bwd", "bwd_sum", "fwd_direct", "fwd_sum_direct")
_RING_KINDS = ("fwd_ring", "fwd_ring_wide", "fwd_sum_ring", "bwd_ring", "bwd_sum_ring")
_SMALL_KINDS = ("carry", "tile_sum")  # templated on the compute type only
_SEQ_STATES = "seq_states"  # ssm_sequence_states, templated on u's and B's dtypes
# Registers per thread of the ring kernels (NVRTC 12 for sm_90: 104-105 at N = 16, 128 at
# NSPLIT 1), the most over their instantiations; only used to estimate how many blocks share
# an SM.
_RING_REGS = 128
# ... and of the ring forward at 8 states per lane (TUNING["fwd_ring_npt8_min_n"]: 144-158 at
# NSPLIT 8 and 16; its summary's are bounded to 128 as at 4).
_RING_REGS_NPT8 = 160


def _dtype_name(dt) -> str:
    name = _arrays.dtype_name(dt)
    if name not in _CXX:
        raise TypeError(f"ssmkit GPU selective_scan: unsupported dtype {name!r}; "
                        f"expected one of {sorted(_CXX)}")
    return name


def state_split(N: int, compute: str = "float32") -> tuple[int, int]:
    """States per thread ``NPT`` and lanes per channel ``NSPLIT`` for state size ``N``.

    ``NPT`` is 4 for N <= 16, 8 for N <= 128 (float64: up to 256) and 16 up to
    ``MAX_N[compute]``; ``NSPLIT`` is the smallest power of two with
    ``NPT * NSPLIT >= N`` (at most 32: the lanes of a channel share a warp).
    """
    limit = MAX_N[compute]
    if N < 0 or N > limit:
        raise NotImplementedError(
            f"ssmkit GPU selective_scan: state size N={N} is not supported on the GPU "
            f"in {compute} (at most {limit})")
    npt = 4 if N <= 16 else (8 if N <= 128 or compute == "float64" else 16)
    nsplit = 1
    while npt * nsplit < N:
        nsplit *= 2
    return npt, nsplit


def _bwd_substeps(compute: str, npt: int) -> int:
    """TS of the backward kernel (mirrors ``ssm_bwd_substeps`` in selective_scan.cu)."""
    budget = 8 if compute == "float64" else (32 if npt >= 8 else 16)
    return max(1, budget // npt)


def _dtype_pairs():
    for io in ("float16", "bfloat16", "float32", "float64"):
        for bc in dict.fromkeys((io, _COMPUTE[io])):
            yield io, bc


def kernel_keys(full: bool = True) -> list:
    """Kernel instantiations the GPU backend can ask for.

    Parameters
    ----------
    full : bool
        True: every one (the four scan kernels x 6 (io, bc) dtype pairs x
        every (NPT, NSPLIT) of :func:`state_split` x per-step/constant B and C,
        and the carry and tile-sum kernels per compute dtype). False: a smaller set in which
        every template-parameter value and every pair of (dtypes, split) and of
        (kernel, B/C form) still appears.

    Returns
    -------
    list of KernelKey
    """
    splits = {ct: sorted({state_split(n, ct) for n in range(MAX_N[ct] + 1)}) for ct in MAX_N}
    keys = [KernelKey(kind, ct, ct, 0, 0, False, False) for kind in _SMALL_KINDS for ct in MAX_N]
    for kind in _SCAN_KINDS:
        for io, bc in _dtype_pairs():
            for npt, nsplit in splits[_COMPUTE[io]]:
                for bv in (True, False):
                    for cv in (True, False):
                        keys.append(KernelKey(kind, io, bc, npt, nsplit, bv, cv))
    for kind in _RING_KINDS:
        for io, bc in _dtype_pairs():
            if _COMPUTE[io] == "float32":  # the forward's up to N = 128, the backward's N <= 32
                top = 129 if kind.startswith("fwd") else 33
                rsplits = {ring_split(n) for n in range(top)}
                if kind in ("fwd_ring_wide", "fwd_sum_ring", "bwd_sum_ring"):  # 8 states per lane
                    # (the TUNING "..._npt8_min_n" knobs; the main pass only in the wide kernel)
                    rsplits |= {ring_split(n, 8) for n in range(9, top)}
                for npt, nsplit in sorted(rsplits):
                    keys.append(KernelKey(kind, io, bc, npt, nsplit, True, True))
    keys += [KernelKey(_SEQ_STATES, io, bc, 0, 0, True, True) for io, bc in _dtype_pairs()
             if _COMPUTE[io] == "float32"]
    if full:
        return keys
    # Representative: per-step B and C for every (kind, dtypes, split) (the wide ring
    # forward, the ring forward's body in other blocks, at the splits of N 64 and 128); the
    # other three B/C forms for every (kind, dtypes) at N=16's split and for
    # every (kind, split) in float32. The direct-staging forward kernels (the
    # A/B alternative, the fallback where the cp.async buffers do not fit)
    # with per-step B and C only, at N=16's split and in float32.
    n16 = state_split(16, "float32")
    f32 = lambda k: k.io == "float32" and k.bc == "float32"  # noqa: E731
    per_step = lambda k: k.b_per_step and k.c_per_step  # noqa: E731
    # ... and at 8 states per lane, the wide forward at N 64's and 128's splits, the other
    # 8-state instances in float32 only
    wide = {ring_split(64), ring_split(128), (8, 8), (8, 16)}
    ring = lambda k: ((k.npt, k.nsplit) in wide or (k.npt == 4 and k.kind != "fwd_ring_wide")  # noqa: E731
                      or (k.npt == 8 and f32(k)))
    return [k for k in keys
            if k.kind in _SMALL_KINDS + (_SEQ_STATES,) or (ring(k) if k.kind in _RING_KINDS else (
                (k.kind.endswith("_direct") and per_step(k) and ((k.npt, k.nsplit) == n16 or f32(k)))
                or (not k.kind.endswith("_direct") and (per_step(k) or (k.npt, k.nsplit) == n16 or f32(k)))))]


def name_expression(key: KernelKey) -> str:
    """The C++ name of the instantiation ``key``, as NVRTC gets it."""
    ct = _COMPUTE[key.io]
    if key.kind == "carry":
        return f"ssm_seg_carry<{_CXX[ct]}>"
    if key.kind == "tile_sum":
        return f"ssm_sum_tiles<{_CXX[ct]}>"
    if key.kind in _RING_KINDS:
        return f"ssm_scan_{key.kind}<{_CXX[key.io]}, {_CXX[key.bc]}, {key.npt}, {key.nsplit}>"
    if key.kind == _SEQ_STATES:
        return f"ssm_sequence_states<{_CXX[key.io]}, {_CXX[key.bc]}>"
    b = lambda v: "true" if v else "false"  # noqa: E731
    return (f"ssm_scan_{key.kind}<{_CXX[key.io]}, {_CXX[key.bc]}, {_CXX[ct]}, {key.npt}, "
            f"{key.nsplit}, {b(key.b_per_step)}, {b(key.c_per_step)}>")


# ---------------------------------------------------------------------------
# Launch planning (pure Python; mirrors the kernels' shared-memory layouts).
# ---------------------------------------------------------------------------

def _r4(x: int) -> int:
    return (x + 3) // 4 * 4


def _fwd_smem_bytes(ch, tl, npad, bv, cv, itemsize, raw=None):
    """Dynamic shared memory of the forward kernels (mirrors ssm_fwd_layout).

    ``raw``: None for the kernels staging from global memory; else the
    ``(io, bc)`` item sizes of the cp.async kernels, which add two tile
    buffers of the raw inputs (mirrors ssm_fwd_raw: rows of u, delta, z, B, C
    of ``tl`` elements of the wider type and 16 bytes more).
    """
    tls, bs = tl | 1, npad + 4
    elems = _r4(2 * ch * tls) + _r4(ch * tls)
    elems += (_r4(tl * bs) if bv else 0) + (_r4(tl * bs) if cv else 0)
    nbytes = elems * itemsize
    if raw is not None:
        row = _round_up(tl * max(raw), 16) + 16
        nbytes += 2 * (3 * ch + npad * (int(bv) + int(cv))) * row
    return nbytes


def _ring_quantum(io, bc):
    """Granule of the ring kernels' tile starts and lengths, in steps (mirrors
    ssm_ring_quantum): 16 bytes of u/delta/z and of B/C, and a scan group of 4 steps."""
    return max(16 // _ITEMSIZE[io], 16 // _ITEMSIZE[bc], 4)


def _ring_gpitch(npad):
    """16-byte slots per group of 4 steps in the ring kernels' B and C stages: a gap after
    every 8 states (mirrors ssm_ring_gpitch)."""
    return npad + npad // 8


# Bytes after each 16-bit B/C row of a tile in the ring kernels' copy buffer (mirrors
# ssm_ring_raw_pitch: rows start in different banks).
_RAW_PAD = 16


def _ring_smem_bytes(ch, tl, n, npad, io, bc, kind="fwd"):
    """Dynamic shared memory of the ring kernels (mirrors ssm_ring_layout).

    ``kind``: "fwd" (ssm_scan_fwd_ring: rows of u, delta, z; B and C; the output sums),
    "sum" (ssm_scan_fwd_sum_ring: u, delta; B) or "bsum" (ssm_scan_bwd_sum_ring: dout,
    delta, z; C).
    """
    pio = tl * _ITEMSIZE[io] + 16
    rows_io = 2 if kind == "sum" else 3
    rows_bc = 2 if kind == "fwd" else 1
    stage = rows_io * ch * pio + rows_bc * _ring_gpitch(npad) * tl * 4
    raw = rows_bc * n * (tl * 2 + _RAW_PAD) if _ITEMSIZE[bc] == 2 else 0
    return 2 * stage + ch * (2 * tl + 4) * 4 + (ch * (tl + 4) * 4 if kind == "fwd" else 0) + raw


def _bwd_ring_smem_bytes(ch, tl, n, npad, io, bc):
    """Dynamic shared memory of ssm_scan_bwd_ring (mirrors ssm_bring_layout)."""
    nthr = ch * (npad // 4)
    pio = tl * _ITEMSIZE[io] + 16
    stage = 4 * ch * pio + 2 * _ring_gpitch(npad) * tl * 4
    rows = ch * (2 * tl + 4) * 4 + ch * (tl + 4) * 4
    slots = -(-tl // _BRING_SUB) * nthr * 16
    acc = _round_up((nthr // 32) * tl * (2 * npad + 1) * 4, 16)
    raw = 2 * n * (tl * 2 + _RAW_PAD) if _ITEMSIZE[bc] == 2 else 0
    return 2 * stage + rows + slots + acc + raw


def _bwd_smem_bytes(ch, tl, npad, npt, ts, bv, cv, itemsize):
    """Dynamic shared memory of ssm_scan_bwd (mirrors ssm_bwd_layout)."""
    tls, bs = tl | 1, npad + 4
    elems = _r4(2 * ch * tls) + 4 * _r4(ch * tls)
    elems += (_r4(tl * bs) if bv else 0) + (_r4(tl * bs) if cv else 0)
    elems += (tl // ts) * (ch * (npad // npt)) * npt
    elems += (ts * ch * npad if bv else 0) + (ts * ch * npad if cv else 0)
    elems += (_r4(npad * tls) if bv else 0) + (_r4(npad * tls) if cv else 0)
    return elems * itemsize


def _pow2_divisor(n: int, cap: int) -> int:
    """Largest power of two <= cap that divides n (n >= 1)."""
    ch = 1
    while ch * 2 <= cap and n % (ch * 2) == 0:
        ch *= 2
    return ch


def _group_size(dim, gb, gc):
    """gcd of dim and the group sizes of per-step B and C (g == 0: constant form)."""
    g = dim
    for G in (gb, gc):
        if G:
            g = math.gcd(g, dim // G)
    return g


def _round_up(x, m):
    return (x + m - 1) // m * m


def _choose_tiles(*, batch, dim, gb, gc, cmax, nsplit, step, tl_max, tl_min, max_threads,
                  warps_by_regs, size, lim, what, nseg=1, ch_min=1, pow2=False, block=None):
    """Pick channels per block CH and time tile TL for one kernel.

    CH runs over the powers of two that divide the group sizes; for each, TL is
    the longest multiple of ``step`` (<= tl_max, <= the chunk) whose shared
    memory lets as many blocks share an SM as the grid needs and the registers
    allow, but not shorter than ``tl_min``. Among the pairs with the fewest
    waves of resident blocks (a block runs for the whole sequence, so a partial
    last wave costs a full block time), and then within ``balance_slack`` of the
    fewest warps on the busiest SM (spreading small grids over all SMs), the
    largest CH (fewer partial sums, B/C tiles shared by more channels) and then
    the longest TL win. ``nseg`` time segments multiply the blocks; CH is at least ``ch_min``;
    ``pow2``: TL is a power of two (``step`` one too); ``block`` (a multiple of ``step``): a
    TL of two blocks or more, shorter than the chunk, is then cut to whole blocks (the
    choice among the pairs, and the blocks per SM returned, are those of the TL that fitted).

    Returns ``(CH, TL, smem bytes, blocks, resident blocks per SM at most)``.
    """
    sm = lim["sm_count"]
    ch_top = _pow2_divisor(_group_size(dim, gb, gc), max(1, max_threads // nsplit))
    tl_top = tl_max if cmax > tl_max else _round_up(cmax, step)
    tl_floor = min(tl_top, _round_up(tl_min, step))
    shorter = (lambda t: t - step) if not pow2 else (lambda t: t // 2)  # noqa: E731
    if pow2:
        tl_top = 1 << (tl_top - 1).bit_length()
        tl_floor = min(tl_top, 1 << (tl_floor - 1).bit_length())
    cands = []
    chs = []
    ch = ch_top
    while ch >= max(1, ch_min):
        chs.append(ch)
        ch //= 2
    # and, where max_threads is not a power of two (the wide ring forward at 8 states per lane:
    # 384), as many whole warps of channels as it allows (CH 24 at NSPLIT 16)
    ch_odd = max_threads // nsplit
    if (ch_odd > ch_top and ch_odd & (ch_odd - 1) and ch_odd * nsplit % 32 == 0
            and _group_size(dim, gb, gc) % ch_odd == 0):
        chs.insert(0, ch_odd)
    for ch in chs:
        warps = -(-(ch * nsplit) // 32)
        blocks = batch * (dim // ch) * nseg
        cap = max(1, min(lim["max_blocks_per_sm"], lim["max_warps_per_sm"] // warps,
                         warps_by_regs // warps))
        want = max(1, min(cap, -(-blocks // sm)))
        tl = tl_top
        while tl > tl_floor and (size(ch, tl) + 1024) * want > lim["smem_per_sm"]:
            tl = shorter(tl)
        while tl > step and size(ch, tl) > lim["smem_optin"]:
            tl = shorter(tl)
        nbytes = size(ch, tl)
        if nbytes <= lim["smem_optin"]:
            occ = max(1, min(want, lim["smem_per_sm"] // (nbytes + 1024)))
            occ_max = max(1, min(cap, lim["smem_per_sm"] // (nbytes + 1024)))
            waves = -(-blocks // (occ * sm))
            busiest = -(-blocks // sm) * warps
            if block and tl >= 2 * block and tl % block and cmax > tl:  # (ranked as fitted)
                tl -= tl % block
                nbytes = size(ch, tl)
            cands.append((waves, busiest, ch, tl, nbytes, blocks, occ_max))
    if not cands:
        raise NotImplementedError(
            f"ssmkit GPU selective_scan: {what} needs more shared memory per block than this "
            f"device's {lim['smem_optin']} bytes")
    fewest = min(c[0] for c in cands)
    cands = [c for c in cands if c[0] == fewest]
    least = min(c[1] for c in cands)
    cands = [c for c in cands if c[1] <= TUNING["balance_slack"] * least]
    _, _, ch, tl, nbytes, blocks, occ_max = max(cands, key=lambda c: (c[2], c[3]))
    return ch, tl, nbytes, blocks, occ_max


def _split_time(choose, *, L, chunk_size, sm_count, min_seg_steps=None, waves=None):
    """Tiles and time segments: ``(CH, TL, smem, blocks, nseg, seg_len)``.

    ``choose(nseg)`` is :func:`_choose_tiles` for ``nseg`` segments. Time is
    split only when the unsplit grid fills less than ``seg_min_fill`` of one
    wave of resident blocks (a nearly full grid gains little, and the summary
    pass repeats the recurrence's exponentials); then into about
    ``waves`` (default ``seg_waves``) waves' worth of
    blocks, in segments of whole chunks (checkpoints stay per global chunk) of
    at least ``min_seg_steps`` steps. Two rounds, since the tiles picked for
    the split grid change the occupancy.
    """
    chunk = max(1, min(chunk_size, L))
    n_chunks = -(-L // chunk)
    ch, tl, nbytes, blocks, occ = choose(1)
    nseg, seg_len = 1, n_chunks * chunk
    force = TUNING["force_segments"]
    for _ in range(2):
        base = blocks // nseg
        if force is not None:
            want = int(force)
        elif blocks >= (TUNING["seg_min_fill"] if nseg == 1 else 1.0) * occ * sm_count:
            break
        else:
            want = -(-int((TUNING["seg_waves"] if waves is None else waves) * occ * sm_count) // base)
        want = max(1, min(want, int(TUNING["max_segments"]), n_chunks))
        least = TUNING["min_seg_steps"] if min_seg_steps is None else min_seg_steps
        per = max(-(-n_chunks // want), -(-int(least) // chunk))
        new = -(-n_chunks // per)
        if new <= 1 or new == nseg:
            break
        nseg, seg_len = new, per * chunk
        ch, tl, nbytes, blocks, occ = choose(nseg)
    return ch, tl, nbytes, blocks, nseg, seg_len


def _limits(lim):
    """Device limits with defaults for the keys a caller may leave out."""
    out = dict(smem_per_sm=lim.get("smem_optin", 227 * 1024) + 1024, max_warps_per_sm=64,
               max_blocks_per_sm=32, regs_per_sm=65536)
    out.update(lim)
    return out


def plan_forward(*, batch, dim, L, N, gb, gc, chunk_size, compute, sm_count, smem_optin, io=None, bc=None,
                 **device):
    """Launch shape of the forward kernel.

    Parameters
    ----------
    gb, gc : int
        Groups of per-step B / C, 0 for the constant (dim, N) form.
    compute : str
        "float32" or "float64".
    io, bc : str, optional
        Storage dtypes of u/delta/z and of B/C (default: ``compute``); they
        size the cp.async kernels' tile buffers (``TUNING["fwd_async"]``).
    sm_count, smem_optin : int
        The device's multiprocessor count and per-block shared-memory limit.
    **device
        Optional further limits: ``smem_per_sm``, ``max_warps_per_sm``,
        ``max_blocks_per_sm``, ``regs_per_sm`` (see :func:`compiler.device_limits`).

    Returns
    -------
    dict
        ``npt``, ``nsplit``, ``ch`` (channels per block), ``tl`` (time tile),
        ``threads``, ``blocks`` (all segments), ``smem`` (bytes), ``nseg``
        (time segments; 1: no split), ``seg_len`` (steps per segment, a
        multiple of the chunk; the last segment may be shorter) and ``async_``
        (whether the plan is for the cp.async kernels: ``TUNING["fwd_async"]``,
        unless their buffers do not fit a block's shared memory).
    """
    lim = _limits(dict(device, sm_count=sm_count, smem_optin=smem_optin))
    npt, nsplit = state_split(N, compute)
    npad = npt * nsplit
    itemsize = 8 if compute == "float64" else 4
    bv, cv = gb > 0, gc > 0
    def choose(nseg, raw):
        regs = _round_up((_FWD_REGS if raw is None else _FWD_REGS_ASYNC)[(compute, npt)], 8)
        return _choose_tiles(
            batch=batch, dim=dim, gb=gb, gc=gc, cmax=max(1, min(chunk_size, L)), nsplit=nsplit,
            step=nsplit, tl_max=_round_up(max(TUNING["fwd_tl"], nsplit), nsplit), tl_min=TUNING["fwd_min_tl"],
            max_threads=min(TUNING["fwd_threads"], FWD_MAX_THREADS) if nsplit <= FWD_MAX_THREADS else nsplit,
            warps_by_regs=lim["regs_per_sm"] // (regs * 32),
            size=lambda c, t: _fwd_smem_bytes(c, t, npad, bv, cv, itemsize, raw), lim=lim,
            what=f"the forward with N={N} in {compute}", nseg=nseg)

    mode = TUNING["fwd_async"]
    use_async = mode == "auto" or bool(mode)
    if use_async:
        # The cp.async kernels' two raw tile buffers may not fit one block's shared memory
        # (large N in float64): then the direct-staging kernels.
        raw = (_ITEMSIZE[io or compute], _ITEMSIZE[bc or compute])
        try:
            ch, tl, nbytes, blocks, nseg, seg_len = _split_time(
                lambda nseg: choose(nseg, raw), L=L, chunk_size=chunk_size, sm_count=lim["sm_count"])
        except NotImplementedError:
            use_async = False
        if use_async and mode == "auto" and (_ITEMSIZE[io or compute] != 2 or nseg > 1):
            use_async = False
    if not use_async:
        ch, tl, nbytes, blocks, nseg, seg_len = _split_time(
            lambda nseg: choose(nseg, None), L=L, chunk_size=chunk_size, sm_count=lim["sm_count"])
    return dict(npt=npt, nsplit=nsplit, ch=ch, tl=tl, threads=ch * nsplit, blocks=blocks, smem=nbytes,
                nseg=nseg, seg_len=seg_len, async_=use_async)


def ring_split(N: int, npt: int = 4) -> tuple[int, int]:
    """``(NPT, NSPLIT)`` of the ring kernels for ``N`` <= 128 states: ``npt`` (4 or 8) states
    per lane on the fewest power-of-two lanes that hold them (4, N <= 16: as
    :func:`state_split`)."""
    nsplit = 1
    while npt * nsplit < N:
        nsplit *= 2
    return npt, nsplit


def _fwd_ring_split(N: int, top) -> tuple[int, int]:
    """``(NPT, NSPLIT)`` of a ring forward pass that keeps 8 states per lane from N = ``top``
    (``TUNING["fwd_ring_npt8_min_n"]``, ``"fwd_sum_npt8_min_n"`` or ``"bwd_sum_npt8_min_n"``;
    None: never) and N > 8, else 4: :func:`ring_split`."""
    return ring_split(N, 8 if top is not None and N >= max(9, top) else 4)


def _ring_case(*, L, N, gb, gc, chunk_size, io, bc, max_n):
    """``(npt, nsplit, q, cmax)`` where the ring kernels apply (float32 compute, B and C per
    step, N <= ``max_n`` (at most 128), L < 2**31, L and the chunk multiples of
    :func:`_ring_quantum`), else None."""
    if (_COMPUTE[io] != "float32" or not (gb > 0 and gc > 0) or N > min(max_n, 128)
            or not 1 <= L < 2**31):
        return None
    q = _ring_quantum(io, bc)
    cmax = max(1, min(chunk_size, L))
    if L % q or cmax % q:
        return None
    return (*ring_split(N), q, cmax)


def _choose_ring_tiles(kind, *, N, npad, io, bc, lim, what, max_threads=None, npt=4, **shape):
    """:func:`_choose_tiles` for a kernel of the ring forward's body (``kind`` as in
    :func:`_ring_smem_bytes`): the forward's thread and tile-length knobs, the ring kernels'
    registers, tiles of 32 steps or more in whole 16-step blocks where a chunk holds more
    than one (the steps past a tile's last whole block go through the 4-step groups, which
    cost more: float32 64x1536x256 N 16 forward 0.266 ms at TL 40, 0.283 at 36, 0.241 at 32;
    benchmarks/NOTES.md);
    ``shape``: the remaining arguments of :func:`_choose_tiles`."""
    return _choose_tiles(
        tl_min=TUNING["fwd_min_tl"],
        max_threads=min(TUNING["fwd_threads"], FWD_MAX_THREADS) if max_threads is None else max_threads,
        # (the summary kernels are bounded to 128 registers at either NPT)
        warps_by_regs=lim["regs_per_sm"] // (
            (_RING_REGS_NPT8 if npt == 8 and kind == "fwd" else _RING_REGS) * 32),
        size=lambda c, t: _ring_smem_bytes(c, t, N, npad, io, bc, kind=kind), lim=lim, what=what,
        block=_RING_BLOCK if TUNING["ring_whole_blocks"] and _RING_BLOCK % shape["step"] == 0
        else None, **shape)


def plan_forward_ring(*, batch, dim, L, N, gb, gc, chunk_size, io, bc, sm_count, smem_optin, _split=None,
                      **device):
    """Launch shape of the ring forward kernels, or None where they do not apply.

    They apply with float32 compute (u in float16, bfloat16 or float32), B and C
    per step (``gb``, ``gc`` > 0), N <= ``TUNING["fwd_ring_max_n"]``, L < 2**31, and L and the chunk (``min(chunk_size,
    L)``) multiples of :func:`_ring_quantum`; the caller also checks that the
    arrays start 16-byte aligned. Parameters and result as :func:`plan_forward`,
    plus ``sum_smem`` (bytes of the summary kernel at the main pass's tiles), ``ring`` True,
    ``inside``: chunks shorter than the longest tile and a multiple of 16 steps do not shorten
    the tiles (then multiples of 16 steps), the kernel writes their states between its 16-step
    blocks; and ``sum_ring``, with time split, the summary pass's ``npt``, ``nsplit``, ``ch``,
    ``tl``, ``threads``, ``smem``, ``split`` (sub-segments per segment) and ``seg_len`` (steps
    of a sub-segment), else None.

    ``npt``/``nsplit``: :func:`_fwd_ring_split`, but 4 states per lane where the 8-state plan's
    grid has fewer than ``TUNING["fwd_ring_npt8_min_warps"]`` warps per SM (``_split`` forces
    a split, for that comparison and the tests).
    """
    case = _ring_case(L=L, N=N, gb=gb, gc=gc, chunk_size=chunk_size, io=io, bc=bc,
                      max_n=TUNING["fwd_ring_max_n"])
    if case is None:
        return None
    _, _, q, cmax = case
    npt, nsplit = _fwd_ring_split(N, TUNING["fwd_ring_npt8_min_n"]) if _split is None else _split
    if npt == 8 and _split is None:
        # 8 states per lane halve the warps: only where the grid still fills the SMs
        plan = plan_forward_ring(batch=batch, dim=dim, L=L, N=N, gb=gb, gc=gc, chunk_size=chunk_size, io=io,
                                 bc=bc, sm_count=sm_count, smem_optin=smem_optin, _split=(npt, nsplit), **device)
        warps = None if plan is None else plan["blocks"] * -(-plan["threads"] // 32)
        if warps is not None and warps >= TUNING["fwd_ring_npt8_min_warps"] * sm_count:
            return plan
        npt, nsplit = ring_split(N)
    lim = _limits(dict(device, sm_count=sm_count, smem_optin=smem_optin))
    npad = npt * nsplit
    tl_max = _round_up(max(TUNING["fwd_tl"], q), q)
    inside = cmax % _RING_BLOCK == 0 and cmax < min(L, tl_max)
    if inside:  # tiles bounded by L only, in whole blocks
        q, cmax, tl_max = _RING_BLOCK, L, _round_up(tl_max, _RING_BLOCK)

    wide = TUNING["fwd_ring_wide_min_n"] is not None and N >= TUNING["fwd_ring_wide_min_n"]

    def choose(nseg):
        return _choose_ring_tiles(
            "fwd", N=N, npad=npad, io=io, bc=bc, lim=lim, what=f"the forward with N={N}", npt=npt,
            max_threads=(RING_FWD_WIDE_THREADS_NPT8 if npt == 8 else RING_FWD_WIDE_THREADS) if wide else None,
            batch=batch, dim=dim, gb=gb, gc=gc, cmax=cmax, nsplit=nsplit, step=q, tl_max=tl_max, nseg=nseg)

    try:
        ch, tl, nbytes, blocks, nseg, seg_len = _split_time(choose, L=L, chunk_size=chunk_size,
                                                             sm_count=lim["sm_count"],
                                                             waves=TUNING["fwd_ring_seg_waves"])
    except NotImplementedError:
        return None
    sum_smem = _ring_smem_bytes(ch, tl, N, npad, io, bc, kind="sum")
    sum_ring = None
    if nseg > 1:  # the summary of segments 0 .. nseg - 2, in sub-segments
        quantum = _ring_quantum(io, bc)
        split = _sum_split(seg_len, quantum)
        sub = seg_len // split
        # its states per lane (its results do not depend on them: one value per state)
        snpt, snsplit = _fwd_ring_split(N, TUNING["fwd_sum_npt8_min_n"])
        snpad = snpt * snsplit
        # the main pass's tiles (at most FWD_MAX_THREADS: the summary has no wide kernel), unless
        # its own fit
        sch = _pow2_divisor(ch, FWD_MAX_THREADS // snsplit)
        stl, sbytes = tl, _ring_smem_bytes(sch, tl, N, snpad, io, bc, kind="sum")
        if TUNING["fwd_sum_tiles"]:
            try:
                sch, stl, sbytes, _, _ = _choose_ring_tiles(
                    "sum", N=N, npad=snpad, io=io, bc=bc, lim=lim, what=f"the forward's summary with N={N}",
                    npt=snpt, batch=batch, dim=dim, gb=gb, gc=gc, cmax=sub, nsplit=snsplit, step=quantum,
                    tl_max=_round_up(max(TUNING["fwd_tl"], q), q), nseg=(nseg - 1) * split)
            except NotImplementedError:
                pass
        sum_ring = dict(npt=snpt, nsplit=snsplit, ch=sch, tl=stl, threads=sch * snsplit, smem=sbytes,
                        split=split, seg_len=sub)
    return dict(npt=npt, nsplit=nsplit, ch=ch, tl=tl, threads=ch * nsplit, blocks=blocks, smem=nbytes,
                nseg=nseg, seg_len=seg_len, async_=True, ring=True, inside=inside,
                sum_smem=sum_smem, sum_ring=sum_ring)


def _sum_split(seg_len, q):
    """Sub-segments per time segment of the ring summary passes (``TUNING["sum_split"]``), or 1
    where ``seg_len`` steps do not split into that many multiples of the ring quantum ``q``."""
    split = max(1, int(TUNING["sum_split"]))
    return split if seg_len % (split * q) == 0 else 1


def plan_backward_ring(*, batch, dim, L, N, gb, gc, chunk_size, io, bc, sm_count, smem_optin, **device):
    """Launch shape of the ring backward kernel, or None where it does not apply.

    It applies where :func:`plan_forward_ring` does and the channels of a B/C group fill a
    warp (``32 / NSPLIT`` of them: blocks are whole warps). Returns the keys of
    :func:`plan_backward` (``ts`` is the sub-block, 8 steps), ``ring`` True and ``sum_ring``:
    ``ch``, ``tl``, ``threads`` and ``smem`` of the summary pass ``ssm_scan_bwd_sum_ring``
    with time split (tiles picked as the ring forward's, not ending at chunk ends), else
    None.
    """
    case = _ring_case(L=L, N=N, gb=gb, gc=gc, chunk_size=chunk_size, io=io, bc=bc,
                      max_n=_slice_states())
    if case is None:
        return None
    npt, nsplit, q, cmax = case
    lim = _limits(dict(device, sm_count=sm_count, smem_optin=smem_optin))
    npad = npt * nsplit
    step = max(q, _BRING_SUB)  # whole sub-blocks but at a chunk's end; TL a power of two

    def choose(nseg):
        return _choose_tiles(
            batch=batch, dim=dim, gb=gb, gc=gc, cmax=cmax, nsplit=nsplit, step=step,
            tl_max=_round_up(max(TUNING["bwd_ring_tl"], step), step), tl_min=TUNING["bwd_min_tl"],
            max_threads=min(TUNING["bwd_ring_threads"], BWD_RING_MAX_THREADS),
            warps_by_regs=lim["regs_per_sm"] // (_BWD_RING_REGS * 32),
            size=lambda c, t: _bwd_ring_smem_bytes(c, t, N, npad, io, bc), lim=lim,
            what=f"the ring backward with N={N}", nseg=nseg, ch_min=32 // nsplit, pow2=True)

    try:
        ch, tl, nbytes, blocks, nseg, seg_len = _split_time(choose, L=L, chunk_size=chunk_size,
                                                             sm_count=lim["sm_count"],
                                                             min_seg_steps=TUNING["bwd_min_seg_steps"])
    except NotImplementedError:
        return None
    tpc = -(-cmax // tl)
    sum_ring = None
    if nseg > 1:  # the summary's own tiles, as the ring forward picks them, for its nseg - 1 segments
        split = _sum_split(seg_len, q)  # in sub-segments
        snpt, snsplit = _fwd_ring_split(N, TUNING["bwd_sum_npt8_min_n"])  # (one value per state)
        try:
            sch, stl, sbytes, _, _ = _choose_ring_tiles(
                "bsum", N=N, npad=snpt * snsplit, io=io, bc=bc, lim=lim, npt=snpt,
                what=f"the backward's summary with N={N}",
                batch=batch, dim=dim, gb=gb, gc=gc, cmax=seg_len // split, nsplit=snsplit, step=q,
                tl_max=_round_up(max(TUNING["fwd_tl"], q), q), nseg=(nseg - 1) * split)
            sum_ring = dict(npt=snpt, nsplit=snsplit, ch=sch, tl=stl, threads=sch * snsplit, smem=sbytes,
                            split=split, seg_len=seg_len // split)
        except NotImplementedError:
            pass
    return dict(npt=npt, nsplit=nsplit, ch=ch, tl=tl, ts=_BRING_SUB, threads=ch * nsplit, blocks=blocks,
                smem=nbytes, tiles_per_chunk=tpc,
                scratch=blocks * tpc * (tl // _BRING_SUB) * ch * nsplit * npt,  # a state per sub-block
                nseg=nseg, seg_len=seg_len, ring=True,
                sum_smem=_fwd_smem_bytes(ch, tl, npad, False, True, 4), sum_ring=sum_ring)


def plan_backward(*, batch, dim, L, N, gb, gc, chunk_size, compute, sm_count, smem_optin, **device):
    """Launch shape of the backward kernel (see :func:`plan_forward`).

    Returns
    -------
    dict
        As :func:`plan_forward`, plus ``ts`` (sub-tile steps), ``tiles_per_chunk``,
        ``scratch`` (elements of per-tile state storage) and ``sum_smem`` (bytes
        of the summary pass ``ssm_scan_bwd_sum``, which runs on the same tiles).
    """
    lim = _limits(dict(device, sm_count=sm_count, smem_optin=smem_optin))
    npt, nsplit = state_split(N, compute)
    npad = npt * nsplit
    itemsize = 8 if compute == "float64" else 4
    ts = _bwd_substeps(compute, npt)
    bv, cv = gb > 0, gc > 0
    cmax = max(1, min(chunk_size, L))
    choose = lambda nseg: _choose_tiles(  # noqa: E731
        batch=batch, dim=dim, gb=gb, gc=gc, cmax=cmax, nsplit=nsplit, step=ts,
        tl_max=_round_up(max(TUNING["bwd_tl"], ts), ts), tl_min=TUNING["bwd_min_tl"],
        max_threads=max(nsplit, min(TUNING["bwd_threads"], BWD_MAX_THREADS)),
        warps_by_regs=BWD_MAX_THREADS * _BWD_MIN_BLOCKS[compute] // 32,
        size=lambda c, t: _bwd_smem_bytes(c, t, npad, npt, ts, bv, cv, itemsize), lim=lim,
        what=f"the backward with N={N} in {compute}", nseg=nseg)
    ch, tl, nbytes, blocks, nseg, seg_len = _split_time(choose, L=L, chunk_size=chunk_size,
                                                         sm_count=lim["sm_count"],
                                                         min_seg_steps=TUNING["bwd_min_seg_steps"])
    tpc = -(-cmax // tl)
    return dict(npt=npt, nsplit=nsplit, ch=ch, tl=tl, ts=ts, threads=ch * nsplit, blocks=blocks,
                smem=nbytes, tiles_per_chunk=tpc, scratch=blocks * tpc * ch * nsplit * npt,
                nseg=nseg, seg_len=seg_len, sum_smem=_fwd_smem_bytes(ch, tl, npad, False, cv, itemsize))


# ---------------------------------------------------------------------------
# Launching.
# ---------------------------------------------------------------------------

_NULL = np.uint64(0)  # a null device pointer for absent optional arrays


def _ptr(x):
    return _NULL if x is None else x


def _launch(key, plan, args):
    import cupy  # noqa: F401  (the kernel call needs CuPy loaded)

    if plan["blocks"] > 2**31 - 1:
        raise ValueError(f"ssmkit GPU selective_scan: {plan['blocks']} blocks "
                         "is more than one launch takes")
    name = name_expression(key)
    kernel = compiler.get_kernel(SOURCE_FILE, name)
    compiler.ensure_dynamic_smem(kernel, name, plan["smem"])
    kernel((plan["blocks"],), (plan["threads"],), args, shared_mem=plan["smem"])


def _check_dtypes(p):
    if int(p.chunk_size) < 1:
        raise ValueError(f"ssmkit GPU selective_scan: chunk_size must be >= 1, got {p.chunk_size}")
    for name, size in (("batch", p.batch), ("dim", p.dim), ("N", p.N)):
        if size > 2**31 - 1:
            raise ValueError(f"ssmkit GPU selective_scan: {name}={size} does not fit the kernels' "
                             "32-bit size parameters")
    io = _dtype_name(p.io_dtype)
    ct = _dtype_name(p.compute_dtype)
    bc = _dtype_name(p.bc_dtype)
    if ct != _COMPUTE[io]:
        raise TypeError(f"ssmkit GPU selective_scan: compute dtype {ct} does not match "
                        f"u's dtype {io} (expected {_COMPUTE[io]})")
    if bc not in (io, ct):
        raise TypeError(f"ssmkit GPU selective_scan: B/C dtype {bc} must be {io} or {ct}")
    # The kernels reinterpret raw memory: a dtype off here would read garbage.
    for name, arr, want in (("delta", p.delta, p.io_dtype), ("z", p.z, p.io_dtype),
                            ("C", p.C, p.bc_dtype), ("D", p.D, p.compute_dtype),
                            ("delta_bias", p.delta_bias, p.compute_dtype),
                            ("initial_state", p.initial_state, p.compute_dtype)):
        if arr is not None and arr.dtype != want:
            raise TypeError(f"ssmkit GPU selective_scan: {name} has dtype {arr.dtype}, "
                            f"expected {np.dtype(want)}")
    return io, bc, ct


def _shape_args(p, plan, chunk=None):
    # Kernel parameters after the arrays: int batch, dim, N; long long L; int GB,
    # GC; long long chunk; int TL, CH (then int flags). A chunk longer than L is
    # the same as one of length L (and then fits in 64 bits). `chunk`: another chunk (the
    # summary passes of sub-segments: their length; no checkpoints there).
    chunk = min(p.chunk_size, max(1, p.L)) if chunk is None else chunk
    return (np.int32(p.batch), np.int32(p.dim), np.int32(p.N), np.int64(p.L),
            np.int32(max(1, p.groups(p.B))), np.int32(max(1, p.groups(p.C))),
            np.int64(chunk), np.int32(plan["tl"]), np.int32(plan["ch"]))


def _seg_args(plan, seg0=0):
    # The scan kernels' last parameters: long long seg_len; int nseg, seg0.
    return (np.int64(plan["seg_len"]), np.int32(plan["nseg"]), np.int32(seg0))


def _carry(p, plan, init, local, sumdt, reverse):
    """Launch ssm_seg_carry: the state (adjoint) entering each segment; returns it."""
    cp = p.xp
    seeds = cp.empty(local.shape, dtype=p.compute_dtype)
    total = p.batch * p.dim * p.N
    threads = 256
    blocks = max(1, min(-(-total // threads), 64 * compiler.device_limits()["sm_count"]))
    key = KernelKey("carry", _dtype_name(p.compute_dtype), _dtype_name(p.compute_dtype), 0, 0, False, False)
    args = (p.A, _ptr(init), local, sumdt, seeds, np.int32(p.batch), np.int32(p.dim), np.int32(p.N),
            np.int32(plan["nseg"]), np.int32(1 if reverse else 0))
    _launch(key, dict(blocks=blocks, threads=threads, smem=0), args)
    return seeds


def _sum_tiles(p, part, G):
    """(batch, ntile, N, L) per-step partials of the backward's channel tiles -> (batch, G,
    N, L): the tiles of group g are g * tpg ... (g + 1) * tpg - 1, summed in that order
    (ssm_sum_tiles)."""
    batch, ntile, N, L = part.shape
    out = p.xp.empty((batch, G, N, L), dtype=part.dtype)
    rows, NL = batch * G, N * L
    if rows * NL == 0:
        return out
    threads = 256
    blocks = max(1, min(-(-rows * NL // threads), 8 * compiler.device_limits()["sm_count"]))
    ct = _dtype_name(part.dtype)
    _launch(KernelKey("tile_sum", ct, ct, 0, 0, False, False),
            dict(blocks=blocks, threads=threads, smem=0),
            (part, out, np.int32(rows), np.int32(ntile // G), np.int64(NL)))
    return out


def _plan(p, which, N=None, dtypes=None):
    """The launch plan for ``p`` (cached: planning in Python costs more than a short kernel);
    None where ``which`` = "fwd_ring" or "bwd_ring" does not apply to its shape. ``N``: for
    ``p`` with that many states instead (a slice of them); ``dtypes``: the names of u's and
    B's dtypes instead of ``p``'s (as they will be: float32 copies)."""
    import cupy

    io, bc = dtypes or (_dtype_name(p.io_dtype), _dtype_name(p.bc_dtype))
    plan = _cached_plan(which, p.batch, p.dim, p.L, p.N if N is None else N, p.groups(p.B), p.groups(p.C),
                        p.chunk_size, _dtype_name(p.compute_dtype),
                        cupy.cuda.runtime.getDevice(), tuple(sorted(TUNING.items())), io, bc)
    return None if plan is None else dict(plan)


def _aligned16(*arrays):
    """Whether every array given (None: skipped) starts on a 16-byte boundary."""
    for a in arrays:
        if a is not None:
            ptr = a.__array_interface__["data"][0] if isinstance(a, np.ndarray) else a.data.ptr
            if ptr % 16:
                return False
    return True


@functools.lru_cache(maxsize=256)
def _cached_plan(which, batch, dim, L, N, gb, gc, chunk_size, compute, device, tuning, io=None, bc=None):
    del device, tuning  # key only: the limits are the device's, and TUNING may be changed
    if which == "fwd_ring":
        return plan_forward_ring(batch=batch, dim=dim, L=L, N=N, gb=gb, gc=gc, chunk_size=chunk_size,
                                 io=io, bc=bc, **compiler.device_limits())
    if which == "bwd_ring":
        return plan_backward_ring(batch=batch, dim=dim, L=L, N=N, gb=gb, gc=gc, chunk_size=chunk_size,
                                  io=io, bc=bc, **compiler.device_limits())
    if which == "fwd":
        return plan_forward(batch=batch, dim=dim, L=L, N=N, gb=gb, gc=gc, chunk_size=chunk_size,
                            compute=compute, io=io, bc=bc, **compiler.device_limits())
    return plan_backward(batch=batch, dim=dim, L=L, N=N, gb=gb, gc=gc, chunk_size=chunk_size,
                         compute=compute, **compiler.device_limits())


def _ring_forward_plan(p):
    """The ring forward's plan for ``p`` where it applies (its shape, and u, delta, z, B and
    C 16-byte aligned), else None."""
    plan = _plan(p, "fwd_ring") if TUNING["fwd_ring"] else None
    return plan if plan is not None and _aligned16(p.u, p.delta, p.z, p.B, p.C) else None


def _sums_in_ring(plan):
    """Whether a ring plan's time segments (if any) are summarised by the ring kernels."""
    return plan["nseg"] == 1 or (TUNING["bwd_sum_ring"] and plan.get("sum_ring") is not None)


# Packed sequences restart in the ring kernels where every A is at most this: the decay into
# a restart is exp2(SSM_RESTART_DT A log2(e)), 0 for these (selective_scan.cu).
_RESTART_MAX_A = -(2.0 ** -120)


def restarts_in_place(p, packing, *, backward, final_states):
    """Whether packed sequences run in place, restarting in the ring kernels (no padded
    rows): where the ring forward (and with ``backward`` the ring backward, in one pass or
    by slices of states, its segments summarised by the ring kernels) runs ``p``; for a
    VJP, where no sequence but a row's last needs its final state (``final_states``: every
    sequence's does; the forward alone computes those after the scan,
    :func:`_sequence_states`, but the backward takes the rows' cotangents only); and every A
    is at most -2^-120 (so a restart's decay is exactly 0). One small device-to-host copy
    (the A check)."""
    if backward and final_states and _packed.inner_segments(packing).any():
        return False
    if _ring_forward_plan(p) is None:
        return False
    if backward:
        if p.N > _slice_states():
            if not _by_state_slices(p):
                return False
            plans = [_slice_plan(p, n) for n in {min(_slice_states(), p.N - k)
                                                  for k in range(0, p.N, _slice_states())}]
        else:
            plans = [_plan(p, "bwd_ring") if TUNING["bwd_ring"] else None]
        if None in plans or not all(_sums_in_ring(q) for q in plans):
            return False
    return bool((p.A <= _RESTART_MAX_A).all())


def _restart_flags(p, sequences):
    """(batch, L) uint8 on the device: 1 where a packed sequence starts after its row's first
    step (None without ``sequences``)."""
    if sequences is None:
        return None
    return p.xp.asarray(_packed.restart_steps(sequences, p.batch, p.L).view(np.uint8))


def _sequence_states(p, sequences, ckpt, out):
    """The final states of the packed sequences that end inside their rows, into their slots
    of ``out`` (n_slots, dim, N), recomputed from the forward's checkpoints ``ckpt``
    (ssm_sequence_states; the rows' last sequences' slots are the caller's)."""
    _, end, slot = sequences.segments
    rows, first = _packed.segment_starts(sequences, p.batch)
    pick = _packed.inner_segments(sequences)
    nseq = int(pick.sum())
    if nseq == 0:
        return
    cp = p.xp
    seqs = tuple(cp.asarray(a[pick].astype(np.int64)) for a in (rows, first, end - 1, slot))
    total = nseq * p.dim * p.N
    blocks = max(1, min(-(-total // 256), 64 * compiler.device_limits()["sm_count"]))
    flags = ((_HAS_BIAS if p.delta_bias is not None else 0)
             | (_SOFTPLUS if p.delta_softplus else 0))
    key = KernelKey(_SEQ_STATES, _dtype_name(p.io_dtype), _dtype_name(p.bc_dtype), 0, 0, True, True)
    args = (p.u, p.delta, p.A, p.B, _ptr(p.delta_bias), ckpt) + seqs + (
        out, np.int32(nseq), np.int32(p.batch), np.int32(p.dim), np.int32(p.N), np.int64(p.L),
        np.int32(p.groups(p.B)), np.int64(min(p.chunk_size, max(1, p.L))), np.int32(flags))
    _launch(key, dict(blocks=blocks, threads=256, smem=0), args)


def selective_scan_forward(p, *, save_checkpoints, sequences=None, final_states=True):
    """Forward selective scan on the GPU.

    Parameters
    ----------
    p : SelectiveScanProblem
        With ``p.xp`` = ``cupy`` (see :mod:`ssmkit._problem` for the layout).
    save_checkpoints : bool
        Also return the state entering each chunk of ``p.chunk_size`` steps.
    sequences : Packing, optional
        Packed sequences (:mod:`ssmkit._selective_scan_packed`) to run in place, where
        :func:`restarts_in_place` allows: the state restarts from zero where each starts.
    final_states : bool
        With ``sequences``: every sequence's final state (those ending inside their rows
        recomputed from checkpoints, kept for that when ``save_checkpoints`` is False);
        False: none (``final_state`` is None).

    Returns
    -------
    y : cupy.ndarray, (batch, dim, L), ``p.io_dtype``
    final_state : cupy.ndarray, (batch, dim, N), ``p.compute_dtype``; with ``sequences``
        (n_slots, dim, N), one per sequence slot, or None (see ``final_states``)
    checkpoints : cupy.ndarray, (n_chunks, batch, dim, N), ``p.compute_dtype``, or None
        ``checkpoints[i]`` is the state before step ``i * chunk_size``;
        ``checkpoints[0]`` is the initial state (zeros when none was given).
    """
    cp = p.xp
    io, bc, ct = _check_dtypes(p)
    batch, dim, L, N = p.batch, p.dim, p.L, p.N
    y = cp.empty((batch, dim, L), dtype=p.io_dtype)
    final = cp.empty((batch, dim, N), dtype=p.compute_dtype)
    restart = _restart_flags(p, sequences)
    inner = sequences is not None and final_states and _packed.inner_segments(sequences).any()
    keep = save_checkpoints or inner  # (the inner sequences' states start from checkpoints)
    ckpt = cp.empty((p.n_chunks, batch, dim, N), dtype=p.compute_dtype) if keep else None
    plan = _ring_forward_plan(p)  # (y is new: aligned)
    if plan is None:
        if restart is not None:
            raise RuntimeError("ssmkit GPU selective_scan: packed sequences in place need the "
                               "ring forward")
        plan = _plan(p, "fwd")
    ring = plan.get("ring", False)
    bv, cv = p.groups(p.B) > 0, p.groups(p.C) > 0
    flags = ((_HAS_D if p.D is not None else 0) | (_HAS_Z if p.z is not None else 0)
             | (_HAS_BIAS if p.delta_bias is not None else 0)
             | (_SOFTPLUS if p.delta_softplus else 0)
             | (_HAS_H0 if p.initial_state is not None else 0)
             | (_SAVE_CKPT if keep else 0)
             | (_CKPT_INSIDE if plan.get("inside") else 0))
    seeds = None
    nseg = plan["nseg"]
    if nseg > 1 and ring:
        # Summary of segments 0 .. nseg-2 (the last one's end state is not needed) in
        # sub-segments of sr["seg_len"] steps, split of them a segment; the carry gives the
        # state entering every sub-segment, of which every split-th enters a segment.
        sr = plan["sum_ring"]
        split = sr["split"]
        nsub = (nseg - 1) * split
        splan = dict(plan, **sr, nseg=nsub + 1, blocks=batch * (dim // sr["ch"]) * nsub)
        local = cp.empty((nsub + 1, batch, dim, N), dtype=p.compute_dtype)
        sumdt = cp.empty((nsub + 1, batch, dim), dtype=p.compute_dtype)
        key = KernelKey("fwd_sum_ring", io, bc, sr["npt"], sr["nsplit"], bv, cv)
        args = (p.u, p.delta, _NULL, p.A, p.B, _NULL, _ptr(p.D), _ptr(p.delta_bias), _NULL,
                _NULL, _NULL, _NULL, local, sumdt) + _shape_args(p, splan, chunk=sr["seg_len"]) + (
                np.int32(flags & ~(_SAVE_CKPT | _CKPT_INSIDE)),) + _seg_args(splan) + (_ptr(restart),)
        _launch(key, splan, args)
        seeds = cp.ascontiguousarray(_carry(p, splan, p.initial_state, local, sumdt, reverse=False)[::split])
    elif nseg > 1:
        # Summary of segments 0 .. nseg-2 (the last one's end state is not
        # needed), then the carry: the state entering every segment.
        local = cp.empty((nseg, batch, dim, N), dtype=p.compute_dtype)
        sumdt = cp.empty((nseg, batch, dim), dtype=p.compute_dtype)
        key = KernelKey("fwd_sum" if plan["async_"] else "fwd_sum_direct", io, bc, plan["npt"], plan["nsplit"],
                        bv, cv)
        args = (p.u, p.delta, _NULL, p.A, p.B, _NULL, _ptr(p.D), _ptr(p.delta_bias), _NULL,
                _NULL, _NULL, _NULL, local, sumdt) + _shape_args(p, plan) + (
                np.int32(flags & ~_SAVE_CKPT),) + _seg_args(plan) + (_NULL,)
        _launch(key, dict(plan, blocks=plan["blocks"] // nseg * (nseg - 1)), args)
        seeds = _carry(p, plan, p.initial_state, local, sumdt, reverse=False)
    kind = "fwd" if plan["async_"] else "fwd_direct"
    if ring:
        # (at 8 states per lane always the wide kernel: its launch bound of 384 threads lets
        # ptxas keep ~150 registers, where the 256-thread kernel's instances may cap at 128
        # and spill 70-100 bytes)
        kind = "fwd_ring_wide" if plan["threads"] > FWD_MAX_THREADS or plan["npt"] == 8 else "fwd_ring"
    key = KernelKey(kind, io, bc, plan["npt"], plan["nsplit"], bv, cv)
    args = (p.u, p.delta, _ptr(p.z), p.A, p.B, p.C, _ptr(p.D), _ptr(p.delta_bias),
            _ptr(p.initial_state), y, final, _ptr(ckpt), _ptr(seeds), _NULL) + _shape_args(p, plan) + (
            np.int32(flags),) + _seg_args(plan) + (_ptr(restart),)
    _launch(key, plan, args)
    if sequences is not None and not final_states:
        final = None
    elif sequences is not None:  # the rows' final states into their last sequences' slots
        rows = final
        final = cp.zeros((sequences.n_slots, dim, N), dtype=p.compute_dtype)
        _packed.put_rows(cp, final, _packed.row_final_slots(sequences), rows)
        if inner:
            _sequence_states(p, sequences, ckpt, final)
    return y, final, ckpt if save_checkpoints else None


def checkpoint_interval(p):
    """The chunk size a VJP uses when its caller gives none (``p.chunk_size`` is the default).

    Where the ring backward applies, its time tile TL: with a checkpoint entering every
    tile, it walks each chunk's one tile and recomputes no earlier tile from the chunk's
    start (its "A" pass); the ring forward writes those states between its blocks without
    shortening its own tiles. Only where TL is a multiple of 16 steps, shorter than the
    chunk and L, and the checkpoints (``N`` floats every TL steps) take no more memory than
    ``u`` (at the peer rows' N = 16: TL 16 in float32, 32 in 16-bit types). Forward +
    backward at 8 x 1536 x 2048, N = 16: float32 1.54 -> 1.41 ms, bfloat16 1.44 -> 1.31 ms
    (benchmarks/NOTES.md, version 8).

    Where the backward runs by slices of states, the shortest multiple of their TL whose
    checkpoints take no more memory than ``u`` (N 128 in float32: 128 steps; forward +
    backward at 8 x 1536 x 2048 12.1 ms against 12.2 at 256 and 10.95 at 16, where the
    checkpoints take 8 times ``u``'s memory; ``chunk_size`` asks for that).
    """
    if not (TUNING["bwd_ring"] and TUNING["fwd_ring"]):
        return p.chunk_size
    if p.N > _slice_states():
        if not _by_state_slices(p):
            return p.chunk_size
        tl = _slice_plan(p, _slice_states())["tl"]
        per = -(-p.N * p.compute_dtype.itemsize // (tl * p.u.dtype.itemsize))
        return tl * per if tl % _RING_BLOCK == 0 and tl * per < min(p.chunk_size, p.L) else p.chunk_size
    plan = _plan(p, "bwd_ring")
    if plan is None or not _aligned16(p.u, p.delta, p.z, p.B, p.C):
        return p.chunk_size
    tl = plan["tl"]
    if (tl % _RING_BLOCK or tl >= min(p.chunk_size, p.L)
            or p.N * p.compute_dtype.itemsize > tl * p.u.dtype.itemsize):
        return p.chunk_size
    return tl


def selective_scan_backward(p, checkpoints, dout, dfinal_state, sequences=None):
    """Pullback of :func:`selective_scan_forward` on the GPU.

    Parameters
    ----------
    p : SelectiveScanProblem
        The problem the forward ran on.
    checkpoints : cupy.ndarray or None
        What the forward returned with ``save_checkpoints=True`` (any shape
        with ``n_chunks * batch * dim * N`` elements in that order); None:
        recomputed here by a forward pass.
    dout : cupy.ndarray, (batch, dim, L), ``p.io_dtype``, C-contiguous
        Cotangent of y.
    dfinal_state : cupy.ndarray, (batch, dim, N), ``p.compute_dtype``, or None
        Cotangent of the final state; (n_slots, dim, N) with ``sequences``, of which only
        the rows' last sequences' slots are read.
    sequences : Packing, optional
        The packed sequences the forward ran in place (its ``sequences``).

    Returns
    -------
    dict
        ``u``, ``delta``, ``z``: (batch, dim, L) in ``p.io_dtype``; ``A``:
        (dim, N); ``B``, ``C``: the shape of ``p.B`` / ``p.C``; ``D``,
        ``delta_bias``: (dim,); ``initial_state``: (batch, dim, N); all but the
        first three in ``p.compute_dtype``; None where the problem's array is None.
    """
    cp = p.xp
    _check_dtypes(p)
    batch, dim, L, N = p.batch, p.dim, p.L, p.N
    cdt = p.compute_dtype

    if checkpoints is None:
        _, _, checkpoints = selective_scan_forward(p, save_checkpoints=True)
    if checkpoints.size != p.n_chunks * batch * dim * N or checkpoints.dtype != cdt:
        raise ValueError(f"ssmkit GPU selective_scan backward: checkpoints of shape "
                         f"{checkpoints.shape} and dtype {checkpoints.dtype} do not come from "
                         f"this problem's forward ({p.n_chunks} x {batch} x {dim} x {N} {cdt})")
    checkpoints = cp.ascontiguousarray(checkpoints)
    dout = cp.ascontiguousarray(dout, dtype=p.io_dtype)
    restart = _restart_flags(p, sequences)
    if restart is not None:
        if not _aligned16(dout):  # (the ring backward must run)
            dout = dout.copy()
        if dfinal_state is not None:  # the rows' last sequences' cotangents
            dfinal_state = _packed.take_rows(cp, dfinal_state, _packed.row_final_slots(sequences))
    if dfinal_state is not None:
        dfinal_state = cp.ascontiguousarray(dfinal_state, dtype=cdt)
    lanes = _slice_lanes(p, dout)
    if lanes:
        return _backward_by_state_slices(p, checkpoints, dout, dfinal_state, lanes=lanes,
                                         restart=restart)
    du = cp.empty((batch, dim, L), dtype=p.io_dtype)
    ddelta = cp.empty((batch, dim, L), dtype=p.io_dtype)
    dz = cp.empty((batch, dim, L), dtype=p.io_dtype) if p.z is not None else None
    return _backward_kernels(p, checkpoints, dout, dfinal_state, du, ddelta, dz, restart=restart)


def _slice_states():
    """States per slice of the backward by state slices: the most the ring backward takes in
    one pass (``TUNING["bwd_ring_max_n"]``, 16 or 32)."""
    n = TUNING["bwd_ring_max_n"]
    if n not in (16, 32):
        raise ValueError(f"ssmkit: TUNING['bwd_ring_max_n'] is {n!r}; expected 16 or 32")
    return n


def _slice_problem(p, k):
    """The problem of states ``k * S`` .. (at most S of them, S = :func:`_slice_states`) of
    ``p``, its B, C and A cut to them (contiguous copies: B and C are per step, (batch, G, N,
    L)), D only in slice 0; with the slice's state range."""
    cp = p.xp
    S = _slice_states()
    sl = slice(k * S, min(p.N, (k + 1) * S))
    cut = (lambda X: None if X is None else cp.ascontiguousarray(X[..., sl]))  # noqa: E731
    return dataclasses.replace(
        p, A=cut(p.A), B=cp.ascontiguousarray(p.B[:, :, sl]), C=cp.ascontiguousarray(p.C[:, :, sl]),
        D=p.D if k == 0 else None, initial_state=cut(p.initial_state)), sl


def _slice_plan(p, n):
    """The ring backward's plan for ``n`` of ``p``'s states in float32 (u, B and C), as the
    slices run it (None where it does not apply)."""
    return _plan(p, "bwd_ring", N=n, dtypes=("float32", "float32"))


def _by_state_slices(p, *arrays):
    """Whether the backward runs as slices of states (:func:`_slice_lanes` > 0)."""
    return _slice_lanes(p, *arrays) > 0


def _slice_lanes(p, *arrays):
    """In how many lanes the backward runs as slices of :func:`_slice_states` states through
    the ring backward (0: not by slices; else ``TUNING["bwd_state_slices_lanes"]``, 1: one
    after another, 2: two at a time on two streams).

    By slices where: N >= ``TUNING["bwd_state_slices_from"]`` (and past the slice width;
    float32 u also from ``TUNING["bwd_state_slices_padded_from"]`` where the slices are fewer
    than ``ssm_scan_bwd``'s padded states in slice widths); u is float32, or 16-bit with
    ``TUNING["bwd_state_slices_16bit"]`` (the slices add their du, ddelta and dz in float32:
    16-bit problems run on float32 copies); the ring backward applies to every slice with a
    grid of at least ``TUNING["bwd_state_slices_min_warps"]`` warps per SM; and (float32) the
    problem's arrays and ``arrays`` are 16-byte aligned."""
    least = TUNING["bwd_state_slices_from"]
    padded = TUNING["bwd_state_slices_padded_from"]
    f32 = p.io_dtype == np.float32
    io_ok = f32 or (TUNING["bwd_state_slices_16bit"] and p.io_dtype.itemsize == 2)
    S = _slice_states()
    if f32 and padded and max(padded, S + 1) <= p.N < (least or p.N + 1):
        npt, nsplit = state_split(p.N, "float32")
        if -(-p.N // S) < npt * nsplit // S:
            least = p.N
    if not (least and TUNING["bwd_ring"] and p.N >= max(least, S + 1)
            and io_ok and p.groups(p.B) and p.groups(p.C)):
        return 0
    if p.io_dtype == np.float32 and not _aligned16(p.u, p.delta, p.z, p.B, p.C, *arrays):
        return 0
    plans = {n: _slice_plan(p, n)  # the slices' widths (N > S: one of them S)
             for n in {min(S, p.N - k) for k in range(0, p.N, S)}}
    if None in plans.values():
        return 0
    per_sm = (plans[S]["blocks"] * plans[S]["threads"] // 32
              / compiler.device_limits()["sm_count"])
    return max(1, int(TUNING["bwd_state_slices_lanes"])) if per_sm >= TUNING["bwd_state_slices_min_warps"] else 0


def _backward_by_state_slices(p, checkpoints, dout, dfinal_state, lanes=1, restart=None):
    """The backward of an N > S problem as ceil(N / S) ring backwards of S states each
    (S = :func:`_slice_states`, 16 or 32).

    The states are independent but for the sums over them (y's, and du's, ddelta's and dz's
    terms), which are linear in each state's part: slice k's kernel adds its parts of du,
    ddelta and dz into the outputs (``SSM_ACCUMULATE``) after slice 0 wrote them, with D's
    terms in slice 0 only. dA, dB, dC and the initial state's gradient are per state: each
    slice's goes into its states' columns; d delta_bias adds up.

    16-bit u: the slices run on float32 copies of u, delta, z, B, C and dout and add float32
    du, ddelta and dz, rounded to u's dtype once at the end (so no sum over the slices is
    rounded on the way).

    ``lanes`` 2: even slices add into du, ddelta and dz, odd ones (on a second stream, on
    the GPU) into a copy of their own, added to the first at the end; d delta_bias is summed
    slice by slice after both lanes. Deterministic either way: which slice adds where, and in
    what order, depends only on the problem."""
    cp = p.xp
    io = p.io_dtype
    narrow = io.itemsize == 2
    if narrow:
        f32 = np.dtype(np.float32)
        wide = (lambda X: None if X is None else X.astype(f32, copy=False))  # noqa: E731
        p = dataclasses.replace(p, u=wide(p.u), delta=wide(p.delta), z=wide(p.z), B=wide(p.B), C=wide(p.C))
        dout = wide(dout)
    du = cp.empty(p.u.shape, dtype=p.io_dtype)
    ddelta = cp.empty(p.u.shape, dtype=p.io_dtype)
    dz = cp.empty(p.u.shape, dtype=p.io_dtype) if p.z is not None else None
    ck = checkpoints.reshape(p.n_chunks, p.batch, p.dim, p.N)
    dA = cp.empty(p.A.shape, dtype=p.compute_dtype)
    dB = cp.empty(p.B.shape, dtype=p.compute_dtype)
    dC = cp.empty(p.C.shape, dtype=p.compute_dtype)
    dh0 = None if p.initial_state is None else cp.empty(p.initial_state.shape, dtype=p.compute_dtype)
    nslices = -(-p.N // _slice_states())
    lanes = max(1, min(lanes, nslices))
    acc = [(du, ddelta, dz)]
    if lanes == 2:
        acc.append(tuple(None if a is None else cp.empty(a.shape, dtype=a.dtype) for a in acc[0]))
    side = fork(cp) if lanes == 2 and cp.__name__ == "cupy" else None
    parts = []
    for k in range(nslices):
        lane = k % lanes
        with side if lane and side is not None else contextlib.nullcontext():
            sp, sl = _slice_problem(p, k)
            g = _backward_kernels(
                sp, ck[..., sl], dout,
                None if dfinal_state is None else cp.ascontiguousarray(dfinal_state[..., sl]),
                *acc[lane], accumulate=k >= lanes, ck_pitch=p.N, restart=restart)
            dA[:, sl] = g["A"]
            dB[:, :, sl] = g["B"]
            dC[:, :, sl] = g["C"]
            if dh0 is not None:
                dh0[..., sl] = g["initial_state"]
        parts.append(g)
    if side is not None:
        join(cp, side)
    if lanes == 2:
        for a, b in zip(*acc):
            if a is not None:
                a += b
    out = parts[0]
    if out["delta_bias"] is not None:
        for g in parts[1:]:
            out["delta_bias"] += g["delta_bias"]
    out.update(A=dA, B=dB, C=dC, initial_state=dh0)
    if narrow:
        out.update({k: None if out[k] is None else out[k].astype(io) for k in ("u", "delta", "z")})
    return out


def _backward_kernels(p, checkpoints, dout, dfinal_state, du, ddelta, dz, accumulate=False,
                      ck_pitch=None, restart=None):
    """The kernels of :func:`selective_scan_backward` (arguments checked, outputs allocated;
    ``accumulate``: the ring backward adds du, ddelta and dz into those outputs; ``ck_pitch``:
    the ring backward's checkpoints are ``ck_pitch`` floats apart per channel, from
    ``checkpoints``' first, instead of ``N``: a slice of a larger problem's; ``restart``:
    packed sequences' restart flags, :func:`_restart_flags`)."""
    cp = p.xp
    io, bc = _dtype_name(p.io_dtype), _dtype_name(p.bc_dtype)  # (checked by the caller)
    batch, dim, L, N = p.batch, p.dim, p.L, p.N
    cdt = p.compute_dtype
    gb, gc = p.groups(p.B), p.groups(p.C)
    plan = _plan(p, "bwd_ring") if TUNING["bwd_ring"] else None
    if plan is None or not _aligned16(p.u, p.delta, p.z, dout, p.B, p.C, du, ddelta, dz):
        if accumulate or restart is not None:
            raise AssertionError("the ring backward must run where its slices add up or "
                                 "packed sequences restart")
        plan = _plan(p, "bwd")
    if restart is not None and not _sums_in_ring(plan):
        raise AssertionError("packed sequences restart in the ring summaries only")
    ring = plan.get("ring", False)
    ch = plan["ch"]
    ntile = dim // ch
    nseg = plan["nseg"]
    # Per-segment partials (segment-major), summed below in a fixed order.
    dA_part = cp.empty((nseg * batch, dim, N), dtype=cdt)
    dB_part = cp.empty((batch, ntile, N, L) if gb else (nseg * batch, dim, N), dtype=cdt)
    dC_part = cp.empty((batch, ntile, N, L) if gc else (nseg * batch, dim, N), dtype=cdt)
    dD_part = cp.empty((nseg * batch, dim), dtype=cdt)
    dbias_part = cp.empty((nseg * batch, dim), dtype=cdt)
    dh0 = cp.empty((batch, dim, N), dtype=cdt) if p.initial_state is not None else None
    scratch = cp.empty((max(1, plan["scratch"]),), dtype=cdt)

    flags = ((_HAS_D if p.D is not None else 0) | (_HAS_Z if p.z is not None else 0)
             | (_HAS_BIAS if p.delta_bias is not None else 0)
             | (_SOFTPLUS if p.delta_softplus else 0)
             | (_HAS_H0 if p.initial_state is not None else 0)
             | (_HAS_DFINAL if dfinal_state is not None else 0)
             | (_ACCUMULATE if accumulate else 0))
    seeds = None
    if nseg > 1:
        # Summary of segments 1 .. nseg-1 in reverse time from a zero adjoint
        # (segment 0's outgoing adjoint is dh0, which the main kernel gives),
        # then the carry from the last segment (seeded by dfinal) to the first.
        sr = plan.get("sum_ring") if TUNING["bwd_sum_ring"] else None
        split = sr["split"] if sr is not None else 1
        local = cp.empty((nseg * split, batch, dim, N), dtype=cdt)
        sumdt = cp.empty((nseg * split, batch, dim), dtype=cdt)
        if sr is not None:  # (the ring backward's alignment checks cover its arrays)
            # in sub-segments, split of them a segment: those of segments 1 .. nseg-1 (sub-segments
            # split .. nseg split - 1); the carry from the last one gives the adjoint leaving
            # every sub-segment from split - 1 on (it never reads its first one's summary), of
            # which every split-th leaves a segment
            splan = dict(plan, **sr, nseg=nseg * split, blocks=batch * (dim // sr["ch"]) * (nseg - 1) * split)
            key = KernelKey("bwd_sum_ring", io, bc, sr["npt"], sr["nsplit"], True, True)
            args = (dout, p.delta, _ptr(p.z), p.A, _NULL, p.C, _NULL, _ptr(p.delta_bias), _NULL, _NULL, _NULL,
                    _NULL, local, sumdt) + _shape_args(p, splan, chunk=sr["seg_len"]) + (
                    np.int32(flags & (_HAS_Z | _HAS_BIAS | _SOFTPLUS)),) + _seg_args(splan, seg0=split) + (
                    _ptr(restart),)
            _launch(key, splan, args)
            cplan = dict(splan, nseg=nseg * split - split + 1)
            seeds = _carry(p, cplan, dfinal_state, local[split - 1:], sumdt[split - 1:], reverse=True)
            seeds = cp.ascontiguousarray(seeds[::split])
        else:
            key = KernelKey("bwd_sum", io, bc, plan["npt"], plan["nsplit"], gb > 0, gc > 0)
            args = (p.delta, _ptr(p.z), dout, p.A, p.C, _ptr(p.delta_bias), local, sumdt,
                    ) + _shape_args(p, plan) + (np.int32(flags),) + _seg_args(plan, seg0=1)
            _launch(key, dict(plan, blocks=plan["blocks"] // nseg * (nseg - 1), smem=plan["sum_smem"]), args)
            seeds = _carry(p, plan, dfinal_state, local, sumdt, reverse=True)

    key = KernelKey("bwd_ring" if ring else "bwd", io, bc, plan["npt"], plan["nsplit"], gb > 0, gc > 0)
    args = (p.u, p.delta, _ptr(p.z), dout, p.A, p.B, p.C, _ptr(p.D), _ptr(p.delta_bias),
            checkpoints, _ptr(dfinal_state), du, ddelta, _ptr(dz),
            dA_part, dB_part, dC_part, dD_part, dbias_part, _ptr(dh0), scratch,
            ) + _shape_args(p, plan) + (np.int32(flags), _ptr(seeds)) + _seg_args(plan)
    if ring:
        args += (np.int32(ck_pitch or N), _ptr(restart))
    _launch(key, plan, args)

    return {
        "u": du,
        "delta": ddelta,
        "z": dz,
        "A": dA_part.sum(axis=0),
        "B": _sum_tiles(p, dB_part, gb) if gb else dB_part.sum(axis=0),
        "C": _sum_tiles(p, dC_part, gc) if gc else dC_part.sum(axis=0),
        "D": None if p.D is None else dD_part.sum(axis=0),
        "delta_bias": None if p.delta_bias is None else dbias_part.sum(axis=0),
        "initial_state": dh0,
    }


def warmup(dtypes=("float32",), N=(16,), *, bc="io", per_step_bc=(True,), backward=True):
    """Compile kernels ahead of their first use (on the current device).

    Parameters
    ----------
    dtypes : sequence of dtype
        io dtypes of u/delta/z (float16, bfloat16, float32, float64).
    N : sequence of int
        State sizes.
    bc : {"io", "compute", "both"}
        Dtype of B/C: the io dtype, the compute dtype, or both.
    per_step_bc : sequence of bool
        True: B and C per step (batch, G, N, L); False: both (dim, N).
    backward : bool
        Also compile the backward kernels.

    Returns
    -------
    list of str
        The name expressions compiled.
    """
    done = []
    for dt in dtypes:
        io = _dtype_name(dt)
        bcs = {"io": [io], "compute": [_COMPUTE[io]], "both": [io, _COMPUTE[io]]}[bc]
        for n in N:
            npt, nsplit = state_split(int(n), _COMPUTE[io])
            for b in dict.fromkeys(bcs):
                for ps in per_step_bc:
                    for kind in (("fwd", "bwd") if backward else ("fwd",)):
                        name = name_expression(KernelKey(kind, io, b, npt, nsplit, bool(ps), bool(ps)))
                        compiler.get_kernel(SOURCE_FILE, name)
                        done.append(name)
    return done
