"""Where the 16-bit SSD backward walk (ssd_mma_bwd, ``MMA_BWD_WALK``) beats the chunked
tensor-core backward: forward+backward (ssd_vjp and its pullback) with the switch on and
off, alternating, over grid sizes and chunk lengths; CUDA-event medians after warm-up, two
rounds, the copy bandwidth of the same run. Prints a markdown table (best of the rounds).

    python3 benchmarks/ssd_walk_shapes.py [dtype]
"""
import sys

import cupy as cp

import timing
from bench_ssd import make_inputs
import ssmkit
from ssmkit import _ssd
from ssmkit._gpu import ssd as gssd

# (batch, L, H, N, chunk); P 64, G 1
SHAPES = [(4, 4096, 80, 128, 256), (4, 4096, 80, 128, 128), (4, 4096, 80, 128, 64),
          (2, 4096, 80, 128, 256), (3, 4096, 80, 128, 256), (8, 4096, 80, 128, 256),
          (8, 2048, 24, 128, 256), (16, 1024, 80, 128, 256), (4, 16384, 80, 128, 256),
          (4, 4096, 80, 64, 256)]


def main(argv):
    dtype = argv[0] if argv else "bfloat16"
    copy = timing.copy_tbps()
    saved = gssd.MMA_BWD_WALK
    rows = []
    for batch, L, H, N, chunk in SHAPES:
        a = make_inputs(cp, dtype, batch, L, H, 64, 1, N)
        opts = dict(chunk_size=chunk, dt_softplus=True)
        dy = cp.random.default_rng(1).standard_normal((batch, L, H, 64), dtype=cp.float32).astype(dtype)

        def fwd_bwd():
            _, pull = ssmkit.ssd_vjp(**a, **opts)
            return pull(dy)

        best = {}
        for _ in range(2):
            for walk in (True, False):
                gssd.MMA_BWD_WALK = walk
                ms = timing.cuda_median_ms(fwd_bwd, warmup=3, reps=15, calls=3)
                best[walk] = min(best.get(walk, ms), ms)
        gssd.MMA_BWD_WALK = True
        p = _ssd._prepare("ssd", a["x"], a["dt"], a["A"], a["B"], a["C"], chunk, a["D"], None,
                          a["dt_bias"], True, (0.0, float("inf")), None, None, None)[0]
        applies = gssd.uses_mma_bwd_walk(p, p.x)
        rows.append((batch, L, H, N, chunk, gssd._fwd_blocks(p), applies, best[True], best[False]))
    gssd.MMA_BWD_WALK = saved
    print(f"{dtype}, P 64, G 1; commit {timing.commit()}; copy {copy:.2f} TB/s; "
          "forward+backward ms, best of 2 rounds")
    print("| batch | L | H | N | chunk | blocks | walk applies | walk on | walk off | on / off |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for b, L, H, N, c, blocks, ap, on, off in rows:
        print(f"| {b} | {L} | {H} | {N} | {c} | {blocks} | {ap} | {on:.3f} | {off:.3f} | "
              f"{on / off:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
