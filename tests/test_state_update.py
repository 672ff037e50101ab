"""ssmkit.state_update (the recurrent step) against the float64 reference, on every backend.

Also: the NVRTC compile check of cuda_src/state_update.cu (no GPU needed) and
its launch planner.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ssmkit
from ssmkit import _nvrtc_check, reference
from ssmkit._gpu import compiler
from ssmkit._gpu import state_update as gsu
from helpers import FORWARD_RTOL, as_dtype, backends, gpu_available, rel_err, to_numpy, xp_for

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                      HealthCheck.function_scoped_fixture])
FULL_NVRTC = os.environ.get("SSMKIT_NVRTC_FULL") == "1"


# --------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------

def make_case(rng, *, layout, batch, H, P, N, G, T=None, pool=None, with_D=True, with_z=True,
              with_bias=True, softplus=True, bcast=False, d_per_channel=False):
    """Fresh float64 inputs in the user's shapes, as ``{name: (base, shape)}``.

    ``base`` is the array to convert; when ``shape`` is not None the argument is
    ``broadcast_to(base, shape)`` (a zero-stride view, as Mamba-2 users pass A,
    dt, D and dt_bias). Mamba-1 (``layout=1``) uses ``dim = H * P`` channels.
    ``d_per_channel``: with ``bcast``, D still per channel (H, P).
    """
    pool = batch if pool is None else pool
    tok = () if T is None else (T,)
    if layout == 2:
        chan, state_shape = (H, P), (pool, H, P, N)
        act = (batch,) + tok + (H, P)
        bc = (batch,) + tok + (G, N)
        if bcast:  # per head, broadcast over P (and N)
            dt = (rng.standard_normal((batch,) + tok + (H, 1)) * 0.5 - 1.0, act)
            A = (-np.exp(rng.standard_normal((H, 1, 1)) * 0.5), (H, P, N))
            D = (rng.standard_normal(chan), None) if d_per_channel else (
                rng.standard_normal((H, 1)), chan)
            bias = (rng.standard_normal((H, 1)) * 0.1, chan)
        else:
            dt = (rng.standard_normal(act) * 0.5 - 1.0, None)
            A = (-np.exp(rng.standard_normal((H, P, N)) * 0.5), None)
            D = (rng.standard_normal(chan), None)
            bias = (rng.standard_normal(chan) * 0.1, None)
    else:
        dim = H * P
        state_shape = (pool, dim, N)
        act = (batch, dim) + tok
        bc = (batch,) + ((G,) if G > 1 else ()) + (N,) + tok
        dt = (rng.standard_normal(act) * 0.5 - 1.0, None)
        A = (-np.exp(rng.standard_normal((dim, N)) * 0.5), None)
        D = (rng.standard_normal(dim), None)
        bias = (rng.standard_normal(dim) * 0.1, None)
    if not softplus:  # positive step sizes without the softplus
        dt = (np.abs(dt[0]) * 0.2 + 0.01, dt[1])
    return dict(
        state=(rng.standard_normal(state_shape), None),
        x=(rng.standard_normal(act), None),
        dt=dt, A=A,
        B=(rng.standard_normal(bc), None),
        C=(rng.standard_normal(bc), None),
        D=D if with_D else None,
        z=(rng.standard_normal(act), None) if with_z else None,
        dt_bias=bias if with_bias else None,
    )


def convert(case, xp, *, state_dtype, io_dtype, param_dtype=None):
    """Arrays for the call (xp, the dtypes asked for) and the float64 values they hold."""
    param_dtype = param_dtype or ("float64" if io_dtype == "float64" else "float32")
    args, exact = {}, {}
    for name, item in case.items():
        if item is None:
            args[name] = exact[name] = None
            continue
        base, shape = item
        dtype = (state_dtype if name == "state" else
                 param_dtype if name in ("A", "D", "dt_bias") else io_dtype)
        low = as_dtype(base, dtype)
        held = low.astype(np.float64)
        arr = low if xp is np else xp.asarray(low)
        if shape is not None:
            arr, held = xp.broadcast_to(arr, shape), np.broadcast_to(held, shape)
        args[name], exact[name] = arr, held
    if xp is np:  # the state must be a writeable array of its own
        args["state"] = np.array(args["state"])
    return args, exact


def state_rtol(state_dtype, io_dtype):
    return max(FORWARD_RTOL[state_dtype], FORWARD_RTOL[io_dtype])


# --------------------------------------------------------------------------------------
# Against the reference
# --------------------------------------------------------------------------------------

@st.composite
def step_cases(draw):
    layout = draw(st.sampled_from([1, 2]))
    H = draw(st.integers(1, 4))
    P = draw(st.sampled_from([1, 2, 3, 5, 8]))
    channels = H if layout == 2 else H * P
    G = draw(st.sampled_from([g for g in (1, 2, 3, 4) if channels % g == 0]))
    return dict(
        layout=layout, batch=draw(st.integers(1, 3)), H=H, P=P,
        N=draw(st.sampled_from([1, 2, 3, 4, 5, 7, 8, 16, 17, 33])), G=G,
        T=draw(st.sampled_from([None, None, 1, 2, 5])),
        with_D=draw(st.booleans()), with_z=draw(st.booleans()),
        with_bias=draw(st.booleans()), softplus=draw(st.booleans()),
        bcast=layout == 2 and draw(st.booleans()),
    ), draw(st.booleans()), draw(st.integers(0, 2**32 - 1))


def _check_against_reference(backend, case_kw, use_indices, seed, state_dtype, io_dtype):
    rng = np.random.default_rng(seed)
    xp = xp_for(backend)
    batch = case_kw["batch"]
    pool = batch + 3 if use_indices else None
    case = make_case(rng, pool=pool, **case_kw)
    args, exact = convert(case, xp, state_dtype=state_dtype, io_dtype=io_dtype)
    kw = {}
    if use_indices:
        rows = rng.permutation(pool)[:batch]
        rows[rng.random(batch) < 0.3] = -1  # some padding rows
        kw["state_batch_indices"] = xp.asarray(rows)
    softplus = case_kw.get("softplus", True)
    state = args.pop("state")
    before = to_numpy(state).copy()
    y = ssmkit.state_update(state, **args, dt_softplus=softplus, **kw)
    rows = to_numpy(kw["state_batch_indices"]) if use_indices else None
    y_ref, state_ref = reference.state_update(**exact, dt_softplus=softplus,
                                              state_batch_indices=rows)
    assert type(y).__module__.split(".")[0] == xp.__name__
    assert y.shape == y_ref.shape and y.dtype == args["x"].dtype
    tol = state_rtol(state_dtype, io_dtype)
    err_y = rel_err(y, y_ref)
    if err_y > tol:
        # y much smaller than the terms it sums (a short contraction that cancels, e.g. N = 2):
        # rounding errors are relative to the terms, C s and D x (times the gate)
        terms = np.linalg.norm(exact["C"]) * np.linalg.norm(state_ref)
        if exact.get("D") is not None:
            terms += np.abs(exact["D"]).max() * np.linalg.norm(exact["x"])
        if exact.get("z") is not None:
            terms *= max(1.0, np.abs(exact["z"]).max())
        err_y = np.linalg.norm(to_numpy(y).astype(np.float64) - y_ref) / terms
    assert err_y <= tol
    assert rel_err(state, state_ref) <= tol
    if use_indices:  # rows no index names are untouched, bit for bit
        untouched = np.setdiff1d(np.arange(pool), rows[rows >= 0])
        assert np.array_equal(to_numpy(state)[untouched].view(np.uint8),
                              before[untouched].view(np.uint8))
        assert np.all(to_numpy(y)[rows < 0].astype(np.float64) == 0)


@pytest.mark.parametrize("backend", backends())
@settings(max_examples=40, **SETTINGS)
@given(args=step_cases())
def test_against_reference_float64(backend, args):
    case_kw, use_indices, seed = args
    _check_against_reference(backend, case_kw, use_indices, seed, "float64", "float64")


@pytest.mark.parametrize("backend", backends())
@settings(max_examples=25, **SETTINGS)
@given(args=step_cases(), dtypes=st.sampled_from([("float32", "float32"), ("float32", "bfloat16"),
                                                   ("float32", "float16"), ("bfloat16", "bfloat16"),
                                                   ("float16", "float32"), ("float64", "float32")]))
def test_against_reference_low_precision(backend, args, dtypes):
    case_kw, use_indices, seed = args
    _check_against_reference(backend, case_kw, use_indices, seed, *dtypes)


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("layout", [1, 2])
@pytest.mark.parametrize("N", [16, 128])
def test_model_shapes(backend, layout, N):
    # Sizes of real models (several lanes per channel, full vectors), float32 state, bf16 input.
    H, P = (4, 64) if layout == 2 else (1, 96)
    _check_against_reference(backend, dict(layout=layout, batch=2, H=H, P=P, N=N, G=1,
                                           bcast=layout == 2), True, 7, "float32", "bfloat16")
    if layout == 2:  # per-head A, dt, dt_bias with D per channel
        _check_against_reference(backend, dict(layout=2, batch=2, H=H, P=P, N=N, G=1, bcast=True,
                                               d_per_channel=True), True, 8, "float32",
                                 "bfloat16")


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("layout", [1, 2])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_tokens_equal_single_steps(backend, layout, dtype):
    rng = np.random.default_rng(3)
    xp = xp_for(backend)
    T = 4
    case = make_case(rng, layout=layout, batch=2, H=2, P=3, N=5, G=2, T=T, bcast=layout == 2)
    args, _ = convert(case, xp, state_dtype=dtype, io_dtype=dtype)
    state = args.pop("state")
    s1 = state.copy()
    y_all = ssmkit.state_update(s1, **args, dt_softplus=True)
    s2 = state.copy()
    ys = []
    for t in range(T):
        def tok(a, name):
            if a is None or name in ("A", "D", "dt_bias"):
                return a
            return a[:, t] if layout == 2 else a[..., t]
        ys.append(ssmkit.state_update(s2, **{k: tok(v, k) for k, v in args.items()},
                                      dt_softplus=True))
    y_steps = xp.stack(ys, axis=1 if layout == 2 else -1)
    tol = 1e-12 if dtype == "float64" else 1e-5
    assert rel_err(y_all, to_numpy(y_steps)) <= tol
    assert rel_err(s1, to_numpy(s2)) <= tol


@pytest.mark.parametrize("backend", backends())
def test_broadcast_views_equal_full_arrays(backend):
    # Mamba-2 users pass A, dt, D, dt_bias as zero-stride views; same numbers as materialised.
    rng = np.random.default_rng(11)
    xp = xp_for(backend)
    case = make_case(rng, layout=2, batch=3, H=4, P=8, N=16, G=2, bcast=True)
    args, _ = convert(case, xp, state_dtype="float32", io_dtype="float32")
    assert args["A"].strides[1:] == (0, 0) and args["dt"].strides[-1] == 0
    full = {k: (None if v is None else xp.ascontiguousarray(v)) for k, v in args.items()}
    s1, s2 = args["state"].copy(), args["state"].copy()
    y1 = ssmkit.state_update(s1, **{k: v for k, v in args.items() if k != "state"},
                             dt_softplus=True)
    y2 = ssmkit.state_update(s2, **{k: v for k, v in full.items() if k != "state"},
                             dt_softplus=True)
    assert rel_err(y1, to_numpy(y2)) <= 1e-6
    assert rel_err(s1, to_numpy(s2)) <= 1e-6


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("layout", [1, 2])
def test_mixed_input_dtypes(backend, layout):
    # x in bfloat16, dt and z in float32, B and C in float16, a bfloat16 A broadcast per head:
    # computed in float32 (the state's), y in x's dtype.
    rng = np.random.default_rng(21)
    xp = xp_for(backend)
    case = make_case(rng, layout=layout, batch=2, H=2, P=8, N=16, G=2, bcast=layout == 2)
    args, exact = convert(case, xp, state_dtype="float32", io_dtype="float32")
    for name, dtype in (("x", "bfloat16"), ("B", "float16"), ("C", "float16"), ("A", "bfloat16")):
        base, shape = case[name]
        low = as_dtype(base, dtype)
        exact[name] = low.astype(np.float64) if shape is None else np.broadcast_to(
            low.astype(np.float64), shape)
        arr = low if xp is np else xp.asarray(low)
        args[name] = arr if shape is None else xp.broadcast_to(arr, shape)
    state = args.pop("state")
    y = ssmkit.state_update(state, **args, dt_softplus=True)
    y_ref, state_ref = reference.state_update(exact.pop("state"), **exact, dt_softplus=True)
    assert y.dtype == args["x"].dtype
    assert rel_err(y, y_ref) <= FORWARD_RTOL["bfloat16"]
    assert rel_err(state, state_ref) <= 1e-5


@pytest.mark.parametrize("backend", backends())
def test_non_contiguous_state_updated_in_place(backend):
    rng = np.random.default_rng(5)
    xp = xp_for(backend)
    case = make_case(rng, layout=2, batch=2, H=3, P=4, N=6, G=1)
    args, exact = convert(case, xp, state_dtype="float64", io_dtype="float64")
    # The state lives inside a bigger buffer: every other row of the pool, N transposed away.
    big = xp.zeros((4, 3, 6, 4), dtype=np.float64)
    state = big[::2].transpose(0, 1, 3, 2)
    state[...] = args.pop("state")
    y = ssmkit.state_update(state, **args, dt_softplus=True)
    y_ref, state_ref = reference.state_update(exact.pop("state"), **exact, dt_softplus=True)
    assert rel_err(y, y_ref) <= 1e-12
    assert rel_err(big[::2].transpose(0, 1, 3, 2), state_ref) <= 1e-12
    assert not to_numpy(big[1::2]).any()  # the rows between were not written


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("layout", [1, 2])
def test_empty_sizes(backend, layout):
    xp = xp_for(backend)
    rng = np.random.default_rng(0)
    for batch, T in ((0, None), (2, 0)):
        case = make_case(rng, layout=layout, batch=batch, H=2, P=2, N=3, G=1, T=T)
        args, _ = convert(case, xp, state_dtype="float32", io_dtype="float32")
        state = args.pop("state")
        before = to_numpy(state).copy()
        y = ssmkit.state_update(state, **args)
        assert y.shape == args["x"].shape
        assert np.array_equal(to_numpy(state), before)


# --------------------------------------------------------------------------------------
# Steps continue a scan
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", backends())
@settings(max_examples=12, **SETTINGS)
@given(L=st.integers(2, 40), split=st.floats(0.0, 1.0), G=st.sampled_from([0, 1, 2]),
       opts=st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans()),
       multi=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_steps_continue_selective_scan(backend, L, split, G, opts, multi, seed):
    with_D, with_z, with_bias, softplus = opts
    rng = np.random.default_rng(seed)
    xp = xp_for(backend)
    batch, dim, N = 2, 4, 5
    k = min(L - 1, max(0, int(split * L)))
    u = rng.standard_normal((batch, dim, L))
    delta = rng.standard_normal((batch, dim, L)) * 0.5 - (1.0 if softplus else -1.5)
    if not softplus:
        delta = np.abs(delta) * 0.1 + 0.01
    A = -np.exp(rng.standard_normal((dim, N)) * 0.5)
    bshape = (batch, N, L) if G == 0 else (batch, G, N, L)
    B, C = rng.standard_normal(bshape), rng.standard_normal(bshape)
    D = rng.standard_normal(dim) if with_D else None
    z = rng.standard_normal((batch, dim, L)) if with_z else None
    bias = rng.standard_normal(dim) * 0.1 if with_bias else None
    g = {n: (None if a is None else xp.asarray(a)) for n, a in
         dict(u=u, delta=delta, A=A, B=B, C=C, D=D, z=z, delta_bias=bias).items()}
    y_whole = ssmkit.selective_scan(**g, delta_softplus=softplus)

    def part(a, sl):
        return None if a is None else a[..., sl]

    pre = {n: (part(a, slice(0, k)) if n in ("u", "delta", "z", "B", "C") else a)
           for n, a in g.items()}
    _, state = ssmkit.selective_scan(**pre, delta_softplus=softplus, return_final_state=True)
    kw = dict(A=g["A"], D=g["D"], dt_bias=g["delta_bias"], dt_softplus=softplus)
    if multi:
        sl = slice(k, L)
        y_rest = ssmkit.state_update(state, part(g["u"], sl), part(g["delta"], sl),
                                     B=part(g["B"], sl), C=part(g["C"], sl),
                                     z=part(g["z"], sl), **kw)
    else:
        ys = [ssmkit.state_update(state, g["u"][..., t], g["delta"][..., t], B=g["B"][..., t],
                                  C=g["C"][..., t], z=part(g["z"], t), **kw)
              for t in range(k, L)]
        y_rest = xp.stack(ys, axis=-1)
    assert rel_err(y_rest, to_numpy(y_whole)[..., k:]) <= 1e-12


def mamba2_scan_f64(x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                    initial_state=None):
    """Mamba-2's recurrence in ssd's layout, written out independently for these tests.

    x, z: (batch, L, H, P); dt: (batch, L, H); A, dt_bias: (H,); D: (H,);
    B, C: (batch, L, G, N). Returns y and the final state (batch, H, P, N).
    """
    batch, L, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    h = np.zeros((batch, H, P, N)) if initial_state is None else initial_state.copy()
    y = np.zeros((batch, L, H, P))
    for t in range(L):
        for hd in range(H):
            g = hd // (H // G)
            d = dt[:, t, hd] + (0.0 if dt_bias is None else dt_bias[hd])
            if dt_softplus:
                d = np.where(d <= 20, np.log1p(np.exp(np.minimum(d, 20))), d)
            decay = np.exp(d * A[hd])[:, None, None]
            inject = (d[:, None] * x[:, t, hd])[:, :, None] * B[:, t, g, None, :]
            h[:, hd] = decay * h[:, hd] + inject
            out = np.einsum("bpn,bn->bp", h[:, hd], C[:, t, g])
            if D is not None:
                out = out + D[hd] * x[:, t, hd]
            if z is not None:
                out = out * z[:, t, hd] / (1 + np.exp(-z[:, t, hd]))
            y[:, t, hd] = out
    return y, h


def _mamba2_sequence(rng, batch, L, H, P, G, N):
    return dict(x=rng.standard_normal((batch, L, H, P)),
                dt=rng.standard_normal((batch, L, H)) * 0.5 - 1.0,
                A=-np.exp(rng.standard_normal(H) * 0.5),
                B=rng.standard_normal((batch, L, G, N)), C=rng.standard_normal((batch, L, G, N)),
                D=rng.standard_normal(H), z=rng.standard_normal((batch, L, H, P)),
                dt_bias=rng.standard_normal(H) * 0.1)


def _mamba2_step_args(xp, seq, sl, P, N):
    """state_update's Mamba-2 arguments for steps ``sl`` of ``seq``, broadcast as users do."""
    H = seq["A"].shape[0]
    dt = xp.asarray(seq["dt"][:, sl])
    return dict(x=xp.asarray(seq["x"][:, sl]), dt=xp.broadcast_to(dt[..., None], dt.shape + (P,)),
                A=xp.broadcast_to(xp.asarray(seq["A"])[:, None, None], (H, P, N)),
                B=xp.asarray(seq["B"][:, sl]), C=xp.asarray(seq["C"][:, sl]),
                D=xp.broadcast_to(xp.asarray(seq["D"])[:, None], (H, P)),
                z=xp.asarray(seq["z"][:, sl]),
                dt_bias=xp.broadcast_to(xp.asarray(seq["dt_bias"])[:, None], (H, P)))


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("L,k", [(1, 0), (6, 0), (9, 4), (12, 11)])
def test_mamba2_steps_continue_sequential_scan(backend, L, k):
    rng = np.random.default_rng(L * 100 + k)
    xp = xp_for(backend)
    batch, H, P, G, N = 2, 4, 3, 2, 8
    seq = _mamba2_sequence(rng, batch, L, H, P, G, N)
    y_ref, final_ref = mamba2_scan_f64(**seq, dt_softplus=True)
    state = xp.zeros((batch, H, P, N))
    y_pre = (ssmkit.state_update(state, **_mamba2_step_args(xp, seq, slice(0, k), P, N),
                                 dt_softplus=True) if k else xp.zeros((batch, 0, H, P)))
    ys = [ssmkit.state_update(state, **{n: (a[:, 0] if n in ("x", "dt", "z", "B", "C") else a)
                                        for n, a in _mamba2_step_args(xp, seq, slice(t, t + 1),
                                                                      P, N).items()},
                              dt_softplus=True) for t in range(k, L)]
    y = np.concatenate([to_numpy(y_pre), np.stack([to_numpy(v) for v in ys], axis=1)], axis=1)
    assert rel_err(y, y_ref) <= 1e-12
    assert rel_err(state, final_ref) <= 1e-12


