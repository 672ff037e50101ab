"""The GPU linear scans' index arithmetic and combine schedules, in plain NumPy.

Each function here mirrors one Numba CUDA kernel of
:mod:`ssmkit._numba_cuda.linear_scan` step for step: the same constants, the
same tile staging (padded shared-memory index), the same per-thread
composition of ``ITEMS`` steps, the same Kogge-Stone shuffle distances (a
shuffle from lane ``l - d`` reaches only lanes ``l >= d``), the same Blelloch
up-sweep and down-sweep, the same chunk carries and look-back walk. A warp, a
block or a grid of threads is a NumPy array over its threads, so the whole
schedule runs on the CPU, where the tests check it against the float64
reference (warp shuffles do not run in Numba's CUDA simulator). The GPU tests
then check the kernels themselves. The kernels' blocked layout (16-byte vectors:
each tile thread's consecutive steps loaded straight into registers; vector-staged
rounds in the sequential scan) is mirrored too (``blocked=True``), with the same
vector columns and the same element order in reverse scans.

No Numba and no CuPy here: this module is the kernels' plan, importable anywhere.

A pair ``(A, B)`` stands for the map ``h -> A h + B``; ``compose(first, then)``
is ``(A2 A1, A2 B1 + B2)``, associative but not commutative.
"""

from __future__ import annotations

import numpy as np

WARP = 32
THREADS = 256  # threads per block of the tile scans
WARPS = THREADS // WARP
TILE_BYTES = 16384  # one tile of a (or b) in shared memory: 6 blocks' worth fit an SM
SEQ_ROWS = 128  # rows (one per thread) per block of the sequential scan
CHUNK_TILES = 8  # tiles per chunk of the three-phase scan
VECTOR_BYTES = 16  # one vector load or store of the blocked tile layout


def items(itemsize):
    """Consecutive steps one thread composes: 16 (4-byte), 8 (8-byte), 4 (16-byte values)."""
    return TILE_BYTES // THREADS // itemsize


def tile_len(itemsize):
    """Steps per tile: THREADS * items(itemsize)."""
    return THREADS * items(itemsize)


def pad(p, itemsize):
    """Shared-memory slot of tile position ``p``: one spare slot after every 128 bytes.

    A warp's strided reads of slots ``tid ITEMS + j`` then hit distinct banks in
    every shared-memory wavefront (32 lanes of 4 bytes, 16 of 8, 8 of 16).
    """
    return p + p // (128 // itemsize)


def vector_width(itemsize):
    """Steps per 16-byte vector: 4 (4-byte), 2 (8-byte), 1 (16-byte values)."""
    return VECTOR_BYTES // itemsize


def seq_steps(itemsize):
    """Steps staged per round by the sequential scan: 128 bytes of one row."""
    return 128 // itemsize


def compose(first, then):
    A1, B1 = first
    A2, B2 = then
    return A2 * A1, A2 * B1 + B2


def identity_like(x):
    return np.ones_like(x), np.zeros_like(x)


# ------------------------------------------------------------------ block-level scans
def shfl_up(v, d):
    """``shfl_up_sync(full, v, d)`` over the last axis (lanes): lanes < d keep their own."""
    out = v.copy()
    out[..., d:] = v[..., :-d]
    return out


def warp_inclusive_kogge_stone(A, B):
    """Inclusive scan of pairs over the lanes (last axis, 32 wide), as the kernel's loop."""
    lane = np.arange(A.shape[-1])
    d = 1
    while d < WARP:
        Ap, Bp = shfl_up(A, d), shfl_up(B, d)
        take = lane >= d
        An, Bn = compose((Ap, Bp), (A, B))
        A, B = np.where(take, An, A), np.where(take, Bn, B)
        d *= 2
    return A, B


