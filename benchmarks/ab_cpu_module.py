"""A/B two versions of the CPU selective scan (ssmkit/_cpu/selective_scan.py) in one process.

The version at a git revision runs against the working tree's, alternating round by round,
so that both see the same machine (the 2-core machines here drift by up to 2x over minutes).
Float32 2 x 256 x 2048, N 16, D, z, delta_bias, softplus: the shape of ``bench_selective_scan.py
--cpu``. Prints each round's forward ms (median of 5 calls) and one forward+backward ms.

    python benchmarks/ab_cpu_module.py HEAD 2 [rounds [dtype]]

With dtype float64 the same inputs are cast to float64 first.
"""
import importlib.util
import os
import subprocess
import sys
import tempfile
import time

import numba
import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ssmkit  # noqa: E402
import ssmkit._cpu.selective_scan as live  # noqa: E402
from bench_selective_scan import make_inputs  # noqa: E402

PATH = "ssmkit/_cpu/selective_scan.py"


def versions(rev, path):
    """The text of ``path`` (relative to the repository) at ``rev`` and in the working tree."""
    return {rev: subprocess.check_output(["git", "-C", ROOT, "show", f"{rev}:{path}"]).decode(),
            "work": open(os.path.join(ROOT, path)).read()}


def load(name, source, tmp):
    """Import ``source``, a module of ssmkit/_cpu, as a module of its own: no disk cache (both
    versions compile here), its relative imports of ssmkit made absolute."""
    fn = os.path.join(tmp, f"ab_{name}.py")
    with open(fn, "w") as f:
        f.write(source.replace("cache=True", "cache=False").replace("from .._", "from ssmkit._"))
    spec = importlib.util.spec_from_file_location(f"ab_{name}", fn)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def alternate(modules, name, fn, rounds):
    """Time ``fn()`` (best of 3 calls) with each version of ``modules`` installed as
    ``sys.modules[name]`` in turn, round by round; round 0 compiles and is not kept.

    Returns ``({version: [ms per round]}, {version: fn's last result})``.
    """
    times, last = {v: [] for v in modules}, {}
    for rnd in range(int(rounds) + 1):
        for v, m in modules.items():
            sys.modules[name] = m
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                last[v] = fn()
                best = min(best, time.perf_counter() - t0)
            if rnd > 0:
                times[v].append(best * 1e3)
    return times, last


def largest_difference(a, b):
    """The largest difference between two sequences of gradients (None fields skipped), each
    relative to its field's largest entry in ``a``."""
    return max(float(np.max(np.abs(np.asarray(ga) - np.asarray(gb))) / (np.max(np.abs(np.asarray(ga))) or 1.0))
               for ga, gb in zip(a, b) if ga is not None)


def main(rev, threads, rounds=6, dtype="float32"):
    numba.set_num_threads(int(threads))
    sources = versions(rev, PATH)
    x = make_inputs(np, "float32", 2, 256, 2048, 16)
    x = {k: v.astype(dtype) if isinstance(v, np.ndarray) else v for k, v in x.items()}

    def forward_backward():
        _, pullback = ssmkit.selective_scan_vjp(**x, delta_softplus=True)
        pullback(x["u"])

    with tempfile.TemporaryDirectory() as tmp:
        modules = {name: load(name, s, tmp) for name, s in sources.items()}
        results = {name: [] for name in modules}
        for rnd in range(int(rounds) + 1):
            for name, m in modules.items():
                live.selective_scan_forward = m.selective_scan_forward
                live.selective_scan_backward = m.selective_scan_backward
                times = []
                for _ in range(5):
                    t0 = time.perf_counter()
                    ssmkit.selective_scan(**x, delta_softplus=True)
                    times.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                forward_backward()
                if rnd > 0:  # round 0 compiles
                    results[name].append((np.median(times) * 1e3, (time.perf_counter() - t0) * 1e3))
    for name, v in results.items():
        print(f"{name:8s} fwd", " ".join(f"{a:.1f}" for a, _ in v),
              "| fwd+bwd", " ".join(f"{b:.1f}" for _, b in v))


if __name__ == "__main__":
    main(*sys.argv[1:])
