"""A float64 NumPy mirror of ssd.cu's ssd_chunk_mm (the CUDA-core products), to run the
backward with SSMKIT_SSD_MMA_BWD=0 in the emulation (the baseline the switch must match).
Imported by run_emu_bwd.py. EMU_R ("m", "b") with EMU_DT rounds the named operands to a dtype
to study rounding."""
import os, ml_dtypes
import numpy as np
from ssmkit._gpu import ssd as gssd
NULL = lambda a: a is gssd._NULL or a is None

def np_chunk_mm(name, args):
    (U, W, Vv, Mm, D, z, dte, cum, seq, starts, out, L, H, XU, XW, XV, K, V, nc, m_chunks,
     tiles) = args[:21]  # (then ssd_chunk_cb's blocks and classes: the same U W^T, unused here)
    flags = [a.strip() for a in name[name.index("<") + 1:-1].split(",")][5:8]
    upper, mt, dtq = (f == "true" for f in flags)
    batch = U.shape[0]
    hs = np.arange(H)
    hu, hw, hv = hs // (H // int(XU)), hs // (H // int(XW)), hs // (H // int(XV))
    f = lambda a: np.asarray(a).astype(np.float64)
    for c in range(int(nc)):
        t0, t1 = int(starts[c]), int(starts[c + 1]); E = t1 - 1
        for b in range(batch):
            sq = np.zeros(t1 - t0, int) if NULL(seq) else seq[b, t0:t1]
            sb = 0 if NULL(seq) else (seq[b, E] if upper else seq[b, max(t0 - 1, 0)])
            cm = f(cum[b, t0:t1])  # (T, H)
            Ur, Wq, Vq = f(U[b, t0:t1][:, hu]), f(W[b, t0:t1][:, hw]), f(Vv[b, t0:t1][:, hv])
            M = f(Mm[b, c]).reshape(H, K, V) if mt else f(Mm[b, c]).reshape(H, V, K).transpose(0, 2, 1)
            scale = np.exp(cm[E - t0] - cm) if upper else np.exp(cm)
            scale = scale * (sq == sb)[:, None]
            R = os.environ.get("EMU_R", "")
            rnd = lambda a: a.astype(os.environ["EMU_DT"]).astype(np.float64) if os.environ.get("EMU_DT") != "bfloat16" else a.astype(ml_dtypes.bfloat16).astype(np.float64)
            if "m" in R: M = rnd(M)
            o = np.einsum("thk,hkv->thv", Ur, M) * scale[:, :, None]
            G = np.einsum("rhk,qhk->hrq", Ur, Wq)
            r = np.arange(t1 - t0)
            mask = (r[None, :] >= r[:, None]) if upper else (r[None, :] <= r[:, None])
            mask = mask & (sq[:, None] == sq[None, :])
            dec = cm.T[:, None, :] - cm.T[:, :, None]  # [h, r, q] = cum_q - cum_r
            w = np.where(mask[None], np.exp(np.where(mask[None], dec if upper else -dec, 0)), 0)
            if dtq:
                w = w * f(dte[b, t0:t1]).T[:, None, :]
            o += np.einsum("hrq,qhv->rhv", rnd(w * G) if "b" in R else w * G, Vq)
            if not NULL(D):
                o += f(D)[None] * Vq
            if not NULL(z):
                zz = f(z[b, t0:t1]); o *= zz / (1 + np.exp(-zz))
            out[b, t0:t1] = o.astype(out.dtype)
