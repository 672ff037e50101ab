"""A float64 model of the chunked float32 SSD backward (ssd_backward's CUDA-core branch) for
the draw of tests/test_ssd.py::test_float32_cancelling_dA, to see where its dA error comes from.

Every product (the forward's chunk states "state", the adjoint chunk states "adj", the
diagonal and boundary parts of ycore "y_in", "y_bd" and of GB "gb_in", "gb_bd") can go through
an emulated 3 x TF32 split (hi rounded to 11 bits, lo cut to 11, a_lo b_lo dropped), the rest
exact; F32=1 also rounds the chunk sums, weights and products to float32 (model2 in the notes).

    TF=all python3 benchmarks/results/ssd_f32_dA/model_f32_dA.py      # or TF=state, TF=gb_in, ...
    python3 benchmarks/results/ssd_f32_dA/model_f32_dA.py compare     # the GPU's intermediates

``compare`` reads diag_tf1.npz / diag_tf0.npz beside this file (written on the H200 by
diag_dA.py, with SSMKIT_SSD_TF32 1 and 0) and prints their relative errors against the model's
exact values.
"""
import sys, os
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
sys.path.insert(0, ROOT); sys.path.insert(0, os.path.join(ROOT, "tests"))
import numpy as np
import test_ssd as T
from ssmkit import reference as ref

def split(a):
    a32 = np.asarray(a, np.float32)
    bits = a32.view(np.uint32)
    hi = ((bits + np.uint32(0x1000)) & np.uint32(0xffffe000)).view(np.float32)
    lo = (a32 - hi).view(np.uint32) & np.uint32(0xffffe000)
    return hi.astype(np.float64), lo.view(np.float32).astype(np.float64)

F32 = os.environ.get('F32') == '1'
f = (lambda v: np.asarray(v, np.float32).astype(np.float64)) if F32 else (lambda v: v)
FLAGS = set(os.environ.get("TF", "").split(","))
def mm(name, A, B):  # A (m,k) @ B (k,n) with 3xTF32 if name in FLAGS
    if name not in FLAGS and "all" not in FLAGS:
        return f(A @ B)
    Ah, Al = split(A); Bh, Bl = split(B)
    return f(Ah @ Bh + Ah @ Bl + Al @ Bh)

