"""The recurrent step (decoding with a carried state): the public function.

It validates every argument, describes the call in one canonical layout and dispatches.
A GPU call whose arrays agree in shapes, strides, dtypes, alignment and device with an
earlier accepted call (decoding: one call per layer and token) skips the checks and the
planning it passed then and replays the backend's launch plan; only the indices' values
are checked again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import sys
from typing import Any

import numpy as np

from . import _arrays

__all__ = ["state_update"]

_FN = "state_update"


# Canonical axes each argument is read along (the Mamba-2 layout with a token axis).
CANONICAL_AXES = {
    "state": "(S, H, P, N)", "x": "(batch, T, H, P)", "dt": "(batch, T, H, P)",
    "z": "(batch, T, H, P)", "y": "(batch, T, H, P)", "A": "(H, P, N)",
    "B": "(batch, T, G, N)", "C": "(batch, T, G, N)", "D": "(H, P)", "dt_bias": "(H, P)",
}


@dataclasses.dataclass(frozen=True)
class StateUpdateProblem:
    """A validated state update, described in the one layout the backends see.

    No array is copied or reshaped: each argument stays the user's array (its
    dtype, its memory, zero strides of broadcasts included), and a *stride
    map* says how to read it in the canonical layout, Mamba-2's with a token
    axis (see :data:`CANONICAL_AXES`)::

        state (S, H, P, N); x, dt, z, y (batch, T, H, P); A (H, P, N);
        B, C (batch, T, G, N); D, dt_bias (H, P)

    Head h uses group ``h // (H // G)``. Mamba-1 (state (S, dim, N)) is read as
    H = G heads of P = dim // G channels, so that a head never straddles a
    group. ``strides(name)`` gives the canonical element strides of an
    argument, computed from its own strides (so they stay right for a cast
    copy of the same shape); ``view(name)`` the canonical view (NumPy).

    Attributes
    ----------
    arrays : dict
        name -> the user's array (or None), plus ``"y"``, the output array
        returned to the user (dtype of x).
    maps : dict
        name -> tuple, one entry per canonical axis: ``(axis, factor)``, the
        canonical stride being ``factor * strides[axis]`` of the user's array,
        or ``None`` for a stride of 0 (an axis the argument does not have).
    batch, T, H, P, N, G : int
    dt_softplus : bool
    rows : ndarray of int64, (batch,) or None
        Host copy of ``state_batch_indices`` (validated: in range, no
        non-negative index twice).
    xp : module
    """

    arrays: dict
    maps: dict
    batch: int
    T: int
    H: int
    P: int
    N: int
    G: int
    dt_softplus: bool
    rows: Any
    xp: Any

    @property
    def compute_dtype(self) -> np.dtype:
        st = self.arrays["state"].dtype
        return np.dtype(np.float64) if st == np.float64 else np.dtype(np.float32)

    def strides(self, name, array=None):
        """Canonical element strides of argument ``name`` (or of ``array``, its stand-in)."""
        a = self.arrays[name] if array is None else array
        if a is None:
            return (0,) * len(self.maps[name])
        size = a.itemsize
        e = [st // size for st in a.strides]
        return tuple(0 if m is None else m[1] * e[m[0]] for m in self.maps[name])

    def shape(self, name):
        dims = {"state": (self.arrays["state"].shape[0], self.H, self.P, self.N),
                "A": (self.H, self.P, self.N), "B": (self.batch, self.T, self.G, self.N),
                "D": (self.H, self.P)}
        act = (self.batch, self.T, self.H, self.P)
        return dims.get({"C": "B", "dt_bias": "D"}.get(name, name), act)

    def view(self, name):
        """The canonical view of a NumPy argument (a view: writes reach the user's array)."""
        a = self.arrays[name]
        if a is None:
            return None
        st = tuple(v * a.itemsize for v in self.strides(name))
        return np.lib.stride_tricks.as_strided(a, self.shape(name), st,
                                               writeable=a.flags.writeable)


def _backend(xp):
    name = "ssmkit._gpu.state_update" if xp.__name__ == "cupy" else "ssmkit._cpu.state_update"
    return importlib.import_module(name)


def _check_state_array(state):
    """The state is written in place: it must be an array, and a writeable one."""
    if state is None:
        raise TypeError(f"{_FN}: state is required; got None")
    is_gpu = _arrays._is_cupy(state) or _arrays._is_foreign_gpu(state)
    if not is_gpu and not isinstance(state, np.ndarray):
        raise TypeError(f"{_FN}: state is updated in place, so it must be a NumPy or GPU "
                        f"array; got {type(state).__name__}")
    if isinstance(state, np.ndarray) and not state.flags.writeable:
        raise ValueError(f"{_FN}: state is updated in place but is read-only "
                         f"(a broadcast view or a read-only buffer)")


def _check_bc(name, X, expected, forms):
    if tuple(X.shape) != tuple(expected):
        raise ValueError(f"{_FN}: {name} must have shape {forms}; here that is "
                         f"{tuple(expected)}; got {tuple(X.shape)}")


def _groups_of(name, X, axis, channels, what):
    G = X.shape[axis]
    if G < 1 or channels % G:
        raise ValueError(f"{_FN}: {name} has G = {G} groups (shape {tuple(X.shape)}), which "
                         f"does not divide {what}")
    return G


def _canonical_mamba2(arr, multi):
    """Validate shapes for state (S, H, P, N); the stride maps and sizes."""
    state, x = arr["state"], arr["x"]
    _, H, P, N = state.shape
    tok = "T, " if multi else ""
    xshape = f"(batch, {tok}H, P)"
    _arrays.check_ndim(_FN, "x", x, (4 if multi else 3,), xshape)
    if tuple(x.shape[-2:]) != (H, P):
        raise ValueError(f"{_FN}: x must have shape {xshape} with (H, P) = {(H, P)} from state "
                         f"(S, H, P, N) = {tuple(state.shape)}; got {tuple(x.shape)}")
    batch = x.shape[0]
    for name in ("dt", "z"):
        if arr[name] is not None:
            _arrays.check_shape(_FN, name, arr[name], x.shape, xshape)
    _arrays.check_shape(_FN, "A", arr["A"], (H, P, N), "(H, P, N)")
    for name in ("D", "dt_bias"):
        if arr[name] is not None:
            _arrays.check_shape(_FN, name, arr[name], (H, P), "(H, P)")
    bc_form = f"(batch, {tok}G, N)"
    B = arr["B"]
    _arrays.check_ndim(_FN, "B", B, (x.ndim,), bc_form)
    G = _groups_of("B", B, -2, H, f"H = {H}")
    expected = (batch,) + ((x.shape[1],) if multi else ()) + (G, N)
    _check_bc("B", B, expected, bc_form)
    _check_bc("C", arr["C"], expected, bc_form + " (the shape of B)")

    ident = lambda n: tuple((j, 1) for j in range(n))  # noqa: E731
    per_token = ident(4) if multi else ((0, 1), None, (1, 1), (2, 1))
    maps = dict(state=ident(4), x=per_token, dt=per_token, z=per_token, y=per_token,
                A=ident(3), B=per_token, C=per_token, D=ident(2), dt_bias=ident(2))
    T = x.shape[1] if multi else 1
    return maps, dict(batch=batch, T=T, H=H, P=P, N=N, G=G)


def _canonical_mamba1(arr, multi):
    """Validate shapes for state (S, dim, N); the stride maps (G heads of dim // G channels)."""
    state, x = arr["state"], arr["x"]
    _, dim, N = state.shape
    xshape = "(batch, dim, T)" if multi else "(batch, dim)"
    _arrays.check_ndim(_FN, "x", x, (3 if multi else 2,), xshape)
    if x.shape[1] != dim:
        raise ValueError(f"{_FN}: x must have shape {xshape} with dim = {dim} from state "
                         f"(S, dim, N) = {tuple(state.shape)}; got {tuple(x.shape)}")
    batch = x.shape[0]
    for name in ("dt", "z"):
        if arr[name] is not None:
            _arrays.check_shape(_FN, name, arr[name], x.shape, xshape)
    _arrays.check_shape(_FN, "A", arr["A"], (dim, N), "(dim, N)")
    for name in ("D", "dt_bias"):
        if arr[name] is not None:
            _arrays.check_shape(_FN, name, arr[name], (dim,), "(dim,)")
    forms = "(batch, N, T) or (batch, G, N, T)" if multi else "(batch, N) or (batch, G, N)"
    tail = (x.shape[2],) if multi else ()
    B = arr["B"]
    _arrays.check_ndim(_FN, "B", B, (x.ndim, x.ndim + 1), forms)
    grouped = B.ndim == x.ndim + 1
    G = _groups_of("B", B, 1, dim, f"dim = {dim}") if grouped else 1
    expected = (batch,) + ((G,) if grouped else ()) + (N,) + tail
    _check_bc("B", B, expected, forms)
    _check_bc("C", arr["C"], expected, forms + " (the shape of B)")

    Pg = dim // G  # channel d = h * Pg + p: its axis splits into (head, channel) strides
    chan = ((1, Pg), (1, 1))
    per_token = ((0, 1), (2, 1) if multi else None) + chan
    if grouped:  # (batch, G, N[, T])
        bc = ((0, 1), (3, 1) if multi else None, (1, 1), (2, 1))
    else:        # (batch, N[, T])
        bc = ((0, 1), (2, 1) if multi else None, None, (1, 1))
    maps = dict(state=((0, 1),) + chan + ((2, 1),), x=per_token, dt=per_token, z=per_token,
                y=per_token, A=((0, Pg), (0, 1), (1, 1)), B=bc, C=bc,
                D=((0, Pg), (0, 1)), dt_bias=((0, Pg), (0, 1)))
    T = x.shape[2] if multi else 1
    return maps, dict(batch=batch, T=T, H=G, P=Pg, N=N, G=G)


def _check_rows(xp, indices, batch, pool):
    """Validate state_batch_indices on the host; returns the int64 host copy."""
    if indices.dtype.kind not in "iu":
        raise TypeError(f"{_FN}: state_batch_indices must hold integers; got {indices.dtype}")
    _arrays.check_shape(_FN, "state_batch_indices", indices, (batch,), "(batch,)")
    rows = np.asarray(indices.get() if xp.__name__ == "cupy" else indices).astype(np.int64)
    used = rows[rows >= 0]
    if used.size and used.max() >= pool:
        bad = int(used[used >= pool][0])
        raise ValueError(f"{_FN}: state_batch_indices holds {bad}, out of range for a state "
                         f"pool of {pool} rows (state.shape[0]); valid: 0 <= i < {pool}, or "
                         f"negative for padding")
    uniq, counts = np.unique(used, return_counts=True)
    if np.any(counts > 1):
        raise ValueError(f"{_FN}: state_batch_indices holds {int(uniq[counts > 1][0])} "
                         f"{int(counts[counts > 1][0])} times; two rows updating one state "
                         f"would race, so each non-negative index may appear once")
    return rows


def _prepare(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices):
    _check_state_array(state)
    named = dict(state=state, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias,
                 state_batch_indices=state_batch_indices)
    for name in ("x", "dt", "A", "B", "C"):
        if named[name] is None:
            raise TypeError(f"{_FN}: {name} is required; got None")
    xp, arr = _arrays.array_namespace(_FN, named)
    for name, a in arr.items():
        if a is None or name == "state_batch_indices":
            continue
        if a.dtype.kind == "c":
            raise TypeError(f"{_FN}: {name} is complex ({a.dtype}); complex states are not "
                            f"supported yet: pass real floating-point arrays")
        _arrays.check_real_float(_FN, name, a)
    if not isinstance(dt_softplus, (bool, np.bool_)):
        raise TypeError(f"{_FN}: dt_softplus must be a bool; got {type(dt_softplus).__name__}")

    st = arr["state"]
    if st.ndim not in (3, 4):
        raise ValueError(f"{_FN}: state must have shape (batch, H, P, N) (Mamba-2) or "
                         f"(batch, dim, N) (Mamba-1); got {st.ndim}-d shape {tuple(st.shape)}")
    if st.shape[-1] < 1:
        raise ValueError(f"{_FN}: state must have N >= 1 states per channel; got shape "
                         f"{tuple(st.shape)}")
    xa = arr["x"]
    if xa.ndim not in (st.ndim - 1, st.ndim):
        one, many = (("(batch, H, P)", "(batch, T, H, P)") if st.ndim == 4
                     else ("(batch, dim)", "(batch, dim, T)"))
        raise ValueError(f"{_FN}: with a {st.ndim}-d state, x must have shape {one} (one "
                         f"token) or {many} (T tokens); got {xa.ndim}-d shape {tuple(xa.shape)}")
    multi = xa.ndim == st.ndim
    maps, sizes = (_canonical_mamba2 if st.ndim == 4 else _canonical_mamba1)(arr, multi)

    batch = sizes["batch"]
    pool = st.shape[0]
    rows = None
    if arr["state_batch_indices"] is None:
        if pool != batch:
            raise ValueError(f"{_FN}: state has {pool} rows but x has batch {batch}; without "
                             f"state_batch_indices they must be equal")
    else:
        rows = _check_rows(xp, arr["state_batch_indices"], batch, pool)

    # A byte stride that is not whole elements (possible with as_strided) cannot be mapped:
    # such an input is read from a contiguous copy; such a state is refused (it is written).
    if any(v % st.itemsize for v in st.strides):
        raise ValueError(f"{_FN}: state has byte strides {tuple(st.strides)}, not whole "
                         f"elements of {st.itemsize} bytes; pass a state whose strides are")
    arrays = {}
    for name in ("x", "dt", "z", "A", "B", "C", "D", "dt_bias"):
        a = arr[name]
        if a is not None and any(v % a.itemsize for v in a.strides):
            a = xp.ascontiguousarray(a)
        arrays[name] = a
    arrays["state"] = st
    arrays["y"] = xp.empty(xa.shape, dtype=xa.dtype)  # the output: x's shape and dtype
    problem = StateUpdateProblem(arrays=arrays, maps=maps, dt_softplus=bool(dt_softplus),
                                 rows=rows, xp=xp, **sizes)
    return problem, arrays["y"]


def state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                 state_batch_indices=None):
    """One recurrent step of a selective SSM (decoding), or several; the state is updated in place.

    Runs on the GPU for CuPy arrays (or GPU arrays of other frameworks, taken
    zero-copy, so a PyTorch state is updated where it lives) and on the CPU for
    NumPy arrays.

    The layout follows ``state.ndim``; ``x`` carries a token axis exactly when
    ``x.ndim == state.ndim``:

    ========= ======================== ============================ ===========================
    argument  Mamba-2 (state 4-d)      Mamba-1 (state 3-d)          with T tokens
    ========= ======================== ============================ ===========================
    state     (S, H, P, N)             (S, dim, N)                  unchanged
    x, dt, z  (batch, H, P)            (batch, dim)                 M2 (batch, T, H, P),
                                                                    M1 (batch, dim, T)
    A         (H, P, N)                (dim, N)                     unchanged
    B, C      (batch, G, N)            (batch, N) or (batch, G, N)  M2 (batch, T, G, N),
                                                                    M1 (batch, N, T) or
                                                                    (batch, G, N, T)
    D,        (H, P)                   (dim,)                       unchanged
    dt_bias
    ========= ======================== ============================ ===========================

    The token axis sits where the scans put their time axis (``ssd``'s x is
    (batch, L, H, P), ``selective_scan``'s u is (batch, dim, L)), so a chunk
    of a sequence is passed as a slice of what the scan would take.

    Parameters
    ----------
    state : array
        The state, updated in place (S = batch without ``state_batch_indices``,
        any pool size with it). float32, float64, float16 or bfloat16; it may
        differ from the dtype of ``x`` (a float32 state with bfloat16
        activations is common).
    x : array
        Input of this step (or of T steps).
    dt : array
        Step sizes, the shape of ``x``. Mamba-2 users broadcast a per-head
        ``dt`` over P with a zero-stride view (``dt[..., None]`` expanded);
        that view is read as it is, never copied.
    A : array
        State matrix, per channel and state. Mamba-2's per-head ``A`` is passed
        as a zero-stride view ``A_h[:, None, None]`` expanded to (H, P, N).
        The GPU kernel reads the strides: A constant along N costs one decay
        per channel instead of one per state, and A, dt and dt_bias constant
        along P (all broadcast per head) one softplus and one decay per head.
    B, C : array
        Input and output vectors of the step. With G groups, head h (Mamba-2)
        uses group ``h // (H // G)``; channel d (Mamba-1) uses group
        ``d // (dim // G)``. B and C have the same shape.
    D : array, optional
        Skip connection.
    z : array, optional
        Gate, the shape of ``x``: the output is multiplied by ``silu(z)``.
    dt_bias : array, optional
        Added to ``dt`` before the softplus.
    dt_softplus : bool
        Apply ``softplus`` (threshold 20) to ``dt + dt_bias``.
    state_batch_indices : array of int, (batch,), optional
        Row i of ``x`` reads and writes ``state[state_batch_indices[i]]``. A
        negative index marks padding: no state is touched and row i of ``y``
        is zero. An index ``>= state.shape[0]`` raises ``ValueError``, and so
        does a non-negative index given twice (two rows would race on one
        state). The indices are checked on the host before anything runs: on
        the GPU that reads them back, one small synchronising copy.

    Returns
    -------
    y : array
        The shape of ``x`` and its dtype, on its device.

    Raises
    ------
    TypeError, ValueError
        For arrays of the wrong kind, dtype or shape, and for bad indices; all
        arguments are checked before the state is touched, so a refused call
        leaves it exactly as it was.

    Notes
    -----
    For each row b, channel c (``(h, p)``, or ``d``) and token, in order::

        dt' = dt + dt_bias, then softplus(dt') when dt_softplus
        state[n] = exp(dt' A[c, n]) state[n] + dt' x B[g, n]
        y = sum_n C[g, n] state[n] + D[c] x, then y silu(z) when z is given

    A sequence of calls continues a scan exactly: the state that
    ``selective_scan(..., return_final_state=True)`` returns, stepped with the
    following tokens, gives the scan's outputs for those tokens.

    On the GPU, N is at most 1024 for a float32 state (512 for float64, 2048
    for 16-bit states) and H at most 65535; larger values raise ValueError
    before anything is written. Repeated calls with CuPy arrays of the same
    shapes, strides, dtypes and device (as in decoding) reuse the checks and
    the launch plan of the first: the host work of such a call is a few
    microseconds.

    Arithmetic is float32, or float64 for a float64 state. With T tokens the
    state stays in float32 (float64) between the steps and is rounded to its
    dtype once, at the end; T one-token calls on a 16-bit state round it after
    every step. On the CPU, 16-bit arrays are computed in float32.
    """
    operands = (state, x, dt, A, B, C, D, z, dt_bias)
    key = _call_key(operands, dt_softplus, state_batch_indices)
    if key is not None:
        known = _KNOWN_CALLS.get(key)
        if known is not None:
            y = _run_known(known, operands, state_batch_indices)
            if y is not None:
                return y
    p, y = _prepare(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices)
    if p.batch * p.T * p.H * p.P == 0:  # no channel or no token: nothing to update
        y[...] = 0
        return y
    scope = (contextlib.nullcontext() if p.xp is np
             else p.xp.cuda.Device(p.arrays["state"].device.id))
    with scope:
        plan = _backend(p.xp).state_update(p)
    # Known only when the kernel read the user's own arrays (not contiguous copies of
    # arrays with strides of partial elements, which a replay would not make).
    if key is not None and plan is not None and all(
            p.arrays[n] is a for n, a in zip(_OPERANDS, operands)):
        if len(_KNOWN_CALLS) >= _KNOWN_CALLS_MAX:
            _KNOWN_CALLS.clear()
        _KNOWN_CALLS[key] = _KnownCall(plan, p.batch, key[0][0][4])
    return y


