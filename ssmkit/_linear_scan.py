"""The first-order linear recurrence h_t = a_t h_{t-1} + b_t: public functions.

They validate, move the scanned axis last and flatten the rest into ``rows x L``
views, and dispatch to the CPU kernel (:mod:`ssmkit._cpu.linear_scan`) or one of
the Numba CUDA scans (:mod:`ssmkit._numba_cuda.linear_scan`).
"""

from __future__ import annotations

import collections
import importlib
import numbers

import numpy as np

from . import _arrays

__all__ = ["LinearScanGrads", "linear_scan", "linear_scan_algorithms", "linear_scan_vjp"]

LinearScanGrads = collections.namedtuple("LinearScanGrads", ["a", "b", "initial_state"])
LinearScanGrads.__doc__ = """Gradients of a linear scan, one field per differentiable argument.

Each field has the shape and dtype of its argument (the compute dtype for a Python
scalar), or is ``None`` where the argument was not given."""

# The names ``algorithm`` accepts. The CPU runs one sequential loop per row whatever
# the name; on the GPU each name is a different kernel (see linear_scan's Notes).
ALGORITHMS = ("auto", "sequential", "kogge_stone", "blelloch", "chunked", "lookback")

_SUPPORTED = ("float16, bfloat16, float32, float64, complex64 or complex128")


def linear_scan_algorithms() -> tuple:
    """The names :func:`linear_scan`'s ``algorithm`` accepts.

    Returns
    -------
    tuple of str
        ``"auto"`` first, then the GPU scans: ``"sequential"`` (one thread per
        row), ``"kogge_stone"`` (warp shuffles), ``"blelloch"`` (work-efficient
        shared-memory scan), ``"chunked"`` (three phases over chunks of long rows)
        and ``"lookback"`` (single pass with decoupled look-back).
    """
    return ALGORITHMS


def _is_weak_scalar(x) -> bool:
    """A Python number (not a NumPy scalar): it takes the dtype of the arrays."""
    return isinstance(x, (int, float, complex)) and not isinstance(x, (bool, np.generic))


def _check_dtype(fn, name, x):
    dt = x.dtype
    if dt.kind == "c" and dt.itemsize in (8, 16):
        return
    if _arrays.is_real_float(dt) and dt.itemsize <= 8:
        return
    raise TypeError(f"{fn}: {name} must hold {_SUPPORTED} data; got {dt}")


def _compute_dtype(dtypes, weak_complex):
    complex_ = weak_complex or any(d.kind == "c" for d in dtypes)
    wide = any(d in (np.float64, np.complex128) for d in dtypes)
    if complex_:
        return np.dtype(np.complex128 if wide else np.complex64)
    return np.dtype(np.float64 if wide else np.float32)


