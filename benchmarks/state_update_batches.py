"""state_update's Mamba-2 step (H 80, P 64, N 128) at several batch sizes: the kernel alone
and the in-place ceiling, each as a fraction of the copy bandwidth of the same run.

A fixed per-launch cost (ramp-up, the last wave of blocks) weighs less as the batch grows;
a kernel whose fraction of copy moves with the batch while the in-place ceiling's does not
is losing time to how its blocks fill the machine, not to its per-value work.

    python3 benchmarks/state_update_batches.py [--state bfloat16] [--batches 16 32 ...]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_state_update as bsu  # noqa: E402
from timing import copy_tbps  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--state", default="bfloat16")
    ap.add_argument("--io", default=None, help="input dtype (default: the state's)")
    ap.add_argument("--batches", type=int, nargs="*",
                    default=[16, 32, 48, 56, 60, 64, 68, 72, 80, 96, 128, 192, 256])
    a = ap.parse_args()
    import cupy as cp

    io = a.io or a.state
    H, P, N = 80, 64, 128
    bw = copy_tbps()
    print(f"copy {bw:.2f} TB/s; state {a.state}, inputs {io}, H {H}, P {P}, N {N}")
    print("| batch | blocks | kernel ms | of copy | in-place ms | of copy |")
    print("|---|---|---|---|---|---|")
    for batch in a.batches:
        r = bsu.time_config(cp, 2, a.state, io, batch, H, P, N)
        nbytes = bsu.compulsory_bytes(2, a.state, io, batch, H, P, N)
        item = 2 if a.state != "float32" else 4
        ceil = bsu.inplace_ceiling_ms(cp, batch * H * P * N * item)
        frac = nbytes / (r["kernel_ms"] * 1e-3) / 1e12 / bw
        cfrac = 2 * batch * H * P * N * item / (ceil * 1e-3) / 1e12 / bw
        print(f"| {batch} | {r['plan']['blocks']} | {r['kernel_ms']:.4f} | {frac:.2f} | {ceil:.4f} "
              f"| {cfrac:.2f} |", flush=True)


if __name__ == "__main__":
    main()
