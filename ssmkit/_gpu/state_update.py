"""GPU backend of ``ssmkit.state_update``: the host side of ``cuda_src/state_update.cu``.

:func:`state_update` takes the public layer's
:class:`ssmkit._state_update.StateUpdateProblem` (the user's arrays and the
stride maps that read them in the Mamba-2 layout with a token axis) and
launches one kernel that reads every array through its own strides: the
state is updated where it lives, zero-stride broadcasts stay zero-stride, and
no argument is copied in the usual case. Four kernels: ``ssm_state_update``
(any strides; blocks walk their channels in passes, 16-bit and some 4-byte
states through a shared-memory staging ring), ``ssm_state_update_vec``
(the vector form in one pass per block, for the (state, input) item sizes of
``TUNING["one_pass"]``: float32 state and inputs) and ``ssm_state_update_tile``
(per-head parameters and contiguous channels on sm_90: a block's channels
brought into shared memory by one bulk asynchronous copy, for the item sizes of
``TUNING["tile"]``: 16-bit states and inputs) and ``ssm_state_update_warp`` (one token of the
same, with 4 to 32 vectors per channel row, on sm_80: a warp per 2 KiB run of channels,
copied into shared memory by cp.async at its start, for the item sizes of
``TUNING["warp"]``: 16-bit states and inputs, and a float32 state with 16-bit inputs).

Dtypes handed to the kernel: the state as it is (ST); x, dt, z, B, C and y in
one type IT, which is their common dtype, or the compute dtype when they
differ (the odd ones are cast, keeping zero strides zero); A, D, dt_bias in
the compute dtype (float64 for a float64 state, else float32).

Each call is described by a :class:`LaunchPlan` (kernel, block, grids and
every scalar argument, packed once) that depends only on shapes, strides,
dtypes, alignment, flags, the device and :data:`TUNING`: :func:`state_update`
returns it and :func:`run_plan` replays it for later calls that agree (the
public layer keys them).

Kernel instantiations are named by :class:`KernelKey`; :func:`kernel_keys`
lists them and :func:`name_expression` spells them for NVRTC (at run time
through CuPy, in CI through ``tests/test_state_update.py``).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any

import numpy as np

from .. import _arrays
from . import compiler

__all__ = ["state_update", "launch_args", "run_plan", "plan_problem", "plan_is_current",
           "LaunchPlan", "KernelKey", "kernel_keys", "name_expression", "plan_launch", "MAX_N"]

SOURCE_FILE = "state_update.cu"

_CXX = {"float16": "ssm_half", "bfloat16": "ssm_bf16", "float32": "float", "float64": "double"}
_VEC = {"float16": 8, "bfloat16": 8, "float32": 4, "float64": 2}  # states per 16-byte vector
_ITEMSIZE = {name: 16 // v for name, v in _VEC.items()}  # bytes per state value
_CHUNKS = (1, 2, 4, 8)
_PPT = (1, 2, 4)
_TILE_TN = (1, 2, 4, 8, 16, 32)  # the tile kernel's lanes per channel (a template parameter)
_WARP_TN = (4, 8, 16, 32)  # the warp kernel's lanes per channel (exactly a channel's vectors)
WARP_THREADS = 256  # the warp kernel's block (its static shared memory is sized for it)
WARP_CHUNKS = 4  # SU_WARP_CHUNKS in state_update.cu: 512-byte chunks per warp

#: Largest N per state dtype: 32 lanes x 8 chunks x one 16-byte vector each.
MAX_N = {name: 32 * _CHUNKS[-1] * v for name, v in _VEC.items()}

#: Every (state, input) item-size pair: ``TUNING["one_pass"]`` that sends every vector-form
#: call to the one-pass kernel.
ONE_PASS_ALL = tuple((s, i) for s in (2, 4, 8) for i in (2, 4, 8))

#: Launch preferences (correctness does not depend on them).
TUNING = {
    "threads": 64,            # threads per block (a multiple of 32, at most 256): 64 measured
                              # faster than 128 on the Mamba-2 peer shape (bf16 state 0.055
                              # against 0.060 ms, float32 0.095 against 0.097)
    "bytes_per_thread": 64,   # state bytes per thread and pass: channels per thread (4, 2, 1)
    "values_per_thread": 16,  # and at most this many states: 16-bit states take 2 channels
                              # (32 values need 126 registers, 16 fit in 80: more warps per SM)
    "blocks_per_sm": 8,       # split a head's channels over blocks until the grid has this many
    "one_pass": ((4, 4),),    # (state, x/B/C item sizes in bytes) whose vector form runs the
                              # one-pass kernel (ssm_state_update_vec): measured faster for
                              # float32 state and inputs (0.087 against 0.095 ms), slower for
                              # a float32 state with bfloat16 inputs (0.113 against 0.096) and
                              # for bfloat16 (0.073 against 0.055 ms with the staging ring),
                              # bench_state_update.py
    "one_pass_bytes_per_thread": 64,  # its state bytes per thread (channels per thread 4, 2, 1)
    "tile": ((2, 2),),        # (state, input) item sizes whose per-head vector form with
                              # contiguous channels runs the tile kernel (ssm_state_update_tile,
                              # sm_90): measured faster for 16-bit states and inputs (0.0519
                              # against 0.0554 ms with the ring), slower for float32 (0.094
                              # against 0.088 one-pass), bench_state_update.py --tile-sweep
    "tile_bytes": 16384,      # state bytes of a tile-kernel block (whole channels, at most a head)
    "tile_threads": 128,      # its threads per block
    "tile_bytes_per_thread": 32,  # its state bytes per thread and pass (channels per thread)
    "warp": ((2, 2), (4, 2)),  # (state, input) item sizes whose one-token per-head vector
                              # form with contiguous channels of 4-32 vectors runs the warp
                              # kernel (ssm_state_update_warp, sm_80): on the peer step,
                              # bfloat16 0.0447 ms against 0.0491 for the tile kernel; a
                              # float32 state with bfloat16 inputs 0.0873 against 0.0920 (the
                              # general kernel); not float32 throughout (0.0872 against 0.0859
                              # one-pass), bench_state_update.py at 99b742e
    "stage_state": (2, 4),    # state item sizes (bytes) whose vector form, in the general
                              # kernel, copies the passes ahead into shared memory (a cp.async
                              # ring of STAGES passes) instead of loading them into registers:
                              # measured faster for 16-bit states (0.055 against 0.066 ms) and
                              # for a float32 state with bfloat16 inputs (0.093-0.095 against
                              # 0.096-0.099 ms, four runs), equal for float32 inputs (which
                              # take the one-pass kernel), bench_state_update.py
}

#: Passes of state the kernel's staging ring holds (``SU_STAGES`` in state_update.cu).
STAGES = 3
#: Static cap on the ring (no opt-in to more than 48 KiB of dynamic shared memory).
_MAX_RING_BYTES = 48 * 1024

#: How A (and dt) vary (``AMODE`` in state_update.cu): per state, per channel (A constant
#: along N), per head (A, dt, dt_bias constant along P too: Mamba-2's broadcast parameters).
A_FULL, A_ROW, A_HEAD = 0, 1, 2

KernelKey = collections.namedtuple("KernelKey", ["state", "io", "ch", "ppt", "amode", "vec",
                                                 "one_pass", "tile", "tn", "warp"],
                                   defaults=(False, False, 0, False))
KernelKey.__doc__ = """One kernel instantiation.

