"""Functional Mamba-1 and Mamba-2 layers built from ssmkit's own operations.

A layer is a plain function of its weights and its input. The weights are
arrays in a small frozen dataclass (:class:`Mamba1Params`, :class:`Mamba2Params`),
built directly or from a PyTorch ``state_dict`` exported to NumPy
(:meth:`Mamba1Params.from_state_dict`; ``examples/pytorch_weights.py`` shows the
export). Everything runs on the arrays' library: NumPy arrays on the CPU, CuPy
arrays on the GPU; projections use that library's ``matmul``.

Each layer has three forms:

- sequence mode, ``mamba1(params, hidden)``: hidden (batch, L, d_model), with an
  optional carried :class:`Mamba1State` in and out (chunked prefill);
- its gradient, ``mamba1_vjp(params, hidden)`` -> ``(out, pullback)``;
- decoding, ``mamba1_step(params, hidden_t, state)``: one token (batch, d_model),
  the state updated in place.

A prefix run with ``return_state=True`` followed by steps gives the same outputs
as one run over the whole sequence.

The layers follow the reference PyTorch modules ``mamba_ssm.Mamba`` (Mamba-1)
and ``mamba_ssm.Mamba2`` (with its gated RMSNorm, ``norm_before_gate=False``).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import numpy as np

from ._arrays import array_namespace
from ._causal_conv1d import causal_conv1d, causal_conv1d_update, causal_conv1d_vjp
from ._selective_scan import selective_scan, selective_scan_vjp
from ._ssd import ssd, ssd_vjp
from ._state_update import state_update

__all__ = [
    "Mamba1Params", "Mamba1State", "Mamba1Grads", "mamba1", "mamba1_vjp", "mamba1_step",
    "mamba1_zero_state",
    "Mamba2Params", "Mamba2State", "Mamba2Grads", "mamba2", "mamba2_vjp", "mamba2_step",
    "mamba2_zero_state",
]


# ----------------------------------------------------------------------------- shared pieces

def _linear(x, W, b=None):
    """``x @ W.T + b`` over the last axis of x, in x's dtype."""
    y = x @ W.T.astype(x.dtype, copy=False)
    if b is not None:
        y = y + b.astype(x.dtype, copy=False)
    return y


def _linear_vjp(dy, x, W, b):
    """Gradients of :func:`_linear`: (dx, dW, db) for cotangent dy."""
    dx = dy @ W.astype(dy.dtype, copy=False)
    dy2, x2 = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
    dW = (dy2.T @ x2).astype(W.dtype, copy=False)
    db = None if b is None else dy2.sum(axis=0).astype(b.dtype, copy=False)
    return dx, dW, db


def _channels_first(x):
    """(batch, L, C) -> contiguous (batch, C, L): the layout of the scan and the convolution."""
    xp = array_namespace("ssmkit.layers", {"x": x})[0]
    return xp.ascontiguousarray(x.transpose(0, 2, 1))


def _sigmoid(xp, x):
    return 1.0 / (1.0 + xp.exp(-x))


def _softplus(xp, x):
    return xp.where(x <= 20.0, xp.log1p(xp.exp(xp.minimum(x, 20.0))), x)


def _compute_dtype(x):
    """float64 for float64 arrays, float32 for every narrower float (as the scans compute)."""
    return np.float64 if x.dtype == np.float64 else np.float32


def _state_dict_reader(weights, prefix, fn):
    """``get(name, required=True)``: ``weights[prefix + name]``; None or a KeyError when absent."""
    def get(name, required=True):
        key = prefix + name
        if key in weights:
            return weights[key]
        if required:
            raise KeyError(f"{fn}: missing {key!r}")
        return None
    return get


def _check_hidden(fn, hidden, d_model, step):
    want = "(batch, d_model)" if step else "(batch, L, d_model)"
    ndim = 2 if step else 3
    if getattr(hidden, "ndim", None) != ndim or hidden.shape[-1] != d_model:
        raise ValueError(f"{fn}: hidden must have shape {want} with d_model = {d_model}; "
                         f"got {tuple(getattr(hidden, 'shape', ()))}")
    if hidden.dtype.kind != "f" and "bfloat16" not in str(hidden.dtype):
        raise TypeError(f"{fn}: hidden must be a real floating array; got {hidden.dtype}")


def _check_state(fn, state, cls, conv_shape, ssm_shape, batch):
    if not isinstance(state, cls):
        raise TypeError(f"{fn}: state must be a {cls.__name__}; got {type(state).__name__}")
    for name, want in (("conv", conv_shape), ("ssm", ssm_shape)):
        got = tuple(getattr(state, name).shape)
        if got != (batch,) + want:
            raise ValueError(f"{fn}: state.{name} must have shape {(batch,) + want}; got {got}")


