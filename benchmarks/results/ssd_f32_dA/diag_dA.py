import os, sys
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
import numpy as np, cupy as cp
import test_ssd as T
from helpers import rel_err
import ssmkit
import ssmkit._gpu.ssd as G
from ssmkit import reference as ref

rec = {}
def wrap(obj, name, key):
    f = getattr(obj, name)
    def g(*a, **k):
        r = f(*a, **k)
        rec.setdefault(key, []).append((a, k, r))
        return r
    setattr(obj, name, g)
wrap(G._Layout, "mm", "mm"); wrap(G._Layout, "chunk_state", "cs")
wrap(G, "_adjoint_passing", "adj"); wrap(G, "_bwd_dt", "dt"); wrap(G, "ssd_forward", "fwd")
wrap(G, "_bwd_rows", "rows")
tonp = lambda v: v.get() if isinstance(v, cp.ndarray) else v
kw = dict(batch=1, L=31, H=1, P=1, G=1, N=2, D_form=None, with_z=False, with_bias=True,
          with_init=False, seq_cuts=[2])
opts = dict(chunk_size=2, dt_softplus=True)
out = os.environ.get("OUT", "/tmp")
for tf in ("1", "0"):
    os.environ["SSMKIT_SSD_TF32"] = tf
    rec.clear()
    rng = np.random.default_rng(0)
    inputs = T.make_inputs(rng, **kw)
    arrays, exact = T.cast(inputs, "float32", cp)
    (y, fin), pb = ssmkit.ssd_vjp(**arrays, **opts, return_final_state=True)
    (y_r, fin_r), pb_r = ref.ssd_vjp(**exact, **opts, return_final_state=True)
    dy = rng.standard_normal(y_r.shape); dfin = rng.standard_normal(fin_r.shape)
    dy_c = dy.astype(np.float32)
    g = pb(cp.asarray(dy_c), cp.asarray(dfin.astype(np.float32)))
    g_r = pb_r(dy_c.astype(np.float64), dfin.astype(np.float32))
    print("TF32", tf, "dA", float(g.A[0]), "ref", g_r.A[0], "rel", rel_err(g.A, g_r.A))
    save = {}
    for i, (a, k, r) in enumerate(rec.get("mm", [])):
        save[f"mm_{a[2]}_{i}"] = tonp(r)
    for i, (a, k, r) in enumerate(rec.get("cs", [])):
        save['cs_%s_%d' % (k.get('adjoint', a[-1] if len(a) > 4 else None), i)] = tonp(r)
    fa, fk, fr = rec["fwd"][-1]
    save["states"] = tonp(fr[2][0])
    aa, ak, ar = rec["adj"][-1]
    save["dHx"] = tonp(ar[0]); save["end_dot"] = tonp(ar[-1]); save["K"] = tonp(aa[2])
    da, dk, dr = rec["dt"][-1]
    save["dcum"] = tonp(da[2]); save["xGB"] = tonp(da[3]); save["dte"] = tonp(da[1].dte)
    save["cum"] = tonp(da[1].cum)
    save["dA"] = tonp(g.A); save["dA_ref"] = g_r.A
    np.savez(os.path.join(out, f"diag_tf{tf}.npz"), **save)
    print(sorted(save))
