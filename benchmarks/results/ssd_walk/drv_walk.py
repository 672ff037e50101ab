import math, sys, os
sys.path.insert(0, "benchmarks")
import cupy, bench_ssd, ssmkit
from ssmkit._gpu import ssd as g
x = bench_ssd.make_inputs(cupy, "bfloat16", 4, 4096, 80, 64, 1, 128)
for walk in (True, True, False, False):
    g.MMA_STATE_WALK = walk
    ssmkit.ssd(**x, chunk_size=256, dt_softplus=True)
cupy.cuda.runtime.deviceSynchronize()
