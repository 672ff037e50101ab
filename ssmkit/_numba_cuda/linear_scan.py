"""Numba CUDA kernels for the first-order linear recurrence, on CuPy arrays.

Every kernel works on the ``rows x L`` layout that :mod:`ssmkit._linear_scan`
prepares (any row stride; along ``L`` unit stride, or stride 0 for a broadcast
``a``). A reverse scan reads and writes column ``L - 1 - t`` at step ``t``, so
nothing is flipped in memory. The index arithmetic and combine order of each
kernel are written out in plain NumPy in :mod:`ssmkit._numba_cuda.scan_plan`
(same constants, same steps), which the CPU tests check; the GPU tests check
these kernels.

A pair ``(A, B)`` stands for the map ``h -> A h + B``; a thread first composes
``ITEMS`` consecutive steps, so shuffles and shared-memory traffic are paid
once per ``ITEMS`` steps. Complex values are shuffled as two real halves.

Kernels are built per (dtype, block scan) on first use, compiled by Numba on
first launch, and launched on CuPy's current stream. Nothing here runs at
``import ssmkit``.
"""

from __future__ import annotations

import functools
import types as pytypes

import numpy as np
from numba import cuda, types

from .scan_plan import CHUNK_TILES, SEQ_ROWS, THREADS, WARP, WARPS, items, seq_steps, tile_len

__all__ = ["linear_scan_rows", "choose_algorithm"]

_FULL_MASK = 0xFFFFFFFF


def _numba_type(dtype):
    return {"float32": types.float32, "float64": types.float64,
            "complex64": types.complex64, "complex128": types.complex128}[np.dtype(dtype).name]


