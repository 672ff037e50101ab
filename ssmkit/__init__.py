"""ssmkit: selective state-space scans on NumPy (CPU) and CuPy (GPU) arrays.

The operations take NumPy arrays, computed on the CPU by Numba kernels, or
CuPy arrays (and GPU arrays of other frameworks, zero-copy), computed on the GPU
by CUDA kernels that CuPy compiles at first use. ``ssmkit.reference`` holds the
float64 step-by-step versions that define what each operation computes, and
``ssmkit.layers`` the functional Mamba-1 and Mamba-2 layers built from them.
"""

from . import reference
from ._causal_conv1d import (CausalConv1dGrads, CausalConv1dPullback, causal_conv1d,
                             causal_conv1d_update, causal_conv1d_vjp)
from ._linear_scan import LinearScanGrads, linear_scan, linear_scan_algorithms, linear_scan_vjp
from ._problem import SelectiveScanGrads
from ._selective_scan import SelectiveScanPullback, selective_scan, selective_scan_vjp
from ._ssd import SSDGrads, SSDPullback, ssd, ssd_vjp
from ._state_update import state_update
from . import layers  # noqa: E402  (after the operations it is built from)

__version__ = "0.1.0"

__all__ = [
    "CausalConv1dGrads", "CausalConv1dPullback", "causal_conv1d", "causal_conv1d_update",
    "causal_conv1d_vjp",
    "LinearScanGrads", "linear_scan", "linear_scan_algorithms", "linear_scan_vjp",
    "SelectiveScanGrads", "SelectiveScanPullback", "selective_scan", "selective_scan_vjp",
    "SSDGrads", "SSDPullback", "ssd", "ssd_vjp",
    "state_update",
    "layers",
    "reference",
]
