"""Forward and forward+backward time of one row of bench_ssd's table at several chunk sizes,
the sizes alternating in one process (CUDA-event medians of back-to-back calls).

The result does not depend on ``chunk_size`` (up to rounding), so this says which chunk the
kernels should run at (``ssmkit._gpu.ssd.kernel_chunk``): the float32 cap, F32_MAX_CHUNK, is
lifted here so that every size runs as given. Prints one ``CHUNK {json}`` line per round and
size.

    PYTHONPATH=$PWD python3 benchmarks/ssd_chunk_sweep.py [ROW] [ROUNDS] [SIZES]

ROW: the index of bench_ssd.TABLE (1, the float32 peer row, by default); SIZES: a
comma-separated list (``64,128,256`` by default).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cupy  # noqa: E402

import ssmkit  # noqa: E402
from ssmkit._gpu import ssd as gpu_ssd  # noqa: E402
from bench_ssd import TABLE, make_inputs  # noqa: E402
from timing import copy_tbps, cuda_median_ms  # noqa: E402


def main(row=1, rounds=2, sizes="64,128,256"):
    shape = TABLE[int(row)][:7]  # (dtype, batch, L, H, P, G, N)
    x = make_inputs(cupy, *shape)
    dy = cupy.ones_like(x["x"])
    gpu_ssd.F32_MAX_CHUNK = 1 << 62  # the sizes as given
    print("copy TB/s", round(copy_tbps(), 3), "row", shape, flush=True)
    for rnd in range(int(rounds)):
        for chunk in (int(s) for s in sizes.split(",")):
            kw = dict(chunk_size=chunk, dt_softplus=True)

            def fwd_bwd():
                _, pullback = ssmkit.ssd_vjp(**x, **kw)
                pullback(dy)

            print("CHUNK", json.dumps({
                "round": rnd, "chunk": chunk, "dtype": shape[0],
                "fwd": round(cuda_median_ms(lambda: ssmkit.ssd(**x, **kw), calls=5), 4),
                "fwd+bwd": round(cuda_median_ms(fwd_bwd, calls=3), 4)}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
