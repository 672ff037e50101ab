# The float32 peer row's ssd_vjp + pullback, 3 times (for ncu: the walk and the forward)
import sys, cupy, ssmkit
sys.path.insert(0, "benchmarks")
from bench_ssd import TABLE, make_inputs
dtype, batch, L, H, P, G, N, chunk = TABLE[1][:8]
x = make_inputs(cupy, dtype, batch, L, H, P, G, N)
for _ in range(3):
    y, pb = ssmkit.ssd_vjp(**x, chunk_size=chunk, dt_softplus=True)
    g = pb(cupy.ones_like(y))
cupy.cuda.Device().synchronize()
