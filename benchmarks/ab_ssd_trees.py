"""Time the SSD peer configuration (bfloat16, batch 4, L 4096, H 80, P 64, G 1, N 128, chunk
256) of the tree this runs in, for A/B runs of several trees in one GPU session: the forward
(back-to-back and one-call latency, without and with z), forward+backward, and the forward's
stages. Prints one ``ABROW {json}`` line.

    cd TREE && PYTHONPATH=$PWD python3 /path/to/ab_ssd_trees.py LABEL

Works in trees from 61585ef on (older trees lack the ``ssd_mma_cb`` stage, which is skipped).
"""
import math, sys, json, os
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import cupy, ssmkit
from ssmkit import _ssd
from ssmkit._gpu import ssd as g
from timing import cuda_median_ms, copy_tbps
from bench_ssd import make_inputs
tag = sys.argv[1]
res = {"tree": tag, "copy_tbps": round(copy_tbps(), 3)}
for dtype in ("bfloat16",):
    x = make_inputs(cupy, dtype, 4, 4096, 80, 64, 1, 128)
    kw = dict(chunk_size=256, dt_softplus=True)
    f = lambda: ssmkit.ssd(**x, **kw)
    res[dtype + " fwd b2b"] = cuda_median_ms(f, calls=5)
    res[dtype + " fwd latency"] = cuda_median_ms(f)
    xz = dict(x, z=x["x"][:, ::-1].copy())
    res[dtype + " fwd b2b with z"] = cuda_median_ms(lambda: ssmkit.ssd(**xz, **kw), calls=5)
    dy = cupy.ones_like(x["x"])
    def fb():
        _, pb = ssmkit.ssd_vjp(**x, **kw)
        pb(dy)
    res[dtype + " fwd+bwd b2b"] = cuda_median_ms(fb, reps=5, calls=3)
    p, _, _ = _ssd._prepare("ssd", x["x"], x["dt"], x["A"], x["B"], x["C"], 256, x["D"], None,
                            x["dt_bias"], True, (0.0, math.inf), None, None, None)
    lay = g._Layout(p)
    st = lay.passing(p, lay.chunk_state_mma(p))
    y = cupy.empty(p.x.shape, dtype=p.io_dtype)
    res["layout"] = cuda_median_ms(lambda: g._Layout(p), calls=5)
    res["chunk_state"] = cuda_median_ms(lambda: lay.chunk_state_mma(p), calls=5)
    if hasattr(lay, "cb_mma"):
        cb = lay.cb_mma(p)
        res["cb"] = cuda_median_ms(lambda: lay.cb_mma(p), calls=5)
        res["out"] = cuda_median_ms(lambda: lay.out_mma(p, st, y, cb), calls=5)
    else:
        res["out"] = cuda_median_ms(lambda: lay.out_mma(p, st, y), calls=5)
print("ABROW", json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in res.items()}))
