"""Numba kernel for the recurrent step (``ssmkit.state_update``) on NumPy arrays.

The public layer hands over a :class:`ssmkit._state_update.StateUpdateProblem`
(every array a view in the Mamba-2 layout with a token axis). This module
copies what it works on into C-contiguous arrays of the compute dtype (so the
kernel is compiled for two signatures only, float32 and float64), runs the
kernel, and writes the updated rows back into the user's state and the output
into ``p.y``. Nothing is written to the user's arrays before the kernel has
finished, and the public layer has validated everything before this runs.

Each parallel iteration owns one (row, head) pair, so no two write the same
state; within it the steps run in token order and the sum over ``n`` runs in
the order of ``n``.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

__all__ = ["state_update"]


@njit(cache=True, parallel=True, fastmath=False, error_model="numpy")
def _state_update_kernel(state, slot, x, dt, z, A, B, C, D, bias, y, has_z, has_d, has_bias,
                         softplus, heads_per_group, zero):
    """state (S, H, P, N) in place; y (batch, T, H, P) written for rows with slot >= 0."""
    batch, T, H, P = x.shape
    N = state.shape[3]
    one = zero + 1
    for bh in prange(batch * H):
        b = bh // H
        h = bh - b * H
        r = slot[b]
        if r < 0:  # padding: y stays zero, no state is touched
            continue
        g = h // heads_per_group
        for p in range(P):
            dd = zero
            xx = zero
            for t in range(T):
                xx = x[b, t, h, p]
                dd = dt[b, t, h, p]
                if has_bias:
                    dd += bias[h, p]
                if softplus and dd <= 20:
                    dd = math.log1p(math.exp(dd))
                dx = dd * xx
                acc = zero
                for n in range(N):
                    s = math.exp(dd * A[h, p, n]) * state[r, h, p, n] + dx * B[b, t, g, n]
                    state[r, h, p, n] = s
                    acc += s * C[b, t, g, n]
                if has_d:
                    acc += D[h, p] * xx
                if has_z:
                    zz = z[b, t, h, p]
                    acc *= zz / (one + math.exp(-zz))
                y[b, t, h, p] = acc


def _work(a, dtype, ndim):
    """A C-contiguous copy (or the array itself) in ``dtype``; a 1-element stand-in for None."""
    if a is None:
        return np.zeros((1,) * ndim, dtype=dtype)
    return np.ascontiguousarray(a, dtype=dtype)


def state_update(p) -> None:
    """Run the steps of problem ``p`` (NumPy arrays): update the state, fill the output."""
    cd = p.compute_dtype
    state = p.view("state")  # (S, H, P, N), a view of the user's state
    if p.rows is None:
        used = None
        slot = np.arange(p.batch, dtype=np.int64)
        inplace = state.dtype == cd and state.flags.c_contiguous
        work = state if inplace else np.ascontiguousarray(state, dtype=cd)
    else:
        valid = p.rows >= 0
        used = p.rows[valid]
        slot = np.full(p.batch, -1, dtype=np.int64)
        slot[valid] = np.arange(used.size)
        work = np.ascontiguousarray(state[used], dtype=cd)  # fancy indexing: a copy
        inplace = False
    y = np.zeros(p.shape("y"), dtype=cd)

    def arg(name, ndim):
        return _work(p.view(name), cd, ndim)

    _state_update_kernel(
        work, slot, arg("x", 4), arg("dt", 4), arg("z", 4), arg("A", 3), arg("B", 4),
        arg("C", 4), arg("D", 2), arg("dt_bias", 2), y,
        p.arrays["z"] is not None, p.arrays["D"] is not None, p.arrays["dt_bias"] is not None,
        bool(p.dt_softplus), p.H // p.G, cd.type(0))
    # Write back only now that every step has run: a refused or failed call never half-updates.
    if used is not None:
        state[used] = work.astype(state.dtype, copy=False)
    elif not inplace:
        state[...] = work.astype(state.dtype, copy=False)
    out = p.view("y")
    out[...] = y.astype(out.dtype, copy=False)
