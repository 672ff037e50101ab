"""Numba kernels for the Mamba-1 selective scan on NumPy arrays.

The public layer hands over a :class:`ssmkit._problem.SelectiveScanProblem`;
this module implements the backend contract stated in ``ssmkit._problem``:
:func:`selective_scan_forward` and :func:`selective_scan_backward`.

Layout of the work
------------------
The scan is sequential in time and independent across the ``batch * dim``
channels, so the SIMD lanes run over channels: a *block* is up to ``_LANES``
consecutive channels of one batch row, holding its state as an
``(N, lanes)`` array, and every inner loop is an elementwise loop over the
lanes. LLVM vectorises those without reassociating anything (the kernels are
compiled with ``fastmath=False``): the sums over ``n`` (``y_t``, ``du_t``,
``ddelta_t``) are per-lane accumulations in the order of ``n``, exactly as
written. Three details keep the loops vectorised:

* exponentials go through :func:`_exp` and :func:`_softplus`, branch-free
  polynomial versions (libm's are opaque calls that keep a loop scalar);
* ``error_model="numpy"``: a float division does not test for zero (the
  Python error model's test is a branch out of the loop);
* the lane count is a run-time argument: with a compile-time count LLVM unrolls
  the lane loops completely and can then no longer prove the scratch arrays
  disjoint, leaving them scalar; as loops, the vectoriser versions them with a
  run-time overlap check.

Blocks never straddle a group of a per-step ``B`` or ``C``, so the ``B_t`` and
``C_t`` of a block are one row each, the same on every lane.

Checkpoints and the backward
----------------------------
``checkpoints`` is a ``(batch, dim, n_chunks, N)`` array of the compute dtype:
``checkpoints[b, d, c]`` is the state entering step ``c * chunk_size``. The
backward walks the chunks in reverse; for each it recomputes the chunk's
states from its checkpoint into a ``(chunk_size + 1, N, lanes)`` buffer and
runs the adjoint recurrence back through it (the decays ``exp(dt A)`` are
recomputed rather than stored: half the scratch, which then stays in cache).
Where a chunk is long enough that its scratch would leave the caches, the
backward first reruns the forward for finer checkpoints (``_backward_chunk``).

Determinism
-----------
No two parallel iterations write the same element. Per-channel results
(``du``, ``ddelta``, ``dz``, ``dinitial_state``) are written by the block of
the channel. Sums over the batch (``dA``, ``dD``, ``ddelta_bias`` and the
``(dim, N)`` forms of ``dB``/``dC``) are written as per-``(b, d)`` partials and
summed over ``b`` in order afterwards. The per-step ``dB``/``dC`` sum over the
channels of a group: a parallel *unit* owns whole groups of one batch row (all
groups, of both ``B`` and ``C``, that its channels touch), or a fixed slice of
their blocks adding into a private copy when that gives too few units, and
walks its blocks in order; the lanes of a block are summed by a fixed pairwise
tree. The order of every sum depends on the shapes only, never on the thread
count or on timing.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from llvmlite import ir
import numba
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from .. import _selective_scan_packed as _packed

__all__ = ["selective_scan_forward", "selective_scan_backward"]

_LANES = 64  # channels per block (a power of two): the vector loops' trip count
_TILE = 256  # forward steps staged at once
_TARGET_UNITS = 32  # backward: split groups into slices until there are this many units
# The backward recomputes a chunk's states into per-block scratch: past _WHOLE_CHUNK_BYTES
# of it (a chunk of 8192 steps at N 16 is 56 MB a thread) the scratch leaves the caches and
# costs more than a second forward, so the backward then runs on finer checkpoints,
# _RUN_BYTES of scratch apart (_backward_chunk; benchmarks/NOTES.md, "CPU").
_WHOLE_CHUNK_BYTES = 32 << 20
_RUN_BYTES = 2 << 20

_KERNEL_OPTIONS = dict(cache=True, fastmath=False, error_model="numpy")


# --------------------------------------------------------------------------------------
# Vectorisable elementary functions
# --------------------------------------------------------------------------------------

@intrinsic
def _bits_to_float32(typingctx, bits):
    """Reinterpret the low 32 bits of an integer as a float32."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        v = args[0]
        if v.type.width > 32:
            v = builder.trunc(v, ir.IntType(32))
        elif v.type.width < 32:
            v = builder.sext(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def _bits_to_float64(typingctx, bits):
    """Reinterpret a (sign-extended) 64-bit integer as a float64."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        v = args[0]
        if v.type.width < 64:
            v = builder.sext(v, ir.IntType(64))
        return builder.bitcast(v, ir.DoubleType())

    return types.float64(bits), codegen


@intrinsic
def _fma(typingctx, a, b, c):
    """``a * b + c`` rounded once (``llvm.fma``): half the work of a polynomial step.

    An explicit FMA is an IEEE operation of its own, not a licence to reassociate:
    the kernels stay ``fastmath=False``.
    """
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return a(a, b, c), codegen


@intrinsic
def _float_bits(typingctx, x):
    """The bits of a float32 as an int32, of a float64 as an int64."""
    if x == types.float32:
        width = 32
    elif x == types.float64:
        width = 64
    else:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(width))

    return getattr(types, f"int{width}")(x), codegen


@njit(forceinline=True, **_KERNEL_OPTIONS)
def _exp32(x):
    # exp(x) = 2^k exp(r), k = round(x / ln2), r = x - k ln2 in [-ln2/2, ln2/2].
    # - k: adding 1.5 * 2^23 rounds x / ln2 to an integer, which is then the low bits
    #   of the sum (no float-to-int conversion, no floor);
    # - r: Cody-Waite, ln2 in two parts, the first exact times any k here, by FMAs;
    # - exp(r) = 1 + r q(r), q of degree 5 fitted for relative error (1.7e-8 with its
    #   float32 coefficients): one FMA less than the Taylor series to r^7;
    # - 2^k exp(r) by adding k to the exponent field of exp(r): the sum's bits shifted
    #   left by 23 are k << 23 (the shift drops the rest). Exact while the result is a
    #   normal float, which the clamp to [-126 ln2, log(max float)] keeps it; outside
    #   it one select takes max(x, 0) 2^127: 0 below (no denormals), inf above, and
    #   NaN for NaN. 4 instructions and a select where a scale by two normal factors
    #   (denormals kept) took 14: the forward 8% faster.
    xc = np.float32(-87.33654) if x < np.float32(-87.33654) else x
    xc = np.float32(88.72283) if xc > np.float32(88.72283) else xc
    shifted = _fma(xc, np.float32(1.4426950408889634), np.float32(12582912.0))
    kf = shifted - np.float32(12582912.0)
    r = _fma(kf, np.float32(-0.693359375), xc)
    r = _fma(kf, np.float32(2.12194440e-4), r)
    q = np.float32(0.0013859294122084975)
    q = _fma(q, r, np.float32(0.008374763652682304))
    q = _fma(q, r, np.float32(0.04166772589087486))
    q = _fma(q, r, np.float32(0.1666642129421234))
    q = _fma(q, r, np.float32(0.4999999403953552))
    q = _fma(q, r, np.float32(1.0))
    p = _fma(q, r, np.float32(1.0))
    y = _bits_to_float32(_float_bits(p) + (_float_bits(shifted) << 23))
    pos = np.float32(0.0) if x < np.float32(0.0) else x  # (NaN stays NaN)
    return y if x == xc else pos * np.float32(1.7014118346046923e38)


@njit(forceinline=True, **_KERNEL_OPTIONS)
def _exp64(x):
    # As _exp32: the shift 1.5 * 2^52, the fdlibm split of ln2, the clamp to
    # [-1022 ln2, log(max double)], and exp(r) = 1 + r q(r) with q of degree 10 fitted
    # (Chebyshev, mpmath; 1.8e-17 relative on [-ln2/2, ln2/2]): two FMAs less than the
    # Taylor series to r^13.
    xc = -708.3964185322641 if x < -708.3964185322641 else x
    xc = 709.782712893384 if xc > 709.782712893384 else xc
    shifted = _fma(xc, 1.4426950408889634, 6755399441055744.0)
    kf = shifted - 6755399441055744.0
    r = _fma(kf, -6.93147180369123816490e-01, xc)
    r = _fma(kf, -1.90821492927058770002e-10, r)
    q = 2.5105312729622103e-08
    q = _fma(q, r, 2.7626495546432196e-07)
    q = _fma(q, r, 2.755725517000089e-06)
    q = _fma(q, r, 2.4801504014426906e-05)
    q = _fma(q, r, 0.0001984126987500228)
    q = _fma(q, r, 0.0013888888932751)
    q = _fma(q, r, 0.008333333333326084)
    q = _fma(q, r, 0.04166666666657239)
    q = _fma(q, r, 0.1666666666666667)
    q = _fma(q, r, 0.5000000000000006)
    q = _fma(q, r, 1.0)
    p = _fma(q, r, 1.0)
    y = _bits_to_float64(_float_bits(p) + (_float_bits(shifted) << 52))
    pos = 0.0 if x < 0.0 else x
    return y if x == xc else pos * 8.98846567431158e307


@njit(forceinline=True, **_KERNEL_OPTIONS)
def _softplus32(x):
    # log(1 + e^x) = max(x, 0) + log1p(y), y = e^-|x| in (0, 1], and
    # log1p(y) = 2 atanh(s), s = y / (2 + y) in (0, 1/3]: the odd series in s to
    # s^15 (next term < 2^-26 relative), accurate for tiny y where log(1 + y) is not.
    y = _exp32(-abs(x))
    s = y / (np.float32(2.0) + y)
    s2 = s * s
    q = np.float32(1.0 / 15.0)
    q = _fma(q, s2, np.float32(1.0 / 13.0))
    q = _fma(q, s2, np.float32(1.0 / 11.0))
    q = _fma(q, s2, np.float32(1.0 / 9.0))
    q = _fma(q, s2, np.float32(1.0 / 7.0))
    q = _fma(q, s2, np.float32(1.0 / 5.0))
    q = _fma(q, s2, np.float32(1.0 / 3.0))
    q = _fma(q, s2, np.float32(1.0))
    pos = x if x > np.float32(0.0) else np.float32(0.0)
    res = pos + np.float32(2.0) * s * q
    return x if x > np.float32(20.0) else res


@njit(forceinline=True, **_KERNEL_OPTIONS)
def _softplus64(x):
    # As _softplus32, the series to s^31 (next term < 2^-56 relative).
    y = _exp64(-abs(x))
    s = y / (2.0 + y)
    s2 = s * s
    q = 1.0 / 31.0
    q = _fma(q, s2, 1.0 / 29.0)
    q = _fma(q, s2, 1.0 / 27.0)
    q = _fma(q, s2, 1.0 / 25.0)
    q = _fma(q, s2, 1.0 / 23.0)
    q = _fma(q, s2, 1.0 / 21.0)
    q = _fma(q, s2, 1.0 / 19.0)
    q = _fma(q, s2, 1.0 / 17.0)
    q = _fma(q, s2, 1.0 / 15.0)
    q = _fma(q, s2, 1.0 / 13.0)
    q = _fma(q, s2, 1.0 / 11.0)
    q = _fma(q, s2, 1.0 / 9.0)
    q = _fma(q, s2, 1.0 / 7.0)
    q = _fma(q, s2, 1.0 / 5.0)
    q = _fma(q, s2, 1.0 / 3.0)
    q = _fma(q, s2, 1.0)
    pos = x if x > 0.0 else 0.0
    res = pos + 2.0 * s * q
    return x if x > 20.0 else res


@njit(forceinline=True, **_KERNEL_OPTIONS)
def _sigmoid32(x):
    return np.float32(1.0) / (np.float32(1.0) + _exp32(-x))


@njit(forceinline=True, **_KERNEL_OPTIONS)
def _sigmoid64(x):
    return 1.0 / (1.0 + _exp64(-x))


def _precision_generic(name, impl32, impl64):
    """A function for kernels that runs ``impl32`` on float32 and ``impl64`` on float64.

    The choice is made when the calling kernel is typed; the float32 version keeps
    float32 arithmetic throughout. Called from Python, the function refuses.
    """
    def generic(x):
        raise TypeError(f"{name} is only callable inside Numba kernels")

    generic.__name__ = generic.__qualname__ = name

    @overload(generic, jit_options=dict(forceinline=True, **_KERNEL_OPTIONS))
    def _overload(x):
        if x == types.float32:
            return lambda x: impl32(x)
        if x == types.float64:
            return lambda x: impl64(x)
        return None

    return generic


_exp = _precision_generic("_exp", _exp32, _exp64)
_softplus = _precision_generic("_softplus", _softplus32, _softplus64)  # threshold 20
_sigmoid = _precision_generic("_sigmoid", _sigmoid32, _sigmoid64)


@njit(**_KERNEL_OPTIONS)
def _elementary_check(x, y_exp, y_softplus, y_sigmoid):
    """Apply :func:`_exp`, :func:`_softplus` and :func:`_sigmoid` (for the tests)."""
    for i in range(x.size):
        y_exp[i] = _exp(x[i])
        y_softplus[i] = _softplus(x[i])
        y_sigmoid[i] = _sigmoid(x[i])


# --------------------------------------------------------------------------------------
# Pieces shared by forward and backward
# --------------------------------------------------------------------------------------

@njit(**_KERNEL_OPTIONS)
def _lane_params(d0, kk, A, B4, C4, D, bias, b_step, c_step, has_D, A_l, B_l, C_l, D_l,
                 bias_l):
    """Spread the per-channel parameters of lanes ``d0 .. d0 + kk - 1`` over the lanes.

    ``A_l``, ``B_l``, ``C_l`` are (N, lanes); a per-step B or C leaves its ``X_l`` zero
    (its rows come through :func:`_stage_bc` instead). Lanes at and above ``kk`` stay
    zero, so they carry a zero state and add exact zeros to every sum over lanes.
    """
    N = A.shape[1]
    A_l[:] = 0
    B_l[:] = 0
    C_l[:] = 0
    D_l[:] = 0
    bias_l[:] = 0
    for k in range(kk):
        d = d0 + k
        for n in range(N):
            A_l[n, k] = A[d, n]
        if not b_step:
            for n in range(N):
                B_l[n, k] = B4[0, d, n, 0]
        if not c_step:
            for n in range(N):
                C_l[n, k] = C4[0, d, n, 0]
        if has_D:
            D_l[k] = D[d]
        bias_l[k] = bias[d]


# --------------------------------------------------------------------------------------
# Prefetch
# --------------------------------------------------------------------------------------

def _prefetch_intrinsic(write):
    """An intrinsic ``f(arr, offset)``: prefetch the cache line ``offset`` bytes into ``arr``.

    The staging reads and writes rows of up to 64 channels at once, more streams than the
    hardware prefetchers follow; the kernels name the next tile's lines ahead of time
    instead. A prefetch never faults, so any offset is safe.
    """
    @intrinsic
    def prefetch(typingctx, arr, offset):
        if not isinstance(arr, types.Array) or not isinstance(offset, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            data = context.make_array(signature.args[0])(context, builder, args[0]).data
            i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                "llvm.prefetch.p0")
            ptr = builder.gep(builder.bitcast(data, i8p), [args[1]])
            # (address, read 0 / write 1, locality 3: keep in all levels, data cache)
            builder.call(fn, [ptr, ir.Constant(i32, int(write)), ir.Constant(i32, 3),
                              ir.Constant(i32, 1)])
            return context.get_dummy_value()

        return types.none(arr, offset), codegen
    return prefetch


_prefetch_read = _prefetch_intrinsic(False)
_prefetch_write = _prefetch_intrinsic(True)


@njit(**_KERNEL_OPTIONS)
def _prefetch_rows(src, b, d0, kk, t0, tt, write):
    """Prefetch ``src[b, d0 + k, t0 : t0 + tt]`` for ``k < kk``, a cache line at a time."""
    sb, sd, st = src.strides
    per_line = max(1, 64 // st) if st > 0 else 1
    for k in range(kk):
        row = b * sb + (d0 + k) * sd + t0 * st
        for j in range(0, tt, per_line):
            if write:
                _prefetch_write(src, row + j * st)
            else:
                _prefetch_read(src, row + j * st)


@njit(**_KERNEL_OPTIONS)
def _stage_rows(src, b, d0, kk, t0, tt, dst):
    """``dst[j, k] = src[b, d0 + k, t0 + j]`` for lanes ``k < kk``, 0 on the others.

    Turns rows of a (batch, dim, L) array into a (steps, lanes) tile in the
    compute dtype, so that the arithmetic on it runs along the lanes.
    """
    lanes = dst.shape[1]
    # in 8 x 8 blocks, whose rows (8 steps of a channel) are one cache line or less and
    # whose stores then fill 8 lines of dst together: a third faster than row by row
    k8, j8 = kk - kk % 8, tt - tt % 8
    for k0 in range(0, k8, 8):
        for j0 in range(0, j8, 8):
            for j in range(j0, j0 + 8):
                for k in range(k0, k0 + 8):
                    dst[j, k] = src[b, d0 + k, t0 + j]
        for j in range(j8, tt):
            for k in range(k0, k0 + 8):
                dst[j, k] = src[b, d0 + k, t0 + j]
    for k in range(k8, kk):
        for j in range(tt):
            dst[j, k] = src[b, d0 + k, t0 + j]
    for j in range(tt):
        for k in range(kk, lanes):
            dst[j, k] = 0


@njit(**_KERNEL_OPTIONS)
def _unstage_rows(src, b, d0, kk, t0, tt, dst):
    """``dst[b, d0 + k, t0 + j] = src[j, k]`` for lanes ``k < kk`` (inverse of _stage_rows)."""
    k8, j8 = kk - kk % 8, tt - tt % 8
    for k0 in range(0, k8, 8):
        for j0 in range(0, j8, 8):
            for k in range(k0, k0 + 8):
                for j in range(j0, j0 + 8):
                    dst[b, d0 + k, t0 + j] = src[j, k]
        for k in range(k0, k0 + 8):
            for j in range(j8, tt):
                dst[b, d0 + k, t0 + j] = src[j, k]
    for k in range(k8, kk):
        for j in range(tt):
            dst[b, d0 + k, t0 + j] = src[j, k]


@njit(**_KERNEL_OPTIONS)
def _stage_bc(X4, b, g, t0, tt, X_s):
    """``X_s[j, n] = X4[b, g, n, t0 + j]``: the rows of a per-step B or C for a tile."""
    N = X_s.shape[1]
    for n in range(N):
        for j in range(tt):
            X_s[j, n] = X4[b, g, n, t0 + j]


@njit(**_KERNEL_OPTIONS)
def _stage_dt(delta, b, d0, kk, t0, tt, bias_l, softplus, dt_s, sg_s, with_grad):
    """dt of a tile: ``delta + delta_bias``, through softplus when asked.

    With ``with_grad`` also ``sg_s``, the derivative of that softplus (sigmoid of
    the raw dt; 1 above the threshold of 20, where softplus is the identity).
    """
    _stage_rows(delta, b, d0, kk, t0, tt, dt_s)
    lanes = dt_s.shape[1]
    one = dt_s.dtype.type(1.0)
    twenty = dt_s.dtype.type(20.0)
    for j in range(tt):
        for k in range(lanes):
            dt_s[j, k] += bias_l[k]
    if softplus:
        if with_grad:
            for j in range(tt):
                for k in range(lanes):
                    raw = dt_s[j, k]
                    sg = _sigmoid(raw)
                    sg_s[j, k] = one if raw > twenty else sg
        for j in range(tt):
            for k in range(lanes):
                dt_s[j, k] = _softplus(dt_s[j, k])


# --------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------

@njit(**_KERNEL_OPTIONS)
def _forward_block(b, d0, kk, lanes, u, delta, A, B4, C4, D, z, bias, h0,
                   softplus, has_D, has_z, has_h0, b_step, c_step, g_b, g_c,
                   chunk, save, y, seq_ptr, seq_end, seq_slot, final, ckpt):
    """Scan channels ``d0 .. d0 + kk - 1`` of batch row ``b`` over all steps.

    The state is ``h`` (N, lanes); time runs in tiles of at most ``_TILE`` steps
    that never cross a chunk boundary, each staged into (steps, lanes) arrays. The
    row's sequences ``seq_ptr[b] .. seq_ptr[b + 1] - 1`` end at ``seq_end``; after each
    the state goes to ``final[seq_slot]`` (unless -1) and restarts from zero.
    """
    N = A.shape[1]
    L = u.shape[2]
    cd = A.dtype
    zero = cd.type(0.0)
    T = min(_TILE, chunk)
    h = np.zeros((N, lanes), cd)
    A_l = np.empty((N, lanes), cd)
    B_l = np.empty((N, lanes), cd)
    C_l = np.empty((N, lanes), cd)
    D_l = np.empty(lanes, cd)
    bias_l = np.empty(lanes, cd)
    dt_s = np.empty((T, lanes), cd)
    u_s = np.empty((T, lanes), cd)
    du_s = np.empty((T, lanes), cd)
    y_s = np.empty((T, lanes), cd)
    B_s = np.zeros((T, N), cd)  # stays zero for a constant B
    C_s = np.zeros((T, N), cd)
    acc = np.empty(lanes, cd)
    acc2 = np.empty(lanes, cd)
    _lane_params(d0, kk, A, B4, C4, D, bias, b_step, c_step, has_D, A_l, B_l, C_l, D_l,
                 bias_l)
    if has_h0:
        for k in range(kk):
            for n in range(N):
                h[n, k] = h0[b, d0 + k, n]

    n_chunks = (L + chunk - 1) // chunk
    si = seq_ptr[b]  # the sequence the scan is in
    for c in range(n_chunks):
        if save:
            for k in range(kk):
                for n in range(N):
                    ckpt[b, d0 + k, c, n] = h[n, k]
        c_end = min(L, (c + 1) * chunk)
        t0 = c * chunk
        while t0 < c_end:
            tt = min(T, c_end - t0)
            _stage_dt(delta, b, d0, kk, t0, tt, bias_l, softplus, dt_s, dt_s, False)
            _stage_rows(u, b, d0, kk, t0, tt, u_s)
            for j in range(tt):
                for k in range(lanes):
                    du_s[j, k] = dt_s[j, k] * u_s[j, k]
            if b_step:
                _stage_bc(B4, b, g_b, t0, tt, B_s)
            if c_step:
                _stage_bc(C4, b, g_c, t0, tt, C_s)
            # the next tile's rows, on their way while this one's scan runs
            t1, t2 = t0 + tt, min(L, t0 + tt + T)
            _prefetch_rows(u, b, d0, kk, t1, t2 - t1, False)
            _prefetch_rows(delta, b, d0, kk, t1, t2 - t1, False)
            if has_z:
                _prefetch_rows(z, b, d0, kk, t1, t2 - t1, False)
            _prefetch_rows(y, b, d0, kk, t1, t2 - t1, True)
            # the scan in pieces that end where the tile or a packed sequence ends: there
            # the sequence's state is reported and the next starts from zero
            s0 = 0
            while s0 < tt:
                s1 = min(tt, seq_end[si] - t0)
                j0 = s0
                if b_step and c_step:  # the common form: two steps per pass over the states
                    for j0 in range(s0, s1 - 1, 2):
                        j1 = j0 + 1
                        for k in range(lanes):
                            acc[k] = zero
                            acc2[k] = zero
                        for n in range(N):
                            bs, cs = B_s[j0, n], C_s[j0, n]
                            bs1, cs1 = B_s[j1, n], C_s[j1, n]
                            for k in range(lanes):
                                a = _fma(_exp(dt_s[j0, k] * A_l[n, k]), h[n, k],
                                         du_s[j0, k] * bs)
                                acc[k] = _fma(cs, a, acc[k])
                                a = _fma(_exp(dt_s[j1, k] * A_l[n, k]), a, du_s[j1, k] * bs1)
                                acc2[k] = _fma(cs1, a, acc2[k])
                                h[n, k] = a
                        for k in range(lanes):
                            y_s[j0, k] = acc[k]
                            y_s[j1, k] = acc2[k]
                    j0 = s1 - (s1 - s0) % 2
                for j in range(j0, s1):
                    for k in range(lanes):
                        acc[k] = zero
                    for n in range(N):
                        # one of B_l[n] and B_s[j, n] is zero: the constant or the per-step form
                        # (here, the per-step form only for a piece's odd last step)
                        bs = B_s[j, n]
                        cs = C_s[j, n]
                        for k in range(lanes):
                            hv = _fma(_exp(dt_s[j, k] * A_l[n, k]), h[n, k],
                                      du_s[j, k] * (B_l[n, k] + bs))
                            h[n, k] = hv
                            acc[k] = _fma(C_l[n, k] + cs, hv, acc[k])
                    for k in range(lanes):
                        y_s[j, k] = acc[k]
                if t0 + s1 == seq_end[si]:
                    if seq_slot[si] >= 0:
                        for k in range(kk):
                            for n in range(N):
                                final[seq_slot[si], d0 + k, n] = h[n, k]
                    h[:, :] = zero
                    si += 1
                s0 = s1
            # y = (sum_n C h + D u) * silu(z)
            if has_D:
                for j in range(tt):
                    for k in range(lanes):
                        y_s[j, k] += D_l[k] * u_s[j, k]
            if has_z:
                _stage_rows(z, b, d0, kk, t0, tt, du_s)  # du_s is free again
                for j in range(tt):
                    for k in range(lanes):
                        zz = du_s[j, k]
                        y_s[j, k] *= zz * _sigmoid(zz)
            _unstage_rows(y_s, b, d0, kk, t0, tt, y)
            t0 += tt


@njit(parallel=True, **_KERNEL_OPTIONS)
def _forward_kernel(u, delta, A, B4, C4, D, z, bias, h0,
                    softplus, has_D, has_z, has_h0, b_step, c_step, cpg_b, cpg_c,
                    fine, lanes, chunk, save, y, seq_ptr, seq_end, seq_slot, final, ckpt):
    """All blocks of the forward, one per parallel iteration (see :func:`_blocking`)."""
    batch, dim, _ = u.shape
    per_fine = (fine + lanes - 1) // lanes
    n_blocks = (dim // fine) * per_fine
    for it in prange(batch * n_blocks):
        b = it // n_blocks
        i = it - b * n_blocks
        d0 = (i // per_fine) * fine + (i % per_fine) * lanes
        kk = min(lanes, (i // per_fine) * fine + fine - d0)
        _forward_block(b, d0, kk, lanes, u, delta, A, B4, C4, D, z, bias, h0,
                       softplus, has_D, has_z, has_h0, b_step, c_step,
                       d0 // cpg_b, d0 // cpg_c, chunk, save, y, seq_ptr, seq_end, seq_slot,
                       final, ckpt)


# --------------------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------------------

@njit(**_KERNEL_OPTIONS)
def _sum_lanes(t):
    """Sum each row of ``t`` (N, lanes) into ``t[:, 0]`` by a fixed pairwise tree.

    ``lanes`` is a power of two; the order of the additions depends on nothing else.
    """
    N, lanes = t.shape
    w = lanes // 2
    while w > 0:
        for n in range(N):
            for k in range(w):
                t[n, k] += t[n, k + w]
        w //= 2


@njit(**_KERNEL_OPTIONS)
def _backward_block(b, d0, kk, slot, u, delta, A, B4, C4, D, z, bias, ckpt, dout, dfinal,
                    softplus, has_D, has_z, has_h0, has_dfinal, b_step, c_step, g_b, g_c,
                    chunk, restart, end_slot, du, ddelta, dz, dh0, pA, pB_const, pC_const,
                    pD, pbias, dB_step, dC_step, h_s, B_s, C_s, dt_s, sg_s, u_s, dy_s, z_s,
                    y_s, du_o, dd_o):
    """Gradients for channels ``d0 .. d0 + kk - 1`` of batch row ``b``.

    Walks the chunks backwards. For each it recomputes the states from the
    checkpoint into ``h_s`` (``h_s[j]`` is the state before step ``j`` of the
    chunk), then runs the adjoint recurrence back through the chunk. Per-step
    ``dB``/``dC`` are added into slot ``slot`` of ``dB_step``/``dC_step``;
    everything else written here belongs to these channels alone. The
    (chunk, ...) scratch arrays come from the caller, which reuses them across
    blocks. Packed sequences: ``restart[b, t]`` (a sequence starts at step t > 0: the
    state before it counts as zero, and no gradient flows back across it) and
    ``end_slot[b, t]`` (the final state taken after step t, whose cotangent is
    ``dfinal[end_slot]``; -1 for none).
    """
    N = A.shape[1]
    L = u.shape[2]
    lanes = h_s.shape[2]
    cd = A.dtype
    zero = cd.type(0.0)
    one = cd.type(1.0)
    A_l = np.empty((N, lanes), cd)
    B_l = np.empty((N, lanes), cd)
    C_l = np.empty((N, lanes), cd)
    D_l = np.empty(lanes, cd)
    bias_l = np.empty(lanes, cd)
    g = np.zeros((N, lanes), cd)  # dL/dh, carried backwards across steps and chunks
    gA = np.zeros((N, lanes), cd)
    gB = np.zeros((N, lanes), cd)  # running dB of a constant B
    gC = np.zeros((N, lanes), cd)
    tB = np.empty((N, lanes), cd)  # this step's dB, dC terms of every lane
    tC = np.empty((N, lanes), cd)
    gD = np.zeros(lanes, cd)
    gbias = np.zeros(lanes, cd)
    acc_u = np.empty(lanes, cd)
    acc_dt = np.empty(lanes, cd)
    dtu = np.empty(lanes, cd)
    _lane_params(d0, kk, A, B4, C4, D, bias, b_step, c_step, has_D, A_l, B_l, C_l, D_l,
                 bias_l)
    B_s[:] = 0
    C_s[:] = 0

    n_chunks = (L + chunk - 1) // chunk
    for c in range(n_chunks - 1, -1, -1):
        t0 = c * chunk
        tt = min(chunk, L - t0)
        _stage_dt(delta, b, d0, kk, t0, tt, bias_l, softplus, dt_s, sg_s, True)
        _stage_rows(u, b, d0, kk, t0, tt, u_s)
        _stage_rows(dout, b, d0, kk, t0, tt, dy_s)
        if b_step:
            _stage_bc(B4, b, g_b, t0, tt, B_s)
        if c_step:
            _stage_bc(C4, b, g_c, t0, tt, C_s)
        if c > 0:  # the previous chunk's rows, on their way while this one's runs
            tp = t0 - chunk
            _prefetch_rows(u, b, d0, kk, tp, chunk, False)
            _prefetch_rows(delta, b, d0, kk, tp, chunk, False)
            _prefetch_rows(dout, b, d0, kk, tp, chunk, False)
            _prefetch_rows(du, b, d0, kk, tp, chunk, True)
            _prefetch_rows(ddelta, b, d0, kk, tp, chunk, True)
            if has_z:
                _prefetch_rows(z, b, d0, kk, tp, chunk, False)
                _prefetch_rows(dz, b, d0, kk, tp, chunk, True)

        # recompute the chunk's states, and y_pre = sum_n C h where the z gate needs it
        for k in range(lanes):
            for n in range(N):
                h_s[0, n, k] = ckpt[b, d0 + k, c, n] if k < kk else zero
        for j in range(tt):
            w = zero if restart[b, t0 + j] else one  # (h_s[j] stays: dC of step j - 1 reads it)
            for k in range(lanes):
                dtu[k] = dt_s[j, k] * u_s[j, k]
            for n in range(N):
                bs = B_s[j, n]
                for k in range(lanes):
                    a = _exp(dt_s[j, k] * A_l[n, k]) * w
                    h_s[j + 1, n, k] = _fma(a, h_s[j, n, k], dtu[k] * (B_l[n, k] + bs))
            if has_z:
                for k in range(lanes):
                    acc_u[k] = zero
                for n in range(N):
                    cs = C_s[j, n]
                    for k in range(lanes):
                        acc_u[k] = _fma(C_l[n, k] + cs, h_s[j + 1, n, k], acc_u[k])
                for k in range(lanes):
                    y_s[j, k] = acc_u[k]

        # through the z gate: dz from y_pre, and dy becomes the gradient of y_pre
        if has_z:
            if has_D:
                for j in range(tt):
                    for k in range(lanes):
                        y_s[j, k] += D_l[k] * u_s[j, k]
            _stage_rows(z, b, d0, kk, t0, tt, z_s)
            for j in range(tt):
                for k in range(lanes):
                    zz = z_s[j, k]
                    s = _sigmoid(zz)
                    g_out = dy_s[j, k]
                    y_s[j, k] = g_out * y_s[j, k] * s * (one + zz * (one - s))
                    dy_s[j, k] = g_out * zz * s
            _unstage_rows(y_s, b, d0, kk, t0, tt, dz)
        if has_D:
            for j in range(tt):
                for k in range(lanes):
                    gD[k] += dy_s[j, k] * u_s[j, k]

        # the adjoint recurrence, backwards through the chunk
        for j in range(tt - 1, -1, -1):
            t = t0 + j
            if has_dfinal and end_slot[b, t] >= 0:
                for k in range(kk):
                    for n in range(N):
                        g[n, k] += dfinal[end_slot[b, t], d0 + k, n]
            w = zero if restart[b, t] else one  # the decay to the state before step t
            for k in range(lanes):
                acc_u[k] = zero
                acc_dt[k] = zero
                dtu[k] = dt_s[j, k] * u_s[j, k]
            for n in range(N):
                bs = B_s[j, n]
                cs = C_s[j, n]
                for k in range(lanes):
                    dy = dy_s[j, k]
                    gv = _fma(C_l[n, k] + cs, dy, g[n, k])  # dL/dh_t
                    tC[n, k] = dy * h_s[j + 1, n, k]
                    tB[n, k] = gv * dtu[k]
                    gb = gv * (B_l[n, k] + bs)
                    acc_u[k] += gb
                    a = _exp(dt_s[j, k] * A_l[n, k]) * w  # recomputed: cheaper than stored
                    q = gv * a * h_s[j, n, k]
                    acc_dt[k] = _fma(q, A_l[n, k], _fma(gb, u_s[j, k], acc_dt[k]))
                    gA[n, k] = _fma(q, dt_s[j, k], gA[n, k])
                    g[n, k] = gv * a
            if b_step:
                _sum_lanes(tB)
                for n in range(N):
                    dB_step[slot, b, g_b, n, t] += tB[n, 0]
            else:
                for n in range(N):
                    for k in range(lanes):
                        gB[n, k] += tB[n, k]
            if c_step:
                _sum_lanes(tC)
                for n in range(N):
                    dC_step[slot, b, g_c, n, t] += tC[n, 0]
            else:
                for n in range(N):
                    for k in range(lanes):
                        gC[n, k] += tC[n, k]
            for k in range(lanes):
                du_o[j, k] = acc_u[k] * dt_s[j, k]
                dd_o[j, k] = acc_dt[k]

        if has_D:
            for j in range(tt):
                for k in range(lanes):
                    du_o[j, k] += D_l[k] * dy_s[j, k]
        if softplus:
            for j in range(tt):
                for k in range(lanes):
                    dd_o[j, k] *= sg_s[j, k]
        for j in range(tt):
            for k in range(lanes):
                gbias[k] += dd_o[j, k]
        _unstage_rows(du_o, b, d0, kk, t0, tt, du)
        _unstage_rows(dd_o, b, d0, kk, t0, tt, ddelta)

    for k in range(kk):
        d = d0 + k
        for n in range(N):
            pA[b, d, n] = gA[n, k]
        if has_h0:
            for n in range(N):
                dh0[b, d, n] = g[n, k]
        if not b_step:
            for n in range(N):
                pB_const[b, d, n] = gB[n, k]
        if not c_step:
            for n in range(N):
                pC_const[b, d, n] = gC[n, k]
        pD[b, d] = gD[k]
        pbias[b, d] = gbias[k]


@njit(**_KERNEL_OPTIONS)
def _backward_unit(b, first, last, slot, u, delta, A, B4, C4, D, z, bias, ckpt, dout,
                   dfinal, softplus, has_D, has_z, has_h0, has_dfinal, b_step, c_step,
                   cpg_b, cpg_c, fine, coarse_start, lanes, chunk, restart, end_slot,
                   du, ddelta, dz, dh0, pA, pB_const, pC_const, pD, pbias,
                   dB_step, dC_step):
    """Blocks ``first .. last - 1`` of the coarse run at ``coarse_start``, in order.

    Owns the (chunk, ...) scratch that its blocks share, allocated here, per unit.
    """
    N = A.shape[1]
    cd = A.dtype
    per_fine = (fine + lanes - 1) // lanes
    h_s = np.empty((chunk + 1, N, lanes), cd)
    B_s = np.empty((chunk, N), cd)
    C_s = np.empty((chunk, N), cd)
    dt_s = np.empty((chunk, lanes), cd)
    sg_s = np.empty((chunk, lanes), cd)
    u_s = np.empty((chunk, lanes), cd)
    dy_s = np.empty((chunk, lanes), cd)
    z_s = np.empty((chunk, lanes), cd)
    y_s = np.empty((chunk, lanes), cd)
    du_o = np.empty((chunk, lanes), cd)
    dd_o = np.empty((chunk, lanes), cd)
    for i in range(first, last):
        fine_start = coarse_start + (i // per_fine) * fine
        d0 = fine_start + (i % per_fine) * lanes
        kk = min(lanes, fine_start + fine - d0)
        _backward_block(b, d0, kk, slot, u, delta, A, B4, C4, D, z, bias, ckpt,
                        dout, dfinal, softplus, has_D, has_z, has_h0, has_dfinal,
                        b_step, c_step, d0 // cpg_b, d0 // cpg_c, chunk, restart, end_slot,
                        du, ddelta, dz, dh0, pA, pB_const, pC_const, pD, pbias,
                        dB_step, dC_step, h_s, B_s, C_s, dt_s, sg_s, u_s, dy_s,
                        z_s, y_s, du_o, dd_o)


@njit(parallel=True, **_KERNEL_OPTIONS)
def _backward_kernel(u, delta, A, B4, C4, D, z, bias, ckpt, dout, dfinal,
                     softplus, has_D, has_z, has_h0, has_dfinal, b_step, c_step,
                     cpg_b, cpg_c, fine, coarse, lanes, n_slices, chunk, restart, end_slot,
                     du, ddelta, dz, dh0, pA, pB_const, pC_const, pD, pbias,
                     dB_step, dC_step):
    """All units of the backward, one per parallel iteration (see :func:`_blocking`).

    Unit ``(b, r, s)`` takes slice ``s`` of the blocks of coarse run ``r`` of batch
    row ``b``; slice ``s`` adds its per-step dB/dC into slot ``s``.
    """
    batch, dim, _ = u.shape
    per_coarse = (coarse // fine) * ((fine + lanes - 1) // lanes)
    n_coarse = dim // coarse
    for it in prange(batch * n_coarse * n_slices):
        b = it // (n_coarse * n_slices)
        rest = it - b * (n_coarse * n_slices)
        r = rest // n_slices
        s = rest - r * n_slices
        _backward_unit(b, s * per_coarse // n_slices, (s + 1) * per_coarse // n_slices, s,
                       u, delta, A, B4, C4, D, z, bias, ckpt, dout, dfinal,
                       softplus, has_D, has_z, has_h0, has_dfinal, b_step, c_step,
                       cpg_b, cpg_c, fine, r * coarse, lanes, chunk, restart, end_slot,
                       du, ddelta, dz, dh0, pA, pB_const, pC_const, pD, pbias,
                       dB_step, dC_step)


@njit(parallel=True, **_KERNEL_OPTIONS)
def _sum_leading(parts, out):
    """``out[i] = parts[0, i] + parts[1, i] + ...``, added in that order."""
    n_parts, size = parts.shape
    for i in prange(size):
        v = parts[0, i]
        for s in range(1, n_parts):
            v += parts[s, i]
        out[i] = v


# --------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------

def _blocking(p):
    """How the channels are cut into blocks, and the backward into units.

    Returns ``(b_step, c_step, cpg_b, cpg_c, fine, coarse, lanes)``: whether B
    and C are per step; channels per group of each (1 for the constant form, so
    that ``d // cpg`` is harmless); ``fine``, the length of the channel runs that
    lie inside one group of every per-step B/C (blocks never cross them);
    ``coarse``, the length of the runs that hold whole groups of every per-step
    B/C (a backward unit owns one, or a slice of one); ``lanes``, the block
    width: ``_LANES``, or the power of two at or above ``fine`` where that is
    smaller, so that scratch stays in proportion to the channels it serves.
    """
    dim = p.dim
    G_b, G_c = p.groups(p.B), p.groups(p.C)
    cpg_b = dim // G_b if G_b else 1
    cpg_c = dim // G_c if G_c else 1
    fine = math.gcd(cpg_b if G_b else dim, cpg_c if G_c else dim)
    coarse = math.lcm(cpg_b, cpg_c) if (G_b or G_c) else dim
    lanes = min(_LANES, 1 << (fine - 1).bit_length())
    return bool(G_b), bool(G_c), cpg_b, cpg_c, fine, coarse, lanes


def _forward_lanes(batch, dim, fine, lanes, threads):
    """The forward's block width: ``lanes``, halved (down to 8) while there are fewer
    blocks than threads, so that a few long rows still use every core.

    Each channel's arithmetic is the same at any width (the lanes never meet in the
    forward), so the results do not depend on the thread count; the backward keeps
    the width of :func:`_blocking`, since its sums over lanes do.
    """
    while lanes > 8 and batch * (dim // fine) * -(-fine // lanes) < threads:
        lanes //= 2
    return lanes


def _slices(p, coarse, fine, lanes):
    """Slices per coarse run, so that the backward has enough units for the cores.

    With no per-step B/C nothing is shared, so every block is a unit of its own.
    Otherwise runs are split until there are ``_TARGET_UNITS`` units; each slice
    adds into its own copy of the per-step dB/dC, so those take at most
    ``_TARGET_UNITS`` times the memory of B/C. Depends on the shapes only (not on
    the thread count), and so does the order of every sum.
    """
    per_coarse = (coarse // fine) * -(-fine // lanes)
    if p.B.ndim == 2 and p.C.ndim == 2:
        return per_coarse
    units = p.batch * (p.dim // coarse)
    return max(1, min(per_coarse, -(-_TARGET_UNITS // units)))


def _as_4d(X):
    """B or C as a 4-d array: the (dim, N) form becomes (1, dim, N, 1)."""
    return X.reshape(1, X.shape[0], X.shape[1], 1) if X.ndim == 2 else X


def _operands(p):
    """The problem's arrays as both kernels take them, all in the compute dtype.

    io-dtype arrays of a wider compute dtype (u, delta, z; B, C where they come
    in the io dtype) are converted here, a copy the size of each input, so the
    kernels are compiled for one dtype per problem, not for each combination.
    Absent optional arrays become 1-element stand-ins the kernels never read,
    except ``delta_bias``, which becomes zeros.
    """
    cd = p.compute_dtype

    def conv(x, ndim):
        if x is None:
            return np.zeros((1,) * ndim, dtype=cd)
        return x if x.dtype == cd else x.astype(cd)

    bias = p.delta_bias if p.delta_bias is not None else np.zeros(p.dim, dtype=cd)
    return (conv(p.u, 3), conv(p.delta, 3), p.A, _as_4d(conv(p.B, 2)),
            _as_4d(conv(p.C, 2)), conv(p.D, 1), conv(p.z, 3), bias)


def _scratch_step_bytes(p, lanes):
    """Bytes of a backward block's scratch per step of a chunk: the states (N x lanes), about
    10 staged rows of lanes, and B's and C's rows."""
    return ((p.N + 10) * lanes + 2 * p.N) * np.dtype(p.compute_dtype).itemsize


def _backward_chunk(p, lanes):
    """Steps per chunk the backward recomputes: ``p.chunk_size`` (at most L) while a block's
    scratch for it fits ``_WHOLE_CHUNK_BYTES``, else ``_RUN_BYTES`` worth (at least 1 step)."""
    per_step = _scratch_step_bytes(p, lanes)
    chunk = min(p.chunk_size, p.L)
    if (chunk + 1) * per_step <= _WHOLE_CHUNK_BYTES:
        return chunk
    return max(1, min(chunk, _RUN_BYTES // per_step))


def selective_scan_forward(p, *, save_checkpoints, sequences=None, final_states=True):
    """Run the selective scan of a NumPy problem.

    Parameters
    ----------
    p : SelectiveScanProblem
        With ``p.xp`` NumPy; see :mod:`ssmkit._problem` for the layout.
    save_checkpoints : bool
        Whether to keep the state entering each chunk, for the backward.
    sequences : Packing, optional
        Packed sequences (:mod:`ssmkit._selective_scan_packed`), run in place: the state
        restarts from zero after each, and the final states are its slots (those without
        steps left zero).
    final_states : bool
        With ``sequences``: False writes none and returns None for ``final_state``.

    Returns
    -------
    y : ndarray, (batch, dim, L), ``p.io_dtype``
    final_state : ndarray, (batch, dim, N), or (n_slots, dim, N) with ``sequences`` (None
        with ``final_states`` False); ``p.compute_dtype``
    checkpoints : ndarray, (batch, dim, n_chunks, N), ``p.compute_dtype``, or None
        ``checkpoints[b, d, c]`` is the state entering step ``c * p.chunk_size``.
    """
    batch, dim, L, N = p.batch, p.dim, p.L, p.N
    cd = p.compute_dtype
    b_step, c_step, cpg_b, cpg_c, fine, _, lanes = _blocking(p)
    lanes = _forward_lanes(batch, dim, fine, lanes, numba.get_num_threads())
    y = np.empty((batch, dim, L), dtype=cd)
    if sequences is None:  # one sequence per row, its state the row's final state
        seq_ptr, seq_end = np.arange(batch + 1), np.full(batch, L)
        seq_slot = np.arange(batch)
        final = np.empty((batch, dim, N), dtype=cd)
    elif final_states:
        seq_ptr, seq_end, seq_slot = sequences.segments
        final = np.zeros((sequences.n_slots, dim, N), dtype=cd)
    else:  # no sequence's final state written (one per sequence can outweigh y)
        seq_ptr, seq_end, _ = sequences.segments
        seq_slot = np.full(seq_end.size, -1)
        final = np.zeros((1, 1, 1), dtype=cd)
    ckpt = (np.empty((batch, dim, p.n_chunks, N), dtype=cd) if save_checkpoints
            else np.zeros((1, 1, 1, 1), dtype=cd))
    h0 = p.initial_state if p.initial_state is not None else np.zeros((1, 1, 1), cd)
    _forward_kernel(*_operands(p), h0,
                    p.delta_softplus, p.D is not None, p.z is not None,
                    p.initial_state is not None, b_step, c_step, cpg_b, cpg_c,
                    fine, lanes, p.chunk_size, bool(save_checkpoints), y,
                    seq_ptr.astype(np.int64), seq_end.astype(np.int64),
                    seq_slot.astype(np.int64), final, ckpt)
    if sequences is not None and not final_states:
        final = None
    return (y.astype(p.io_dtype, copy=False), final,
            ckpt if save_checkpoints else None)


def restarts_in_place(p, packing, *, backward, final_states):
    """Whether packed sequences run here in place (no padded rows): always, forward and
    backward, every sequence's final state and its cotangent included."""
    return True


def _sequence_steps(sequences, batch, L):
    """Per step of each row: whether a packed sequence starts there (after step 0), and the
    final-state slot taken after it (-1: none); one sequence per row without ``sequences``."""
    end_slot = np.full((batch, L), -1, np.int32)  # (slots < 2^31: one per sequence)
    if sequences is None:
        end_slot[:, L - 1] = np.arange(batch)
        return np.zeros((batch, L), np.bool_), end_slot
    _, end, slot = sequences.segments
    rows, _ = _packed.segment_starts(sequences, batch)
    end_slot[rows, end - 1] = slot
    return _packed.restart_steps(sequences, batch, L), end_slot


def selective_scan_backward(p, checkpoints, dout, dfinal_state, sequences=None):
    """Gradients of a NumPy selective scan, recomputing the states chunk by chunk.

    Parameters
    ----------
    p : SelectiveScanProblem
        The problem the forward ran.
    checkpoints : ndarray, (batch, dim, n_chunks, N), ``p.compute_dtype``
        From :func:`selective_scan_forward` with ``save_checkpoints=True``
        (recomputed here when None).
    dout : ndarray, (batch, dim, L), ``p.io_dtype``
        Gradient of ``y``.
    dfinal_state : ndarray, (batch, dim, N), ``p.compute_dtype``, or None
        Gradient of the final state; (n_slots, dim, N) with ``sequences``.
    sequences : Packing, optional
        The packed sequences the forward ran in place (its ``sequences``).

    Returns
    -------
    dict
        ``u``, ``delta``, ``z`` in ``p.io_dtype`` with their shapes; ``A``
        (dim, N), ``B``, ``C`` (the problem's forms), ``D``, ``delta_bias``
        (dim,), ``initial_state`` (batch, dim, N) in ``p.compute_dtype``; None
        for each array the problem does not have.

    Notes
    -----
    With ``g`` the gradient of the state, for each step backwards::

        g += C_t dy_t
        dC_t += dy_t h_t;  dB_t += g dt_t u_t;  du_t = dt_t sum_n g B_t + D dy_t
        ddt_t = sum_n g (A a_t h_{t-1} + B_t u_t);  dA += g a_t h_{t-1} dt_t
        g *= a_t
    where ``a_t = exp(dt_t A)``, ``dy`` is ``dout`` through the z gate, and
    ``ddelta = ddt * softplus'(delta + delta_bias)`` when ``delta_softplus``.
    """
    batch, dim, L, N = p.batch, p.dim, p.L, p.N
    cd, io = p.compute_dtype, p.io_dtype
    b_step, c_step, cpg_b, cpg_c, fine, coarse, lanes = _blocking(p)
    chunk = _backward_chunk(p, lanes)
    if chunk < min(p.chunk_size, L):
        # finer checkpoints from the forward once more (its states do not depend on the
        # chunk size), so that a chunk's scratch stays in cache
        p = dataclasses.replace(p, chunk_size=chunk)
        checkpoints = None
    if checkpoints is None:
        _, _, checkpoints = selective_scan_forward(p, save_checkpoints=True,
                                                   sequences=sequences)
    restart, end_slot = _sequence_steps(sequences, batch, L)
    n_slices = _slices(p, coarse, fine, lanes)
    has_z = p.z is not None
    has_h0 = p.initial_state is not None

    def empty_or_dummy(shape, present):
        return np.empty(shape, dtype=cd) if present else np.zeros((1,) * len(shape), cd)

    du = np.empty((batch, dim, L), dtype=cd)
    ddelta = np.empty((batch, dim, L), dtype=cd)
    dz = empty_or_dummy((batch, dim, L), has_z)
    dh0 = empty_or_dummy((batch, dim, N), has_h0)
    # per-(b, d) partials of the sums over the batch
    pA = np.empty((batch, dim, N), dtype=cd)
    pD = np.empty((batch, dim), dtype=cd)
    pbias = np.empty((batch, dim), dtype=cd)
    pB_const = empty_or_dummy((batch, dim, N), not b_step)
    pC_const = empty_or_dummy((batch, dim, N), not c_step)
    # per-step dB/dC: a zeroed copy per slice (slice s adds into [s]), summed below
    dB_step = np.zeros((n_slices,) + p.B.shape if b_step else (1,) * 5, dtype=cd)
    dC_step = np.zeros((n_slices,) + p.C.shape if c_step else (1,) * 5, dtype=cd)

    dout = dout if dout.dtype == cd else dout.astype(cd)
    dfinal = dfinal_state if dfinal_state is not None else np.zeros((1, 1, 1), cd)
    _backward_kernel(*_operands(p), checkpoints, dout, dfinal,
                     p.delta_softplus, p.D is not None, has_z, has_h0,
                     dfinal_state is not None, b_step, c_step, cpg_b, cpg_c, fine, coarse,
                     lanes, n_slices, p.chunk_size, restart, end_slot,
                     du, ddelta, dz, dh0, pA, pB_const, pC_const, pD, pbias,
                     dB_step, dC_step)

    def summed(parts):
        """Sum over the leading axis, in order."""
        if parts.shape[0] == 1:
            return parts[0]
        out = np.empty(parts.shape[1:], dtype=cd)
        _sum_leading(parts.reshape(parts.shape[0], -1), out.reshape(-1))
        return out

    return {
        "u": du.astype(io, copy=False),
        "delta": ddelta.astype(io, copy=False),
        "z": dz.astype(io, copy=False) if has_z else None,
        "A": summed(pA),
        "B": summed(dB_step) if b_step else summed(pB_const),
        "C": summed(dC_step) if c_step else summed(pC_const),
        "D": summed(pD) if p.D is not None else None,
        "delta_bias": summed(pbias) if p.delta_bias is not None else None,
        "initial_state": dh0 if has_h0 else None,
    }