def block_scan_kogge_stone(A, B):
    """Exclusive prefix pair of each thread (THREADS,) and the block total.

    Warps scan by shuffles; lane 31 of each warp leaves its total in shared
    memory; warp 0 scans the WARPS totals (lanes >= WARPS hold the identity);
    each thread's exclusive prefix is (totals of the warps before) then (its
    warp's inclusive value shifted up one lane, the identity at lane 0).
    """
    A, B = A.reshape(WARPS, WARP), B.reshape(WARPS, WARP)
    Ai, Bi = warp_inclusive_kogge_stone(A, B)
    wA = np.ones((1, WARP), A.dtype)
    wB = np.zeros((1, WARP), B.dtype)
    wA[0, :WARPS], wB[0, :WARPS] = Ai[:, WARP - 1], Bi[:, WARP - 1]
    wA, wB = warp_inclusive_kogge_stone(wA, wB)
    # exclusive within the warp: shuffle up by one, lane 0 takes the identity
    Ae, Be = shfl_up(Ai, 1), shfl_up(Bi, 1)
    Ae[:, 0], Be[:, 0] = 1, 0
    # prefix of the warps before: warp w reads the scanned total of warp w - 1
    pA = np.concatenate([[1], wA[0, :WARPS - 1]]).astype(A.dtype)
    pB = np.concatenate([[0], wB[0, :WARPS - 1]]).astype(B.dtype)
    eA, eB = compose((pA[:, None], pB[:, None]), (Ae, Be))
    return (eA.reshape(THREADS), eB.reshape(THREADS)), (wA[0, WARPS - 1], wB[0, WARPS - 1])


def block_scan_blelloch(A, B):
    """Work-efficient exclusive scan of THREADS pairs in shared memory (Blelloch).

    Up-sweep: at distance d, slot ``(i + 1) 2d - 1`` takes (slot - d) then itself.
    The total is read from the last slot, which is then set to the identity.
    Down-sweep: at distance d, the left child takes the parent's prefix and the
    parent becomes (its prefix) then (the old left child).
    """
    sA, sB = A.copy(), B.copy()
    i = np.arange(THREADS)
    d = 1
    while d < THREADS:
        idx = (i + 1) * 2 * d - 1
        idx = idx[idx < THREADS]
        sA[idx], sB[idx] = compose((sA[idx - d], sB[idx - d]), (sA[idx], sB[idx]))
        d *= 2
    total = (sA[THREADS - 1].copy(), sB[THREADS - 1].copy())
    sA[THREADS - 1], sB[THREADS - 1] = 1, 0
    d = THREADS // 2
    while d >= 1:
        idx = (i + 1) * 2 * d - 1
        idx = idx[idx < THREADS]
        tA, tB = sA[idx - d].copy(), sB[idx - d].copy()
        sA[idx - d], sB[idx - d] = sA[idx], sB[idx]
        sA[idx], sB[idx] = compose((sA[idx], sB[idx]), (tA, tB))
        d //= 2
    return (sA, sB), total


BLOCK_SCANS = {"kogge_stone": block_scan_kogge_stone, "blelloch": block_scan_blelloch}


# ------------------------------------------------------------------ one tile
def stage_tile(a_row, b_row, start, end, rev, isz):
    """Shared arrays after the coalesced loads: thread ``tid`` loads positions
    ``k THREADS + tid``; out-of-range positions hold the identity (1, 0)."""
    L = b_row.shape[0]
    n = tile_len(isz)
    sA = np.ones(pad(n, isz), b_row.dtype)
    sB = np.zeros(pad(n, isz), b_row.dtype)
    for k in range(items(isz)):
        p = k * THREADS + np.arange(THREADS)
        t = start + p
        ok = t < end
        col = np.where(rev, L - 1 - t, t)[ok]
        sA[pad(p[ok], isz)] = a_row[col]
        sB[pad(p[ok], isz)] = b_row[col]
    return sA, sB


def thread_pairs(sA, sB, isz):
    """Each thread composes its ITEMS consecutive positions ``tid ITEMS + j``."""
    tid = np.arange(THREADS)
    A = np.ones(THREADS, sA.dtype)
    B = np.zeros(THREADS, sB.dtype)
    n_items = items(isz)
    for j in range(n_items):
        s = pad(tid * n_items + j, isz)
        A, B = compose((A, B), (sA[s], sB[s]))
    return A, B


