"""What every benchmark script shares: CUDA-event timing, the copy bandwidth, the commit.

Each figure a benchmark reports is set against the device-to-device copy
bandwidth measured in the same run (:func:`copy_tbps`), and each row names the
code it timed (:func:`commit`).
"""

from __future__ import annotations

import os
import subprocess

import numpy as np


def commit() -> str:
    """The commit the timed code comes from.

    ``$SSMKIT_COMMIT`` first (a GPU machine's copy of the tree may carry stale
    git state), else git's short HEAD, marked ``+working tree`` when files differ
    from it, else ``"unknown"``.
    """
    env = os.environ.get("SSMKIT_COMMIT")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=here,
                                       text=True, stderr=subprocess.DEVNULL).strip()
        dirty = subprocess.check_output(["git", "status", "--porcelain"], cwd=here, text=True,
                                        stderr=subprocess.DEVNULL).strip()
        return head + ("+working tree" if dirty else "")
    except Exception:
        return "unknown"


def cuda_median_ms(fn, warmup=3, reps=20, calls=1):
    """Median over ``reps`` of the CUDA-event time of ``calls`` back-to-back calls, per call.

    With ``calls=1`` this is the latency of one call, host work included; with
    more, the host prepares the next call while the GPU runs the last one, as in
    a pipeline, and the figure is the device time per call whenever that exceeds
    the host's. For that, one untimed call is queued before the start event: the
    GPU runs it while the host prepares the first timed call, so the timed calls
    do not include the host time of the first one. (Without it, each figure
    carried a ``calls``-th of one call's host time: for a 50 us kernel at 5 calls
    and 30-40 us of host work, 6-8 us.)
    """
    import cupy

    for _ in range(warmup):
        fn()
    cupy.cuda.Device().synchronize()
    times = []
    for _ in range(reps):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        if calls > 1:
            fn()  # the primer: the GPU busy before the timed calls start
        start.record()
        for _ in range(calls):
            fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / calls)
    return float(np.median(times))


def host_median_us(fn, calls=200, reps=9, warmup=0, sync=False):
    """Median over ``reps`` of the wall-clock microseconds per call of ``calls`` back-to-back
    calls of ``fn`` after ``warmup`` calls: the host's side of a call, where the GPU work is
    negligible or never waited for. With ``sync``, the device is synchronised before each
    batch and after the last, so that no batch waits on work queued by the one before."""
    import time

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if sync:
            _device_sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    if sync:
        _device_sync()
    return float(np.median(times))


def _device_sync():
    import cupy

    cupy.cuda.Device().synchronize()


def copy_tbps(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth of an ``nbytes`` buffer, bytes read plus written, in TB/s."""
    import cupy

    src = cupy.ones(nbytes, dtype=cupy.uint8)
    dst = cupy.empty_like(src)
    ms = cuda_median_ms(lambda: cupy.copyto(dst, src), warmup=3, reps=20)
    return 2 * nbytes / (ms * 1e-3) / 1e12
