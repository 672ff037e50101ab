import sys
sys.path.insert(0, "benchmarks")
import cupy as cp
import timing
from bench_ssd import make_inputs
import ssmkit
from ssmkit._gpu import ssd as gssd
for shape in [(4, 4096, 80), (8, 4096, 80), (2, 4096, 80), (16, 1024, 80)]:
    b, L, H = shape
    a = make_inputs(cp, "bfloat16", b, L, H, 64, 1, 128)
    dy = cp.random.default_rng(1).standard_normal((b, L, H, 64), dtype=cp.float32).astype("bfloat16")
    def fb():
        _, pull = ssmkit.ssd_vjp(**a, chunk_size=256, dt_softplus=True)
        return pull(dy)
    ref = None
    for r in range(2):
        for first in (False, True):
            gssd._WALK_FIRST = first
            g = fb()
            if ref is None: ref = g
            else: assert all(bool(cp.array_equal(getattr(g, f), getattr(ref, f))) for f in ("x", "B", "C", "dt"))
            ms = timing.cuda_median_ms(fb, warmup=3, reps=15, calls=3)
            print(f"| {b}x{L}x{H} | walk first {first} | round {r} | {ms:.3f} |", flush=True)
