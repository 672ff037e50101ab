"""Pointwise functions the references share, in float64."""

from __future__ import annotations

import numpy as np

__all__ = ["softplus", "silu"]


def softplus(x):
    """``log1p(exp(x))`` for ``x <= 20``, ``x`` above (the threshold every peer uses)."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(x <= 20.0, np.log1p(np.exp(np.minimum(x, 20.0))), x)


def silu(x):
    """``x * sigmoid(x)``."""
    x = np.asarray(x, dtype=np.float64)
    return x / (1.0 + np.exp(-x))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _f64(x):
    return None if x is None else np.asarray(x, dtype=np.float64)


def _segments(batch, L, seq_idx, cu_seqlens):
    """Restart flags (batch, L) and the slot each step's state is reported in.

    ``restart[b, t]``: the state is zero before step t (a new sequence starts).
    ``slot[b, t]``: index of the final state that is the state after step t, or -1.
    """
    if cu_seqlens is not None:
        cu = np.asarray(cu_seqlens, dtype=np.int64)
        seq_idx = np.searchsorted(cu[1:], np.arange(L), side="right")[None]
    restart = np.zeros((batch, L), dtype=bool)
    if seq_idx is not None:
        seq_idx = np.asarray(seq_idx)
        restart[:, 1:] = seq_idx[:, 1:] != seq_idx[:, :-1]
    slot = np.full((batch, L), -1, dtype=np.int64)
    if cu_seqlens is not None:
        for i in range(len(cu) - 1):
            if cu[i + 1] > cu[i]:
                slot[0, cu[i + 1] - 1] = i
    elif L > 0:
        slot[:, L - 1] = np.arange(batch)
    return restart, slot


def _passthrough_slots(batch, L, cu_seqlens):
    """(slot, row) pairs whose final state is the initial state of that row.

    A sequence without steps ends in the state it starts from: the initial
    state for an empty sequence at offset 0 (or every row when L is 0), zeros
    for any other.
    """
    if cu_seqlens is None:
        return [(b, b) for b in range(batch)] if L == 0 else []
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    return [(i, 0) for i in range(len(cu) - 1) if cu[i + 1] == cu[i] == 0]


def _empty_final_states(shape, cu_seqlens, h0, batch, L):
    """Final states before the scan writes them: zeros, or h0 for sequences without steps."""
    final = np.zeros(shape)
    if h0 is not None:
        for slot, row in _passthrough_slots(batch, L, cu_seqlens):
            final[slot] = h0[row]
    return final