def vector_columns(start, rev, L, isz):
    """Blocked layout: the first column of vector ``v`` of thread ``tid`` (THREADS, NVEC),
    its first step ``p``, and the item ``j`` each of its VEC elements holds (NVEC, VEC).

    Vector v of thread tid holds steps p = start + tid ITEMS + v VEC + (0 .. VEC-1);
    forward they are columns p .. p + VEC - 1; reversed, columns L - p - VEC ..
    L - 1 - p, so element i is step VEC - 1 - i of the vector.
    """
    n_items, vec = items(isz), vector_width(isz)
    nvec = n_items // vec
    p = start + np.arange(THREADS)[:, None] * n_items + np.arange(nvec)[None, :] * vec
    col = L - p - vec if rev else p
    i = np.arange(vec)
    j = np.arange(nvec)[:, None] * vec + ((vec - 1 - i) if rev else i)[None, :]
    return col, p, j


def load_blocked(a_row, b_row, start, end, rev, isz):
    """Blocked layout: each thread's ITEMS steps (THREADS, ITEMS), read as whole vectors
    (``end`` and L are multiples of VEC); past ``end`` the identity (1, 0)."""
    L = b_row.shape[0]
    vec = vector_width(isz)
    assert L % vec == 0 and start % vec == 0 and end % vec == 0
    col, p, j = vector_columns(start, rev, L, isz)
    xa = np.ones((THREADS, items(isz)), b_row.dtype)
    xb = np.zeros((THREADS, items(isz)), b_row.dtype)
    for tid in range(THREADS):
        for v in range(col.shape[1]):
            if p[tid, v] < end:
                c = col[tid, v]
                xa[tid, j[v]] = a_row[c:c + vec]
                xb[tid, j[v]] = b_row[c:c + vec]
    return xa, xb


def store_blocked(out_row, start, end, rev, xb, isz):
    L = out_row.shape[0]
    vec = vector_width(isz)
    col, p, j = vector_columns(start, rev, L, isz)
    for tid in range(THREADS):
        for v in range(col.shape[1]):
            if p[tid, v] < end:
                c = col[tid, v]
                out_row[c:c + vec] = xb[tid, j[v]]


def blocked_pairs(xa, xb):
    """Each thread composes its items in order (the kernel's loop over j)."""
    A = np.ones(THREADS, xa.dtype)
    B = np.zeros(THREADS, xb.dtype)
    for j in range(xa.shape[1]):
        A, B = compose((A, B), (xa[:, j], xb[:, j]))
    return A, B


def scan_tile(a_row, b_row, out_row, start, end, h, rev, block_scan, isz, blocked=False):
    """One tile of the tile scans from the incoming state ``h``; returns the outgoing one."""
    if blocked:
        xa, xb = load_blocked(a_row, b_row, start, end, rev, isz)
        (eA, eB), (tA, tB) = BLOCK_SCANS[block_scan](*blocked_pairs(xa, xb))
        hh = eA * h + eB
        for j in range(xa.shape[1]):
            hh = xa[:, j] * hh + xb[:, j]
            xb[:, j] = hh
        store_blocked(out_row, start, end, rev, xb, isz)
        return tA * h + tB
    L = b_row.shape[0]
    sA, sB = stage_tile(a_row, b_row, start, end, rev, isz)
    A, B = thread_pairs(sA, sB, isz)
    (eA, eB), (tA, tB) = BLOCK_SCANS[block_scan](A, B)
    hh = eA * h + eB  # state entering each thread's first position
    tid = np.arange(THREADS)
    n_items = items(isz)
    for j in range(n_items):
        s = pad(tid * n_items + j, isz)
        hh = sA[s] * hh + sB[s]
        sB[s] = hh
    for k in range(n_items):
        p = k * THREADS + tid
        t = start + p
        ok = t < end
        col = np.where(rev, L - 1 - t, t)[ok]
        out_row[col] = sB[pad(p[ok], isz)]
    return tA * h + tB


