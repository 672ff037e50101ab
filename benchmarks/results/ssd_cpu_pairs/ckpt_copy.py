import time, numpy as np, sys, math
sys.path.insert(0, "/work/main/benchmarks")
from ssmkit import _ssd
from ssmkit._cpu import ssd as cs
from bench_ssd import make_inputs
x = make_inputs(np, "float32", 1, 4096, 8, 64, 1, 64)
Q = int(sys.argv[1])
p, user, pas = _ssd._prepare("ssd_vjp", x["x"], x["dt"], x["A"], x["B"], x["C"], Q, x.get("D"), x.get("z"), x.get("dt_bias"), True, (0.0, math.inf), None, None, None)
cs.ssd_forward(p, save_checkpoints=True)
ts=[]
for _ in range(5):
    t = time.perf_counter(); cs.ssd_forward(p, save_checkpoints=True); ts.append(time.perf_counter() - t)
print(Q, " ".join(f"{v*1e3:.1f}" for v in ts), flush=True)
