"""Float64 reference for Mamba-2's SSD (state space duality) scan, one step at a time."""

from __future__ import annotations

import math

import numpy as np

from ._common import (_empty_final_states, _f64, _passthrough_slots, _segments, _sigmoid, silu,
                      softplus)

__all__ = ["ssd", "ssd_vjp"]


def _effective_dt(dt, dt_bias, dt_softplus, dt_limit):
    """dt' = clip(softplus?(dt + dt_bias), dt_limit), with what its gradient needs.

    Returns ``(raw, dt_eff, grad_factor)``: ``raw = dt + dt_bias`` and
    ``d dt_eff / d raw`` (zero where the limit clips). As in mamba_ssm, the
    default limit ``(0, inf)`` means no clipping at all.
    """
    raw = dt if dt_bias is None else dt + dt_bias[None, None, :]
    if dt_softplus:
        v = softplus(raw)
        factor = np.where(raw <= 20.0, _sigmoid(np.minimum(raw, 20.0)), 1.0)
    else:
        v, factor = raw, np.ones_like(raw)
    lo, hi = float(dt_limit[0]), float(dt_limit[1])
    if (lo, hi) != (0.0, math.inf):
        factor = np.where((v >= lo) & (v <= hi), factor, 0.0)
        v = np.clip(v, lo, hi)
    return raw, v, factor