def tile_total(a_row, b_row, start, end, rev, block_scan, isz, blocked=False):
    if blocked:
        A, B = blocked_pairs(*load_blocked(a_row, b_row, start, end, rev, isz))
    else:
        A, B = thread_pairs(*stage_tile(a_row, b_row, start, end, rev, isz), isz)
    return BLOCK_SCANS[block_scan](A, B)[1]


# ------------------------------------------------------------------ whole algorithms
def _isz(b, itemsize):
    return itemsize or b.dtype.itemsize


def segment_scan(a, b, h_in, seg_len, rev, block_scan, itemsize=None, blocked=False):
    """The tile-walk kernel: block (row, seg) scans steps [seg seg_len, (seg+1) seg_len)
    tile by tile from ``h_in[row, seg]``, carrying the state across tiles."""
    isz = _isz(b, itemsize)
    tile = tile_len(isz)
    rows, L = b.shape
    out = np.empty_like(b)
    n_segs = h_in.shape[1]
    for block in range(rows * n_segs):
        row, seg = divmod(block, n_segs)
        h = h_in[row, seg]
        start, end = seg * seg_len, min(L, (seg + 1) * seg_len)
        while start < end:
            h = scan_tile(a[row], b[row], out[row], start, min(end, start + tile), h, rev,
                          block_scan, isz, blocked)
            start += tile
    return out