class _Scan:
    """A validated call in canonical layout: ``rows x L`` views of the compute dtype."""

    def __init__(self, fn, a, b, initial_state, axis, reverse, algorithm):
        weak = {n: x for n, x in (("a", a), ("b", b)) if _is_weak_scalar(x)}
        named = {n: x for n, x in (("a", a), ("b", b), ("initial_state", initial_state))
                 if n not in weak}
        for n in ("a", "b"):
            if n not in weak and named[n] is None:
                raise TypeError(f"{fn}: {n} is required; got None")
            if isinstance(named.get(n), (bool, np.bool_)):
                raise TypeError(f"{fn}: {n} must be an array or a number; got bool")
        xp, arr = _arrays.array_namespace(fn, named)
        for n, x in arr.items():
            if x is not None:
                _check_dtype(fn, n, x)
        if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, numbers.Integral):
            raise TypeError(f"{fn}: axis must be an int; got {type(axis).__name__}")
        for flag, value in (("reverse", reverse),):
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{fn}: {flag} must be a bool; got {type(value).__name__}")
        if not isinstance(algorithm, str):
            raise TypeError(f"{fn}: algorithm must be a str; got {type(algorithm).__name__}")
        if algorithm not in ALGORITHMS:
            raise ValueError(f"{fn}: unknown algorithm {algorithm!r}; expected one of "
                             f"{', '.join(repr(s) for s in ALGORITHMS)}")

        arrays = [x for x in arr.values() if x is not None]
        cd = _compute_dtype([x.dtype for x in arrays],
                            any(isinstance(x, complex) for x in weak.values()))
        real16 = [x.dtype for x in arrays if x.dtype.itemsize == 2]
        io = real16[0] if real16 and len(set(real16)) == 1 and len(real16) == len(arrays) else cd
        for n, x in weak.items():
            arr[n] = xp.asarray(x, dtype=cd)

        a_arr, b_arr = arr["a"], arr["b"]
        try:
            shape = tuple(np.broadcast_shapes(a_arr.shape, b_arr.shape))
        except ValueError:
            raise ValueError(f"{fn}: a and b must broadcast against each other; got shapes "
                             f"{tuple(a_arr.shape)} and {tuple(b_arr.shape)}") from None
        if len(shape) == 0:
            raise ValueError(f"{fn}: a and b must have at least one axis to scan along; "
                             f"both are 0-d")
        if not -len(shape) <= axis < len(shape):
            raise ValueError(f"{fn}: axis {axis} is out of range for the {len(shape)}-d "
                             f"broadcast shape {shape}; expected -{len(shape)} <= axis < "
                             f"{len(shape)}")
        axis = int(axis) % len(shape)
        state_shape = shape[:axis] + shape[axis + 1:]
        h0 = arr["initial_state"]
        if h0 is not None:
            _arrays.check_shape(fn, "initial_state", h0, state_shape,
                                "(the broadcast shape of a and b without axis)")

        self.fn, self.xp, self.algorithm, self.reverse = fn, xp, algorithm, bool(reverse)
        self.shape, self.axis, self.state_shape = shape, axis, state_shape
        self.compute_dtype, self.io_dtype = cd, np.dtype(io)
        self.user = {n: (None if x is None else (x.shape, x.dtype)) for n, x in arr.items()}
        for n in weak:
            self.user[n] = ((), cd)
        self.L = shape[axis]
        self.rows = int(np.prod(state_shape, dtype=np.int64))
        self.a2 = self._rows_view(a_arr)
        self.b2 = self._rows_view(b_arr)
        self.h0 = None if h0 is None else h0.astype(cd, copy=False).reshape(self.rows)

    # -- layout --------------------------------------------------------------------------
    def _rows_view(self, x):
        """``x`` broadcast to the full shape, scanned axis last, as (rows, L), a view if it can."""
        x = self.xp.broadcast_to(x.astype(self.compute_dtype, copy=False), self.shape)
        return self.xp.moveaxis(x, self.axis, -1).reshape(self.rows, self.L)

    def from_rows(self, x2):
        """A (rows, L) result back in the caller's layout."""
        moved = self.state_shape + (self.L,)
        return self.xp.moveaxis(x2.reshape(moved), -1, self.axis)

    def to_rows(self, x):
        return self.xp.moveaxis(x, self.axis, -1).reshape(self.rows, self.L)

    # -- running -------------------------------------------------------------------------
    def scan_rows(self, a2, b2, h0, reverse):
        """Run the backend on (rows, L) views; returns (h2, final) in the compute dtype."""
        xp = self.xp
        if h0 is None:
            h0 = xp.zeros(self.rows, dtype=self.compute_dtype)
        if self.rows == 0 or self.L == 0:
            return xp.zeros((self.rows, self.L), self.compute_dtype), h0.copy()
        if xp is np:
            if self.algorithm not in ("auto", "sequential"):
                raise ValueError(f"{self.fn}: algorithm {self.algorithm!r} runs on the GPU "
                                 f"(CuPy arrays); NumPy arrays take 'auto' or 'sequential'")
            backend = importlib.import_module("ssmkit._cpu.linear_scan")
            return backend.linear_scan_rows(a2, b2, h0, reverse)
        backend = importlib.import_module("ssmkit._numba_cuda.linear_scan")
        with xp.cuda.Device(b2.device.id):
            return backend.linear_scan_rows(a2, b2, h0, reverse, self.algorithm)

    def forward(self, return_final_state):
        h2, final = self.scan_rows(self.a2, self.b2, self.h0, self.reverse)
        h = self.from_rows(h2)
        if h.dtype != self.io_dtype:
            h = h.astype(self.io_dtype)
        return (h, final.reshape(self.state_shape)) if return_final_state else h