@pytest.mark.parametrize("backend", backends())
def test_steps_continue_ssd(backend):
    if not hasattr(ssmkit, "ssd"):
        pytest.skip("ssmkit.ssd is not in this checkout")
    rng = np.random.default_rng(2)
    xp = xp_for(backend)
    batch, L, k, H, P, G, N = 2, 11, 6, 4, 3, 2, 8
    seq = _mamba2_sequence(rng, batch, L, H, P, G, N)
    g = {n: xp.asarray(a) for n, a in seq.items()}
    y_whole = ssmkit.ssd(g["x"], g["dt"], g["A"], g["B"], g["C"], chunk_size=4, D=g["D"],
                         z=g["z"], dt_bias=g["dt_bias"], dt_softplus=True)
    _, state = ssmkit.ssd(g["x"][:, :k], g["dt"][:, :k], g["A"], g["B"][:, :k], g["C"][:, :k],
                          chunk_size=4, D=g["D"], z=g["z"][:, :k], dt_bias=g["dt_bias"],
                          dt_softplus=True, return_final_state=True)
    y_rest = ssmkit.state_update(state, **_mamba2_step_args(xp, seq, slice(k, L), P, N),
                                 dt_softplus=True)
    assert rel_err(y_rest, to_numpy(y_whole)[:, k:]) <= 1e-10


