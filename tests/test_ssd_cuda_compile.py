"""cuda_src/ssd.cu and ssd_mma.cu compile with NVRTC for sm_90, exactly as the GPU backend
compiles them (ssd_mma.cu: every instantiation, forward and backward, without register spills).

No GPU or driver needed. Without an NVRTC library these tests skip, unless
``SSMKIT_REQUIRE_NVRTC=1`` (then they fail). The default set covers every
template value (each dtype pair, each chunk-product kind, each column-group
count); ``SSMKIT_NVRTC_FULL=1`` compiles every instantiation (a few minutes).
"""

from __future__ import annotations

import os
import re

from ssmkit import _nvrtc_check
from ssmkit._gpu import compiler, ssd

FULL = os.environ.get("SSMKIT_NVRTC_FULL") == "1"


def representative_names():
    """Every template value at least once: each dtype pair's forward output and chunk state,
    every product kind and every column-group count VM, the passing kernels."""
    names = []
    for io, bc in ssd.DTYPE_PAIRS:
        names.append(ssd.mm_name("y", io, bc, ssd.column_groups(64, "float32")))
        names.append(ssd.kernel_names(io, bc, mm_kinds=())[4])  # forward chunk state
        names += [n for n in ssd.kernel_names(io, bc, mm_kinds=())
                  if n.startswith(("ssd_diag_cb", "ssd_chunk_cb", "ssd_bwd_rows", "ssd_bwd_gate",
                                   "ssd_sum_parts"))]
    for kind, V in (("ycore", 64), ("GB", 64), ("dB", 128), ("dC", 128)):
        names.append(ssd.mm_name(kind, "float32", "float32", ssd.column_groups(V, "float32")))
    # the tensor-core float products: every kind, and 16-bit inputs with float32 arithmetic
    names += [ssd.mm_tc_name(kind, "float32", "float32", nt) for kind in ssd.TC_KINDS
              if kind in ssd.MM_KINDS for nt in ssd.TC_NT]
    names += [ssd.mm_tc_name("y", io, bc, 8) for io, bc in ssd.DTYPE_PAIRS if io != "float64"]
    # GB of float32 x with the per-step pass as its epilogue (ROWS)
    names += [ssd.mm_tc_name("GB", "float32", "float32", nt, rows=True) for nt in ssd.TC_NT]
    names += [ssd.state_name(io, bc, adj, nt=nt) for io, bc in ssd.DTYPE_PAIRS
              if io != "float64" for adj in (False, True) for nt in ssd.TC_NT]
    # dB and dC summed over heads: both kinds at both widths, and every 16-bit input pair
    names += [ssd.hsum_name(kind, "float32", "float32", nt) for kind in ssd.HSUM_KINDS
              for nt in ssd.TC_NT]
    names += [ssd.hsum_name("dB", io, bc, 8) for io, bc in ssd.DTYPE_PAIRS if io != "float64"]
    names += [ssd.hblocks_name(io) for io, _ in ssd.DTYPE_PAIRS if io != "float64"]
    for vm in ssd.vm_values("float32"):
        names.append(ssd.mm_name("y", "float32", "float32", vm))
    for vm in ssd.vm_values("float64"):
        names.append(ssd.mm_name("dB", "float64", "float64", vm))
    for io in ("float32", "float64"):
        names += [n for n in ssd.kernel_names(io, io, mm_kinds=()) if "false>" not in n]
    return list(dict.fromkeys(names))


def all_names():
    names = []
    for io, bc in ssd.DTYPE_PAIRS:
        names += ssd.kernel_names(io, bc)
    return list(dict.fromkeys(names))


def test_source_needs_no_include_path():
    src = compiler.kernel_source(ssd.SOURCE_FILE)
    assert not re.search(r"^\s*#\s*include", src, re.M)


def test_representative_set_covers_every_template_value():
    def args(name):
        return [a.strip() for a in name[name.index("<") + 1:-1].split(",")]

    rep, full = representative_names(), all_names()
    assert set(rep) <= set(full)
    for kernel in {n.split("<")[0] for n in full}:
        full_args = [args(n) for n in full if n.startswith(kernel + "<")]
        rep_args = [args(n) for n in rep if n.startswith(kernel + "<")]
        for i in range(len(full_args[0])):
            assert {a[i] for a in rep_args} == {a[i] for a in full_args}, (kernel, i)


def test_kernels_compile_for_sm90(nvrtc_path):
    names = all_names() if FULL else representative_names()
    report = _nvrtc_check.compile_kernels(ssd.SOURCE_FILE, names, per_program=8,
                                          nvrtc_path=nvrtc_path)
    for name in names:
        assert report[name]["lowered"].startswith("_Z"), name
        assert "registers" in report[name], name


# --------------------------------------------------------------------------------------
# cuda_src/ssd_mma.cu: the tensor-core forward kernels (16-bit x, B, C)
# --------------------------------------------------------------------------------------

def mma_names():
    """Every instantiation: each 16-bit dtype, each state tile width NW, each column width PW."""
    return [n for io in ("float16", "bfloat16") for n in ssd.mma_kernel_names(io)]


def test_mma_source_needs_no_include_path():
    src = compiler.kernel_source(ssd.MMA_SOURCE_FILE)
    assert not re.search(r"^\s*#\s*include", src, re.M)