state, io : numpy dtype names of the state and of x/dt/z/B/C/y; ch : chunks of
one 16-byte vector per lane (1, 2, 4, 8); ppt : channels per thread and pass
(1, 2, 4); amode : A_FULL, A_ROW or A_HEAD; vec : whole-vector accesses only
(contiguous, aligned rows, V divides N) or the general form; one_pass : the
one-pass vector kernel ``ssm_state_update_vec`` (vec only); tile : the tile
kernel ``ssm_state_update_tile`` (vec and A_HEAD only); tn : the tile and warp kernels'
lanes per channel (1, 2, 4, ..., 32; 0 for the other kernels, which take it at run
time); warp : the warp kernel ``ssm_state_update_warp`` (vec and A_HEAD only, ch and ppt 1,
tn 4 to 32)."""

_AMODES = (A_FULL, A_ROW, A_HEAD)

_NULL = np.uint64(0)


def name_expression(key: KernelKey) -> str:
    """The C++ name of the instantiation ``key``, as NVRTC gets it."""
    if key.warp:
        return f"ssm_state_update_warp<{_CXX[key.state]}, {_CXX[key.io]}, {key.tn}>"
    if key.tile:
        return (f"ssm_state_update_tile<{_CXX[key.state]}, {_CXX[key.io]}, {key.ch}, {key.ppt}, "
                f"{key.tn}>")
    if key.one_pass:
        return (f"ssm_state_update_vec<{_CXX[key.state]}, {_CXX[key.io]}, {key.ch}, {key.ppt}, "
                f"{key.amode}>")
    return (f"ssm_state_update<{_CXX[key.state]}, {_CXX[key.io]}, {key.ch}, {key.ppt}, "
            f"{key.amode}, {'true' if key.vec else 'false'}>")


def kernel_keys(full: bool = True) -> list:
    """Kernel instantiations this backend can ask for.

    Parameters
    ----------
    full : bool
        True: every one (4 state dtypes x 4 io dtypes x 4 chunk counts x 3
        channels per thread x 3 A modes x 2 access forms: 1152). False: a representative set in
        which every value of every template parameter appears, every dtype on
        both sides of a mixed (state, io) pair, and every A mode with both a
        16-byte-per-lane state and the wider ones.
    """
    names = list(_CXX)
    keys = [KernelKey(s, i, ch, ppt, a, v) for s in names for i in names for ch in _CHUNKS
            for ppt in _PPT for a in _AMODES for v in (True, False)]
    keys += [k._replace(one_pass=True) for k in keys if k.vec]
    keys += [k._replace(tile=True, tn=tn) for k in keys
             if k.vec and k.amode == A_HEAD and not k.one_pass for tn in _TILE_TN]
    keys += [KernelKey(s, i, 1, 1, A_HEAD, True, tn=tn, warp=True) for s in names for i in names
             for tn in _WARP_TN]
    if full:
        return keys
    rep = [KernelKey(s, s, 1, 4 if _VEC[s] == 4 else 2, A_HEAD, True) for s in names]
    rep += [KernelKey("float32", "bfloat16", 1, 4, A_HEAD, True),
            KernelKey("bfloat16", "float32", 1, 2, A_ROW, False),
            KernelKey("float64", "float16", 2, 2, A_FULL, True),
            KernelKey("float16", "float64", 1, 1, A_ROW, False)]
    rep += [KernelKey("float32", "float32", 2, 1, A_FULL, False),
            KernelKey("float32", "float32", 4, 2, A_ROW, True),
            KernelKey("float32", "float32", 8, 1, A_FULL, False),
            KernelKey("float32", "float32", 1, 4, A_FULL, True)]
    rep += [k._replace(one_pass=True) for k in rep if k.vec]
    tiles = [k for k in rep if k.vec and k.amode == A_HEAD and not k.one_pass]
    rep += [k._replace(tile=True, tn=_TILE_TN[i % len(_TILE_TN)]) for i, k in enumerate(tiles)]
    rep += [tiles[0]._replace(tile=True, tn=tn) for tn in _TILE_TN]
    rep += [KernelKey(s, s, 1, 1, A_HEAD, True, tn=_WARP_TN[i % len(_WARP_TN)], warp=True)
            for i, s in enumerate(names)]
    rep += [KernelKey("bfloat16", "bfloat16", 1, 1, A_HEAD, True, tn=tn, warp=True)
            for tn in _WARP_TN]
    rep += [KernelKey("float32", "bfloat16", 1, 1, A_HEAD, True, tn=16, warp=True),
            KernelKey("float16", "float64", 1, 1, A_HEAD, True, tn=8, warp=True)]
    return list(dict.fromkeys(rep))


def chunks_for(N: int, state: str) -> tuple[int, int]:
    """(TN lanes per channel, CH chunks per lane) for N states of dtype ``state``."""
    vecs = -(-N // _VEC[state])
    tn = 1
    while tn < vecs and tn < 32:
        tn *= 2
    need = -(-vecs // tn)
    for ch in _CHUNKS:
        if ch >= need:
            return tn, ch
    raise ValueError(f"ssmkit.state_update (GPU): N = {N} states per channel is more than the "
                     f"kernel holds for a {state} state (at most {MAX_N[state]})")


def warp_lanes(N: int, state: str) -> int:
    """The warp kernel's lanes per channel for N states of dtype ``state`` (its 16-byte
    vectors: 4, 8, 16 or 32), or 0 where it does not take such channels."""
    nbytes = N * _ITEMSIZE[state]
    return nbytes // 16 if nbytes % 16 == 0 and nbytes // 16 in _WARP_TN else 0


def plan_launch(*, batch: int, H: int, P: int, N: int, state: str, amode: int = A_HEAD,
                sm_count: int = 132, tuning: dict | None = None, one_pass: bool = False,
                tile: bool = False, warp: bool = False) -> dict:
    """Block shape and grid for one launch.

    A block owns one row and head and ``rows_per_block`` consecutive channels,
    which it walks in passes of ``threads // tn * ppt`` channels (each thread:
    ``ppt`` channels of ``tn`` lanes); ``one_pass``: the plan of the one-pass
    vector kernel, one pass per block (``ppt`` from
    ``TUNING["one_pass_bytes_per_thread"]``, no staging ring); ``tile``: the
    plan of the tile kernel (``threads`` from ``TUNING["tile_threads"]``, a
    block's channels: whole rows of at most ``TUNING["tile_bytes"]``, fewer for
    small problems); ``warp``: the plan of the warp kernel (``WARP_THREADS``
    threads, ``tn`` the channel's vectors, a warp per run of ``WARP_CHUNKS * 32 //
    tn`` channels).

    Returns
    -------
    dict
        ``tn`` lanes per channel, ``ch`` chunks per lane, ``ppt`` channels per
        thread and pass, ``threads`` per block, ``rows_per_block``, ``npb``
        blocks per head, ``blocks`` in all (``batch * H * npb``), ``ring_bytes``
        of dynamic shared memory (the staging ring, used by the vector form
        only, 0: none; for the tile kernel its tile and the channels' x, z, D),
        ``one_pass``, ``tile`` and ``warp``: which kernel the plan is for.
    """
    tuning = TUNING if tuning is None else tuning
    if warp:
        tn = warp_lanes(N, state)
        if not tn:
            raise ValueError(f"the warp kernel takes channels of 4 to 32 whole vectors, not N = {N}")
        rows = WARP_THREADS // 32 * WARP_CHUNKS * (32 // tn)
        npb = -(-P // rows)
        return dict(tn=tn, ch=1, ppt=1, threads=WARP_THREADS, rows_per_block=rows, npb=npb,
                    blocks=batch * H * npb, ring_bytes=0, one_pass=False, tile=False, warp=True)
    tn, ch = chunks_for(N, state)
    threads = int(tuning["threads"])
    target = tuning["blocks_per_sm"] * sm_count
    tp = threads // tn
    if tile:
        threads = int(tuning["tile_threads"])
        ppt = _PPT[-1]
        while ppt > 1 and ppt * ch * 16 > tuning["tile_bytes_per_thread"]:
            ppt //= 2
        row_bytes = N * _ITEMSIZE[state]
        rows = max(1, min(P, tuning["tile_bytes"] // row_bytes))
        while rows > 1 and batch * H * -(-P // rows) < target:
            rows = -(-rows // 2)  # a small problem: more, smaller tiles
        npb = -(-P // rows)
        smem = rows * (row_bytes + 4 * (8 if state == "float64" else 4))  # + x, z, D, sums
        return dict(tn=tn, ch=ch, ppt=ppt, threads=threads, rows_per_block=rows, npb=npb,
                    blocks=batch * H * npb, ring_bytes=smem, one_pass=False, tile=True,
                    warp=False)
    if one_pass:
        ppt = _PPT[-1]
        while ppt > 1 and ppt * ch * 16 > tuning["one_pass_bytes_per_thread"]:
            ppt //= 2
        while ppt > 1 and batch * H * -(-P // (tp * ppt)) < target // 4:
            ppt //= 2  # a small problem: more, thinner blocks
        npb = -(-P // (tp * ppt))
        return dict(tn=tn, ch=ch, ppt=ppt, threads=threads, rows_per_block=tp * ppt,
                    npb=npb, blocks=batch * H * npb, ring_bytes=0, one_pass=True, tile=False,
                    warp=False)
    ppt = 4
    while ppt > 1 and ppt * ch * 16 > tuning["bytes_per_thread"]:
        ppt //= 2
    while ppt > 1 and ppt * ch * _VEC[state] > tuning["values_per_thread"]:
        ppt //= 2  # registers: each state value in flight takes one
    while amode == A_FULL and ppt > 1 and ppt * ch * _VEC[state] > 16:
        ppt //= 2  # A per state doubles the registers a channel takes
    passes = -(-P // (tp * ppt))  # one block per head: all its channels
    while passes > 1 and batch * H * -(-P // (tp * ppt * passes)) < target:
        passes = -(-passes // 2)
    while ppt > 1 and batch * H * -(-P // (tp * ppt * passes)) < target // 4:
        ppt //= 2  # a small problem: more, thinner blocks
    rows_per_block = tp * ppt * passes
    npb = -(-P // rows_per_block)
    # The staging ring: one slot per pass a block makes, at most STAGES, each holding the
    # ppt * ch state vectors of every thread.
    ring_bytes = min(passes, STAGES) * ppt * ch * threads * 16
    if _ITEMSIZE[state] not in tuning.get("stage_state", ()) or ring_bytes > _MAX_RING_BYTES:
        ring_bytes = 0
    return dict(tn=tn, ch=ch, ppt=ppt, threads=threads, rows_per_block=rows_per_block,
                npb=npb, blocks=batch * H * npb, ring_bytes=ring_bytes, one_pass=False, tile=False,
                warp=False)


@functools.lru_cache(maxsize=256)
def _cached_plan(batch, H, P, N, state, amode, sm_count, tuning_repr, one_pass, tile, warp):
    del tuning_repr  # key only: TUNING may be changed
    return plan_launch(batch=batch, H=H, P=P, N=N, state=state, amode=amode, sm_count=sm_count,
                       one_pass=one_pass, tile=tile, warp=warp)


def _dtype_name(dt) -> str:
    name = _arrays.dtype_name(dt)
    if name not in _CXX:
        raise TypeError(f"ssmkit.state_update (GPU): unsupported dtype {name!r}; expected one "
                        f"of {sorted(_CXX)}")
    return name


def _cast_keep_broadcast(xp, a, dtype):
    """``a`` in ``dtype``; axes of stride 0 stay stride 0 (only one slice is cast)."""
    if a is None or a.dtype == dtype:
        return a
    index = tuple(slice(0, 1) if st == 0 and n > 1 else slice(None)
                  for st, n in zip(a.strides, a.shape))
    return xp.broadcast_to(a[index].astype(dtype), a.shape)


def _vector_ok(a, shape, strides) -> bool:
    """The kernel may move the state 16 bytes at a time: aligned rows, unit N-stride.

    ``shape``/``strides``: the canonical (S, H, P, N) shape and element strides.
    """
    if shape[3] > 1 and strides[3] != 1:
        return False
    if a.data.ptr % 16:
        return False
    return all(n <= 1 or (s * a.itemsize) % 16 == 0 for s, n in zip(strides[:3], shape[:3]))


_MAX_GRID_Z = 65535


def _bc_vector_ok(use, strides, V, N, names) -> bool:
    """B, C (and A when read per state) may be read V values at a time: unit N-stride,
    aligned rows."""
    for name in names:
        a, st = use[name], strides[name]
        align = min(16, V * a.itemsize)
        if N > 1 and st[-1] != 1:
            return False
        if a.data.ptr % align or any((v * a.itemsize) % align for v in st[:-1]):
            return False
    return True


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """Everything about one call that depends only on shapes, strides, dtypes, alignment,
    flags, the device and :data:`TUNING`, built once and replayed for calls that agree.

    Attributes
    ----------
    kernel : the compiled kernel (per device)
    key : KernelKey
    block : tuple
    launches : tuple of (grid, scalars)
        One per launch (several when batch > 65535): the grid and every
        argument after the eleven pointers (strides, first row, sizes, flags),
        packed once.
    casts : tuple of (name, dtype, address modulo 16)
        Arguments cast before each launch (mixed input dtypes; A, D, dt_bias
        not in the compute dtype). The cast copies have strides that depend
        only on the argument's shape and strides, so ``launches`` stays valid;
        their alignment, which the vector form relies on, is checked per call.
    io_dtype : numpy dtype
        x, dt, z, B, C and y as the kernel reads and writes them.
    staged_y : bool
        The kernel writes y in ``io_dtype``, copied into the user's dtype after.
    smem : int
        Dynamic shared memory of each launch (the staging ring; 0 without it).
    tuning : dict
        :data:`TUNING` when planned (a plan made under other preferences is stale).
    """

    kernel: Any
    key: KernelKey
    block: tuple
    launches: tuple
    casts: tuple
    io_dtype: Any
    staged_y: bool
    smem: int
    tuning: dict


def _apply_casts(xp, arrays, casts):
    """The arguments as the kernel reads them: ``arrays`` with ``casts`` applied (a new dict)."""
    use = dict(arrays)
    for name, dtype, *_ in casts:
        use[name] = _cast_keep_broadcast(xp, use[name], dtype)
    return use


def plan_problem(p, use) -> LaunchPlan:
    """The launch plan of problem ``p``; ``use``: its arrays as the kernel reads them
    (from :func:`_apply_casts`, with ``"y"`` the array the kernel writes)."""
    st = _dtype_name(use["state"].dtype)
    io = _dtype_name(use["x"].dtype)
    strides = {n: p.strides(n, use[n]) for n in use if n in p.maps}

    N = p.N
    sA, sD, sB = strides["A"], strides["dt"], strides["dt_bias"]
    if (N == 1 or sA[2] == 0) and (p.P == 1 or (sA[1] == 0 and sD[3] == 0 and sB[1] == 0)):
        amode = A_HEAD
    elif N == 1 or sA[2] == 0:
        amode = A_ROW
    else:
        amode = A_FULL
    if p.H > 65535:
        raise ValueError(f"ssmkit.state_update (GPU): H = {p.H} heads is more than one launch "
                         "takes (65535)")
    V = _VEC[st]
    per_state = ("B", "C", "A") if amode == A_FULL else ("B", "C")
    vec = (N % V == 0 and _vector_ok(use["state"], p.shape("state"), strides["state"])
           and _bc_vector_ok(use, strides, V, N, per_state))
    limits = compiler.device_limits()
    items = (_ITEMSIZE[st], _ITEMSIZE[io])
    # the tile kernel: Mamba-2's per-head parameters, the channels' rows contiguous, sm_90's
    # bulk copies
    rows_whole = vec and amode == A_HEAD and (p.P == 1 or strides["state"][2] == N)
    # the warp kernel: one token, a channel of 4 to 32 vectors, sm_80's cp.async
    warp = (rows_whole and p.T == 1 and items in TUNING["warp"] and warp_lanes(N, st)
            and limits["compute_capability"] >= 80)
    tile = (rows_whole and not warp and items in TUNING["tile"]
            and limits["compute_capability"] >= 90)
    one_pass = vec and not tile and not warp and items in TUNING["one_pass"]
    plan = _cached_plan(p.batch, p.H, p.P, N, st, amode, limits["sm_count"], repr(TUNING),
                        one_pass, tile, warp)
    key = KernelKey(st, io, plan["ch"], plan["ppt"], amode, vec, one_pass, tile,
                    plan["tn"] if tile or warp else 0, warp)
    kernel = compiler.get_kernel(SOURCE_FILE, name_expression(key))
    if tile:
        compiler.ensure_dynamic_smem(kernel, key, plan["ring_bytes"])

    ints = [v for n in ("state", "x", "dt", "z", "y") for v in strides[n]]
    ints += strides["A"] + strides["B"] + strides["C"] + strides["D"] + strides["dt_bias"]
    head = tuple(np.int64(v) for v in ints)
    tail = (np.int32(p.T), np.int32(p.P), np.int32(N), np.int32(p.H // p.G),
            np.int32(plan["tn"].bit_length() - 1), np.int32(plan["rows_per_block"]),
            np.int32(1 if p.dt_softplus else 0))
    # The grid's z axis holds at most 65535 rows: larger batches take several launches.
    launches = tuple(((plan["npb"], p.H, min(_MAX_GRID_Z, p.batch - b0)),
                      head + (np.int32(b0),) + tail)
                     for b0 in range(0, p.batch, _MAX_GRID_Z))
    casts = tuple((n, use[n].dtype, use[n].data.ptr & 15)
                  for n in ("x", "dt", "z", "B", "C", "A", "D", "dt_bias")
                  if p.arrays[n] is not None and p.arrays[n].dtype != use[n].dtype)
    return LaunchPlan(kernel=kernel, key=key, block=(plan["threads"],), launches=launches,
                      casts=casts, io_dtype=use["x"].dtype,
                      staged_y=p.arrays["y"].dtype != use["x"].dtype,
                      smem=plan["ring_bytes"] if vec else 0, tuning=dict(TUNING))


def plan_is_current(plan: LaunchPlan) -> bool:
    """False when :data:`TUNING` changed since ``plan`` was made."""
    return plan.tuning == TUNING


def _kernel_arrays(xp, p):
    """``p``'s arrays as the kernel reads them: x, dt, z, B, C (and y) in one dtype (theirs
    when they agree, else the compute dtype); A, D, dt_bias in the compute dtype."""
    arrays = p.arrays
    cd = p.compute_dtype
    act_names = ("x", "dt", "z", "B", "C")
    io_dtype = arrays["x"].dtype
    if any(arrays[n] is not None and arrays[n].dtype != io_dtype for n in act_names):
        io_dtype = cd
    casts = [(n, io_dtype) for n in act_names] + [(n, cd) for n in ("A", "D", "dt_bias")]
    use = _apply_casts(xp, arrays, casts)
    y_user = arrays["y"]
    if y_user.dtype != io_dtype:
        use["y"] = xp.empty(y_user.shape, dtype=io_dtype)
    return use


def run_plan(plan: LaunchPlan, arrays: dict, rows) -> bool:
    """Launch ``plan`` on ``arrays`` (name -> the user's array or None, ``"y"`` the output)
    with ``rows`` (validated int64 host indices, or None). The current device must be the
    arrays' device. Returns False, having launched nothing, when a cast copy is not aligned
    as the plan's was (an allocator unlike CuPy's pool): then plan the call afresh."""
    import cupy as cp

    use = _apply_casts(cp, arrays, plan.casts) if plan.casts or plan.staged_y else arrays
    for name, _, align in plan.casts:
        if use[name].data.ptr & 15 != align:
            return False
    y_user = arrays["y"]
    if plan.staged_y:
        use["y"] = cp.empty(y_user.shape, dtype=plan.io_dtype)
    _launch(plan, use, rows)
    if plan.staged_y:
        y_user[...] = use["y"]
    return True


def _launch(plan, use, rows):
    import cupy as cp

    g = use.get
    pointers = (use["state"], _NULL if rows is None else cp.asarray(rows, dtype=np.int64),
                use["x"], use["dt"], g("z") if g("z") is not None else _NULL, use["A"],
                use["B"], use["C"], g("D") if g("D") is not None else _NULL,
                g("dt_bias") if g("dt_bias") is not None else _NULL, use["y"])
    kernel, block = plan.kernel, plan.block
    for grid, scalars in plan.launches:
        kernel(grid, block, pointers + scalars, shared_mem=plan.smem)


def launch_args(p):
    """Everything one launch of problem ``p`` needs, without launching.

    Returns
    -------
    kernel : the compiled kernel
    launches : list of (grid, args)
        ``kernel(grid, block, args)`` for each (one, unless batch > 65535).
    block : tuple
    finish : callable
        Run after the kernel: casts the output into the user's dtype when the
        kernel wrote it in another (mixed input dtypes); else a no-op.
    """
    import cupy as cp

    use = _kernel_arrays(cp, p)
    plan = plan_problem(p, use)
    recorder = _Recorder()
    _launch(dataclasses.replace(plan, kernel=recorder), use, p.rows)

    def finish():
        if plan.staged_y:
            p.arrays["y"][...] = use["y"]

    calls = [(grid, args) for grid, _, args in recorder.calls]
    return functools.partial(plan.kernel, shared_mem=plan.smem), calls, plan.block, finish


class _Recorder:
    """A stand-in kernel that keeps its launches."""

    def __init__(self):
        self.calls = []

    def __call__(self, grid, block, args, shared_mem=0):
        self.calls.append((grid, block, args))


def state_update(p) -> LaunchPlan:
    """Run the steps of problem ``p`` (CuPy arrays): update the state, fill the output.

    Returns the :class:`LaunchPlan`, which :func:`run_plan` replays for later calls
    with the same shapes, strides, dtypes, alignment, flags and device.
    """
    import cupy as cp

    for name, size in (("batch", p.batch), ("T", p.T), ("H", p.H), ("P", p.P), ("N", p.N)):
        if size > 2**31 - 1:
            raise ValueError(f"ssmkit.state_update (GPU): {name} = {size} does not fit the "
                             "kernel's 32-bit size parameters")
    use = _kernel_arrays(cp, p)
    plan = plan_problem(p, use)
    _launch(plan, use, p.rows)
    if plan.staged_y:
        p.arrays["y"][...] = use["y"]
    return plan


def warmup(state_dtypes=("float32",), io_dtypes=("float32",), N=(128,), amodes=_AMODES):
    """Compile the kernels for these dtypes and state sizes ahead of their first use."""
    for st in state_dtypes:
        for io in io_dtypes:
            for n in N:
                _, ch = chunks_for(n, np.dtype(st).name)
                for ppt in _PPT:
                    for a in amodes:
                        compiler.get_kernel(SOURCE_FILE, name_expression(
                            KernelKey(np.dtype(st).name, np.dtype(io).name, ch, ppt, a,
                                      n % _VEC[np.dtype(st).name] == 0)))
