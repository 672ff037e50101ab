"""The Mamba-1 selective scan's forward through the Numba CUDA linear scans.

The measured alternative to the fused CUDA C++ kernel of :mod:`ssmkit._gpu`:
the discretisation and the output contraction run as CuPy array expressions,
the recurrence as one :func:`ssmkit._numba_cuda.linear_scan.linear_scan_rows`
call over the ``batch * dim * N`` rows of length ``L``, with any of its
algorithms. Unfused, it holds ``a_t = exp(dt_t A)``, ``b_t = dt_t B_t u_t`` and
the states as ``(batch, dim, N, L)`` arrays of the compute dtype: about
``3 * batch * dim * N * L`` values beside the inputs, where the fused kernel
keeps the states in registers.

It implements the forward of the backend contract of :mod:`ssmkit._problem`;
the backward is not provided (``selective_scan_vjp`` refuses this backend).
"""

from __future__ import annotations

from .linear_scan import linear_scan_rows

__all__ = ["selective_scan_forward"]


def _per_step(xp, X, batch, dim, L, dtype):
    """B or C as a (batch, dim, N, L) array (a broadcast view where possible)."""
    X = X.astype(dtype, copy=False)
    if X.ndim == 2:  # (dim, N): the same at every step
        return X[None, :, :, None]
    G = X.shape[1]  # (batch, G, N, L): channel d uses group d // (dim // G)
    N = X.shape[2]
    full = xp.broadcast_to(X[:, :, None], (batch, G, dim // G, N, L))
    return full.reshape(batch, dim, N, L)


def selective_scan_forward(p, *, save_checkpoints, algorithm="auto"):
    """Forward of the backend contract (``checkpoints`` is always None).

    Parameters
    ----------
    p : SelectiveScanProblem
        CuPy arrays, batch, dim, L and N of at least 1.
    save_checkpoints : bool
        Must be False: this backend has no backward.
    algorithm : str
        The linear-scan algorithm (``"auto"`` or a name of
        :func:`ssmkit.linear_scan_algorithms`).

    Returns
    -------
    y : cupy.ndarray, (batch, dim, L), ``p.io_dtype``
    final_state : cupy.ndarray, (batch, dim, N), ``p.compute_dtype``
    checkpoints : None
    """
    if save_checkpoints:
        raise ValueError("selective_scan_vjp: backend 'numba' has no backward; "
                         "use backend=None or 'cuda'")
    import cupy as xp

    cd = p.compute_dtype
    batch, dim, L, N = p.batch, p.dim, p.L, p.N
    u = p.u.astype(cd)
    dt = p.delta.astype(cd)
    if p.delta_bias is not None:
        dt = dt + p.delta_bias[None, :, None]
    if p.delta_softplus:
        dt = xp.where(dt <= 20, xp.log1p(xp.exp(xp.minimum(dt, 20))), dt)
    a = xp.exp(dt[:, :, None, :] * p.A[None, :, :, None])  # (batch, dim, N, L)
    B = _per_step(xp, p.B, batch, dim, L, cd)
    bx = (dt * u)[:, :, None, :] * B
    rows = batch * dim * N
    h0 = (xp.zeros(rows, cd) if p.initial_state is None
          else p.initial_state.reshape(rows))
    h, final = linear_scan_rows(a.reshape(rows, L), xp.ascontiguousarray(bx).reshape(rows, L),
                                h0, False, algorithm)
    del a, bx
    C = _per_step(xp, p.C, batch, dim, L, cd)
    y = (C * h.reshape(batch, dim, N, L)).sum(axis=2)
    if p.D is not None:
        y += p.D[None, :, None] * u
    if p.z is not None:
        z = p.z.astype(cd)
        y *= z / (1 + xp.exp(-z))
    return y.astype(p.io_dtype, copy=False), final.reshape(batch, dim, N), None
