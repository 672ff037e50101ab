import sys
sys.path.insert(0, "benchmarks")
import cupy as cp
from bench_ssd import make_inputs
import ssmkit
a = make_inputs(cp, "bfloat16", 4, 4096, 80, 64, 1, 128)
dy = cp.random.default_rng(1).standard_normal((4, 4096, 80, 64), dtype=cp.float32).astype("bfloat16")
for _ in range(3):
    _, pull = ssmkit.ssd_vjp(**a, chunk_size=256, dt_softplus=True)
    pull(dy)
cp.cuda.Device().synchronize()
