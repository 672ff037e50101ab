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

Two data layouts. *Blocked* (rows unit-stride and 16-byte aligned, ``L`` a
multiple of the vector width): global memory is read and written as 16-byte
vectors (``load_vec``/``store_vec``, one ``ld/st.global.v4.f32`` or
``.v2.f64``); the tile kernels load a thread's ITEMS consecutive steps straight
into registers (NVEC = 4 vectors per array), with no shared-memory staging, and
the sequential kernel stages its rounds through vectors. *Staged* (any other
input): element loads, coalesced across the block, transposed through shared
memory. Both compose the same steps in the same order.

Kernels are built per (dtype, block scan, layout) on first use, compiled by
Numba on first launch, and launched on CuPy's current stream. Nothing here runs
at ``import ssmkit``.
"""

from __future__ import annotations

import functools
import os
import types as pytypes

import numpy as np
from numba import cuda, types

from .scan_plan import (CHUNK_TILES, SEQ_ROWS, THREADS, VECTOR_BYTES, WARP, WARPS, items,
                        seq_steps, tile_len, vector_width)

__all__ = ["linear_scan_rows", "choose_algorithm"]

_FULL_MASK = 0xFFFFFFFF
_SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"


def _real_parts(dtype):
    """(real Numba type, reals per 16-byte vector) of an array's element type."""
    real = dtype.underlying_float if isinstance(dtype, types.Complex) else dtype
    return real, VECTOR_BYTES // (real.bitwidth // 8)


if _SIMULATOR:  # the simulator runs kernels as Python: the same values, element by element
    @cuda.jit(device=True)
    def load_vec(arr, row, col):
        """The 16 bytes from ``arr[row, col]`` on, as a tuple of reals."""
        n = VECTOR_BYTES // arr.dtype.itemsize
        if arr.dtype.kind == "c":
            return tuple(p for i in range(n) for p in (arr[row, col + i].real,
                                                       arr[row, col + i].imag))
        return tuple(arr[row, col + i] for i in range(n))

    @cuda.jit(device=True)
    def store_vec(arr, row, col, reals):
        n = VECTOR_BYTES // arr.dtype.itemsize
        for i in range(n):
            if arr.dtype.kind == "c":
                arr[row, col + i] = complex(reals[2 * i], reals[2 * i + 1])
            else:
                arr[row, col + i] = reals[i]
else:
    from llvmlite import ir
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    def _vector_pointer(context, builder, aryty, ary_val, row, row_ty, col, col_ty):
        """Global-space pointer to the 16-byte vector that starts at ``arr[row, col]``."""
        ary = context.make_array(aryty)(context, builder, ary_val)
        inds = [context.cast(builder, row, row_ty, types.intp),
                context.cast(builder, col, col_ty, types.intp)]
        ptr = cgutils.get_item_pointer2(context, builder, data=ary.data,
                                        shape=cgutils.unpack_tuple(builder, ary.shape),
                                        strides=cgutils.unpack_tuple(builder, ary.strides),
                                        layout=aryty.layout, inds=inds)
        real, n = _real_parts(aryty.dtype)
        vec = ir.VectorType(context.get_value_type(real), n)
        return builder.addrspacecast(builder.bitcast(ptr, vec.as_pointer()),
                                     ir.PointerType(vec, 1)), n

    @intrinsic
    def load_vec(typingctx, arr, row, col):
        """The 16 bytes from ``arr[row, col]`` on (16-byte aligned), one ``ld.global.v*``."""
        real, n = _real_parts(arr.dtype)
        rt = types.UniTuple(real, n)

        def codegen(context, builder, sig, args):
            ptr, n = _vector_pointer(context, builder, sig.args[0], args[0], args[1],
                                     sig.args[1], args[2], sig.args[2])
            v = builder.load(ptr, align=VECTOR_BYTES)
            parts = [builder.extract_element(v, ir.Constant(ir.IntType(32), i))
                     for i in range(n)]
            return context.make_tuple(builder, rt, parts)

        return rt(arr, row, col), codegen

    @intrinsic
    def store_vec(typingctx, arr, row, col, reals):
        """Store the reals as the 16 bytes from ``arr[row, col]`` on, one ``st.global.v*``."""
        real, n = _real_parts(arr.dtype)
        if not (isinstance(reals, types.UniTuple) and reals.count == n and reals.dtype == real):
            return None

        def codegen(context, builder, sig, args):
            ptr, n = _vector_pointer(context, builder, sig.args[0], args[0], args[1],
                                     sig.args[1], args[2], sig.args[2])
            v = ir.Constant(ptr.type.pointee, ir.Undefined)
            for i, x in enumerate(cgutils.unpack_tuple(builder, args[3], n)):
                v = builder.insert_element(v, x, ir.Constant(ir.IntType(32), i))
            builder.store(v, ptr, align=VECTOR_BYTES)
            return context.get_dummy_value()

        return types.void(arr, row, col, reals), codegen


