"""Variable-length sequences in one selective scan call: reads of different lengths packed
end to end into one row, with ``cu_seqlens`` marking where each starts.

Run it with ``python examples/packed_sequences.py``. It scans the packed row once, checks
each sequence's outputs and final state against a call of its own, and takes the gradient
of a loss over all of them. The same code runs on CuPy arrays on a GPU.
"""

import numpy as np

import ssmkit


def main():
    rng = np.random.default_rng(0)
    dim, N = 32, 16
    lengths = [300, 17, 1, 1200, 96]  # e.g. reads of a genomics batch, of any length
    cu_seqlens = np.concatenate(([0], np.cumsum(lengths)))
    L = int(cu_seqlens[-1])
    f = np.float32
    u = rng.standard_normal((1, dim, L)).astype(f)
    delta = (rng.standard_normal((1, dim, L)) * 0.5 - 1.0).astype(f)
    A = -np.exp(rng.standard_normal((dim, N)) * 0.5).astype(f)
    B = rng.standard_normal((1, N, L)).astype(f)
    C = rng.standard_normal((1, N, L)).astype(f)
    D = rng.standard_normal(dim).astype(f)

    # one call: the state restarts at each sequence; one final state per sequence
    y, final = ssmkit.selective_scan(u, delta, A, B, C, D, delta_softplus=True,
                                     cu_seqlens=cu_seqlens, return_final_state=True)
    print(f"{len(lengths)} sequences, {L} steps in one row: y {y.shape}, "
          f"final states {final.shape}")

    worst = 0.0
    for i, (a, b) in enumerate(zip(cu_seqlens[:-1], cu_seqlens[1:])):
        y1, h1 = ssmkit.selective_scan(u[..., a:b], delta[..., a:b], A, B[..., a:b],
                                       C[..., a:b], D, delta_softplus=True,
                                       return_final_state=True)
        worst = max(worst, float(np.abs(y[..., a:b] - y1).max()),
                    float(np.abs(final[i] - h1[0]).max()))
    print(f"largest difference from one call per sequence: {worst:.2e}")
    assert worst < 1e-4, worst

    # gradients through every sequence at once
    (y, final), pullback = ssmkit.selective_scan_vjp(u, delta, A, B, C, D, delta_softplus=True,
                                                     cu_seqlens=cu_seqlens,
                                                     return_final_state=True)
    grads = pullback(np.ones_like(y), np.zeros_like(final))
    print(f"d sum(y) / dA: shape {grads.A.shape}, norm {np.linalg.norm(grads.A):.4f}")


if __name__ == "__main__":
    main()
