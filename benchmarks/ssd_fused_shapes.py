"""The SSD forward as one kernel against the chunked kernels, over shapes: for bfloat16
ssd_mma_fwd against the state walk and the output kernel (MMA_FUSED_FWD), for float32
ssd_tf32_fwd against the chunk states, their passing and the output product
(TF32_FUSED_FWD). With ``bwd`` (float32): forward+backward with the backward walk
(ssd_tf32_bwd) against the chunked backward (TF32_BWD_WALK). How the one kernel's blocks (one
per (batch row, head, 64 columns p), each walking the whole row) fill the GPU decides which
is faster. Alternating settings in one process, CUDA-event medians of back-to-back calls
(``timing.cuda_median_ms``). Prints one ``SHAPE {json}`` line per shape and a table last.

    PYTHONPATH=$PWD python3 benchmarks/ssd_fused_shapes.py [ROUNDS] [all | z | noz] [DTYPE] \
        [fwd | bwd]
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cupy  # noqa: E402

import ssmkit  # noqa: E402
from ssmkit._gpu import ssd as gpu_ssd  # noqa: E402
from bench_ssd import make_inputs  # noqa: E402
from timing import cuda_median_ms  # noqa: E402

# (batch, L, H, P, N, z): the peer row's H, P, N at several batches and lengths, a smaller
# model (24 heads), N = 64, and some of them with z
SHAPES = [(1, 4096, 80, 64, 128, False), (2, 4096, 80, 64, 128, False),
          (4, 4096, 80, 64, 128, False), (5, 4096, 80, 64, 128, False),
          (8, 4096, 80, 64, 128, False), (4, 1024, 80, 64, 128, False),
          (4, 16384, 80, 64, 128, False), (16, 1024, 80, 64, 128, False),
          (8, 2048, 24, 64, 128, False), (4, 4096, 80, 64, 64, False),
          (4, 4096, 80, 64, 128, True), (2, 4096, 80, 64, 128, True),
          (8, 4096, 80, 64, 128, True), (16, 1024, 80, 64, 128, True),
          (8, 2048, 24, 64, 128, True), (1, 4096, 8, 64, 64, False),
          (1, 4096, 24, 64, 128, False), (1, 16384, 24, 64, 128, False)]


def main(rounds=2, which="all", dtype="bfloat16", what="fwd"):
    switch = "TF32_FUSED_FWD" if dtype == "float32" else "MMA_FUSED_FWD"
    if what == "bwd":
        switch = "TF32_BWD_WALK"
    rows = []
    for batch, L, H, P, N, with_z in SHAPES:
        if which != "all" and with_z != (which == "z"):
            continue
        x = make_inputs(cupy, dtype, batch, L, H, P, 1, N)
        if with_z:
            x["z"] = x["x"][:, ::-1].copy()
        kw = dict(chunk_size=256, dt_softplus=True)
        dy = cupy.ones_like(x["x"])

        def call(x=x, dy=dy):  # (this shape's arrays: x is deleted below)
            if what == "bwd":
                ssmkit.ssd_vjp(**x, **kw)[1](dy)
            else:
                ssmkit.ssd(**x, **kw)

        best, before = {}, getattr(gpu_ssd, switch)
        for _ in range(int(rounds)):
            for fused in (True, False):
                setattr(gpu_ssd, switch, fused)
                ms = cuda_median_ms(call, calls=5)
                best[fused] = min(best.get(fused, ms), ms)
        setattr(gpu_ssd, switch, before)
        row = {"dtype": dtype, "batch": batch, "L": L, "H": H, "P": P, "N": N, "z": with_z,
               "blocks": batch * H * -(-P // 64), "fused ms": best[True],
               "two kernels ms": best[False]}
        rows.append(row)
        print("SHAPE", json.dumps(row), flush=True)
        del x
        cupy.get_default_memory_pool().free_all_blocks()
    print("| batch | L | H | N | z | blocks | one kernel ms | two kernels ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['L']} | {r['H']} | {r['N']} | {r['z']} | {r['blocks']} | "
              f"{r['fused ms']:.3f} | {r['two kernels ms']:.3f} |")


if __name__ == "__main__":
    main(*sys.argv[1:])
