"""GPU backend: CuPy arrays, CUDA kernels from ``cuda_src/`` compiled lazily by NVRTC.

Importing this package imports neither CuPy nor compiles anything; kernels are
compiled at their first use (or ahead of time with :func:`warmup`).
"""

from .selective_scan import selective_scan_backward, selective_scan_forward, warmup

__all__ = ["selective_scan_forward", "selective_scan_backward", "warmup"]
