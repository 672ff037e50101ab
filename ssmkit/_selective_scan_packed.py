"""Packed sequences in the selective scan (``seq_idx``, ``cu_seqlens``), on any backend.

:func:`plan` reads the sequences; :func:`forward` and :func:`backward` run them. Where the
backend's kernels restart the state themselves (its ``restarts_in_place`` says so: the CPU
always; the GPU where its ring kernels run the call and no sequence but a row's last reports
a final state) they get the sequences as they are. Elsewhere each sequence becomes one row
of an ordinary scan; sequences of similar length share a call, and the results go back to
the steps they came from:

- A sequence that starts from zeros is placed at the end of its row, after steps with
  ``u``, ``delta``, ``B`` and ``z`` zero. Through those the state stays exactly zero
  (``exp(dt A) 0 + dt B 0``), so the sequence starts from zero as a restart does, and the
  row's final state is the sequence's. Gradients there are exactly zero too: every term
  of dA, d delta_bias, dD and a constant dB or dC carries the state before the step or
  ``u`` as a factor.
- A row's first sequence, which takes the row's initial state, is placed at the start of
  its row. The steps after it (``dy`` zero, no final-state cotangent) send no gradient
  back into it. Where its final state is reported too (a row without restarts, or the
  first of ``cu_seqlens``' sequences) it runs in a call of exactly its length.
- Sequences are grouped by length, each group padded to its longest (on the GPU rounded
  up to 8 steps, which its fastest kernels need): a group's rows are at least half its
  length, so padding at most doubles the work, in at most ``log2(L) + 2`` calls.

Rows without restarts run as they are, in one call without copies.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from . import _arrays
from ._problem import SelectiveScanGrads


@dataclasses.dataclass
class Group:
    """One call's rows: row r holds steps ``off[r] + j`` of batch row ``rows[r]`` at its
    columns ``lo[r] <= j < hi[r]`` of ``length`` (zeros elsewhere); ``init[r]``: it starts
    from its batch row's initial state; ``slot[r]``: the final state it reports (-1: none)."""

    rows: np.ndarray
    off: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    length: int
    init: np.ndarray
    slot: np.ndarray

    def __post_init__(self):
        self._on = {}

    @property
    def src(self) -> np.ndarray:
        """(R, length): the source step at each column, -1 where padded."""
        j = np.arange(self.length)
        held = (j >= self.lo[:, None]) & (j < self.hi[:, None])
        return np.where(held, self.off[:, None] + j, -1)

    def on(self, xp):
        """(rows, off, lo, hi) on ``xp``'s device (copied there once)."""
        if xp.__name__ not in self._on:
            self._on[xp.__name__] = tuple(xp.asarray(a) for a in (self.rows, self.off, self.lo,
                                                                  self.hi))
        return self._on[xp.__name__]


@dataclasses.dataclass
class Packing:
    """How the sequences of one call run. ``restarts``: some row restarts (else
    ``row_slot[b]`` is the final-state slot of row b, -1 for none); ``groups``: the padded
    rows' calls, None without restarts (built at first use: the in-place path needs none);
    ``n_slots`` final states, ``passthrough`` (slot, row) pairs of sequences without steps,
    whose final state is the row's initial state."""

    row_slot: np.ndarray
    n_slots: int
    passthrough: list
    segments: tuple = ()  # (ptr (batch + 1), end, slot): each row's sequences, row-major
    padding: tuple | None = None  # (rows, begin, n, init, slot, align): what groups come from

    @property
    def restarts(self) -> bool:
        return self.padding is not None

    @functools.cached_property
    def groups(self) -> list | None:
        return None if self.padding is None else _groups(*self.padding)


@dataclasses.dataclass
class Saved:
    """What :func:`forward` keeps for :func:`backward`: each call's ``(problem,
    checkpoints)``; ``in_place``: one call, the sequences restarting in the kernels."""

    calls: list
    in_place: bool = False


def segment_starts(packing, batch):
    """``(rows, begin)``: each segment's batch row and first step (``packing.segments``'
    order)."""
    ptr, end, _ = packing.segments
    rows = np.repeat(np.arange(batch), np.diff(ptr))
    begin = np.zeros_like(end)
    later = rows[1:] == rows[:-1]  # a segment after another of its row starts where it ended
    begin[1:][later] = end[:-1][later]
    return rows, begin


