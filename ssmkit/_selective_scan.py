"""Mamba-1 selective scan: the public functions, which validate, normalise and dispatch."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import numbers

import numpy as np

from . import _arrays
from . import _selective_scan_packed as _packed
from ._problem import SelectiveScanGrads, SelectiveScanProblem

__all__ = ["selective_scan", "selective_scan_vjp"]

DEFAULT_CHUNK_SIZE = 256
_ARRAY_ARGS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state")


_BACKEND_MODULES = {"cpu": "ssmkit._cpu.selective_scan", "cuda": "ssmkit._gpu.selective_scan",
                    "numba": "ssmkit._numba_cuda.selective_scan"}


def _backend(xp, backend=None):
    """The backend module for arrays of ``xp``, or the one named (imported on first use)."""
    if backend is None:
        backend = "cuda" if xp.__name__ == "cupy" else "cpu"
    return importlib.import_module(_BACKEND_MODULES[backend])


def _check_backend(fn, backend, xp):
    """Validate ``backend``; returns (backend name or None, linear-scan algorithm or None)."""
    if backend is None:
        return None, None
    if not isinstance(backend, str):
        raise TypeError(f"{fn}: backend must be None or a str; got {type(backend).__name__}")
    name, _, algorithm = backend.partition(":")
    from ._linear_scan import ALGORITHMS

    if name not in _BACKEND_MODULES or (algorithm and (name != "numba"
                                                       or algorithm not in ALGORITHMS)):
        raise ValueError(f"{fn}: unknown backend {backend!r}; expected None, 'cuda', 'cpu', "
                         f"'numba' or 'numba:<algorithm>' with <algorithm> one of "
                         f"{', '.join(ALGORITHMS)}")
    where = "gpu" if xp.__name__ == "cupy" else "cpu"
    if (name == "cpu") != (where == "cpu"):
        raise TypeError(f"{fn}: backend {backend!r} computes on the "
                        f"{'CPU (NumPy arrays)' if name == 'cpu' else 'GPU (CuPy arrays)'}; "
                        f"got {'CuPy' if where == 'gpu' else 'NumPy'} arrays")
    return name, (algorithm or "auto") if name == "numba" else None


def _prepare(fn, u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state,
             chunk_size, seq_idx=None, cu_seqlens=None):
    """Validate the arguments and build the canonical problem.

    Returns
    -------
    problem : SelectiveScanProblem
    user : dict
        The user's arrays after conversion (for shapes and dtypes of the gradients).
    packing : Packing or None
        How packed sequences run (:mod:`ssmkit._selective_scan_packed`); None without
        ``seq_idx`` and ``cu_seqlens``.
    """
    named = dict(u=u, delta=delta, A=A, B=B, C=C, D=D, z=z, delta_bias=delta_bias,
                 initial_state=initial_state, seq_idx=seq_idx, cu_seqlens=cu_seqlens)
    for name in ("u", "delta", "A", "B", "C"):
        if named[name] is None:
            raise TypeError(f"{fn}: {name} is required; got None")
    xp, arr = _arrays.array_namespace(fn, named)
    seq_idx, cu_seqlens = arr.pop("seq_idx"), arr.pop("cu_seqlens")
    for name, x in arr.items():
        if x is None:
            continue
        if name == "A" and x.dtype.kind == "c":
            raise TypeError(f"{fn}: complex A ({x.dtype}) is not supported yet; "
                            f"pass a real floating A")
        _arrays.check_real_float(fn, name, x)
    if not isinstance(delta_softplus, (bool, np.bool_)):
        raise TypeError(f"{fn}: delta_softplus must be a bool; got "
                        f"{type(delta_softplus).__name__}")
    if chunk_size is not None:
        if isinstance(chunk_size, (bool, np.bool_)) or not isinstance(chunk_size, numbers.Integral):
            raise TypeError(f"{fn}: chunk_size must be an int or None; got "
                            f"{type(chunk_size).__name__}")
        if chunk_size < 1:
            raise ValueError(f"{fn}: chunk_size must be >= 1; got {chunk_size}")

    u = arr["u"]
    _arrays.check_ndim(fn, "u", u, (3,), "(batch, dim, L)")
    batch, dim, L = u.shape
    _arrays.check_shape(fn, "delta", arr["delta"], u.shape, "(batch, dim, L)")
    if arr["z"] is not None:
        _arrays.check_shape(fn, "z", arr["z"], u.shape, "(batch, dim, L)")
    for name in ("delta", "z"):
        x = arr[name]
        if x is not None and x.dtype != u.dtype:
            raise TypeError(f"{fn}: {name} must have the dtype of u ({u.dtype}); got {x.dtype}")
    A = arr["A"]
    _arrays.check_ndim(fn, "A", A, (2,), "(dim, N)")
    if A.shape[0] != dim or A.shape[1] < 1:
        raise ValueError(f"{fn}: A must have shape (dim, N) with dim = {dim} (from u) and "
                         f"N >= 1; got {tuple(A.shape)}")
    N = A.shape[1]
    for name in ("B", "C"):
        X = arr[name]
        forms = "(dim, N), (batch, N, L) or (batch, G, N, L)"
        _arrays.check_ndim(fn, name, X, (2, 3, 4), forms)
        if X.ndim == 2:
            expected = (dim, N)
        elif X.ndim == 3:
            expected = (batch, N, L)
        else:
            G = X.shape[1]
            if G < 1 or dim % G:
                raise ValueError(f"{fn}: {name} has G = {G} groups (shape {tuple(X.shape)}), "
                                 f"which does not divide dim = {dim}")
            expected = (batch, G, N, L)
        if tuple(X.shape) != expected:
            raise ValueError(f"{fn}: {name} must have shape {forms}; as a {X.ndim}-d array "
                             f"that is {expected} here; got {tuple(X.shape)}")
    for name in ("D", "delta_bias"):
        if arr[name] is not None:
            _arrays.check_shape(fn, name, arr[name], (dim,), "(dim,)")
    if arr["initial_state"] is not None:
        _arrays.check_shape(fn, "initial_state", arr["initial_state"], (batch, dim, N),
                            "(batch, dim, N)")

    # Canonical dtypes: the CPU computes 16-bit inputs in float32 and casts the result back.
    io = u.dtype
    if xp is np and io != np.float64:
        io = np.dtype(np.float32)
    cd = _arrays.compute_dtype_for(io)
    bc = io if (arr["B"].dtype == io and arr["C"].dtype == io) else cd

    def canon(x, dtype):
        return None if x is None else xp.ascontiguousarray(x, dtype=dtype)

    def canon_bc(X):
        X = canon(X, bc)
        return X[:, None] if X.ndim == 3 else X

    problem = SelectiveScanProblem(
        u=canon(u, io), delta=canon(arr["delta"], io), A=canon(A, cd),
        B=canon_bc(arr["B"]), C=canon_bc(arr["C"]), D=canon(arr["D"], cd),
        z=canon(arr["z"], io), delta_bias=canon(arr["delta_bias"], cd),
        delta_softplus=bool(delta_softplus), initial_state=canon(arr["initial_state"], cd),
        chunk_size=int(chunk_size) if chunk_size is not None else DEFAULT_CHUNK_SIZE, xp=xp)
    packing = None
    if seq_idx is not None or cu_seqlens is not None:
        labels, cu = _arrays.packed_sequences(fn, xp, seq_idx, cu_seqlens, batch, L,
                                              on_device=False)
        packing = _packed.plan(labels, cu, batch, L, arr["initial_state"] is not None,
                               align=1 if xp is np else 8)
    return problem, arr, packing


def _device_scope(p):
    """A context that runs GPU work on the device the arrays live on."""
    if p.xp is np:
        return contextlib.nullcontext()
    return p.xp.cuda.Device(p.u.device.id)


def _forward(p, user, save_checkpoints, backend=(None, None), packing=None, pick=None,
             final_states=True):
    """Run the scan; y in the dtype of the user's u. With ``packing`` (packed sequences),
    the final states are one per sequence slot (``final_states`` False: none, and final is
    None) and the checkpoints what the packed backward needs;
    ``pick(problem)`` then chooses each of its calls' chunk size."""
    xp = p.xp
    batch, dim, L, N = p.batch, p.dim, p.L, p.N
    name, algorithm = backend
    extra = {} if algorithm is None else {"algorithm": algorithm}
    if packing is not None:
        y, final, saved = _packed.forward(p, packing, _backend(xp, name),
                                          save_checkpoints=save_checkpoints, pick=pick,
                                          final_states=final_states, **extra)
        return y.astype(user["u"].dtype, copy=False), final, saved
    if batch * dim * L == 0:  # nothing to scan: the state passes through unchanged
        y = xp.zeros((batch, dim, L), dtype=user["u"].dtype)
        final = (p.initial_state.copy() if p.initial_state is not None
                 else xp.zeros((batch, dim, N), dtype=p.compute_dtype))
        return y, final, None
    y, final, checkpoints = _backend(xp, name).selective_scan_forward(
        p, save_checkpoints=save_checkpoints, **extra)
    if y.dtype != user["u"].dtype:
        y = y.astype(user["u"].dtype)
    return y, final, checkpoints


def selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                   *, initial_state=None, return_final_state=False, chunk_size=None,
                   backend=None, seq_idx=None, cu_seqlens=None):
    """Mamba-1's selective scan, fused: discretize, scan, contract with C, D skip, silu(z) gate.

    Runs on the GPU for CuPy arrays (or GPU arrays of other frameworks, taken
    zero-copy through ``__cuda_array_interface__`` / DLPack) and on the CPU for
    NumPy arrays.

    Parameters
    ----------
    u : array, (batch, dim, L)
        Input sequence. float16, bfloat16, float32 or float64.
    delta : array, (batch, dim, L)
        Step sizes, the dtype of ``u``.
    A : array, (dim, N)
        State matrix (diagonal per channel); real.
    B, C : array
        Input and output matrices, each in one of three forms: (dim, N), the
        same at every step; (batch, N, L), per step; (batch, G, N, L), per step
        in G groups, channel d using group ``d // (dim // G)`` (G divides dim).
    D : array, (dim,), optional
        Skip connection.
    z : array, (batch, dim, L), optional
        Gate: the output is multiplied by ``silu(z)``.
    delta_bias : array, (dim,), optional
        Added to ``delta`` before the softplus.
    delta_softplus : bool
        Apply ``softplus`` (threshold 20) to ``delta + delta_bias``.
    initial_state : array, (batch, dim, N), optional
        State before the first step (zeros when absent); with packed sequences
        it feeds the first sequence of each row only.
    return_final_state : bool
        Also return the state after the last step (of each row, or of each
        sequence with ``cu_seqlens``).
    chunk_size : int, optional
        Steps between the states the GPU kernels carry between tiles and the
        backward recomputes from (default 256). Results do not depend on it
        beyond rounding.
    backend : str, optional
        Which kernels compute: None (default) picks by where the arrays live,
        the fused CUDA kernels for GPU arrays and the Numba CPU kernels for
        NumPy arrays; ``"cuda"`` or ``"cpu"`` name those; ``"numba"`` runs the
        forward on the GPU through the Numba CUDA linear scans (unfused, the
        measured alternative to the fused kernel; ``"numba:<algorithm>"`` picks
        one of :func:`ssmkit.linear_scan_algorithms`). The backend must match
        where the arrays live (nothing is copied between host and device).
    seq_idx : array, (batch, L) int, optional
        Packed sequences: non-decreasing along L; where it changes, the state
        restarts from zero.
    cu_seqlens : array, (num_sequences + 1,) int, optional
        Packed sequences in one row (batch 1): the offsets where each starts,
        from 0 to L, non-decreasing (a sequence may be empty). The state
        restarts at each, and the final states are one per sequence. With
        ``seq_idx`` too, both must restart at the same places.

    Returns
    -------
    y : array, (batch, dim, L)
        The dtype of ``u``, on the device of ``u``.
    final_state : array, (batch, dim, N), or (num_sequences, dim, N) with ``cu_seqlens``
        Only with ``return_final_state``: float64 for float64 ``u``, float32
        otherwise. A sequence without steps ends in the state it starts from:
        ``initial_state[0]`` at offset 0, zeros elsewhere.

    Notes
    -----
    For each batch row b and channel d, with h = initial_state or 0::

        dt_t   = delta_t + delta_bias, then softplus(dt_t) when delta_softplus
        h_t[n] = exp(dt_t A[d, n]) h_{t-1}[n] + dt_t B_t[n] u_t
        y_t    = sum_n C_t[n] h_t[n] + D[d] u_t, then y_t silu(z_t) when z is given

    with h_{t-1} = 0 where a packed sequence starts: the same results as
    scanning each sequence alone. On the CPU the kernels restart the state in
    place. On the GPU they do too where its ring kernels run the call (float32
    or 16-bit u, B and C per step, N <= 128, L a multiple of 4 or 8 steps, A <=
    -2^-120); with ``cu_seqlens`` and ``return_final_state`` the states of
    sequences that end inside the row are then recomputed from checkpoints, at
    most a chunk of steps each. Elsewhere the sequences run as padded rows of
    ordinary scans, sequences of similar length in one call (padding at most
    doubles the work; rows without restarts run as they are).

    Arithmetic is float32 for 16- and 32-bit inputs, float64 for float64. On
    the CPU, float16 and bfloat16 inputs are computed in float32 and the result
    cast back.

    References
    ----------
    A. Gu and T. Dao, "Mamba: Linear-Time Sequence Modeling with Selective
    State Spaces", 2023, arXiv:2312.00752.
    """
    p, user, packing = _prepare("selective_scan", u, delta, A, B, C, D, z, delta_bias,
                                delta_softplus, initial_state, chunk_size, seq_idx, cu_seqlens)
    chosen = _check_backend("selective_scan", backend, p.xp)
    with _device_scope(p):
        y, final, _ = _forward(p, user, save_checkpoints=False, backend=chosen, packing=packing,
                               final_states=return_final_state)
    return (y, final) if return_final_state else y


