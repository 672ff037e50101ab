"""Packed sequences in ssmkit.selective_scan (seq_idx, cu_seqlens) against the float64 reference
and against scanning each sequence alone, on every backend."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ssmkit
from ssmkit import _selective_scan_packed as packed
from ssmkit import reference
from helpers import (FORWARD_RTOL, GRAD_RTOL, backends, cast_inputs, check_scan_vjp_against_fd,
                     gpu_available, random_scan_inputs, rel_err, to_numpy, xp_for)

FIELDS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state")
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
# How the sequences run: "in place" is the backend's own choice (the CPU restarts them in
# place always, the GPU where its ring kernels run the call and no final state but the rows'
# is needed); "padded rows" (rows of ordinary scans, the GPU's way elsewhere) is forced on
# every backend, the CPU too.
LAYOUTS = ["in place", "padded rows"]


def close(x, ref, dtype, tol):
    """rel_err(x, ref) <= tol; in float32 against at least 1e-2 per entry (the inputs are of
    order 1): a result that is small through cancellation or decay, such as one sequence's
    d delta_bias or a decayed final state, is exact only to float32 of its terms."""
    x = to_numpy(x).astype(np.float64)
    ref = np.asarray(ref, np.float64)
    assert x.shape == ref.shape and np.all(np.isfinite(x))
    floor = 1e-2 * np.sqrt(ref.size) if dtype == "float32" else 0.0
    return np.linalg.norm(x - ref) <= tol * max(np.linalg.norm(ref), floor, 1e-300)


def _backend_module(backend):
    if backend == "gpu":
        from ssmkit._gpu import selective_scan as module
    else:
        from ssmkit._cpu import selective_scan as module
    return module


@contextlib.contextmanager
def layout(backend, name):
    with pytest.MonkeyPatch.context() as mp:
        if name == "padded rows":
            mp.setattr(_backend_module(backend), "restarts_in_place",
                       lambda *args, **kwargs: False)
        yield


@st.composite
def packed_cases(draw, max_L=70):
    """A scan's shapes and options with its sequences: ("seq_idx", labels (batch, L)) or
    ("cu_seqlens", offsets) for one row, a chunk size and a seed."""
    cu_mode = draw(st.booleans())
    L = draw(st.one_of(st.sampled_from([1, 2, 3, 8, 9, 17, 33]), st.integers(1, max_L)))
    G = draw(st.sampled_from([1, 2]))
    case = dict(batch=1 if cu_mode else draw(st.integers(1, 3)), dim=G * draw(st.integers(1, 2)),
                L=L, N=draw(st.sampled_from([1, 3, 4, 16])),
                b_form=draw(st.sampled_from(["const", "step", "group"])),
                c_form=draw(st.sampled_from(["const", "step", "group"])), groups=G,
                with_D=draw(st.booleans()), with_z=draw(st.booleans()),
                with_bias=draw(st.booleans()), softplus=draw(st.booleans()),
                with_init=draw(st.booleans()))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    restart = draw(st.sampled_from([0.0, 0.05, 0.2, 0.5, 1.0]))
    if cu_mode:
        # offsets with repeats (empty sequences), at 0 and at L too
        inner = np.sort(rng.integers(0, L + 1, draw(st.integers(0, 6))))
        seqs = ("cu_seqlens", np.concatenate(([0], inner, [L])).astype(np.int32))
    else:
        flips = rng.random((case["batch"], L)) < restart
        flips[:, 0] = False
        start = rng.integers(-3, 4, (case["batch"], 1))  # any int labels
        seqs = ("seq_idx", (start + np.cumsum(flips, axis=1)).astype(np.int64))
    return case, seqs, draw(st.sampled_from([None, 1, 3, 4, 16])), seed


def _scan_with(backend, dtype, case, seqs, chunk, seed):
    """(y, final, grads) of ssmkit and of the reference for one packed problem."""
    rng = np.random.default_rng(seed)
    xp = xp_for(backend)
    inputs, exact = cast_inputs(random_scan_inputs(rng, **case), dtype, xp)
    kw = dict(delta_softplus=case.get("softplus", True), return_final_state=True)
    name, value = seqs
    (y, final), pullback = ssmkit.selective_scan_vjp(**inputs, **kw, chunk_size=chunk,
                                                     **{name: xp.asarray(value)})
    (y_ref, final_ref), pullback_ref = reference.selective_scan_vjp(**exact, **kw,
                                                                    **{name: value})
    # without a pullback (the CPU restarts in place, the GPU runs the packed calls)
    y_plain, final_plain = ssmkit.selective_scan(**inputs, **kw, chunk_size=chunk,
                                                 **{name: xp.asarray(value)})
    assert close(y_plain, y_ref, dtype, FORWARD_RTOL[dtype])
    assert close(final_plain, final_ref, dtype, FORWARD_RTOL[dtype])
    dy64 = rng.standard_normal(y_ref.shape)
    dfinal64 = rng.standard_normal(final_ref.shape)
    dy = cast_inputs({"u": dy64}, dtype, xp)[0]["u"]
    grads = pullback(dy, xp.asarray(dfinal64.astype(final.dtype)))
    cotangents = (to_numpy(dy).astype(np.float64), dfinal64)
    grads_ref = pullback_ref(*cotangents)

    def spread(field, u=2.0**-24, trials=3):
        """The largest relative change of the float64 reference's gradient ``field`` when u,
        delta, B and C each move by one rounding ``u`` (random signs, fixed seed). A sum
        over every step whose terms cancel many-fold (d delta_bias, dD, dA) moves that much
        under the roundings a float32 computation makes, so it cannot be expected closer:
        one of 3 rows x 57 steps, -6.8e-4 from much larger terms, came out 1.8% off."""
        prng, worst = np.random.default_rng(12345), 0.0
        base = np.asarray(getattr(grads_ref, field), np.float64)
        for _ in range(trials):
            moved = {n: (v * (1 + u * prng.choice([-1.0, 1.0], np.shape(v)))
                         if n in ("u", "delta", "B", "C") else v) for n, v in exact.items()}
            _, pull = reference.selective_scan_vjp(**moved, **kw, **{name: value})
            g = np.asarray(getattr(pull(*cotangents), field), np.float64)
            worst = max(worst, np.linalg.norm(g - base) / max(np.linalg.norm(base), 1e-300))
        return worst

    return inputs, (y, final, grads), (y_ref, final_ref, grads_ref), spread


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("how", LAYOUTS)
@settings(max_examples=100, **SETTINGS)
@given(args=packed_cases())
def test_packed_matches_reference(backend, dtype, how, args):
    with layout(backend, how):
        inputs, (y, final, grads), (y_ref, final_ref, grads_ref), spread = _scan_with(
            backend, dtype, *args)
    assert y.dtype == inputs["u"].dtype and type(y) is type(inputs["u"])
    assert final.shape == final_ref.shape
    assert close(y, y_ref, dtype, FORWARD_RTOL[dtype])
    assert close(final, final_ref, dtype, FORWARD_RTOL[dtype])
    for name in FIELDS:
        g, g_ref = getattr(grads, name), getattr(grads_ref, name)
        if inputs[name] is None:
            assert g is None, name
            continue
        assert g.shape == inputs[name].shape and g.dtype == inputs[name].dtype, name
        # (float32: or within 4 times what one rounding of the inputs moves the reference)
        assert close(g, g_ref, dtype, GRAD_RTOL[dtype]) or (
            dtype == "float32" and close(g, g_ref, dtype, 4 * spread(name))), name


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("how", LAYOUTS)
@settings(max_examples=60, **SETTINGS)
@given(args=packed_cases(max_L=50))
def test_packed_equals_each_sequence_alone(backend, how, args):
    """Every sequence of a packed call gives the outputs and final state of its own call (the
    row's first from the row's initial state, the others from zeros)."""
    case, (name, value), chunk, seed = args
    rng = np.random.default_rng(seed)
    xp = xp_for(backend)
    inputs, _ = cast_inputs(random_scan_inputs(rng, **case), "float64", xp)
    kw = dict(delta_softplus=case["softplus"], return_final_state=True, chunk_size=chunk)
    with layout(backend, how):
        y, final = ssmkit.selective_scan(**inputs, **kw, **{name: xp.asarray(value)})
    y, final = to_numpy(y), to_numpy(final)
    L = case["L"]
    if name == "cu_seqlens":
        bounds = [(0, int(a), int(b), i) for i, (a, b) in enumerate(zip(value[:-1], value[1:]))]
    else:
        bounds = []
        for row in range(case["batch"]):
            cuts = [0] + [t for t in range(1, L) if value[row, t] != value[row, t - 1]] + [L]
            bounds += [(row, a, b, row if b == L else -1) for a, b in zip(cuts[:-1], cuts[1:])]
    for row, a, b, slot in bounds:
        one = {}
        for key, x in inputs.items():
            if x is None or key in ("A", "D", "delta_bias") or (key in "BC" and x.ndim == 2):
                one[key] = x
            elif key == "initial_state":
                one[key] = x[row:row + 1] if a == 0 else xp.zeros_like(x[row:row + 1])
            else:
                one[key] = x[row:row + 1, ..., a:b]
        y1, h1 = ssmkit.selective_scan(**one, **kw)
        np.testing.assert_allclose(y[row:row + 1, :, a:b], to_numpy(y1), rtol=1e-10, atol=1e-12)
        if slot >= 0:
            np.testing.assert_allclose(final[slot], to_numpy(h1)[0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("how", LAYOUTS)
@settings(max_examples=40, **SETTINGS)
@given(args=packed_cases(max_L=30))
def test_packed_vjp_matches_finite_differences(backend, how, args):
    """<pullback(dy, dh), v> equals the directional derivative of <y, dy> + <h, dh>."""
    case, (name, value), chunk, seed = args
    xp = xp_for(backend)
    with layout(backend, how):
        check_scan_vjp_against_fd(xp, case, chunk, seed, FIELDS, fast={name: xp.asarray(value)},
                                  ref={name: value})


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("how", LAYOUTS)
def test_empty_sequences_and_lengths_past_a_chunk(backend, how):
    """Empty sequences (at offset 0 they end in the initial state, elsewhere in zeros),
    sequences of 1 step, and ones just past the chunk size, against the reference."""
    case = dict(batch=1, dim=3, L=40, N=4, b_form="group", c_form="step", groups=3,
                with_init=True)
    for cu in ([0, 0, 1, 1, 18, 40, 40], [0, 40], [0, 0, 0, 40], [0, 17, 17, 18, 40]):
        for dtype in ("float64", "float32"):
            seqs = ("cu_seqlens", np.array(cu))
            with layout(backend, how):
                inputs, (y, final, grads), (y_ref, final_ref, grads_ref), _ = _scan_with(
                    backend, dtype, case, seqs, 16, len(cu))
            assert close(y, y_ref, dtype, FORWARD_RTOL[dtype])
            assert close(final, final_ref, dtype, FORWARD_RTOL[dtype])
            for name in FIELDS:
                assert close(getattr(grads, name), getattr(grads_ref, name), dtype,
                             GRAD_RTOL[dtype]), name
    # a sequence without steps at offset 0 ends in the initial state, and passes its cotangent
    xp = xp_for(backend)
    inputs, _ = cast_inputs(random_scan_inputs(np.random.default_rng(3), **case), "float64", xp)
    (y, final), pullback = ssmkit.selective_scan_vjp(**inputs, return_final_state=True,
                                                     cu_seqlens=xp.asarray([0, 0, 40]))
    np.testing.assert_array_equal(to_numpy(final[0]), to_numpy(inputs["initial_state"][0]))
    dfinal = xp.zeros_like(final)
    dfinal[0] = 1.0
    grads = pullback(None, dfinal)
    np.testing.assert_array_equal(to_numpy(grads.initial_state), np.ones((1, 3, 4)))


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("vjp", [False, True])
def test_no_final_states_built_unless_asked(backend, vjp, monkeypatch):
    """Without return_final_state the backend is asked for no final state (one per sequence
    of cu_seqlens can outweigh y) and returns none; y is the same, bit for bit."""
    xp = xp_for(backend)
    rng = np.random.default_rng(11)
    case = dict(batch=1, dim=2, L=40, N=4, b_form="step", c_form="step", groups=1,
                with_D=True, with_z=True, with_bias=True, softplus=True, with_init=True)
    inputs, _ = cast_inputs(random_scan_inputs(rng, **case), "float32", xp)
    cu = xp.asarray(np.array([0, 7, 7, 23, 40]))
    module = _backend_module(backend)
    real, in_place = module.selective_scan_forward, []

    def spy(p, **kwargs):  # (the padded rows' calls report their rows' states: small)
        out = real(p, **kwargs)
        if "sequences" in kwargs:
            in_place.append((kwargs["final_states"], out[1]))
        return out

    monkeypatch.setattr(module, "selective_scan_forward", spy)
    call = ssmkit.selective_scan_vjp if vjp else ssmkit.selective_scan
    out = call(**inputs, delta_softplus=True, cu_seqlens=cu)
    y = out[0] if vjp else out
    assert all(not asked and final is None for asked, final in in_place)
    assert in_place or backend == "gpu"  # (the CPU runs them in place always)
    out_kept = call(**inputs, delta_softplus=True, cu_seqlens=cu, return_final_state=True)
    y_kept, final = out_kept[0] if vjp else out_kept
    assert final.shape == (4, 2, 4)
    np.testing.assert_array_equal(to_numpy(y), to_numpy(y_kept))


@pytest.mark.parametrize("backend", backends())
def test_empty_problem_with_packed_sequences(backend):
    xp = xp_for(backend)
    h0 = xp.ones((1, 2, 3))
    args = (xp.zeros((1, 2, 0)), xp.zeros((1, 2, 0)), -xp.ones((2, 3)), xp.zeros((2, 3)),
            xp.zeros((2, 3)))
    (y, final), pullback = ssmkit.selective_scan_vjp(*args, initial_state=h0,
                                                     return_final_state=True,
                                                     cu_seqlens=xp.asarray([0, 0, 0]))
    assert y.shape == (1, 2, 0) and final.shape == (2, 2, 3)
    np.testing.assert_array_equal(to_numpy(final), np.ones((2, 2, 3)))
    grads = pullback(None, xp.full((2, 2, 3), 0.5))
    np.testing.assert_array_equal(to_numpy(grads.initial_state), np.ones((1, 2, 3)))


@settings(max_examples=60, **SETTINGS)
@given(lengths=st.lists(st.integers(0, 300), min_size=1, max_size=30),
       init=st.booleans())
def test_packing_covers_every_step_once_within_twice_the_work(lengths, init):
    """Each step is in exactly one padded row, each row holds one sequence in order, the
    padded steps are at most the steps plus each row's rounding doubled, and the calls few."""
    cu = np.concatenate(([0], np.cumsum(lengths)))
    L = int(cu[-1])
    if L == 0:
        return
    labels = np.searchsorted(cu[1:], np.arange(L), side="right")[None]
    plan = packed.plan(labels, cu, 1, L, init, align=8)
    nonempty = [i for i, n in enumerate(lengths) if n]
    if plan.groups is None:
        assert len(nonempty) == 1 and plan.row_slot[0] == nonempty[0]
        return
    seen = np.zeros(L, int)
    padded = 0
    for g in plan.groups:
        padded += g.src.size
        for r in range(g.rows.size):
            steps = g.src[r][g.src[r] >= 0]
            seen[steps] += 1
            i = int(g.slot[r])
            np.testing.assert_array_equal(steps, np.arange(cu[i], cu[i + 1]))
            at = np.flatnonzero(g.src[r] >= 0)
            # from the initial state: at the row's start; else at its end
            assert at[0] == 0 if g.init[r] else at[-1] == g.src.shape[1] - 1
            assert g.init[r] == (init and cu[i] == 0)
    np.testing.assert_array_equal(seen, 1)
    assert padded <= 2 * (L + 8 * sum(g.rows.size for g in plan.groups))
    assert len(plan.groups) <= int(np.log2(max(lengths))) + 3