def _numba_type(dtype):
    return {"float32": types.float32, "float64": types.float64,
            "complex64": types.complex64, "complex128": types.complex128}[np.dtype(dtype).name]


@functools.lru_cache(maxsize=None)
def _kernels(dtype_name, block_scan_name, blocked=False):
    """The kernels for one compute dtype, with the block scan ``block_scan_name``.

    ``blocked``: the tile kernels load and store each thread's ITEMS consecutive
    steps directly, as 16-byte vectors, and keep them in registers (no shared
    memory staging); only for unit-stride, 16-byte aligned rows whose length is
    a multiple of the vector width (see :func:`_blocked_ok`).
    """
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
    VEC = vector_width(itemsize)  # steps per 16-byte vector
    NVEC = ITEMS // VEC  # vectors per thread and array (4 for every dtype)
    if blocked:
        stage_len = 1  # tiles live in registers

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
        """Coalesced loads of one tile into shared memory (identity past ``end``).

        All of a thread's loads are issued before any is stored, so each thread
        has 2 ITEMS loads in flight; only a partial last tile tests each position.
        """
        tid = cuda.threadIdx.x
        va = cuda.local.array(ITEMS, vt)
        vb = cuda.local.array(ITEMS, vt)
        if start + TILE <= end:
            for k in range(ITEMS):
                c = column(start + k * THREADS + tid, L, rev)
                va[k] = a[row, c]
                vb[k] = b[row, c]
        else:
            for k in range(ITEMS):
                t = start + k * THREADS + tid
                if t < end:
                    c = column(t, L, rev)
                    va[k] = a[row, c]
                    vb[k] = b[row, c]
                else:
                    va[k] = one
                    vb[k] = zero
        for k in range(ITEMS):
            p = k * THREADS + tid
            sA[pad(p)] = va[k]
            sB[pad(p)] = vb[k]
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

    # ---------------------------------------------------------------- blocked tiles
    # Thread tid owns tile positions tid ITEMS + j (j < ITEMS), loaded as NVEC
    # vectors of VEC steps; vector v holds steps p = tid ITEMS + v VEC + i. A
    # forward scan reads them from column start + p (vector at column
    # start + tid ITEMS + v VEC); a reverse scan from column L - 1 - (start + p),
    # so the vector starts at column L - (start + tid ITEMS + v VEC) - VEC and its
    # element i is step v VEC + VEC - 1 - i. All indices below are constants
    # after unrolling, so the items stay in registers.
    if is_complex and VEC == 2:  # complex64: (re0, im0, re1, im1)
        @cuda.jit(device=True, inline=True)
        def unpack(x, v, r, rev):
            if rev:
                x[2 * v + 1] = vt(complex(r[0], r[1]))
                x[2 * v] = vt(complex(r[2], r[3]))
            else:
                x[2 * v] = vt(complex(r[0], r[1]))
                x[2 * v + 1] = vt(complex(r[2], r[3]))

        @cuda.jit(device=True, inline=True)
        def pack(x, v, rev):
            if rev:
                return (x[2 * v + 1].real, x[2 * v + 1].imag, x[2 * v].real, x[2 * v].imag)
            return (x[2 * v].real, x[2 * v].imag, x[2 * v + 1].real, x[2 * v + 1].imag)
    elif is_complex:  # complex128: one value per vector
        @cuda.jit(device=True, inline=True)
        def unpack(x, v, r, rev):
            x[v] = vt(complex(r[0], r[1]))

        @cuda.jit(device=True, inline=True)
        def pack(x, v, rev):
            return (x[v].real, x[v].imag)
    elif VEC == 4:  # float32
        @cuda.jit(device=True, inline=True)
        def unpack(x, v, r, rev):
            if rev:
                x[4 * v + 3] = r[0]
                x[4 * v + 2] = r[1]
                x[4 * v + 1] = r[2]
                x[4 * v] = r[3]
            else:
                x[4 * v] = r[0]
                x[4 * v + 1] = r[1]
                x[4 * v + 2] = r[2]
                x[4 * v + 3] = r[3]

        @cuda.jit(device=True, inline=True)
        def pack(x, v, rev):
            if rev:
                return (x[4 * v + 3], x[4 * v + 2], x[4 * v + 1], x[4 * v])
            return (x[4 * v], x[4 * v + 1], x[4 * v + 2], x[4 * v + 3])
    else:  # float64
        @cuda.jit(device=True, inline=True)
        def unpack(x, v, r, rev):
            if rev:
                x[2 * v + 1] = r[0]
                x[2 * v] = r[1]
            else:
                x[2 * v] = r[0]
                x[2 * v + 1] = r[1]

        @cuda.jit(device=True, inline=True)
        def pack(x, v, rev):
            if rev:
                return (x[2 * v + 1], x[2 * v])
            return (x[2 * v], x[2 * v + 1])

    @cuda.jit(device=True, inline=True)
    def vector_column(p, L, rev):
        """First column of the vector holding steps p .. p + VEC - 1 (p a multiple of VEC)."""
        return L - p - VEC if rev else p

    @cuda.jit(device=True, inline=True)
    def load_blocked(a, b, row, start, end, L, rev, xa, xb):
        """This thread's ITEMS steps of the tile into xa, xb (identity past ``end``)."""
        p0 = start + cuda.threadIdx.x * ITEMS
        for v in range(NVEC):
            p = p0 + v * VEC
            if p < end:  # end is a multiple of VEC: a vector is wholly in or out
                c = vector_column(p, L, rev)
                unpack(xa, v, load_vec(a, row, c), rev)
                unpack(xb, v, load_vec(b, row, c), rev)
            else:
                for i in range(VEC):
                    xa[v * VEC + i] = one
                    xb[v * VEC + i] = zero

    @cuda.jit(device=True, inline=True)
    def store_blocked(out, row, start, end, L, rev, h, xa, xb):
        """Run this thread's ITEMS steps from ``h`` and store them, vector by vector."""
        for j in range(ITEMS):
            h = xa[j] * h + xb[j]
            xb[j] = h
        p0 = start + cuda.threadIdx.x * ITEMS
        for v in range(NVEC):
            p = p0 + v * VEC
            if p < end:
                store_vec(out, row, vector_column(p, L, rev), pack(xb, v, rev))

    # ---------------------------------------------------------------- either layout
    if blocked:
        @cuda.jit(device=True, inline=True)
        def tile_pair(a, b, row, start, end, L, rev, sA, sB, xa, xb):
            """This thread's composed pair of its ITEMS steps of the tile."""
            load_blocked(a, b, row, start, end, L, rev, xa, xb)
            A = one
            B = zero
            for j in range(ITEMS):
                B = xa[j] * B + xb[j]
                A = xa[j] * A
            return A, B

        @cuda.jit(device=True, inline=True)
        def tile_store(out, row, start, end, L, rev, h, sA, sB, xa, xb):
            store_blocked(out, row, start, end, L, rev, h, xa, xb)
    else:
        @cuda.jit(device=True, inline=True)
        def tile_pair(a, b, row, start, end, L, rev, sA, sB, xa, xb):
            stage(a, b, row, start, end, L, rev, sA, sB)
            return thread_pair(sA, sB)

        @cuda.jit(device=True, inline=True)
        def tile_store(out, row, start, end, L, rev, h, sA, sB, xa, xb):
            rescan_store(out, row, start, end, L, rev, h, sA, sB)

    @cuda.jit(device=True, inline=True)
    def walk_span(a, b, out, span, n_spans, h, rev, store):
        """Block (row, part) = blockIdx.x walks steps [part span, (part+1) span) tile by
        tile: returns the row, the part and the span's composed pair; with ``store``, also
        writes every step's state, ``h[row, part]`` entering the span."""
        sA = cuda.shared.array(stage_len, vt)
        sB = cuda.shared.array(stage_len, vt)
        wA = cuda.shared.array(scratch, vt)
        wB = cuda.shared.array(scratch, vt)
        xa = cuda.local.array(ITEMS, vt)
        xb = cuda.local.array(ITEMS, vt)
        L = b.shape[1]
        block = np.int64(cuda.blockIdx.x)
        row = block // n_spans
        part = block - row * n_spans
        start = part * span
        end = min(L, start + span)
        hs = h[row, part] if store else zero
        runA = one
        runB = zero
        while start < end:
            tile_end = min(end, start + TILE)
            A, B = tile_pair(a, b, row, start, tile_end, L, rev, sA, sB, xa, xb)
            eA, eB, tA, tB = block_scan(A, B, wA, wB)
            if store:
                tile_store(out, row, start, tile_end, L, rev, eA * hs + eB, sA, sB, xa, xb)
                hs = tA * hs + tB
            runB = tA * runB + tB
            runA = tA * runA
            start += TILE
        return row, part, runA, runB

    # ---------------------------------------------------------------- kernels
    @cuda.jit
    def segment_scan(a, b, h_in, out, seg_len, rev):
        """Block (row, seg) walks steps [seg seg_len, (seg+1) seg_len) tile by tile."""
        walk_span(a, b, out, seg_len, h_in.shape[1], h_in, rev, True)

    @cuda.jit
    def chunk_totals(a, b, aggA, aggB, chunk, rev):
        """Phase 1: block (row, chunk) reduces its chunk to one pair."""
        row, c, runA, runB = walk_span(a, b, aggA, chunk, aggA.shape[1], aggA, rev, False)
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
        xa = cuda.local.array(ITEMS, vt)
        xb = cuda.local.array(ITEMS, vt)
        A, B = tile_pair(a, b, row, start, end, L, rev, sA, sB, xa, xb)
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
        tile_store(out, row, start, end, L, rev, eA * sh_h[0] + eB, sA, sB, xa, xb)

    @cuda.jit
    def sequential_staged(a, b, h0, out, rev):
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
            va = cuda.local.array(seq_s, vt)
            vb = cuda.local.array(seq_s, vt)
            for k in range(seq_s):  # every load issued before any store (loads in flight)
                idx = k * SEQ_ROWS + tid
                r = idx // seq_s
                t = idx - r * seq_s
                if r0 + r < rows and t0 + t < L:
                    c = column(t0 + t, L, rev)
                    va[k] = a[r0 + r, c]
                    vb[k] = b[r0 + r, c]
                else:
                    va[k] = one
                    vb[k] = zero
            for k in range(seq_s):
                idx = k * SEQ_ROWS + tid
                r = idx // seq_s
                t = idx - r * seq_s
                sA[r, t] = va[k]
                sB[r, t] = vb[k]
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

    SEQ_VECS = seq_s // VEC  # 16-byte vectors per row and round (8 for every dtype)

    @cuda.jit
    def sequential_blocked(a, b, h0, out, rev):
        """As ``sequential_staged``, its rounds read and written as 16-byte vectors.

        Thread tid handles vectors idx = k SEQ_ROWS + tid: row r = idx // SEQ_VECS,
        vector q = idx % SEQ_VECS, steps t0 + q VEC + (0 .. VEC-1) of that row,
        kept in va[k VEC + j] and staged to sA[r, q VEC + j].
        """
        sA = cuda.shared.array(seq_shape, vt)
        sB = cuda.shared.array(seq_shape, vt)
        rows = b.shape[0]
        L = b.shape[1]
        tid = cuda.threadIdx.x
        r0 = np.int64(cuda.blockIdx.x) * SEQ_ROWS
        h = h0[r0 + tid] if r0 + tid < rows else zero
        va = cuda.local.array(seq_s, vt)
        vb = cuda.local.array(seq_s, vt)
        t0 = 0
        while t0 < L:
            for k in range(SEQ_VECS):  # every load issued before any store (loads in flight)
                idx = k * SEQ_ROWS + tid
                r = idx // SEQ_VECS
                p = t0 + (idx - r * SEQ_VECS) * VEC
                if r0 + r < rows and p < L:  # L is a multiple of VEC: whole vectors
                    c = vector_column(p, L, rev)
                    unpack(va, k, load_vec(a, r0 + r, c), rev)
                    unpack(vb, k, load_vec(b, r0 + r, c), rev)
                else:
                    for j in range(VEC):
                        va[k * VEC + j] = one
                        vb[k * VEC + j] = zero
            for k in range(SEQ_VECS):
                idx = k * SEQ_ROWS + tid
                r = idx // SEQ_VECS
                q = idx - r * SEQ_VECS
                for j in range(VEC):
                    sA[r, q * VEC + j] = va[k * VEC + j]
                    sB[r, q * VEC + j] = vb[k * VEC + j]
            cuda.syncthreads()
            for t in range(seq_s):
                h = sA[tid, t] * h + sB[tid, t]
                sB[tid, t] = h
            cuda.syncthreads()
            for k in range(SEQ_VECS):
                idx = k * SEQ_ROWS + tid
                r = idx // SEQ_VECS
                q = idx - r * SEQ_VECS
                p = t0 + q * VEC
                if r0 + r < rows and p < L:
                    for j in range(VEC):
                        vb[k * VEC + j] = sB[r, q * VEC + j]
                    store_vec(out, r0 + r, vector_column(p, L, rev), pack(vb, k, rev))
            cuda.syncthreads()
            t0 += seq_s

    sequential = sequential_blocked if blocked else sequential_staged

    return pytypes.SimpleNamespace(segment_scan=segment_scan, chunk_totals=chunk_totals,
                                   chunk_carries=chunk_carries, lookback=lookback,
                                   sequential=sequential, parts=parts, real_dtype=rt)


