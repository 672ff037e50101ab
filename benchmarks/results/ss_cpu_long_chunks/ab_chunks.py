"""A/B of the CPU selective scan (ssmkit/_cpu/selective_scan.py) at a git revision against the
working tree's, in one process, alternating round by round, at several chunk sizes: float32
2 x 256 x 8192, N 16, D, z, delta_bias, softplus (bench_selective_scan.py's CPU inputs at L
8192). Prints each round's forward+backward ms (selective_scan_vjp and its pullback, best of
3) per version and chunk size, and the largest difference between the versions' gradients.

    python benchmarks/results/ss_cpu_long_chunks/ab_chunks.py REV [rounds [threads [chunks...]]]
"""
import os
import sys
import tempfile

import numba
import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import ssmkit  # noqa: E402
from bench_selective_scan import make_inputs  # noqa: E402
from ab_cpu_module import alternate, largest_difference, load, versions  # noqa: E402

PATH = "ssmkit/_cpu/selective_scan.py"
NAME = "ssmkit._cpu.selective_scan"


def main(rev, rounds=3, threads=2, *chunks):
    numba.set_num_threads(int(threads))
    chunks = [int(c) for c in chunks] or [256, 4096, 8192]
    sources = versions(rev, PATH)
    x = make_inputs(np, "float32", 2, 256, 8192, 16)

    def forward_backward(chunk):
        _, pullback = ssmkit.selective_scan_vjp(**x, delta_softplus=True, chunk_size=chunk)
        return pullback(x["u"])

    with tempfile.TemporaryDirectory() as tmp:
        modules = {name: load(name, s, tmp) for name, s in sources.items()}
        for chunk in chunks:
            times, grads = alternate(modules, NAME, lambda: forward_backward(chunk), rounds)
            for name, v in times.items():
                print(f"chunk {chunk:5d} {name:8s} fwd+bwd ms", " ".join(f"{t:.1f}" for t in v))
            diff = largest_difference(*grads.values())
            print(f"chunk {chunk:5d} largest difference between the versions' gradients: {diff:.2e}")

if __name__ == "__main__":
    main(*sys.argv[1:])