def run(kw, opts, seed):
    rng = np.random.default_rng(seed)
    inputs = T.make_inputs(rng, **kw)
    arrays, exact = T.cast(inputs, "float32", np)
    (y_r, fin_r), pb = ref.ssd_vjp(**exact, **opts, return_final_state=True)
    dy = rng.standard_normal(y_r.shape); dfin = rng.standard_normal(fin_r.shape)
    dy = dy.astype(np.float32).astype(np.float64); dfin = dfin.astype(np.float32).astype(np.float64)
    g_r = pb(dy, dfin)
    # model (batch 1, H 1, G 1)
    x = exact["x"][0, :, 0, :]; B = exact["B"][0, :, 0, :]; C = exact["C"][0, :, 0, :]
    dtr = exact["dt"][0, :, 0] + exact["dt_bias"][0]
    dte = np.log1p(np.exp(dtr)) if opts.get("dt_softplus") else dtr
    dte = dte.astype(np.float32).astype(np.float64)
    A = exact["A"][0]; L = x.shape[0]; Q = opts["chunk_size"]
    seq = inputs["seq_idx"][0] if inputs["seq_idx"] is not None else np.zeros(L, int)
    dY = dy[0, :, 0, :]
    starts = list(range(0, L, Q)) + [L]
    nc = len(starts) - 1
    P, N = x.shape[1], B.shape[1]
    a = dte * A
    H = [np.zeros((P, N))]
    cums = []; Ws = []
    for c in range(nc):
        t0, t1 = starts[c], starts[c + 1]
        cum = f(np.cumsum(f(a[t0:t1]))); cums.append(cum)
        sq = seq[t0:t1]; sb = seq[t0 - 1] if t0 > 0 else seq[0]
        W = np.exp(cum[:, None] - cum[None, :]) * (np.arange(t1-t0)[:, None] >= np.arange(t1-t0)[None, :]) * (sq[:, None] == sq[None, :])
        Ws.append(W)
        same_in = (sq == sb)
        wend = np.exp(cum[-1] - cum) * (sq == sq[-1])
        S = mm("state", (x[t0:t1] * (dte[t0:t1] * wend)[:, None]).T, B[t0:t1])
        Hn = (np.exp(cum[-1]) if sq[-1] == sb else 0.0) * H[-1] + S
        H.append(Hn)
    # adjoint
    dHx = [None] * nc
    g = dfin[0, 0]
    for c in range(nc - 1, -1, -1):
        dHx[c] = g
        t0, t1 = starts[c], starts[c + 1]
        cum = cums[c]; sq = seq[t0:t1]; sb = seq[t0 - 1] if t0 > 0 else seq[0]
        w = np.exp(cum) * (sq == sb)
        K = mm("adj", (dY[t0:t1] * w[:, None]).T, C[t0:t1])
        g = (np.exp(cum[-1]) if sq[-1] == sb else 0.0) * g + K
    global YC, GBs
    YC = []; GBs = []
    absd = np.zeros(L)
    dcum = np.zeros(L); xGB = np.zeros(L); sd = np.zeros(L)
    for c in range(nc):
        t0, t1 = starts[c], starts[c + 1]
        cum = cums[c]; sq = seq[t0:t1]; sb = seq[t0 - 1] if t0 > 0 else seq[0]
        CB = C[t0:t1] @ B[t0:t1].T
        Mw = f(f(Ws[c]) * f(CB) * dte[t0:t1][None, :])
        yc = mm("y_in", Mw, x[t0:t1]) + mm("y_bd", C[t0:t1], H[c].T) * (np.exp(cum) * (sq == sb))[:, None]
        GB = mm("gb_in", Mw.T / dte[t0:t1][:, None], dY[t0:t1]) + mm("gb_bd", B[t0:t1], dHx[c].T) * (np.exp(cum[-1] - cum) * (sq == sq[-1]))[:, None]
        dc = (dY[t0:t1] * yc).sum(1) - dte[t0:t1] * (x[t0:t1] * GB).sum(1)
        ab = np.abs((dY[t0:t1] * yc).sum(1)) + np.abs(dte[t0:t1] * (x[t0:t1] * GB).sum(1))
        ab[-1] += abs(np.sum(dHx[c] * H[c + 1]))
        absd[t0:t1] = np.cumsum(ab[::-1])[::-1]
        dc[-1] += np.sum(dHx[c] * H[c + 1])
        dcum[t0:t1] = dc
        YC.append(yc); GBs.append(GB)
        sd[t0:t1] = np.cumsum(dc[::-1])[::-1]
    dA = np.sum(dte * sd)
    print('sum of |terms| of the suffix sums, times dt:', np.sum(dte * absd),
          '; of dA = sum dt sdcum:', np.sum(np.abs(dte * sd)))
    global EX
    EX = dict(H=np.array(H), dHx=np.array(dHx), dcum=dcum)
    return dA, g_r.A[0]

kw = dict(batch=1, L=31, H=1, P=1, G=1, N=2, D_form=None, with_z=False, with_bias=True,
          with_init=False, seq_cuts=[2])
opts = dict(chunk_size=2, dt_softplus=True)
dA, dA_r = run(kw, opts, 0)
print(os.environ.get("TF", ""), "F32" if F32 else "", "model dA", dA, "ref", dA_r,
      "rel", abs(dA - dA_r) / abs(dA_r))
if sys.argv[1:] == ["compare"]:
    here = os.path.dirname(os.path.abspath(__file__))
    yc = np.concatenate(YC)[:, 0]
    gb = np.concatenate(GBs)[:, 0]
    rel = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)  # noqa: E731
    for tf in ("1", "0"):
        d = np.load(os.path.join(here, f"diag_tf{tf}.npz"))
        print("SSMKIT_SSD_TF32", tf, "states", rel(d["states"][0, :, 0], EX["H"]),
              "dHx", rel(d["dHx"][0, :, 0], EX["dHx"]),
              "ycore", rel(d["mm_ycore_1"][0, :, 0, 0], yc), "GB", rel(d["mm_GB_2"][0, :, 0, 0], gb),
              "dcum max abs err", np.abs(d["dcum"][0, :, 0] - EX["dcum"]).max())
