"""ssmkit quickstart: one selective scan and its gradient, on the GPU if there is one.

Run it with ``python examples/quickstart.py``. It prints what it computed, on which
backend, and how far the result is from the float64 reference.
"""

import numpy as np

import ssmkit


def main():
    try:
        import cupy

        xp = cupy if cupy.cuda.runtime.getDeviceCount() > 0 else np
    except Exception:  # no CuPy, or no GPU: the same call runs on the CPU
        xp = np
    if xp is np:
        import numba

        where = f"CPU (NumPy arrays, Numba kernels on {numba.get_num_threads()} threads)"
    else:
        where = "GPU ({})".format(
            xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)["name"].decode())

    batch, dim, L, N = 2, 64, 1000, 16
    rng = np.random.default_rng(0)
    host = dict(
        u=rng.standard_normal((batch, dim, L), dtype=np.float32),
        delta=rng.standard_normal((batch, dim, L), dtype=np.float32) * 0.5 - 1.0,
        A=-np.exp(rng.standard_normal((dim, N), dtype=np.float32) * 0.5),
        B=rng.standard_normal((batch, N, L), dtype=np.float32),
        C=rng.standard_normal((batch, N, L), dtype=np.float32),
        D=rng.standard_normal(dim, dtype=np.float32),
        z=rng.standard_normal((batch, dim, L), dtype=np.float32),
        delta_bias=rng.standard_normal(dim, dtype=np.float32) * 0.1,
    )
    args = {k: xp.asarray(v) for k, v in host.items()}

    (y, final_state), pullback = ssmkit.selective_scan_vjp(
        **args, delta_softplus=True, return_final_state=True)
    grads = pullback(xp.ones_like(y))

    y_ref = ssmkit.reference.selective_scan(**host, delta_softplus=True)
    y_np = y.get() if xp is not np else y
    err = np.linalg.norm(y_np - y_ref) / np.linalg.norm(y_ref)
    print(f"ssmkit {ssmkit.__version__} selective_scan on the {where}")
    print(f"  u {tuple(y.shape)} float32, A (dim={dim}, N={N}), B and C per step")
    print(f"  y: shape {tuple(y.shape)}, dtype {y.dtype}, mean |y| = {float(abs(y).mean()):.4f}")
    print(f"  final_state: shape {tuple(final_state.shape)}")
    print(f"  relative difference from the float64 reference: {err:.2e}")
    print(f"  gradients: " + ", ".join(
        f"{name} {tuple(g.shape)}" for name, g in grads._asdict().items() if g is not None))


if __name__ == "__main__":
    main()
