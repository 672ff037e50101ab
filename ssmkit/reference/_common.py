"""Pointwise functions the references share, in float64."""

from __future__ import annotations

import numpy as np

__all__ = ["softplus", "silu"]


def softplus(x):
    """``log1p(exp(x))`` for ``x <= 20``, ``x`` above (the threshold every peer uses)."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(x <= 20.0, np.log1p(np.exp(np.minimum(x, 20.0))), x)


def silu(x):
    """``x * sigmoid(x)``."""
    x = np.asarray(x, dtype=np.float64)
    return x / (1.0 + np.exp(-x))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _f64(x):
    return None if x is None else np.asarray(x, dtype=np.float64)
