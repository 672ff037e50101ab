r"""Sweep the host-emulated selective scan kernels (run.py) over a case list and compare every
output and gradient with the float64 reference.

    LD_PRELOAD=$(g++ -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 \
        python3 tests/emulation/selective_scan/sweep.py quick      # or ring | ring_wide | ring_npt8 | bwd_ring | bwd_ring32 | slices | n | quads | dtypes | bf | big

Prints one OK/BAD line per case and "ALL OK" or "FAILURES" last. Takes minutes; CI runs the
quick, ring, ring_wide, ring_npt8, quads, n, bwd_ring, slices and bwd_ring32 lists without
AddressSanitizer (tests/test_emulation.py).
"""
import sys, os, itertools
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import make, check, LAUNCHES
TOL = {"float32": 2e-4, "float64": 1e-10, "float16": 4e-3, "bfloat16": 3e-2}
rng = np.random.default_rng(1)
cases = []
# (batch, dim, L, N, io, bc, gb, gc, flags, chunk)
full = dict(D=True, z=True, bias=True, softplus=True, h0=True)
none = dict(D=False, z=False, bias=False, softplus=False, h0=False)
which = sys.argv[1] if len(sys.argv) > 1 else "quick"
if which == "quick":
    cases += [
        (2, 8, 37, 16, "float32", None, 1, 1, full, 16),
        (2, 8, 37, 16, "float32", None, 1, 1, none, 16),
        (1, 4, 5, 16, "float32", None, 1, 1, full, 1),
        (2, 6, 29, 16, "float32", None, 3, 2, full, 7),
        (2, 6, 29, 16, "float32", None, 0, 0, full, 7),
        (2, 6, 29, 16, "float32", None, 1, 0, full, 10),
        (2, 6, 29, 16, "float32", None, 0, 3, full, 100),
        (1, 3, 50, 5, "float32", None, 3, 1, full, 13),
        (2, 4, 70, 1, "float32", None, 1, 1, full, 64),
        (1, 4, 133, 3, "float32", None, 2, 2, full, 1000),
        (2, 4, 20, 8, "float32", None, 1, 1, full, 3),
    ]
elif which == "ring":
    # Shapes the ring forward kernels take (N <= 128, B and C per step, L and the chunk multiples
    # of 16 bytes and of 4 steps): every IO/BC pair, chunk carries, segments (SEGS), N 1 to 128,
    # blocks of one channel (G = dim) and of several warps.
    for io, bc in (("float32", None), ("bfloat16", None), ("bfloat16", "float32"), ("float16", None),
                   ("float16", "float32")):
        cases.append((2, 8, 48, 16, io, bc, 1, 1, full, 16))
        cases.append((1, 6, 40, 5, io, bc, 3, 2, none, 8))
    cases += [
        (2, 8, 64, 16, "float32", None, 1, 1, full, 4),
        (1, 4, 8, 16, "float32", None, 1, 1, full, 1000),
        (2, 16, 96, 16, "float32", None, 2, 1, full, 32),
        (1, 4, 24, 1, "float32", None, 1, 1, full, 12),
        (1, 4, 24, 2, "float32", None, 4, 4, full, 8),
        (1, 64, 32, 16, "bfloat16", None, 1, 1, full, 32),
        (1, 40, 80, 9, "float32", None, 1, 1, full, 40),
        # chunks of 16 and 32 steps under longer tiles (checkpoints written between blocks),
        # L not a multiple of 16 (a chunk starting in the 4-step tail), segments with SEGS
        (2, 8, 88, 16, "float32", None, 1, 1, full, 16),
        (1, 8, 104, 7, "bfloat16", None, 1, 1, none, 32),
        (1, 32, 200, 16, "bfloat16", "float32", 1, 1, full, 16),
        # N > 16 (8 to 32 lanes per channel; one channel per warp from N 65): N past a
        # multiple of 4 and of a power of two, every IO/BC form, segments with SEGS
        (2, 8, 48, 17, "float32", None, 1, 1, full, 16),
        (1, 8, 40, 37, "bfloat16", None, 2, 1, full, 8),
        (1, 8, 72, 64, "float32", None, 1, 1, none, 1000),
        (2, 4, 56, 100, "float16", "float32", 1, 2, full, 24),
        (1, 8, 88, 128, "bfloat16", "float32", 1, 1, full, 16),
        (2, 16, 64, 128, "float32", None, 1, 1, full, 32),
    ]
    import run
    run.ss.TUNING["fwd_ring_max_n"] = 128
    run.ss.TUNING["fwd_ring_npt8_min_n"] = None  # 4 states per lane (8: the ring_npt8 list)