# ----------------------------------------------------------------------------- Mamba-1

@dataclasses.dataclass(frozen=True)
class Mamba1Params:
    """Weights of a Mamba-1 layer (``mamba_ssm.Mamba``), as plain arrays.

    Shapes use d_inner = expand * d_model, N = d_state, R = dt_rank, W = d_conv.

    Attributes
    ----------
    in_proj_weight : (2 * d_inner, d_model)
    conv_weight : (d_inner, W)
    conv_bias : (d_inner,) or None
    x_proj_weight : (R + 2 * N, d_inner)
    dt_proj_weight : (d_inner, R)
    dt_proj_bias : (d_inner,)
    A_log : (d_inner, N); A = -exp(A_log)
    D : (d_inner,)
    out_proj_weight : (d_model, d_inner)
    in_proj_bias : (2 * d_inner,) or None
    out_proj_bias : (d_model,) or None
    """

    in_proj_weight: object
    conv_weight: object
    conv_bias: object
    x_proj_weight: object
    dt_proj_weight: object
    dt_proj_bias: object
    A_log: object
    D: object
    out_proj_weight: object
    in_proj_bias: object = None
    out_proj_bias: object = None

    @property
    def d_model(self) -> int:
        return self.in_proj_weight.shape[1]

    @property
    def d_inner(self) -> int:
        return self.in_proj_weight.shape[0] // 2

    @property
    def d_state(self) -> int:
        return self.A_log.shape[1]

    @property
    def dt_rank(self) -> int:
        return self.dt_proj_weight.shape[1]

    @property
    def d_conv(self) -> int:
        return self.conv_weight.shape[1]

    @classmethod
    def from_state_dict(cls, weights, prefix: str = "") -> "Mamba1Params":
        """Build from a ``mamba_ssm.Mamba`` state dict exported as arrays.

        Parameters
        ----------
        weights : mapping of str to array
            For example ``numpy.load("layer.npz")`` or ``safetensors.numpy.load_file``,
            keyed by the PyTorch names (``in_proj.weight``, ``conv1d.weight`` ...).
        prefix : str
            Prepended to every name (``"layers.0.mixer."``).
        """
        get = _state_dict_reader(weights, prefix, "Mamba1Params.from_state_dict")
        conv = get("conv1d.weight")
        return cls(
            in_proj_weight=get("in_proj.weight"),
            # PyTorch's Conv1d weight (d_inner, 1, W) -> (d_inner, W)
            conv_weight=conv.reshape(conv.shape[0], conv.shape[-1]),
            conv_bias=get("conv1d.bias", False),
            x_proj_weight=get("x_proj.weight"),
            dt_proj_weight=get("dt_proj.weight"),
            dt_proj_bias=get("dt_proj.bias"),
            A_log=get("A_log"),
            D=get("D"),
            out_proj_weight=get("out_proj.weight"),
            in_proj_bias=get("in_proj.bias", False),
            out_proj_bias=get("out_proj.bias", False),
        )


class Mamba1State(NamedTuple):
    """Carried state of a Mamba-1 layer: conv (batch, d_inner, W - 1), ssm (batch, d_inner, N)."""

    conv: object
    ssm: object


class Mamba1Grads(NamedTuple):
    """Gradients of :func:`mamba1_vjp`: ``params`` (a :class:`Mamba1Params` of gradients),
    ``hidden``, and ``state`` (a :class:`Mamba1State`, or None when no state was passed)."""

    params: Mamba1Params
    hidden: object
    state: Optional[Mamba1State]


def mamba1_zero_state(params: Mamba1Params, batch: int, dtype=np.float32) -> Mamba1State:
    """A zero :class:`Mamba1State` for ``batch`` rows, on the device of ``params``."""
    xp = array_namespace("mamba1_zero_state", {"in_proj_weight": params.in_proj_weight})[0]
    return Mamba1State(conv=xp.zeros((batch, params.d_inner, params.d_conv - 1), dtype=dtype),
                       ssm=xp.zeros((batch, params.d_inner, params.d_state), dtype=dtype))


def _mamba1_split(p, xc):
    """x_proj: xc (batch, d_inner, L) -> delta_low (batch, L, R), B, C (batch, N, L)."""
    x_dbl = _linear(xc.transpose(0, 2, 1), p.x_proj_weight)  # (batch, L, R + 2N)
    R, N = p.dt_rank, p.d_state
    B = x_dbl[..., R:R + N].transpose(0, 2, 1)
    C = x_dbl[..., R + N:].transpose(0, 2, 1)
    return x_dbl[..., :R], B, C


