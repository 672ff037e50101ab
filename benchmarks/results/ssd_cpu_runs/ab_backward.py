"""A/B of the CPU SSD backend (ssmkit/_cpu/ssd.py) at a git revision against the working tree's,
in one process, alternating round by round (the 2-core development machines drift by up to 2x
over minutes). The shape of ``bench_ssd.py --cpu`` (float32, batch 1, L 4096, H 8, P 64, N 64,
chunks of 256, dt_softplus). Prints each round's forward+backward ms (ssd_vjp and its pullback,
best of 3) per version, and the largest difference between the versions' gradients.

    python benchmarks/results/ssd_cpu_runs/ab_backward.py REV [rounds [threads [chunk_size [dtype]]]]
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
from bench_ssd import make_inputs  # noqa: E402
from ab_cpu_module import alternate, largest_difference, load, versions  # noqa: E402

PATH = "ssmkit/_cpu/ssd.py"
NAME = "ssmkit._cpu.ssd"


def main(rev, rounds=5, threads=2, chunk_size=256, dtype="float32"):
    numba.set_num_threads(int(threads))
    sources = versions(rev, PATH)
    x = make_inputs(np, dtype, 1, 4096, 8, 64, 1, 64)
    kw = dict(dt_softplus=True, chunk_size=int(chunk_size))
    dy = np.random.default_rng(0).standard_normal(x["x"].shape).astype(x["x"].dtype)

    def forward_backward():
        _, pullback = ssmkit.ssd_vjp(**x, **kw)
        return pullback(dy)

    with tempfile.TemporaryDirectory() as tmp:
        modules = {name: load(name, s, tmp) for name, s in sources.items()}
        times, grads = alternate(modules, NAME, forward_backward, rounds)
    for name, v in times.items():
        print(f"{name:8s} fwd+bwd ms", " ".join(f"{t:.1f}" for t in v))
    diff = largest_difference(*grads.values())
    print(f"largest difference between the versions' gradients, relative to each field's largest entry: {diff:.2e}")

if __name__ == "__main__":
    main(*sys.argv[1:])