class SelectiveScanPullback:
    """The pullback returned by :func:`selective_scan_vjp`.

    Call it as ``pullback(dy)`` or ``pullback(dy, dfinal_state)``; either
    cotangent may be None (zeros). It keeps the (normalised) inputs and the
    state at each chunk boundary, nothing per step; :attr:`residuals` lists
    what it keeps beyond the inputs.
    """

    def __init__(self, problem, user, checkpoints, packing=None):
        self._problem = problem
        self._user_dtypes = {n: (None if x is None else (x.dtype, x.ndim))
                             for n, x in user.items()}
        self._checkpoints = checkpoints
        self._packing = packing

    @property
    def residuals(self) -> dict:
        """Arrays kept beyond the inputs: ``{"checkpoints": ...}``."""
        return {"checkpoints": self._checkpoints}

    def __call__(self, dy=None, dfinal_state=None) -> SelectiveScanGrads:
        fn = "selective_scan_vjp pullback"
        p = self._problem
        xp = p.xp
        batch, dim, L, N = p.batch, p.dim, p.L, p.N
        packing = self._packing
        finals = batch if packing is None else packing.n_slots
        finals_label = "(batch, dim, N)" if packing is None else "(num_final_states, dim, N)"
        arr = _arrays.check_cotangents(fn, xp, {"u": p.u}, {
            "dy": (dy, (batch, dim, L), "(batch, dim, L)"),
            "dfinal_state": (dfinal_state, (finals, dim, N), finals_label)})
        dy = (xp.zeros((batch, dim, L), p.io_dtype) if arr["dy"] is None
              else xp.ascontiguousarray(arr["dy"], dtype=p.io_dtype))
        dfinal = (None if arr["dfinal_state"] is None
                  else xp.ascontiguousarray(arr["dfinal_state"], dtype=p.compute_dtype))
        with _device_scope(p):
            if packing is not None:
                grads = _packed.backward(p, packing, _backend(xp), self._checkpoints, dy, dfinal)
            elif batch * dim * L == 0:
                grads = {n: (None if getattr(p, n) is None else xp.zeros_like(getattr(p, n)))
                         for n in _ARRAY_ARGS}
                if p.initial_state is not None and dfinal is not None:
                    grads["initial_state"] = dfinal.copy()
            else:
                grads = _backend(xp).selective_scan_backward(p, self._checkpoints, dy, dfinal)
            return SelectiveScanGrads(**{n: self._as_user(n, grads[n]) for n in _ARRAY_ARGS})

    def _as_user(self, name, g):
        """A gradient in the shape form and dtype of the user's argument."""
        meta = self._user_dtypes[name]
        if meta is None:
            return None
        dtype, ndim = meta
        if name in ("B", "C") and ndim == 3:
            g = g[:, 0]
        return g.astype(dtype, copy=False)


