"""Per-kernel event times (streams off) and the fwd+bwd time (streams as set) of one SSD row."""
import sys, numpy as np, cupy
sys.path.insert(0, "benchmarks")
from bench_ssd import TABLE, make_inputs
from timing import cuda_median_ms
import ssmkit
from ssmkit._gpu import ssd as g
import os
if os.environ.get("NT"): g.TC_NT = tuple(map(int, os.environ["NT"].split(",")))
tag, dtype = sys.argv[1], sys.argv[2]
_, batch, L, H, P, G, N, chunk = next(r for r in TABLE if r[0] == dtype)[:8]
x = make_inputs(cupy, dtype, batch, L, H, P, G, N)
kw = dict(chunk_size=chunk, dt_softplus=True)
dy = cupy.ones_like(x["x"])
def fb():
    _, pb = ssmkit.ssd_vjp(**x, **kw); pb(dy)
streams = g.TC_STREAMS, g.MMA_STREAMS
g.TC_STREAMS = g.MMA_STREAMS = False
times = {}
orig = g._launch
def launch(name, *a, **k):
    s, e = cupy.cuda.Event(), cupy.cuda.Event(); s.record(); orig(name, *a, **k); e.record()
    marks.append((name, s, e))
g._launch = launch
for r in range(10):
    marks = []
    fb()
    cupy.cuda.Device().synchronize()
    if r >= 2:
        for n, s, e in marks:
            times.setdefault(n.split("(")[0], []).append(cupy.cuda.get_elapsed_time(s, e))
g._launch = orig
g.TC_STREAMS, g.MMA_STREAMS = streams
t = cuda_median_ms(fb, warmup=3, reps=15, calls=3)
tf = cuda_median_ms(lambda: ssmkit.ssd(**x, **kw), warmup=3, reps=15, calls=5)
print(f"{tag} {dtype} fwd {tf:.3f} fwd+bwd {t:.3f} | " + " ".join(
    f"{k.split('<')[0]}={np.median(v):.3f}" for k, v in times.items() if np.median(v) > 0.03))