# --------------------------------------------------------------------------------------
# state_batch_indices and refusals: the state is untouched, bit for bit
# --------------------------------------------------------------------------------------

def _small_call(xp, layout=2, pool=None, state_dtype="float32"):
    rng = np.random.default_rng(0)
    case = make_case(rng, layout=layout, batch=3, H=2, P=2, N=4, G=1, pool=pool)
    args, _ = convert(case, xp, state_dtype=state_dtype, io_dtype="float32")
    return args.pop("state"), args


def _refused(state, exc, match, **kwargs):
    before = to_numpy(state).copy()
    with pytest.raises(exc, match=match):
        ssmkit.state_update(state, **kwargs)
    assert np.array_equal(to_numpy(state).view(np.uint8), before.view(np.uint8))


@pytest.mark.parametrize("backend", backends())
def test_batch_indices_refusals_leave_state_untouched(backend):
    xp = xp_for(backend)
    state, args = _small_call(xp, pool=5)
    _refused(state, ValueError, r"out of range.*pool of 5",
             state_batch_indices=xp.asarray([0, 5, 1]), **args)
    _refused(state, ValueError, r"holds 2 2 times.*race",
             state_batch_indices=xp.asarray([2, -1, 2]), **args)
    _refused(state, TypeError, r"state_batch_indices must hold integers",
             state_batch_indices=xp.asarray([0.0, 1.0, 2.0]), **args)
    _refused(state, ValueError, r"state_batch_indices must have shape \(batch,\)",
             state_batch_indices=xp.asarray([0, 1]), **args)
    _refused(state, ValueError, r"state has 5 rows but x has batch 3", **args)
    # Repeated padding is fine: only non-negative indices race.
    ssmkit.state_update(state, state_batch_indices=xp.asarray([-1, 4, -1]), **args)


