"""Run a Mamba layer whose weights were exported from PyTorch, with no PyTorch here.

Export, on the machine that has the PyTorch model (``mamba_ssm.Mamba`` or
``mamba_ssm.Mamba2``, alone or inside a model)::

    import numpy as np
    sd = model.state_dict()
    np.savez("mamba.npz", **{k: v.float().cpu().numpy() for k, v in sd.items()})
    # or, with the safetensors package:
    # from safetensors.torch import save_file; save_file(sd, "mamba.safetensors")

Then, here::

    python examples/pytorch_weights.py mamba.npz --prefix "layers.0.mixer." --mamba 1
    python examples/pytorch_weights.py mamba.safetensors --prefix "" --mamba 2 --headdim 64

Without a file, the script writes a small random one in the PyTorch naming and
uses that, so it runs anywhere. It runs a sequence, continues it with decoding
steps from the returned state, and checks that the two agree.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

import ssmkit
from ssmkit import layers


def load_weights(path):
    """A dict of NumPy arrays from an ``.npz`` or ``.safetensors`` file."""
    if path.endswith(".safetensors"):
        from safetensors.numpy import load_file  # pip install safetensors

        return load_file(path)
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def random_mamba1_file(path, d_model=32, d_state=16, d_conv=4, expand=2):
    """A ``mamba_ssm.Mamba``-shaped state dict with random weights, saved as .npz."""
    rng = np.random.default_rng(0)
    di, R = expand * d_model, max(1, d_model // 16)
    sd = {
        "in_proj.weight": rng.standard_normal((2 * di, d_model)) / np.sqrt(d_model),
        "conv1d.weight": rng.standard_normal((di, 1, d_conv)) / np.sqrt(d_conv),
        "conv1d.bias": np.zeros(di),
        "x_proj.weight": rng.standard_normal((R + 2 * d_state, di)) / np.sqrt(di),
        "dt_proj.weight": rng.standard_normal((di, R)) / np.sqrt(R),
        "dt_proj.bias": np.log(np.expm1(rng.uniform(1e-3, 1e-1, di))),
        "A_log": np.log(np.tile(np.arange(1, d_state + 1), (di, 1))),
        "D": np.ones(di),
        "out_proj.weight": rng.standard_normal((d_model, di)) / np.sqrt(di),
    }
    np.savez(path, **{k: v.astype(np.float32) for k, v in sd.items()})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("path", nargs="?", help=".npz or .safetensors state dict")
    ap.add_argument("--prefix", default="", help="name prefix of the layer in the state dict")
    ap.add_argument("--mamba", type=int, choices=(1, 2), default=1)
    ap.add_argument("--headdim", type=int, default=64, help="Mamba-2 only")
    ap.add_argument("--ngroups", type=int, default=1, help="Mamba-2 only")
    ap.add_argument("--gpu", action="store_true", help="run on the GPU (CuPy)")
    args = ap.parse_args()

    path = args.path
    if path is None:
        if args.mamba != 1:
            ap.error("the built-in example file is a Mamba-1 layer; pass a file for --mamba 2")
        path = os.path.join(tempfile.mkdtemp(), "mamba1_random.npz")
        random_mamba1_file(path)
        print(f"no file given: wrote random Mamba-1 weights to {path}")
    weights = load_weights(path)
    if args.mamba == 1:
        params = layers.Mamba1Params.from_state_dict(weights, args.prefix)
        run, step = layers.mamba1, layers.mamba1_step
    else:
        params = layers.Mamba2Params.from_state_dict(weights, args.prefix, headdim=args.headdim,
                                                     ngroups=args.ngroups)
        run, step = layers.mamba2, layers.mamba2_step

    xp = np
    if args.gpu:
        import cupy as xp  # noqa: N813
        import dataclasses

        params = dataclasses.replace(params, **{
            f.name: xp.asarray(getattr(params, f.name)) for f in dataclasses.fields(params)
            if isinstance(getattr(params, f.name), np.ndarray)})

    batch, L, prompt = 2, 24, 16
    hidden = xp.asarray(np.random.default_rng(1).standard_normal(
        (batch, L, params.d_model)).astype(np.float32))
    whole = run(params, hidden)
    # prefill the prompt, then decode the rest one token at a time
    out, state = run(params, hidden[:, :prompt], return_state=True)
    steps = [step(params, hidden[:, t], state) for t in range(prompt, L)]
    decoded = xp.concatenate([out] + [s[:, None] for s in steps], axis=1)
    err = float(xp.abs(decoded - whole).max() / xp.abs(whole).max())
    print(f"ssmkit {ssmkit.__version__}: Mamba-{args.mamba} layer, d_model {params.d_model}, "
          f"output {tuple(whole.shape)}; prefill + {L - prompt} steps vs one pass: "
          f"max relative difference {err:.2e}")


if __name__ == "__main__":
    main()
