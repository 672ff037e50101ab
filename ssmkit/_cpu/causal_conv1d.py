"""Numba kernels for the causal convolution on NumPy arrays.

Implements the backend contract stated in ``ssmkit._causal_conv1d``. Every
channel row ``(b, d)`` is independent, so the kernels run over rows in
parallel; a row works on its padded input ``xpad = concat(initial_state, x)``
kept in a scratch vector of the compute dtype. Any width works (it is a
run-time value here).

Determinism: each row writes only its own outputs; the sums over the batch
(``dweight``, ``dbias``) are written as per-row partials and summed over the
batch afterwards in a fixed order.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .selective_scan import _sigmoid  # (FMA polynomials that vectorise; libm's exp does not)

__all__ = ["forward", "backward", "update"]

_KERNEL_OPTIONS = dict(cache=True, fastmath=False, error_model="numpy")


@njit(**_KERNEL_OPTIONS)
def _pad_row(x, h0, b, d, xpad):
    H = h0.shape[2]
    for j in range(H):
        xpad[j] = h0[b, d, j]
    for t in range(x.shape[2]):
        xpad[H + t] = x[b, d, t]


@njit(**_KERNEL_OPTIONS)
def _seq_at(seq, b, p, H):
    """Sequence id of xpad position p (the initial state belongs to the first sequence)."""
    return seq[b, p - H] if p >= H else seq[b, 0]


@njit(parallel=True, **_KERNEL_OPTIONS)
def _same_sequence(seq, W):
    """(batch, W, L) bool: tap k of output t reads an input of t's own sequence (xpad position
    t + k). Shared by a batch row's channels, so built once, not per channel and tap."""
    batch, L = seq.shape
    H = W - 1
    same = np.empty((batch, W, L), dtype=np.bool_)
    for r in prange(batch * W):
        b = r // W
        k = r - b * W
        for t in range(L):
            same[b, k, t] = _seq_at(seq, b, t + k, H) == seq[b, t]
    return same


@njit(**_KERNEL_OPTIONS)
def _pre_activation(xpad, w, bias, same, has_seq, b, d, z):
    """z[t] = bias[d] + sum_k w[d, k] xpad[t + k] over same-sequence inputs (``same``, from
    :func:`_same_sequence`), for the whole row.

    The taps are the outer loop, so the loop over time has no dependence and vectorises
    (another sequence's tap adds 0 by a select: its input is never multiplied in); the sum
    for each t is still taken in the order of k.
    """
    W = w.shape[1]
    L = z.shape[0]
    zero = np.zeros(1, dtype=z.dtype)[0]
    for t in range(L):
        z[t] = bias[d]
    for k in range(W):
        wk = w[d, k]
        if has_seq:
            for t in range(L):
                v = wk * xpad[t + k]
                z[t] += v if same[b, k, t] else zero
        else:
            for t in range(L):
                z[t] += wk * xpad[t + k]


@njit(parallel=True, **_KERNEL_OPTIONS)
def _forward_kernel(x, w, bias, h0, seq, same, has_seq, silu, y, final):
    batch, dim, L = x.shape
    H = w.shape[1] - 1
    for r in prange(batch * dim):
        b = r // dim
        d = r - b * dim
        xpad = np.empty(H + L, dtype=w.dtype)
        _pad_row(x, h0, b, d, xpad)
        z = np.empty(L, dtype=w.dtype)
        _pre_activation(xpad, w, bias, same, has_seq, b, d, z)
        if silu:
            for t in range(L):
                y[b, d, t] = z[t] * _sigmoid(z[t])
        else:
            for t in range(L):
                y[b, d, t] = z[t]
        last = seq[b, L - 1]
        for j in range(H):
            if has_seq and _seq_at(seq, b, L + j, H) != last:
                final[b, d, j] = 0  # an earlier sequence's input
            else:
                final[b, d, j] = xpad[L + j]


@njit(parallel=True, **_KERNEL_OPTIONS)
def _backward_kernel(x, w, bias, h0, seq, same, has_seq, silu, dy, dfinal, has_dfinal,
                     dx, dh0, dw_part, db_part):
    batch, dim, L = x.shape
    W = w.shape[1]
    H = W - 1
    for r in prange(batch * dim):
        b = r // dim
        d = r - b * dim
        xpad = np.empty(H + L, dtype=w.dtype)
        _pad_row(x, h0, b, d, xpad)
        g = np.empty(L, dtype=w.dtype)  # dLoss / dz
        if silu:
            _pre_activation(xpad, w, bias, same, has_seq, b, d, g)
            for t in range(L):
                z = g[t]
                s = _sigmoid(z)
                g[t] = dy[b, d, t] * (s * (1 + z * (1 - s)))
        else:
            for t in range(L):
                g[t] = dy[b, d, t]
        db = np.zeros(1, dtype=w.dtype)[0]
        for t in range(L):
            db += g[t]
        dxpad = np.zeros(H + L, dtype=w.dtype)
        zero = np.zeros(1, dtype=w.dtype)[0]
        for k in range(W):  # (as _pre_activation: taps outer, another sequence's adds 0)
            wk = w[d, k]
            acc = dw_part[b, d, k]
            if has_seq:
                for t in range(L):
                    m = same[b, k, t]
                    dxpad[t + k] += wk * g[t] if m else zero
                    acc += g[t] * xpad[t + k] if m else zero
            else:
                for t in range(L):
                    dxpad[t + k] += wk * g[t]
                    acc += g[t] * xpad[t + k]
            dw_part[b, d, k] = acc
        if has_dfinal:
            last = seq[b, L - 1]
            for j in range(H):
                if not has_seq or _seq_at(seq, b, L + j, H) == last:
                    dxpad[L + j] += dfinal[b, d, j]
        for t in range(L):
            dx[b, d, t] = dxpad[H + t]
        for j in range(H):
            dh0[b, d, j] = dxpad[j]
        db_part[b, d] = db


