"""The chunked SSD algorithm of the GPU kernels, written in NumPy, against the reference.

``cuda_src/ssd.cu`` computes SSD in chunks: per-chunk cumulative sums of dt' A,
chunk states, state passing, chunk-local outputs with the output correction,
and for the gradient the reverse passing of the state adjoint and the same
chunk-local products transposed. This file writes those formulas once more in
plain NumPy (same chunk boundaries, same masks, same order of pieces) and
checks them against the float64 step-by-step reference, so that the algebra
the kernels implement is tested on every machine, GPU or not.
"""

from __future__ import annotations

import numpy as np
import pytest

from ssmkit import reference as ref
from ssmkit._gpu.ssd import chunk_starts

from test_ssd import FIELDS, make_inputs


def _chunked(inputs, *, chunk_size, dt_softplus, cu_seqlens=None, dy=None, dfinal=None):
    """Forward (y, final states) and, given cotangents, the gradients, in the kernels' order."""
    x, dt, A, B, C = (inputs[k] for k in ("x", "dt", "A", "B", "C"))
    D, z, bias, h0, seq = (inputs[k] for k in ("D", "z", "dt_bias", "initial_state", "seq_idx"))
    batch, L, H, P = x.shape
    N = B.shape[3]
    Bh = np.repeat(B, H // B.shape[2], axis=2)
    Ch = np.repeat(C, H // C.shape[2], axis=2)
    Dhp = np.zeros((H, P)) if D is None else (np.repeat(D[:, None], P, 1) if D.ndim == 1 else D)
    raw = dt + (0 if bias is None else bias)
    dte = ref.softplus(raw) if dt_softplus else raw
    if cu_seqlens is not None:
        seq = np.searchsorted(np.asarray(cu_seqlens)[1:], np.arange(L), side="right")[None]
    if seq is None:
        seq = np.zeros((batch, L), dtype=int)
    starts = chunk_starts(L, chunk_size, cu_seqlens)
    nc = len(starts) - 1
    a = dte * A
    cum = np.empty_like(a)
    for c in range(nc):
        cum[:, starts[c]:starts[c + 1]] = np.cumsum(a[:, starts[c]:starts[c + 1]], axis=1)

    def lmask(b, t0, t1):
        """L[t, s] = [s <= t][seq_s == seq_t] exp(cum_t - cum_s), (Q, Q, H)."""
        sq = seq[b, t0:t1]
        ok = np.tril(np.ones((t1 - t0, t1 - t0), bool)) & (sq[:, None] == sq[None, :])
        cu = cum[b, t0:t1]
        diff = np.where(ok[..., None], cu[:, None, :] - cu[None, :, :], -np.inf)
        return np.exp(diff)

    def m_prev(b, t0, t1):
        return seq[b, t0:t1] == seq[b, max(t0 - 1, 0)]

    # forward: chunk states, passing, outputs
    states = np.zeros((batch, nc + 1, H, P, N))
    states[:, 0] = 0 if h0 is None else h0
    ycore = np.zeros_like(x)
    for b in range(batch):
        for c in range(nc):
            t0, t1 = starts[c], starts[c + 1]
            E = t1 - 1
            w = np.where((seq[b, t0:t1] == seq[b, E])[:, None],
                         np.exp(cum[b, E] - cum[b, t0:t1]) * dte[b, t0:t1], 0.0)  # (Q, H)
            S = np.einsum("sh,shp,shn->hpn", w, x[b, t0:t1], Bh[b, t0:t1])
            dE = np.where(m_prev(b, t0, t1)[-1], np.exp(cum[b, E]), 0.0)
            states[b, c + 1] = dE[:, None, None] * states[b, c] + S
            Lm = lmask(b, t0, t1)
            CB = np.einsum("thn,shn->tsh", Ch[b, t0:t1], Bh[b, t0:t1])
            intra = np.einsum("tsh,s h,shp->thp".replace(" ", ""), Lm * CB, dte[b, t0:t1],
                              x[b, t0:t1])
            scale = np.where(m_prev(b, t0, t1)[:, None], np.exp(cum[b, t0:t1]), 0.0)
            off = scale[..., None] * np.einsum("hpn,thn->thp", states[b, c], Ch[b, t0:t1])
            ycore[b, t0:t1] = intra + off
    y_pre = ycore + Dhp * x
    y = y_pre * ref.silu(z) if z is not None else y_pre
    # final states: the states at the chunk boundaries that end a row or a sequence
    if cu_seqlens is None:
        bounds = [(b, nc, b) for b in range(batch)]
    else:
        bounds = [(0, list(starts).index(cu_seqlens[i + 1]), i) for i in range(len(cu_seqlens) - 1)
                  if cu_seqlens[i + 1] > cu_seqlens[i]]  # empty sequences: the public layer
    n_slots = batch if cu_seqlens is None else len(cu_seqlens) - 1
    final = np.zeros((n_slots, H, P, N))
    for b, j, k in bounds:
        final[k] = states[b, j]
    if dy is None:
        return y, final

    # backward
    if z is not None:
        sg = 1.0 / (1.0 + np.exp(-z))
        dz = dy * y_pre * sg * (1.0 + z * (1.0 - sg))
        dY = dy * z * sg
    else:
        dz, dY = None, dy
    Finj = np.zeros((batch, nc + 1, H, P, N))  # dfinal injected at the chunk boundaries
    if dfinal is not None:
        for b, j, k in bounds:
            Finj[b, j] += dfinal[k]
    dHx = np.zeros((batch, nc, H, P, N))
    dinit = np.zeros((batch, H, P, N))
    GB = np.zeros_like(x)
    dBh = np.zeros((batch, L, H, N))
    dCh = np.zeros((batch, L, H, N))
    dcum = np.zeros_like(dte)
    for b in range(batch):
        g = Finj[b, nc]
        for c in range(nc - 1, -1, -1):
            t0, t1 = starts[c], starts[c + 1]
            E = t1 - 1
            dHx[b, c] = g
            mp = m_prev(b, t0, t1)
            K = np.einsum("th,thp,thn->hpn", np.where(mp[:, None], np.exp(cum[b, t0:t1]), 0.0),
                          dY[b, t0:t1], Ch[b, t0:t1])
            dE = np.where(mp[-1], np.exp(cum[b, E]), 0.0)
            g = dE[:, None, None] * g + K + Finj[b, c]
        dinit[b] = g
        for c in range(nc):
            t0, t1 = starts[c], starts[c + 1]
            E = t1 - 1
            Lm = lmask(b, t0, t1)  # [t, s]
            CB = np.einsum("thn,shn->tsh", Ch[b, t0:t1], Bh[b, t0:t1])
            dYX = np.einsum("thp,shp->tsh", dY[b, t0:t1], x[b, t0:t1])
            ex = np.where((seq[b, t0:t1] == seq[b, E])[:, None],
                          np.exp(cum[b, E] - cum[b, t0:t1]), 0.0)  # (Q, H) by s
            GB[b, t0:t1] = (np.einsum("tsh,thp->shp", Lm * CB, dY[b, t0:t1])
                            + ex[..., None] * np.einsum("hpn,shn->shp", dHx[b, c], Bh[b, t0:t1]))
            dBh[b, t0:t1] = dte[b, t0:t1, :, None] * (
                np.einsum("tsh,thn->shn", Lm * dYX, Ch[b, t0:t1])
                + ex[..., None] * np.einsum("hpn,shp->shn", dHx[b, c], x[b, t0:t1]))
            scale = np.where(m_prev(b, t0, t1)[:, None], np.exp(cum[b, t0:t1]), 0.0)
            dCh[b, t0:t1] = (np.einsum("tsh,sh,shn->thn", Lm * dYX, dte[b, t0:t1], Bh[b, t0:t1])
                             + scale[..., None] * np.einsum("hpn,thp->thn", states[b, c],
                                                             dY[b, t0:t1]))
            dcum[b, E] += np.einsum("hpn,hpn->h", dHx[b, c], states[b, c + 1])
    xGB = (x * GB).sum(-1)
    dcum += (dY * ycore).sum(-1) - dte * xGB
    sdcum = np.empty_like(dcum)  # sum over t >= r within the chunk
    for c in range(nc):
        t0, t1 = starts[c], starts[c + 1]
        sdcum[:, t0:t1] = np.cumsum(dcum[:, t0:t1][:, ::-1], axis=1)[:, ::-1]
    ddte = xGB + A * sdcum
    factor = np.where(raw <= 20.0, 1.0 / (1.0 + np.exp(-np.minimum(raw, 20.0))), 1.0) \
        if dt_softplus else np.ones_like(raw)
    ddt = ddte * factor
    GBs, GCs = B.shape[2], C.shape[2]
    grads = dict(
        x=dte[..., None] * GB + Dhp * dY,
        dt=ddt,
        A=(dte * sdcum).sum(axis=(0, 1)),
        B=dBh.reshape(batch, L, GBs, H // GBs, N).sum(3),
        C=dCh.reshape(batch, L, GCs, H // GCs, N).sum(3),
        D=None if D is None else ((dY * x).sum((0, 1)) if D.ndim == 2 else (dY * x).sum((0, 1, 3))),
        z=dz,
        dt_bias=None if bias is None else ddt.sum((0, 1)),
        initial_state=None if h0 is None else dinit,
    )
    return y, final, grads


@pytest.mark.parametrize("case", ["plain", "seq_idx", "cu_seqlens", "L1"])
@pytest.mark.parametrize("chunk", [1, 3, 8, 64])
def test_chunked_algorithm_matches_reference(case, chunk):
    rng = np.random.default_rng(hash((case, chunk)) % 2**32)
    L = 1 if case == "L1" else 29
    batch = 1 if case == "cu_seqlens" else 2
    cu = np.array([0, 5, 5, 12, 29]) if case == "cu_seqlens" else None
    inputs = make_inputs(rng, batch=batch, L=L, H=4, P=3, G=2, N=4, D_form="channel",
                         with_init=True, seq_cuts=[8, 11] if case == "seq_idx" else None)
    if inputs["seq_idx"] is None:
        inputs.pop("seq_idx")
        inputs["seq_idx"] = None
    dy = rng.standard_normal(inputs["x"].shape)
    n_slots = batch if cu is None else len(cu) - 1
    dfin = rng.standard_normal((n_slots, 4, 3, 4))
    y, fin, grads = _chunked(inputs, chunk_size=chunk, dt_softplus=True, cu_seqlens=cu, dy=dy,
                             dfinal=dfin)
    (y_r, fin_r), pb = ref.ssd_vjp(**inputs, dt_softplus=True, cu_seqlens=cu,
                                   return_final_state=True)
    assert np.allclose(y, y_r, rtol=1e-10, atol=1e-10)
    assert np.allclose(fin, fin_r, rtol=1e-10, atol=1e-10)
    g_r = pb(dy, dfin)
    for name in FIELDS:
        r = getattr(g_r, name)
        if r is None:
            assert grads[name] is None
            continue
        assert np.allclose(grads[name], r, rtol=1e-9, atol=1e-9), name


def test_chunk_starts_include_sequence_ends():
    assert list(chunk_starts(10, 4, None)) == [0, 4, 8, 10]
    assert list(chunk_starts(10, 4, np.array([0, 3, 3, 10]))) == [0, 3, 4, 8, 10]
    assert list(chunk_starts(1, 256, None)) == [0, 1]
