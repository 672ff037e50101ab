"""Forward ms on few long rows: HEAD's CPU selective scan against the working tree's.

Both modules load in one process and alternate call by call (the host's speed drifts);
the first round of each shape compiles and is not printed.

    python benchmarks/results/cpu_prefetch/few_long_rows.py
"""
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]
import ssmkit  # noqa: E402
import ssmkit._cpu.selective_scan as live  # noqa: E402
from ab_cpu_module import PATH, load  # noqa: E402
from bench_selective_scan import make_inputs  # noqa: E402


def main():
    tmp = tempfile.gettempdir()
    modules = {
        "HEAD": load("HEAD", subprocess.check_output(["git", "-C", ROOT, "show", f"HEAD:{PATH}"]).decode(), tmp),
        "work": load("work", open(os.path.join(ROOT, PATH)).read(), tmp),
    }
    for shape in [(1, 64, 32768, 16), (1, 16, 131072, 16), (2, 64, 16384, 16)]:
        x = make_inputs(np, "float32", *shape)
        times = {name: [] for name in modules}
        for rnd in range(5):
            for name, m in modules.items():
                live.selective_scan_forward = m.selective_scan_forward
                t0 = time.perf_counter()
                ssmkit.selective_scan(**x, delta_softplus=True)
                if rnd:
                    times[name].append((time.perf_counter() - t0) * 1e3)
        print(shape, " | ".join(f"{n} " + " ".join(f"{v:.1f}" for v in t) for n, t in times.items()))


if __name__ == "__main__":
    main()