def selective_scan_vjp(u, delta, A, B, C, D=None, z=None, delta_bias=None,
                       delta_softplus=False, *, initial_state=None, return_final_state=False,
                       chunk_size=None, backend=None, seq_idx=None, cu_seqlens=None):
    """The selective scan and its pullback (reverse-mode gradient).

    Takes the arguments of :func:`selective_scan`; ``backend`` may be None,
    ``"cuda"`` or ``"cpu"`` (``"numba"`` has no backward and is refused).

    Returns
    -------
    out : array or (array, array)
        Exactly what :func:`selective_scan` returns.
    pullback : SelectiveScanPullback
        ``pullback(dy)`` or ``pullback(dy, dfinal_state)`` returns a
        :class:`SelectiveScanGrads` with fields ``u, delta, A, B, C, D, z,
        delta_bias, initial_state``, each with the shape and dtype of its
        argument (None for arguments not given). ``dfinal_state`` carries a
        gradient through the final state, and ``initial_state`` receives one.

    Notes
    -----
    The forward keeps the state entering each chunk of ``chunk_size`` steps,
    ``batch * dim * N * ceil(L / chunk_size)`` floats beside the inputs. Without a
    ``chunk_size`` the backend picks it: 256 steps, but for the GPU's ring kernels
    (N <= 32, B and C per step) the backward's time tile (16 to 64 steps) where those
    states take no more memory than ``u``, so that the backward recomputes no tile
    twice; where the GPU backward runs as slices of 32 states through those kernels (N >
    32) the fewest whole tiles whose states take no more memory than ``u`` (128 steps at
    N = 128 in float32). The slices run two at a time, the second lane adding into
    float32 buffers of its own for the gradients of ``u``, ``delta`` and ``z``; for 16-bit
    ``u`` they run on float32 copies of ``u``, ``delta``, ``z``, ``B``, ``C`` and the
    cotangent and round those gradients once at the end. Both are held while the backward
    runs. The
    backward walks the chunks in reverse, recomputes each chunk's states from
    its saved state and runs the adjoint recurrence through it::

        g += C_t dy_t                  (g = dLoss/dh_t)
        dC_t += dy_t h_t;  dB_t += g dt_t u_t;  du_t = sum_n g dt_t B_t + D dy_t
        ddt_t = sum_n g (A a_t h_{t-1} + B_t u_t);  dA += g a_t h_{t-1} dt_t
        g *= a_t                       (a_t = exp(dt_t A))

    Reductions run in a fixed order: the gradients are deterministic. Where packed
    sequences run as padded rows on the GPU (see :func:`selective_scan`) the pullback
    also holds the padded rows' copies of the per-step inputs (at most twice their
    steps) and each call's checkpoints; where they restart in place, the backward too
    needs the ring kernels (N <= 32 in one pass, or slices of 32 states where the grid
    is large enough), and takes cotangents of the rows' final states only: with
    ``cu_seqlens`` and ``return_final_state`` the VJP runs padded rows. A cotangent for
    the final state of a sequence that ends inside its row, given to a pullback whose
    forward ran in place, sends the backward through the padded rows, their states
    recomputed.
    """
    p, user, packing = _prepare("selective_scan_vjp", u, delta, A, B, C, D, z, delta_bias,
                                delta_softplus, initial_state, chunk_size, seq_idx, cu_seqlens)
    chosen = _check_backend("selective_scan_vjp", backend, p.xp)
    if chosen[0] == "numba":
        raise ValueError(f"selective_scan_vjp: backend {backend!r} has no backward (the Numba "
                         f"CUDA scans run the forward only); use backend=None or 'cuda'")
    with _device_scope(p):
        pick = None
        if chunk_size is None:  # the backend may keep states more often where that pays
            pick = getattr(_backend(p.xp, chosen[0]), "checkpoint_interval", None)
            if pick is not None and p.batch * p.dim * p.L and packing is None:
                p = dataclasses.replace(p, chunk_size=pick(p))
        y, final, checkpoints = _forward(p, user, save_checkpoints=True, packing=packing,
                                         pick=pick, final_states=return_final_state)
    out = (y, final) if return_final_state else y
    return out, SelectiveScanPullback(p, user, checkpoints, packing)
