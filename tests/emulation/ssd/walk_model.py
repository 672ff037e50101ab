r"""A NumPy model of a bfloat16 SSD backward as one walk backwards in time (the 16-bit form of
ssd_tf32_bwd, not built): where its rounding to 16 bits lands in ddt, dA and d initial_state,
for choosing its design before writing the kernel (benchmarks/SSD.md, "The 16-bit backward
as one walk: its numerics first"). One head, no D, z, softplus or restarts; tiles = chunks; float64
arithmetic with explicit roundings where the kernels round.

    python3 tests/emulation/ssd/walk_model.py 120 7      # 120 problems, seed 7
    python3 tests/emulation/ssd/walk_model.py tiles 4 0  # 4 problems of the kernels' sizes
    python3 tests/emulation/ssd/walk_model.py chunks 20 1  # tiles of 64 inside chunks of 256
    python3 tests/emulation/ssd/walk_model.py real 20 1  # the same, and the emulated GPU backward

The problems are run_emu_problems.py's (the tests' make_inputs and seeds) without the options
the model lacks. Each runs through the emulated chunked tensor-core backward (the kernels of
ssd_mma.cu on the host, as the GPU runs them) and through each variant of the model; every
gradient is compared with the float64 reference as the tests compare it (rel_err). Prints
the worst error per field and variant. The model first checks itself: with its roundings
off, every variant equals the float64 recurrence.
"""
import sys
import numpy as np