def restart_steps(packing, batch, L) -> np.ndarray:
    """(batch, L) bool: where a sequence starts after its row's first step (the steps whose
    decay is zero: the state restarts)."""
    restart = np.zeros((batch, L), np.bool_)
    rows, begin = segment_starts(packing, batch)
    restart[rows[begin > 0], begin[begin > 0]] = True  # (segments are never empty)
    return restart


def row_final_slots(packing):
    """The final-state slot of each row's last sequence, which ends at the row's end (-1:
    none)."""
    ptr, _, slot = packing.segments
    return slot[ptr[1:] - 1]  # (every row of L > 0 steps has a segment)


def inner_segments(packing) -> np.ndarray:
    """Per segment: whether it reports a final state and ends inside its row (not its row's
    last)."""
    ptr, _, slot = packing.segments
    inner = slot >= 0
    inner[ptr[1:] - 1] = False
    return inner


def plan(labels, cu, batch, L, has_initial_state, align=1) -> Packing:
    """The packing for sequences ``labels`` (batch, L) (``seq_idx`` on the host), or for
    those of ``cu`` (``cu_seqlens`` on the host, batch 1; ``labels`` then unused), with
    final states per row, or per sequence of ``cu`` when that is given; each call's length a
    multiple of ``align`` steps."""
    if L == 0:
        n_slots = batch if cu is None else cu.size - 1
        passthrough = [(b, b) for b in range(batch)] if cu is None else \
            [(i, 0) for i in range(n_slots)]
        return Packing(np.full(batch, -1, np.int64), n_slots, passthrough)
    # segments: runs of equal labels, row-major; or cu's sequences that have steps
    if cu is None:
        starts = np.ones((batch, L), bool)
        starts[:, 1:] = labels[:, 1:] != labels[:, :-1]
        rows, begin = np.divmod(np.flatnonzero(starts), L)  # (np.nonzero's 2-d form: 6x slower)
        end = np.append(begin[1:], 0)
        end[(np.append(rows[1:], -1) != rows)] = L  # a row's last segment ends at L
        slot = np.where(end == L, rows, -1)
        n_slots = batch
        passthrough = []
    else:
        slot, passthrough = _arrays.offsets_sequences(cu)
        begin, end = cu[:-1][slot], cu[1:][slot]
        rows = np.zeros(begin.size, begin.dtype)
        n_slots = cu.size - 1
    segments = (np.searchsorted(rows, np.arange(batch + 1)), end, slot)
    if np.all(end - begin == L):
        row_slot = np.full(batch, -1, np.int64)
        row_slot[rows] = slot
        return Packing(row_slot, n_slots, passthrough, segments)
    padding = (rows, begin, end - begin, has_initial_state & (begin == 0), slot, align)
    return Packing(np.zeros(0, np.int64), n_slots, passthrough, segments, padding)


def _groups(rows, begin, n, init, slot, align) -> list:
    """The padded rows' calls for segments ``begin`` .. ``begin + n`` of ``rows``."""
    exact = init & (slot >= 0)  # from the initial state, and reporting its final state
    groups = [_group(rows, begin, n, init, slot, np.flatnonzero(exact & (n == m)), m)
              for m in np.unique(n[exact])]
    order = np.flatnonzero(~exact)
    order = order[np.argsort(-n[order], kind="stable")]
    while order.size:
        longest = n[order[0]]
        k = int(np.searchsorted(-2 * n[order], -longest, side="right"))  # 2 n >= longest
        length = -(-int(longest) // align) * align
        groups.append(_group(rows, begin, n, init, slot, order[:k], length))
        order = order[k:]
    return groups


def _group(rows, begin, n, init, slot, pick, length) -> Group:
    """The segments ``pick`` in a call of ``length`` steps: at its start those from the
    initial state, at its end the others."""
    lo = np.where(init[pick], 0, length - n[pick]).astype(np.int32)
    return Group(rows[pick].astype(np.int64), (begin[pick] - lo).astype(np.int64), lo,
                 (lo + n[pick]).astype(np.int32), int(length), init[pick], slot[pick])


def _bits(X):
    """Elements as unsigned integers of their size (16-bit floats included): the copies
    move bits."""
    return X.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[X.dtype.itemsize])


