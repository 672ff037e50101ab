"""Time the SSD peer configuration (bfloat16, batch 4, L 4096, H 80, P 64, G 1, N 128, chunk
256) of the tree this runs in, for A/B runs of several trees in one GPU session: the forward
(back-to-back and one-call latency, without and with z), forward+backward (without and
with z), and the forward's
stages as that tree's ``bench_ssd.forward_stages`` times them. Prints one ``ABROW {json}``
line. ``benchmarks/ab_ssd_trees.sh`` runs it in two trees, rounds alternating.

    cd TREE && PYTHONPATH=$PWD python3 /path/to/ab_ssd_trees.py LABEL [DTYPE]

DTYPE (default bfloat16) replaces the configuration's dtype, float32 for instance.
"""
import json
import os
import sys

sys.path.insert(0, os.getcwd())  # the tree being timed, not this script's
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import cupy  # noqa: E402

import ssmkit  # noqa: E402
from bench_ssd import TABLE, forward_stages, make_inputs  # noqa: E402
from timing import copy_tbps, cuda_median_ms  # noqa: E402

PEER, CHUNK = TABLE[0][:7], TABLE[0][7]  # (dtype, batch, L, H, P, G, N), chunk of the peer row


def main(label, dtype=PEER[0]):
    config = (dtype,) + PEER[1:]
    row = {"tree": label, "dtype": dtype, "copy_tbps": round(copy_tbps(), 3)}
    x = make_inputs(cupy, *config)
    kw = dict(chunk_size=CHUNK, dt_softplus=True)
    xz = dict(x, z=x["x"][:, ::-1].copy())
    dy = cupy.ones_like(x["x"])

    def fwd_bwd(inputs=x):
        _, pullback = ssmkit.ssd_vjp(**inputs, **kw)
        pullback(dy)

    row["fwd b2b"] = cuda_median_ms(lambda: ssmkit.ssd(**x, **kw), calls=5)
    row["fwd latency"] = cuda_median_ms(lambda: ssmkit.ssd(**x, **kw))
    row["fwd b2b with z"] = cuda_median_ms(lambda: ssmkit.ssd(**xz, **kw), calls=5)
    row["fwd+bwd b2b"] = cuda_median_ms(fwd_bwd, reps=5, calls=3)
    row["fwd+bwd b2b with z"] = cuda_median_ms(lambda: fwd_bwd(xz), reps=5, calls=3)
    if dtype in ("bfloat16", "float16"):  # the tensor-core forward's stages
        row.update(forward_stages(cupy, *config, CHUNK))
    print("ABROW", json.dumps({k: round(v, 4) if isinstance(v, float) else v
                               for k, v in row.items()}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