def _mamba1_forward(fn, p, hidden, state, chunk_size, seq_idx, with_vjp):
    xp = array_namespace(fn, {"hidden": hidden, "in_proj_weight": p.in_proj_weight})[0]
    _check_hidden(fn, hidden, p.d_model, step=False)
    if state is not None:
        _check_state(fn, state, Mamba1State, (p.d_inner, p.d_conv - 1), (p.d_inner, p.d_state),
                     hidden.shape[0])
    di = p.d_inner
    xz = _linear(hidden, p.in_proj_weight, p.in_proj_bias)  # (batch, L, 2 d_inner)
    x = _channels_first(xz[..., :di])
    z = _channels_first(xz[..., di:])
    conv_args = dict(activation="silu", initial_state=None if state is None else state.conv,
                     seq_idx=seq_idx, return_final_state=True)
    if with_vjp:
        (xc, conv_final), conv_pb = causal_conv1d_vjp(x, p.conv_weight, p.conv_bias, **conv_args)
    else:
        xc, conv_final = causal_conv1d(x, p.conv_weight, p.conv_bias, **conv_args)
    delta_low, B, C = _mamba1_split(p, xc)
    delta = _channels_first(_linear(delta_low, p.dt_proj_weight))  # (batch, d_inner, L)
    A = -xp.exp(p.A_log)
    scan_args = dict(D=p.D, z=z, delta_bias=p.dt_proj_bias, delta_softplus=True,
                     initial_state=None if state is None else state.ssm, seq_idx=seq_idx,
                     return_final_state=True, chunk_size=chunk_size)
    if with_vjp:
        (y, ssm_final), scan_pb = selective_scan_vjp(xc, delta, A, B, C, **scan_args)
    else:
        y, ssm_final = selective_scan(xc, delta, A, B, C, **scan_args)
    y_t = y.transpose(0, 2, 1)
    out = _linear(y_t, p.out_proj_weight, p.out_proj_bias)
    final = Mamba1State(conv=conv_final, ssm=ssm_final)
    if not with_vjp:
        return out, final
    saved = dict(xp=xp, hidden=hidden, xc=xc, delta_low=delta_low, A=A, y_t=y_t,
                 conv_pb=conv_pb, scan_pb=scan_pb)
    return out, final, saved


def mamba1(params: Mamba1Params, hidden, *, state: Optional[Mamba1State] = None,
           return_state: bool = False, chunk_size: Optional[int] = None, seq_idx=None):
    """Mamba-1 layer over a sequence.

    Parameters
    ----------
    params : Mamba1Params
    hidden : array, shape (batch, L, d_model)
    state : Mamba1State, optional
        The state a previous call returned (continues that sequence); zeros when None.
    return_state : bool
        Also return the :class:`Mamba1State` after the last step.
    chunk_size : int, optional
        Passed to :func:`ssmkit.selective_scan`.
    seq_idx : int array, shape (batch, L), optional
        Packed sequences: the convolution and the scan restart where it changes
        (``state`` feeds the first sequence of each row).

    Returns
    -------
    out : array, shape (batch, L, d_model)
    state : Mamba1State
        Only with ``return_state=True``.
    """
    out, final = _mamba1_forward("mamba1", params, hidden, state, chunk_size, seq_idx,
                                 with_vjp=False)
    return (out, final) if return_state else out


