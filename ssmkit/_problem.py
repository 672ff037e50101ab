"""The canonical form in which the public functions hand a selective scan to a backend.

The public layer (``ssmkit._selective_scan``) validates the user's arguments and
normalises them into a :class:`SelectiveScanProblem`; the backends (``ssmkit._cpu``
and ``ssmkit._gpu``) only ever see this one layout, so they never re-check shapes.

Backend contract
----------------
The public layer handles empty problems itself (batch, dim or L of 0): a backend
only ever sees batch, dim, L and N of at least 1. Each backend module provides
two functions::

    selective_scan_forward(p, *, save_checkpoints) -> (y, final_state, checkpoints)
    selective_scan_backward(p, checkpoints, dout, dfinal_state) -> dict

``forward``
    ``y``: (batch, dim, L), dtype ``p.io_dtype``.
    ``final_state``: (batch, dim, N), dtype ``p.compute_dtype``.
    ``checkpoints``: ``None`` unless ``save_checkpoints``; otherwise the state
    entering each chunk of ``p.chunk_size`` steps (chunk 0 holds the initial
    state), ``p.n_chunks * batch * dim * N`` elements of ``p.compute_dtype`` in a
    layout the same backend's ``backward`` understands.
``backward``
    ``dout``: (batch, dim, L) C-contiguous, dtype ``p.io_dtype``;
    ``dfinal_state``: (batch, dim, N) C-contiguous ``p.compute_dtype`` or ``None``.
    Returns a dict with keys ``u, delta, z, A, B, C, D, delta_bias,
    initial_state``: ``u``, ``delta``, ``z`` in ``p.io_dtype`` with their shapes;
    the others in ``p.compute_dtype`` with the shapes of the problem's arrays
    (``B``/``C`` in their canonical shape); ``None`` where the problem's array is
    ``None``.

Packed sequences (``seq_idx``, ``cu_seqlens``) reach a backend as ordinary problems: the
public layer runs them as padded rows (``ssmkit._selective_scan_packed``), unless the
backend module's ``restarts_in_place(p, packing, *, backward, final_states)`` says its
kernels take them for that problem (the CPU's always; the GPU's where its ring kernels
run it). Then both functions also take ``sequences`` (a ``Packing``): the state restarts
from zero after each sequence, and ``final_state`` and ``dfinal_state`` are (n_slots, dim,
N), one per sequence slot; ``final_state`` is None where the forward is not asked for
them (``final_states=False``). The GPU's backward takes only the rows' last sequences'
cotangents.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import numpy as np

SelectiveScanGrads = collections.namedtuple(
    "SelectiveScanGrads",
    ["u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state"],
)
SelectiveScanGrads.__doc__ = """Gradients of a selective scan, one field per differentiable argument.

Each field has the shape and dtype of the argument it belongs to, or is ``None``
where that argument was not given."""


class ChunkedScan:
    """What a scan problem with fields ``A``, ``B``, ``L`` and ``chunk_size`` derives the
    same way whatever the operation (selective scan, SSD)."""

    @property
    def bc_dtype(self) -> np.dtype:
        return self.B.dtype

    @property
    def compute_dtype(self) -> np.dtype:
        return self.A.dtype

    @property
    def n_chunks(self) -> int:
        return -(-self.L // self.chunk_size)


@dataclasses.dataclass(frozen=True)
class SelectiveScanProblem(ChunkedScan):
    """A validated selective scan in canonical layout.

    Attributes
    ----------
    u, delta : array, (batch, dim, L)
        C-contiguous, both of dtype ``io_dtype``.
    z : array, (batch, dim, L) or None
        C-contiguous, ``io_dtype``.
    A : array, (dim, N)
        C-contiguous, ``compute_dtype``.
    B, C : array
        Either (dim, N), the same at every step, or (batch, G, N, L) per step,
        channel ``d`` using group ``d // (dim // G)``; G may differ between B
        and C. C-contiguous; both of dtype ``bc_dtype``.
    D, delta_bias : array, (dim,) or None
        C-contiguous, ``compute_dtype``.
    delta_softplus : bool
    initial_state : array, (batch, dim, N) or None
        C-contiguous, ``compute_dtype``.
    chunk_size : int
        Steps between saved states (the backward recomputes from these); also
        the largest carry interval the tests force.
    xp : module
        ``numpy`` or ``cupy``: where the arrays live.
    """

    u: Any
    delta: Any
    A: Any
    B: Any
    C: Any
    D: Any
    z: Any
    delta_bias: Any
    delta_softplus: bool
    initial_state: Any
    chunk_size: int
    xp: Any

    @property
    def batch(self) -> int:
        return self.u.shape[0]

    @property
    def dim(self) -> int:
        return self.u.shape[1]

    @property
    def L(self) -> int:
        return self.u.shape[2]

    @property
    def N(self) -> int:
        return self.A.shape[1]

    @property
    def io_dtype(self) -> np.dtype:
        return self.u.dtype

    @staticmethod
    def groups(X) -> int:
        """Number of groups of a per-step B or C, or 0 for the (dim, N) form."""
        return X.shape[1] if X.ndim == 4 else 0