elif which == "ring_wide":
    # The ring forward in blocks of up to 512 threads (ssm_scan_fwd_ring_wide; run with SM=1 so
    # that the planner takes the widest): 16 channels of one warp each at N 128, 32 at N 64
    # (a B/C group of 32 channels), 128 at N 16, N past a multiple of 4, chunk carries, SEGS.
    import run
    run.ss.TUNING["fwd_ring_max_n"] = 128
    run.ss.TUNING["fwd_ring_wide_min_n"] = 1
    run.ss.TUNING["fwd_ring_npt8_min_n"] = None
    cases += [
        (1, 16, 72, 128, "float32", None, 1, 1, full, 32),
        (2, 32, 48, 64, "bfloat16", None, 1, 1, full, 16),
        (1, 32, 40, 61, "float16", "float32", 1, 1, none, 1000),
        (1, 128, 32, 16, "float32", None, 1, 1, full, 8),
        (1, 32, 56, 100, "bfloat16", "float32", 1, 2, full, 24),
    ]
elif which == "ring_npt8":
    # The ring forward and its summary at 8 states per lane (TUNING["fwd_ring_npt8_min_n"]):
    # 2 to 16 lanes a channel (N 9 to 128, past multiples of 8), wide blocks of 384 threads
    # (24 channels at N 128, 48 at N 64; run with SM=1 so that the planner takes the widest),
    # every IO/BC form, chunk carries, segments with SEGS, the summary at 4 states per lane as
    # by default (SUM8=1: at 8 too; SUM_ONLY=1: only the summary at 8, the main pass at 4).
    import run
    run.ss.TUNING["fwd_ring_max_n"] = 128
    run.ss.TUNING["fwd_ring_npt8_min_n"] = None if os.environ.get("SUM_ONLY") == "1" else 9
    run.ss.TUNING["fwd_sum_npt8_min_n"] = 9 if "1" in (os.environ.get("SUM8"), os.environ.get("SUM_ONLY")) else None
    run.ss.TUNING["fwd_ring_npt8_min_warps"] = 0  # (however thin the grid)
    cases += [
        (1, 48, 72, 128, "float32", None, 1, 1, full, 32),
        (2, 96, 48, 64, "bfloat16", None, 1, 1, full, 16),
        (1, 48, 40, 100, "float16", "float32", 1, 1, none, 1000),
        (1, 16, 56, 16, "float32", None, 1, 1, full, 8),
        (2, 8, 48, 9, "bfloat16", "float32", 1, 2, full, 24),
        (1, 16, 64, 17, "float32", None, 2, 1, full, 16),
        (1, 8, 40, 37, "float16", None, 1, 1, none, 8),
    ]
elif which == "bwd_ring":
    # The ring backward: several tiles per chunk (A tiles, scratch), chunks ending in half
    # sub-blocks, every IO/BC pair; run with SM=1 for blocks of several warps and with SEGS
    # (BSUM_NPT8=1: its summary at 8 states per lane from N 9).
    if os.environ.get("BSUM_NPT8") == "1":
        import run
        run.ss.TUNING["bwd_sum_npt8_min_n"] = 9
    for io, bc in (("float32", None), ("bfloat16", None), ("bfloat16", "float32"), ("float16", None)):
        cases.append((1, 32, 200, 16, io, bc, 1, 1, full, 200))
    cases += [
        (2, 64, 136, 16, "float32", None, 1, 1, full, 132),
        (1, 32, 96, 8, "float32", None, 1, 2, full, 36),
        (1, 64, 72, 3, "float32", None, 2, 1, full, 1000),
        (1, 64, 264, 16, "bfloat16", None, 2, 2, none, 80),
        (1, 16, 40, 16, "float32", None, 1, 1, full, 4),
    ]
