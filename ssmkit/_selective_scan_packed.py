"""Packed sequences in the selective scan (``seq_idx``, ``cu_seqlens``), on any backend.

Each sequence becomes one row of an ordinary scan; sequences of similar length share a
call, and the results go back to the steps they came from. No kernel sees a restart:

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
- Sequences are grouped by length, each group padded to its longest (rounded up to 8
  steps, which the GPU's fastest kernels need): a group's rows are at least half its
  length, so padding at most doubles the work, in at most ``log2(L) + 2`` calls.

Rows without restarts run as they are, in one call without copies.
"""

from __future__ import annotations

import dataclasses

import numpy as np

_ALIGN = 8  # a group's length is rounded up to this many steps


@dataclasses.dataclass
class Group:
    """One call's rows: ``rows[r]`` is the batch row that row r's steps come from, ``src``
    (R, length) the source step of each (-1: padding), ``init`` whether row r starts from
    its batch row's initial state, ``slot`` the final state it reports (-1: none)."""

    rows: np.ndarray
    src: np.ndarray
    init: np.ndarray
    slot: np.ndarray

    def __post_init__(self):
        r, j = np.nonzero(self.src >= 0)
        self.at = (r, j)                          # padded positions that hold steps
        self.to = (self.rows[r], self.src[r, j])  # and the (batch row, step) each holds


@dataclasses.dataclass
class Packing:
    """How the sequences of one call run: ``groups``, or None when no row restarts (then
    ``row_slot[b]`` is the final-state slot of row b, -1 for none); ``n_slots`` final
    states, ``passthrough`` (slot, row) pairs of sequences without steps, whose final state
    is the row's initial state."""

    groups: list | None
    row_slot: np.ndarray
    n_slots: int
    passthrough: list