def mamba1_vjp(params: Mamba1Params, hidden, *, state: Optional[Mamba1State] = None,
               return_state: bool = False, chunk_size: Optional[int] = None, seq_idx=None):
    """:func:`mamba1` and its pullback.

    Returns
    -------
    out
        Exactly what :func:`mamba1` returns.
    pullback : callable
        ``pullback(dout, dstate=None)`` -> :class:`Mamba1Grads`. ``dstate`` is a
        :class:`Mamba1State` of cotangents (either field may be None); only with
        ``return_state=True``. Gradients of ``A_log`` go through ``A = -exp(A_log)``.
    """
    fn = "mamba1_vjp"
    out, final, s = _mamba1_forward(fn, params, hidden, state, chunk_size, seq_idx,
                                    with_vjp=True)
    p = params

    def pullback(dout, dstate=None):
        dstate = dstate if dstate is not None else Mamba1State(None, None)
        dy_t, dW_out, db_out = _linear_vjp(dout, s["y_t"], p.out_proj_weight, p.out_proj_bias)
        g = s["scan_pb"](_channels_first(dy_t), dstate.ssm)
        dA_log = g.A * s["A"]
        # delta = dt_proj(delta_low); x_dbl = x_proj(xc) = [delta_low, B^T, C^T]
        ddelta_low, dW_dt, _ = _linear_vjp(g.delta.transpose(0, 2, 1), s["delta_low"],
                                           p.dt_proj_weight, None)
        dx_dbl = s["xp"].concatenate(
            [ddelta_low, g.B.transpose(0, 2, 1), g.C.transpose(0, 2, 1)], axis=-1)
        dxc_t, dW_x, _ = _linear_vjp(dx_dbl, s["xc"].transpose(0, 2, 1), p.x_proj_weight, None)
        dxc = g.u + _channels_first(dxc_t)
        gc = s["conv_pb"](dxc, dstate.conv)
        dxz = s["xp"].concatenate([gc.x.transpose(0, 2, 1), g.z.transpose(0, 2, 1)], axis=-1)
        dhidden, dW_in, db_in = _linear_vjp(dxz, s["hidden"], p.in_proj_weight, p.in_proj_bias)
        grads = Mamba1Params(
            in_proj_weight=dW_in, conv_weight=gc.weight, conv_bias=gc.bias,
            x_proj_weight=dW_x, dt_proj_weight=dW_dt, dt_proj_bias=g.delta_bias,
            A_log=dA_log, D=g.D, out_proj_weight=dW_out,
            in_proj_bias=db_in, out_proj_bias=db_out)
        dstate0 = None if state is None else Mamba1State(conv=gc.initial_state,
                                                        ssm=g.initial_state)
        return Mamba1Grads(params=grads, hidden=dhidden, state=dstate0)

    return ((out, final) if return_state else out), pullback


def mamba1_step(params: Mamba1Params, hidden, state: Mamba1State):
    """One decoding step of the Mamba-1 layer; ``state`` is updated in place.

    Parameters
    ----------
    params : Mamba1Params
    hidden : array, shape (batch, d_model)
        One token per row.
    state : Mamba1State
        conv (batch, d_inner, W - 1), ssm (batch, d_inner, N); from
        :func:`mamba1_zero_state` or ``mamba1(..., return_state=True)``.

    Returns
    -------
    out : array, shape (batch, d_model)
    """
    fn = "mamba1_step"
    conv_state = state.conv if isinstance(state, Mamba1State) else None
    xp = array_namespace(fn, {"hidden": hidden, "in_proj_weight": params.in_proj_weight,
                              "state.conv": conv_state})[0]
    _check_hidden(fn, hidden, params.d_model, step=True)
    p = params
    # Checked before anything is written, so a refused call leaves the state as it was.
    _check_state(fn, state, Mamba1State, (p.d_inner, p.d_conv - 1), (p.d_inner, p.d_state),
                 hidden.shape[0])
    di, R, N = p.d_inner, p.dt_rank, p.d_state
    xz = _linear(hidden, p.in_proj_weight, p.in_proj_bias)
    x, z = xp.ascontiguousarray(xz[:, :di]), xp.ascontiguousarray(xz[:, di:])
    xc = causal_conv1d_update(x, state.conv, p.conv_weight, p.conv_bias, activation="silu")
    x_dbl = _linear(xc, p.x_proj_weight)
    delta = _linear(x_dbl[:, :R], p.dt_proj_weight)
    B = xp.ascontiguousarray(x_dbl[:, R:R + N])
    C = xp.ascontiguousarray(x_dbl[:, R + N:])
    y = state_update(state.ssm, xc, xp.ascontiguousarray(delta), -xp.exp(p.A_log), B, C,
                     D=p.D, z=z, dt_bias=p.dt_proj_bias, dt_softplus=True)
    return _linear(y, p.out_proj_weight, p.out_proj_bias)


# ----------------------------------------------------------------------------- Mamba-2

