"""Mamba-2 SSD (state space duality) scan: the public functions, which validate, normalise and
dispatch.

Backend contract
----------------
The public layer validates the user's arguments and hands a backend an
:class:`SSDProblem` (canonical layout, dtypes and sizes of at least 1; empty
problems are handled here). A backend module provides::

    ssd_forward(p, *, save_checkpoints, final_states=True) -> (y, final_states, checkpoints)
    ssd_backward(p, checkpoints, dy, dfinal_states) -> dict

``y`` is (batch, L, H, P) of ``p.io_dtype``; ``final_states`` is
(p.n_slots, H, P, N) of ``p.compute_dtype`` holding the state after each step
``t`` with ``p.slot[b, t] >= 0`` (other rows zero), or None where the caller
asks for none (``final_states=False``, with ``save_checkpoints`` only); ``checkpoints`` is None
unless ``save_checkpoints``, else the state entering each chunk of
``p.chunk_size`` steps, in a layout the same backend's ``ssd_backward``
understands. ``ssd_backward`` takes ``dy`` (batch, L, H, P) of ``p.io_dtype``
and ``dfinal_states`` (p.n_slots, H, P, N) of ``p.compute_dtype`` or None,
and returns a dict with the keys of :class:`SSDGrads`: ``x`` and ``z`` in
``p.io_dtype``, ``B`` and ``C`` in ``p.compute_dtype`` or ``p.bc_dtype`` (their
user dtype, rounded once), the others in ``p.compute_dtype`` with the shapes of the
problem's arrays (``D`` as (H, P)), None where the problem's array is None;
``dt`` is the gradient with respect to the raw ``dt`` (bias, softplus and
clip already differentiated through).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import importlib
import math
import numbers
from typing import Any

import numpy as np

from . import _arrays
from ._problem import ChunkedScan

__all__ = ["SSDGrads", "SSDPullback", "ssd", "ssd_vjp"]

DEFAULT_CHUNK_SIZE = 256
_GRAD_FIELDS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_state")

SSDGrads = collections.namedtuple("SSDGrads", list(_GRAD_FIELDS))
SSDGrads.__doc__ = """Gradients of an SSD scan, one field per differentiable argument.

