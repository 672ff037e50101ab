"""Copy bandwidth at the sizes of the causal_conv1d and state_update problems, against 1 GiB."""
import sys, os
sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "benchmarks")]
import cupy
from timing import cuda_median_ms, copy_tbps
big = copy_tbps()
print(f"copy 1 GiB: {big:.3f} TB/s")
for label, nbytes in [("cc1d fwd 8x3072x2048 bf16", 2 * 8 * 3072 * 2048 * 2),
                      ("cc1d bwd 8x3072x2048 bf16", 3 * 8 * 3072 * 2048 * 2),
                      ("cc1d fwd 4x5376x4096 bf16", 2 * 4 * 5376 * 4096 * 2),
                      ("cc1d bwd 4x5376x4096 bf16", 3 * 4 * 5376 * 4096 * 2),
                      ("state_update bf16 peer", 2 * 64 * 80 * 64 * 128 * 2)]:
    half = nbytes // 2
    src = cupy.ones(half, dtype=cupy.uint8); dst = cupy.empty_like(src)
    ms = cuda_median_ms(lambda: cupy.copyto(dst, src), warmup=3, reps=20, calls=5)
    tb = nbytes / (ms * 1e-3) / 1e12
    print(f"{label}: {nbytes/1e6:.0f} MB moved in {ms*1e3:.1f} us = {tb:.3f} TB/s = {tb/big:.3f} of the 1 GiB copy")
