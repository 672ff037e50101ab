"""A second CUDA stream per device and host thread, for work that can run beside the caller's
stream (the SSD backward's independent chains, the selective scan's state slices)."""

from __future__ import annotations

import threading

_SIDE_STREAMS = threading.local()  # per thread: {device: its second stream}


def fork(cp):
    """A second stream of the current device and host thread (one each, kept) that starts
    after everything enqueued on the current stream so far. Its work joins the current stream
    through :func:`join`. Memory it allocates returns to its own pool, so only later forks of
    the same thread reuse it, and they wait for the current stream again first."""
    streams = _SIDE_STREAMS.__dict__.setdefault("by_device", {})
    device = cp.cuda.Device().id
    side = streams.get(device)
    if side is None:
        side = streams[device] = cp.cuda.Stream(non_blocking=True)
    side.wait_event(cp.cuda.get_current_stream().record())
    return side


def join(cp, side):
    """The current stream waits for everything enqueued on ``side`` so far."""
    cp.cuda.get_current_stream().wait_event(side.record())