@functools.lru_cache(maxsize=None)
def _kernels(dtype_name, block_scan_name):
    """The kernels for one compute dtype, with the block scan ``block_scan_name``."""
    vt = _numba_type(dtype_name)
    is_complex = np.dtype(dtype_name).kind == "c"
    rt = types.float64 if dtype_name in ("float64", "complex128") else types.float32
    itemsize = np.dtype(dtype_name).itemsize
    seq_s = seq_steps(itemsize)
    seq_shape = (SEQ_ROWS, seq_s + 1)  # one spare column against bank conflicts
    one, zero = vt(1), vt(0)
    ITEMS = items(itemsize)
    TILE = tile_len(itemsize)
    pad_every = 128 // itemsize
    stage_len = TILE + TILE // pad_every  # a tile in shared memory, padded (scan_plan.pad)

    # ---------------------------------------------------------------- elements
    if is_complex:
        @cuda.jit(device=True, inline=True)
        def shfl_up(v, d):
            re = cuda.shfl_up_sync(_FULL_MASK, v.real, d)
            im = cuda.shfl_up_sync(_FULL_MASK, v.imag, d)
            return vt(complex(re, im))
    else:
        @cuda.jit(device=True, inline=True)
        def shfl_up(v, d):
            return cuda.shfl_up_sync(_FULL_MASK, v, d)

    if is_complex:
        @cuda.jit(device=True, inline=True)
        def shfl_down(v, d):
            re = cuda.shfl_down_sync(_FULL_MASK, v.real, d)
            im = cuda.shfl_down_sync(_FULL_MASK, v.imag, d)
            return vt(complex(re, im))
    else:
        @cuda.jit(device=True, inline=True)
        def shfl_down(v, d):
            return cuda.shfl_down_sync(_FULL_MASK, v, d)

    @cuda.jit(device=True, inline=True)
    def pad(p):
        return p + p // pad_every

    @cuda.jit(device=True, inline=True)
    def column(t, L, rev):
        return L - 1 - t if rev else t

    # ---------------------------------------------------------------- block scans
    @cuda.jit(device=True, inline=True)
    def block_scan_kogge_stone(A, B, wA, wB):
        """This thread's exclusive prefix pair and the block total (scan_plan, same name)."""
        tid = cuda.threadIdx.x
        lane = tid % WARP
        warp = tid // WARP
        d = 1
        while d < WARP:
            Ap = shfl_up(A, d)
            Bp = shfl_up(B, d)
            if lane >= d:
                B = A * Bp + B
                A = A * Ap
            d *= 2
        if lane == WARP - 1:
            wA[warp] = A
            wB[warp] = B
        cuda.syncthreads()
        if warp == 0:
            xA = wA[lane] if lane < WARPS else one
            xB = wB[lane] if lane < WARPS else zero
            d = 1
            while d < WARP:
                Ap = shfl_up(xA, d)
                Bp = shfl_up(xB, d)
                if lane >= d:
                    xB = xA * Bp + xB
                    xA = xA * Ap
                d *= 2
            if lane < WARPS:
                wA[lane] = xA
                wB[lane] = xB
        cuda.syncthreads()
        eA = shfl_up(A, 1)
        eB = shfl_up(B, 1)
        if lane == 0:
            eA = one
            eB = zero
        if warp > 0:
            pA = wA[warp - 1]
            pB = wB[warp - 1]
            eB = eA * pB + eB
            eA = eA * pA
        tA = wA[WARPS - 1]
        tB = wB[WARPS - 1]
        cuda.syncthreads()  # wA/wB are reused by the next tile
        return eA, eB, tA, tB

    @cuda.jit(device=True, inline=True)
    def block_scan_blelloch(A, B, sA, sB):
        """Work-efficient exclusive scan in shared memory (scan_plan.block_scan_blelloch)."""
        tid = cuda.threadIdx.x
        sA[tid] = A
        sB[tid] = B
        d = 1
        while d < THREADS:
            cuda.syncthreads()
            idx = (tid + 1) * 2 * d - 1
            if idx < THREADS:
                lA = sA[idx - d]
                lB = sB[idx - d]
                rA = sA[idx]
                sB[idx] = rA * lB + sB[idx]
                sA[idx] = rA * lA
            d *= 2
        cuda.syncthreads()
        tA = sA[THREADS - 1]
        tB = sB[THREADS - 1]
        cuda.syncthreads()
        if tid == 0:
            sA[THREADS - 1] = one
            sB[THREADS - 1] = zero
        d = THREADS // 2
        while d >= 1:
            cuda.syncthreads()
            idx = (tid + 1) * 2 * d - 1
            if idx < THREADS:
                lA = sA[idx - d]
                lB = sB[idx - d]
                pA = sA[idx]
                pB = sB[idx]
                sA[idx - d] = pA
                sB[idx - d] = pB
                sA[idx] = lA * pA
                sB[idx] = lA * pB + lB
            d //= 2
        cuda.syncthreads()
        eA = sA[tid]
        eB = sB[tid]
        cuda.syncthreads()  # sA/sB are reused by the next tile
        return eA, eB, tA, tB

    block_scan = {"kogge_stone": block_scan_kogge_stone,
                  "blelloch": block_scan_blelloch}[block_scan_name]
    scratch = WARPS if block_scan_name == "kogge_stone" else THREADS

    # ---------------------------------------------------------------- tile steps
    @cuda.jit(device=True, inline=True)
    def stage(a, b, row, start, end, L, rev, sA, sB):
        """Coalesced loads of one tile into shared memory (identity past ``end``)."""
        tid = cuda.threadIdx.x
        for k in range(ITEMS):
            p = k * THREADS + tid
            t = start + p
            if t < end:
                c = column(t, L, rev)
                sA[pad(p)] = a[row, c]
                sB[pad(p)] = b[row, c]
            else:
                sA[pad(p)] = one
                sB[pad(p)] = zero
        cuda.syncthreads()

    @cuda.jit(device=True, inline=True)
    def thread_pair(sA, sB):
        tid = cuda.threadIdx.x
        A = one
        B = zero
        for j in range(ITEMS):
            s = pad(tid * ITEMS + j)
            x = sA[s]
            B = x * B + sB[s]
            A = x * A
        return A, B

    @cuda.jit(device=True, inline=True)
    def rescan_store(out, row, start, end, L, rev, h, sA, sB):
        """Each thread runs its ITEMS steps from ``h``; then coalesced stores."""
        tid = cuda.threadIdx.x
        for j in range(ITEMS):
            s = pad(tid * ITEMS + j)
            h = sA[s] * h + sB[s]
            sB[s] = h
        cuda.syncthreads()
        for k in range(ITEMS):
            p = k * THREADS + tid
            t = start + p
            if t < end:
                out[row, column(t, L, rev)] = sB[pad(p)]
        cuda.syncthreads()

    # ---------------------------------------------------------------- kernels
    @cuda.jit
    def segment_scan(a, b, h_in, out, seg_len, rev):
        """Block (row, seg) walks steps [seg seg_len, (seg+1) seg_len) tile by tile."""
        sA = cuda.shared.array(stage_len, vt)
        sB = cuda.shared.array(stage_len, vt)
        wA = cuda.shared.array(scratch, vt)
        wB = cuda.shared.array(scratch, vt)
        L = b.shape[1]
        n_segs = h_in.shape[1]
        block = np.int64(cuda.blockIdx.x)
        row = block // n_segs
        seg = block - row * n_segs
        h = h_in[row, seg]
        start = seg * seg_len
        end = min(L, start + seg_len)
        while start < end:
            tile_end = min(end, start + TILE)
            stage(a, b, row, start, tile_end, L, rev, sA, sB)
            A, B = thread_pair(sA, sB)
            eA, eB, tA, tB = block_scan(A, B, wA, wB)
            rescan_store(out, row, start, tile_end, L, rev, eA * h + eB, sA, sB)
            h = tA * h + tB
            start += TILE

    @cuda.jit
    def chunk_totals(a, b, aggA, aggB, chunk, rev):
        """Phase 1: block (row, chunk) reduces its chunk to one pair."""
        sA = cuda.shared.array(stage_len, vt)
        sB = cuda.shared.array(stage_len, vt)
        wA = cuda.shared.array(scratch, vt)
        wB = cuda.shared.array(scratch, vt)
        L = b.shape[1]
        n_chunks = aggA.shape[1]
        block = np.int64(cuda.blockIdx.x)
        row = block // n_chunks
        c = block - row * n_chunks
        start = c * chunk
        end = min(L, start + chunk)
        runA = one
        runB = zero
        while start < end:
            tile_end = min(end, start + TILE)
            stage(a, b, row, start, tile_end, L, rev, sA, sB)
            A, B = thread_pair(sA, sB)
            eA, eB, tA, tB = block_scan(A, B, wA, wB)
            runB = tA * runB + tB
            runA = tA * runA
            start += TILE
        if cuda.threadIdx.x == 0:
            aggA[row, c] = runA
            aggB[row, c] = runB

    @cuda.jit
    def chunk_carries(aggA, aggB, h0, carries):
        """Phase 2: one thread per row, the state entering each of its chunks."""
        row = cuda.grid(1)
        if row < carries.shape[0]:
            h = h0[row]
            for c in range(carries.shape[1]):
                carries[row, c] = h
                h = aggA[row, c] * h + aggB[row, c]

    # look-back state: per tile the published pair and inclusive state as reals
    # (real, imag for complex), read back through atomics so no stale L1 line is seen.
    parts = 2 if is_complex else 1

    @cuda.jit(device=True, inline=True)
    def publish(store, vid, slot, v):
        store[vid, slot * parts] = v.real
        if parts == 2:
            store[vid, slot * parts + 1] = v.imag

    @cuda.jit(device=True, inline=True)
    def fetch(store, vid, slot):
        re = cuda.atomic.add(store, (vid, slot * parts), rt(0))
        if parts == 2:
            im = cuda.atomic.add(store, (vid, slot * parts + 1), rt(0))
            return vt(complex(re, im))
        return vt(re)

    @cuda.jit(device=True, inline=True)
    def warp_reduce_older_first(A, B):
        """Lane 0 gets the composition of the lanes' pairs, lane 31 first (scan_plan)."""
        lane = cuda.threadIdx.x % WARP
        d = 1
        while d < WARP:
            QA = shfl_down(A, d)
            QB = shfl_down(B, d)
            if lane + d < WARP:
                B = A * QB + B
                A = A * QA
            d *= 2
        return A, B

    @cuda.jit
    def lookback(a, b, h0, out, flags, store, ticket, rev):
        """Single pass: tile pairs published, incoming states found by a warp's look-back."""
        sA = cuda.shared.array(stage_len, vt)
        sB = cuda.shared.array(stage_len, vt)
        wA = cuda.shared.array(scratch, vt)
        wB = cuda.shared.array(scratch, vt)
        sh_vid = cuda.shared.array(1, types.int64)
        sh_h = cuda.shared.array(1, vt)
        L = b.shape[1]
        tiles = (L + TILE - 1) // TILE
        tid = cuda.threadIdx.x
        lane = tid % WARP
        if tid == 0:  # tickets in launch order: every tile before ours has started
            sh_vid[0] = cuda.atomic.add(ticket, 0, 1)
        cuda.syncthreads()
        vid = np.int64(sh_vid[0])
        row = vid // tiles
        tile = vid - row * tiles
        start = tile * TILE
        end = min(L, start + TILE)
        stage(a, b, row, start, end, L, rev, sA, sB)
        A, B = thread_pair(sA, sB)
        eA, eB, tA, tB = block_scan(A, B, wA, wB)
        if tid < WARP:
            if tile == 0:
                if lane == 0:
                    h = h0[row]
                    publish(store, vid, 2, tA * h + tB)
                    cuda.threadfence()
                    cuda.atomic.exch(flags, vid, 2)
                    sh_h[0] = h
            else:
                if lane == 0:
                    publish(store, vid, 0, tA)
                    publish(store, vid, 1, tB)
                    cuda.threadfence()
                    cuda.atomic.exch(flags, vid, 1)
                first = vid - tile
                accA = one
                accB = zero
                top = vid - 1
                while True:
                    j = top - lane
                    f = cuda.atomic.add(flags, j, 0) if j >= first else 3
                    two = np.int64(cuda.ballot_sync(_FULL_MASK, f == 2))
                    k = cuda.popc((two & -two) - 1) if two != 0 else WARP
                    waiting = cuda.ballot_sync(_FULL_MASK, f == 0 and lane < k)
                    if waiting != 0:
                        continue  # a tile before the nearest inclusive state is unpublished
                    cuda.threadfence()
                    pA = one
                    pB = zero
                    if lane < k:
                        pA = fetch(store, j, 0)
                        pB = fetch(store, j, 1)
                    WA, WB = warp_reduce_older_first(pA, pB)
                    if k < WARP:
                        if lane == k:
                            sh_h[0] = fetch(store, j, 2)
                        cuda.syncwarp(_FULL_MASK)
                        if lane == 0:
                            x = sh_h[0]
                            h = accA * (WA * x + WB) + accB
                            publish(store, vid, 2, tA * h + tB)
                            cuda.threadfence()
                            cuda.atomic.exch(flags, vid, 2)
                            sh_h[0] = h
                        break
                    if lane == 0:  # only lane 0 holds the window's composition
                        accB = accA * WB + accB
                        accA = accA * WA
                    top -= WARP
        cuda.syncthreads()
        rescan_store(out, row, start, end, L, rev, eA * sh_h[0] + eB, sA, sB)

    @cuda.jit
    def sequential(a, b, h0, out, rev):
        """One thread per row; ``seq_s`` steps of SEQ_ROWS rows staged per round."""
        sA = cuda.shared.array(seq_shape, vt)
        sB = cuda.shared.array(seq_shape, vt)
        rows = b.shape[0]
        L = b.shape[1]
        tid = cuda.threadIdx.x
        r0 = np.int64(cuda.blockIdx.x) * SEQ_ROWS
        h = h0[r0 + tid] if r0 + tid < rows else zero
        t0 = 0
        while t0 < L:
            for k in range(seq_s):
                idx = k * SEQ_ROWS + tid
                r = idx // seq_s
                t = idx - r * seq_s
                if r0 + r < rows and t0 + t < L:
                    c = column(t0 + t, L, rev)
                    sA[r, t] = a[r0 + r, c]
                    sB[r, t] = b[r0 + r, c]
                else:
                    sA[r, t] = one
                    sB[r, t] = zero
            cuda.syncthreads()
            for t in range(seq_s):
                h = sA[tid, t] * h + sB[tid, t]
                sB[tid, t] = h
            cuda.syncthreads()
            for k in range(seq_s):
                idx = k * SEQ_ROWS + tid
                r = idx // seq_s
                t = idx - r * seq_s
                if r0 + r < rows and t0 + t < L:
                    out[r0 + r, column(t0 + t, L, rev)] = sB[r, t]
            cuda.syncthreads()
            t0 += seq_s

    return pytypes.SimpleNamespace(segment_scan=segment_scan, chunk_totals=chunk_totals,
                                   chunk_carries=chunk_carries, lookback=lookback,
                                   sequential=sequential, parts=parts, real_dtype=rt)