elif which == "bwd_ring32":
    # The ring backward at N 17 to 32 in one pass (TUNING["bwd_ring_max_n"] 32: 4 states on up to
    # 8 lanes a channel, 4 channels a warp, 2 dB/dC sums a lane and step), its summary at 4 or
    # (BSUM_NPT8=1) 8 states per lane with SEGS; then N past 32 as slices of 32 states (the last
    # of 1, 5, 17 or 32). Run with SM=1 for blocks of several warps.
    import run
    run.ss.TUNING["bwd_ring_max_n"] = 32
    if os.environ.get("BSUM_NPT8") == "1":
        run.ss.TUNING["bwd_sum_npt8_min_n"] = 9
    from run import state_slices
    state_slices(True)
    cases += [
        (1, 16, 200, 32, "float32", None, 1, 1, full, 200),
        (1, 32, 96, 17, "bfloat16", None, 1, 2, full, 40),
        (2, 16, 136, 29, "float32", None, 2, 1, none, 132),
        (1, 16, 72, 24, "float16", "float32", 1, 1, full, 1000),
        (1, 8, 40, 32, "float32", None, 1, 1, full, 4),
        (1, 32, 64, 33, "float32", None, 1, 1, full, 32),
        (1, 32, 96, 37, "bfloat16", None, 1, 2, full, 48),
        (2, 8, 40, 64, "float32", None, 1, 1, none, 8),
        (1, 16, 48, 81, "float32", None, 2, 1, full, 1000),
    ]
elif which == "slices":
    # N > 16 as slices of 16 states through the ring backward (as STATE_SLICES=1):
    # last slices of 1, 5 and 16 states, several tiles per chunk, with and without options
    # and time segments (SEGS); each slice's ring backward adds into du, ddelta, dz; 16-bit u
    # (with 16-bit or float32 B and C) on float32 copies, its gradients rounded at the end.
    import run
    run.ss.TUNING["bwd_ring_max_n"] = 16  # (slices of 32: the bwd_ring32 list)
    from run import state_slices
    state_slices(True)
    cases += [
        (1, 32, 96, 37, "float32", None, 1, 2, full, 48),
        (2, 32, 40, 17, "float32", None, 1, 1, none, 8),
        (1, 16, 64, 32, "float32", None, 2, 1, full, 1000),
        (1, 32, 72, 33, "bfloat16", None, 1, 1, full, 24),
        (1, 32, 48, 21, "float16", "float32", 1, 2, none, 1000),
    ]
elif which == "n":
    for N in (17, 32, 33, 64, 100, 128, 129, 200, 256, 300, 512):
        cases.append((1, 4, 23, N, "float32", None, 1, 2, full, 9))
    for N in (17, 64, 128, 256):
        cases.append((1, 2, 23, N, "float32", None, 0, 0, full, 9))
elif which == "quads":
    # B and C staged 4 steps x 4 states at a time and the backward's dB/dC partials written 4
    # steps at a time (float or double rows 16-byte aligned at the tile: L a multiple of 4):
    # tiles starting on and off 4-step boundaries (chunks of 7, 8, 10, 12), aligned tiles of
    # 1 to 3 steps past a multiple of 4, N past a multiple of 4 and past 128 (2-step
    # sub-tiles), N <= 16 off the ring kernels (chunks of 6: fewer than 8 state quads), every
    # B/C form. (The ring backward at N <= 16 only: at N 17-32 it would take the aligned cases
    # from ssm_scan_bwd.)
    import run
    run.ss.TUNING["bwd_ring_max_n"] = 16
    for N, L, chunk in ((17, 24, 8), (64, 40, 12), (128, 36, 10), (130, 28, 12), (64, 64, 1000),
                        (33, 20, 20), (64, 28, 7), (160, 28, 7), (16, 24, 6), (5, 20, 6)):
        cases.append((1, 4, L, N, "float32", None, 1, 2, full, chunk))
    cases += [
        (2, 4, 24, 64, "float32", None, 0, 1, full, 8),
        (1, 4, 32, 40, "float32", None, 2, 0, none, 12),
        (1, 4, 28, 64, "bfloat16", "float32", 1, 1, full, 12),
        (1, 4, 28, 64, "float64", None, 1, 1, full, 8),
        (1, 2, 16, 256, "float64", None, 1, 1, full, 8),
    ]
