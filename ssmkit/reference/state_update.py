"""Float64 reference for the recurrent step (decoding), one token at a time."""

from __future__ import annotations

import numpy as np

from ._common import _f64, silu, softplus

__all__ = ["state_update"]


def _tokens_last_to_first(X, multi, token_axis):
    """A per-token array with the token axis moved to axis 1 (added, length 1, if absent)."""
    X = _f64(X)
    if not multi:
        return X[:, None]
    return np.moveaxis(X, token_axis, 1)


def state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                 state_batch_indices=None):
    """The recurrent step of :func:`ssmkit.state_update`, token by token in float64.

    Takes the arguments of :func:`ssmkit.state_update` but does not modify
    ``state``: it returns the new state instead.

    Returns
    -------
    y : ndarray, float64
        The shape of ``x`` (one token) or with the token axis of ``x``.
    new_state : ndarray, float64
        A copy of ``state`` (the whole pool when ``state_batch_indices`` is
        given) after the steps.

    Notes
    -----
    The layout follows ``state.ndim``: 4 is Mamba-2 (state (batch, H, P, N)), 3
    is Mamba-1 (state (batch, dim, N), which is the Mamba-2 layout with one head
    of ``P = dim`` channels). ``x`` has a token axis when ``x.ndim ==
    state.ndim``. For each row b, channel (h, p) and token t, with
    ``s = state[state_batch_indices[b]]`` (or ``state[b]``)::

        dt' = dt + dt_bias, then softplus(dt') when dt_softplus
        s[n] = exp(dt' A[h, p, n]) s[n] + dt' x B_g[n]     (g: the group of (h, p))
        y    = sum_n C_g[n] s[n] + D[h, p] x, then y silu(z) when z is given

    A row whose index is negative is padding: its state is not touched and its
    ``y`` is zero.
    """
    state = np.asarray(state)
    new_state = _f64(state).copy()
    mamba2 = state.ndim == 4
    x = np.asarray(x)
    multi = x.ndim == state.ndim
    if mamba2:
        # x (batch[, T], H, P); B (batch[, T], G, N): the token axis is axis 1 already.
        X = _tokens_last_to_first(x, multi, 1)
        DT = _tokens_last_to_first(dt, multi, 1)
        Z = None if z is None else _tokens_last_to_first(z, multi, 1)
        Bt = _tokens_last_to_first(B, multi, 1)
        Ct = _tokens_last_to_first(C, multi, 1)
        A4 = _f64(A)
        D4 = None if D is None else _f64(D)
        bias = None if dt_bias is None else _f64(dt_bias)
    else:
        # Mamba-1 as one head of dim channels: x (batch[, dim, T]) -> (batch, T, 1, dim).
        X = _tokens_last_to_first(x, multi, 2)[:, :, None]
        DT = _tokens_last_to_first(dt, multi, 2)[:, :, None]
        Z = None if z is None else _tokens_last_to_first(z, multi, 2)[:, :, None]

        def bc(M):
            M = np.asarray(M)
            single_ndim = 2 if not multi else 3
            if M.ndim == single_ndim:  # no group axis: one group
                M = M[:, None]
            # (batch, G, N[, T]) -> (batch, T, G, N)
            return _tokens_last_to_first(M, multi, 3)

        Bt, Ct = bc(B), bc(C)
        A4 = _f64(A)[None]
        D4 = None if D is None else _f64(D)[None]
        bias = None if dt_bias is None else _f64(dt_bias)[None]
        new_state = new_state[:, None]  # (pool, 1, dim, N), a view: writes land in new_state

    batch, T, H, P = X.shape
    G = Bt.shape[2]
    per_group = H * P // G
    rows = (np.arange(batch) if state_batch_indices is None
            else np.asarray(state_batch_indices, dtype=np.int64))
    group = (np.arange(H * P) // per_group).reshape(H, P)  # the group of each channel (h, p)
    y = np.zeros((batch, T, H, P))
    for b in range(batch):
        if rows[b] < 0:
            continue
        s = new_state[rows[b]]  # (H, P, N), a view
        for t in range(T):
            d = DT[b, t] if bias is None else DT[b, t] + bias
            if dt_softplus:
                d = softplus(d)
            Bg, Cg = Bt[b, t][group], Ct[b, t][group]  # (H, P, N)
            s[...] = np.exp(d[..., None] * A4) * s + (d * X[b, t])[..., None] * Bg
            out = (Cg * s).sum(axis=-1)
            if D4 is not None:
                out = out + D4 * X[b, t]
            if Z is not None:
                out = out * silu(Z[b, t])
            y[b, t] = out
    if not mamba2:
        new_state = new_state[:, 0]
        y = y[:, :, 0, :]  # (batch, T, dim)
        y = np.moveaxis(y, 1, 2) if multi else y[:, 0]
    elif not multi:
        y = y[:, 0]
    return y, new_state