def choose_algorithm(rows, L, sm_count):
    """What ``algorithm="auto"`` runs for ``rows`` rows of ``L`` steps (see linear_scan's Notes)."""
    if rows < 4 * sm_count and L > 4096:
        return "lookback"
    if L <= 256 and rows >= 8192:
        return "sequential"
    return "kogge_stone"


@functools.lru_cache(maxsize=None)
def _sm_count(device_id):
    import cupy

    return cupy.cuda.Device(device_id).attributes["MultiProcessorCount"]


@functools.lru_cache(maxsize=64)
def _numba_stream(ptr):
    """Numba's handle on a CuPy stream (kept: making one per call costs host time)."""
    return cuda.external_stream(ptr)


def _unit_stride(cupy, x, allow_zero=False):
    """``x`` (rows, L) as is when it runs along L with unit (or, for a, zero) stride."""
    step = x.strides[1]
    if x.shape[1] <= 1 or step == x.itemsize or (allow_zero and step == 0):
        return x
    return cupy.ascontiguousarray(x)


def linear_scan_rows(a, b, h0, reverse, algorithm, *, chunk_tiles=CHUNK_TILES):
    """Scan each row of ``b`` with coefficients ``a`` on the GPU.

    Parameters
    ----------
    a, b : cupy.ndarray, (rows, L)
        The compute dtype (float32, float64, complex64 or complex128); rows may
        be strided, ``L`` is copied to unit stride when it is not (``a`` may
        have stride 0 along ``L``).
    h0 : cupy.ndarray, (rows,)
        State before the first step.
    reverse : bool
        Run from column ``L - 1`` down to 0.
    algorithm : str
        ``"auto"`` or one of the kernels (see :func:`ssmkit.linear_scan`).
    chunk_tiles : int
        Tiles per chunk of the ``"chunked"`` scan (small values force many
        chunk carries in tests).

    Returns
    -------
    h : cupy.ndarray, (rows, L)
        C-contiguous.
    final : cupy.ndarray, (rows,)
    """
    import cupy

    rows, L = b.shape
    cd = b.dtype
    if algorithm == "auto":
        algorithm = choose_algorithm(rows, L, _sm_count(b.device.id))
    a = _unit_stride(cupy, a, allow_zero=True)
    b = _unit_stride(cupy, b)
    h0 = cupy.ascontiguousarray(h0)
    out = cupy.empty((rows, L), cd)
    stream = _numba_stream(cupy.cuda.get_current_stream().ptr)

    def dev(x):  # zero-copy view; ordering is by the shared stream, so no sync
        return cuda.as_cuda_array(x, sync=False)

    rev = bool(reverse)
    A, B, O = dev(a), dev(b), dev(out)
    if algorithm == "sequential":
        k = _kernels(cd.name, "kogge_stone")
        k.sequential[(rows + SEQ_ROWS - 1) // SEQ_ROWS, SEQ_ROWS, stream](A, B, dev(h0), O, rev)
    elif algorithm in ("kogge_stone", "blelloch"):
        k = _kernels(cd.name, algorithm)
        k.segment_scan[rows, THREADS, stream](A, B, dev(h0.reshape(rows, 1)), O, np.int64(L), rev)
    elif algorithm == "chunked":
        k = _kernels(cd.name, "kogge_stone")
        chunk = int(chunk_tiles) * tile_len(cd.itemsize)
        n_chunks = -(-L // chunk)
        aggA = cupy.empty((rows, n_chunks), cd)
        aggB = cupy.empty((rows, n_chunks), cd)
        carries = cupy.empty((rows, n_chunks), cd)
        k.chunk_totals[rows * n_chunks, THREADS, stream](A, B, dev(aggA), dev(aggB),
                                                         np.int64(chunk), rev)
        k.chunk_carries[(rows + 127) // 128, 128, stream](dev(aggA), dev(aggB), dev(h0),
                                                          dev(carries))
        k.segment_scan[rows * n_chunks, THREADS, stream](A, B, dev(carries), O,
                                                         np.int64(chunk), rev)
    elif algorithm == "lookback":
        k = _kernels(cd.name, "kogge_stone")
        n = rows * (-(-L // tile_len(cd.itemsize)))
        flags = cupy.zeros(n, cupy.int32)
        store = cupy.empty((n, 3 * k.parts), k.real_dtype.name if hasattr(k.real_dtype, "name")
                           else str(k.real_dtype))
        ticket = cupy.zeros(1, cupy.int32)
        k.lookback[n, THREADS, stream](A, B, dev(h0), O, dev(flags), dev(store), dev(ticket), rev)
    else:
        raise ValueError(f"linear_scan: unknown algorithm {algorithm!r}")
    final = (out[:, 0] if rev else out[:, L - 1]).copy()
    return out, final