elif which == "dtypes":
    for io in ("float16", "bfloat16", "float64"):
        for bc in dict.fromkeys((io, "float64" if io == "float64" else "float32")):
            cases.append((2, 8, 41, 16, io, bc, 1, 2, full, 16))
            cases.append((1, 4, 19, 64, io, bc, 0, 1, full, 5))
            cases.append((1, 4, 19, 3, io, bc, 2, 0, none, 6))
    cases.append((1, 2, 11, 200, "float64", None, 1, 1, full, 4))
    cases.append((1, 2, 11, 256, "float64", None, 0, 0, full, 4))
elif which == "bf":
    for io in ("bfloat16",):
        for bc in ("bfloat16", "float32"):
            cases.append((1, 4, 19, 3, io, bc, 2, 0, none, 6))
elif which == "big":
    cases += [
        (3, 64, 300, 16, "float32", None, 1, 1, full, 128),
        (2, 32, 257, 16, "float32", None, 4, 2, full, 64),
        (1, 16, 130, 64, "float32", None, 1, 1, full, 50),
        (2, 512, 40, 16, "float32", None, 1, 1, full, 40),
    ]
ok = True
for (batch, dim, L, N, io, bc, gb, gc, flags, chunk) in cases:
    p = make(rng, batch, dim, L, N, io=io, bc=bc, gb=gb, gc=gc, chunk=chunk, **flags)
    label = f"b{batch} d{dim} L{L} N{N} {io}/{bc or io} G{gb},{gc} {'full' if flags is full else 'none'} cs{chunk}"
    for dfin in (True, False) if flags is full else (False,):
        LAUNCHES.clear()
        ok &= check(p, rng, TOL[io], dfinal=dfin, label=label + f" dfin={dfin}")
        if which == "ring":  # every case of the list through the ring forward
            assert {"fwd_ring", "fwd_ring_wide"} & {k for k, _ in LAUNCHES}, label
        if which == "ring_npt8":  # ... at 8 states per lane
            fwd = {(k, pl["npt"]) for k, pl in LAUNCHES if k.startswith("fwd_") and "ring" in k}
            if os.environ.get("SUM_ONLY") == "1":
                assert fwd - {("fwd_ring", 4), ("fwd_ring_wide", 4), ("fwd_sum_ring", 8)} == set(), (label, fwd)
            else:  # (the main pass at 8; the summary, where one ran, at 8 or 4 as asked)
                sum_npt = 8 if os.environ.get("SUM8") == "1" else 4
                assert fwd and fwd - {("fwd_ring_wide", 8), ("fwd_sum_ring", sum_npt)} == set(), (label, fwd)
                assert ("fwd_ring_wide", 8) in fwd, (label, fwd)
        if which == "ring_wide":  # ... in blocks of more than 256 threads
            assert any(k == "fwd_ring_wide" and pl["threads"] > 256 for k, pl in LAUNCHES), label
        if which in ("slices", "bwd_ring32"):  # every slice through the ring backward, nothing else
            S = run.ss.TUNING["bwd_ring_max_n"]  # (each list sets its width)
            kinds = [k for k, _ in LAUNCHES]
            assert kinds.count("bwd_ring") == -(-N // S) and "bwd" not in kinds, kinds
            assert which == "slices" or any(pl["nsplit"] == 8 for k, pl in LAUNCHES if k == "bwd_ring"), label
print("ALL OK" if ok else "FAILURES")
sys.exit(0 if ok else 1)