_NOTES = """
    Notes
    -----
    Along ``axis``, with ``h_{-1} = initial_state`` (zeros when absent)::

        h_t = a_t h_{t-1} + b_t,   t = 0, 1, ..., L-1   (L-1 down to 0 with reverse)

    With a constant ``a`` this is the one-pole IIR filter
    ``scipy.signal.lfilter([1], [1, -a], b)``.

    dtypes: the computation runs in float32, float64, complex64 or complex128,
    the narrowest that holds every argument (Python numbers take the arrays'
    dtype). float16 and bfloat16 are computed in float32 (CPU and GPU) and the
    result is cast back when every array argument has that one 16-bit dtype.

    On the CPU (NumPy arrays) one Numba loop per row runs, rows in parallel
    (``algorithm`` ``"auto"`` or ``"sequential"``; the GPU scans' names are
    refused there). On the GPU (CuPy arrays) ``algorithm`` picks one
    of the Numba CUDA kernels of :mod:`ssmkit._numba_cuda.linear_scan`, all on
    the rows x L layout:

    ``"sequential"``
        One thread per row, 128 rows per block, 128 bytes of each row staged
        through shared memory per round so loads and stores stay coalesced.
        Best for many short rows.
    ``"kogge_stone"``
        One block of 256 threads per row, walking it in tiles of 16 KiB per
        array: each thread composes 16 (8-byte values: 8, 16-byte: 4)
        consecutive steps, the warps scan those pairs with ``shfl_up_sync``
        (Kogge-Stone), warp totals combine through shared memory, and the state
        at the end of a tile is carried into the next.
    ``"blelloch"``
        As ``"kogge_stone"``, with the pairs scanned by the work-efficient
        up-sweep/down-sweep tree in shared memory instead of shuffles.
    ``"chunked"``
        For few long rows: each chunk of 8 tiles is reduced to one pair (phase
        1), one thread per row walks the chunk pairs for every chunk's
        incoming state (phase 2), and every chunk is rescanned from it (phase
        3). Reads the input twice.
    ``"lookback"``
        One block per tile, single pass with decoupled look-back: each block
        takes a ticket (tiles start in order), reduces its tile, publishes
        the pair, and its first warp looks back 32 tiles at a time (ballot
        for the nearest published inclusive state, shuffle reduction of the
        pairs in between) before publishing its own state and scanning its
        tile once.
    ``"auto"``
        ``"lookback"`` when there are too few rows to fill the GPU one block
        per row (rows < 4 x SM count) and rows are long (L > 4096);
        ``"sequential"`` for rows of L <= 256 with at least 8192 rows;
        otherwise ``"kogge_stone"``. benchmarks/LINEAR_SCAN.md has the
        measurements behind this choice.

    Rows are read along ``L`` in place (a broadcast ``a`` is not materialised
    when the reshape allows a view); data strided along ``L`` is copied once.
    When ``a`` and ``b`` run along ``L`` with unit stride, their rows start
    16-byte aligned and ``L`` is a multiple of 16 bytes' worth of steps (4 in
    float32, 2 in float64 and complex64, any in complex128), every kernel
    moves data as 16-byte vectors: the tile kernels keep each thread's
    consecutive steps in registers (no shared-memory staging), the
    sequential kernel stages its rounds through vectors. Other inputs take
    element-wise loads staged through shared memory; the results agree.
"""


def linear_scan(a, b, *, initial_state=None, axis=-1, reverse=False, algorithm="auto",
                return_final_state=False):
    """The first-order linear recurrence ``h_t = a_t h_{t-1} + b_t`` along an axis.

    Parameters
    ----------
    a : array or number
        Coefficients, broadcasting against ``b``. Real or complex.
    b : array or number
        Inputs, broadcasting against ``a``. Real or complex.
    initial_state : array, optional
        ``h_{-1}``: the broadcast shape of ``a`` and ``b`` with ``axis`` removed
        (zeros when absent).
    axis : int
        The axis of the broadcast shape to scan along.
    reverse : bool
        Run from the end: ``h_t = a_t h_{t+1} + b_t``, ``h_L = initial_state``.
    algorithm : str
        One of :func:`linear_scan_algorithms` (see Notes).
    return_final_state : bool
        Also return the state after the last step.

    Returns
    -------
    h : array
        The broadcast shape of ``a`` and ``b``, where the inputs live (NumPy or
        CuPy).
    final_state : array
        Only with ``return_final_state``: the broadcast shape without ``axis``,
        in the compute dtype.
    """
    scan = _Scan("linear_scan", a, b, initial_state, axis, reverse, algorithm)
    if not isinstance(return_final_state, (bool, np.bool_)):
        raise TypeError(f"linear_scan: return_final_state must be a bool; got "
                        f"{type(return_final_state).__name__}")
    return scan.forward(return_final_state)


linear_scan.__doc__ += _NOTES


