"""Lazy compilation of ssmkit's CUDA sources through CuPy (NVRTC).

The CUDA sources live in ``cuda_src/``: at ``<repo>/cuda_src`` in a source
checkout, and installed as the package-data subpackage ``ssmkit.cuda_src``.
They include no CUDA header, so NVRTC needs no include path; a source file's
``#include "x.cuh"`` lines for files of the same folder are pasted in here
(:func:`kernel_source`), which also lets this module and
:mod:`ssmkit._nvrtc_check` hand NVRTC exactly the same text.

Nothing is compiled at import. :func:`get_kernel` compiles one template
instantiation (a *name expression* such as
``"ssm_scan_fwd<float, float, float, 4, 4, true, true>"``) at its first use
on a device and keeps it per (device, source file, name expression). CuPy
caches binaries on disk keyed by source and options; the options carry a
hash of every file in ``cuda_src/`` (``-DSSMKIT_SRC_HASH=...``), so an edit
to a header also invalidates that cache.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import threading
from pathlib import Path

__all__ = [
    "cuda_src_dir",
    "source_hash",
    "kernel_source",
    "compile_options",
    "get_kernel",
    "ensure_dynamic_smem",
    "device_limits",
]

_SOURCE_SUFFIXES = (".cu", ".cuh")
_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[ \t]*(?:\n|$)', re.M)
_PRAGMA_ONCE_RE = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+once[ \t]*$", re.M)


@functools.lru_cache(maxsize=None)
def cuda_src_dir() -> Path:
    """The folder that holds the CUDA sources.

    Returns
    -------
    pathlib.Path
        ``ssmkit/cuda_src`` when installed (package data), else
        ``<repo>/cuda_src`` beside the ``ssmkit/`` folder of a checkout.
    """
    pkg = Path(__file__).resolve().parent.parent  # .../ssmkit
    for candidate in (pkg / "cuda_src", pkg.parent / "cuda_src"):
        if (candidate / "selective_scan.cu").is_file():
            return candidate
    raise FileNotFoundError(
        "ssmkit: the CUDA sources were not found; looked for selective_scan.cu in "
        f"{pkg / 'cuda_src'} (installed package data) and {pkg.parent / 'cuda_src'} "
        "(source checkout)")


@functools.lru_cache(maxsize=None)
def source_hash() -> str:
    """A short hash of every ``.cu``/``.cuh`` file in :func:`cuda_src_dir` (names and bytes)."""
    h = hashlib.sha256()
    folder = cuda_src_dir()
    for path in sorted(p for p in folder.iterdir() if p.suffix in _SOURCE_SUFFIXES):
        h.update(path.name.encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def kernel_source(filename: str) -> str:
    """The text of ``cuda_src/<filename>`` with its local includes pasted in.

    Each included file is pasted once (its ``#pragma once`` dropped), between
    ``#line`` directives so compiler messages name the original file and line.

    Parameters
    ----------
    filename : str
        A file of :func:`cuda_src_dir`, e.g. ``"selective_scan.cu"``.

    Returns
    -------
    str
        Source text that needs no include path.
    """
    folder = cuda_src_dir()
    seen: set[str] = set()

    def expand(name: str) -> str:
        text = _PRAGMA_ONCE_RE.sub("", (folder / name).read_text())
        out, pos = [], 0
        for m in _INCLUDE_RE.finditer(text):
            inc = m.group(1)
            if not (folder / inc).is_file():
                raise FileNotFoundError(
                    f"ssmkit: {name} includes {inc!r}, which is not in {folder}; "
                    "the CUDA sources must include only each other")
            out.append(text[pos:m.start()])
            if inc not in seen:
                seen.add(inc)
                line_after = text.count("\n", 0, m.end()) + 1  # the line after the include
                out.append(f'#line 1 "{inc}"\n{expand(inc)}\n#line {line_after} "{name}"\n')
            pos = m.end()
        out.append(text[pos:])
        return "".join(out)

    seen.add(filename)
    return f'#line 1 "{filename}"\n' + expand(filename)


@functools.lru_cache(maxsize=None)
def compile_options(defines: tuple = ()) -> tuple:
    """NVRTC options shared by the run-time path and the CI check (no ``-arch``).

    ``defines`` (``NAME=VALUE`` strings) select a variant of a source, such as
    ``SSM_TF32_PASSES=1`` (ssd's ``allow_tf32``); they come last.

    CuPy picks ``-arch`` for the device at run time; :mod:`ssmkit._nvrtc_check`
    adds ``--gpu-architecture=sm_90``. ``SSMKIT_FWD_PREFETCH=0`` in the
    environment (read once) adds ``-DSSM_FWD_PREFETCH=0``, which turns off the
    forward's L2 prefetch of the next tile (for A/B timing); ``SSMKIT_CUDA_DEFINES``
    (space-separated ``NAME=VALUE``) defines macros that tune the kernels at compile time;
    ``SSMKIT_LINEINFO=1`` adds ``-lineinfo`` (source lines for profilers).
    """
    opts = ("-std=c++17", f"-DSSMKIT_SRC_HASH=0x{source_hash()}")
    if os.environ.get("SSMKIT_FWD_PREFETCH") == "0":
        # A/B switch for the forward's L2 prefetch of the next tile (selective_scan.cu).
        opts += ("-DSSM_FWD_PREFETCH=0",)
    # A/B switches of compile-time tuning macros, e.g. "SU_MIN_BLOCKS_16BIT=2 CC1D_PREFETCH=1".
    opts += tuple(f"-D{d}" for d in os.environ.get("SSMKIT_CUDA_DEFINES", "").split())
    if os.environ.get("SSMKIT_LINEINFO") == "1":
        # source lines in the binary, for profilers (benchmarks/ncu_lines.py)
        opts += ("-lineinfo",)
    return opts + tuple(f"-D{d}" for d in defines)


_lock = threading.Lock()
_kernels: dict = {}
_smem_set: dict = {}


def get_kernel(filename: str, name_expression: str, defines: tuple = ()):
    """The compiled kernel ``name_expression`` of ``cuda_src/<filename>`` on the current device.

    Compiles on first use per (device, file, name expression, defines); later calls
    return the cached ``cupy.RawKernel``.

    Parameters
    ----------
    filename : str
        Source file in :func:`cuda_src_dir`.
    name_expression : str
        The template instantiation, exactly as :mod:`ssmkit._gpu.selective_scan`
        spells it (also what NVRTC lowers).
    defines : tuple of str, optional
        ``NAME=VALUE`` macros of a variant of the source (:func:`compile_options`).

    Returns
    -------
    cupy.RawKernel
    """
    import cupy

    key = (cupy.cuda.runtime.getDevice(), filename, name_expression, tuple(defines))
    kernel = _kernels.get(key)
    if kernel is None:
        with _lock:
            kernel = _kernels.get(key)
            if kernel is None:
                module = cupy.RawModule(
                    code=kernel_source(filename),
                    options=compile_options(tuple(defines)),
                    name_expressions=[name_expression],
                )
                kernel = module.get_function(name_expression)  # compiles (or loads CuPy's cache)
                _kernels[key] = kernel
    return kernel


def ensure_dynamic_smem(kernel, key, nbytes: int) -> None:
    """Allow ``kernel`` (cached under ``key``) ``nbytes`` of dynamic shared memory.

    Launches whose static and dynamic shared memory add up to more than 48 KiB
    need the kernel's opt-in attribute raised first; it is raised once per
    kernel to the largest size asked so far.
    """
    if nbytes + int(getattr(kernel, "shared_size_bytes", 0) or 0) <= 48 * 1024:
        return
    import cupy

    k = (cupy.cuda.runtime.getDevice(), key)
    if _smem_set.get(k, 0) < nbytes:
        kernel.max_dynamic_shared_size_bytes = int(nbytes)
        _smem_set[k] = int(nbytes)


_limits: dict = {}


def device_limits() -> dict:
    """Limits of the current device, read from it at run time (cached per device).

    Returns
    -------
    dict
        ``sm_count``: multiprocessors; ``smem_optin``: most dynamic shared
        memory one block may opt in to (bytes); ``smem_per_sm``: shared memory
        per multiprocessor (bytes); ``max_warps_per_sm``, ``max_blocks_per_sm``,
        ``regs_per_sm``: the other residency limits; ``compute_capability``:
        major * 10 + minor (90 for sm_90).
    """
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    lim = _limits.get(dev)
    if lim is None:
        attrs = cupy.cuda.Device(dev).attributes
        lim = {
            "sm_count": int(attrs["MultiProcessorCount"]),
            "smem_optin": int(attrs["MaxSharedMemoryPerBlockOptin"]),
            "smem_per_sm": int(attrs["MaxSharedMemoryPerMultiprocessor"]),
            "max_warps_per_sm": int(attrs["MaxThreadsPerMultiProcessor"]) // 32,
            "max_blocks_per_sm": int(attrs.get("MaxBlocksPerMultiprocessor", 32)),
            "regs_per_sm": int(attrs["MaxRegistersPerMultiprocessor"]),
            "compute_capability": int(cupy.cuda.Device(dev).compute_capability),
        }
        _limits[dev] = lim
    return lim
