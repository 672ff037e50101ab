"""Per-kernel CUDA-event times of one selective-scan backward (pullback) call, by kernel kind."""
import sys, collections
import cupy as cp
sys.path.insert(0, 'benchmarks')
import ssmkit
from ssmkit._gpu import selective_scan as g
from bench_selective_scan import make_inputs

real = g._launch
rec = []
def timed(key, plan, args):
    s, e = cp.cuda.Event(), cp.cuda.Event()
    s.record(); real(key, plan, args); e.record()
    rec.append((key.kind, s, e))
g._launch = timed

def run(dtype, b, d, L, N, chunk, slices):
    g.TUNING['bwd_state_slices_from'] = 17 if slices else None
    x = make_inputs(cp, dtype, b, d, L, N)
    dy = cp.ones_like(x['u'])
    tots = []
    for rep in range(4):
        out, pb = ssmkit.selective_scan_vjp(**x, delta_softplus=True, chunk_size=chunk)
        cp.cuda.Device().synchronize()
        rec.clear()
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record(); pb(dy); e.record(); e.synchronize()
        tots.append(cp.cuda.get_elapsed_time(s, e))
    per = collections.defaultdict(float); cnt = collections.Counter()
    for k, a, b_ in rec:
        per[k] += cp.cuda.get_elapsed_time(a, b_); cnt[k] += 1
    ks = sum(per.values())
    print(f"| {dtype} {b}x{d}x{L} N{N} | chunk {chunk} | slices {slices} | backward {min(tots):.3f} | kernels {ks:.3f} | "
          + ", ".join(f"{k} x{cnt[k]} {v:.3f}" for k, v in per.items()) + " |", flush=True)
    del x, dy
    cp.get_default_memory_pool().free_all_blocks()

print("| row | chunk | slices | backward ms (best of 4) | sum of kernels | by kind |\n|---|---|---|---|---|---|")
run('float32', 8, 1536, 2048, 16, None, False)
for ch in (None, 16, 128):
    run('float32', 8, 1536, 2048, 128, ch, True)
run('float32', 8, 1536, 2048, 128, 256, False)
for ch in (None, 16):
    run('float32', 8, 1536, 2048, 64, ch, True)
run('float32', 8, 1536, 2048, 64, 256, False)