def _expand_groups(X, H):
    """(batch, L, G, N) -> (batch, L, H, N): head h uses group h // (H // G)."""
    return np.repeat(X, H // X.shape[2], axis=2)


def _run(x, dt, A, B, C, h0, restart):
    """The recurrence; returns the states after every step, (L, batch, H, P, N), and h_{-1}."""
    batch, L, H, P = x.shape
    N = B.shape[-1]
    h = np.zeros((batch, H, P, N)) if h0 is None else h0.copy()
    h_init = h.copy()
    states = np.empty((L, batch, H, P, N))
    for t in range(L):
        decay = np.exp(dt[:, t] * A[None])  # (batch, H)
        decay = np.where(restart[:, t, None], 0.0, decay)
        inflow = (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t, :, None, :]  # dt x (outer) B
        h = decay[..., None, None] * h + inflow
        states[t] = h
    return states, h_init


def ssd(x, dt, A, B, C, *, chunk_size=256, D=None, z=None, dt_bias=None, dt_softplus=False,
        dt_limit=(0.0, math.inf), initial_state=None, seq_idx=None, cu_seqlens=None,
        return_final_state=False):
    """Mamba-2's SSD scan, step by step in float64.

    Parameters are those of :func:`ssmkit.ssd`; ``chunk_size`` is accepted and
    ignored (the result does not depend on it).

    Notes
    -----
    For every batch row b and head h, with state ``h = initial_state or 0``
    (P x N) and ``dt' = clip(softplus?(dt + dt_bias), dt_limit)``::

        h_t = exp(dt'_t A[h]) h_{t-1} + dt'_t x_t (outer) B_t    (h_{t-1} = 0 where seq_idx changes)
        y_t = h_t C_t + D x_t                                    (times silu(z_t) when z is given)
    """
    out, _ = _forward(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_state,
                      seq_idx, cu_seqlens)
    y, final = out
    return (y, final) if return_final_state else y


def _forward(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_state, seq_idx,
             cu_seqlens):
    x, dt, A, D, z, dt_bias, h0 = map(_f64, (x, dt, A, D, z, dt_bias, initial_state))
    batch, L, H, P = x.shape
    Bh, Ch = _expand_groups(_f64(B), H), _expand_groups(_f64(C), H)
    N = Bh.shape[-1]
    raw, dte, factor = _effective_dt(dt, dt_bias, dt_softplus, dt_limit)
    restart, slot = _segments(batch, L, seq_idx, cu_seqlens)
    states, h_init = _run(x, dte, A, Bh, Ch, h0, restart)
    y_pre = np.einsum("tbhpn,bthn->bthp", states, Ch)
    Dhp = None if D is None else (D[:, None] if D.ndim == 1 else D)
    if Dhp is not None:
        y_pre = y_pre + Dhp[None, None] * x
    y = y_pre * silu(z) if z is not None else y_pre
    n_slots = batch if cu_seqlens is None else len(cu_seqlens) - 1
    final = _empty_final_states((n_slots, H, P, N), cu_seqlens, h0, batch, L)
    for b, t in zip(*np.nonzero(slot >= 0)):
        final[slot[b, t]] = states[t, b]
    saved = dict(x=x, dte=dte, raw=raw, factor=factor, A=A, Bh=Bh, Ch=Ch, Dhp=Dhp, z=z,
                 y_pre=y_pre, states=states, h_init=h_init, restart=restart, slot=slot)
    return (y, final), saved


def ssd_vjp(x, dt, A, B, C, *, chunk_size=256, D=None, z=None, dt_bias=None, dt_softplus=False,
            dt_limit=(0.0, math.inf), initial_state=None, seq_idx=None, cu_seqlens=None,
            return_final_state=False):
    """The SSD scan and its pullback, in float64.

    Returns ``(out, pullback)``: ``out`` is what :func:`ssd` returns and
    ``pullback(dy)`` or ``pullback(dy, dfinal_state)`` returns an
    :class:`~ssmkit.SSDGrads`. This reference keeps every state.

    Notes
    -----
    With ``g`` the adjoint of the state (P x N), walking time backwards::

        g += dfinal (at steps that end a sequence);  g += dy_t (outer) C_t
        dC_t = sum_p dy_t h_t;   dB_t = sum_p g dt'_t x_t;   dx_t = dt'_t g B_t + D dy_t
        ddt'_t = sum (g (A a_t h_{t-1} + x_t B_t)),   dA += dt'_t sum (g a_t h_{t-1})
        g *= a_t     (a_t = exp(dt'_t A), 0 where a sequence starts)

    and ``dinitial_state`` is the final ``g``. The gradient through the
    clip of ``dt_limit`` is zero where it clips.
    """
    from .._ssd import SSDGrads

    (y, final), s = _forward(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit,
                             initial_state, seq_idx, cu_seqlens)
    out = (y, final) if return_final_state else y
    xs, dte, A64, Bh, Ch, states = s["x"], s["dte"], s["A"], s["Bh"], s["Ch"], s["states"]
    batch, L, H, P = xs.shape
    N = Bh.shape[-1]

    def pullback(dy=None, dfinal_state=None):
        dy = np.zeros_like(y) if dy is None else _f64(dy)
        z64 = s["z"]
        dz = None
        if z64 is not None:
            sg = _sigmoid(z64)
            dz = dy * s["y_pre"] * sg * (1.0 + z64 * (1.0 - sg))
            dy = dy * z64 * sg
        dfin = None if dfinal_state is None else _f64(dfinal_state)
        g = np.zeros((batch, H, P, N))
        dx, ddte = np.zeros_like(xs), np.zeros_like(dte)
        dA = np.zeros((batch, H))
        dBh, dCh = np.zeros_like(Bh), np.zeros_like(Ch)
        for t in range(L - 1, -1, -1):
            if dfin is not None:
                for b in range(batch):
                    if s["slot"][b, t] >= 0:
                        g[b] += dfin[s["slot"][b, t]]
            h_prev = states[t - 1] if t > 0 else s["h_init"]
            a_t = np.exp(dte[:, t] * A64[None])
            a_t = np.where(s["restart"][:, t, None], 0.0, a_t)[..., None, None]
            g = g + dy[:, t, :, :, None] * Ch[:, t, :, None, :]
            dCh[:, t] = np.einsum("bhp,bhpn->bhn", dy[:, t], states[t])
            dBh[:, t] = np.einsum("bhpn,bhp->bhn", g, dte[:, t, :, None] * xs[:, t])
            gB = np.einsum("bhpn,bhn->bhp", g, Bh[:, t])
            dx[:, t] = dte[:, t, :, None] * gB
            decayed = (g * a_t * h_prev).sum(axis=(2, 3))
            ddte[:, t] = A64[None] * decayed + (gB * xs[:, t]).sum(-1)
            dA += dte[:, t] * decayed
            g = g * a_t
        if dfin is not None:
            for slot, row in _passthrough_slots(batch, L, cu_seqlens):
                g[row] += dfin[slot]
        if s["Dhp"] is not None:
            dx += s["Dhp"][None, None] * dy
        ddt_raw = ddte * s["factor"]
        G_B, G_C = np.shape(B)[2], np.shape(C)[2]
        dD = None
        if D is not None:
            dD = (dy * xs).sum(axis=(0, 1))
            if np.ndim(D) == 1:
                dD = dD.sum(-1)
        return SSDGrads(
            x=dx,
            dt=ddt_raw,
            A=dA.sum(axis=0),
            B=dBh.reshape(batch, L, G_B, H // G_B, N).sum(axis=3),
            C=dCh.reshape(batch, L, G_C, H // G_C, N).sum(axis=3),
            D=dD,
            z=dz,
            dt_bias=None if dt_bias is None else ddt_raw.sum(axis=(0, 1)),
            initial_state=None if initial_state is None else g,
        )

    return out, pullback
