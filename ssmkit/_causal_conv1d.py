"""Depthwise causal convolution (causal_conv1d): public functions that validate and dispatch.

Backend contract
----------------
The public layer validates and normalises; a backend module
(``ssmkit._cpu.causal_conv1d`` or ``ssmkit._gpu.causal_conv1d``) sees a
:class:`CausalConv1dProblem` with batch, dim and L of at least 1 and provides::

    forward(p) -> (y, final_state)
    backward(p, dy, dfinal_state) -> dict(x=, weight=, bias=, initial_state=)
    update(x, state, weight, bias, silu, rows) -> y

``forward``: ``y`` (batch, dim, L) and ``final_state`` (batch, dim, W-1), both of
dtype ``p.io_dtype``. ``backward``: ``dy`` (batch, dim, L) C-contiguous
``p.io_dtype``; ``dfinal_state`` (batch, dim, W-1) C-contiguous compute dtype or
None; ``x`` in ``p.io_dtype``, the others in the compute dtype (None where the
problem's array is None). ``update``: see each backend.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import importlib
from typing import Any

import numpy as np

from . import _arrays

__all__ = ["causal_conv1d", "causal_conv1d_vjp", "causal_conv1d_update", "CausalConv1dGrads",
           "CausalConv1dPullback"]

#: Widths the GPU kernels take (the width is a compile-time template parameter there).
GPU_MAX_WIDTH = 8

CausalConv1dGrads = collections.namedtuple(
    "CausalConv1dGrads", ["x", "weight", "bias", "initial_state"])
CausalConv1dGrads.__doc__ = """Gradients of a causal convolution, one field per differentiable argument.

