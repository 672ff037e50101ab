"""The GPU backend's CUDA kernels compile with NVRTC for sm_90, as the GPU will compile them.

No GPU or CUDA driver is needed: ``ssmkit._nvrtc_check`` calls NVRTC directly with
the run-time path's source text, options and template name expressions. Without
an NVRTC library (``pip install nvidia-cuda-nvrtc-cu12``) these tests skip, unless
``SSMKIT_REQUIRE_NVRTC=1``, which turns the skip into a failure (for CI).
``SSMKIT_NVRTC_FULL=1`` compiles every instantiation instead of the representative
set (about 400 kernels; minutes).
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from ssmkit import _nvrtc_check
from ssmkit._gpu import compiler, selective_scan as ss

FULL = os.environ.get("SSMKIT_NVRTC_FULL") == "1"


def test_source_needs_no_include_path():
    src = compiler.kernel_source(ss.SOURCE_FILE)
    assert not re.search(r"^\s*#\s*include", src, re.M), "CUDA sources must be self-contained"
    assert compiler.compile_options()[0] == "-std=c++17"
    assert f"-DSSMKIT_SRC_HASH=0x{compiler.source_hash()}" in compiler.compile_options()


def test_compile_options_add_a_variants_defines_last():
    """A module variant (such as ssd's allow_tf32, SSM_TF32_PASSES=1) is the library's options
    with its defines appended, so it compiles and caches apart from the plain module."""
    plain = compiler.compile_options()
    variant = compiler.compile_options(("SSM_TF32_PASSES=1",))
    assert variant == plain + ("-DSSM_TF32_PASSES=1",)
    assert compiler.compile_options(()) == plain


def test_kernel_keys_cover_every_template_value():
    full, rep = ss.kernel_keys(full=True), ss.kernel_keys(full=False)
    names = [ss.name_expression(k) for k in full]
    assert len(set(names)) == len(names)
    assert set(rep) <= set(full)
    for field in ss.KernelKey._fields:
        assert {getattr(k, field) for k in rep} == {getattr(k, field) for k in full}, field
    # every state size the planner accepts maps to a listed (NPT, NSPLIT)
    for ct, top in ss.MAX_N.items():
        io = "float64" if ct == "float64" else "float32"
        splits = {(k.npt, k.nsplit) for k in full if k.io == io
                  and k.kind not in ("carry", "tile_sum", "seq_states") and k.kind not in ss._RING_KINDS}
        assert {ss.state_split(n, ct) for n in range(top + 1)} == splits
    # ... and of the ring kernels: the forward's up to N = 128, the backward's up to 32
    # (TUNING["bwd_ring_max_n"]); the ring forward and its summary also at 8 states per lane
    # (TUNING["fwd_ring_npt8_min_n"])
    for kind in ss._RING_KINDS:
        splits = {(k.npt, k.nsplit) for k in full if k.io == "float32" and k.kind == kind}
        top = 128 if kind.startswith("fwd") else 32
        want = {ss.ring_split(n) for n in range(top + 1)}
        if kind in ("fwd_ring_wide", "fwd_sum_ring", "bwd_sum_ring"):  # (8 states: the wide kernel)
            want |= {ss._fwd_ring_split(n, 1) for n in range(top + 1)}
        assert want == splits, kind


def test_kernels_compile_for_sm90(nvrtc_path):
    keys = ss.kernel_keys(full=FULL)
    rows = _nvrtc_check.check_kernels(keys, nvrtc_path=nvrtc_path)
    assert [r["key"] for r in rows] == keys
    for r in rows:
        assert r["lowered"].startswith("_Z"), r
        assert "registers" in r, r


def test_hot_kernels_keep_state_in_registers(nvrtc_path):
    # The Mamba-1 configuration (N = 16, per-step B and C): no local memory.
    npt, nsplit = ss.state_split(16)
    keys = [ss.KernelKey(kind, io, bc, npt, nsplit, True, True)
            for kind in ("fwd", "fwd_sum", "bwd", "bwd_sum", "fwd_ring", "fwd_sum_ring", "bwd_ring",
                         "bwd_sum_ring")
            for io, bc in (("bfloat16", "bfloat16"), ("float16", "float16"), ("float32", "float32"))]
    # the ring forward at N = 128 (32 lanes per channel, one channel per warp)
    keys += [ss.KernelKey(kind, io, bc, *ss.ring_split(n), True, True)
             for kind, n in (("fwd_ring", 128), ("fwd_sum_ring", 128), ("fwd_ring_wide", 128), ("fwd_ring_wide", 64))
             for io, bc in (("bfloat16", "bfloat16"), ("float32", "float32"))]
    # the ring backward at N = 32 (8 lanes per channel, TUNING["bwd_ring_max_n"] 32)
    keys += [ss.KernelKey(kind, io, bc, *ss.ring_split(32), True, True)
             for kind in ("bwd_ring", "bwd_sum_ring")
             for io, bc in (("bfloat16", "bfloat16"), ("float32", "float32"))]
    # ... and at 8 states per lane (16, 8 and 4 lanes per channel)
    keys += [ss.KernelKey(kind, io, bc, 8, nsplit, True, True)
             for kind, nsplit in (("fwd_ring_wide", 16), ("fwd_ring_wide", 8), ("fwd_ring_wide", 4),
                                  ("fwd_sum_ring", 16))
             for io, bc in (("bfloat16", "bfloat16"), ("float32", "float32"))]
    for r in _nvrtc_check.check_kernels(keys, nvrtc_path=nvrtc_path):
        # ptxas may park a few values that are needed only at a kernel's start
        # and end (offsets of the final writes) or once per tile (the backward's
        # staging of four rows at a time, measured 11-16% faster than one row
        # with 12 bytes less spilled; the ring backward's 16-bit instances, 7
        # words since B and C were staged with bank gaps, touched once per
        # 8-step sub-block at most, measured faster) in local memory: a few
        # words, rarely touched. More than that means state left the registers.
        assert r["stack"] <= 32 and r["spill_stores"] <= 32, r


@pytest.mark.parametrize("compute", ["float32", "float64"])
def test_launch_plans_meet_kernel_preconditions(compute):
    # The kernels trap when these fail; check the planner over awkward shapes.
    limits = dict(sm_count=132, smem_optin=227 * 1024)
    for N in (0, 1, 3, 4, 5, 16, 17, 33, 64, 100, 128, 129, 256):
        for dim, gb, gc in ((1536, 1, 1), (1536, 0, 0), (96, 3, 2), (6, 3, 0), (7, 7, 1), (3, 0, 3)):
            for batch, L, chunk in ((8, 2048, 2048), (1, 37, 7), (2, 5, 1), (1, 100, 10**9)):
                shape = dict(batch=batch, dim=dim, L=L, N=N, gb=gb, gc=gc, chunk_size=chunk,
                             compute=compute, **limits)
                for kind, plan in (("fwd", ss.plan_forward(**shape)), ("bwd", ss.plan_backward(**shape))):
                    ch, tl = plan["ch"], plan["tl"]
                    assert plan["threads"] == ch * plan["nsplit"]
                    assert plan["threads"] <= (ss.FWD_MAX_THREADS if kind == "fwd" else ss.BWD_MAX_THREADS)
                    assert ch & (ch - 1) == 0 and dim % ch == 0
                    for G in (gb, gc):
                        assert G == 0 or (dim // G) % ch == 0
                    assert tl % (plan["nsplit"] if kind == "fwd" else plan["ts"]) == 0
                    assert plan["npt"] * plan["nsplit"] >= N
                    assert plan["smem"] <= limits["smem_optin"]
                    nseg, seg_len = plan["nseg"], plan["seg_len"]
                    assert plan["blocks"] == batch * (dim // ch) * nseg
                    # segments: whole chunks, all non-empty, covering [0, L)
                    assert seg_len % min(chunk, L) == 0 and (nseg - 1) * seg_len < L <= nseg * seg_len


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_backend_runs_on_gpu(dtype):
    # Smoke test of the run-time path (compile through CuPy, launch, compare);
    # the public API's GPU tests are elsewhere.
    cp = pytest.importorskip("cupy")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except cp.cuda.runtime.CUDARuntimeError:
        pytest.skip("no CUDA device")
    from ssmkit import reference
    from ssmkit._problem import SelectiveScanProblem

    rng = np.random.default_rng(0)
    batch, dim, L, N = 2, 8, 37, 16
    arrs = dict(u=rng.standard_normal((batch, dim, L)), delta=0.5 * rng.standard_normal((batch, dim, L)),
                A=-np.exp(0.5 * rng.standard_normal((dim, N))), B=rng.standard_normal((batch, 2, N, L)),
                C=rng.standard_normal((batch, 1, N, L)), D=rng.standard_normal(dim),
                z=rng.standard_normal((batch, dim, L)), delta_bias=0.5 * rng.standard_normal(dim),
                initial_state=rng.standard_normal((batch, dim, N)))
    arrs = {k: v.astype(dtype) for k, v in arrs.items()}
    p = SelectiveScanProblem(**{k: cp.asarray(v) for k, v in arrs.items()}, delta_softplus=True,
                             chunk_size=16, xp=cp)
    y, final, ckpt = ss.selective_scan_forward(p, save_checkpoints=True)
    (y_ref, final_ref), pullback = reference.selective_scan_vjp(
        **{k: v for k, v in arrs.items() if k != "initial_state"}, delta_softplus=True,
        initial_state=arrs["initial_state"], return_final_state=True)
    rtol = 1e-4 if dtype == "float32" else 1e-10
    np.testing.assert_allclose(cp.asnumpy(y), y_ref, rtol=rtol, atol=rtol * np.abs(y_ref).max())
    np.testing.assert_allclose(cp.asnumpy(final), final_ref, rtol=rtol, atol=rtol * np.abs(final_ref).max())
    dy = rng.standard_normal((batch, dim, L)).astype(dtype)
    dfin = rng.standard_normal((batch, dim, N)).astype(dtype)
    grads = ss.selective_scan_backward(p, ckpt, cp.asarray(dy), cp.asarray(dfin))
    ref_grads = pullback(dy, dfin)
    for name in ref_grads._fields:
        want = getattr(ref_grads, name)
        got = cp.asnumpy(grads[name])
        assert got.shape == want.shape, name
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max(), err_msg=name)


@pytest.mark.parametrize("max_n, wide_min_n, npt8_min_n, bwd_max_n",
                         [(16, 33, None, 16), (128, 33, None, 16), (128, 1, None, 32), (128, 33, 9, 32),
                          (128, 1, 33, 16)])
def test_ring_plans_meet_kernel_preconditions(monkeypatch, max_n, wide_min_n, npt8_min_n, bwd_max_n):
    # The ring kernels trap when these fail (ssm_fwd_ring_body); plan_forward_ring returns
    # None where they do not apply (the forward: N up to TUNING["fwd_ring_max_n"]; blocks of
    # more than FWD_MAX_THREADS, ssm_scan_fwd_ring_wide's, from N = TUNING["fwd_ring_wide_min_n"];
    # 8 states per lane from N = TUNING["fwd_ring_npt8_min_n"], and N > 8, in wide blocks of at
    # most RING_FWD_WIDE_THREADS_NPT8 threads, not always a power of two); the backward: N up
    # to TUNING["bwd_ring_max_n"], 16 or 32).
    monkeypatch.setitem(ss.TUNING, "fwd_ring_max_n", max_n)
    monkeypatch.setitem(ss.TUNING, "bwd_ring_max_n", bwd_max_n)
    monkeypatch.setitem(ss.TUNING, "fwd_ring_wide_min_n", wide_min_n)
    monkeypatch.setitem(ss.TUNING, "fwd_ring_npt8_min_n", npt8_min_n)
    monkeypatch.setitem(ss.TUNING, "fwd_sum_npt8_min_n", npt8_min_n)
    monkeypatch.setitem(ss.TUNING, "bwd_sum_npt8_min_n", npt8_min_n)
    limits = dict(sm_count=132, smem_optin=227 * 1024)
    for io, bc in (("bfloat16", "bfloat16"), ("bfloat16", "float32"), ("float16", "float16"),
                   ("float32", "float32")):
        q = ss._ring_quantum(io, bc)
        assert q == max(4, 16 // ss._ITEMSIZE[io], 16 // ss._ITEMSIZE[bc])
        for N in (1, 3, 4, 5, 9, 16, 17, 33, 64, 100, 128, 129):
            for dim, gb, gc in ((1536, 1, 1), (1536, 0, 1), (96, 3, 2), (7, 7, 1)):
                for batch, L, chunk in ((8, 2048, 2048), (2, 32768, 256), (1, 40, 8), (1, 37, 7),
                                        (2, 8, 1), (1, 100, 10**9), (1, 16, 4), (8, 2048, 16),
                                        (2, 32768, 32), (1, 88, 16), (1, 48, 32)):
                    shape = dict(batch=batch, dim=dim, L=L, N=N, gb=gb, gc=gc, chunk_size=chunk,
                                 io=io, bc=bc, **limits)
                    plan = ss.plan_forward_ring(**shape)
                    cmax = min(chunk, L)
                    applies = N <= max_n and gb > 0 and gc > 0 and L % q == 0 and cmax % q == 0
                    assert (plan is not None) == applies, shape
                    if plan is None:
                        continue
                    ch, tl = plan["ch"], plan["tl"]
                    npad = plan["npt"] * plan["nsplit"]
                    npt8 = npt8_min_n is not None and N >= max(9, npt8_min_n)
                    # (8 states per lane only where their grid fills the SMs)
                    warps = lambda pl: pl["blocks"] * -(-pl["threads"] // 32)  # noqa: E731
                    thin = ss.TUNING["fwd_ring_npt8_min_warps"] * limits["sm_count"]
                    if plan["npt"] == 8:
                        assert npt8 and warps(plan) >= thin, shape
                    elif npt8:
                        plan8 = ss.plan_forward_ring(**shape, _split=ss._fwd_ring_split(N, npt8_min_n))
                        assert plan8 is None or warps(plan8) < thin, shape
                    assert plan["nsplit"] & (plan["nsplit"] - 1) == 0
                    assert N <= npad < max(2 * plan["npt"], 2 * N)
                    top = ((ss.RING_FWD_WIDE_THREADS_NPT8 if plan["npt"] == 8 else ss.RING_FWD_WIDE_THREADS)
                           if N >= wide_min_n else ss.FWD_MAX_THREADS)
                    assert plan["threads"] == ch * plan["nsplit"] <= top
                    assert plan["threads"] % 32 == 0 or plan["threads"] < 32
                    assert ch & (ch - 1) == 0 or plan["threads"] == ss.RING_FWD_WIDE_THREADS_NPT8
                    assert dim % ch == 0
                    assert (dim // gb) % ch == 0 and (dim // gc) % ch == 0
                    # chunks of whole 16-step blocks, shorter than L and the longest tile,
                    # do not shorten the tiles: the kernel writes their states between blocks
                    inside = cmax % 16 == 0 and cmax < min(L, _round_up(ss.TUNING["fwd_tl"], q))
                    assert plan["inside"] == inside, shape
                    assert tl % q == 0 and (tl % 16 == 0 if inside else tl <= max(cmax, q))
                    # tiles of two 16-step blocks or more that a chunk repeats: whole blocks
                    assert tl < 32 or cmax <= tl or tl % 16 == 0, shape
                    assert plan["sum_smem"] <= plan["smem"] <= limits["smem_optin"]
                    assert plan["smem"] == ss._ring_smem_bytes(ch, tl, N, npad, io, bc)
                    nseg, seg_len = plan["nseg"], plan["seg_len"]
                    assert plan["blocks"] == batch * (dim // ch) * nseg
                    assert seg_len % cmax == 0 and (nseg - 1) * seg_len < L <= nseg * seg_len
                    # its summary pass, with time split: sub-segments of whole quanta, any tiles
                    fr = plan["sum_ring"]
                    assert (fr is not None) == (nseg > 1), shape
                    if fr is not None:
                        sch, stl = fr["ch"], fr["tl"]
                        assert fr["seg_len"] * fr["split"] == seg_len and fr["seg_len"] % q == 0
                        assert (fr["npt"], fr["nsplit"]) == ss._fwd_ring_split(N, npt8_min_n)
                        assert fr["threads"] == sch * fr["nsplit"] <= ss.FWD_MAX_THREADS
                        assert sch & (sch - 1) == 0 and (dim // gb) % sch == 0 and (dim // gc) % sch == 0
                        assert stl % q == 0 and fr["smem"] <= limits["smem_optin"]
                        assert stl < 32 or fr["seg_len"] <= stl or stl % 16 == 0, shape
                        assert fr["smem"] == ss._ring_smem_bytes(sch, stl, N, fr["npt"] * fr["nsplit"], io, bc,
                                                                 kind="sum")
                    # The ring backward: the same case, and whole warps of channels.
                    bplan = ss.plan_backward_ring(**shape)
                    nsplit = ss.ring_split(N)[1]  # (4 states per lane, whatever the forward's)
                    ch_top = ss._pow2_divisor(ss._group_size(dim, gb, gc), 1 << 30)
                    assert (bplan is not None) == (N <= min(max_n, bwd_max_n) and ch_top >= 32 // nsplit), shape
                    if bplan is None:
                        continue
                    ch, tl = bplan["ch"], bplan["tl"]
                    assert bplan["threads"] == ch * nsplit <= ss.BWD_RING_MAX_THREADS
                    assert bplan["threads"] % 32 == 0 and ch & (ch - 1) == 0
                    assert (dim // gb) % ch == 0 and (dim // gc) % ch == 0
                    step = max(q, ss._BRING_SUB)
                    assert tl % step == 0 and tl & (tl - 1) == 0 and tl < 2 * max(cmax, step)
                    assert bplan["smem"] == ss._bwd_ring_smem_bytes(ch, tl, N, 4 * nsplit, io, bc)
                    assert bplan["smem"] <= limits["smem_optin"]
                    nseg, seg_len = bplan["nseg"], bplan["seg_len"]
                    assert bplan["blocks"] == batch * (dim // ch) * nseg
                    assert seg_len % cmax == 0 and (nseg - 1) * seg_len < L <= nseg * seg_len
                    # the state entering each 8-step sub-block of a chunk, per thread
                    assert bplan["scratch"] == (bplan["blocks"] * -(-cmax // tl) * (tl // 8)
                                                * bplan["threads"] * 4)
                    # its summary pass, with time split: the ring forward's staging, any tiles
                    sr = bplan["sum_ring"]
                    assert (sr is not None) == (nseg > 1), shape
                    if sr is not None:
                        sch, stl = sr["ch"], sr["tl"]
                        assert (sr["npt"], sr["nsplit"]) == ss._fwd_ring_split(N, npt8_min_n)
                        assert sr["threads"] == sch * sr["nsplit"] <= ss.FWD_MAX_THREADS
                        assert sch & (sch - 1) == 0 and (dim // gb) % sch == 0 and (dim // gc) % sch == 0
                        assert stl % q == 0 and sr["smem"] <= limits["smem_optin"]
                        assert sr["smem"] == ss._ring_smem_bytes(sch, stl, N, sr["npt"] * sr["nsplit"], io, bc,
                                                                 kind="bsum")
                        assert sr["seg_len"] * sr["split"] == seg_len and sr["seg_len"] % q == 0
    # Not for float64, nor for N > 128 (the backward: N > TUNING["bwd_ring_max_n"]) or B, C
    # constant in time.
    base = dict(batch=8, dim=1536, L=2048, N=16, gb=1, gc=1, chunk_size=2048, **limits)
    assert ss.plan_forward_ring(**base, io="float32", bc="float32") is not None
    assert ss.plan_forward_ring(**base, io="float64", bc="float64") is None
    if max_n == 128:
        assert ss.plan_forward_ring(**dict(base, N=128), io="float32", bc="float32")["nsplit"] == (
            16 if npt8_min_n else 32)
    else:
        assert ss.plan_forward_ring(**dict(base, N=17), io="float32", bc="float32") is None
    monkeypatch.setitem(ss.TUNING, "fwd_ring_max_n", 1000)  # never past 128
    assert ss.plan_forward_ring(**dict(base, N=129), io="float32", bc="float32") is None
    assert (ss.plan_backward_ring(**dict(base, N=17), io="float32", bc="float32") is None) == (bwd_max_n == 16)
    assert ss.plan_backward_ring(**dict(base, N=33), io="float32", bc="float32") is None
    assert ss.plan_forward_ring(**dict(base, gb=0), io="float32", bc="float32") is None
    # Steps in 32 bits inside the kernels: L < 2**31.
    assert ss.plan_forward_ring(**dict(base, batch=1, dim=8, L=2**31), io="float32", bc="float32") is None


def test_ring_whole_blocks_keep_the_plan(monkeypatch):
    # Cutting the ring forward's tiles to whole 16-step blocks (TUNING["ring_whole_blocks"])
    # shortens a tile, and nothing else: the same channels per block, blocks and time
    # segments (the summaries' too) as with the tile that fitted, so that the blocks per SM
    # the planner counted on stay true.
    limits = dict(sm_count=132, smem_optin=227 * 1024)
    cut = 0
    for io in ("bfloat16", "float32"):
        for batch, dim, L, chunk in ((64, 1536, 256, 256), (16, 1536, 512, 256), (8, 1536, 2048, 256),
                                     (2, 1536, 32768, 256), (1, 1536, 4096, 2048), (4, 96, 1000, 200),
                                     (3, 64, 384, 96), (1, 32, 40, 40)):
            shape = dict(batch=batch, dim=dim, L=L, N=16, gb=1, gc=1, chunk_size=chunk, io=io, bc=io,
                         **limits)
            plans = {}
            for whole in (False, True):
                monkeypatch.setitem(ss.TUNING, "ring_whole_blocks", whole)
                plans[whole] = ss.plan_forward_ring(**shape), ss.plan_backward_ring(**shape)
            for old, new in zip(plans[False], plans[True]):
                for key in ("ch", "blocks", "nseg", "seg_len", "threads"):
                    assert old[key] == new[key], (shape, key)
                assert new["tl"] <= old["tl"] and new["smem"] <= old["smem"], shape
                cut += new["tl"] < old["tl"]
                so, sn = old["sum_ring"], new["sum_ring"]
                assert (so is None) == (sn is None), shape
                if so is not None:
                    assert (so["ch"], so.get("split")) == (sn["ch"], sn.get("split")), shape
                    assert sn["tl"] <= so["tl"], shape
    assert cut > 0  # (the shapes include tiles that were not whole blocks)



@pytest.mark.parametrize("width", [16, 32])
def test_state_slices_where_they_were_faster(monkeypatch, width):
    # Width 16 (TUNING["bwd_ring_max_n"] 16, slices from N 65 as measured then): the backward
    # of N > 64 by slices of 16 states (_by_state_slices) against the forward+backward times
    # of benchmarks/NOTES.md, versions 19 and 22 (132 SMs): taken for float32 N 96 and 128 at
    # 8 x 1536 x 2048, not for N 64 there; for N 128 at batch 4 (one slice's grid 5.8 warps
    # per SM: faster in two lanes), not for N 256 at batch 2 (2.9: slower); 16-bit u alike
    # (on float32 copies) unless TUNING["bwd_state_slices_16bit"] is off; and the VJP's
    # checkpoint interval for them: the fewest whole slice tiles as large as u.
    # Width 32 (the default, version 24): slices of 32 from N 33 (N 64 and 128 measured
    # faster), N 17-32 in one ring pass; the same warps rule on one slice's (twice as wide) grid.
    from ssmkit._problem import SelectiveScanProblem

    monkeypatch.setitem(ss.TUNING, "bwd_ring_max_n", width)
    monkeypatch.setitem(ss.TUNING, "bwd_state_slices_from", 65 if width == 16 else 33)

    limits = dict(sm_count=132, smem_optin=227 * 1024, smem_per_sm=228 * 1024)
    monkeypatch.setattr(ss.compiler, "device_limits", lambda: limits)
    monkeypatch.setattr(ss, "_plan", lambda p, which, N=None, dtypes=None: ss._cached_plan(
        which, p.batch, p.dim, p.L, p.N if N is None else N, p.groups(p.B), p.groups(p.C),
        p.chunk_size, "float32", 0, tuple(sorted(ss.TUNING.items())),
        *(dtypes or (ss._dtype_name(p.io_dtype), ss._dtype_name(p.bc_dtype)))))

    def problem(batch, N, io=np.float32, dim=1536, L=2048):
        big = np.empty((batch, dim, L), dtype=io)  # (never touched)
        bc = np.zeros((batch, 1, N, L), dtype=io)
        return SelectiveScanProblem(u=big, delta=big, A=np.zeros((dim, N), np.float32), B=bc, C=bc,
                                    D=None, z=big, delta_bias=None, delta_softplus=True,
                                    initial_state=None, chunk_size=256, xp=np)

    faster = {(8, 96): True, (8, 128): True, (8, 64): width == 32, (2, 256): width == 32, (4, 128): True,
              (1, 256): False}  # (one slice's grid: 2.9 warps per SM at width 32)
    for (batch, N), want in faster.items():
        assert ss._by_state_slices(problem(batch, N)) == want, (batch, N)
        assert ss._by_state_slices(problem(batch, N, io=np.float16)) == want, (batch, N)
    assert ss.checkpoint_interval(problem(8, 128)) == 128  # 8 tiles of 16 steps: u's bytes
    assert ss.checkpoint_interval(problem(8, 96)) == 96
    assert ss.checkpoint_interval(problem(8, 128, io=np.float16)) == 256  # u of 2 bytes a step
    if width == 32:  # from N 33; N 17-32: one pass
        for N, want in ((33, True), (48, True), (64, True), (32, False), (17, False)):
            assert ss._by_state_slices(problem(8, N)) == want, N
        return
    # float32 N 40-48: 3 slices against ssm_scan_bwd's 64 padded states (N 40 and 48
    # measured faster; N 33, a last slice of one state, and N 64's 4 against 4 slower); not
    # for 16-bit u, nor N 17-32 (2 against 2)
    for N, want in ((33, False), (39, False), (40, True), (48, True), (49, False), (32, False), (17, False)):
        assert ss._by_state_slices(problem(8, N)) == want, N
    assert not ss._by_state_slices(problem(8, 48, io=np.float16))
    monkeypatch.setitem(ss.TUNING, "bwd_state_slices_padded_from", None)
    assert not ss._by_state_slices(problem(8, 48))
    monkeypatch.setitem(ss.TUNING, "bwd_state_slices_16bit", False)
    assert not ss._by_state_slices(problem(8, 128, io=np.float16))
    assert ss._by_state_slices(problem(8, 128))

def _round_up(x, m):
    return (x + m - 1) // m * m


def test_time_split_only_when_grid_is_small():
    limits = dict(sm_count=132, smem_optin=227 * 1024)
    # Mamba-1 long sequence, few channels: split; the summary + carry pay off.
    small = dict(batch=2, dim=1536, L=32768, N=16, gb=1, gc=1, chunk_size=256, compute="float32", **limits)
    for planner in (ss.plan_forward, ss.plan_backward):
        plan = planner(**small)
        assert plan["nseg"] > 1 and plan["seg_len"] % 256 == 0, plan
    # Many channels at N=128: the grid is full already.
    full = dict(batch=8, dim=1536, L=2048, N=128, gb=1, gc=1, chunk_size=256, compute="float32", **limits)
    for planner in (ss.plan_forward, ss.plan_backward):
        assert planner(**full)["nseg"] == 1
    # One chunk: nothing to split.
    one = dict(small, chunk_size=10**9)
    assert ss.plan_forward(**one)["nseg"] == 1


def test_forward_staging_choice(monkeypatch):
    # "auto": cp.async tile copies for 16-bit inputs in one time segment (measured faster),
    # direct staging for float32 and for split time (measured slower with the copies).
    limits = dict(sm_count=132, smem_optin=227 * 1024)
    monkeypatch.setitem(ss.TUNING, "fwd_async", "auto")
    short = dict(batch=8, dim=1536, L=2048, N=16, gb=1, gc=1, chunk_size=2048, compute="float32",
                 **limits)
    long = dict(short, batch=2, L=32768, chunk_size=256)
    assert ss.plan_forward(**short, io="bfloat16", bc="bfloat16")["async_"]
    assert not ss.plan_forward(**short, io="float32", bc="float32")["async_"]
    split = ss.plan_forward(**long, io="bfloat16", bc="bfloat16")
    assert split["nseg"] > 1 and not split["async_"]
    for mode in (True, False):
        monkeypatch.setitem(ss.TUNING, "fwd_async", mode)
        assert ss.plan_forward(**long, io="bfloat16", bc="bfloat16")["async_"] is mode
        assert ss.plan_forward(**short, io="float32", bc="float32")["async_"] is mode


def test_packed_rows_kernels_compile_for_sm90(nvrtc_path):
    """cuda_src/packed_rows.cu (packed sequences' copies), every element size, no local memory."""
    from ssmkit._gpu import packed

    src = compiler.kernel_source(packed.SOURCE_FILE)
    assert not re.search(r"^\s*#\s*include", src, re.M), "CUDA sources must be self-contained"
    rows = _nvrtc_check.compile_kernels(packed.SOURCE_FILE, packed.kernel_names(),
                                        nvrtc_path=nvrtc_path)
    assert set(rows) == set(packed.kernel_names())
    for name, row in rows.items():
        assert row["stack"] == 0 and row["spill_stores"] == 0, (name, row)
