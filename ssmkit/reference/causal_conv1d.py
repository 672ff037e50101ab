"""Float64 reference for the depthwise causal convolution (causal_conv1d) and its decoding step."""

from __future__ import annotations

import numpy as np

from ._common import _f64, _sigmoid, silu

__all__ = ["causal_conv1d", "causal_conv1d_vjp", "causal_conv1d_update"]


def _padded(x, weight, initial_state, seq_idx):
    """xpad (batch, dim, W-1+L) and the sequence id of every xpad position (batch, W-1+L).

    The W-1 leading positions hold ``initial_state`` (zeros when absent) and belong
    to the first sequence of the row.
    """
    batch, dim, L = x.shape
    H = weight.shape[1] - 1
    h0 = np.zeros((batch, dim, H)) if initial_state is None else _f64(initial_state)
    xpad = np.concatenate([h0, x], axis=2)
    if seq_idx is None:
        seq = np.zeros((batch, H + L), dtype=np.int64)
    else:
        seq = np.asarray(seq_idx).astype(np.int64)
        first = seq[:, :1] if L > 0 else np.zeros((batch, 1), dtype=np.int64)
        seq = np.concatenate([np.repeat(first, H, axis=1), seq], axis=1)
    return xpad, seq


def _pre_activation(xpad, seq, weight, bias, L):
    """z[b, d, t] = bias[d] + sum_k weight[d, k] xpad[b, d, t + k] over inputs of t's sequence."""
    batch, dim, _ = xpad.shape
    W = weight.shape[1]
    z = np.zeros((batch, dim, L)) if bias is None else np.broadcast_to(
        bias[None, :, None], (batch, dim, L)).copy()
    for t in range(L):
        for k in range(W):
            same = (seq[:, t + k] == seq[:, W - 1 + t]).astype(np.float64)  # (batch,)
            z[:, :, t] += weight[None, :, k] * xpad[:, :, t + k] * same[:, None]
    return z


def _final_state(xpad, seq, L, H):
    """The last W-1 positions of xpad, zero where they belong to an earlier sequence than the last."""
    final = xpad[:, :, L:L + H].copy()
    if H and seq.shape[1]:
        keep = seq[:, L:L + H] == seq[:, -1:]
        final *= keep[:, None, :]
    return final


def _activation_name(activation):
    if activation in (None, False):
        return None
    if activation in (True, "silu", "swish"):
        return "silu"
    raise ValueError(f"causal_conv1d reference: activation must be None or 'silu'; got {activation!r}")


def causal_conv1d(x, weight, bias=None, *, activation=None, initial_state=None, seq_idx=None,
                  return_final_state=False):
    """Depthwise causal convolution, one tap at a time, in float64.

    Parameters are those of :func:`ssmkit.causal_conv1d`.

    Notes
    -----
    With ``xpad = concat(initial_state or 0, x)`` along time (W-1 leading values)::

        y[b, d, t] = bias[d] + sum_k weight[d, k] xpad[b, d, t + k]     (then silu)

    where, with ``seq_idx``, an input from another sequence than step t counts as 0
    (the initial state belongs to the first sequence of each row). ``final_state`` is
    ``xpad[..., L:]``, zero where a position belongs to an earlier sequence than the
    last one.
    """
    x, weight, bias = _f64(x), _f64(weight), _f64(bias)
    act = _activation_name(activation)
    L = x.shape[2]
    H = weight.shape[1] - 1
    xpad, seq = _padded(x, weight, initial_state, seq_idx)
    z = _pre_activation(xpad, seq, weight, bias, L)
    y = silu(z) if act == "silu" else z
    if not return_final_state:
        return y
    return y, _final_state(xpad, seq, L, H)


