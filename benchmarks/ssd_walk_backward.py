"""The 16-bit SSD backward as one walk (ssd_mma_bwd, MMA_BWD_WALK) against the chunked
tensor-core backward, on the GPU: first the gradients of both against the float64 reference
on a small problem (rel_err per field), then at the peer bfloat16 row forward+backward
(ssd_vjp and its pullback) with the switch on and off, alternating, and the walk kernel
alone; CUDA-event medians after warm-up, the copy bandwidth of the same run. Prints
markdown tables.

    python3 benchmarks/ssd_walk_backward.py
"""
import math

import cupy as cp
import numpy as np

import timing
from bench_ssd import make_inputs
import ssmkit
from ssmkit import _ssd, reference as ref
from ssmkit._gpu import ssd as gssd

FIELDS = ("x", "dt", "A", "B", "C", "D", "dt_bias", "initial_state")


def rel(a, r):
    d = np.linalg.norm(r)
    return float(np.linalg.norm(np.asarray(a, np.float64) - r) / (d if d > 0 else 1.0))


def accuracy(batch=1, L=1000, H=4, dtype="bfloat16"):
    a = make_inputs(cp, dtype, batch, L, H, 64, 1, 128, seed=3)
    rng = np.random.default_rng(4)
    a["initial_state"] = cp.asarray(rng.standard_normal((batch, H, 64, 128)).astype(np.float32))
    exact = {k: cp.asnumpy(v.astype(cp.float32)).astype(np.float64) for k, v in a.items()}
    opts = dict(chunk_size=256, dt_softplus=True, return_final_state=True)
    (yr, fr), pb = ref.ssd_vjp(**exact, **opts)
    dy = rng.standard_normal(yr.shape)
    dfin = rng.standard_normal(fr.shape)
    gr = pb(cp.asnumpy(cp.asarray(dy).astype(dtype).astype(cp.float64)), dfin)
    gssd.MMA_FUSED_FWD = True  # (the walk's forward; the rule keeps small grids off it)
    out = {}
    for walk in (True, False):
        gssd.MMA_BWD_WALK = walk
        (y, fin), pull = ssmkit.ssd_vjp(**a, **opts)
        g = pull(cp.asarray(dy).astype(dtype), cp.asarray(dfin.astype(np.float32)))
        out[walk] = {f: rel(cp.asnumpy(getattr(g, f).astype(cp.float64)), getattr(gr, f))
                     for f in FIELDS}
        out[walk]["y"] = rel(cp.asnumpy(y.astype(cp.float64)), yr)
    gssd.MMA_BWD_WALK = "auto"
    gssd.MMA_FUSED_FWD = "auto"
    print(f"accuracy, {dtype} batch {batch}, L {L}, H {H}, P 64, N 128, chunk 256, initial "
          "states: rel_err against the float64 reference")
    print("| backward | " + " | ".join(("y",) + FIELDS) + " |")
    print("|---|" + "---|" * (len(FIELDS) + 1))
    for walk in (True, False):
        e = out[walk]
        print(f"| {'walk' if walk else 'chunked'} | " + " | ".join(
            f"{e[f]:.2e}" for f in ("y",) + FIELDS) + " |")


def speed(dtype="bfloat16", batch=4, L=4096, H=80):
    a = make_inputs(cp, dtype, batch, L, H, 64, 1, 128)
    opts = dict(chunk_size=256, dt_softplus=True)
    dy = cp.random.default_rng(1).standard_normal((batch, L, H, 64), dtype=cp.float32).astype(dtype)

    def fwd_bwd():
        out, pull = ssmkit.ssd_vjp(**a, **opts)
        return pull(dy)

    def fwd():
        return ssmkit.ssd(**a, **opts)

    copy = timing.copy_tbps()
    rows = []
    for rnd in range(2):
        for walk in (True, False):
            gssd.MMA_BWD_WALK = walk
            rows.append((f"forward+backward, {'walk' if walk else 'chunked'}", rnd,
                         timing.cuda_median_ms(fwd_bwd, warmup=3, reps=15, calls=3)))
            rows.append((f"ssd (forward only), switch {'on' if walk else 'off'}", rnd,
                         timing.cuda_median_ms(fwd, warmup=3, reps=15, calls=5)))
    # the walk kernel alone, on the WALK forward's checkpoints
    gssd.MMA_BWD_WALK = True
    p, _, _ = _ssd._prepare("ssd", a["x"], a["dt"], a["A"], a["B"], a["C"], 256, a["D"], None,
                            a["dt_bias"], True, (0.0, math.inf), None, None, None)
    _, _, ck = gssd.ssd_forward(p, save_checkpoints=True)
    states, entering, _, yblob = ck
    lay = gssd._Layout(p)
    rows.append(("ssd_mma_bwd alone", 0,
                 timing.cuda_median_ms(lambda: lay.bwd_mma(p, dy, yblob, states, None),
                                       warmup=3, reps=20, calls=5)))
    gs = lay.shared_blocks(p)
    rows.append(("dC keeping its blocks (ssd_mma_chunk_dc) alone", 0,
                 timing.cuda_median_ms(lambda: lay.dc_mma(p, dy, entering, gs), warmup=3,
                                       reps=20, calls=5)))
    gssd.MMA_BWD_WALK = "auto"
    print(f"{dtype} batch {batch}, L {L}, H {H}, P 64, N 128, chunk 256; commit "
          f"{timing.commit()}; copy {copy:.2f} TB/s")
    print("| what | round | ms |")
    print("|---|---|---|")
    for name, rnd, ms in rows:
        print(f"| {name} | {rnd} | {ms:.3f} |")


if __name__ == "__main__":
    import sys
    if "speed" not in sys.argv[1:]:
        accuracy()
    speed()
