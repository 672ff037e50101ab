"""Float64 reference implementations: plain loops over time, written to be read.

These are the oracle that every fast path in ssmkit is tested against, and a
teaching aid: each function states its recurrence and computes exactly that,
one time step at a time, in float64 NumPy. They accept the same arguments as
the public functions (NumPy arrays, or anything ``numpy.asarray`` takes) and
return float64 NumPy arrays. They do not validate their input beyond what the
computation itself needs.
"""

from ._common import silu, softplus
from .causal_conv1d import causal_conv1d, causal_conv1d_update, causal_conv1d_vjp
from .linear_scan import linear_scan, linear_scan_vjp
from .selective_scan import selective_scan, selective_scan_vjp
from .ssd import ssd, ssd_vjp
from .state_update import state_update

__all__ = [
    "causal_conv1d", "causal_conv1d_update", "causal_conv1d_vjp",
    "linear_scan", "linear_scan_vjp",
    "selective_scan", "selective_scan_vjp",
    "ssd", "ssd_vjp",
    "state_update",
    "softplus", "silu",
]