@pytest.mark.parametrize("backend", backends())
def test_bad_arguments_leave_state_untouched(backend):
    xp = xp_for(backend)
    state, args = _small_call(xp)
    bad = [
        (dict(x=args["x"][:, :1]), ValueError, r"x must have shape \(batch, H, P\) with \(H, P\)"),
        (dict(x=args["x"][0]), ValueError, r"x must have shape \(batch, H, P\) \(one token\)"),
        (dict(dt=args["dt"][:, :, :1]), ValueError, r"dt must have shape"),
        (dict(z=args["z"][:2]), ValueError, r"z must have shape"),
        (dict(A=args["A"][:, :, :2]), ValueError, r"A must have shape \(H, P, N\)"),
        (dict(B=xp.zeros((3, 3, 4), np.float32)), ValueError, r"B has G = 3 groups"),
        (dict(B=args["B"][:, :, :3]), ValueError, r"B must have shape"),
        (dict(C=args["C"][:2]), ValueError, r"C must have shape"),
        (dict(D=args["D"][:1]), ValueError, r"D must have shape \(H, P\)"),
        (dict(dt_bias=args["dt_bias"][:, :1]), ValueError, r"dt_bias must have shape"),
        (dict(x=args["x"].astype(np.int32)), TypeError, r"x must hold real floating-point"),
        (dict(A=args["A"].astype(np.complex64)), TypeError, r"A is complex"),
        (dict(dt_softplus=1), TypeError, r"dt_softplus must be a bool"),
        (dict(B=None), TypeError, r"B is required"),
    ]
    for change, exc, match in bad:
        _refused(state, exc, match, **{**args, **change})
    _refused(state[:, :, :, :0], ValueError, r"N >= 1", **args)
    with pytest.raises(ValueError, match=r"state must have shape \(batch, H, P, N\)"):
        ssmkit.state_update(state[0, 0], **args)
    with pytest.raises(TypeError, match=r"arrays must all live on the CPU or all on the GPU"
                       if xp is not np else "state is updated in place"):
        ssmkit.state_update(to_numpy(state).tolist() if xp is np else to_numpy(state), **args)


def test_state_with_partial_element_strides_refused():
    state, args = _small_call(np)
    # N-stride of 6 bytes for 4-byte floats: a view NumPy allows, whose elements overlap.
    raw = np.zeros(4 * state.nbytes, dtype=np.uint8)
    odd = np.ndarray(state.shape, dtype=state.dtype, buffer=raw,
                     strides=state.strides[:3] + (6,))
    with pytest.raises(ValueError, match="not whole elements"):
        ssmkit.state_update(odd, **args)


def test_read_only_state_refused():
    state, args = _small_call(np)
    state.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        ssmkit.state_update(state, **args)


@pytest.mark.parametrize("backend", backends())
def test_mamba1_shapes_refused(backend):
    xp = xp_for(backend)
    state, args = _small_call(xp, layout=1)
    # dim = 4 channels, N = 4; B given per step without groups: (batch, N)
    for change, match in ((dict(x=args["x"][:, :3]),
                           r"x must have shape \(batch, dim\) with dim = 4"),
                          (dict(A=args["A"][:3]), r"A must have shape \(dim, N\)"),
                          (dict(B=xp.zeros((3, 3, 4), np.float32)), r"B has G = 3 groups"),
                          (dict(C=xp.zeros((3, 5), np.float32)), r"C must have shape"),
                          (dict(D=xp.zeros(3, np.float32)), r"D must have shape \(dim,\)")):
        _refused(state, ValueError, match, **{**args, **change})


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")
def test_gpu_refuses_too_large_N():
    import cupy as cp

    N = gsu.MAX_N["float32"] + 1
    state = cp.zeros((1, 1, 1, N), cp.float32)
    x = cp.zeros((1, 1, 1), cp.float32)
    _refused(state, ValueError, r"more than the kernel holds", x=x, dt=x,
             A=cp.zeros((1, 1, N), cp.float32), B=cp.zeros((1, 1, N), cp.float32),
             C=cp.zeros((1, 1, N), cp.float32))


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")
def test_gpu_matches_cpu_bfloat16_state():
    # One 16-bit state on both backends: the same float32 arithmetic, the same rounding.
    rng = np.random.default_rng(9)
    import cupy as cp

    case = make_case(rng, layout=2, batch=4, H=3, P=16, N=64, G=1, bcast=True)
    a_cpu, _ = convert(case, np, state_dtype="bfloat16", io_dtype="bfloat16")
    a_gpu, _ = convert(case, cp, state_dtype="bfloat16", io_dtype="bfloat16")
    s_cpu, s_gpu = a_cpu.pop("state"), a_gpu.pop("state")
    y_cpu = ssmkit.state_update(s_cpu, **a_cpu, dt_softplus=True)
    y_gpu = ssmkit.state_update(s_gpu, **a_gpu, dt_softplus=True)
    assert rel_err(y_gpu, y_cpu.astype(np.float64)) <= 1e-2
    assert rel_err(s_gpu, s_cpu.astype(np.float64)) <= 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("kernel", ["general", "one_pass", "tile", "warp"])
