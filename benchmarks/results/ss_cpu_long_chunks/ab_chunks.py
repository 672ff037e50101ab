"""A/B of the CPU selective scan (ssmkit/_cpu/selective_scan.py) at a git revision against the
working tree's, in one process, alternating round by round, at several chunk sizes: float32
2 x 256 x 8192, N 16, D, z, delta_bias, softplus (bench_selective_scan.py's CPU inputs at L
8192). Prints each round's forward+backward ms (selective_scan_vjp and its pullback, best of
3) per version and chunk size, and the largest difference between the versions' gradients.

    python benchmarks/results/ss_cpu_long_chunks/ab_chunks.py REV [rounds [threads [chunks...]]]
"""
import importlib.util
import os
import subprocess
import sys
import tempfile
import time

import numba
import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import ssmkit  # noqa: E402
from bench_selective_scan import make_inputs  # noqa: E402

PATH = "ssmkit/_cpu/selective_scan.py"
NAME = "ssmkit._cpu.selective_scan"


def load(name, source, tmp):
    """Import ``source`` as a module of its own (no disk cache: both versions compile here)."""
    fn = os.path.join(tmp, f"ab_{name}.py")
    with open(fn, "w") as f:
        f.write(source.replace("cache=True", "cache=False"))
    spec = importlib.util.spec_from_file_location(f"ab_{name}", fn)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(rev, rounds=3, threads=2, *chunks):
    numba.set_num_threads(int(threads))
    chunks = [int(c) for c in chunks] or [256, 4096, 8192]
    sources = {rev: subprocess.check_output(["git", "-C", ROOT, "show", f"{rev}:{PATH}"]).decode(),
               "work": open(os.path.join(ROOT, PATH)).read()}
    x = make_inputs(np, "float32", 2, 256, 8192, 16)

    def forward_backward(chunk):
        _, pullback = ssmkit.selective_scan_vjp(**x, delta_softplus=True, chunk_size=chunk)
        return pullback(x["u"])

    with tempfile.TemporaryDirectory() as tmp:
        modules = {name: load(name, s, tmp) for name, s in sources.items()}
        for chunk in chunks:
            results = {name: [] for name in modules}
            grads = {}
            for rnd in range(int(rounds) + 1):
                for name, m in modules.items():
                    sys.modules[NAME] = m
                    best = float("inf")
                    for _ in range(3):
                        t0 = time.perf_counter()
                        grads[name] = forward_backward(chunk)
                        best = min(best, time.perf_counter() - t0)
                    if rnd > 0:  # round 0 compiles
                        results[name].append(best * 1e3)
            for name, v in results.items():
                print(f"chunk {chunk:5d} {name:8s} fwd+bwd ms", " ".join(f"{t:.1f}" for t in v))
            a, b = grads.values()
            diff = max(float(np.max(np.abs(np.asarray(ga) - np.asarray(gb))) / (np.max(np.abs(np.asarray(ga))) or 1.0))
                       for ga, gb in zip(a, b) if ga is not None)
            print(f"chunk {chunk:5d} largest difference between the versions' gradients: {diff:.2e}")


if __name__ == "__main__":
    main(*sys.argv[1:])
