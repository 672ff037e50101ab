import os, sys
sys.path.insert(0, "benchmarks")
import cupy as cp
import timing
from bench_ssd import make_inputs
import ssmkit
DT = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"
a = make_inputs(cp, DT, 4, 4096, 80, 64, 1, 128)
dy = cp.random.default_rng(1).standard_normal((4, 4096, 80, 64), dtype=cp.float32).astype(DT)
def fb():
    _, pull = ssmkit.ssd_vjp(**a, chunk_size=256, dt_softplus=True)
    return pull(dy)
g = fb()
ms = timing.cuda_median_ms(fb, warmup=3, reps=15, calls=3)
h = float(cp.abs(g.A).sum() + cp.abs(g.x.astype(cp.float32)).sum())
print(f"| {DT} | {os.environ.get('SSMKIT_CUDA_DEFINES','')} | {ms:.3f} | {h:.6e} |", flush=True)