def choose_algorithm(rows, L, sm_count, itemsize=8):
    """What ``algorithm="auto"`` runs for ``rows`` rows of ``L`` steps (see linear_scan's Notes).

    Few long rows need the work split along L: look-back (one pass, where the
    chunked scan reads twice). Many short rows: one thread per row. Between,
    one block per row (kogge_stone), with no inter-block traffic: with the
    16-byte vector layout it measured fastest in float32 and complex64 alike
    (75% and 81% of copy bandwidth at 16384 x 16384, benchmarks/LINEAR_SCAN.md).
    ``itemsize`` is kept for rules that depend on the dtype.
    """
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


def _blocked_ok(x, L):
    """Whether every row of ``x`` (rows, L) reads as whole, aligned 16-byte vectors.

    Needs unit stride along L (not a broadcast ``a``), L a multiple of the
    vector width, and the first element and the row stride 16-byte aligned.
    """
    rows, width = x.shape[0], VECTOR_BYTES // x.itemsize
    return (L % width == 0 and x.strides[1] == x.itemsize
            and (rows <= 1 or x.strides[0] % VECTOR_BYTES == 0)
            and x.data.ptr % VECTOR_BYTES == 0)


def linear_scan_rows(a, b, h0, reverse, algorithm, *, chunk_tiles=CHUNK_TILES, blocked=None):
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
    blocked : bool or None
        Tile kernels in the blocked layout (16-byte vector loads and stores,
        a thread's steps in registers). None: whenever ``a``, ``b`` and the
        output allow it (:func:`_blocked_ok`); False forces the shared-memory
        staged layout (tests compare both).

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
        algorithm = choose_algorithm(rows, L, _sm_count(b.device.id), cd.itemsize)
    a = _unit_stride(cupy, a, allow_zero=True)
    b = _unit_stride(cupy, b)
    h0 = cupy.ascontiguousarray(h0)
    out = cupy.empty((rows, L), cd)
    can_block = _blocked_ok(a, L) and _blocked_ok(b, L) and _blocked_ok(out, L)
    if blocked is None:
        blocked = can_block
    elif blocked and not can_block:
        raise ValueError("linear_scan: blocked layout needs unit-stride, 16-byte aligned rows "
                         f"and L a multiple of {VECTOR_BYTES // cd.itemsize}")
    blocked = bool(blocked)
    stream = _numba_stream(cupy.cuda.get_current_stream().ptr)

    def dev(x):  # zero-copy view; ordering is by the shared stream, so no sync
        return cuda.as_cuda_array(x, sync=False)

    rev = bool(reverse)
    A, B, O = dev(a), dev(b), dev(out)
    if algorithm == "sequential":
        k = _kernels(cd.name, "kogge_stone", blocked)
        k.sequential[(rows + SEQ_ROWS - 1) // SEQ_ROWS, SEQ_ROWS, stream](A, B, dev(h0), O, rev)
    elif algorithm in ("kogge_stone", "blelloch"):
        k = _kernels(cd.name, algorithm, blocked)
        k.segment_scan[rows, THREADS, stream](A, B, dev(h0.reshape(rows, 1)), O, np.int64(L), rev)
    elif algorithm == "chunked":
        k = _kernels(cd.name, "kogge_stone", blocked)
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
        k = _kernels(cd.name, "kogge_stone", blocked)
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