class LinearScanPullback:
    """The pullback returned by :func:`linear_scan_vjp`.

    ``pullback(dh)`` or ``pullback(dh, dfinal_state)`` (either may be None)
    returns a :class:`LinearScanGrads`. It keeps the inputs only; the states
    are recomputed by one more forward scan.
    """

    def __init__(self, scan):
        self._scan = scan

    def __call__(self, dh=None, dfinal_state=None) -> LinearScanGrads:
        s = self._scan
        fn = "linear_scan_vjp pullback"
        xp = s.xp
        xp_c, arr = _arrays.array_namespace(fn, {"dh": dh, "dfinal_state": dfinal_state})
        if any(x is not None for x in arr.values()) and xp_c is not xp:
            raise TypeError(f"{fn}: cotangents must live where the inputs do "
                            f"({xp.__name__}); got {xp_c.__name__} arrays")
        for name, shape in (("dh", s.shape), ("dfinal_state", s.state_shape)):
            if arr[name] is not None:
                _check_dtype(fn, name, arr[name])
                _arrays.check_shape(fn, name, arr[name], shape,
                                    "(the output's shape)" if name == "dh"
                                    else "(the final state's shape)")
        cd, rows, L = s.compute_dtype, s.rows, s.L
        dh2 = (xp.zeros((rows, L), cd) if arr["dh"] is None
               else s.to_rows(arr["dh"].astype(cd, copy=False)))
        dfinal = (None if arr["dfinal_state"] is None
                  else arr["dfinal_state"].astype(cd, copy=False).reshape(rows))
        h0 = s.h0 if s.h0 is not None else xp.zeros(rows, cd)

        # The adjoint is the same recurrence run the other way:
        # g_t = conj(a_next) g_next + dh_t, starting from dfinal_state.
        if L == 0 or rows == 0:
            g = xp.zeros((rows, L), cd)
            g_first = dfinal if dfinal is not None else xp.zeros(rows, cd)
            grad_a, grad_h0 = g, g_first
        else:
            h2, _ = s.scan_rows(s.a2, s.b2, s.h0, s.reverse)
            ac = xp.conj(s.a2) if cd.kind == "c" else s.a2
            ga = xp.ones((rows, L), cd)
            h_prev = xp.empty((rows, L), cd)
            if s.reverse:
                ga[:, 1:] = ac[:, :-1]
                h_prev[:, :-1], h_prev[:, -1] = h2[:, 1:], h0
                first = L - 1
            else:
                ga[:, :-1] = ac[:, 1:]
                h_prev[:, 1:], h_prev[:, 0] = h2[:, :-1], h0
                first = 0
            g, _ = s.scan_rows(ga, dh2, dfinal, not s.reverse)
            grad_a = g * (xp.conj(h_prev) if cd.kind == "c" else h_prev)
            grad_h0 = ac[:, first] * g[:, first]
        return LinearScanGrads(
            self._as_user("a", grad_a), self._as_user("b", g),
            None if s.user["initial_state"] is None
            else self._cast("initial_state", grad_h0.reshape(s.state_shape)))

    def _cast(self, name, g):
        shape, dtype = self._scan.user[name]
        if dtype.kind != "c" and g.dtype.kind == "c":
            g = g.real
        return g.astype(dtype, copy=False)

    def _as_user(self, name, g2):
        """A (rows, L) gradient summed back to the shape of the user's argument."""
        s = self._scan
        shape = s.user[name][0]
        g = s.from_rows(g2)
        lead = g.ndim - len(shape)
        if lead:
            g = g.sum(axis=tuple(range(lead)))
        axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
        if axes:
            g = g.sum(axis=axes, keepdims=True)
        return self._cast(name, s.xp.ascontiguousarray(g))


def linear_scan_vjp(a, b, *, initial_state=None, axis=-1, reverse=False, algorithm="auto",
                    return_final_state=False):
    """The linear scan and its pullback (reverse-mode gradient).

    Takes the arguments of :func:`linear_scan`.

    Returns
    -------
    out : array or (array, array)
        Exactly what :func:`linear_scan` returns.
    pullback : LinearScanPullback
        ``pullback(dh)`` or ``pullback(dh, dfinal_state)`` returns a
        :class:`LinearScanGrads` ``(a, b, initial_state)``, each the shape and
        dtype of its argument (None for an absent ``initial_state``).

    Notes
    -----
    The adjoint of a linear recurrence is a linear recurrence run the other
    way, so the pullback is two more scans (one recomputes the states, one
    runs the adjoint) with the same ``algorithm``::

        g_t = dh_t + conj(a_{t+1}) g_{t+1}     (g_{L-1} = dh_{L-1} + dfinal_state)
        grad b_t = g_t;  grad a_t = g_t conj(h_{t-1});  grad initial_state = conj(a_0) g_0

    Complex gradients follow PyTorch's convention: for a real loss, the
    gradient of a complex argument is ``dLoss/dRe + 1j * dLoss/dIm``; that of a
    real argument is the real part. Gradients of broadcast arguments are summed
    back to their shapes.
    """
    scan = _Scan("linear_scan_vjp", a, b, initial_state, axis, reverse, algorithm)
    if not isinstance(return_final_state, (bool, np.bool_)):
        raise TypeError(f"linear_scan_vjp: return_final_state must be a bool; got "
                        f"{type(return_final_state).__name__}")
    return scan.forward(return_final_state), LinearScanPullback(scan)