Each field has the shape and dtype of the argument it belongs to, or is ``None``
where that argument was not given."""


@dataclasses.dataclass(frozen=True)
class SSDProblem(ChunkedScan):
    """A validated SSD scan in canonical layout (every array C-contiguous).

    Attributes
    ----------
    x : array, (batch, L, H, P)
        ``io_dtype`` (float32 or float64 on the CPU; any float dtype on the GPU).
    dt : array, (batch, L, H)
        ``compute_dtype``: the raw step sizes, before bias, softplus and clip.
    A : array, (H,)
        ``compute_dtype``.
    B, C : array, (batch, L, G, N)
        Both of dtype ``bc_dtype``; head h uses group ``h // (H // G)``; G may
        differ between B and C.
    D : array, (H, P) or None
        ``compute_dtype``; a per-head D is broadcast over P.
    z : array, (batch, L, H, P) or None
        ``io_dtype``.
    dt_bias : array, (H,) or None
        ``compute_dtype``.
    dt_softplus : bool
    dt_lo, dt_hi : float
        The clip of the effective step, applied only when ``dt_clip``.
    dt_clip : bool
        False for the default limit ``(0, inf)``, which means no clipping.
    initial_state : array, (batch, H, P, N) or None
        ``compute_dtype``.
    seq_idx : array, (batch, L) int32 or None
        The state restarts from zero at each ``t`` with ``seq_idx[b, t] !=
        seq_idx[b, t - 1]`` (derived from ``cu_seqlens`` when that is given).
    slot : numpy.ndarray, (batch, L) int32, or None
        ``slot[b, t] >= 0``: the state after step ``t`` is final state
        ``slot[b, t]``. On the host, for NumPy problems only (the CPU backend's;
        None for CuPy arrays: the GPU backend reads ``slot_steps``, and a
        (batch, L) host array costs host time per call, 0.4 ms at L = 32768).
    slot_steps : numpy.ndarray, (k, 3) int64
        The same on the host: one row ``(b, t, slot)`` per such step, and with slot -1 per
        end of a packed sequence whose final state is not kept (the chunks are cut after
        every step listed).
    n_slots : int
        Number of final states: batch, or the number of packed sequences (0 where none
        is kept: ``ssd`` with ``cu_seqlens`` and without ``return_final_state``).
    chunk_size : int
    xp : module
        ``numpy`` or ``cupy``.
    allow_tf32 : bool
        float32 matrix products may run as one TF32 product (GPU tensor cores).
    """

    x: Any
    dt: Any
    A: Any
    B: Any
    C: Any
    D: Any
    z: Any
    dt_bias: Any
    dt_softplus: bool
    dt_lo: float
    dt_hi: float
    dt_clip: bool
    initial_state: Any
    seq_idx: Any
    slot: Any
    slot_steps: Any
    n_slots: int
    chunk_size: int
    xp: Any
    allow_tf32: bool = False

    @property
    def batch(self) -> int:
        return self.x.shape[0]

    @property
    def L(self) -> int:
        return self.x.shape[1]

    @property
    def H(self) -> int:
        return self.x.shape[2]

    @property
    def P(self) -> int:
        return self.x.shape[3]

    @property
    def N(self) -> int:
        return self.B.shape[3]

    @property
    def io_dtype(self) -> np.dtype:
        return self.x.dtype


def effective_dt(p):
    """dt' = clip(softplus?(dt + dt_bias)) and d dt' / d dt, both (batch, L, H), on ``p.xp``.

    Shared by the backends: a small elementwise pass before the kernels. As in
    mamba_ssm, the clip applies only when ``dt_limit`` is not the default.
    """
    xp = p.xp
    raw = p.dt if p.dt_bias is None else p.dt + p.dt_bias[None, None, :]
    if p.dt_softplus:
        capped = xp.minimum(raw, 20.0)
        v = xp.where(raw <= 20.0, xp.log1p(xp.exp(capped)), raw)
        factor = xp.where(raw <= 20.0, 1.0 / (1.0 + xp.exp(-capped)), 1.0)
    else:
        v, factor = raw, xp.ones_like(raw)
    if p.dt_clip:
        factor = xp.where((v >= p.dt_lo) & (v <= p.dt_hi), factor, 0.0)
        v = xp.clip(v, p.dt_lo, p.dt_hi)
    cd = p.compute_dtype
    return xp.ascontiguousarray(v, dtype=cd), xp.ascontiguousarray(factor, dtype=cd)


def _backend(xp):
    """The backend module for arrays of ``xp`` (imported on first use)."""
    name = "ssmkit._gpu.ssd" if xp.__name__ == "cupy" else "ssmkit._cpu.ssd"
    return importlib.import_module(name)


def _check_bool(fn, name, v):
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{fn}: {name} must be a bool; got {type(v).__name__}")


def _check_dt_limit(fn, dt_limit):
    try:
        lo, hi = dt_limit
        lo, hi = float(lo), float(hi)
    except (TypeError, ValueError):
        raise TypeError(f"{fn}: dt_limit must be a pair of numbers (low, high); got "
                        f"{dt_limit!r}") from None
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        raise ValueError(f"{fn}: dt_limit must be (low, high) with low <= high; got {dt_limit!r}")
    return lo, hi


def _prepare(fn, x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, dt_limit,
             initial_state, seq_idx, cu_seqlens, allow_tf32=False, sequence_finals=True):
    """Validate the arguments and build the canonical problem. ``sequence_finals`` False:
    the caller wants no final state of cu_seqlens' sequences, so the problem has no
    final-state slots (``n_slots`` 0; the chunks are still cut at every sequence's end, so
    that the outputs are those of a call that keeps them, bit for bit).

    Returns
    -------
    problem : SSDProblem
    user : dict
        The user's arrays after conversion (for shapes and dtypes of the gradients).
    passthrough : list of (slot, row)
        Final states of sequences without steps: they equal ``initial_state[row]``.
    """
    named = dict(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias,
                 initial_state=initial_state, seq_idx=seq_idx, cu_seqlens=cu_seqlens)
    for name in ("x", "dt", "A", "B", "C"):
        if named[name] is None:
            raise TypeError(f"{fn}: {name} is required; got None")
    xp, arr = _arrays.array_namespace(fn, named)
    for name, a in arr.items():
        if a is None:
            continue
        if name not in ("seq_idx", "cu_seqlens"):  # (those: _arrays.packed_sequences)
            _arrays.check_real_float(fn, name, a)
    _check_bool(fn, "dt_softplus", dt_softplus)
    _check_bool(fn, "allow_tf32", allow_tf32)
    if isinstance(chunk_size, (bool, np.bool_)) or not isinstance(chunk_size, numbers.Integral):
        raise TypeError(f"{fn}: chunk_size must be an int; got {type(chunk_size).__name__}")
    if chunk_size < 1:
        raise ValueError(f"{fn}: chunk_size must be >= 1; got {chunk_size}")
    lo, hi = _check_dt_limit(fn, dt_limit)

    x = arr["x"]
    _arrays.check_ndim(fn, "x", x, (4,), "(batch, L, H, P)")
    batch, L, H, P = x.shape
    if H < 1 or P < 1:
        raise ValueError(f"{fn}: x must have shape (batch, L, H, P) with H >= 1 and P >= 1; "
                         f"got {tuple(x.shape)}")
    _arrays.check_shape(fn, "dt", arr["dt"], (batch, L, H), "(batch, L, H)")
    if arr["z"] is not None:
        _arrays.check_shape(fn, "z", arr["z"], x.shape, "(batch, L, H, P)")
    _arrays.check_shape(fn, "A", arr["A"], (H,), "(H,)")
    for name in ("B", "C"):
        X = arr[name]
        _arrays.check_ndim(fn, name, X, (4,), "(batch, L, G, N)")
        G, N_ = X.shape[2], X.shape[3]
        if X.shape[:2] != (batch, L) or G < 1 or N_ < 1:
            raise ValueError(f"{fn}: {name} must have shape (batch, L, G, N) = ({batch}, {L}, "
                             f"G, N) with G, N >= 1; got {tuple(X.shape)}")
        if H % G:
            raise ValueError(f"{fn}: {name} has G = {G} groups (shape {tuple(X.shape)}), "
                             f"which does not divide the number of heads H = {H}")
    N = arr["B"].shape[3]
    if arr["C"].shape[3] != N:
        raise ValueError(f"{fn}: C must have the state size N = {N} of B; got shape "
                         f"{tuple(arr['C'].shape)}")
    if arr["D"] is not None:
        _arrays.check_ndim(fn, "D", arr["D"], (1, 2), "(H,) or (H, P)")
        if tuple(arr["D"].shape) not in ((H,), (H, P)):
            raise ValueError(f"{fn}: D must have shape (H,) = ({H},) or (H, P) = ({H}, {P}); "
                             f"got {tuple(arr['D'].shape)}")
    if arr["dt_bias"] is not None:
        _arrays.check_shape(fn, "dt_bias", arr["dt_bias"], (H,), "(H,)")
    if arr["initial_state"] is not None:
        _arrays.check_shape(fn, "initial_state", arr["initial_state"], (batch, H, P, N),
                            "(batch, H, P, N)")

    seq, cu_host = _arrays.packed_sequences(fn, xp, arr["seq_idx"], arr["cu_seqlens"], batch, L)
    if cu_host is not None:
        nonempty, passthrough = _arrays.offsets_sequences(cu_host)
        # (row, last step, slot) of every sequence with steps (slot -1: none kept)
        ends = (np.zeros(nonempty.size, np.int64), cu_host[1:][nonempty] - 1,
                nonempty if sequence_finals else np.full(nonempty.size, -1, np.int64))
        n_slots = cu_host.size - 1
        if not sequence_finals:
            passthrough, n_slots = [], 0
    else:
        rows = np.arange(batch if L > 0 else 0, dtype=np.int64)
        ends = rows, np.full(rows.size, L - 1, np.int64), rows
        passthrough = [(b, b) for b in range(batch)] if L == 0 else []
        n_slots = batch
    slot_steps = np.stack(ends, axis=1).astype(np.int64)
    slot_host = None
    if xp is np:
        slot_host = np.full((batch, L), -1, dtype=np.int32)
        slot_host[slot_steps[:, 0], slot_steps[:, 1]] = slot_steps[:, 2]

    # Canonical dtypes: the CPU computes 16-bit inputs in float32 and casts the result back.
    io = x.dtype
    if xp is np and io != np.float64:
        io = np.dtype(np.float32)
    cd = _arrays.compute_dtype_for(io)
    bc = io if (arr["B"].dtype == io and arr["C"].dtype == io) else cd

    def canon(a, dtype):
        return None if a is None else xp.ascontiguousarray(a, dtype=dtype)

    D_hp = canon(arr["D"], cd)
    if D_hp is not None and D_hp.ndim == 1:
        D_hp = xp.ascontiguousarray(xp.broadcast_to(D_hp[:, None], (H, P)))
    problem = SSDProblem(
        x=canon(x, io), dt=canon(arr["dt"], cd), A=canon(arr["A"], cd),
        B=canon(arr["B"], bc), C=canon(arr["C"], bc), D=D_hp, z=canon(arr["z"], io),
        dt_bias=canon(arr["dt_bias"], cd), dt_softplus=bool(dt_softplus), dt_lo=lo, dt_hi=hi,
        dt_clip=(lo, hi) != (0.0, math.inf), initial_state=canon(arr["initial_state"], cd),
        seq_idx=None if seq is None else _relabel(xp, seq),
        slot=slot_host, slot_steps=slot_steps,
        n_slots=int(n_slots), chunk_size=int(chunk_size), xp=xp, allow_tf32=bool(allow_tf32))
    return problem, arr, passthrough


def _relabel(xp, seq):
    """seq_idx as int32 labels 0, 1, 2, ... per row that change where it changes (any int
    dtype and range in, the same restarts out)."""
    out = xp.zeros(seq.shape, dtype=np.int32)
    if seq.shape[1] > 1:
        out[:, 1:] = xp.cumsum(seq[:, 1:] != seq[:, :-1], axis=1, dtype=np.int32)
    return out


def _device_scope(p):
    """A context that runs GPU work on the device the arrays live on."""
    if p.xp is np:
        return contextlib.nullcontext()
    return p.xp.cuda.Device(p.x.device.id)


def _forward(p, user, passthrough, save_checkpoints, final_states=True):
    """Run the scan; y in the dtype of the user's x, final states in the compute dtype
    (None with ``final_states`` False, for a VJP whose caller wants none: the backend then
    builds none)."""
    xp = p.xp
    if p.batch * p.L == 0:
        y = xp.zeros(user["x"].shape, dtype=user["x"].dtype)
        final = xp.zeros((p.n_slots, p.H, p.P, p.N), dtype=p.compute_dtype)
        checkpoints = None
    else:
        y, final, checkpoints = _backend(xp).ssd_forward(
            p, save_checkpoints=save_checkpoints, final_states=final_states)
        if y.dtype != user["x"].dtype:
            y = y.astype(user["x"].dtype)
    if not final_states:
        return y, None, checkpoints
    if p.initial_state is not None:
        for slot, row in passthrough:
            final[slot] = p.initial_state[row]
    return y, final, checkpoints


_SHARED_DOC = """
    Runs on the GPU for CuPy arrays (or GPU arrays of other frameworks, taken
    zero-copy) and on the CPU for NumPy arrays.

    Parameters
    ----------
    x : array, (batch, L, H, P)
        Input: H heads of P channels. float16, bfloat16, float32 or float64.
    dt : array, (batch, L, H)
        Step sizes, one per head and step; any real float dtype.
    A : array, (H,)
        Decay rate per head (negative for a stable scan); real.
    B, C : array, (batch, L, G, N)
        Input and output matrices in G groups; head h uses group
        ``h // (H // G)`` (G divides H).
    chunk_size : int
        Steps per chunk: the chunked algorithm's block length and the interval
        of the states the backward recomputes from. Results do not depend on it
        beyond rounding. Default 256. On the GPU, float32 ``x`` runs chunks of
        at most 128 steps, where its kernels are fastest.
    D : array, (H,) or (H, P), optional
        Skip connection, per head or per channel.
    z : array, (batch, L, H, P), optional
        Gate: the output is multiplied by ``silu(z)``.
    dt_bias : array, (H,), optional
        Added to ``dt`` before the softplus.
    dt_softplus : bool
        Apply ``softplus`` (threshold 20) to ``dt + dt_bias``.
    dt_limit : (float, float)
        Clip the effective step to ``[low, high]``; the gradient is zero where
        it clips. The default ``(0.0, inf)`` means no clipping (as in mamba_ssm).
    initial_state : array, (batch, H, P, N), optional
        State before the first step of each row (zeros when absent); it feeds
        the first sequence of each row only.
    seq_idx : array, (batch, L) int, optional
        Packed sequences: non-decreasing along L; where it changes, the state
        restarts from zero.
    cu_seqlens : array, (num_sequences + 1,) int, optional
        Packed sequences in one row (batch 1): starts at 0, non-decreasing,
        ends at L. The state restarts at each boundary, and the final states
        are one per sequence (a sequence without steps ends in the state it
        starts from: ``initial_state`` at offset 0, zeros elsewhere). With
        ``seq_idx`` too, both must restart at the same places.
    return_final_state : bool
        Also return the final state(s).
    allow_tf32 : bool
        On the GPU with float32 ``x``, ``B`` and ``C``, let the matrix products
        run as single TF32 tensor-core products (operands rounded to 11
        significant bits, float32 sums), as PyTorch's ``allow_tf32`` and
        mamba_ssm's Triton kernels do: faster, with errors of about 1e-3
        relative instead of float32's 1e-6 (the gradients of A and dt_bias,
        sums of terms that cancel, a few percent). Default False: the products
        run as three TF32 products that keep float32's accuracy. Other dtypes
        and the CPU ignore it."""


def ssd(x, dt, A, B, C, *, chunk_size=DEFAULT_CHUNK_SIZE, D=None, z=None, dt_bias=None,
        dt_softplus=False, dt_limit=(0.0, math.inf), initial_state=None, seq_idx=None,
        cu_seqlens=None, return_final_state=False, allow_tf32=False):
    # (without return_final_state no sequence's final state is built: one per sequence of
    # cu_seqlens, H x P x N each, can outweigh y)
    p, user, passthrough = _prepare("ssd", x, dt, A, B, C, chunk_size, D, z, dt_bias,
                                    dt_softplus, dt_limit, initial_state, seq_idx, cu_seqlens,
                                    allow_tf32, sequence_finals=bool(return_final_state))
    with _device_scope(p):
        y, final, _ = _forward(p, user, passthrough, save_checkpoints=False)
    return (y, final) if return_final_state else y


ssd.__doc__ = """Mamba-2's SSD scan (chunked state space duality), fused.
""" + _SHARED_DOC + """

    Returns
    -------
    y : array, (batch, L, H, P)
        The dtype of ``x``, on the device of ``x``.
    final_state : array, (batch, H, P, N) or (num_sequences, H, P, N)
        Only with ``return_final_state``: float64 for float64 ``x``, float32
        otherwise; one per sequence with ``cu_seqlens``.

    Notes
    -----
    For every batch row b and head h, with the P x N state ``h = initial_state
    or 0`` and ``dt' = clip(softplus?(dt + dt_bias), dt_limit)``::

        h_t = exp(dt'_t A[h]) h_{t-1} + dt'_t x_t (outer) B_t    (h_{t-1} = 0 where seq_idx changes)
        y_t = h_t C_t + D x_t, then y_t silu(z_t) when z is given

    This is :func:`ssmkit.selective_scan` with dim = H * P, A repeated over P
    and N, dt repeated over P and B, C grouped. The GPU computes it in chunks
    (chunk-local outputs with a decay mask from a cumulative sum of ``dt' A``
    inside the chunk, chunk states, state passing between chunks, output
    correction); the CPU runs the recurrence step by step, in parallel over
    (batch, head). Arithmetic is float32 for 16- and 32-bit inputs, float64
    for float64.

    References
    ----------
    T. Dao and A. Gu, "Transformers are SSMs: Generalized Models and
    Efficient Algorithms Through Structured State Space Duality", 2024,
    arXiv:2405.21060.
    """


class SSDPullback:
    """The pullback returned by :func:`ssd_vjp`.

    Call it as ``pullback(dy)`` or ``pullback(dy, dfinal_state)``; either
    cotangent may be None (zeros). It keeps the (normalised) inputs and the
    state entering each chunk, nothing per step; :attr:`residuals` lists what
    it keeps beyond the inputs.
    """

    def __init__(self, problem, user, passthrough, checkpoints):
        self._problem = problem
        self._user_meta = {n: (None if user.get(n) is None else (user[n].dtype, user[n].shape))
                           for n in _GRAD_FIELDS}
        self._passthrough = passthrough
        self._checkpoints = checkpoints

    @property
    def residuals(self) -> dict:
        """Arrays kept beyond the inputs: ``{"checkpoints": ...}``."""
        return {"checkpoints": self._checkpoints}

    def __call__(self, dy=None, dfinal_state=None) -> SSDGrads:
        fn = "ssd_vjp pullback"
        p = self._problem
        xp = p.xp
        arr = _arrays.check_cotangents(fn, xp, {"x": p.x}, {
            "dy": (dy, p.x.shape, "(batch, L, H, P)"),
            "dfinal_state": (dfinal_state, (p.n_slots, p.H, p.P, p.N),
                             "(n_final_states, H, P, N)")})
        dy = (xp.zeros(p.x.shape, p.io_dtype) if arr["dy"] is None
              else xp.ascontiguousarray(arr["dy"], dtype=p.io_dtype))
        dfinal = (None if arr["dfinal_state"] is None
                  else xp.ascontiguousarray(arr["dfinal_state"], dtype=p.compute_dtype))
        with _device_scope(p):
            if p.batch * p.L == 0:
                grads = {n: (None if getattr(p, n) is None else xp.zeros_like(getattr(p, n)))
                         for n in _GRAD_FIELDS}
            else:
                grads = _backend(xp).ssd_backward(p, self._checkpoints, dy, dfinal)
            if p.initial_state is not None and dfinal is not None:
                for slot, row in self._passthrough:
                    grads["initial_state"][row] += dfinal[slot]
            return SSDGrads(**{n: self._as_user(n, grads[n]) for n in _GRAD_FIELDS})

    def _as_user(self, name, g):
        """A gradient in the shape and dtype of the user's argument."""
        meta = self._user_meta[name]
        if meta is None:
            return None
        dtype, shape = meta
        if name == "D" and len(shape) == 1:
            g = g.sum(axis=1)
        return g.astype(dtype, copy=False)


def ssd_vjp(x, dt, A, B, C, *, chunk_size=DEFAULT_CHUNK_SIZE, D=None, z=None, dt_bias=None,
            dt_softplus=False, dt_limit=(0.0, math.inf), initial_state=None, seq_idx=None,
            cu_seqlens=None, return_final_state=False, allow_tf32=False):
    p, user, passthrough = _prepare("ssd_vjp", x, dt, A, B, C, chunk_size, D, z, dt_bias,
                                    dt_softplus, dt_limit, initial_state, seq_idx, cu_seqlens,
                                    allow_tf32)
    with _device_scope(p):
        # (no final states built unless returned: one per sequence of cu_seqlens can
        # outweigh y; the pullback still takes their cotangents)
        y, final, checkpoints = _forward(p, user, passthrough, save_checkpoints=True,
                                         final_states=bool(return_final_state))
    out = (y, final) if return_final_state else y
    return out, SSDPullback(p, user, passthrough, checkpoints)


ssd_vjp.__doc__ = """The SSD scan and its pullback (reverse-mode gradient).

    Takes the arguments of :func:`ssd`.
""" + _SHARED_DOC + """

    Returns
    -------
    out : array or (array, array)
        Exactly what :func:`ssd` returns.
    pullback : SSDPullback
        ``pullback(dy)`` or ``pullback(dy, dfinal_state)`` returns an
        :class:`SSDGrads` with fields ``x, dt, A, B, C, D, z, dt_bias,
        initial_state``, each with the shape and dtype of its argument (None
        for arguments not given).

    Notes
    -----
    The forward keeps the state entering each chunk, ``batch * H * P * N *
    ceil(L / chunk_size)`` floats beside the inputs (on the GPU with float32
    ``x``, a chunk is at most 128 steps). On the GPU with 16-bit ``x`` and
    ``z``, where the forward runs as one kernel, it also keeps the output before
    the gate, (batch, L, H, P) in x's dtype, so that the backward need not
    recompute it. The backward walks the
    chunks in reverse, recomputes each chunk's states from its saved state and
    runs the adjoint recurrence (``g`` = dLoss/dh_t, P x N) through it::

        g += dy_t (outer) C_t
        dC_t = sum_p dy_t h_t;  dB_t = sum_p g dt'_t x_t;  dx_t = dt'_t g B_t + D dy_t
        ddt'_t = sum g (A a_t h_{t-1} + x_t B_t);  dA += dt'_t sum g a_t h_{t-1}
        g *= a_t                     (a_t = exp(dt'_t A), 0 where a sequence starts)

    The gradient through the ``dt_limit`` clip is zero where it clips.
    Reductions run in a fixed order: the gradients are deterministic.
    """