def chunk_totals(a, b, chunk, rev, block_scan, itemsize=None, blocked=False):
    """Phase 1: each block reduces one chunk of one row, tile by tile, to one pair."""
    isz = _isz(b, itemsize)
    tile = tile_len(isz)
    rows, L = b.shape
    n_chunks = -(-L // chunk)
    aggA = np.ones((rows, n_chunks), b.dtype)
    aggB = np.zeros((rows, n_chunks), b.dtype)
    for row in range(rows):
        for c in range(n_chunks):
            start, end = c * chunk, min(L, (c + 1) * chunk)
            run = (b.dtype.type(1), b.dtype.type(0))
            while start < end:
                run = compose(run, tile_total(a[row], b[row], start, min(end, start + tile),
                                              rev, block_scan, isz, blocked))
                start += tile
            aggA[row, c], aggB[row, c] = run
    return aggA, aggB


def chunk_carries(aggA, aggB, h0):
    """Phase 2: one thread per row walks its chunk totals: the state entering each chunk."""
    carries = np.empty_like(aggB)
    h = h0.copy()
    for c in range(aggB.shape[1]):
        carries[:, c] = h
        h = aggA[:, c] * h + aggB[:, c]
    return carries


def chunked(a, b, h0, rev, block_scan="kogge_stone", chunk_tiles=CHUNK_TILES, itemsize=None,
            blocked=False):
    """Three-phase scan: chunk totals, carries between chunks, rescan of every chunk."""
    chunk = chunk_tiles * tile_len(_isz(b, itemsize))
    aggA, aggB = chunk_totals(a, b, chunk, rev, block_scan, itemsize, blocked)
    return segment_scan(a, b, chunk_carries(aggA, aggB, h0), chunk, rev, block_scan, itemsize,
                        blocked)


def warp_reduce_older_first(A, B):
    """Lane 0's composition of the lanes' pairs, lane 31 (oldest) applied first.

    As the kernel: at distance d each lane takes the pair of lane + d (older)
    first, then its own; lanes past 31 contribute nothing.
    """
    A, B = A.copy(), B.copy()
    lane = np.arange(WARP)
    d = 1
    while d < WARP:
        QA, QB = np.ones_like(A), np.zeros_like(B)
        QA[:-d], QB[:-d] = A[d:], B[d:]  # shfl_down_sync: lanes >= 32 - d keep their own
        take = lane + d < WARP
        nA, nB = compose((QA, QB), (A, B))
        A, B = np.where(take, nA, A), np.where(take, nB, B)
        d *= 2
    return A[0], B[0]


def lookback(a, b, h0, rev, block_scan="kogge_stone", order=None, itemsize=None,
             blocked=False):
    """Single pass with decoupled look-back, its events in the order ``order``.

    Block ``vid`` (row, tile), in launch order, has two events: *publish*
    reduces its tile and publishes the pair (flag 1), or, for a row's first
    tile, the inclusive state at once (flag 2); *finish* has its first warp
    look back 32 tiles at a time: lane l reads the flag of tile ``j - l``; if
    some lane sees flag 2, the nearest such lane k ends the walk, once lanes
    below k all see at least flag 1 (else the warp reads again); the pairs of
    lanes 0..k-1 are composed by a shuffle reduction and applied to tile
    ``j - k``'s inclusive state. With no flag 2 in the window and no flag 0,
    all 32 pairs are composed and the walk moves 32 tiles back. Then the block
    publishes its inclusive state (flag 2) and rescans its tile.

    ``order`` is a sequence of ``vid`` giving the interleaving: a ``vid``'s
    first appearance is its publish, its second its finish. A window that
    meets a flag 0 makes the GPU warp read again; the emulation runs that
    publish first, as the in-order ticketing of blocks guarantees it happens.
    """
    isz = _isz(b, itemsize)
    tl = tile_len(isz)
    rows, L = b.shape
    tiles = -(-L // tl)
    n = rows * tiles
    flags = np.zeros(n, np.int8)
    aggA = np.ones(n, b.dtype)
    aggB = np.zeros(n, b.dtype)
    incl = np.zeros(n, b.dtype)
    h_in = np.zeros(n, b.dtype)
    out = np.empty_like(b)

    def span(vid):
        row, tile = divmod(vid, tiles)
        return row, tile, tile * tl, min(L, (tile + 1) * tl)

    def publish(vid):
        if flags[vid]:
            return
        row, tile, start, end = span(vid)
        tA, tB = tile_total(a[row], b[row], start, end, rev, block_scan, isz, blocked)
        aggA[vid], aggB[vid] = tA, tB
        if tile == 0:
            h_in[vid] = h0[row]
            incl[vid] = tA * h0[row] + tB
            flags[vid] = 2
        else:
            flags[vid] = 1

    def finish(vid):
        publish(vid)
        row, tile, start, end = span(vid)
        if tile > 0:
            first = vid - tile  # the row's first tile: its flag becomes 2 without waiting
            accA, accB = b.dtype.type(1), b.dtype.type(0)  # the tiles passed over, composed
            top = vid - 1
            lane = np.arange(WARP)
            while True:
                j = top - lane
                inside = j >= first
                f = np.where(inside, flags[np.maximum(j, first)], 3)
                two = np.flatnonzero(inside & (f == 2))
                k = two[0] if two.size else WARP
                if np.any(f[:k] == 0):
                    for jj in j[:k][f[:k] == 0]:
                        publish(jj)  # the GPU warp reads the window again until it is set
                    continue
                wA = np.where(lane < k, aggA[np.maximum(j, first)], 1).astype(b.dtype)
                wB = np.where(lane < k, aggB[np.maximum(j, first)], 0).astype(b.dtype)
                WA, WB = warp_reduce_older_first(wA, wB)
                if k < WARP:
                    x = incl[j[k]]
                    h_in[vid] = accA * (WA * x + WB) + accB
                    break
                accA, accB = compose((WA, WB), (accA, accB))
                top -= WARP
            incl[vid] = aggA[vid] * h_in[vid] + aggB[vid]
            flags[vid] = 2
        scan_tile(a[row], b[row], out[row], start, end, h_in[vid], rev, block_scan, isz, blocked)

    seen = np.zeros(n, np.int8)
    for vid in (list(range(n)) * 2 if order is None else order):
        if seen[vid] == 0:
            publish(vid)
        elif seen[vid] == 1:
            finish(vid)
        seen[vid] += 1
    for vid in range(n):
        if seen[vid] < 2:
            finish(vid)
    return out


def sequential(a, b, h0, rev, itemsize=None, blocked=False):
    """One thread per row; steps staged ``seq_steps`` at a time, each thread loading
    positions ``k SEQ_ROWS + tid`` of the (rows x steps) stage.

    ``blocked``: the stage is read and written as 16-byte vectors instead, thread
    tid taking vectors ``idx = k SEQ_ROWS + tid``: row ``idx // (S / VEC)``,
    vector ``idx % (S / VEC)`` of the round (L a multiple of VEC).
    """
    rows, L = b.shape
    isz = _isz(b, itemsize)
    S = seq_steps(isz)
    V = vector_width(isz) if blocked else 1
    per_row = S // V  # loads (vectors or elements) per row and round
    out = np.empty_like(b)
    lane = np.arange(V)
    j = (V - 1 - lane) if (blocked and rev) else lane  # step within the vector of element i
    for block in range(-(-rows // SEQ_ROWS)):
        r0 = block * SEQ_ROWS
        h = np.zeros(SEQ_ROWS, b.dtype)
        nr = min(SEQ_ROWS, rows - r0)
        h[:nr] = h0[r0:r0 + nr]
        for t0 in range(0, L, S):
            sA = np.ones((SEQ_ROWS, S + 1), b.dtype)
            sB = np.zeros((SEQ_ROWS, S + 1), b.dtype)
            for k in range(per_row):
                idx = k * SEQ_ROWS + np.arange(SEQ_ROWS)
                r, q = idx // per_row, idx % per_row
                p = t0 + q * V  # first step of the vector (of the element, unblocked)
                ok = (r0 + r < rows) & (p < L)
                col = (L - p - V if rev else p) if blocked else np.where(rev, L - 1 - p, p)
                for i in range(V):  # element i of the vector: column col + i, step p + j[i]
                    sA[r[ok], q[ok] * V + j[i]] = a[r0 + r[ok], col[ok] + i]
                    sB[r[ok], q[ok] * V + j[i]] = b[r0 + r[ok], col[ok] + i]
            for t in range(S):
                h = sA[:, t] * h + sB[:, t]
                sB[:, t] = h
            for k in range(per_row):
                idx = k * SEQ_ROWS + np.arange(SEQ_ROWS)
                r, q = idx // per_row, idx % per_row
                p = t0 + q * V
                ok = (r0 + r < rows) & (p < L)
                col = (L - p - V if rev else p) if blocked else np.where(rev, L - 1 - p, p)
                for i in range(V):
                    out[r0 + r[ok], col[ok] + i] = sB[r[ok], q[ok] * V + j[i]]
    return out


def run(algorithm, a, b, h0, rev, chunk_tiles=CHUNK_TILES, itemsize=None, blocked=False):
    """The plan of ``algorithm`` on (rows, L) arrays: returns h (rows, L).

    ``itemsize`` picks the tile geometry of the kernel to mirror (default: that
    of ``b``'s dtype), so float64 data can follow a float32 kernel's plan.
    ``blocked`` follows the kernels' 16-byte vector layout (L a multiple of
    ``vector_width(itemsize)``): the tile kernels keep each thread's steps in
    registers, the sequential kernel stages its rounds through vectors.
    """
    if algorithm == "sequential":
        return sequential(a, b, h0, rev, itemsize, blocked)
    if algorithm in ("kogge_stone", "blelloch"):
        return segment_scan(a, b, h0[:, None], b.shape[1], rev, algorithm, itemsize, blocked)
    if algorithm == "chunked":
        return chunked(a, b, h0, rev, chunk_tiles=chunk_tiles, itemsize=itemsize,
                       blocked=blocked)
    if algorithm == "lookback":
        return lookback(a, b, h0, rev, itemsize=itemsize, blocked=blocked)
    raise ValueError(algorithm)
