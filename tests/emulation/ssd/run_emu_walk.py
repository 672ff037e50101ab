"""The 16-bit backward as one walk (ssd_mma_bwd, after ssd_mma_fwd's WALK form) in host
emulation, against the float64 reference and the chunked tensor-core backward on the same
inputs (run_emu_bwd.case, with MMA_BWD_WALK on and off): every gradient within the GPU
tests' bound (4 GRAD_RTOL) of the reference. Cases where the walk applies: no z or restarts,
P <= 64, dt_softplus, B and C in equal groups; chunks of 1 to 4 tiles, tiles that end before
their 64 steps, L 1, P from 8 to 64, N from 8 to 128 (both widths), groups, D per head and
per channel, initial states.

    python3 tests/emulation/ssd/run_emu_walk.py [case numbers] [--asan]

Prints per gradient: walk vs reference / chunked vs reference, then "ALL OK" or "SOME FAILED".
"""
import sys

import run_emu_bwd as EB
from helpers import GRAD_RTOL

CASES = [
    # dtype, batch, L, H, P, G, N, chunk, options
    ("bfloat16", 2, 200, 4, 64, 1, 128, 64, {"z": False}),
    ("float16", 2, 130, 4, 40, 2, 72, 128, {"D": "chan", "init": True, "z": False}),
    ("bfloat16", 1, 456, 4, 64, 1, 128, 256, {"z": False, "init": True, "sum_blocks": 1}),
    ("float16", 1, 150, 2, 16, 1, 32, 16, {"init": True, "z": False}),
    ("bfloat16", 1, 1, 2, 32, 1, 16, 256, {"D": "chan", "z": False}),
    ("bfloat16", 2, 65, 2, 8, 1, 8, 32, {"z": False, "init": True}),
    ("float16", 1, 300, 2, 64, 1, 64, 256, {"z": False, "D": None}),
]

if __name__ == "__main__":
    sel = [int(a) for a in sys.argv[1:] if a.isdigit()]
    allok = True
    for i, (dtype, *shape, opts) in enumerate(CASES):
        if sel and i not in sel:
            continue
        errs, ok, el, _ = EB.case(dtype, *shape, **opts, seed=100 + i, walk=True)
        errs0, _, _, _ = EB.case(dtype, *shape, **opts, seed=100 + i, walk=False)
        allok &= ok
        es = " ".join(f"{k}={v:.1e}/{errs0[k]:.1e}" for k, v in errs.items())
        print(f"{i} {dtype:9s} batch,L,H,P,G,N,chunk={shape} {opts}: {es} (walk / chunked vs "
              f"reference; bound {4 * GRAD_RTOL[dtype]:g}) {'OK' if ok else 'FAIL'} [{el:.1f}s]",
              flush=True)
    print("ALL OK" if allok else "SOME FAILED")
    sys.exit(0 if allok else 1)