def assert_mma_kernels_compile(names, allowed, nvrtc_path, **options):
    """Compile ``names`` of ssd_mma.cu for sm_90 (``compile_kernels``'s ``options``; one
    program by default) and check that each is lowered, has ptxas's resource report, and
    spills at most ``allowed(name)`` bytes of stores and of loads."""
    options.setdefault("per_program", len(names))
    report = _nvrtc_check.compile_kernels(ssd.MMA_SOURCE_FILE, names, nvrtc_path=nvrtc_path,
                                          **options)
    for name in names:
        entry = report[name]
        assert entry["lowered"].startswith("_Z"), name
        assert "registers" in entry and "spill_stores" in entry, name
        bound = allowed(name)
        assert entry.get("spill_stores", 0) <= bound and entry.get("spill_loads", 0) <= bound, (
            name, entry)


def test_mma_kernels_compile_for_sm90_without_spills(nvrtc_path):
    names = mma_names()
    assert len(names) == 2 * (10 + len(ssd.MMA_WIDTHS))  # chunk state x 2, cb, walk, fwd x 6, outputs
    # Spilled accumulators would go through local memory in the inner loop. The one
    # exception: ssd_mma_fwd at NW = 128, where ptxas (168 registers, 3 blocks per SM)
    # spills a few of its walk's invariants before the walk and reloads them once per
    # 64-step tile (seen in its SASS); the form without spills measured 6% slower
    # (benchmarks/SSD.md). Its WALK form spills more (86 / 88 bytes); without spills, at 2
    # blocks per SM, its first form took 0.950 ms at the peer bfloat16 row against 0.685.
    def allowed(name):
        if not (name.startswith("ssd_mma_fwd<") and ", 128, " in name):
            return 0
        return 128 if name.endswith(", true>") and ", false, true>" in name else 16

    assert_mma_kernels_compile(names, allowed, nvrtc_path)


def test_tf32_forward_compiles_for_sm90(nvrtc_path):
    """ssd_tf32_fwd (the float32 forward in one kernel) at both state widths. At NW = 128
    ptxas (168 registers, 3 blocks per SM) keeps a few of the walk's invariants in local
    memory: stored before the walk, reloaded where a tile's copies are issued (seen in its
    SASS), at most 40 bytes; the products' accumulators stay in registers."""
    names = [ssd.tf32_fwd_name(n, keep) for n in (64, 128) for keep in (False, True)]
    assert_mma_kernels_compile(names, lambda name: 40 if "<128," in name else 0, nvrtc_path)


def test_tf32_backward_walk_compiles_for_sm90(nvrtc_path):
    """ssd_tf32_bwd (the float32 backward walk) at both state widths. At NW = 128 ptxas (168
    registers, 3 blocks per SM) keeps 8 bytes in local memory; without the L2 prefetch of x
    and ycore (SSD_TF32_BWD_PREFETCH=0) 156 / 176 bytes, in the set-up, the tile copies'
    address arithmetic and the chunk boundaries (seen in its SASS). At most 192 bytes either
    way, so that both forms pass; NW = 64 spills nothing."""
    names = [ssd.tf32_bwd_name(n) for n in (64, 128)]
    assert_mma_kernels_compile(names, lambda name: 192 if "<128>" in name else 0, nvrtc_path)


def mma_bwd_names():
    """Every backward instantiation: each 16-bit dtype, each product kind (ycore and GB also
    with the per-step work fused), each width VW."""
    return [n for io in ("float16", "bfloat16") for n in ssd.mma_bwd_kernel_names(io)]


def test_mma_backward_kernels_compile_for_sm90_without_spills(nvrtc_path):
    names = mma_bwd_names()
    assert len(names) == len(set(names)) == 2 * (6 * len(ssd.MMA_WIDTHS) + 11)
    # ssd_mma_bwd (the walk, up to 255 registers at 2 blocks per SM) keeps up to 24 bytes in
    # local memory (float16 at NW 128, with its boundary states' prefetch; 16 without)
    assert_mma_kernels_compile(names, lambda name: 24 if name.startswith("ssd_mma_bwd<") else 0,
                               nvrtc_path, per_program=-(-len(names) // 2), jobs=2)


def test_tf32_one_pass_variant_compiles_for_sm90(nvrtc_path):
    """The module variant of ssd's allow_tf32 (SSM_TF32_PASSES=1: every 3 x TF32 product as
    one TF32 product, ssd.cu's stages of hi only) of every float32 kernel on ssm_tf32.cuh
    compiles for sm_90: ssd.cu's tensor-core products, chunk states and head sums (lowered,
    with ptxas's report; their spills move with the NVRTC version, in either build, so they
    are not bounded here), and ssd_mma.cu's forward and backward walks within the spills
    counted below."""
    names = [n for n in representative_names()
             if ssd.on_tf32_header(n) and "ssm_half" not in n and "ssm_bf16" not in n]
    assert {n.split("<")[0] for n in names} == {
        "ssd_chunk_mm_tc", "ssd_chunk_state_tc", "ssd_chunk_hsum_tc", "ssd_chunk_hblocks_tc"}
    report = _nvrtc_check.compile_kernels(ssd.SOURCE_FILE, names, per_program=8,
                                          nvrtc_path=nvrtc_path, defines=ssd.TF32_ONE_PASS)
    for name in names:
        assert report[name]["lowered"].startswith("_Z"), name
        assert "registers" in report[name], name
    # ssd_mma.cu's walks: the forward without spills (24-32 bytes in the 3 x TF32 build at
    # NW 128, NVRTC 12.9); the backward walk at NW 128 spills 240 bytes of stores there (8 in
    # the 3 x TF32 build), at most 256 allowed
    mma = ([ssd.tf32_fwd_name(n, keep) for n in (64, 128) for keep in (False, True)]
           + [ssd.tf32_bwd_name(n) for n in (64, 128)])
    assert_mma_kernels_compile(mma, lambda name: 256 if name == "ssd_tf32_bwd<128>" else 0,
                               nvrtc_path, defines=ssd.TF32_ONE_PASS)
