"""A/B of one switch of ``ssmkit._gpu.ssd`` (MMA_ROWS_FUSED, MMA_STATE_WALK, ...) or of an
environment variable it reads at each call (SSMKIT_SSD_TF32) on the SSD peer configuration
(bfloat16, batch 4, L 4096, H 80, P 64, G 1, N 128, chunk 256; or another row of bench_ssd's
table), in one process, the settings alternating: forward and forward+backward, without and
with z (CUDA-event medians of back-to-back calls, ``timing.cuda_median_ms``). Prints one
``AB {json}`` line per round and setting.

    PYTHONPATH=$PWD python3 benchmarks/ab_ssd_switch.py NAME [ROUNDS] [VALUES] [ROW]

NAME a boolean switch (True and False alternate), or any switch with VALUES given as a
comma-separated list of Python literals (``MMA_FWD_PIECES 3 1,2,4``; separated by semicolons
when one holds a comma: ``TC_KINDS 2 "('y','dB');('y',)"``); a NAME starting with
``SSMKIT_`` is an environment variable, VALUES its strings (``1,0`` by default). ROW: the
index of the row of bench_ssd.TABLE (0, the bfloat16 peer row, by default; 1 is float32).
"""
import ast
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cupy  # noqa: E402

import ssmkit  # noqa: E402
from ssmkit._gpu import ssd as gpu_ssd  # noqa: E402
from bench_ssd import TABLE, make_inputs  # noqa: E402
from timing import copy_tbps, cuda_median_ms  # noqa: E402



def main(name, rounds=3, values=None, row=0):
    shape, chunk = TABLE[int(row)][:7], TABLE[int(row)][7]  # (dtype, batch, L, H, P, G, N)
    env = name.startswith("SSMKIT_")
    if env:
        values = (values or "1,0").split(",")
    elif values is not None:
        values = [ast.literal_eval(v) for v in values.split(";" if ";" in values else ",")]
    elif isinstance(getattr(gpu_ssd, name), bool):
        values = (True, False)
    else:
        raise ValueError(f"{name} is not a boolean switch of ssmkit._gpu.ssd: give VALUES")
    x = make_inputs(cupy, *shape)
    xz = dict(x, z=x["x"][:, ::-1].copy())
    kw = dict(chunk_size=chunk, dt_softplus=True)
    dy = cupy.ones_like(x["x"])

    def fwd_bwd(a):
        _, pullback = ssmkit.ssd_vjp(**a, **kw)
        pullback(dy)

    print("copy TB/s", round(copy_tbps(), 3), flush=True)
    for rnd in range(int(rounds)):
        for value in values:
            if env:
                os.environ[name] = value
            else:
                setattr(gpu_ssd, name, value)
            row = {"round": rnd, name: value, "dtype": shape[0],
                   "fwd": cuda_median_ms(lambda: ssmkit.ssd(**x, **kw), calls=5),
                   "fwd with z": cuda_median_ms(lambda: ssmkit.ssd(**xz, **kw), calls=5),
                   "fwd+bwd": cuda_median_ms(lambda: fwd_bwd(x), reps=5, calls=3),
                   "fwd+bwd with z": cuda_median_ms(lambda: fwd_bwd(xz), reps=5, calls=3)}
            cupy.get_default_memory_pool().free_all_blocks()
            print("AB", json.dumps({k: round(v, 4) if isinstance(v, float) else v
                                    for k, v in row.items()}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