@dataclasses.dataclass(frozen=True)
class Mamba2Params:
    """Weights of a Mamba-2 layer (``mamba_ssm.Mamba2``), as plain arrays.

    Shapes use H heads of P = headdim channels (d_inner = H * P), G = ngroups,
    N = d_state, W = d_conv, conv_dim = d_inner + 2 * G * N, and d_mlp, the width
    of the optional gated MLP branch (0 in the usual configurations).

    Attributes
    ----------
    in_proj_weight : (2 * d_mlp + 2 * d_inner + 2 * G * N + H, d_model)
        Rows in the order [z0, x0, z, x, B, C, dt] (z0, x0 only when d_mlp > 0).
    conv_weight : (conv_dim, W)
    conv_bias : (conv_dim,) or None
    dt_bias : (H,)
    A_log : (H,); A = -exp(A_log)
    D : (H,) or (H, P)
    norm_weight : (d_inner,) or None
        The gated RMSNorm's weight; None for a layer without it (then y * silu(z)).
    out_proj_weight : (d_model, d_inner + d_mlp)
    headdim : int
        P.
    ngroups : int
        G.
    dt_limit : (float, float)
    norm_eps : float
    in_proj_bias, out_proj_bias : arrays or None
    """

    in_proj_weight: object
    conv_weight: object
    conv_bias: object
    dt_bias: object
    A_log: object
    D: object
    norm_weight: object
    out_proj_weight: object
    headdim: int = 64
    ngroups: int = 1
    dt_limit: tuple = (0.0, float("inf"))
    norm_eps: float = 1e-5
    in_proj_bias: object = None
    out_proj_bias: object = None

    @property
    def nheads(self) -> int:
        return self.A_log.shape[0]

    @property
    def d_inner(self) -> int:
        return self.nheads * self.headdim

    @property
    def d_model(self) -> int:
        return self.in_proj_weight.shape[1]

    @property
    def conv_dim(self) -> int:
        return self.conv_weight.shape[0]

    @property
    def d_state(self) -> int:
        return (self.conv_dim - self.d_inner) // (2 * self.ngroups)

    @property
    def d_mlp(self) -> int:
        rest = self.in_proj_weight.shape[0] - 2 * self.d_inner - 2 * self.ngroups * self.d_state
        return (rest - self.nheads) // 2

    @property
    def d_conv(self) -> int:
        return self.conv_weight.shape[1]

    def check(self, fn: str) -> None:
        """Raise ValueError when the shapes do not fit together."""
        H, P, G = self.nheads, self.headdim, self.ngroups
        extra = self.conv_dim - self.d_inner
        if P < 1 or G < 1 or H % G or extra <= 0 or extra % (2 * G):
            raise ValueError(
                f"{fn}: Mamba2Params shapes do not fit: heads {H}, headdim {P}, ngroups {G}, "
                f"conv_dim {self.conv_dim}; expected conv_dim = heads*headdim + 2*ngroups*d_state "
                f"and ngroups dividing heads")
        if self.d_mlp < 0 or self.in_proj_weight.shape[0] != (
                2 * self.d_mlp + 2 * self.d_inner + 2 * G * self.d_state + H):
            raise ValueError(f"{fn}: in_proj_weight has {self.in_proj_weight.shape[0]} rows; "
                             f"expected 2*d_mlp + 2*d_inner + 2*ngroups*d_state + heads")

    @classmethod
    def from_state_dict(cls, weights, prefix: str = "", *, headdim: int, ngroups: int = 1,
                        dt_limit=(0.0, float("inf")), norm_eps: float = 1e-5) -> "Mamba2Params":
        """Build from a ``mamba_ssm.Mamba2`` state dict exported as arrays.

        The configuration the weights do not determine (``headdim``, ``ngroups``,
        ``dt_limit``, ``norm_eps``) is passed as in the PyTorch constructor.
        """
        get = _state_dict_reader(weights, prefix, "Mamba2Params.from_state_dict")
        conv = get("conv1d.weight")
        params = cls(
            in_proj_weight=get("in_proj.weight"),
            conv_weight=conv.reshape(conv.shape[0], conv.shape[-1]),
            conv_bias=get("conv1d.bias", False),
            dt_bias=get("dt_bias"), A_log=get("A_log"), D=get("D"),
            norm_weight=get("norm.weight", False),
            out_proj_weight=get("out_proj.weight"),
            headdim=headdim, ngroups=ngroups, dt_limit=tuple(dt_limit), norm_eps=norm_eps,
            in_proj_bias=get("in_proj.bias", False), out_proj_bias=get("out_proj.bias", False))
        params.check("Mamba2Params.from_state_dict")
        return params


class Mamba2State(NamedTuple):
    """Carried state of a Mamba-2 layer: conv (batch, conv_dim, W - 1), ssm (batch, H, P, N)."""

    conv: object
    ssm: object


class Mamba2Grads(NamedTuple):
    """Gradients of :func:`mamba2_vjp`, as in :class:`Mamba1Grads`."""

    params: Mamba2Params
    hidden: object
    state: Optional[Mamba2State]


def mamba2_zero_state(params: Mamba2Params, batch: int, dtype=np.float32) -> Mamba2State:
    """A zero :class:`Mamba2State` for ``batch`` rows, on the device of ``params``."""
    xp = array_namespace("mamba2_zero_state", {"in_proj_weight": params.in_proj_weight})[0]
    p = params
    return Mamba2State(conv=xp.zeros((batch, p.conv_dim, p.d_conv - 1), dtype=dtype),
                       ssm=xp.zeros((batch, p.nheads, p.headdim, p.d_state), dtype=dtype))


