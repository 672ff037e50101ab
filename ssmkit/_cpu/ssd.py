"""Numba kernels for Mamba-2's SSD scan on NumPy arrays.

Implements the backend contract stated in ``ssmkit._ssd``: :func:`ssd_forward`
and :func:`ssd_backward`.

Layout of the work
------------------
On a CPU the recurrence itself is the cheapest form of the computation (about
4 P N flops per step and head, against the chunked form's extra Q x Q
matrices), so the kernels run it step by step. The (batch, head) pairs are
independent and run in parallel; each keeps its P x N state in a small
thread-local array, and every inner loop runs over the N contiguous state
entries of one channel, which LLVM vectorises (the kernels allow
reassociation, so the sums over ``n`` vectorise too; their order is fixed by
the compiled code, so results do not change from run to run).

A restart (a change of ``seq_idx``) multiplies the state by ``keep[b, t] = 0``
instead of ``exp(dt' A)``, so the hot loop has no branch.

Checkpoints and the backward
----------------------------
``checkpoints`` is a ``(batch, H, n_chunks, P, N)`` array: the state entering
step ``c * chunk_size``. The backward walks the chunks in reverse; for each it
recomputes the chunk's states from its checkpoint into a thread-local buffer and
runs the adjoint recurrence back through it. A long chunk goes in runs, last run
first (``_run_steps``), so that the buffer stays in a core's cache. Sums over
heads of a group (``dB``, ``dC``) and over the batch (``dA``, ``dD``) are written
as per-(batch, head) partials and summed afterwards in a fixed order: the
gradients are deterministic.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .._ssd import effective_dt
from .selective_scan import _sigmoid  # (an FMA polynomial; libm's exp is slower)

__all__ = ["ssd_forward", "ssd_backward"]

# Reassociation lets LLVM vectorise the sums over n; no nnan/ninf, so
# infinities and NaNs propagate as written.
_KERNEL_OPTIONS = dict(cache=True, error_model="numpy",
                       fastmath={"reassoc", "contract", "nsz", "arcp"})


def _keep(p):
    """(batch, L) in the compute dtype: 0 where a new sequence starts, 1 elsewhere."""
    keep = np.ones((p.batch, p.L), dtype=p.compute_dtype)
    if p.seq_idx is not None and p.L > 1:
        keep[:, 1:] = p.seq_idx[:, 1:] == p.seq_idx[:, :-1]
    return keep


@njit(parallel=True, **_KERNEL_OPTIONS)
def _forward_kernel(x, dte, A, B, C, D, z, h0, keep, slot, has_z, Q, save, y, final, ckpt):
    batch, L, H, P = x.shape
    N = B.shape[3]
    heads_per_b = H // B.shape[2]
    heads_per_c = H // C.shape[2]
    for i in prange(batch * H):
        b = i // H
        h = i - b * H
        gb = h // heads_per_b
        gc = h // heads_per_c
        st = h0[b, h].copy()
        for t in range(L):
            if save and t % Q == 0:
                # element by element: the array assignment took about 50 us per
                # checkpoint here (6.8x the forward's time at chunk_size 16)
                dst = ckpt[b, h, t // Q]
                for p in range(P):
                    for n in range(N):
                        dst[p, n] = st[p, n]
            dtv = dte[b, t, h]
            decay = math.exp(dtv * A[h]) * keep[b, t]
            Bt = B[b, t, gb]
            Ct = C[b, t, gc]
            for p in range(P):
                xv = x[b, t, h, p]
                xs = dtv * xv
                acc = A.dtype.type(0)
                row = st[p]
                for n in range(N):
                    v = decay * row[n] + xs * Bt[n]
                    row[n] = v
                    acc += v * Ct[n]
                yv = acc + D[h, p] * xv
                if has_z:
                    zv = z[b, t, h, p]
                    yv = yv * (zv * _sigmoid(zv))
                y[b, t, h, p] = yv
            s = slot[b, t]
            if s >= 0:
                final[s, h] = st


# The backward recomputes a chunk's states into a buffer and walks it backwards. Past
# _WHOLE_CHUNK_BYTES of states (a chunk of 1024 steps at P 64, N 64 is 16 MB per thread) the
# buffer leaves the caches, so the chunk goes in runs of _RUN_BYTES, last run first: the
# states entering each run first (one more pass over the chunk's recurrence), then each run's
# states. Measured in benchmarks/SSD.md ("The CPU backward's recompute in runs").
_WHOLE_CHUNK_BYTES = 6 << 20
_RUN_BYTES = 2 << 20


def _state_bytes(P, N, dtype):
    """Bytes of one recomputed state (P, N) in the compute dtype."""
    return P * N * np.dtype(dtype).itemsize


def _run_steps(p):
    """Steps per recomputed run of the CPU backward: the whole chunk while its states fit
    ``_WHOLE_CHUNK_BYTES``, else ``_RUN_BYTES`` worth (at least 1 step)."""
    per_step = _state_bytes(p.P, p.N, p.compute_dtype)
    chunk = min(p.chunk_size, p.L)
    if (chunk + 1) * per_step <= _WHOLE_CHUNK_BYTES:
        return chunk
    return max(1, min(chunk, _RUN_BYTES // per_step - 1))


@njit(forceinline=True, **_KERNEL_OPTIONS)
def _copy_state(dst, src):
    """dst[:] = src for (P, N) states, element by element."""
    for p in range(dst.shape[0]):
        for n in range(dst.shape[1]):
            dst[p, n] = src[p, n]


@njit(forceinline=True, **_KERNEL_OPTIONS)
def _advance(st, t, b, h, gb, x, dte, A, B, keep):
    """The state st (P, N) of head h, row b, across step t, in place. (The runs' starts pass
    uses it: recomputed into buf rows as the run pass does, that pass took 8% longer at
    chunks of 1024 and 4096.)"""
    dtv = dte[b, t, h]
    decay = math.exp(dtv * A[h]) * keep[b, t]
    Bt = B[b, t, gb]
    for p in range(st.shape[0]):
        xs = dtv * x[b, t, h, p]
        row = st[p]
        for n in range(st.shape[1]):
            row[n] = decay * row[n] + xs * Bt[n]


@njit(parallel=True, **_KERNEL_OPTIONS)
def _backward_kernel(x, dte, A, B, C, D, z, keep, slot, dy, dfinal, has_dfinal, has_z, Q, R,
                     ckpt, dx, ddte, dA_part, dBh, dCh, dD_part, dz, dh0):
    batch, L, H, P = x.shape
    N = B.shape[3]
    heads_per_b = H // B.shape[2]
    heads_per_c = H // C.shape[2]
    n_chunks = ckpt.shape[2]
    zero = A.dtype.type(0)
    one = A.dtype.type(1)
    for i in prange(batch * H):
        b = i // H
        h = i - b * H
        gb = h // heads_per_b
        gc = h // heads_per_c
        # runs of R steps (_run_steps): the states entering them, and one run's states
        starts = np.empty(((Q + R - 1) // R, P, N), dtype=A.dtype)
        buf = np.empty((R + 1, P, N), dtype=A.dtype)
        g = np.zeros((P, N), dtype=A.dtype)
        dyv = np.empty(P, dtype=A.dtype)
        dB_row = np.empty(N, dtype=A.dtype)
        dC_row = np.empty(N, dtype=A.dtype)
        dA_acc = zero
        for c in range(n_chunks - 1, -1, -1):
            t0 = c * Q
            n_steps = min(L, t0 + Q) - t0
            n_runs = (n_steps + R - 1) // R
            _copy_state(starts[0], ckpt[b, h, c])
            for j in range(1, n_runs):
                _copy_state(starts[j], starts[j - 1])
                for k in range((j - 1) * R, j * R):
                    _advance(starts[j], t0 + k, b, h, gb, x, dte, A, B, keep)
            for j in range(n_runs - 1, -1, -1):
                k0 = j * R
                run_steps = min(R, n_steps - k0)
                _copy_state(buf[0], starts[j])
                for k in range(run_steps):  # recompute the run's states
                    t = t0 + k0 + k
                    dtv = dte[b, t, h]
                    decay = math.exp(dtv * A[h]) * keep[b, t]
                    Bt = B[b, t, gb]
                    for p in range(P):
                        xs = dtv * x[b, t, h, p]
                        for n in range(N):
                            buf[k + 1, p, n] = decay * buf[k, p, n] + xs * Bt[n]
                for k in range(run_steps - 1, -1, -1):  # the adjoint recurrence, backwards
                    t = t0 + k0 + k
                    dtv = dte[b, t, h]
                    decay = math.exp(dtv * A[h]) * keep[b, t]
                    Bt = B[b, t, gb]
                    Ct = C[b, t, gc]
                    s = slot[b, t]
                    if has_dfinal and s >= 0:
                        g += dfinal[s, h]
                    for p in range(P):
                        dyo = dy[b, t, h, p]
                        if has_z:
                            acc = zero
                            for n in range(N):
                                acc += buf[k + 1, p, n] * Ct[n]
                            y_pre = acc + D[h, p] * x[b, t, h, p]
                            zv = z[b, t, h, p]
                            sg = _sigmoid(zv)
                            dz[b, t, h, p] = dyo * y_pre * sg * (one + zv * (one - sg))
                            dyo = dyo * zv * sg
                        dyv[p] = dyo
                        dD_part[b, h, p] += dyo * x[b, t, h, p]
                    dB_row[:] = zero
                    dC_row[:] = zero
                    s1 = zero  # sum g a h_{t-1} / a, i.e. sum g h_{t-1}
                    s2 = zero  # sum_p x_p (g B)_p
                    for p in range(P):
                        dyp = dyv[p]
                        xv = x[b, t, h, p]
                        xs = dtv * xv
                        gB = zero
                        s1p = zero
                        grow = g[p]
                        hnew = buf[k + 1, p]
                        hold = buf[k, p]
                        for n in range(N):
                            dC_row[n] += dyp * hnew[n]
                            gv = grow[n] + dyp * Ct[n]
                            dB_row[n] += gv * xs
                            gB += gv * Bt[n]
                            s1p += gv * hold[n]
                            grow[n] = gv * decay
                        dx[b, t, h, p] = dtv * gB + D[h, p] * dyp
                        s1 += s1p
                        s2 += gB * xv
                    dBh[b, t, h] = dB_row
                    dCh[b, t, h] = dC_row
                    ddte[b, t, h] = A[h] * decay * s1 + s2
                    dA_acc += dtv * decay * s1
        dA_part[b, h] = dA_acc
        dh0[b, h] = g


def _dummy(dtype):
    return np.zeros((1, 1, 1, 1), dtype=dtype)


def ssd_forward(p, *, save_checkpoints, final_states=True):
    """Run the scan. See the backend contract in ``ssmkit._ssd`` (``final_states`` False:
    none written, None returned)."""
    cd = p.compute_dtype
    dte, _ = effective_dt(p)
    D = p.D if p.D is not None else np.zeros((p.H, p.P), dtype=cd)
    h0 = (p.initial_state if p.initial_state is not None
          else np.zeros((p.batch, p.H, p.P, p.N), dtype=cd))
    y = np.empty(p.x.shape, dtype=p.io_dtype)
    final = np.zeros((p.n_slots if final_states else 0, p.H, p.P, p.N), dtype=cd)
    slot = p.slot if final_states else np.full_like(p.slot, -1)
    ckpt = (np.empty((p.batch, p.H, p.n_chunks, p.P, p.N), dtype=cd) if save_checkpoints
            else np.empty((1, 1, 1, 1, 1), dtype=cd))
    z = p.z if p.z is not None else _dummy(p.io_dtype)
    _forward_kernel(p.x, dte, p.A, p.B, p.C, D, z, h0, _keep(p), slot, p.z is not None,
                    min(p.chunk_size, p.L), save_checkpoints, y, final, ckpt)
    return y, (final if final_states else None), (ckpt if save_checkpoints else None)


def ssd_backward(p, checkpoints, dy, dfinal):
    """Gradients of every argument. See the backend contract in ``ssmkit._ssd``."""
    cd = p.compute_dtype
    batch, L, H, P, N = p.batch, p.L, p.H, p.P, p.N
    dte, factor = effective_dt(p)
    D = p.D if p.D is not None else np.zeros((H, P), dtype=cd)
    z = p.z if p.z is not None else _dummy(p.io_dtype)
    dx = np.empty(p.x.shape, dtype=p.io_dtype)
    dz = np.empty(p.x.shape, dtype=p.io_dtype) if p.z is not None else _dummy(p.io_dtype)
    ddte = np.empty((batch, L, H), dtype=cd)
    dA_part = np.empty((batch, H), dtype=cd)
    dBh = np.empty((batch, L, H, N), dtype=cd)
    dCh = np.empty((batch, L, H, N), dtype=cd)
    dD_part = np.zeros((batch, H, P), dtype=cd)
    dh0 = np.empty((batch, H, P, N), dtype=cd)
    has_dfinal = dfinal is not None
    dfin = dfinal if has_dfinal else _dummy(cd)
    _backward_kernel(p.x, dte, p.A, p.B, p.C, D, z, _keep(p), p.slot, dy, dfin, has_dfinal,
                     p.z is not None, min(p.chunk_size, p.L), _run_steps(p), checkpoints, dx,
                     ddte, dA_part, dBh, dCh, dD_part, dz, dh0)
    ddt = ddte * factor
    GB, GC = p.B.shape[2], p.C.shape[2]
    return dict(
        x=dx,
        dt=ddt,
        A=dA_part.sum(axis=0),
        B=dBh.reshape(batch, L, GB, H // GB, N).sum(axis=3),
        C=dCh.reshape(batch, L, GC, H // GC, N).sum(axis=3),
        D=None if p.D is None else dD_part.sum(axis=0),
        z=dz if p.z is not None else None,
        dt_bias=None if p.dt_bias is None else ddt.sum(axis=(0, 1)),
        initial_state=None if p.initial_state is None else dh0,
    )
