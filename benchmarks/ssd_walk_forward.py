"""The SSD forward's WALK form (what the 16-bit backward walk differentiates: the VJP's
forward where the walk runs) against the plain form (the VJP's forward for the chunked
backward), both ``ssd_mma_fwd`` with every boundary kept, and the inference form (final
states only), on the GPU, each between CUDA events (medians after warm-up), with the copy
bandwidth of the same run. Checks first that both forms keep the same checkpoints and give
the same outputs. Prints a markdown table.

    python3 benchmarks/ssd_walk_forward.py [dtype] [batch] [L] [H]   # default: the peer row
"""
import math
import sys

import cupy as cp

import timing
from bench_ssd import make_inputs
from ssmkit import _ssd
from ssmkit._gpu import ssd as gssd


def main(argv):
    dtype = argv[0] if argv else "bfloat16"
    batch, L, H = (int(a) for a in argv[1:4]) if len(argv) >= 4 else (4, 4096, 80)
    P, N, chunk = 64, 128, 256
    a = make_inputs(cp, dtype, batch, L, H, P, 1, N)
    x = a["x"]
    p, _, _ = _ssd._prepare("ssd", x, a["dt"], a["A"], a["B"], a["C"], chunk, a["D"], None,
                            a["dt_bias"], True,
                            (0.0, math.inf), None, None, None)
    assert gssd.uses_mma_fwd(p, p.x)
    lay = gssd._Layout(p, factor=False)
    y = cp.empty(x.shape, x.dtype)
    blob = lay.walk_blob(p)
    final = cp.empty((batch, H, P, N), cp.float32)
    plain = lay.fwd_mma(p, y)
    y_walk = cp.empty_like(y)
    walk = lay.fwd_mma(p, y_walk, walk=True, yblob=blob)
    same = all(bool(cp.array_equal(a, b)) for a, b in zip(plain, walk))
    same_y = bool(cp.array_equal(y, y_walk))
    copy = timing.copy_tbps()
    forms = [("plain form (every boundary kept)", lambda: lay.fwd_mma(p, y)),
             ("WALK form (every boundary kept, float32 y before D)",
              lambda: lay.fwd_mma(p, y, walk=True, yblob=blob)),
             ("inference (final states only)", lambda: lay.fwd_mma(p, y, final=final))]
    rows = []
    for rnd in range(2):
        for name, fn in forms:
            rows.append((rnd, name, timing.cuda_median_ms(fn, warmup=3, reps=20, calls=5)))
    print(f"{dtype} batch {batch}, L {L}, H {H}, P {P}, N {N}, chunk {chunk}; commit "
          f"{timing.commit()}; copy {copy:.2f} TB/s; checkpoints equal: {same}; outputs equal: {same_y}; "
          f"yblob {blob.nbytes / 1e6:.0f} MB")
    print("| form | round | ms |")
    print("|---|---|---|")
    for rnd, name, ms in rows:
        print(f"| {name} | {rnd} | {ms:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
