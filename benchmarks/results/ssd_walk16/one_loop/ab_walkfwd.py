import math, os, sys
sys.path.insert(0, "benchmarks")
import cupy as cp
import timing
from bench_ssd import make_inputs
import ssmkit
from ssmkit import _ssd
from ssmkit._gpu import ssd as gssd
a = make_inputs(cp, "bfloat16", 4, 4096, 80, 64, 1, 128)
p = _ssd._prepare("ssd", a["x"], a["dt"], a["A"], a["B"], a["C"], 256, a["D"], None, a["dt_bias"], True,
                  (0.0, math.inf), None, None, None)[0]
lay = gssd._Layout(p, factor=False)
y0, y1 = cp.empty(p.x.shape, p.x.dtype), cp.empty(p.x.shape, p.x.dtype)
blob = lay.walk_blob(p)
s0 = lay.fwd_mma(p, y0)
s1 = lay.fwd_mma(p, y1, walk=True, yblob=blob)
same = bool(cp.array_equal(y0, y1)) and all(bool(cp.array_equal(u, v)) for u, v in zip(s0, s1))
dy = cp.random.default_rng(1).standard_normal((4, 4096, 80, 64), dtype=cp.float32).astype("bfloat16")
def fb():
    _, pull = ssmkit.ssd_vjp(**a, chunk_size=256, dt_softplus=True)
    return pull(dy)
w = timing.cuda_median_ms(lambda: lay.fwd_mma(p, y1, walk=True, yblob=blob), warmup=3, reps=20, calls=5)
f = timing.cuda_median_ms(fb, warmup=3, reps=15, calls=3)
print(f"| {os.environ.get('SSMKIT_CUDA_DEFINES','')} | {same} | {w:.3f} | {f:.3f} |", flush=True)
