"""Float64 reference for the Mamba-1 selective scan."""

from __future__ import annotations

import numpy as np

from .._problem import SelectiveScanGrads
from ._common import (_empty_final_states, _f64, _passthrough_slots, _segments, _sigmoid, silu,
                      softplus)

__all__ = ["selective_scan", "selective_scan_vjp"]


def _per_step(X, batch, dim, L):
    """B or C in any of its three forms as a (batch, dim, N, L) float64 array."""
    X = _f64(X)
    if X.ndim == 2:  # (dim, N): the same at every step
        return np.broadcast_to(X[None, :, :, None], (batch, dim, X.shape[1], L))
    if X.ndim == 3:  # (batch, N, L): one group
        X = X[:, None]
    G = X.shape[1]  # (batch, G, N, L): channel d uses group d // (dim // G)
    return np.repeat(X, dim // G, axis=1)


def _reduce_like(dX_full, X):
    """Sum a (batch, dim, N, L) gradient back to the form of B or C."""
    X = np.asarray(X)
    if X.ndim == 2:
        return dX_full.sum(axis=(0, 3))
    batch, dim, N, L = dX_full.shape
    G = 1 if X.ndim == 3 else X.shape[1]
    dX = dX_full.reshape(batch, G, dim // G, N, L).sum(axis=2)
    return dX[:, 0] if X.ndim == 3 else dX


def _discretized_dt(delta, delta_bias, delta_softplus):
    dt_raw = delta if delta_bias is None else delta + delta_bias[None, :, None]
    return dt_raw, (softplus(dt_raw) if delta_softplus else dt_raw)


def _decay(dt, A, restart, t):
    """exp(dt_t A), (batch, dim, N); zero where a new sequence starts at step t."""
    a_t = np.exp(dt[:, :, t, None] * A[None])
    return np.where(restart[:, t, None, None], 0.0, a_t)


def _scan_states(u, dt, A, B, C, h0, restart):
    """Run the recurrence; return the states h_t, (L, batch, dim, N), and h_{-1}."""
    batch, dim, L = u.shape
    h = np.zeros((batch, dim, A.shape[1])) if h0 is None else h0.copy()
    h_init = h.copy()
    states = np.empty((L,) + h.shape)
    for t in range(L):
        a_t = _decay(dt, A, restart, t)
        h = a_t * h + dt[:, :, t, None] * B[..., t] * u[:, :, t, None]
        states[t] = h
    return states, h_init


def selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None,
                   delta_softplus=False, *, initial_state=None,
                   return_final_state=False, seq_idx=None, cu_seqlens=None):
    """Mamba-1 selective scan, step by step in float64.

    Parameters are those of :func:`ssmkit.selective_scan`.

    Notes
    -----
    For every batch row b and channel d, with h = initial_state or 0::

        dt_t = delta_t + delta_bias            (softplus(dt_t) when delta_softplus)
        h_t[n] = exp(dt_t A[d, n]) h_{t-1}[n] + dt_t B_t[n] u_t
        y_t = sum_n C_t[n] h_t[n] + D[d] u_t   (times silu(z_t) when z is given)

    with h_{t-1} = 0 where a packed sequence starts (``seq_idx`` changes, or a
    ``cu_seqlens`` boundary); with ``cu_seqlens`` the final states are one per
    sequence.
    """
    u, delta, A, D, z, delta_bias, h0 = map(
        _f64, (u, delta, A, D, z, delta_bias, initial_state))
    batch, dim, L = u.shape
    Bf, Cf = _per_step(B, batch, dim, L), _per_step(C, batch, dim, L)
    _, dt = _discretized_dt(delta, delta_bias, delta_softplus)
    restart, slot = _segments(batch, L, seq_idx, cu_seqlens)
    states, _ = _scan_states(u, dt, A, Bf, Cf, h0, restart)
    y = np.einsum("bdnt,tbdn->bdt", Cf, states)
    if D is not None:
        y = y + D[None, :, None] * u
    if z is not None:
        y = y * silu(z)
    if not return_final_state:
        return y
    return y, _final_states(states, slot, cu_seqlens, h0, batch, dim, L, A.shape[1])


def _final_states(states, slot, cu_seqlens, h0, batch, dim, L, N):
    """The state after each sequence's last step: one per row, or per sequence of cu_seqlens."""
    n_slots = batch if cu_seqlens is None else len(cu_seqlens) - 1
    final = _empty_final_states((n_slots, dim, N), cu_seqlens, h0, batch, L)
    for b, t in zip(*np.nonzero(slot >= 0)):
        final[slot[b, t]] = states[t, b]
    return final


def selective_scan_vjp(u, delta, A, B, C, D=None, z=None, delta_bias=None,
                       delta_softplus=False, *, initial_state=None,
                       return_final_state=False, seq_idx=None, cu_seqlens=None):
    """The selective scan and its pullback, in float64.

    Returns ``(out, pullback)`` where ``out`` is what :func:`selective_scan`
    returns and ``pullback(dy)`` or ``pullback(dy, dfinal_state)`` returns a
    :class:`~ssmkit.SelectiveScanGrads`. This reference keeps every state; the
    fast backends keep only the states at chunk boundaries.

    Notes
    -----
    With ``g`` the adjoint of the state, walking time backwards::

        g += C_t dy_t                         (g = dL/dh_t)
        dC_t += dy_t h_t;   dB_t += g dt_t u_t
        du_t = sum_n g dt_t B_t + D dy_t
        ddt_t = sum_n g (A a_t h_{t-1} + B_t u_t),   dA += g a_t h_{t-1} dt_t
        g *= a_t
    and ``dinitial_state`` is the final ``g``.
    """
    u64, delta64, A64, D64, z64, bias64, h0 = map(
        _f64, (u, delta, A, D, z, delta_bias, initial_state))
    batch, dim, L = u64.shape
    N = A64.shape[1]
    Bf, Cf = _per_step(B, batch, dim, L), _per_step(C, batch, dim, L)
    dt_raw, dt = _discretized_dt(delta64, bias64, delta_softplus)
    restart, slot = _segments(batch, L, seq_idx, cu_seqlens)
    states, h_init = _scan_states(u64, dt, A64, Bf, Cf, h0, restart)
    y_pre = np.einsum("bdnt,tbdn->bdt", Cf, states)
    if D64 is not None:
        y_pre = y_pre + D64[None, :, None] * u64
    y = y_pre * silu(z64) if z64 is not None else y_pre
    final = _final_states(states, slot, cu_seqlens, h0, batch, dim, L, N)
    out = (y, final) if return_final_state else y

    def pullback(dy, dfinal_state=None):
        dy = np.zeros_like(y) if dy is None else _f64(dy)
        if z64 is not None:
            s = _sigmoid(z64)
            dz = dy * y_pre * s * (1.0 + z64 * (1.0 - s))
            dy = dy * z64 * s
        dfinal = None if dfinal_state is None else _f64(dfinal_state)
        g = np.zeros((batch, dim, N))
        du, ddt = np.zeros_like(u64), np.zeros_like(u64)
        dA = np.zeros((batch, dim, N))
        dBf, dCf = np.zeros_like(Bf), np.zeros_like(Cf)
        for t in range(L - 1, -1, -1):
            h_prev = states[t - 1] if t > 0 else h_init
            a_t = _decay(dt, A64, restart, t)
            if dfinal is not None:  # the final states taken after step t
                ends = slot[:, t] >= 0
                g[ends] += dfinal[slot[ends, t]]
            g = g + Cf[..., t] * dy[:, :, t, None]
            dCf[..., t] = dy[:, :, t, None] * states[t]
            dBf[..., t] = g * (dt[:, :, t] * u64[:, :, t])[..., None]
            du[:, :, t] = (g * Bf[..., t]).sum(-1) * dt[:, :, t]
            ddt[:, :, t] = (g * (A64[None] * a_t * h_prev + Bf[..., t] * u64[:, :, t, None])).sum(-1)
            dA += g * a_t * h_prev * dt[:, :, t, None]
            g = g * a_t
        if delta_softplus:  # d softplus(x)/dx = sigmoid(x), and 1 above the threshold
            ddt = ddt * np.where(dt_raw <= 20.0, _sigmoid(np.minimum(dt_raw, 20.0)), 1.0)
        if D64 is not None:
            du += D64[None, :, None] * dy
        if dfinal is not None:  # sequences without steps end in the initial state
            for slot_, row in _passthrough_slots(batch, L, cu_seqlens):
                g[row] += dfinal[slot_]
        return SelectiveScanGrads(
            u=du,
            delta=ddt,
            A=dA.sum(axis=0),
            B=_reduce_like(dBf, B),
            C=_reduce_like(dCf, C),
            D=None if D is None else (dy * u64).sum(axis=(0, 2)),
            z=None if z is None else dz,
            delta_bias=None if delta_bias is None else ddt.sum(axis=(0, 2)),
            initial_state=None if initial_state is None else g,
        )

    return out, pullback