def _copies(xp):
    if xp is np:
        from ._cpu import packed
    else:
        from ._gpu import packed
    return packed


def gather(xp, X, group):
    """Per-step ``X`` (batch, ..., L) -> (R, ..., length): the group's rows, zero where padded."""
    R, length = group.rows.size, group.length
    dst = xp.empty((R,) + X.shape[1:-1] + (length,), X.dtype)
    _copies(xp).pack_rows(_bits(X).reshape(X.shape[0], -1, X.shape[-1]),
                          _bits(dst).reshape(R, -1, length), *group.on(xp))
    return dst


def scatter(xp, out, Xg, group):
    """The inverse of :func:`gather` on the steps the group holds: ``out[b, ..., t] =
    Xg[r, ..., j]`` for every padded position (r, j) that holds step t of row b."""
    if not out.flags.c_contiguous:  # a reshape would copy it, and the writes would be lost
        raise RuntimeError("packed sequences: scatter needs a C-contiguous destination")
    if out.dtype != Xg.dtype:  # the copies move bits
        raise RuntimeError(f"packed sequences: scatter of {Xg.dtype} into {out.dtype}")
    _copies(xp).unpack_rows(_bits(Xg).reshape(Xg.shape[0], -1, Xg.shape[-1]),
                            _bits(out).reshape(out.shape[0], -1, out.shape[-1]), *group.on(xp))


def take_rows(xp, src, src_index):
    """(len(src_index), ...) zeros, with row r = src[src_index[r]] where src_index[r] >= 0
    (host indices): the inverse of :func:`put_rows`."""
    out = xp.zeros((src_index.size,) + src.shape[1:], src.dtype)
    r = np.flatnonzero(src_index >= 0)
    if r.size:
        out[xp.asarray(r)] = src[xp.asarray(src_index[r])]
    return out


def _problem(p, group):
    """The group's rows as an ordinary problem (gathered copies of the per-step arrays)."""
    xp = p.xp

    def steps(X):
        return X if X is None or X.ndim == 2 else gather(xp, X, group)

    h0 = (None if p.initial_state is None
          else take_rows(xp, p.initial_state, np.where(group.init, group.rows, -1)))
    return dataclasses.replace(p, u=steps(p.u), delta=steps(p.delta), z=steps(p.z),
                               B=steps(p.B), C=steps(p.C), initial_state=h0)


def put_rows(xp, dst, dst_index, src):
    """dst[dst_index[r]] = src[r] for every r with dst_index[r] >= 0 (host indices)."""
    r = np.flatnonzero(dst_index >= 0)
    if r.size:
        dst[xp.asarray(dst_index[r])] = src[xp.asarray(r)]


def _in_place(p, packing, backend, *, backward, final_states) -> bool:
    """Whether the backend's kernels restart the state themselves for problem ``p`` (its
    ``restarts_in_place``), so that packed sequences run where they are, without padded
    rows; ``backward``: its backward too; ``final_states``: every sequence's final state."""
    test = getattr(backend, "restarts_in_place", None)
    return (packing.restarts and test is not None
            and test(p, packing, backward=backward, final_states=final_states))


def _passthrough(final, p, packing):
    """``final`` with the slots of sequences without steps set to their row's initial state
    (None stays None)."""
    if final is not None and p.initial_state is not None:
        for slot, row in packing.passthrough:
            final[slot] = p.initial_state[row]
    return final


