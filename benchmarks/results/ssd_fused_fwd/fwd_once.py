"""One ssmkit.ssd call at the peer bfloat16 shape, three times (a driver for Nsight Compute).
Argument: 1 (the default) runs ssd_mma_fwd, 0 the state walk and the output kernel."""
import sys, cupy, ssmkit
sys.path.insert(0, "benchmarks")
from ssmkit._gpu import ssd as gpu_ssd
from bench_ssd import TABLE, make_inputs
gpu_ssd.MMA_FUSED_FWD = (sys.argv[1] if len(sys.argv) > 1 else "1") == "1"
dtype, batch, L, H, P, G, N, chunk = TABLE[0][:8]
x = make_inputs(cupy, dtype, batch, L, H, P, G, N)
for _ in range(3):
    y = ssmkit.ssd(**x, chunk_size=chunk, dt_softplus=True)
cupy.cuda.Device().synchronize()