@pytest.mark.parametrize("threads,states", [(128, 64), (256, 64), (128, 16), (64, 32)])
def test_gpu_launch_shapes(monkeypatch, threads, states, kernel):
    # Small test problems plan one channel per thread; force the other block shapes too
    # (several channels per thread, blocks that end inside P, several chunks per lane), in
    # each of the four kernels. The tile kernel takes the per-head cases with contiguous
    # channels (the others fall back to the general kernel); its tiles of 3 or 40 channels
    # end inside P and inside a pass. The warp kernel takes the one-token ones among those
    # whose channels are 4 to 32 vectors (the others fall back again).
    monkeypatch.setitem(gsu.TUNING, "one_pass", gsu.ONE_PASS_ALL if kernel == "one_pass" else ())
    monkeypatch.setitem(gsu.TUNING, "tile", gsu.ONE_PASS_ALL if kernel == "tile" else ())
    monkeypatch.setitem(gsu.TUNING, "warp", gsu.ONE_PASS_ALL if kernel == "warp" else ())
    monkeypatch.setitem(gsu.TUNING, "threads", threads)
    monkeypatch.setitem(gsu.TUNING, "bytes_per_thread", states)
    monkeypatch.setitem(gsu.TUNING, "one_pass_bytes_per_thread", states)
    monkeypatch.setitem(gsu.TUNING, "tile_threads", threads)
    monkeypatch.setitem(gsu.TUNING, "tile_bytes_per_thread", states)
    monkeypatch.setitem(gsu.TUNING, "tile_bytes", 1024 if states < 64 else 40 * 1024)
    if kernel != "general":
        monkeypatch.setitem(gsu.TUNING, "blocks_per_sm", 0)  # no thinning for small problems
    cases = [(dict(layout=2, H=2, P=20, N=128, G=2, bcast=True), "float32", "bfloat16"),
             (dict(layout=2, H=3, P=9, N=16, G=1, T=3), "float32", "float32"),
             (dict(layout=1, H=1, P=70, N=16, G=2), "bfloat16", "bfloat16"),
             (dict(layout=2, H=2, P=5, N=300, G=1, T=2), "float32", "float32"),
             (dict(layout=2, H=2, P=6, N=40, G=2, bcast=True), "float64", "float64"),
             (dict(layout=1, H=1, P=33, N=24, G=1, T=2), "float16", "float32")]
    for i, (case_kw, st_dtype, io_dtype) in enumerate(cases):
        _check_against_reference("gpu", dict(case_kw, batch=3), i % 2 == 0, 100 + i,
                                 st_dtype, io_dtype)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("N,P", [(128, 64), (64, 64), (16, 128), (8, 256), (256, 32)])