def _gated_rmsnorm(xp, y, z, w, groups, eps):
    """Mamba-2's gated RMSNorm (gate first): rmsnorm(y * silu(z)) * w, per group of channels.

    y, z (..., d_inner) -> (out in y's dtype, intermediates saved for the VJP).
    """
    ct = _compute_dtype(y)
    yf, zf = y.astype(ct), z.astype(ct)
    sig = _sigmoid(xp, zf)
    g = yf * zf * sig
    shape = g.shape
    gg = g.reshape(shape[:-1] + (groups, shape[-1] // groups))
    r = 1.0 / xp.sqrt((gg * gg).mean(axis=-1, keepdims=True) + eps)
    gn = (gg * r).reshape(shape)
    out = (gn * w.astype(ct)).astype(y.dtype)
    return out, (yf, zf, sig, gn, r)


def _gated_rmsnorm_vjp(xp, dout, w, groups, saved):
    """Gradients (dy, dz, dw) of :func:`_gated_rmsnorm`."""
    yf, zf, sig, gn, r = saved
    d = dout.astype(yf.dtype)
    dw = (d * gn).reshape(-1, gn.shape[-1]).sum(axis=0)
    dgn = d * w.astype(yf.dtype)
    shape = gn.shape
    split = shape[:-1] + (groups, shape[-1] // groups)
    dgn_g, gn_g = dgn.reshape(split), gn.reshape(split)
    # gn = g * r with r = 1/sqrt(mean(g^2) + eps): dg = r * (dgn - gn * mean(dgn * gn))
    dg = (r * (dgn_g - gn_g * (dgn_g * gn_g).mean(axis=-1, keepdims=True))).reshape(shape)
    silu_z = zf * sig
    dy = dg * silu_z
    dz = dg * yf * sig * (1.0 + zf * (1.0 - sig))
    return dy, dz, dw


def _mamba2_sizes(p):
    di, G, N, H = p.d_inner, p.ngroups, p.d_state, p.nheads
    m = p.d_mlp
    # in_proj rows: [z0 (m), x0 (m), z (di), xBC (di + 2GN), dt (H)]
    bounds = np.cumsum([0, m, m, di, di + 2 * G * N, H])
    return di, G, N, H, m, bounds


def _mamba2_forward(fn, p, hidden, state, chunk_size, seq_idx, with_vjp, allow_tf32=False):
    xp = array_namespace(fn, {"hidden": hidden, "in_proj_weight": p.in_proj_weight})[0]
    p.check(fn)
    _check_hidden(fn, hidden, p.d_model, step=False)
    di, G, N, H, m, bnd = _mamba2_sizes(p)
    P = p.headdim
    if state is not None:
        _check_state(fn, state, Mamba2State, (p.conv_dim, p.d_conv - 1), (H, P, N),
                     hidden.shape[0])
    batch, L, _ = hidden.shape
    zxbcdt = _linear(hidden, p.in_proj_weight, p.in_proj_bias)
    z0, x0, z = zxbcdt[..., bnd[0]:bnd[1]], zxbcdt[..., bnd[1]:bnd[2]], zxbcdt[..., bnd[2]:bnd[3]]
    xBC = _channels_first(zxbcdt[..., bnd[3]:bnd[4]])
    dt = xp.ascontiguousarray(zxbcdt[..., bnd[4]:bnd[5]])
    conv_args = dict(activation="silu", initial_state=None if state is None else state.conv,
                     seq_idx=seq_idx, return_final_state=True)
    if with_vjp:
        (xBCc, conv_final), conv_pb = causal_conv1d_vjp(xBC, p.conv_weight, p.conv_bias,
                                                        **conv_args)
    else:
        xBCc, conv_final = causal_conv1d(xBC, p.conv_weight, p.conv_bias, **conv_args)
    xBC_t = xBCc.transpose(0, 2, 1)  # (batch, L, conv_dim)
    x = xp.ascontiguousarray(xBC_t[..., :di]).reshape(batch, L, H, P)
    B = xp.ascontiguousarray(xBC_t[..., di:di + G * N]).reshape(batch, L, G, N)
    C = xp.ascontiguousarray(xBC_t[..., di + G * N:]).reshape(batch, L, G, N)
    A = -xp.exp(p.A_log)
    gate_in_scan = p.norm_weight is None
    scan_args = dict(chunk_size=chunk_size if chunk_size is not None else 256, D=p.D,
                     z=xp.ascontiguousarray(z).reshape(batch, L, H, P) if gate_in_scan else None,
                     dt_bias=p.dt_bias, dt_softplus=True, dt_limit=tuple(p.dt_limit),
                     initial_state=None if state is None else state.ssm, seq_idx=seq_idx,
                     return_final_state=True, allow_tf32=allow_tf32)
    if with_vjp:
        (y, ssm_final), scan_pb = ssd_vjp(x, dt, A, B, C, **scan_args)
    else:
        y, ssm_final = ssd(x, dt, A, B, C, **scan_args)
    y = y.reshape(batch, L, di)
    norm_saved = None
    if not gate_in_scan:
        y, norm_saved = _gated_rmsnorm(xp, y, z, p.norm_weight, G, p.norm_eps)
    if m:
        ct = _compute_dtype(z0)
        z0f = z0.astype(ct)
        mlp = (x0.astype(ct) * z0f * _sigmoid(xp, z0f)).astype(y.dtype)
        y = xp.concatenate([mlp, y], axis=-1)
    out = _linear(y, p.out_proj_weight, p.out_proj_bias)
    final = Mamba2State(conv=conv_final, ssm=ssm_final)
    if not with_vjp:
        return out, final
    saved = dict(xp=xp, hidden=hidden, zxbcdt=zxbcdt, y=y, A=A, conv_pb=conv_pb,
                 scan_pb=scan_pb, norm_saved=norm_saved)
    return out, final, saved


def mamba2(params: Mamba2Params, hidden, *, state: Optional[Mamba2State] = None,
           return_state: bool = False, chunk_size: Optional[int] = None, seq_idx=None,
           allow_tf32: bool = False):
    """Mamba-2 layer over a sequence.

    Parameters
    ----------
    params : Mamba2Params
    hidden : array, shape (batch, L, d_model)
    state : Mamba2State, optional
        The state a previous call returned (continues that sequence); zeros when None.
    return_state : bool
        Also return the :class:`Mamba2State` after the last step.
    chunk_size : int, optional
        Passed to :func:`ssmkit.ssd` (default 256).
    seq_idx : int array, shape (batch, L), optional
        Packed sequences: the convolution and the scan restart where it changes.
    allow_tf32 : bool
        Passed to :func:`ssmkit.ssd`: float32 scan products as single TF32 products on the
        GPU (faster, about 1e-3 relative error).

    Returns
    -------
    out : array, shape (batch, L, d_model)
    state : Mamba2State
        Only with ``return_state=True``.
    """
    out, final = _mamba2_forward("mamba2", params, hidden, state, chunk_size, seq_idx, False,
                                 allow_tf32)
    return (out, final) if return_state else out


def mamba2_vjp(params: Mamba2Params, hidden, *, state: Optional[Mamba2State] = None,
               return_state: bool = False, chunk_size: Optional[int] = None, seq_idx=None,
               allow_tf32: bool = False):
    """:func:`mamba2` and its pullback; ``pullback(dout, dstate=None)`` -> :class:`Mamba2Grads`."""
    fn = "mamba2_vjp"
    out, final, s = _mamba2_forward(fn, params, hidden, state, chunk_size, seq_idx, True,
                                    allow_tf32)
    p = params
    xp = s["xp"]
    di, G, N, H, m, bnd = _mamba2_sizes(p)
    P = p.headdim

    def pullback(dout, dstate=None):
        dstate = dstate if dstate is not None else Mamba2State(None, None)
        batch, L, _ = dout.shape
        zx = s["zxbcdt"]
        dy, dW_out, db_out = _linear_vjp(dout, s["y"], p.out_proj_weight, p.out_proj_bias)
        dz0 = dx0 = None
        if m:
            dmlp, dy = dy[..., :m], dy[..., m:]
            ct = _compute_dtype(zx)
            z0 = zx[..., bnd[0]:bnd[1]].astype(ct)
            sig0 = _sigmoid(xp, z0)
            dmlp = dmlp.astype(ct)
            dx0 = dmlp * z0 * sig0
            dz0 = dmlp * zx[..., bnd[1]:bnd[2]].astype(ct) * sig0 * (1.0 + z0 * (1.0 - sig0))
        dnorm_w = dz = None
        if s["norm_saved"] is not None:
            dy, dz, dnorm_w = _gated_rmsnorm_vjp(xp, dy, p.norm_weight, G, s["norm_saved"])
            dnorm_w = dnorm_w.astype(p.norm_weight.dtype)
        g = s["scan_pb"](dy.astype(s["y"].dtype).reshape(batch, L, H, P), dstate.ssm)
        if dz is None:
            dz = g.z.reshape(batch, L, di)
        dA_log = g.A * s["A"]
        dxBC_t = xp.concatenate([g.x.reshape(batch, L, di), g.B.reshape(batch, L, G * N),
                                 g.C.reshape(batch, L, G * N)], axis=-1)
        gc = s["conv_pb"](_channels_first(dxBC_t), dstate.conv)
        parts = [] if not m else [dz0, dx0]
        parts += [dz, gc.x.transpose(0, 2, 1), g.dt]
        dzx = xp.concatenate([q.astype(zx.dtype) for q in parts], axis=-1)
        dhidden, dW_in, db_in = _linear_vjp(dzx, s["hidden"], p.in_proj_weight, p.in_proj_bias)
        grads = dataclasses.replace(
            p, in_proj_weight=dW_in, conv_weight=gc.weight, conv_bias=gc.bias,
            dt_bias=g.dt_bias, A_log=dA_log, D=g.D, norm_weight=dnorm_w,
            out_proj_weight=dW_out, in_proj_bias=db_in, out_proj_bias=db_out)
        dstate0 = None if state is None else Mamba2State(conv=gc.initial_state,
                                                        ssm=g.initial_state)
        return Mamba2Grads(params=grads, hidden=dhidden, state=dstate0)

    return ((out, final) if return_state else out), pullback


def mamba2_step(params: Mamba2Params, hidden, state: Mamba2State):
    """One decoding step of the Mamba-2 layer; ``state`` is updated in place.

    Parameters
    ----------
    params : Mamba2Params
    hidden : array, shape (batch, d_model)
    state : Mamba2State
        conv (batch, conv_dim, W - 1), ssm (batch, H, P, N).

    Returns
    -------
    out : array, shape (batch, d_model)
    """
    fn = "mamba2_step"
    conv_state = state.conv if isinstance(state, Mamba2State) else None
    xp = array_namespace(fn, {"hidden": hidden, "in_proj_weight": params.in_proj_weight,
                              "state.conv": conv_state})[0]
    p = params
    p.check(fn)
    _check_hidden(fn, hidden, p.d_model, step=True)
    di, G, N, H, m, bnd = _mamba2_sizes(p)
    P = p.headdim
    # Checked before anything is written, so a refused call leaves the state as it was.
    _check_state(fn, state, Mamba2State, (p.conv_dim, p.d_conv - 1), (H, P, N), hidden.shape[0])
    batch = hidden.shape[0]
    zx = _linear(hidden, p.in_proj_weight, p.in_proj_bias)
    z = xp.ascontiguousarray(zx[:, bnd[2]:bnd[3]])
    xBC = causal_conv1d_update(xp.ascontiguousarray(zx[:, bnd[3]:bnd[4]]), state.conv,
                               p.conv_weight, p.conv_bias, activation="silu")
    x = xp.ascontiguousarray(xBC[:, :di]).reshape(batch, H, P)
    B = xp.ascontiguousarray(xBC[:, di:di + G * N]).reshape(batch, G, N)
    C = xp.ascontiguousarray(xBC[:, di + G * N:]).reshape(batch, G, N)
    # dt' = clip(softplus(dt + dt_bias), dt_limit), per head, computed as the sequence mode does.
    ct = _compute_dtype(zx)
    dt = zx[:, bnd[4]:bnd[5]].astype(ct) + p.dt_bias.astype(ct)
    dt = xp.clip(_softplus(xp, dt), p.dt_limit[0], p.dt_limit[1])
    dt_hp = xp.broadcast_to(dt.astype(x.dtype)[:, :, None], (batch, H, P))
    A_hpn = xp.broadcast_to((-xp.exp(p.A_log))[:, None, None], (H, P, N))
    D_hp = xp.broadcast_to(p.D if p.D.ndim == 2 else p.D[:, None], (H, P))
    gate_in_scan = p.norm_weight is None
    y = state_update(state.ssm, x, dt_hp, A_hpn, B, C, D=D_hp,
                     z=z.reshape(batch, H, P) if gate_in_scan else None)
    y = y.reshape(batch, di)
    if not gate_in_scan:
        y, _ = _gated_rmsnorm(xp, y, z, p.norm_weight, G, p.norm_eps)
    if m:
        z0 = zx[:, bnd[0]:bnd[1]].astype(ct)
        mlp = (zx[:, bnd[1]:bnd[2]].astype(ct) * z0 * _sigmoid(xp, z0)).astype(y.dtype)
        y = xp.concatenate([mlp, y], axis=-1)
    return _linear(y, p.out_proj_weight, p.out_proj_bias)