Each field has the shape and dtype of the argument it belongs to, or is ``None``
where that argument was not given."""


@dataclasses.dataclass(frozen=True)
class CausalConv1dProblem:
    """A validated causal convolution in canonical layout.

    Attributes
    ----------
    x : array, (batch, dim, L)
        C-contiguous, dtype ``io_dtype`` (float32/float64 on the CPU; any of the
        four float dtypes on the GPU).
    weight : array, (dim, W)
        C-contiguous, compute dtype (float64 for float64 x, else float32).
    bias : array, (dim,) or None
        C-contiguous, compute dtype.
    initial_state : array, (batch, dim, W-1) or None
        C-contiguous, compute dtype.
    seq_idx : array, (batch, L) or None
        C-contiguous int32 (GPU) or int64 (CPU); non-decreasing along L.
    silu : bool
    xp : module
    """

    x: Any
    weight: Any
    bias: Any
    initial_state: Any
    seq_idx: Any
    silu: bool
    xp: Any

    @property
    def batch(self) -> int:
        return self.x.shape[0]

    @property
    def dim(self) -> int:
        return self.x.shape[1]

    @property
    def L(self) -> int:
        return self.x.shape[2]

    @property
    def width(self) -> int:
        return self.weight.shape[1]

    @property
    def io_dtype(self) -> np.dtype:
        return self.x.dtype

    @property
    def compute_dtype(self) -> np.dtype:
        return self.weight.dtype


def _backend(xp):
    name = "ssmkit._gpu.causal_conv1d" if xp.__name__ == "cupy" else "ssmkit._cpu.causal_conv1d"
    return importlib.import_module(name)


def _device_scope(xp, x):
    if xp is np:
        return contextlib.nullcontext()
    return xp.cuda.Device(x.device.id)


def _parse_activation(fn, activation) -> bool:
    """True for silu. Accepts None/False (none) and "silu"/"swish"/True (silu)."""
    if activation is None or activation is False:
        return False
    if activation is True:
        return True
    if isinstance(activation, str) and activation in ("silu", "swish"):
        return True
    raise ValueError(f"{fn}: activation must be None or 'silu' (aliases: 'swish', True); "
                     f"got {activation!r}")


def _check_bool(fn, name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{fn}: {name} must be a bool; got {type(value).__name__}")


def _check_int_dtype(fn, name, x):
    if x.dtype.kind not in "iu":
        raise TypeError(f"{fn}: {name} must hold integers; got {x.dtype}")


def _io_dtype(xp, dtype):
    """The dtype a backend computes x in: the CPU takes 16-bit data as float32."""
    dtype = np.dtype(dtype)
    if xp is np and dtype != np.float64:
        return np.dtype(np.float32)
    return dtype


def _check_width(fn, xp, W):
    if W < 1:
        raise ValueError(f"{fn}: weight must have shape (dim, W) with W >= 1; got W = {W}")
    if xp is not np and W > GPU_MAX_WIDTH:
        raise ValueError(f"{fn}: the GPU kernels take widths 1..{GPU_MAX_WIDTH}; got W = {W} "
                         f"(the CPU backend takes any width)")


def _prepare(fn, x, weight, bias, activation, initial_state, seq_idx):
    for name, value in (("x", x), ("weight", weight)):
        if value is None:
            raise TypeError(f"{fn}: {name} is required; got None")
    silu = _parse_activation(fn, activation)
    named = dict(x=x, weight=weight, bias=bias, initial_state=initial_state, seq_idx=seq_idx)
    xp, arr = _arrays.array_namespace(fn, named)
    for name in ("x", "weight", "bias", "initial_state"):
        if arr[name] is not None:
            _arrays.check_real_float(fn, name, arr[name])
    x = arr["x"]
    _arrays.check_ndim(fn, "x", x, (3,), "(batch, dim, L)")
    batch, dim, L = x.shape
    weight = arr["weight"]
    _arrays.check_ndim(fn, "weight", weight, (2,), "(dim, W)")
    if weight.shape[0] != dim:
        raise ValueError(f"{fn}: weight must have shape (dim, W) with dim = {dim} (from x); "
                         f"got {tuple(weight.shape)}")
    W = weight.shape[1]
    _check_width(fn, xp, W)
    if arr["bias"] is not None:
        _arrays.check_shape(fn, "bias", arr["bias"], (dim,), "(dim,)")
    if arr["initial_state"] is not None:
        _arrays.check_shape(fn, "initial_state", arr["initial_state"], (batch, dim, W - 1),
                            "(batch, dim, W-1)")
    seq = arr["seq_idx"]
    if seq is not None:
        _check_int_dtype(fn, "seq_idx", seq)
        _arrays.check_shape(fn, "seq_idx", seq, (batch, L), "(batch, L)")
        if L > 1:
            steps = xp.diff(seq.astype(np.int64), axis=1)
            if bool((steps < 0).any()):
                where = np.argwhere(_to_host(steps < 0))[0]
                raise ValueError(f"{fn}: seq_idx must be non-decreasing along L; row "
                                 f"{int(where[0])} decreases at position {int(where[1]) + 1}")
            # Sequence numbers 0, 1, 2... per row: equality is all the kernels test,
            # and this fits any id range into 32 bits.
            seq = xp.concatenate([xp.zeros((batch, 1), dtype=np.int64),
                                  xp.cumsum(steps != 0, axis=1)], axis=1)
        seq = xp.zeros((batch, L), dtype=np.int64) if L <= 1 else seq
        seq = xp.ascontiguousarray(seq, dtype=np.int64 if xp is np else np.int32)

    io = _io_dtype(xp, x.dtype)
    cd = _arrays.compute_dtype_for(io)

    def canon(a, dtype):
        return None if a is None else xp.ascontiguousarray(a, dtype=dtype)

    p = CausalConv1dProblem(x=canon(x, io), weight=canon(weight, cd), bias=canon(arr["bias"], cd),
                            initial_state=canon(arr["initial_state"], cd), seq_idx=seq,
                            silu=silu, xp=xp)
    return p, arr


def _to_host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _forward(p, user_x):
    xp = p.xp
    batch, dim, L, H = p.batch, p.dim, p.L, p.width - 1
    out_dtype = user_x.dtype
    if batch * dim * L == 0:  # nothing to convolve: the state passes through
        y = xp.zeros((batch, dim, L), dtype=out_dtype)
        final = (xp.zeros((batch, dim, H), dtype=out_dtype) if p.initial_state is None
                 else p.initial_state.astype(out_dtype))
        return y, final
    y, final = _backend(xp).forward(p)
    return y.astype(out_dtype, copy=False), final.astype(out_dtype, copy=False)


def causal_conv1d(x, weight, bias=None, *, activation=None, initial_state=None, seq_idx=None,
                  return_final_state=False):
    """Depthwise causal 1-d convolution over time, with optional bias and silu.

    Runs on the GPU for CuPy arrays (or GPU arrays of other frameworks, taken
    zero-copy) and on the CPU for NumPy arrays.

    Parameters
    ----------
    x : array, (batch, dim, L)
        Input. float16, bfloat16, float32 or float64.
    weight : array, (dim, W)
        One filter of width W per channel. Any width W >= 1 on the CPU; 1..8 on
        the GPU (the width is a compile-time template parameter of the kernels).
    bias : array, (dim,), optional
    activation : None or "silu"
        ``"swish"`` and ``True`` are accepted as aliases of ``"silu"``, ``False``
        of ``None``; anything else raises ValueError.
    initial_state : array, (batch, dim, W-1), optional
        The W-1 inputs before ``x`` (zeros when absent). Read in the compute dtype.
    seq_idx : array of int, (batch, L), optional
        Sequence id of every step, non-decreasing along L. The convolution does not
        look across a change: inputs of another sequence count as zero, and the
        initial state feeds only the first sequence of each row. Any integer ids;
        the order is checked on every call (on the GPU that waits for the device
        once) and a decrease raises ValueError.
    return_final_state : bool
        Also return the last W-1 inputs, ready to pass as ``initial_state`` (or as
        a ``conv_state`` of :func:`causal_conv1d_update`) to continue.

    Returns
    -------
    y : array, (batch, dim, L)
        The dtype of ``x``, on the device of ``x``.
    final_state : array, (batch, dim, W-1)
        Only with ``return_final_state``; the dtype of ``x``. It is taken from
        ``concat(initial_state, x)``, so it is right also when L < W-1; with
        ``seq_idx``, positions of an earlier sequence than the row's last are zero.

    Notes
    -----
    With ``xpad = concat(initial_state or 0, x)`` along time::

        y[b, d, t] = bias[d] + sum_k weight[d, k] * xpad[b, d, t + k],  then silu

    Arithmetic is float32 for 16- and 32-bit inputs and float64 for float64; on
    the CPU float16/bfloat16 inputs are computed in float32 and cast back. On the
    GPU, bfloat16 inputs without ``seq_idx`` or ``initial_state`` (L even) go
    through tensor cores, the taps split into a bfloat16 part and its residual so
    that the sums keep about float32 accuracy; other inputs through CUDA-core
    kernels (``benchmarks/CAUSAL_CONV1D.md``).

    References
    ----------
    T. Dao, causal-conv1d (https://github.com/Dao-AILab/causal-conv1d), whose
    layout and semantics this follows.
    """
    fn = "causal_conv1d"
    _check_bool(fn, "return_final_state", return_final_state)
    p, user = _prepare(fn, x, weight, bias, activation, initial_state, seq_idx)
    with _device_scope(p.xp, p.x):
        y, final = _forward(p, user["x"])
    return (y, final) if return_final_state else y


class CausalConv1dPullback:
    """The pullback returned by :func:`causal_conv1d_vjp`.

    ``pullback(dy)`` or ``pullback(dy, dfinal_state)``, either may be None
    (zeros). It keeps the (normalised) inputs only; the backward recomputes the
    pre-activations.
    """

    def __init__(self, problem, user):
        self._problem = problem
        self._user = {n: (None if a is None else a.dtype) for n, a in user.items()}

    def __call__(self, dy=None, dfinal_state=None) -> CausalConv1dGrads:
        fn = "causal_conv1d_vjp pullback"
        p = self._problem
        xp = p.xp
        batch, dim, L, H = p.batch, p.dim, p.L, p.width - 1
        arr = _arrays.check_cotangents(fn, xp, {"x": p.x}, {
            "dy": (dy, (batch, dim, L), "(batch, dim, L)"),
            "dfinal_state": (dfinal_state, (batch, dim, H), "(batch, dim, W-1)")})
        cd = p.compute_dtype
        dfinal = (None if arr["dfinal_state"] is None or H == 0
                  else xp.ascontiguousarray(arr["dfinal_state"], dtype=cd))
        with _device_scope(xp, p.x):
            if batch * dim * L == 0:  # the forward passed the state through
                grads = dict(x=xp.zeros((batch, dim, L), p.io_dtype),
                             weight=xp.zeros_like(p.weight),
                             bias=None if p.bias is None else xp.zeros_like(p.bias),
                             initial_state=None if p.initial_state is None
                             else xp.zeros_like(p.initial_state))
                if p.initial_state is not None and dfinal is not None:
                    grads["initial_state"] = dfinal.copy()
            else:
                dyc = (xp.zeros((batch, dim, L), p.io_dtype) if arr["dy"] is None
                       else xp.ascontiguousarray(arr["dy"], dtype=p.io_dtype))
                grads = _backend(xp).backward(p, dyc, dfinal)
            return CausalConv1dGrads(**{n: self._as_user(n, grads[n])
                                        for n in CausalConv1dGrads._fields})

    def _as_user(self, name, g):
        dtype = self._user[name]
        if dtype is None:
            return None
        return g.astype(dtype, copy=False)


def causal_conv1d_vjp(x, weight, bias=None, *, activation=None, initial_state=None,
                      seq_idx=None, return_final_state=False):
    """The causal convolution and its pullback (reverse-mode gradient).

    Takes the arguments of :func:`causal_conv1d`.

    Returns
    -------
    out : array or (array, array)
        Exactly what :func:`causal_conv1d` returns.
    pullback : CausalConv1dPullback
        ``pullback(dy)`` or ``pullback(dy, dfinal_state)`` returns a
        :class:`CausalConv1dGrads` with fields ``x, weight, bias, initial_state``,
        each with the shape and dtype of its argument (None where it was not
        given). ``seq_idx`` is not differentiable.

    Notes
    -----
    With ``g = dy * silu'(z)`` (``dy`` without activation), ``z`` the
    pre-activation recomputed from the inputs::

        dxpad[t + k] = sum weight[k] g[t]    dweight[k] = sum_{b, t} g[t] xpad[t + k]
        dbias = sum_{b, t} g[t]              dxpad[L + j] += dfinal_state[j]

    over same-sequence pairs only; ``dx = dxpad[W-1:]``, ``dinitial_state =
    dxpad[:W-1]``. Sums over batch and time run in a fixed order (per-block partial
    sums, then an ordered reduction): gradients are deterministic. On the GPU, for
    bfloat16 inputs without ``seq_idx`` or ``initial_state`` and widths 6 to 8, the
    sums run on tensor cores with split operands: ``dweight`` and ``dbias`` to about
    1e-5 relative (1e-7 on the other paths), ``dx`` to its bfloat16 rounding.
    """
    fn = "causal_conv1d_vjp"
    _check_bool(fn, "return_final_state", return_final_state)
    p, user = _prepare(fn, x, weight, bias, activation, initial_state, seq_idx)
    with _device_scope(p.xp, p.x):
        y, final = _forward(p, user["x"])
    out = (y, final) if return_final_state else y
    user = {n: user[n] for n in CausalConv1dGrads._fields}
    return out, CausalConv1dPullback(p, user)


def causal_conv1d_update(x, conv_state, weight, bias=None, *, activation=None,
                         conv_state_indices=None):
    """Decoding steps of the causal convolution; ``conv_state`` is updated in place.

    Parameters
    ----------
    x : array, (batch, dim) or (batch, dim, T)
        One new token per row, or T tokens (speculative decoding, chunked prefill),
        taken in order.
    conv_state : array, (pool, dim, W-1)
        The last W-1 inputs of each sequence, updated in place; the dtype of ``x``
        (it is a window of past inputs). Any strides; NumPy arrays must be writeable.
    weight : array, (dim, W)
    bias : array, (dim,), optional
    activation : None or "silu"
        As in :func:`causal_conv1d`.
    conv_state_indices : array of int, (batch,), optional
        Row i reads and writes ``conv_state[conv_state_indices[i]]`` (without it
        row i uses ``conv_state[i]`` and pool must equal batch). A negative index
        marks a padding row: its output is zeros and no state is touched. An index
        >= pool and a non-negative index given twice raise ValueError (two rows
        writing one state would race), before anything is written.

    Returns
    -------
    y : array, the shape of ``x``
        The dtype of ``x``.

    Notes
    -----
    For each token t: ``window = concat(state, x_t)``, ``y_t = bias + sum_k
    weight[k] window[k]`` (then silu), ``state = window[1:]``. A run of steps
    continues a :func:`causal_conv1d` exactly: pass its ``final_state`` as the
    state. All arguments are checked before any state is written: a call either
    raises with the state untouched or updates every row it names.
    """
    fn = "causal_conv1d_update"
    for name, value in (("x", x), ("conv_state", conv_state), ("weight", weight)):
        if value is None:
            raise TypeError(f"{fn}: {name} is required; got None")
    silu = _parse_activation(fn, activation)
    named = dict(x=x, conv_state=conv_state, weight=weight, bias=bias,
                 conv_state_indices=conv_state_indices)
    xp, arr = _arrays.array_namespace(fn, named)
    for name in ("x", "conv_state", "weight", "bias"):
        if arr[name] is not None:
            _arrays.check_real_float(fn, name, arr[name])
    x, state, w = arr["x"], arr["conv_state"], arr["weight"]
    if xp is np and not isinstance(conv_state, np.ndarray):
        raise TypeError(f"{fn}: conv_state must be an array updated in place (numpy.ndarray "
                        f"or a GPU array); got {type(conv_state).__name__}")
    _arrays.check_ndim(fn, "x", x, (2, 3), "(batch, dim) or (batch, dim, T)")
    batch, dim = x.shape[:2]
    _arrays.check_ndim(fn, "weight", w, (2,), "(dim, W)")
    if w.shape[0] != dim:
        raise ValueError(f"{fn}: weight must have shape (dim, W) with dim = {dim} (from x); "
                         f"got {tuple(w.shape)}")
    W = w.shape[1]
    _check_width(fn, xp, W)
    if arr["bias"] is not None:
        _arrays.check_shape(fn, "bias", arr["bias"], (dim,), "(dim,)")
    _arrays.check_ndim(fn, "conv_state", state, (3,), "(pool, dim, W-1)")
    if tuple(state.shape[1:]) != (dim, W - 1):
        raise ValueError(f"{fn}: conv_state must have shape (pool, dim, W-1) with dim = {dim} "
                         f"and W-1 = {W - 1}; got {tuple(state.shape)}")
    if state.dtype != x.dtype:
        raise TypeError(f"{fn}: conv_state must have the dtype of x ({x.dtype}); got "
                        f"{state.dtype}")
    if xp is np and not state.flags.writeable:
        raise ValueError(f"{fn}: conv_state is read-only; it is updated in place")
    pool = state.shape[0]
    idx = arr["conv_state_indices"]
    if idx is None:
        if pool != batch:
            raise ValueError(f"{fn}: without conv_state_indices, conv_state must have one row "
                             f"per batch row: pool = batch = {batch}; got pool = {pool}")
        rows = None
    else:
        _check_int_dtype(fn, "conv_state_indices", idx)
        _arrays.check_shape(fn, "conv_state_indices", idx, (batch,), "(batch,)")
        rows = xp.ascontiguousarray(idx, dtype=np.int64)
        if batch:
            # Checked on the host: one small copy (and one wait) on the GPU, far cheaper
            # than a chain of device reductions.
            top, dup = _index_summary(_to_host(rows))
            if top >= pool:
                raise ValueError(f"{fn}: conv_state_indices must be < pool = {pool} (or negative "
                                 f"for padding); got {top}; nothing was written")
            if dup >= 0:
                raise ValueError(f"{fn}: conv_state_indices names conv_state row {dup} twice; "
                                 f"each row may be updated by one batch row only; nothing was "
                                 f"written")
    one_token = x.ndim == 2
    io = _io_dtype(xp, x.dtype)
    cd = _arrays.compute_dtype_for(io)
    xc = xp.ascontiguousarray(x[:, :, None] if one_token else x, dtype=io)
    wc = xp.ascontiguousarray(w, dtype=cd)
    bc = None if arr["bias"] is None else xp.ascontiguousarray(arr["bias"], dtype=cd)
    with _device_scope(xp, xc):
        if xc.size == 0:
            y = xp.zeros(xc.shape, dtype=x.dtype)
        else:
            y = _backend(xp).update(xc, state, wc, bc, silu, rows)
            y = y.astype(x.dtype, copy=False)
    return y[:, :, 0] if one_token else y


def _index_summary(rows):
    """(largest index, a non-negative index given twice or -1) of a NumPy int64 vector."""
    live = np.sort(rows[rows >= 0])
    repeated = live[1:][live[1:] == live[:-1]]
    return int(rows.max()), (int(repeated[0]) if repeated.size else -1)
