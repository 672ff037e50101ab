"""ssmkit: selective state-space scans on NumPy (CPU) and CuPy (GPU) arrays.

The operations take NumPy arrays, computed on the CPU by Numba kernels, or
CuPy arrays (and GPU arrays of other frameworks, zero-copy), computed on the GPU
by CUDA kernels that CuPy compiles at first use. ``ssmkit.reference`` holds the
float64 step-by-step versions that define what each operation computes.
"""

from . import reference
from ._problem import SelectiveScanGrads
from ._selective_scan import SelectiveScanPullback, selective_scan, selective_scan_vjp
from ._ssd import SSDGrads, SSDPullback, ssd, ssd_vjp
from ._linear_scan import LinearScanGrads, linear_scan, linear_scan_algorithms, linear_scan_vjp
from ._causal_conv1d import CausalConv1dGrads, CausalConv1dPullback, causal_conv1d, causal_conv1d_update, causal_conv1d_vjp

__version__ = "0.1.0"

__all__ = [
    "SelectiveScanGrads",
    "SelectiveScanPullback",
    "reference",
    "selective_scan",
    "selective_scan_vjp",
    "SSDGrads", "SSDPullback", "ssd", "ssd_vjp",
    "LinearScanGrads", "linear_scan", "linear_scan_algorithms", "linear_scan_vjp",
    "CausalConv1dGrads", "CausalConv1dPullback", "causal_conv1d", "causal_conv1d_update", "causal_conv1d_vjp",
]