def rb(a):
    """Round to bfloat16 (nearest even), returned as float64."""
    a = np.asarray(a, np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return u.view(np.float32).astype(np.float64)

def f32(a):
    return np.asarray(a, np.float32).astype(np.float64)

def exact(x, dt, A, B, C, h0, dY, dHf):
    """float64 recurrence and its gradients."""
    L, P = x.shape; N = B.shape[1]
    a = np.exp(dt * A)
    hs = np.zeros((L + 1, P, N)); hs[0] = h0
    for t in range(L):
        hs[t + 1] = a[t] * hs[t] + dt[t] * np.outer(x[t], B[t])
    y = np.einsum('tpn,tn->tp', hs[1:], C)
    g = dHf.copy(); ddt = np.zeros(L); dA = 0.0; dx = np.zeros_like(x)
    for t in range(L - 1, -1, -1):
        g = g + np.outer(dY[t], C[t])
        gb = g @ B[t]
        dx[t] = dt[t] * gb
        q = np.sum(g * a[t] * hs[t])
        ddt[t] = x[t] @ gb + A * q
        dA += dt[t] * q
        g = a[t] * g
    return y, hs, dict(dt=ddt, A=dA, x=dx, h0=g)

def forward16(x, dt, A, B, C, h0, T):
    """The 16-bit forward by chunks of T: y rounded to bf16 (what a walk would read), ycore in
    float32, the float32 states entering each chunk (checkpoints); operands rounded as the
    tensor-core forward rounds them (the state, the masked block, w_s x_s)."""
    L, P = x.shape
    S = f32(h0); y16 = np.zeros((L, P)); ycore = np.zeros((L, P)); ck = []
    for b in range(0, L, T):
        e = min(L, b + T); ck.append(S.copy())
        cum = A * np.cumsum(dt[b:e])
        Cb, Bb, xb, dtb = C[b:e], B[b:e], x[b:e], dt[b:e]
        W = np.tril(np.exp(cum[:, None] - cum[None, :]) * (Cb @ Bb.T) * dtb[None, :])
        yc = np.exp(cum)[:, None] * (Cb @ rb(S).T) + rb(W) @ xb
        ycore[b:e] = f32(yc); y16[b:e] = rb(yc)
        w = np.exp(cum[-1] - cum) * dtb
        S = f32(np.exp(cum[-1]) * S + (rb(w[:, None] * xb)).T @ Bb)
    ck.append(S.copy())
    return y16, ycore, ck

def walk(x, dt, A, B, C, h0, dY, dHf, T, dest="ycore", G_split=False, pairs_dA=False):
    """The walk: chunks last to first with the adjoint G after each in float32.
    dest: where dcum's destination terms come from: 'y16' (the forward's 16-bit output),
    'ycore' (its float32 output), 'split' (the diagonal block's pairs from the same rounded
    block as the source side, the state part from the checkpoint as the forward rounded it).
    G_split: G as hi + lo bf16 parts in its products. pairs_dA: dA from each pair's own
    log-decay (no dcum), the state terms weighted the same way."""
    L, P = x.shape
    y16, ycore, ck = forward16(x, dt, A, B, C, h0, T)
    G = f32(dHf); dcum = np.zeros(L); ddt = np.zeros(L); dA_pairs = 0.0
    starts = list(range(0, L, T))
    for ci in range(len(starts) - 1, -1, -1):
        b = starts[ci]; e = min(L, b + T)
        Sb, Se = ck[ci], ck[ci + 1]
        cum = A * np.cumsum(dt[b:e]); ce = cum[-1]
        Cb, Bb, xb, dtb, dYb = C[b:e], B[b:e], x[b:e], dt[b:e], dY[b:e]
        Gr = rb(G) + (rb(G - rb(G)) if G_split else 0.0)
        Wt = rb(np.triu(np.exp(cum[None, :] - cum[:, None]) * (Bb @ Cb.T)))  # [s, t], t >= s
        GB = np.exp(ce - cum)[:, None] * (Bb @ Gr.T) + Wt @ dYb              # [s, p]
        src = dtb * np.einsum('sp,sp->s', xb, GB)                            # each step as source
        if dest == 'y16':
            dst = np.einsum('tp,tp->t', dYb, y16[b:e])
        elif dest == 'ycore':
            dst = np.einsum('tp,tp->t', dYb, ycore[b:e])
        elif dest == 'split':
            pairs = Wt.T * dtb[None, :] * (dYb @ xb.T)                        # [t, s]
            st = np.exp(cum) * np.einsum('tp,tp->t', dYb, Cb @ rb(Sb).T)
            dst = pairs.sum(1) + st
        elif dest == 'ycore-fwd':  # the forward's float32 output, the source side as 'forward'
            Wf = rb(np.tril(np.exp(cum[:, None] - cum[None, :]) * (Cb @ Bb.T) * dtb[None, :]))
            pairs = Wf * (dYb @ xb.T)
            dst = np.einsum('tp,tp->t', dYb, ycore[b:e])
            wx = rb((np.exp(ce - cum) * dtb)[:, None] * xb)
            src = pairs.sum(0) + np.einsum('sp,sp->s', wx, Bb @ Gr.T)
        else:  # 'forward': both sides from the forward's own rounded operands
            Wf = rb(np.tril(np.exp(cum[:, None] - cum[None, :]) * (Cb @ Bb.T) * dtb[None, :]))
            pairs = Wf * (dYb @ xb.T)                                         # [t, s]
            st = np.exp(cum) * np.einsum('tp,tp->t', dYb, Cb @ rb(Sb).T)
            dst = pairs.sum(1) + st
            wx = rb((np.exp(ce - cum) * dtb)[:, None] * xb)                   # the forward's w_s x_s
            src = pairs.sum(0) + np.einsum('sp,sp->s', wx, Bb @ Gr.T)
        dc = dst - src
        dc[-1] += np.sum(G * Se)  # the chunk's end: <G, its state>
        dcum[b:e] = dc
        # ddt: A times dcum's suffix sum in the chunk (cum_t = A sum_{r <= t} dt_r), plus x . GB
        ddt[b:e] = A * np.cumsum(dc[::-1])[::-1] + np.einsum('sp,sp->s', xb, GB)
        if pairs_dA:
            # log-decays per A: pair (t, s) in the chunk: D_t - D_s; the entering state to t:
            # D_t; source s to the chunk's end (through G): D_e - D_s; S_b to the end: D_e
            Dl = np.cumsum(dtb)
            pairs = Wt.T * dtb[None, :] * (dYb @ xb.T)
            dA_pairs += np.sum(pairs * (Dl[:, None] - Dl[None, :]))
            dA_pairs += np.sum(Dl * np.exp(cum) * np.einsum('tp,tp->t', dYb, Cb @ rb(Sb).T))
            w = np.exp(ce - cum) * dtb
            dA_pairs += np.sum((Dl[-1] - Dl) * w * np.einsum('sp,sp->s', xb, Bb @ Gr.T))
            dA_pairs += Dl[-1] * np.exp(ce) * np.sum(G * Sb)
        # G before the chunk
        wdy = np.exp(cum)[:, None] * dYb
        wr = rb(wdy) + (rb(wdy - rb(wdy)) if G_split else 0.0)
        G = f32(np.exp(ce) * G + wr.T @ Cb)
    # dA = sum_t dcum_t * sum_{r <= t} dt_r (within the chunk)
    dA = 0.0
    for b in starts:
        e = min(L, b + T)
        dA += np.sum(dcum[b:e] * np.cumsum(dt[b:e]))
    return dict(dt=ddt, A=dA_pairs if pairs_dA else dA, h0=G)

def tile_spans(L, Tc, Tt):
    """The chunks of Tc steps and, in each, its tiles of Tt steps: [(c0, c1, [(b, e), ..])]."""
    return [(c0, min(L, c0 + Tc), [(b, min(L, c0 + Tc, b + Tt)) for b in range(c0, min(L, c0 + Tc), Tt)])
            for c0 in range(0, L, Tc)]


def forward_tiles(x, dt, A, B, C, h0, Tc, Tt, dtx, s_split=0):
    """The one-kernel 16-bit forward (ssd_mma_fwd) as it walks: tiles of Tt steps inside chunks
    of Tc, cum relative to the chunk's start. Its masked block W[t][s] holds dt'_s (dtx False,
    as the kernel is now) or not, dt'_s x_s then rounded as the diagonal term's operand (dtx
    True). Returns ycore (float32) and the float32 states at the chunks' boundaries."""
    L, P = x.shape
    S = f32(h0); ycore = np.zeros((L, P)); ck = []
    for c0, c1, tiles in tile_spans(L, Tc, Tt):
        ck.append(S.copy())
        cum = A * np.cumsum(dt[c0:c1])
        for b, e in tiles:
            cu = cum[b - c0:e - c0]; cum_b = cum[b - c0 - 1] if b > c0 else 0.0
            Cb, Bb, xb, dtb = C[b:e], B[b:e], x[b:e], dt[b:e]
            E = np.tril(np.exp(cu[:, None] - cu[None, :]) * (Cb @ Bb.T))
            diag = rb(E) @ rb(dtb[:, None] * xb) if dtx else rb(E * dtb[None, :]) @ xb
            Sr = rb(S) + (rb(S - rb(S)) if s_split > 1 or (s_split and b > c0) else 0.0)
            ycore[b:e] = f32(np.exp(cu - cum_b)[:, None] * (Cb @ Sr.T) + diag)
            w = np.exp(cu[-1] - cu) * dtb
            S = f32(np.exp(cu[-1] - cum_b) * S + rb(w[:, None] * xb).T @ Bb)
    ck.append(S.copy())
    return ycore, ck


def walk_tiles(x, dt, A, B, C, h0, dY, dHf, Tc, Tt, design):
    """The walk over forward_tiles' tiles, last to first, G (after each tile) in float32 and
    in its products as hi + lo; dcum's destination terms dY . ycore (the forward's float32
    output). design: 'dtx' (the forward rounds dt' x, the walk's diagonal term is its block
    transposed: the source terms rb(dt' x) . (W^T dY) and rb(w x) . (G B), every pair as the
    forward rounded it); 'dtw' (the forward as now, the walk's block without dt': source
    terms dt' x . (G B), rounded otherwise than the forward's pairs); 'dtW' (the forward as
    now, the walk's block the forward's own, dt'_s in it: diagonal source terms
    x . (rb(W dt')^T dY)). '+S': the forward's state term with S as hi + lo on a chunk's
    later tiles ('+SS': on every tile)."""
    L, P = x.shape
    ycore, ck = forward_tiles(x, dt, A, B, C, h0, Tc, Tt, design.startswith("dtx"),
                              s_split=2 if design.endswith("+SS") else int(design.endswith("+S")))
    G = f32(dHf); dcum = np.zeros(L); xgb = np.zeros(L)
    spans = tile_spans(L, Tc, Tt)
    for ci in range(len(spans) - 1, -1, -1):
        c0, c1, tiles = spans[ci]
        cum = A * np.cumsum(dt[c0:c1])
        dcum[c1 - 1] += np.sum(G * ck[ci + 1])  # the chunk's end: <G, its state>
        for b, e in reversed(tiles):
            cu = cum[b - c0:e - c0]; cum_b = cum[b - c0 - 1] if b > c0 else 0.0
            Cb, Bb, xb, dtb, dYb = C[b:e], B[b:e], x[b:e], dt[b:e], dY[b:e]
            Gr = rb(G) + rb(G - rb(G))
            E = np.triu(np.exp(cu[None, :] - cu[:, None]) * (Bb @ Cb.T))  # [s, t]
            st = Bb @ Gr.T                                                # [s, p]
            if design.startswith("dtW"):  # the forward's own block, dt'_s in it
                dgw = rb(E * dtb[:, None]) @ dYb
                dg = dgw / dtb[:, None]
            else:
                dg = rb(E) @ dYb
            GB = np.exp(cu[-1] - cu)[:, None] * st + dg
            xgb[b:e] = np.einsum('sp,sp->s', xb, GB)
            if design.startswith("dtx"):
                w = np.exp(cu[-1] - cu) * dtb
                src = (np.einsum('sp,sp->s', rb(dtb[:, None] * xb), dg)
                       + np.einsum('sp,sp->s', rb(w[:, None] * xb), st))
            elif design.startswith("dtW"):
                w = np.exp(cu[-1] - cu) * dtb
                src = (np.einsum('sp,sp->s', xb, dgw)
                       + np.einsum('sp,sp->s', rb(w[:, None] * xb), st))
            else:
                src = dtb * xgb[b:e]
            dcum[b:e] += np.einsum('tp,tp->t', dYb, ycore[b:e]) - src
            wdy = np.exp(cu - cum_b)[:, None] * dYb
            G = f32(np.exp(cu[-1] - cum_b) * G + (rb(wdy) + rb(wdy - rb(wdy))).T @ Cb)
    ddt = np.zeros(L); dA = 0.0
    for c0, c1, _ in spans:
        ddt[c0:c1] = A * np.cumsum(dcum[c0:c1][::-1])[::-1] + xgb[c0:c1]
        dA += np.sum(dcum[c0:c1] * np.cumsum(dt[c0:c1]))
    return dict(dt=ddt, A=dA, h0=G)


def sized_problem(rng, L, P, N, slow):
    """One row and head of the kernels' inputs: x, B, C, dY in bfloat16, dt in [0.01, 0.5] (slow:
    [0.001, 0.05]), A = -exp(0.5 n), n standard normal, an initial state and a final cotangent;
    walk_tiles' and walk's argument order."""
    x = rb(rng.standard_normal((L, P)))
    B, C = rb(rng.standard_normal((L, N))), rb(rng.standard_normal((L, N)))
    dt = f32(rng.uniform(0.001, 0.05, L) if slow else rng.uniform(0.01, 0.5, L))
    A = float(f32(-np.exp(rng.standard_normal() * 0.5)))
    h0, dHf = f32(rng.standard_normal((P, N))), f32(rng.standard_normal((P, N)))
    dY = rb(rng.standard_normal((L, P)))
    return x, dt, A, B, C, h0, dY, dHf


def tiles_in_chunks(count, rng):
    """Tiles inside chunks, as the kernels walk (chunks of 256, tiles of 64; L 512, P 64,
    N 128) and small ones (chunks of 12, tiles of 4): the designs of walk_tiles against the
    float64 recurrence. First the model's check: without rounding both equal it."""
    glob = globals(); saved = glob["rb"], glob["f32"]
    glob["rb"] = glob["f32"] = lambda a: np.asarray(a, np.float64)
    crng = np.random.default_rng(3)
    args = (crng.standard_normal((37, 3)), crng.uniform(0.01, 0.5, 37), -1.3,
            crng.standard_normal((37, 5)), crng.standard_normal((37, 5)),
            crng.standard_normal((3, 5)), crng.standard_normal((37, 3)), crng.standard_normal((3, 5)))
    ref = exact(*args)[2]
    for d in ("dtx", "dtx+S", "dtx+SS", "dtw", "dtW", "dtW+S"):
        got = walk_tiles(*args, 12, 5, d)
        assert all(rel(got[k], ref[k]) < 1e-10 for k in got), (d, {k: rel(got[k], ref[k]) for k in got})
    glob["rb"], glob["f32"] = saved
    print("model check: without rounding both designs equal the float64 recurrence")
    for (L, P, N, Tc, Tt) in ((512, 64, 128, 256, 64), (40, 4, 8, 12, 4)):
        for slow in (False, True):
            worst = {d: {} for d in ("dtx", "dtx+S", "dtx+SS", "dtw", "dtw+S", "dtW", "dtW+S")}
            for _ in range(count):
                args = sized_problem(rng, L, P, N, slow)
                ref = exact(*args)[2]
                for d in worst:
                    got = walk_tiles(*args, Tc, Tt, d)
                    for k in ("dt", "A", "h0"):
                        worst[d][k] = max(worst[d].get(k, 0.0), rel(got[k], ref[k]))
            print(f"{count} problems of L {L}, P {P}, N {N}, chunks of {Tc}, tiles of {Tt}, dt in "
                  + ("[0.001, 0.05]" if slow else "[0.01, 0.5]") + "; worst rel_err")
            print("| design | ddt | dA | d initial_state |")
            print("|---|---|---|---|")
            for d, w in worst.items():
                print(f"| {d} | {w['dt']:.2e} | {w['A']:.2e} | {w['h0']:.2e} |")


def rel(a, r):
    """As the tests' rel_err: |a - r| / |r| in the 2-norm (|r| = 0: the absolute error)."""
    a, r = np.atleast_1d(a), np.atleast_1d(r)
    d = np.linalg.norm(r)
    return np.linalg.norm(a - r) / (d if d > 0 else 1.0)

def problem(rng, L, P, N, T, init=True, slow=False):
    x = rb(rng.standard_normal((L, P))); B = rb(rng.standard_normal((L, N))); C = rb(rng.standard_normal((L, N)))
    dt = f32(rng.uniform(0.001, 0.1, L) if slow else rng.uniform(0.01, 0.5, L))
    A = float(-rng.uniform(0.5, 2.0) if not slow else -rng.uniform(0.01, 0.2))
    h0 = f32(rng.standard_normal((P, N))) if init else np.zeros((P, N))
    dY = rb(rng.standard_normal((L, P))); dHf = f32(rng.standard_normal((P, N)))
    return x, dt, A, B, C, h0, dY, dHf

VARIANTS = [  # (dcum's destination terms, G as hi + lo, dA from pairs)
    ("y16", False, False), ("ycore", False, False), ("ycore", True, False),
    ("split", False, False), ("split", True, False), ("split", True, True),
    ("forward", False, False), ("forward", True, False), ("ycore-fwd", True, False)]
LABELS = {"y16": "dY . y, y the forward's 16-bit output", "ycore": "dY . ycore (float32 output)",
          "split": "pairs from the walk's block, state part from the checkpoint",
          "forward": "both sides from the forward's rounded operands",
          "ycore-fwd": "dY . ycore; the source side from the forward's rounded operands"}


def model_grads(arrays, dy, dfin, variant, chunk, exact_only=False):
    """Gradients dt (batch, L, H), A (H,), initial_state (batch, H, P, N) of the model, by
    (batch row, head); exact_only: the float64 recurrence instead."""
    x, dt, A, B, C = (np.asarray(arrays[k], np.float64) for k in ("x", "dt", "A", "B", "C"))
    h0 = arrays["initial_state"]
    batch, L, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    out = {"dt": np.zeros((batch, L, H)), "A": np.zeros(H), "initial_state": np.zeros((batch, H, P, N))}
    for b in range(batch):
        for h in range(H):
            g = h // (H // G)
            args = (x[b, :, h], dt[b, :, h], float(A[h]), B[b, :, g], C[b, :, g],
                    np.zeros((P, N)) if h0 is None else np.asarray(h0[b, h], np.float64),
                    np.asarray(dy[b, :, h], np.float64), np.asarray(dfin[b, h], np.float64))
            if exact_only:
                r = exact(*args)[2]
            elif isinstance(variant, str):  # a walk_tiles design, the kernels' 64-step tiles
                r = walk_tiles(*args, chunk, min(64, chunk), variant)
            else:
                r = walk(*args, chunk, dest=variant[0], G_split=variant[1], pairs_dA=variant[2])
            out["dt"][b, :, h] = r["dt"]
            out["A"][h] += r["A"]
            out["initial_state"][b, h] = r["h0"]
    return out


def tile_sized(count, rng):
    """Problems of the kernels' sizes (one row and head: L 256, P 64, N 128, tiles of 64; the
    tests' ranges of dt and A, and a slow-decay form): the model's variants only (the
    emulated chunked backward is too slow here), against the float64 recurrence."""
    for slow in (False, True):
        worst = {v: {} for v in VARIANTS}
        for _ in range(count):
            T = 64
            args = sized_problem(rng, 256, 64, 128, slow)
            ref = exact(*args)[2]
            for v in VARIANTS:
                got = walk(*args, T, dest=v[0], G_split=v[1], pairs_dA=v[2])
                for k in ("dt", "A", "h0"):
                    worst[v][k] = max(worst[v].get(k, 0.0), rel(got[k], ref[k]))
        print(f"{count} problems of L 256, P 64, N 128, tiles of 64, dt in "
              + ("[0.001, 0.05] (slow decay)" if slow else "[0.01, 0.5]") + "; worst rel_err")
        print("| walk | G in its products | dA from | ddt | dA | d initial_state |")
        print("|---|---|---|---|---|---|")
        for v, w in worst.items():
            print(f"| {LABELS[v[0]]} | {'hi + lo' if v[1] else 'bf16'} | {'pairs' if v[2] else 'dcum'} "
                  f"| {w['dt']:.2e} | {w['A']:.2e} | {w['h0']:.2e} |")


def real_sized(count, rng, L=512, chunk=256):
    """Problems of the kernels' sizes (one row and head: L 512, P 64, N 128, chunks of 256, an
    initial state; the tests' make_inputs, dt uniform in [0.01, 0.5] as run_emu_problems
    draws it without softplus) through the emulated chunked GPU backward and walk_tiles'
    designs (tiles of 64 inside the chunks): worst rel_err of each."""
    import run_emu_problems as E
    from helpers import as_dtype
    designs = ("dtx", "dtx+S", "dtx+SS", "dtw", "dtW+S")
    worst = {"chunked (the GPU's)": {}}
    worst.update({d: {} for d in designs})
    for _ in range(count):
        seed = int(rng.integers(1 << 30))
        kw = dict(batch=1, L=L, H=1, P=64, G=1, N=128, D_form=None, with_z=False,
                  with_bias=False, with_init=True, seq_cuts=None)
        opts = dict(chunk_size=chunk, dt_softplus=False)
        errs = E.run_problem("bfloat16", kw, opts, seed)
        prng = np.random.default_rng(seed)
        inputs = E.make_inputs(prng, **kw)
        inputs["dt"] = prng.uniform(0.01, 0.5, inputs["dt"].shape)
        arrays, exact_in = E.cast(inputs, "bfloat16", np)
        dy = as_dtype(prng.standard_normal(inputs["x"].shape), "bfloat16").astype(np.float64)
        dfin = prng.standard_normal((1, 1, 64, 128)).astype(np.float32)
        ref = model_grads(exact_in, dy, dfin, None, chunk, exact_only=True)
        for k in ("dt", "A", "initial_state"):
            worst["chunked (the GPU's)"][k] = max(worst["chunked (the GPU's)"].get(k, 0.0), errs[k])
        for d in designs:
            got = model_grads(arrays, dy, dfin, d, chunk)
            for k in ref:
                worst[d][k] = max(worst[d].get(k, 0.0), rel(got[k], ref[k]))
    print(f"{count} problems of L {L}, P 64, N 128, chunks of {chunk} (walks: tiles of 64); worst rel_err")
    print("| backward | ddt | dA | d initial_state |")
    print("|---|---|---|---|")
    for v, w in worst.items():
        print(f"| {v} | {w['dt']:.2e} | {w['A']:.2e} | {w['initial_state']:.2e} |")


def main(argv):
    if argv and argv[0] == "real":
        real_sized(int(argv[1]) if len(argv) > 1 else 3, np.random.default_rng(int(argv[2]) if len(argv) > 2 else 0))
        return
    if argv and argv[0] == "chunks":
        tiles_in_chunks(int(argv[1]) if len(argv) > 1 else 3, np.random.default_rng(int(argv[2]) if len(argv) > 2 else 0))
        return
    if argv and argv[0] == "tiles":
        tile_sized(int(argv[1]) if len(argv) > 1 else 3, np.random.default_rng(int(argv[2]) if len(argv) > 2 else 0))
        return
    count = int(argv[0]) if argv else 60
    rng = np.random.default_rng(int(argv[1]) if len(argv) > 1 else 0)
    # the model's own check: no rounding, every variant equals the recurrence
    glob = globals()
    saved = glob["rb"], glob["f32"]
    glob["rb"] = glob["f32"] = lambda a: np.asarray(a, np.float64)
    crng = np.random.default_rng(5)
    a = dict(x=crng.standard_normal((2, 37, 2, 3)), dt=crng.uniform(0.01, 0.5, (2, 37, 2)),
             A=-crng.uniform(0.5, 2, 2), B=crng.standard_normal((2, 37, 1, 5)),
             C=crng.standard_normal((2, 37, 1, 5)), initial_state=crng.standard_normal((2, 2, 3, 5)))
    dy, dfin = crng.standard_normal((2, 37, 2, 3)), crng.standard_normal((2, 2, 3, 5))
    ref = model_grads(a, dy, dfin, None, 8, exact_only=True)
    for v in VARIANTS:
        got = model_grads(a, dy, dfin, v, 8)
        errs = {k: rel(got[k], ref[k]) for k in ref}
        assert all(e < 1e-10 for e in errs.values()), (v, errs)
    glob["rb"], glob["f32"] = saved
    print("model check: without rounding every variant equals the float64 recurrence")

    import run_emu_problems as E
    from helpers import as_dtype
    worst = {"chunked (the GPU's)": {}}
    worst.update({v: {} for v in VARIANTS})
    n = 0
    while n < count:
        kw, opts, seed = E.sample(rng)
        kw.update(D_form=None, with_z=False, with_bias=False, seq_cuts=None)
        opts = dict(chunk_size=opts["chunk_size"], dt_softplus=False)
        errs = E.run_problem("bfloat16", kw, opts, seed)
        # the same inputs again (run_problem's draws, in its order)
        prng = np.random.default_rng(seed)
        inputs = E.make_inputs(prng, **kw)
        inputs["dt"] = prng.uniform(0.01, 0.5, inputs["dt"].shape)
        arrays, exact_in = E.cast(inputs, "bfloat16", np)
        shape_y = inputs["x"].shape
        dy = as_dtype(prng.standard_normal(shape_y), "bfloat16").astype(np.float64)
        dfin = prng.standard_normal((kw["batch"], kw["H"], kw["P"], kw["N"])).astype(np.float32)
        ref = model_grads(exact_in, dy, dfin, None, opts["chunk_size"], exact_only=True)
        for k in ("dt", "A", "initial_state"):
            if k == "initial_state" and not kw["with_init"]:
                continue
            worst["chunked (the GPU's)"][k] = max(worst["chunked (the GPU's)"].get(k, 0.0), errs[k])
        for v in VARIANTS:
            got = model_grads(arrays, dy, dfin, v, opts["chunk_size"])
            for k in ref:
                if k == "initial_state" and not kw["with_init"]:
                    continue
                worst[v][k] = max(worst[v].get(k, 0.0), rel(got[k], ref[k]))
        n += 1
    print(f"{count} problems (run_emu_problems' sizes: L 1-40, chunk 1-16, N 1-8, P 1-4, H 1-3; "
          "no D, z, bias, softplus or restarts); worst rel_err, bfloat16 bound 0.2")
    print("| backward | G in its products | dA from | ddt | dA | d initial_state |")
    print("|---|---|---|---|---|---|")
    for v, w in worst.items():
        if isinstance(v, str):
            print(f"| {v} | - | - | {w['dt']:.2e} | {w['A']:.2e} | {w.get('initial_state', 0):.2e} |")
        else:
            print(f"| walk: {LABELS[v[0]]} | {'hi + lo' if v[1] else 'bf16'} | {'pairs' if v[2] else 'dcum'} "
                  f"| {w['dt']:.2e} | {w['A']:.2e} | {w.get('initial_state', 0):.2e} |")


if __name__ == "__main__":
    main(sys.argv[1:])