@njit(parallel=True, **_KERNEL_OPTIONS)
def _update_kernel(x, state, w, bias, silu, y):
    batch, dim, T = x.shape
    H = w.shape[1] - 1
    for r in prange(batch * dim):
        b = r // dim
        d = r - b * dim
        for t in range(T):
            xt = x[b, d, t]
            z = bias[d] + w[d, H] * xt
            for k in range(H):
                z += w[d, k] * state[b, d, k]
            for k in range(H - 1):
                state[b, d, k] = state[b, d, k + 1]
            if H > 0:
                state[b, d, H - 1] = xt
            y[b, d, t] = z * _sigmoid(z) if silu else z


def _operands(p):
    """Bias, initial state, sequence ids and their taps' same-sequence mask, with zeros
    standing in for absent ones."""
    cd = p.compute_dtype
    H = p.width - 1
    bias = p.bias if p.bias is not None else np.zeros(p.dim, dtype=cd)
    h0 = (p.initial_state if p.initial_state is not None
          else np.zeros((p.batch, p.dim, H), dtype=cd))
    seq = p.seq_idx if p.seq_idx is not None else np.zeros((p.batch, p.L), dtype=np.int64)
    seq = np.ascontiguousarray(seq, dtype=np.int64)
    same = (_same_sequence(seq, p.width) if p.seq_idx is not None
            else np.zeros((1, 1, 1), dtype=np.bool_))
    return bias, h0, seq, same


def forward(p):
    """y (batch, dim, L) and final_state (batch, dim, W-1), both ``p.io_dtype``."""
    bias, h0, seq, same = _operands(p)
    y = np.empty(p.x.shape, dtype=p.io_dtype)
    final = np.empty((p.batch, p.dim, p.width - 1), dtype=p.io_dtype)
    _forward_kernel(p.x, p.weight, bias, h0, seq, same, p.seq_idx is not None, p.silu, y, final)
    return y, final


def backward(p, dy, dfinal_state):
    """Gradients dict(x, weight, bias, initial_state) (see the backend contract)."""
    bias, h0, seq, same = _operands(p)
    cd = p.compute_dtype
    H = p.width - 1
    has_dfinal = dfinal_state is not None
    dfinal = dfinal_state if has_dfinal else np.zeros((1, 1, 1), dtype=cd)
    dx = np.empty(p.x.shape, dtype=cd)
    dh0 = np.empty((p.batch, p.dim, H), dtype=cd)
    dw_part = np.zeros((p.batch, p.dim, p.width), dtype=cd)  # accumulated in place
    db_part = np.empty((p.batch, p.dim), dtype=cd)
    _backward_kernel(p.x, p.weight, bias, h0, seq, same, p.seq_idx is not None, p.silu,
                     np.ascontiguousarray(dy, dtype=cd), dfinal, has_dfinal,
                     dx, dh0, dw_part, db_part)
    return dict(x=dx.astype(p.io_dtype, copy=False), weight=dw_part.sum(axis=0),
                bias=None if p.bias is None else db_part.sum(axis=0),
                initial_state=None if p.initial_state is None else dh0)


def update(x, conv_state, weight, bias, silu, rows):
    """Decoding steps on the CPU.

    Parameters
    ----------
    x : ndarray, (batch, dim, T), float32 or float64, C-contiguous
    conv_state : ndarray, (pool, dim, W-1), any float dtype and strides; updated in place
    weight : ndarray, (dim, W), compute dtype
    bias : ndarray, (dim,), or None
    silu : bool
    rows : ndarray of int64, (batch,), or None
        Validated: unique non-negative indices < pool, negative for padding.

    The rows used are gathered into a compute-dtype copy, stepped, and written
    back with one assignment once every step is done.
    """
    cd = weight.dtype
    batch, dim, T = x.shape
    bias = bias if bias is not None else np.zeros(dim, dtype=cd)
    if rows is None:
        live = np.arange(batch)
        slots = live
    else:
        live = np.nonzero(rows >= 0)[0]
        slots = rows[live]
    state = np.ascontiguousarray(conv_state[slots], dtype=cd)
    ys = np.empty((live.size, dim, T), dtype=cd)
    _update_kernel(np.ascontiguousarray(x[live]), state, weight, bias, silu, ys)
    y = np.zeros((batch, dim, T), dtype=cd)
    y[live] = ys
    conv_state[slots] = state
    return y