# ------------------------------------------------------------------------------------------
# Repeated GPU calls (decoding: one call per layer and token, the same shapes every time).
# Everything _prepare checks and the launch plan depend only on what _call_key holds, so a
# call whose key was accepted before skips them; what depends on values (the indices) is
# still checked on every call, before anything is launched.
# ------------------------------------------------------------------------------------------

_KNOWN_CALLS: dict = {}
_OPERANDS = ("state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias")
_KNOWN_CALLS_MAX = 256


@dataclasses.dataclass(frozen=True)
class _KnownCall:
    plan: Any     # the backend's launch plan (ssmkit._gpu.state_update.LaunchPlan)
    batch: int
    device: int


def _call_key(operands, dt_softplus, indices):
    """What a GPU call's checks and launch depend on, or None (not a plain CuPy call).

    Per array: shape, byte strides, dtype, the address modulo 16 (vector access) and the
    device; None for an absent one. The indices' shape, dtype and device (their values are
    checked per call), and dt_softplus.
    """
    cp = sys.modules.get("cupy")
    if cp is None or type(dt_softplus) is not bool:
        return None
    ndarray = cp.ndarray
    parts = []
    for a in operands:
        if a is None:
            parts.append(None)
        elif type(a) is ndarray:
            parts.append((a.shape, a.strides, a.dtype, a.data.ptr & 15, a.device.id))
        else:
            return None
    if parts[0] is None:
        return None
    if indices is None:
        index_part = None
    elif type(indices) is ndarray:
        index_part = (indices.shape, indices.dtype, indices.device.id)
    else:
        return None
    return (tuple(parts), dt_softplus, index_part)


def _run_known(known, operands, indices):
    """Replay a known call's launch plan; None when it cannot be (the tuning changed, or a
    cast copy is aligned otherwise): nothing was launched, the caller plans afresh."""
    backend = _backend_gpu()
    if not backend.plan_is_current(known.plan):
        return None
    cp = sys.modules["cupy"]
    state, x = operands[0], operands[1]
    rows = None if indices is None else _check_rows(cp, indices, known.batch, state.shape[0])
    arrays = dict(zip(_OPERANDS, operands))
    if cp.cuda.runtime.getDevice() == known.device:
        arrays["y"] = cp.empty(x.shape, dtype=x.dtype)
        done = backend.run_plan(known.plan, arrays, rows)
    else:
        with cp.cuda.Device(known.device):
            arrays["y"] = cp.empty(x.shape, dtype=x.dtype)
            done = backend.run_plan(known.plan, arrays, rows)
    return arrays["y"] if done else None


@functools.lru_cache(maxsize=None)
def _backend_gpu():
    return importlib.import_module("ssmkit._gpu.state_update")