@pytest.mark.parametrize("T", [None, 3])
def test_gpu_tile_kernel_whole_tiles(monkeypatch, N, P, T):
    # The tile kernel's path without bound tests: every block's channels are whole passes and
    # every lane holds states (TN from 1 to 32 lanes per channel), with and without z, one
    # token and several, padding rows among the indexed ones.
    monkeypatch.setitem(gsu.TUNING, "blocks_per_sm", 0)  # full tiles even for a small batch
    monkeypatch.setitem(gsu.TUNING, "warp", ())  # one token: the tile kernel, not the warp one
    for dtype in ("bfloat16", "float16"):
        plan = gsu.plan_launch(batch=5, H=2, P=P, N=N, state=dtype, tile=True)
        assert plan["rows_per_block"] % (plan["threads"] // plan["tn"] * plan["ppt"]) == 0
        assert plan["tn"] * plan["ch"] * 8 == N  # whole lanes
        for i, with_z in enumerate((True, False)):
            _check_against_reference("gpu", dict(layout=2, batch=5, H=2, P=P, N=N, G=1, T=T,
                                                 bcast=True, with_z=with_z),
                                     i == 0, 300 + N + i, dtype, dtype)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("N", [32, 64, 128, 256])
@pytest.mark.parametrize("P", [1, 7, 16, 64, 100])
def test_gpu_warp_kernel(monkeypatch, N, P):
    # The warp kernel (one token; 4, 8, 16 or 32 vectors per 16-bit channel row): runs that
    # end inside P, inside a chunk and past whole blocks, with and without z, padding rows
    # among the indexed ones, against the reference and against the tile kernel.
    import cupy as cp

    for dtype in ("bfloat16", "float16"):
        plan = gsu.plan_launch(batch=5, H=2, P=P, N=N, state=dtype, warp=True)
        assert plan["tn"] * 8 == N and plan["threads"] == gsu.WARP_THREADS
        assert plan["rows_per_block"] * plan["npb"] >= P
        for i, with_z in enumerate((True, False)):
            _check_against_reference("gpu", dict(layout=2, batch=5, H=2, P=P, N=N, G=1,
                                                 bcast=True, with_z=with_z),
                                     i == 0, 400 + N + P + i, dtype, dtype)
        # without D and dt_bias, without the softplus; D per channel
        _check_against_reference("gpu", dict(layout=2, batch=5, H=2, P=P, N=N, G=1, bcast=True,
                                             with_D=False, with_bias=False, softplus=False),
                                 False, 500 + N + P, dtype, dtype)
        _check_against_reference("gpu", dict(layout=2, batch=5, H=2, P=P, N=N, G=1, bcast=True,
                                             d_per_channel=True),
                                 True, 600 + N + P, dtype, dtype)
    # the same step by both kernels: the same values, but for a rounding here and there
    case = make_case(np.random.default_rng(N + P), pool=None, layout=2, batch=4, H=3, P=P, N=N,
                     G=1, bcast=True, with_z=True)
    args, _ = convert(case, cp, state_dtype="bfloat16", io_dtype="bfloat16")
    state0 = args.pop("state")
    out = {}
    for kernel in ("warp", "tile"):
        monkeypatch.setitem(gsu.TUNING, "warp", gsu.ONE_PASS_ALL if kernel == "warp" else ())
        s = state0.copy()
        y = ssmkit.state_update(s, **args, dt_softplus=True)
        out[kernel] = (to_numpy(y).astype(np.float64), to_numpy(s).astype(np.float64))
    for a, b in zip(out["warp"], out["tile"]):  # at most one bfloat16 rounding apart
        assert np.all(np.abs(a - b) <= 2.0**-7 * np.abs(b) + 1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("threads", [32, 64])
def test_gpu_staging_ring_matches_register_loads(monkeypatch, threads):
    # Blocks of many passes (the ring wraps several times, the last pass ends inside P),
    # two passes and one: the staged state equals the register-loaded one bit for bit, and
    # both the reference (padding rows included).
    import cupy as cp

    monkeypatch.setitem(gsu.TUNING, "one_pass", ())  # the general kernel's ring
    monkeypatch.setitem(gsu.TUNING, "tile", ())
    monkeypatch.setitem(gsu.TUNING, "threads", threads)
    monkeypatch.setitem(gsu.TUNING, "blocks_per_sm", 0)  # one block per head: every pass
    cases = [(dict(layout=2, H=2, P=100, N=64, G=1, bcast=True), "float32", "float32"),
             (dict(layout=2, H=3, P=37, N=128, G=1, T=3), "bfloat16", "bfloat16"),
             (dict(layout=1, H=1, P=70, N=16, G=2), "float32", "bfloat16"),
             (dict(layout=2, H=2, P=5, N=32, G=2), "float16", "float16"),
             (dict(layout=2, H=2, P=3, N=256, G=1), "float64", "float64")]
    for i, (case_kw, st_dtype, io_dtype) in enumerate(cases):
        outs = []
        for stage in ((2, 4, 8), ()):
            monkeypatch.setitem(gsu.TUNING, "stage_state", stage)
            _check_against_reference("gpu", dict(case_kw, batch=3), True, 400 + i,
                                     st_dtype, io_dtype)
            rng = np.random.default_rng(500 + i)
            case = make_case(rng, **dict(case_kw, batch=3))
            args, _ = convert(case, cp, state_dtype=st_dtype, io_dtype=io_dtype)
            state = args.pop("state")
            y = ssmkit.state_update(state, **args, dt_softplus=True)
            outs.append((to_numpy(state).view(np.uint8), to_numpy(y).view(np.uint8)))
        assert np.array_equal(outs[0][0], outs[1][0]) and np.array_equal(outs[0][1], outs[1][1])


# --------------------------------------------------------------------------------------
# The CUDA source: compiles with NVRTC (no GPU needed); the launch planner
# --------------------------------------------------------------------------------------

def _compile(keys, nvrtc_path, per_program=4):
    """ptxas's report per key; programs of a few kernels each, compiled on parallel threads."""
    exprs = [gsu.name_expression(k) for k in keys]
    report = _nvrtc_check.compile_kernels(gsu.SOURCE_FILE, exprs, per_program=per_program,
                                          nvrtc_path=nvrtc_path)
    return {k: report[e] for k, e in zip(keys, exprs)}


def test_kernel_keys_cover_every_template_value():
    full, rep = gsu.kernel_keys(full=True), gsu.kernel_keys(full=False)
    # general, one-pass, the tile kernel at each of 6 lane counts per channel, the warp kernel
    # at each of 4 for every (state, input) pair
    assert len({gsu.name_expression(k) for k in full}) == len(full) == (1152 + 576 + 192 * 6
                                                                        + 16 * 4)
    assert set(rep) <= set(full)
    for field in gsu.KernelKey._fields:
        assert {getattr(k, field) for k in rep} == {getattr(k, field) for k in full}, field
    mixed = [(k.state, k.io) for k in rep if k.state != k.io]
    assert {s for s, _ in mixed} == {i for _, i in mixed} == set(gsu.MAX_N)


def test_kernels_compile_for_sm90(nvrtc_path):
    keys = gsu.kernel_keys(full=FULL_NVRTC)
    report = _compile(keys, nvrtc_path)
    for k in keys:
        assert "registers" in report[k], k


def test_hot_kernels_keep_state_in_registers(nvrtc_path):
    # The benchmark shapes (Mamba-2 N = 128 with per-head A; Mamba-1 N = 16): no local memory.
    keys = []
    for state, io, N, amode in (("float32", "float32", 128, gsu.A_HEAD),
                                ("float32", "bfloat16", 128, gsu.A_HEAD),
                                ("bfloat16", "bfloat16", 128, gsu.A_HEAD),
                                ("float32", "float32", 128, gsu.A_FULL),
                                ("float32", "float32", 16, gsu.A_FULL),
                                ("bfloat16", "bfloat16", 16, gsu.A_FULL)):
        for one_pass, tile in ((False, False), (True, False), (False, True)):
            if tile and amode != gsu.A_HEAD:
                continue
            plan = gsu.plan_launch(batch=64, H=80 if N == 128 else 1,
                                   P=64 if N == 128 else 3072, N=N, state=state, amode=amode,
                                   one_pass=one_pass, tile=tile)
            keys.append(gsu.KernelKey(state, io, plan["ch"], plan["ppt"], amode, True, one_pass,
                                      tile, plan["tn"] if tile else 0))
    keys.append(gsu.KernelKey("bfloat16", "bfloat16", 1, 1, gsu.A_HEAD, True, tn=16, warp=True))
    for k, r in _compile(keys, nvrtc_path).items():
        assert r["stack"] == 0 and r["spill_stores"] == 0, (k, r)
        if k.warp:  # five blocks of 256 threads per SM
            assert r["registers"] <= 48, (k, r)
            continue
        if k.state == "bfloat16" and k.amode == gsu.A_HEAD and not k.one_pass:
            # two channels per thread under the 80-register bound (the tile kernel: 64):
            # many blocks per SM
            assert k.ppt == 2 and r["registers"] <= (64 if k.tile else 80), (k, r)


@pytest.mark.parametrize("state", ["float16", "bfloat16", "float32", "float64"])
def test_launch_plans(state):
    V = {"float16": 8, "bfloat16": 8, "float32": 4, "float64": 2}[state]
    for N in (1, 2, 3, 4, 7, 8, 15, 16, 17, 64, 100, 128, 129, 256, gsu.MAX_N[state]):
        for (batch, H, P), amode in zip(((64, 80, 64), (1, 1, 1), (3, 5, 7), (64, 1, 3072),
                                         (1, 24, 64)), (2, 0, 1, 0, 2)):
            plan = gsu.plan_launch(batch=batch, H=H, P=P, N=N, state=state, amode=amode)
            tn, ch, ppt, threads = plan["tn"], plan["ch"], plan["ppt"], plan["threads"]
            assert tn & (tn - 1) == 0 and tn <= 32 and threads % 32 == 0 and threads % tn == 0
            assert ch in (1, 2, 4, 8) and ppt in (1, 2, 4)
            assert tn * ch * V >= N  # every state has a lane
            rpb = plan["rows_per_block"]
            assert rpb % ((threads // tn) * ppt) == 0  # whole passes
            assert rpb * plan["npb"] >= P > rpb * (plan["npb"] - 1)  # blocks cover P, none empty
            assert plan["blocks"] == batch * H * plan["npb"]
            # the staging ring: one slot per pass, at most STAGES, within 48 KiB (0: none)
            passes = rpb // ((threads // tn) * ppt)
            slot = ppt * ch * threads * 16
            ring = plan["ring_bytes"]
            staged = 16 // V in gsu.TUNING["stage_state"]
            assert ring == (min(passes, gsu.STAGES) * slot
                            if staged and min(passes, gsu.STAGES) * slot <= 48 * 1024 else 0)
            one = gsu.plan_launch(batch=batch, H=H, P=P, N=N, state=state, amode=amode,
                                  one_pass=True)  # one pass: one block row per TP * PPT channels
            assert one["ppt"] in (1, 2, 4) and one["ppt"] * one["ch"] * 16 <= max(
                16 * one["ch"], gsu.TUNING["one_pass_bytes_per_thread"])
            assert one["rows_per_block"] == (one["threads"] // one["tn"]) * one["ppt"]
            assert one["rows_per_block"] * one["npb"] >= P > one["rows_per_block"] * (one["npb"] - 1)
            assert one["ring_bytes"] == 0 and one["blocks"] == batch * H * one["npb"]
            tile = gsu.plan_launch(batch=batch, H=H, P=P, N=N, state=state, amode=amode,
                                   tile=True)  # whole channels of one head per tile
            rows, row_bytes = tile["rows_per_block"], N * (16 // V)
            assert tile["tile"] and 1 <= rows <= P and tile["ppt"] in (1, 2, 4)
            assert rows * row_bytes <= max(row_bytes, gsu.TUNING["tile_bytes"])
            assert rows * tile["npb"] >= P > rows * (tile["npb"] - 1)
            # the tile, then x, z, D and the sums over N of its channels
            assert tile["ring_bytes"] == rows * (row_bytes + 4 * (8 if state == "float64" else 4))
            assert tile["blocks"] == batch * H * tile["npb"]
            every = dict(gsu.TUNING, stage_state=(2, 4, 8))
            ring = gsu.plan_launch(batch=batch, H=H, P=P, N=N, state=state, amode=amode,
                                   tuning=every)["ring_bytes"]
            assert ring == (min(passes, gsu.STAGES) * slot
                            if min(passes, gsu.STAGES) * slot <= 48 * 1024 else 0)
    no_ring = dict(gsu.TUNING, stage_state=())
    assert gsu.plan_launch(batch=64, H=80, P=64, N=128, state=state, tuning=no_ring)[
        "ring_bytes"] == 0
    with pytest.raises(ValueError, match="more than the kernel holds"):
        gsu.plan_launch(batch=1, H=1, P=1, N=gsu.MAX_N[state] + 1, state=state)


def test_source_needs_no_include_path():
    import re

    src = compiler.kernel_source(gsu.SOURCE_FILE)
    assert not re.search(r"^\s*#\s*include", src, re.M)


# --------------------------------------------------------------------------------------
# Repeated GPU calls replay a cached launch plan: checked on the CPU with NumPy arrays that
# the host code takes for CuPy arrays and a kernel that records its launches
# --------------------------------------------------------------------------------------

class _FakeGpuArray(np.ndarray):
    """A NumPy array dressed as a CuPy array: ``data.ptr``, ``device.id``, ``get()``."""

    def __array_finalize__(self, obj):
        self.pointer = _Namespace(ptr=self.__array_interface__["data"][0])
        self.gpu = getattr(obj, "gpu", None) or _Namespace(id=0)

    @property
    def data(self):
        return self.pointer

    @property
    def device(self):
        return self.gpu

    def get(self):
        return np.array(self)


_FakeGpuArray.__module__ = "cupy._core.core"  # what ssmkit._arrays recognises as CuPy


class _Namespace:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _fake_cupy():
    """A stand-in ``cupy`` module for the host path (arrays in host memory, no launches)."""
    import contextlib
    import types

    cp = types.ModuleType("cupy")
    fake = _FakeGpuArray
    cp.ndarray = fake
    cp.empty = lambda shape, dtype=np.float32: np.zeros(shape, dtype).view(fake)  # repeatable
    cp.asarray = lambda a, dtype=None: np.asarray(a, dtype).view(fake)
    cp.ascontiguousarray = lambda a: np.ascontiguousarray(a).view(fake)
    cp.broadcast_to = lambda a, shape: np.broadcast_to(a, shape, subok=True)
    current = [0]
    cp.cuda = _Namespace(Device=lambda i: contextlib.nullcontext(),
                         runtime=_Namespace(getDevice=lambda: current[0]))
    return cp


class _RecordingKernel:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def __call__(self, grid, block, args, shared_mem=0):
        self.log.append((self.name, grid, (block, shared_mem), args))


@pytest.fixture
def fake_gpu(monkeypatch):
    """(fake cupy module, launch log): the GPU host path runs, kernels only record."""
    import sys

    from ssmkit import _state_update

    cp = _fake_cupy()
    log = []
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setattr(compiler, "get_kernel", lambda f, name: _RecordingKernel(name, log))
    monkeypatch.setattr(compiler, "device_limits", lambda: {"sm_count": 132,
                                                                 "compute_capability": 90})
    monkeypatch.setattr(_state_update, "_KNOWN_CALLS", {})
    return cp, log


def _describe_launch(record, operands):
    """A launch with arrays described by position among ``operands`` (user arrays) or by
    shape, strides, dtype and values (arrays made per call: y, casts, row indices)."""
    name, grid, block, args = record
    out = []
    for a in args:
        if isinstance(a, np.ndarray):
            same = [i for i, op in enumerate(operands) if op is a]
            out.append(("operand", same[0]) if same else
                        ("made", a.shape, a.strides, a.dtype.str, a.data.ptr & 15,
                         np.array(a).tobytes() if a.size < 4096 else None))
        else:
            out.append((type(a).__name__, a.item() if hasattr(a, "item") else a))
    return name, grid, block, tuple(out)


def _call_twice(fake_gpu, args, kw, monkeypatch):
    """Launches of a first call (checked and planned) and of a second one (replayed)."""
    from ssmkit import _state_update

    cp, log = fake_gpu
    operands = [args[n] for n in ("state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias")]
    del log[:]
    y1 = ssmkit.state_update(**args, **kw)
    first = [_describe_launch(r, operands) for r in log]
    del log[:]
    prepared = []
    real_prepare = _state_update._prepare
    monkeypatch.setattr(_state_update, "_prepare",
                        lambda *a: prepared.append(1) or real_prepare(*a))
    y2 = ssmkit.state_update(**args, **kw)
    monkeypatch.setattr(_state_update, "_prepare", real_prepare)
    second = [_describe_launch(r, operands) for r in log]
    assert type(y1) is type(y2) is cp.ndarray and y1.shape == y2.shape and y1.dtype == y2.dtype
    return first, second, bool(prepared)


_FAKE_CASES = [
    (dict(layout=2, batch=3, H=2, P=8, N=16, G=1, bcast=True), "float32", "float32", {}),
    (dict(layout=2, batch=3, H=2, P=8, N=16, G=2, T=3), "bfloat16", "bfloat16", {}),
    (dict(layout=1, batch=2, H=1, P=12, N=8, G=1), "float32", "bfloat16", {}),
    (dict(layout=1, batch=2, H=1, P=12, N=8, G=3, T=2, with_z=False), "float64", "float64", {}),
    (dict(layout=2, batch=3, H=2, P=4, N=5, G=1, with_D=False, with_bias=False,
          softplus=False), "float16", "float32", {}),
    (dict(layout=2, batch=3, H=2, P=4, N=16, G=1, pool=6), "float32", "float32",
     dict(state_batch_indices=[4, -1, 0])),
]


@pytest.mark.parametrize("case_kw,st_dtype,io_dtype,extra", _FAKE_CASES)
def test_repeated_call_replays_the_same_launch(fake_gpu, monkeypatch, case_kw, st_dtype,
                                               io_dtype, extra):
    cp, _ = fake_gpu
    case = make_case(np.random.default_rng(5), **case_kw)
    args, _ = convert(case, cp, state_dtype=st_dtype, io_dtype=io_dtype)
    kw = dict(dt_softplus=case_kw.get("softplus", True))
    if "state_batch_indices" in extra:
        kw["state_batch_indices"] = cp.asarray(extra["state_batch_indices"])
    first, second, prepared = _call_twice(fake_gpu, args, kw, monkeypatch)
    assert first and second == first
    assert not prepared  # the second call skipped the checks it had passed already


def _base_call(cp):
    case = make_case(np.random.default_rng(3), layout=2, batch=3, H=2, P=8, N=16, G=1,
                     bcast=True)
    args, _ = convert(case, cp, state_dtype="float32", io_dtype="float32")
    return args, dict(dt_softplus=True)


def test_call_key_covers_what_changes_the_launch(fake_gpu, monkeypatch):
    from ssmkit import _state_update

    cp, log = fake_gpu
    args, kw = _base_call(cp)
    ssmkit.state_update(**args, **kw)  # the base call is known from here on

    def wide(a):  # the same values, other strides
        w = cp.empty(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
        w[..., ::2] = a
        return w[..., ::2]

    def misaligned(a):  # the same values at an address 4 bytes past a 16-byte boundary
        raw = cp.empty(a.size + 4, a.dtype)
        v = raw[1:1 + a.size].reshape(a.shape)
        v[...] = a
        return v

    def on_device(i):
        out = {}
        for n, a in args.items():
            b = None if a is None else cp.asarray(np.array(a))
            if b is not None:
                b.gpu = _Namespace(id=i)
            out[n] = b
        return out

    variants = [
        ("shape", dict(args, x=args["x"][:2], dt=args["dt"][:2], z=args["z"][:2],
                       B=args["B"][:2], C=args["C"][:2], state=args["state"][:2]), kw),
        ("strides of x", dict(args, x=wide(args["x"])), kw),
        ("strides of state", dict(args, state=wide(args["state"])), kw),
        ("dtype of x", dict(args, x=args["x"].astype(np.float64)), kw),
        ("dtype of state", dict(args, state=args["state"].astype(np.float64)), kw),
        ("dtype of A", dict(args, A=args["A"].astype(np.float64)), kw),
        ("alignment of B", dict(args, B=misaligned(args["B"])), kw),
        ("no z", dict(args, z=None), kw),
        ("no D", dict(args, D=None), kw),
        ("dt_softplus", args, dict(dt_softplus=False)),
        ("indices", args, dict(kw, state_batch_indices=cp.asarray([2, 0, 1]))),
        ("device", on_device(1), kw),
    ]
    keys = {_state_update._call_key([args[n] for n in _state_update._OPERANDS],
                                    kw["dt_softplus"], None)}
    for what, v_args, v_kw in variants:
        key = _state_update._call_key([v_args[n] for n in _state_update._OPERANDS],
                                      v_kw["dt_softplus"], v_kw.get("state_batch_indices"))
        assert key is not None and key not in keys, what
        keys.add(key)
        # Replayed after every other known call: the launch of a fresh, fully checked call.
        first, second, prepared = _call_twice(fake_gpu, v_args, v_kw, monkeypatch)
        _state_update._KNOWN_CALLS.clear()
        fresh, _, _ = _call_twice(fake_gpu, v_args, v_kw, monkeypatch)
        assert first == second == fresh and not prepared, what
        ssmkit.state_update(**args, **kw)
    # The plan also depends on the launch preferences: a change makes known calls stale.
    ssmkit.state_update(**args, **kw)
    monkeypatch.setitem(gsu.TUNING, "threads", 256)
    monkeypatch.setitem(gsu.TUNING, "tile_threads", 256)
    first, second, _ = _call_twice(fake_gpu, args, kw, monkeypatch)
    assert first == second and first[0][2][0] == (256,)


def test_repeated_call_still_checks_indices(fake_gpu):
    cp, log = fake_gpu
    args, kw = _base_call(cp)
    state = cp.asarray(np.random.default_rng(1).standard_normal((5, 2, 8, 16)), np.float32)
    args = dict(args, state=state)
    ssmkit.state_update(**args, **kw, state_batch_indices=cp.asarray([4, 0, 1]))
    before = np.array(state)
    del log[:]
    for bad, match in (([0, 5, 1], "out of range"), ([2, -1, 2], "race")):
        with pytest.raises(ValueError, match=match):
            ssmkit.state_update(**args, **kw, state_batch_indices=cp.asarray(bad))
    assert not log and np.array_equal(np.array(state), before)


def test_other_arrays_are_not_cached(fake_gpu):
    from ssmkit import _state_update

    cp, _ = fake_gpu
    args, kw = _base_call(cp)
    ops = [args[n] for n in _state_update._OPERANDS]
    assert _state_update._call_key(ops, True, None) is not None
    assert _state_update._call_key(ops, np.True_, None) is None  # checked in full every time
    assert _state_update._call_key([np.array(ops[0])] + ops[1:], True, None) is None
    assert _state_update._call_key(ops, True, [0, 1, 2]) is None


def test_replay_checks_the_alignment_of_cast_copies(fake_gpu, monkeypatch):
    from ssmkit import _state_update

    cp, log = fake_gpu
    case = make_case(np.random.default_rng(2), layout=2, batch=3, H=2, P=8, N=16, G=1)
    args, _ = convert(case, cp, state_dtype="float32", io_dtype="bfloat16")
    args["x"] = args["x"].astype(np.float32)  # mixed inputs: dt, z, B, C are cast
    ssmkit.state_update(**args, dt_softplus=True)
    (known,) = _state_update._KNOWN_CALLS.values()
    assert {n for n, *_ in known.plan.casts} >= {"B", "C"} and known.plan.key.vec
    real = gsu._cast_keep_broadcast

    def misaligned(xp, a, dtype):  # an allocator that hands out addresses 4 bytes off
        c = real(xp, a, dtype)
        if c is None or not c.flags.c_contiguous:
            return c
        raw = cp.empty(c.size + 4, c.dtype)
        out = raw[1:1 + c.size].reshape(c.shape)
        out[...] = c
        return out

    monkeypatch.setattr(gsu, "_cast_keep_broadcast", misaligned)
    del log[:]
    prepared = []
    real_prepare = _state_update._prepare
    monkeypatch.setattr(_state_update, "_prepare",
                        lambda *a: prepared.append(1) or real_prepare(*a))
    ssmkit.state_update(**args, dt_softplus=True)
    assert prepared and len(log) == 1  # planned afresh, launched once
    assert log[0][0].endswith("false>")  # the general form for unaligned B and C


def test_kernel_choice(fake_gpu, monkeypatch):
    # Which kernel the host launches (no GPU: the launches are recorded). The warp kernel takes
    # one token of per-head parameters (D per head or per channel) and channels of 4-32
    # vectors, for the item sizes of TUNING["warp"] from sm_80; the tile kernel the other
    # per-head 16-bit cases.
    cp, log = fake_gpu
    monkeypatch.setattr(compiler, "ensure_dynamic_smem", lambda *a: None)

    def kernel_of(st_dtype="bfloat16", io_dtype="bfloat16", T=None, N=128, P=64, **kw):
        case = make_case(np.random.default_rng(0), layout=2, batch=2, H=3, P=P, N=N, G=1, T=T,
                         bcast=True, **kw)
        args, _ = convert(case, cp, state_dtype=st_dtype, io_dtype=io_dtype)
        del log[:]
        ssmkit.state_update(**args, dt_softplus=True)
        (name, grid, (block, _), _), = log
        return name, grid, block

    name, grid, block = kernel_of()
    assert name == "ssm_state_update_warp<ssm_bf16, ssm_bf16, 16>"
    assert grid == (1, 3, 2) and block == (gsu.WARP_THREADS,)
    assert kernel_of(N=32)[0] == "ssm_state_update_warp<ssm_bf16, ssm_bf16, 4>"
    assert kernel_of(P=100)[1] == (2, 3, 2)  # 64 channels per block
    assert kernel_of("float32", "bfloat16")[0] == "ssm_state_update_warp<float, ssm_bf16, 32>"
    for kw in (dict(with_D=False), dict(d_per_channel=True)):
        assert kernel_of(**kw)[0].startswith("ssm_state_update_warp<"), kw
    for kw in (dict(T=2), dict(N=16), dict(N=512)):
        assert kernel_of(**kw)[0].startswith("ssm_state_update_tile<"), kw
    assert kernel_of("float32", "float32")[0].startswith("ssm_state_update_vec<")
    monkeypatch.setitem(gsu.TUNING, "warp", ())
    assert kernel_of()[0].startswith("ssm_state_update_tile<")
    monkeypatch.setattr(compiler, "device_limits", lambda: {"sm_count": 132,
                                                             "compute_capability": 80})
    monkeypatch.setitem(gsu.TUNING, "warp", ((2, 2),))
    assert kernel_of()[0].startswith("ssm_state_update_warp<")  # sm_80: cp.async, no bulk copy
    monkeypatch.setattr(compiler, "device_limits", lambda: {"sm_count": 132,
                                                             "compute_capability": 75})
    from ssmkit import _state_update

    monkeypatch.setattr(_state_update, "_KNOWN_CALLS", {})  # (a device keeps its plans)
    assert kernel_of()[0].startswith("ssm_state_update<")