def plan(labels, cu, batch, L, has_initial_state) -> Packing:
    """The packing for sequences ``labels`` (batch, L) (from :func:`ssmkit._arrays.packed_sequences`),
    with final states per row, or per sequence of ``cu`` when that is given."""
    segments = []  # (row, begin, end, slot)
    for b in range(batch):
        cuts = np.flatnonzero(labels[b, 1:] != labels[b, :-1]) + 1 if L > 1 else np.zeros(0, int)
        bounds = np.concatenate(([0], cuts, [L])) if L > 0 else np.zeros(0, int)
        for i in range(bounds.size - 1):
            segments.append([b, int(bounds[i]), int(bounds[i + 1]), -1])
    if cu is None:
        for seg in segments:
            if seg[2] == L:
                seg[3] = seg[0]
        n_slots = batch
        passthrough = [(b, b) for b in range(batch)] if L == 0 else []
    else:
        for seg, i in zip(segments, np.flatnonzero(cu[1:] > cu[:-1])):
            seg[3] = int(i)
        n_slots = cu.size - 1
        passthrough = [(i, 0) for i in range(n_slots) if cu[i] == cu[i + 1] == 0]
    if all(end - begin == L for _, begin, end, _ in segments):
        row_slot = np.full(batch, -1, np.int64)
        for b, _, _, slot in segments:
            row_slot[b] = slot
        return Packing(None, row_slot, n_slots, passthrough)

    exact, rest = {}, []
    for seg in segments:
        b, begin, end, slot = seg
        if has_initial_state and begin == 0 and slot >= 0:
            exact.setdefault(end, []).append(seg)
        else:
            rest.append(seg)
    groups = [_group(segs, length, has_initial_state) for length, segs in sorted(exact.items())]
    rest.sort(key=lambda s: s[2] - s[1], reverse=True)
    while rest:
        longest = rest[0][2] - rest[0][1]
        n = next((i for i, s in enumerate(rest) if 2 * (s[2] - s[1]) < longest), len(rest))
        length = -(-longest // _ALIGN) * _ALIGN
        groups.append(_group(rest[:n], length, has_initial_state))
        rest = rest[n:]
    return Packing(groups, np.zeros(0, np.int64), n_slots, passthrough)


def _group(segments, length, has_initial_state) -> Group:
    R = len(segments)
    src = np.full((R, length), -1, np.int64)
    init = np.zeros(R, bool)
    for r, (_, begin, end, _) in enumerate(segments):
        init[r] = has_initial_state and begin == 0
        at = 0 if init[r] else length - (end - begin)
        src[r, at:at + end - begin] = np.arange(begin, end)
    rows = np.array([s[0] for s in segments], np.int64)
    return Group(rows, src, init, np.array([s[3] for s in segments], np.int64))


def _on(xp, group):
    """The group's index arrays on ``xp``'s device (cached on the group)."""
    key = xp.__name__
    cache = group.__dict__.setdefault("_dev", {})
    if key not in cache:
        cache[key] = dict(rows=xp.asarray(group.rows), src=xp.asarray(np.maximum(group.src, 0)),
                          pad=xp.asarray(group.src < 0), at=tuple(map(xp.asarray, group.at)),
                          to=tuple(map(xp.asarray, group.to)))
    return cache[key]


def _bits(X):
    """16-bit floats as their bits (zero is 0 in every format): the copies below then need
    no bfloat16 support from the array library."""
    return X.view(np.uint16) if X.dtype.itemsize == 2 else X


def gather(xp, X, group):
    """Per-step ``X`` (batch, ..., L) -> (R, ..., length): the group's rows, zero where padded."""
    d = _on(xp, group)
    idx = (d["rows"][:, None],) + (slice(None),) * (X.ndim - 2) + (d["src"],)
    Xg = _bits(X)[idx]  # (R, length, ...): NumPy puts the advanced axes first
    pad = d["pad"].reshape(d["pad"].shape + (1,) * (X.ndim - 2))
    Xg = xp.where(pad, xp.zeros((), Xg.dtype), Xg)
    return xp.ascontiguousarray(xp.moveaxis(Xg, 1, -1)).view(X.dtype)


def scatter(xp, out, Xg, group):
    """The inverse of :func:`gather` on the steps the group holds: ``out[b, ..., t] =
    Xg[r, ..., j]`` for every padded position (r, j) that holds step t of row b."""
    d = _on(xp, group)
    mid = (slice(None),) * (out.ndim - 2)
    _bits(out)[(d["to"][0],) + mid + (d["to"][1],)] = \
        _bits(Xg)[(d["at"][0],) + mid + (d["at"][1],)]


def rows_of(xp, X, group, mask):
    """(R, ...) from per-row ``X`` (batch, ...): the group's rows where ``mask``, else zeros."""
    out = xp.zeros((group.rows.size,) + X.shape[1:], X.dtype)
    r = np.flatnonzero(mask)
    if r.size:
        out[xp.asarray(r)] = X[xp.asarray(group.rows[r])]
    return out


def _problem(p, group):
    """The group's rows as an ordinary problem (gathered copies of the per-step arrays)."""
    xp = p.xp

    def steps(X):
        return X if X is None or X.ndim == 2 else gather(xp, X, group)

    h0 = None if p.initial_state is None else rows_of(xp, p.initial_state, group, group.init)
    return dataclasses.replace(p, u=steps(p.u), delta=steps(p.delta), z=steps(p.z),
                               B=steps(p.B), C=steps(p.C), initial_state=h0)


def _put(xp, dst, dst_index, src):
    """dst[dst_index[r]] = src[r] for every r with dst_index[r] >= 0 (host indices)."""
    r = np.flatnonzero(dst_index >= 0)
    if r.size:
        dst[xp.asarray(dst_index[r])] = src[xp.asarray(r)]


def forward(p, packing, backend, *, save_checkpoints, pick=None, **extra):
    """Run problem ``p`` with its sequences packed as ``packing`` says, on ``backend`` (a
    module with ``selective_scan_forward``). ``pick(problem)``, when given, chooses each
    call's chunk size. Returns ``(y, final, saved)``: y (batch, dim, L) in ``p.io_dtype``,
    final (n_slots, dim, N) in ``p.compute_dtype``, saved what :func:`backward` needs."""
    xp = p.xp
    final = xp.zeros((packing.n_slots, p.dim, p.N), p.compute_dtype)
    if p.initial_state is not None:
        for slot, row in packing.passthrough:
            final[slot] = p.initial_state[row]
    if p.batch * p.dim * p.L == 0:
        return xp.zeros((p.batch, p.dim, p.L), p.io_dtype), final, []
    if packing.groups is None:
        calls = [(p, None)]
    else:
        calls = [(_problem(p, g), g) for g in packing.groups]
    y = xp.empty((p.batch, p.dim, p.L), p.io_dtype) if packing.groups is not None else None
    saved = []
    for pg, g in calls:
        if pick is not None:
            pg = dataclasses.replace(pg, chunk_size=pick(pg))
        yg, fg, ck = backend.selective_scan_forward(pg, save_checkpoints=save_checkpoints, **extra)
        if g is None:
            y = yg
            _put(xp, final, packing.row_slot, fg)
        else:
            scatter(xp, y, yg, g)
            _put(xp, final, g.slot, fg)
        saved.append((pg, ck))
    return y, final, saved


def backward(p, packing, backend, saved, dy, dfinal):
    """The gradients of :func:`forward`'s call (``saved`` its third result) for cotangents
    ``dy`` (batch, dim, L) in ``p.io_dtype`` and ``dfinal`` (n_slots, dim, N) in
    ``p.compute_dtype`` or None; a dict as the backends' ``selective_scan_backward``."""
    xp = p.xp
    names = ("u", "delta", "z", "A", "B", "C", "D", "delta_bias", "initial_state")
    grads = {n: (None if getattr(p, n) is None else xp.zeros_like(getattr(p, n))) for n in names}
    if p.batch * p.dim * p.L:
        groups = [None] if packing.groups is None else packing.groups
        for (pg, ck), g in zip(saved, groups):
            slots = packing.row_slot if g is None else g.slot
            dfg = None
            if dfinal is not None:
                dfg = xp.zeros((pg.batch, p.dim, p.N), p.compute_dtype)
                r = np.flatnonzero(slots >= 0)
                if r.size:
                    dfg[xp.asarray(r)] = dfinal[xp.asarray(slots[r])]
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
    if dfinal is not None and grads["initial_state"] is not None:
        for slot, row in packing.passthrough:
            grads["initial_state"][row] += dfinal[slot]
    return grads