def causal_conv1d_vjp(x, weight, bias=None, *, activation=None, initial_state=None,
                      seq_idx=None, return_final_state=False):
    """The causal convolution and its pullback, in float64.

    Returns ``(out, pullback)``; ``pullback(dy)`` or ``pullback(dy, dfinal_state)``
    returns a :class:`~ssmkit.CausalConv1dGrads` (fields x, weight, bias,
    initial_state; None where the argument was None).

    Notes
    -----
    With ``g = dy * silu'(z)`` (or ``dy``) and ``m`` the same-sequence mask::

        dxpad[t + k] += weight[k] g[t] m(t, t + k);   dweight[k] += g[t] xpad[t + k] m(t, t + k)
        dbias += g[t];   dxpad[L + j] += dfinal_state[j] (where final_state keeps position L + j)

    ``dx = dxpad[W-1:]``, ``dinitial_state = dxpad[:W-1]``.
    """
    from .._causal_conv1d import CausalConv1dGrads

    x64, w64, b64 = _f64(x), _f64(weight), _f64(bias)
    act = _activation_name(activation)
    batch, dim, L = x64.shape
    W = w64.shape[1]
    H = W - 1
    xpad, seq = _padded(x64, w64, initial_state, seq_idx)
    z = _pre_activation(xpad, seq, w64, b64, L)
    y = silu(z) if act == "silu" else z
    out = (y, _final_state(xpad, seq, L, H)) if return_final_state else y

    def pullback(dy=None, dfinal_state=None):
        g = np.zeros((batch, dim, L)) if dy is None else _f64(dy)
        if act == "silu":
            s = _sigmoid(z)
            g = g * s * (1.0 + z * (1.0 - s))
        dxpad = np.zeros_like(xpad)
        dw = np.zeros((dim, W))
        for t in range(L):
            for k in range(W):
                same = (seq[:, t + k] == seq[:, H + t]).astype(np.float64)[:, None]
                dxpad[:, :, t + k] += w64[None, :, k] * g[:, :, t] * same
                dw[:, k] += (g[:, :, t] * xpad[:, :, t + k] * same).sum(axis=0)
        if dfinal_state is not None and H:
            keep = (seq[:, L:L + H] == seq[:, -1:]) if seq.shape[1] else np.ones((batch, H), bool)
            dxpad[:, :, L:L + H] += _f64(dfinal_state) * keep[:, None, :]
        return CausalConv1dGrads(
            x=dxpad[:, :, H:],
            weight=dw,
            bias=None if bias is None else g.sum(axis=(0, 2)),
            initial_state=None if initial_state is None else dxpad[:, :, :H],
        )

    return out, pullback


def causal_conv1d_update(x, conv_state, weight, bias=None, *, activation=None,
                         conv_state_indices=None):
    """One (or T) decoding steps of the causal convolution, in float64; ``conv_state`` in place.

    Parameters are those of :func:`ssmkit.causal_conv1d_update`: ``x`` (batch, dim)
    or (batch, dim, T), ``conv_state`` (pool, dim, W-1), updated in place (in its own
    dtype). Row i uses ``conv_state[conv_state_indices[i]]`` (row i without indices);
    a negative index is padding: output zeros, no state touched.

    Notes
    -----
    For each token: ``window = concat(state, x_t)``, ``y_t = bias + sum_k weight[k]
    window[k]`` (then silu), ``state = window[1:]``.
    """
    x64, w64, b64 = _f64(x), _f64(weight), _f64(bias)
    act = _activation_name(activation)
    one_token = x64.ndim == 2
    if one_token:
        x64 = x64[:, :, None]
    batch, dim, T = x64.shape
    y = np.zeros((batch, dim, T))
    for i in range(batch):
        slot = i if conv_state_indices is None else int(conv_state_indices[i])
        if slot < 0:
            continue
        state = _f64(conv_state[slot]).copy()  # (dim, W-1)
        for t in range(T):
            window = np.concatenate([state, x64[i, :, t:t + 1]], axis=1)
            zt = (window * w64).sum(axis=1) + (0.0 if b64 is None else b64)
            y[i, :, t] = silu(zt) if act == "silu" else zt
            state = window[:, 1:]
        conv_state[slot] = state
    return y[:, :, 0] if one_token else y