def forward(p, packing, backend, *, save_checkpoints, pick=None, final_states=True, **extra):
    """Run problem ``p`` with its sequences packed as ``packing`` says, on ``backend`` (a
    module with ``selective_scan_forward``). ``pick(problem)``, when given, chooses each
    call's chunk size. ``final_states``: False where the caller needs no final state (then
    ``final`` is None: at one state per sequence it can outweigh y). Returns ``(y, final,
    saved)``: y (batch, dim, L) in ``p.io_dtype``, final (n_slots, dim, N) in
    ``p.compute_dtype`` or None, saved (:class:`Saved`) what :func:`backward` needs."""
    xp = p.xp
    if p.batch * p.dim * p.L and packing.restarts:
        whole = p if pick is None else dataclasses.replace(p, chunk_size=pick(p))
        if _in_place(whole, packing, backend, backward=save_checkpoints,
                     final_states=final_states):
            y, final, ck = backend.selective_scan_forward(
                whole, save_checkpoints=save_checkpoints, sequences=packing,
                final_states=final_states, **extra)
            return y, _passthrough(final, whole, packing), Saved([(whole, ck)], in_place=True)
    final = (_passthrough(xp.zeros((packing.n_slots, p.dim, p.N), p.compute_dtype), p, packing)
             if final_states else None)
    if p.batch * p.dim * p.L == 0:
        return xp.zeros((p.batch, p.dim, p.L), p.io_dtype), final, Saved([])
    if not packing.restarts:
        calls = [(p, None)]
    else:
        calls = [(_problem(p, g), g) for g in packing.groups]
    y = xp.empty((p.batch, p.dim, p.L), p.io_dtype) if packing.restarts else None
    saved = []
    for pg, g in calls:
        if pick is not None:
            pg = dataclasses.replace(pg, chunk_size=pick(pg))
        yg, fg, ck = backend.selective_scan_forward(pg, save_checkpoints=save_checkpoints, **extra)
        if g is None:
            y = yg
        else:
            scatter(xp, y, yg, g)
        if final is not None:
            put_rows(xp, final, packing.row_slot if g is None else g.slot, fg)
        saved.append((pg, ck))
    return y, final, Saved(saved)


def backward(p, packing, backend, saved, dy, dfinal):
    """The gradients of :func:`forward`'s call (``saved`` its third result) for cotangents
    ``dy`` (batch, dim, L) in ``p.io_dtype`` and ``dfinal`` (n_slots, dim, N) in
    ``p.compute_dtype`` or None; a dict as the backends' ``selective_scan_backward``."""
    xp = p.xp
    names = SelectiveScanGrads._fields
    calls = saved.calls
    if saved.in_place:
        (pg, ck), = calls
        if dfinal is not None and not _in_place(pg, packing, backend, backward=True,
                                                final_states=True) and _inner_cotangents(
                                                    xp, dfinal, packing):
            # the in-place kernels take cotangents of the rows' final states only: the
            # padded rows, their checkpoints recomputed
            calls = [(_problem(pg, g), None) for g in packing.groups]
        else:
            return _passthrough_cotangents(
                backend.selective_scan_backward(pg, ck, dy, dfinal, sequences=packing),
                dfinal, packing)
    # the backends' dtypes: u, delta, z in p.io_dtype, the rest (B and C included, which
    # may be 16-bit) in p.compute_dtype
    grads = {n: (None if getattr(p, n) is None else xp.zeros(
        getattr(p, n).shape, p.io_dtype if n in ("u", "delta", "z") else p.compute_dtype))
        for n in names}
    groups = [None] if packing.groups is None else packing.groups
    for (pg, ck), g in zip(calls, groups):  # (none for an empty problem)
        slots = packing.row_slot if g is None else g.slot
        dfg = None if dfinal is None else take_rows(xp, dfinal, slots)
        dyg = dy if g is None else gather(xp, dy, g)
        gg = backend.selective_scan_backward(pg, ck, dyg, dfg)
        for n in names:
            if grads[n] is None:
                continue
            if g is None:
                grads[n] = gg[n]
            elif n in ("u", "delta", "z") or (n in ("B", "C") and grads[n].ndim == 4):
                scatter(xp, grads[n], gg[n], g)
            elif n == "initial_state":
                r = np.flatnonzero(g.init)
                if r.size:
                    grads[n][xp.asarray(g.rows[r])] = gg[n][xp.asarray(r)]
            else:
                grads[n] += gg[n]
    return _passthrough_cotangents(grads, dfinal, packing)


def _passthrough_cotangents(grads, dfinal, packing):
    """``grads`` with the final-state cotangents of sequences without steps added to their
    row's initial-state gradient."""
    if dfinal is not None and grads["initial_state"] is not None:
        for slot, row in packing.passthrough:
            grads["initial_state"][row] += dfinal[slot]
    return grads


def _inner_cotangents(xp, dfinal, packing) -> bool:
    """Whether ``dfinal`` is nonzero for a sequence that ends inside its row."""
    slots = packing.segments[2][inner_segments(packing)]
    return bool(slots.size) and bool(xp.any(dfinal[xp.asarray(slots)] != 0))
