"""Float64 (complex128) reference for the first-order linear recurrence h_t = a_t h_{t-1} + b_t."""

from __future__ import annotations

import numpy as np

from .._linear_scan import LinearScanGrads

__all__ = ["linear_scan", "linear_scan_vjp"]


def _as64(x):
    """float64, or complex128 for complex data."""
    x = np.asarray(x)
    return x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)


def _sum_to_shape(g, shape):
    """Sum a broadcast gradient back to ``shape`` (NumPy broadcasting rules)."""
    shape = tuple(shape)
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def _scan(a, b, h0, reverse):
    """Step by step along the last axis; ``a``, ``b`` already broadcast, h0 (...,) or None."""
    L = b.shape[-1]
    h = np.zeros(b.shape[:-1], dtype=b.dtype) if h0 is None else h0.astype(b.dtype)
    out = np.empty_like(b)
    steps = range(L - 1, -1, -1) if reverse else range(L)
    for t in steps:
        h = a[..., t] * h + b[..., t]
        out[..., t] = h
    return out, h


def _canonical(a, b, initial_state, axis):
    a, b = _as64(a), _as64(b)
    shape = np.broadcast_shapes(a.shape, b.shape)
    cdt = np.result_type(a.dtype, b.dtype)
    axis = axis % len(shape)
    a_full = np.moveaxis(np.broadcast_to(a, shape), axis, -1).astype(cdt)
    b_full = np.moveaxis(np.broadcast_to(b, shape), axis, -1).astype(cdt)
    h0 = None if initial_state is None else _as64(initial_state)
    if h0 is not None and h0.dtype.kind == "c":
        a_full, b_full = a_full.astype(np.complex128), b_full.astype(np.complex128)
    return a, b, a_full, b_full, h0, axis


def linear_scan(a, b, *, initial_state=None, axis=-1, reverse=False, return_final_state=False):
    """The first-order linear recurrence, one step at a time in float64 (complex128).

    Parameters are those of :func:`ssmkit.linear_scan` (``algorithm`` aside).

    Notes
    -----
    Along ``axis``, with ``h = initial_state`` (zeros when absent)::

        h_t = a_t h_{t-1} + b_t        (t = 0, 1, ..., L-1; from L-1 down with reverse)
    """
    a, b, a_full, b_full, h0, axis = _canonical(a, b, initial_state, axis)
    h, final = _scan(a_full, b_full, h0, reverse)
    h = np.moveaxis(h, -1, axis)
    return (h, final) if return_final_state else h


def linear_scan_vjp(a, b, *, initial_state=None, axis=-1, reverse=False,
                    return_final_state=False):
    """The reference scan and its pullback.

    Returns ``(out, pullback)``; ``pullback(dh, dfinal_state=None)`` returns a
    :class:`LinearScanGrads` ``(a, b, initial_state)``.

    Notes
    -----
    With ``g_t = dLoss/dh_t`` summed over every path, the adjoint runs the other
    way (complex: PyTorch's convention, ``grad = dL/dRe + i dL/dIm``)::

        g_t = dh_t + conj(a_{t+1}) g_{t+1}     (g_{L-1} = dh_{L-1} + dfinal_state)
        grad b_t = g_t;  grad a_t = g_t conj(h_{t-1});  grad h_{-1} = conj(a_0) g_0

    Gradients of real arguments are the real parts; gradients of broadcast
    arguments are summed back to their shapes.
    """
    a, b, a_full, b_full, h0, axis = _canonical(a, b, initial_state, axis)
    h, final = _scan(a_full, b_full, h0, reverse)
    out = np.moveaxis(h, -1, axis)
    out = (out, final) if return_final_state else out
    a_shape, b_shape, a_real, b_real = a.shape, b.shape, a.dtype.kind != "c", b.dtype.kind != "c"
    h0_real = h0 is not None and h0.dtype.kind != "c"

    def pullback(dh=None, dfinal_state=None):
        if reverse:  # mirror: time runs backwards, so flip into a forward problem
            af, hf = a_full[..., ::-1], h[..., ::-1]
        else:
            af, hf = a_full, h
        g_in = np.zeros_like(hf) if dh is None else np.moveaxis(_as64(dh), axis, -1)
        if reverse and dh is not None:
            g_in = g_in[..., ::-1]
        L = hf.shape[-1]
        g = np.zeros(hf.shape[:-1], dtype=hf.dtype)
        if dfinal_state is not None:
            g = g + _as64(dfinal_state)
        grad_b = np.empty_like(hf)
        for t in range(L - 1, -1, -1):
            g = g + g_in[..., t]
            grad_b[..., t] = g
            if t > 0:
                g = np.conj(af[..., t]) * g
        h_prev = np.concatenate([(np.zeros(hf.shape[:-1], hf.dtype) if h0 is None
                                  else np.broadcast_to(h0, hf.shape[:-1]))[..., None],
                                 hf[..., :-1]], axis=-1)
        grad_a = grad_b * np.conj(h_prev)
        grad_h0 = None if h0 is None else np.conj(af[..., 0]) * grad_b[..., 0] if L else g
        if reverse:
            grad_a, grad_b = grad_a[..., ::-1], grad_b[..., ::-1]
        grad_a = _sum_to_shape(np.moveaxis(grad_a, -1, axis), a_shape)
        grad_b = _sum_to_shape(np.moveaxis(grad_b, -1, axis), b_shape)
        if a_real:
            grad_a = grad_a.real
        if b_real:
            grad_b = grad_b.real
        if grad_h0 is not None and h0_real:
            grad_h0 = grad_h0.real
        return LinearScanGrads(grad_a, grad_b, grad_h0)

    return out, pullback