@settings(max_examples=60, **SETTINGS)
@given(lengths=st.lists(st.integers(0, 40), min_size=1, max_size=20))
def test_plans_from_labels_and_from_cu_seqlens_agree(lengths):
    """cu_seqlens' plan (read from the offsets) has the segments of the same sequences given
    as labels (seq_idx's plan, a search over the steps), each in its sequence's slot."""
    cu = np.concatenate(([0], np.cumsum(lengths)))
    L = int(cu[-1])
    if L == 0:
        return
    labels = np.searchsorted(cu[1:], np.arange(L), side="right")[None]
    by_cu, by_labels = packed.plan(None, cu, 1, L, False), packed.plan(labels, None, 1, L, False)
    for a, b in zip(packed.segment_starts(by_cu, 1) + by_cu.segments[:2],
                    packed.segment_starts(by_labels, 1) + by_labels.segments[:2]):
        np.testing.assert_array_equal(a, b)
    _, end, slot = by_cu.segments
    np.testing.assert_array_equal(cu[slot + 1], end)  # each segment ends its sequence
    assert by_cu.restarts == by_labels.restarts == (slot.size > 1)


@pytest.mark.parametrize("backend", backends())
def test_packed_sequence_errors(backend):
    xp = xp_for(backend)
    rng = np.random.default_rng(0)
    inputs, _ = cast_inputs(random_scan_inputs(rng, batch=2, dim=2, L=6, N=2), "float32", xp)
    one = {k: (None if v is None else v[:1] if k in ("u", "delta", "z", "initial_state")
               or (k in "BC" and v.ndim > 2) else v) for k, v in inputs.items()}
    fn = ssmkit.selective_scan
    with pytest.raises(TypeError, match="seq_idx must hold integers"):
        fn(**inputs, seq_idx=xp.zeros((2, 6), xp.float32))
    with pytest.raises(ValueError, match=r"seq_idx must have shape \(batch, L\) = \(2, 6\)"):
        fn(**inputs, seq_idx=xp.zeros((2, 5), xp.int32))
    with pytest.raises(ValueError, match="seq_idx must be non-decreasing"):
        fn(**inputs, seq_idx=xp.asarray([[0, 0, 1, 0, 1, 1]] * 2))
    with pytest.raises(ValueError, match="cu_seqlens packs sequences into one row"):
        fn(**inputs, cu_seqlens=xp.asarray([0, 6]))
    for bad in ([0, 7], [1, 6], [0, 4, 3, 6], [6]):
        with pytest.raises(ValueError, match="cu_seqlens must have at least 2 entries"):
            fn(**one, cu_seqlens=xp.asarray(bad))
    with pytest.raises(TypeError, match="cu_seqlens must hold integers"):
        fn(**one, cu_seqlens=xp.asarray([0.0, 6.0]))
    with pytest.raises(ValueError, match="seq_idx must change exactly where"):
        fn(**one, cu_seqlens=xp.asarray([0, 3, 6]), seq_idx=xp.asarray([[0, 0, 1, 1, 1, 1]]))
    (_, final), pullback = ssmkit.selective_scan_vjp(**one, return_final_state=True,
                                                     cu_seqlens=xp.asarray([0, 2, 6]))
    assert final.shape == (2, 2, 2)
    with pytest.raises(ValueError, match=r"dfinal_state must have shape \(num_final_states"):
        pullback(None, xp.zeros((1, 2, 2), xp.float32))


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("N", [16, 64])
@pytest.mark.parametrize("form", ["seq_idx", "cu_seqlens"])
@pytest.mark.parametrize("chunk", [None, 16])
def test_restarts_in_place_on_gpu(dtype, N, form, chunk):
    """Shapes the GPU's ring kernels run, so that packed sequences restart in place there
    (checked: the in-place test answers True for both calls), against the reference: the
    forward, the rows' final states and every gradient. cu_seqlens without final states
    (with them each sequence's would be needed: padded rows). N 16 at L 16384: time split
    in segments (forward and backward); N 64: the backward by slices of 32 states (allowed
    on a small grid here, so that the float64 reference stays quick)."""
    pytest.importorskip("ml_dtypes")
    from ssmkit._gpu import selective_scan as gpu

    answers = []

    def spy(*args, **kwargs):
        answers.append(test(*args, **kwargs))
        return answers[-1]

    test = gpu.restarts_in_place
    batch = 1 if form == "cu_seqlens" else 2
    dim, L = (64, 16384) if N == 16 else (64, 2048)
    rng = np.random.default_rng(N + len(form))
    case = dict(batch=batch, dim=dim, L=L, N=N, b_form="step", c_form="step", with_init=True,
                softplus=True)
    inputs, exact = cast_inputs(random_scan_inputs(rng, **case), dtype, xp_for("gpu"))
    if form == "cu_seqlens":
        value = np.concatenate(([0], np.sort(rng.integers(0, L + 1, 40)), [L]))
    else:
        value = np.cumsum(rng.random((batch, L)) < 0.01, axis=1)
    final = form == "seq_idx"
    kw = dict(delta_softplus=True, return_final_state=final)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gpu, "restarts_in_place", spy)
        mp.setitem(gpu.TUNING, "bwd_state_slices_min_warps", 0)
        out, pullback = ssmkit.selective_scan_vjp(**inputs, **kw, chunk_size=chunk,
                                                  **{form: xp_for("gpu").asarray(value)})
        dy64 = rng.standard_normal((batch, dim, L))
        dy = cast_inputs({"u": dy64}, dtype, xp_for("gpu"))[0]["u"]
        grads = pullback(dy)
    assert answers == [True], answers
    out_ref, pullback_ref = reference.selective_scan_vjp(**exact, **kw, **{form: value})
    y, y_ref = (out[0], out_ref[0]) if final else (out, out_ref)
    assert rel_err(y, y_ref) <= FORWARD_RTOL[dtype]
    if final:
        assert rel_err(out[1], out_ref[1]) <= FORWARD_RTOL[dtype]
    grads_ref = pullback_ref(to_numpy(dy).astype(np.float64))
    for name in FIELDS:
        assert rel_err(getattr(grads, name), getattr(grads_ref, name)) <= GRAD_RTOL[dtype], name


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("chunk", [None, 16])
def test_every_sequences_final_state_in_place_on_gpu(dtype, chunk):
    """cu_seqlens with every sequence's final state: the forward restarts in place (checked)
    and the states of sequences that end inside the row come from the checkpoints
    (ssm_sequence_states), against the reference; sequences of 1 step, at chunk ends and
    across them, and an empty one."""
    pytest.importorskip("ml_dtypes")
    from ssmkit._gpu import selective_scan as gpu

    answers = []
    test = gpu.restarts_in_place

    def spy(*args, **kwargs):
        answers.append(test(*args, **kwargs))
        return answers[-1]

    L = 4096
    rng = np.random.default_rng(5)
    case = dict(batch=1, dim=64, L=L, N=16, b_form="step", c_form="step", with_init=True,
                softplus=True)
    inputs, exact = cast_inputs(random_scan_inputs(rng, **case), dtype, xp_for("gpu"))
    cu = np.unique(np.concatenate(([0, 1, 16, 17, 32, 33, 33, 1000], rng.integers(0, L, 30),
                                   [L])))
    cu = np.insert(cu, 5, cu[5])  # an empty sequence
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gpu, "restarts_in_place", spy)
        y, final = ssmkit.selective_scan(**inputs, delta_softplus=True, return_final_state=True,
                                         chunk_size=chunk, cu_seqlens=xp_for("gpu").asarray(cu))
    assert answers == [True], answers
    y_ref, final_ref = reference.selective_scan(**exact, delta_softplus=True,
                                                return_final_state=True, cu_seqlens=cu)
    assert rel_err(y, y_ref) <= FORWARD_RTOL[dtype]
    assert rel_err(final, final_ref) <= FORWARD_RTOL[dtype]


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_packed_half_precision_on_gpu(dtype):
    """16-bit packed calls through the GPU's fastest kernels (N 16, lengths past a tile)."""
    pytest.importorskip("ml_dtypes")
    case = dict(batch=1, dim=64, L=700, N=16, b_form="step", c_form="step", with_init=True,
                softplus=True)
    seqs = ("cu_seqlens", np.array([0, 5, 300, 301, 640, 700]))
    inputs, (y, final, grads), (y_ref, final_ref, grads_ref), _ = _scan_with(
        "gpu", dtype, case, seqs, None, 11)
    assert rel_err(y, y_ref) <= FORWARD_RTOL[dtype]
    assert rel_err(final, final_ref) <= FORWARD_RTOL[dtype]
    for name in FIELDS:
        assert rel_err(getattr(grads, name), getattr(grads_ref, name)) <= GRAD_RTOL[dtype], name
