"""Tensor-core kernels on the CPU, through the host emulation.

CI has no GPU; tests/emulation builds the CUDA sources as C++ with the warp-level operations
(mma.sync, movmatrix, shuffles, barriers) emulated per the PTX ISA, and checks:

* cc1d_fwd_mma and cc1d_bwd_mma against the float64 reference on a few lengths around the
  chunk and span edges (the full sweep: ``python3 tests/emulation/causal_conv1d/emu.py mma``),
  and cc1d_fwd_warp and cc1d_bwd_warp the same way (``emu.py warp``);
* the SSD forward and backward (ssmkit._gpu.ssd's host code, run with NumPy arrays, and its
  tensor-core kernels) on a few cases of ``tests/emulation/ssd/run_emu.py`` and
  ``run_emu_bwd.py`` (packed sequences, initial states, head runs; all cases: run the scripts),
  and the kernel text of ssd.cu's CUDA-core chunk products and of its per-chunk passes (chunk
  sums, layout, the backward's ddt pass) (``run_emu_mm.py``, every kind and column-group
  count, float and double); the float32 forward in one kernel of ssd_mma.cu (``run_emu_tf32.py``)
  against the reference and the chunked float32 kernels; and the 16-bit backward as one walk
  (``run_emu_walk.py``) against the reference and the chunked tensor-core backward;
* the selective scan's kernels and host code, forward and every gradient, on the quick case
  list of ``tests/emulation/selective_scan/sweep.py`` (groups, chunks of 1 to 1000 steps,
  small N, every option), its ring list (the shapes the ring forward kernels take, also as
  planned for a one-SM device: blocks of several warps; its ring_wide list, blocks of up to 512
  threads; its ring_npt8 list, 8 states per lane), its quads and n lists (N > 16) and
  its bwd_ring list (the ring backward over several tiles per chunk);
* packed sequences as the GPU runs them (``tests/emulation/selective_scan/packed.py``: in
  place and as padded rows, through the GPU module's host code and emulated kernels), and
  the row copies of ``cuda_src/packed_rows.cu`` built for the host against the CPU's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None,
                               reason="needs g++ (C++20) for the emulation")


def _conv_emulation():
    """tests/emulation/causal_conv1d/emu.py as a module."""
    pytest.importorskip("ml_dtypes")
    sys.path.insert(0, os.path.join(HERE, "emulation", "causal_conv1d"))
    try:
        import emu
    finally:
        sys.path.pop(0)
    return emu


@needs_gxx
def test_tensor_core_convolution_kernels_in_emulation():
    cases = [(8, 128), (130, 128), (264, 256), (390, 384), (1000, 384)]
    worst, fails = _conv_emulation().run_mma(["bfloat16"], [3, 8], cases=cases, asan=False)
    assert not fails, fails
    assert {name for _, name in worst} == {"y", "final", "dx", "dw", "db"}


@needs_gxx
def test_warp_convolution_kernels_in_emulation():
    cases = [(8, 256), (264, 256), (520, 512), (1536 + 24, 768)]
    worst, fails = _conv_emulation().run_warp(["bfloat16", "float32"], [3, 8], cases=cases,
                                              asan=False)
    assert not fails, fails
    assert {name for _, name in worst} == {"y", "final", "dx", "dw", "db"}


@needs_gxx
@pytest.mark.parametrize("script, cases, variant", [
    # bfloat16; packed sequences (cu_seqlens) with initial states, and with a sequence
    # without steps and no initial state (case 16, whole tiles)
    ("run_emu.py", ["0", "8", "4", "16"], None),
    # float16 seq_idx, initial state, D per channel; head runs; whole tiles (factored weights);
    # without z (dcum's first half from dC); whole tiles (case 21)
    ("run_emu_bwd.py", ["14", "18", "23", "21"], None),
    # ssd_chunk_mm and ssd_chunk_mm_tc (float and double) and the per-chunk passes, on every
    # product case: a length-1 row, chunks of 8 with sequence ends, float64 with head groups
    # and a sequence end, 4 tiles per chunk (case 7), runs of heads (case 9)
    ("run_emu_mm.py", [], None),
    # the float32 forward in one kernel (ssd_tf32_fwd) against the reference and the chunked
    # float32 kernels: a partial column tile with N 68, a slow decay (case 5, chunks of 5 steps)
    ("run_emu_tf32.py", ["3", "7", "5"], None),
    # the float32 backward with its backward walk (ssd_tf32_bwd: NW 64 and 128) and with its
    # per-step pass in GB's epilogue (8 and 16 n-tiles) against the reference and the
    # unfused pass
    ("run_emu_tf32_bwd.py", ["0", "5", "3"], None),
    # the 16-bit backward as one walk (ssd_mma_bwd, where it applies: MMA_BWD_WALK): chunks of
    # 32 with initial states, of 64 with four heads, of 256 in float16 without D
    ("run_emu_walk.py", ["5", "0", "6"], None),
    # allow_tf32: the float32 kernels built with one TF32 product each, forward and backward,
    # within TF32's bounds and less accurate than 3 x TF32 (so the variant did run)
    ("run_emu_tf32.py", ["4", "5", "2"], "tf32"),
    ("run_emu_tf32_bwd.py", ["0", "5", "3"], "tf32"),
])
def test_ssd_in_emulation(script, cases, variant):
    pytest.importorskip("ml_dtypes")
    env = dict(os.environ, ASAN="0")
    if variant == "tf32":
        env["SSD_EMU_TF32_PASSES"] = "1"
    run = subprocess.run([sys.executable, os.path.join(HERE, "emulation", "ssd", script), *cases],
                         capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0 and "ALL OK" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]


@needs_gxx
# ring: the ring forward kernels' shapes; one SM: the planner's larger blocks, so backward
# blocks of several warps; quads: the backward's B/C staging and dB/dC partials 4 steps at a
# time (N > 16, aligned rows); n: N from 17 to 512 (the swizzled B/C tiles at 4, 8 and 16
# states per lane); bwd_ring: the ring backward with several tiles per chunk (pass A's
# sub-block states in scratch), also with time split into up to 3 segments (the ring
# summaries, in 2 sub-segments each where they divide: the backward's walks its tiles last to
# first); slices: N > 16 as slices of 16 states through the ring backward, time split too;
# ring_wide: the ring forward in blocks of up to 512 threads, time split too; ring_npt8: the
# ring forward and its summary at 8 states per lane (2 to 16 lanes a channel, blocks of 384
# threads), time split too; bwd_ring32: the ring backward at N 17 to 32 in one pass (8 lanes a
# channel) and N > 32 as slices of 32, time split too
@pytest.mark.parametrize("which,sm,segs", [("quick", "132", ""), ("ring", "132", ""), ("ring", "1", ""),
                                           ("ring_wide", "1", "2"), ("ring_npt8", "1", "3"),
                                           ("quads", "132", ""), ("n", "132", ""), ("bwd_ring", "1", ""),
                                           ("bwd_ring", "1", "3"), ("slices", "1", "3"),
                                           ("bwd_ring32", "1", "3")])
def test_selective_scan_in_emulation(which, sm, segs):
    pytest.importorskip("ml_dtypes")
    env = dict(os.environ, ASAN="0", SM=sm)  # (the full sweeps run under AddressSanitizer by hand)
    if segs:  # (and the summaries in sub-segments: the default 8 seldom divides these short segments)
        env.update(SEGS=segs, MINSEG="1", SUM_SPLIT="2")
    script = os.path.join(HERE, "emulation", "selective_scan", "sweep.py")
    run = subprocess.run([sys.executable, script, which], capture_output=True, text=True,
                         timeout=900, env=env)
    assert run.returncode == 0 and "ALL OK" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]


@needs_gxx
def test_packed_sequences_as_the_gpu_runs_them_in_emulation():
    """The GPU's ways with packed sequences (padded rows of ordinary scans; restarts in place
    in the ring kernels) through the GPU module's host code and its emulated kernels, float32
    and bfloat16, against the reference (tests/emulation/selective_scan/packed.py: forward
    and every gradient; one SM, so that the small cases' grids take the ring backward and
    its slices, and in place runs both ways in five cases; with every sequence's final
    state, the forward in place and ssm_sequence_states in the two cu_seqlens cases)."""
    pytest.importorskip("ml_dtypes")
    script = os.path.join(HERE, "emulation", "selective_scan", "packed.py")
    run = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=900,
                         env=dict(os.environ, ASAN="0", SM="1"))
    out = run.stdout
    assert run.returncode == 0 and "BAD" not in out and out.count("OK ") == 16, \
        out[-3000:] + run.stderr[-3000:]
    assert (out.count("(in place: in place)") == 5 and out.count("(padded, 3 calls)") == 7
            and out.count("(in place, all final states: in place: the forward alone") == 2), out


_PACKED_ROWS_HOST = r'''
#include <cstdint>
struct emu_dim3 { unsigned x = 0, y = 0, z = 0; };
static emu_dim3 blockIdx, threadIdx, blockDim;
#define __global__ static
#define __restrict__ __restrict
%s
// One block after another, each thread in turn: the kernels have no barrier, and each
// element is written by one thread only.
template <typename T>
static void run(int pack, const void* src, void* dst, const long long* row,
                const long long* off, const int* lo, const int* hi, int R, int C, long long L,
                int Lp, unsigned threads) {
    blockDim.x = threads;
    for (long long b = 0; b < (long long)R * C; ++b) {
        blockIdx.x = (unsigned)b;
        for (unsigned t = 0; t < threads; ++t) {
            threadIdx.x = t;
            if (pack) ssm_pack_rows<T>((const T*)src, (T*)dst, row, off, lo, hi, C, L, Lp);
            else ssm_unpack_rows<T>((const T*)src, (T*)dst, row, off, lo, hi, C, L, Lp);
        }
    }
}
extern "C" void emu_rows(int pack, int itemsize, const void* src, void* dst,
                         const long long* row, const long long* off, const int* lo,
                         const int* hi, int R, int C, long long L, int Lp, unsigned threads) {
    if (itemsize == 2) run<unsigned short>(pack, src, dst, row, off, lo, hi, R, C, L, Lp, threads);
    if (itemsize == 4) run<unsigned int>(pack, src, dst, row, off, lo, hi, R, C, L, Lp, threads);
    if (itemsize == 8)
        run<unsigned long long>(pack, src, dst, row, off, lo, hi, R, C, L, Lp, threads);
}
'''


@needs_gxx
def test_packed_rows_kernels_in_emulation(tmp_path):
    """cuda_src/packed_rows.cu (the GPU's copies for packed sequences), built for the host,
    against the CPU's copies (ssmkit/_cpu/packed.py) on the rows that plans of random packed
    sequences give, at every element size, with the GPU's block size."""
    import ctypes

    import numpy as np

    from ssmkit import _selective_scan_packed as packed
    from ssmkit._cpu import packed as cpu
    from ssmkit._gpu import compiler, packed as gpu

    src = tmp_path / "packed_rows.cpp"
    src.write_text(_PACKED_ROWS_HOST % compiler.kernel_source(gpu.SOURCE_FILE))
    lib_path = tmp_path / "packed_rows.so"
    subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-o", str(lib_path), str(src)],
                   check=True)
    lib = ctypes.CDLL(str(lib_path))
    rng = np.random.default_rng(0)
    checked = 0
    for trial in range(12):
        batch, L, C = int(rng.integers(1, 4)), int(rng.integers(1, 300)), int(rng.integers(1, 5))
        labels = np.cumsum(rng.random((batch, L)) < rng.choice([0.02, 0.1, 0.5]), axis=1)
        plan = packed.plan(labels, None, batch, L, bool(trial % 2), align=8)
        for g in plan.groups or []:
            for dtype in (np.uint16, np.uint32, np.uint64):
                full = rng.integers(1, 1000, (batch, C, L)).astype(dtype)
                R, Lp = g.rows.size, g.length
                want = np.empty((R, C, Lp), dtype)
                cpu.pack_rows(full, want, g.rows, g.off, g.lo, g.hi)
                got = np.full((R, C, Lp), 7, dtype)
                args = [ctypes.c_void_p(a.ctypes.data) for a in (g.rows, g.off, g.lo, g.hi)]
                dims = [ctypes.c_int(R), ctypes.c_int(C), ctypes.c_longlong(L), ctypes.c_int(Lp),
                        ctypes.c_uint(gpu.THREADS)]
                lib.emu_rows(1, full.itemsize, ctypes.c_void_p(full.ctypes.data),
                             ctypes.c_void_p(got.ctypes.data), *args, *dims)
                np.testing.assert_array_equal(got, want)
                back_want = np.zeros_like(full)
                cpu.unpack_rows(want, back_want, g.rows, g.off, g.lo, g.hi)
                back = np.zeros_like(full)
                lib.emu_rows(0, full.itemsize, ctypes.c_void_p(want.ctypes.data),
                             ctypes.c_void_p(back.ctypes.data), *args, *dims)
                np.testing.assert_array_equal(back, back_want)
                checked += 1
    assert checked > 20
