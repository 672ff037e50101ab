"""The functional Mamba-1 and Mamba-2 layers (``ssmkit.layers``).

Checked against a float64 composition written out here from the reference
operations (the layer's wiring: projections, split, convolution, scan, gate,
norm), for sequence mode, decoding steps, carried state and gradients.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ssmkit import layers, reference
from helpers import backends, to_numpy, xp_for

RTOL = {"float32": 2e-4, "float64": 1e-10}


# ----------------------------------------------------------------------------- weights

def mamba1_params(rng, d_model=6, expand=2, N=4, R=3, W=4, biases=False, dtype=np.float64):
    di = expand * d_model

    def w(*shape, scale=0.4):
        return (rng.standard_normal(shape) * scale).astype(dtype)

    return layers.Mamba1Params(
        in_proj_weight=w(2 * di, d_model), conv_weight=w(di, W), conv_bias=w(di),
        x_proj_weight=w(R + 2 * N, di), dt_proj_weight=w(di, R),
        dt_proj_bias=(rng.uniform(-3, -1, di)).astype(dtype),
        A_log=np.log(rng.uniform(0.5, 4.0, (di, N))).astype(dtype), D=w(di),
        out_proj_weight=w(d_model, di),
        in_proj_bias=w(2 * di) if biases else None, out_proj_bias=w(d_model) if biases else None)


def mamba2_params(rng, d_model=6, H=4, P=3, G=2, N=4, W=4, d_mlp=0, norm=True, D_hdim=False,
                  dt_limit=(0.0, float("inf")), dtype=np.float64):
    di = H * P
    conv_dim = di + 2 * G * N

    def w(*shape, scale=0.4):
        return (rng.standard_normal(shape) * scale).astype(dtype)

    return layers.Mamba2Params(
        in_proj_weight=w(2 * d_mlp + 2 * di + 2 * G * N + H, d_model),
        conv_weight=w(conv_dim, W), conv_bias=w(conv_dim),
        dt_bias=rng.uniform(-3, -1, H).astype(dtype),
        A_log=np.log(rng.uniform(0.5, 4.0, H)).astype(dtype),
        D=w(H, P) if D_hdim else w(H), norm_weight=(1.0 + w(di)) if norm else None,
        out_proj_weight=w(d_model, di + d_mlp), headdim=P, ngroups=G, dt_limit=dt_limit)


def to_xp(params, xp, dtype=None):
    def conv(v):
        if v is None or not hasattr(v, "shape"):
            return v
        a = np.asarray(v) if dtype is None else np.asarray(v).astype(dtype)
        return xp.asarray(a)
    return dataclasses.replace(params, **{f.name: conv(getattr(params, f.name))
                                          for f in dataclasses.fields(params)})


# ----------------------------------------------------------------------------- float64 wiring

def _silu(x):
    return x / (1.0 + np.exp(-x))


def _conv_ref(x, w, b, init):
    """Depthwise causal convolution with silu: x (batch, C, L), init (batch, C, W-1)."""
    W = w.shape[1]
    xpad = np.concatenate([init, x], axis=-1)
    L = x.shape[-1]
    y = sum(w[None, :, k, None] * xpad[:, :, k:k + L] for k in range(W)) + b[None, :, None]
    return _silu(y), xpad[:, :, xpad.shape[-1] - (W - 1):]


def mamba1_ref(p, hidden, state=None):
    di, R, N = p.d_inner, p.dt_rank, p.d_state
    batch = hidden.shape[0]
    xz = hidden @ p.in_proj_weight.T + (0 if p.in_proj_bias is None else p.in_proj_bias)
    x, z = xz[..., :di].transpose(0, 2, 1), xz[..., di:].transpose(0, 2, 1)
    init = np.zeros((batch, di, p.d_conv - 1)) if state is None else state.conv
    xc, conv_final = _conv_ref(x, p.conv_weight, p.conv_bias, init)
    x_dbl = xc.transpose(0, 2, 1) @ p.x_proj_weight.T
    delta = (x_dbl[..., :R] @ p.dt_proj_weight.T).transpose(0, 2, 1)
    B, C = x_dbl[..., R:R + N].transpose(0, 2, 1), x_dbl[..., R + N:].transpose(0, 2, 1)
    y, ssm_final = reference.selective_scan(
        xc, delta, -np.exp(p.A_log), B, C, p.D, z, p.dt_proj_bias, True,
        initial_state=None if state is None else state.ssm, return_final_state=True)
    out = y.transpose(0, 2, 1) @ p.out_proj_weight.T
    if p.out_proj_bias is not None:
        out = out + p.out_proj_bias
    return out, layers.Mamba1State(conv_final, ssm_final)


def mamba2_ref(p, hidden, state=None):
    H, P, G, N, di, m = p.nheads, p.headdim, p.ngroups, p.d_state, p.d_inner, p.d_mlp
    batch, L, _ = hidden.shape
    zx = hidden @ p.in_proj_weight.T
    z0, x0 = zx[..., :m], zx[..., m:2 * m]
    z = zx[..., 2 * m:2 * m + di]
    xBC = zx[..., 2 * m + di:2 * m + 2 * di + 2 * G * N].transpose(0, 2, 1)
    dt = zx[..., 2 * m + 2 * di + 2 * G * N:]
    init = np.zeros((batch, p.conv_dim, p.d_conv - 1)) if state is None else state.conv
    xBCc, conv_final = _conv_ref(xBC, p.conv_weight, p.conv_bias, init)
    t = xBCc.transpose(0, 2, 1)
    x = t[..., :di].reshape(batch, L, H, P)
    B = t[..., di:di + G * N].reshape(batch, L, G, N)
    C = t[..., di + G * N:].reshape(batch, L, G, N)
    y, ssm_final = reference.ssd(
        x, dt, -np.exp(p.A_log), B, C, D=p.D,
        z=z.reshape(batch, L, H, P) if p.norm_weight is None else None, dt_bias=p.dt_bias,
        dt_softplus=True, dt_limit=p.dt_limit,
        initial_state=None if state is None else state.ssm, return_final_state=True)
    y = y.reshape(batch, L, di)
    if p.norm_weight is not None:
        g = (y * _silu(z)).reshape(batch, L, G, di // G)
        g = g / np.sqrt((g * g).mean(-1, keepdims=True) + p.norm_eps)
        y = g.reshape(batch, L, di) * p.norm_weight
    if m:
        y = np.concatenate([x0 * _silu(z0), y], axis=-1)
    return y @ p.out_proj_weight.T, layers.Mamba2State(conv_final, ssm_final)


def _close(got, want, rtol):
    got = to_numpy(got).astype(np.float64)
    scale = max(np.abs(want).max(), 1e-30)
    np.testing.assert_allclose(got, want, rtol=0, atol=rtol * scale)


LAYERS = {
    "mamba1": (mamba1_params, layers.mamba1, layers.mamba1_vjp, layers.mamba1_step,
               layers.mamba1_zero_state, mamba1_ref),
    "mamba2": (mamba2_params, layers.mamba2, layers.mamba2_vjp, layers.mamba2_step,
               layers.mamba2_zero_state, mamba2_ref),
}
VARIANTS = {
    "mamba1": [dict(), dict(biases=True, W=2, N=3)],
    "mamba2": [dict(), dict(norm=False, D_hdim=True, G=1), dict(d_mlp=3, W=3, G=4, P=2),
               dict(dt_limit=(0.05, 0.2))],
}
CASES = [(name, i) for name in LAYERS for i in range(len(VARIANTS[name]))]


# ----------------------------------------------------------------------------- tests

@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name,variant", CASES)
@pytest.mark.parametrize("L", [1, 7, 20])
def test_sequence_mode_matches_reference(backend, dtype, name, variant, L):
    make, seq, _, _, _, ref = LAYERS[name]
    rng = np.random.default_rng(L + 10 * variant)
    p64 = make(rng, **VARIANTS[name][variant])
    hidden = rng.standard_normal((2, L, p64.d_model))
    want, want_state = ref(p64, hidden)
    xp = xp_for(backend)
    p = to_xp(p64, xp, dtype)
    out, state = seq(p, xp.asarray(hidden.astype(dtype)), return_state=True, chunk_size=4)
    _close(out, want, RTOL[dtype])
    _close(state.conv, want_state.conv, RTOL[dtype])
    _close(state.ssm, want_state.ssm, RTOL[dtype])


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("name,variant", CASES)
def test_steps_continue_a_prefix(backend, name, variant):
    """Prefill a prefix, carry the state through a second call, then decode step by step."""
    make, seq, _, step, zero_state, ref = LAYERS[name]
    rng = np.random.default_rng(3 + variant)
    p64 = make(rng, **VARIANTS[name][variant])
    batch, L = 3, 13
    hidden = rng.standard_normal((batch, L, p64.d_model))
    want, want_state = ref(p64, hidden)
    xp = xp_for(backend)
    p = to_xp(p64, xp)
    h = xp.asarray(hidden)
    out1, st = seq(p, h[:, :5], return_state=True, chunk_size=2)
    out2, st = seq(p, h[:, 5:9], state=st, return_state=True, chunk_size=3)
    outs = [to_numpy(out1), to_numpy(out2)]
    for t in range(9, L):
        outs.append(to_numpy(step(p, h[:, t], st))[:, None])
    _close(np.concatenate(outs, axis=1), want, 1e-10)
    _close(st.ssm, want_state.ssm, 1e-10)
    _close(st.conv, want_state.conv, 1e-10)
    # decoding from a zero state equals the sequence mode from the start
    st0 = zero_state(p, batch, dtype=np.float64)
    first = np.stack([to_numpy(step(p, h[:, t], st0)) for t in range(4)], axis=1)
    _close(first, want[:, :4], 1e-10)


@pytest.mark.parametrize("name,variant", CASES)
def test_vjp_matches_finite_differences(name, variant):
    """Directional derivatives of sum(out * W) along random directions, for every input."""
    make, seq, vjp, _, zero_state, _ = LAYERS[name]
    rng = np.random.default_rng(11 + variant)
    p = make(rng, **VARIANTS[name][variant])
    batch, L = 2, 6
    hidden = rng.standard_normal((batch, L, p.d_model))
    st = zero_state(p, batch, dtype=np.float64)
    st = type(st)(*(rng.standard_normal(s.shape) * 0.5 for s in st))
    wout = rng.standard_normal((batch, L, p.d_model))
    wst = type(st)(*(rng.standard_normal(s.shape) for s in st))

    def loss(p_, h_, st_):
        out, fin = seq(p_, h_, state=st_, return_state=True, chunk_size=4)
        return (out * wout).sum() + sum((f * w).sum() for f, w in zip(fin, wst))

    (_, _), pullback = vjp(p, hidden, state=st, return_state=True, chunk_size=4)
    g = pullback(wout, wst)
    eps = 1e-6
    arrays = [f.name for f in dataclasses.fields(p) if isinstance(getattr(p, f.name), np.ndarray)]
    for field in arrays + ["hidden", "state.conv", "state.ssm"]:
        if field == "hidden":
            base, grad = hidden, g.hidden
        elif field.startswith("state."):
            base, grad = getattr(st, field[6:]), getattr(g.state, field[6:])
        else:
            base, grad = getattr(p, field), getattr(g.params, field)
        v = rng.standard_normal(base.shape)

        def at(sign):
            moved = base + sign * eps * v
            if field == "hidden":
                return loss(p, moved, st)
            if field.startswith("state."):
                return loss(p, hidden, st._replace(**{field[6:]: moved}))
            return loss(dataclasses.replace(p, **{field: moved}), hidden, st)

        fd = (at(1) - at(-1)) / (2 * eps)
        got = float((np.asarray(grad) * v).sum())
        assert abs(got - fd) <= 1e-5 * max(1.0, abs(fd)), (field, got, fd)


def test_step_refusal_leaves_state_untouched():
    rng = np.random.default_rng(0)
    p = mamba1_params(rng)
    st = layers.mamba1_zero_state(p, 2, dtype=np.float64)
    st.ssm[...] = 1.5
    before = (st.conv.copy(), st.ssm.copy())
    with pytest.raises(ValueError, match="hidden"):
        layers.mamba1_step(p, np.zeros((2, p.d_model + 1)), st)
    bad = layers.Mamba1State(st.conv, st.ssm[:1])
    with pytest.raises(ValueError, match="state.ssm"):
        layers.mamba1_step(p, np.zeros((2, p.d_model)), bad)
    np.testing.assert_array_equal(st.conv, before[0])
    np.testing.assert_array_equal(st.ssm, before[1])


def test_from_state_dict_round_trip():
    rng = np.random.default_rng(1)
    p = mamba2_params(rng, d_mlp=0)
    sd = {"m.in_proj.weight": p.in_proj_weight, "m.conv1d.weight": p.conv_weight[:, None, :],
          "m.conv1d.bias": p.conv_bias, "m.dt_bias": p.dt_bias, "m.A_log": p.A_log, "m.D": p.D,
          "m.norm.weight": p.norm_weight, "m.out_proj.weight": p.out_proj_weight}
    q = layers.Mamba2Params.from_state_dict(sd, "m.", headdim=p.headdim, ngroups=p.ngroups)
    hidden = rng.standard_normal((1, 5, p.d_model))
    np.testing.assert_array_equal(layers.mamba2(q, hidden), layers.mamba2(p, hidden))
    with pytest.raises(KeyError, match="A_log"):
        layers.Mamba2Params.from_state_dict({k: v for k, v in sd.items() if "A_log" not in k},
                                            "m.", headdim=p.headdim)
    with pytest.raises(ValueError, match="in_proj_weight has"):
        layers.Mamba2Params.from_state_dict(sd, "m.", headdim=p.headdim + 1, ngroups=p.ngroups)


@pytest.mark.parametrize("backend", backends())
def test_mamba2_passes_allow_tf32_to_the_scan(backend, monkeypatch):
    """mamba2 and mamba2_vjp hand allow_tf32 to ssmkit.ssd / ssd_vjp (seen by the scan), and
    the float32 output stays within TF32's bound of the reference."""
    from ssmkit import _ssd
    from helpers import TF32_RTOL

    seen = []
    real = _ssd._prepare
    monkeypatch.setattr(_ssd, "_prepare", lambda *a, **k: (seen.append(a[-1]), real(*a, **k))[1])
    rng = np.random.default_rng(5)
    p64 = mamba2_params(rng)
    hidden = rng.standard_normal((2, 20, p64.d_model))
    want, _ = mamba2_ref(p64, hidden)
    xp = xp_for(backend)
    p = to_xp(p64, xp, "float32")
    x = xp.asarray(hidden.astype("float32"))
    out = layers.mamba2(p, x, chunk_size=8, allow_tf32=True)
    out_vjp, _ = layers.mamba2_vjp(p, x, chunk_size=8, allow_tf32=True)
    assert seen == [True, True]
    _close(out, want, TF32_RTOL["forward"])
    _close(out_vjp, want, TF32_RTOL["forward"])


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("name,variant", CASES)
def test_packed_sequences_equal_separate_calls(backend, name, variant):
    """With seq_idx, each sequence's outputs, the rows' final states and the gradients equal
    those of each sequence in a call of its own (the row's state feeding its first)."""
    make, seq, vjp, _, zero_state, _ = LAYERS[name]
    rng = np.random.default_rng(5 + variant)
    xp = xp_for(backend)
    p = to_xp(make(rng, **VARIANTS[name][variant]), xp)
    L = 14
    labels = np.array([[0, 0, 0, 1, 1, 1, 1, 1, 1, 4, 4, 4, 4, 4], [2] * 5 + [3] * 8 + [5]])
    hidden = xp.asarray(rng.standard_normal((2, L, p.d_model)))
    state = zero_state(p, 2, dtype=np.float64)
    state = type(state)(*(xp.asarray(rng.standard_normal(s.shape)) for s in state))
    dout = xp.asarray(rng.standard_normal((2, L, p.d_model)))
    (out, final), pullback = vjp(p, hidden, state=state, return_state=True, chunk_size=2,
                                 seq_idx=xp.asarray(labels))
    grads = pullback(dout)
    dhidden = np.zeros((2, L, p.d_model))
    dparams = None
    for b in range(2):
        cuts = [0] + [t for t in range(1, L) if labels[b, t] != labels[b, t - 1]] + [L]
        for a, e in zip(cuts[:-1], cuts[1:]):
            st = type(state)(*(s[b:b + 1] for s in state)) if a == 0 else None
            (o1, f1), pb1 = vjp(p, hidden[b:b + 1, a:e], state=st, return_state=True,
                                chunk_size=3)
            _close(out[b:b + 1, a:e], to_numpy(o1), 1e-10)
            if e == L:
                _close(final.ssm[b:b + 1], to_numpy(f1.ssm), 1e-10)
                _close(final.conv[b:b + 1], to_numpy(f1.conv), 1e-10)
            g1 = pb1(dout[b:b + 1, a:e])
            dhidden[b:b + 1, a:e] = to_numpy(g1.hidden)
            part = _param_arrays(g1.params)
            dparams = part if dparams is None else [u + v for u, v in zip(dparams, part)]
    _close(grads.hidden, dhidden, 1e-9)
    got = _param_arrays(grads.params)
    assert len(got) == len(dparams) > 0
    for g, want in zip(got, dparams):
        _close(g, want, 1e-9)


def _param_arrays(params):
    """The array fields of a parameter dataclass (gradients), as NumPy arrays."""
    values = (getattr(params, f.name) for f in dataclasses.fields(params))
    return [to_numpy(v) for v in values if hasattr(v, "shape")]
