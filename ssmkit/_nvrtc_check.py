"""Compile ssmkit's CUDA kernels with NVRTC, without a GPU or a CUDA driver.

CuPy's own compile path asks the driver first, so it fails on machines with no
GPU; NVRTC itself needs none. This module calls NVRTC directly through
``ctypes`` with the source text, options and template name expressions that
the GPU backend uses at run time (:func:`ssmkit._gpu.compiler.kernel_source`,
:func:`ssmkit._gpu.compiler.compile_options`,
:func:`ssmkit._gpu.selective_scan.kernel_keys`), for
``--gpu-architecture=sm_90``. CI runs it (``tests/test_cuda_compile.py``) so
that a source that would not compile on the GPU never lands.

Run ``python -m ssmkit._nvrtc_check`` for a report.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["NVRTCError", "find_nvrtc", "load_nvrtc", "compile_program", "compile_kernels",
           "check_kernels"]

ARCH = "sm_90"


class NVRTCError(RuntimeError):
    """NVRTC failed; ``log`` holds the compiler's log."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message + (f"\n--- NVRTC log ---\n{log}" if log else ""))
        self.log = log


def _candidate_paths() -> list[str]:
    names = ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so")
    dirs: list[str] = []
    env = os.environ.get("SSMKIT_NVRTC")
    if env:
        return [env]
    # pip wheels: nvidia-cuda-nvrtc-cu12 (nvidia/cuda_nvrtc/lib), the CUDA 13
    # wheels (nvidia/cu13/lib), in every site-packages on sys.path.
    for entry in sys.path:
        base = Path(entry or ".") / "nvidia"
        if base.is_dir():
            dirs += sorted(glob.glob(str(base / "cu1*" / "lib")), reverse=True)
            dirs.append(str(base / "cuda_nvrtc" / "lib"))
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(var):
            dirs += [os.path.join(os.environ[var], "lib64"), os.path.join(os.environ[var], "lib")]
    dirs += ["/usr/local/cuda/lib64", "/usr/local/cuda/lib"]
    paths = [os.path.join(d, n) for d in dirs for n in names]
    paths = [p for p in paths if os.path.isfile(p)]
    found = ctypes.util.find_library("nvrtc")
    if found:
        paths.append(found)
    return paths


def find_nvrtc() -> str | None:
    """Path (or soname) of a loadable NVRTC library, or ``None``.

    Looks at ``$SSMKIT_NVRTC``, the lib folders of the ``nvidia-cuda-nvrtc``
    pip wheels, ``$CUDA_PATH``/``$CUDA_HOME``, ``/usr/local/cuda`` and
    ``ctypes.util.find_library("nvrtc")``, in that order.
    """
    for path in _candidate_paths():
        try:
            ctypes.CDLL(path)
        except OSError:
            continue
        return path
    return None


class _NVRTC:
    def __init__(self, path: str):
        self.path = path
        # NVRTC dlopens libnvrtc-builtins by soname at compile time; from a pip
        # wheel's folder (not on the loader's path) that fails unless the
        # builtins library is already loaded, so load it first.
        folder = os.path.dirname(path)
        if folder:
            for builtins in sorted(glob.glob(os.path.join(folder, "libnvrtc-builtins.so.*"))):
                if ".alt." not in builtins:
                    try:
                        ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
                    except OSError:
                        pass
        lib = ctypes.CDLL(path)
        c_char_pp = ctypes.POINTER(ctypes.c_char_p)
        prog_p = ctypes.POINTER(ctypes.c_void_p)
        sig = {
            "nvrtcVersion": [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)],
            "nvrtcCreateProgram": [prog_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
                                   c_char_pp, c_char_pp],
            "nvrtcDestroyProgram": [prog_p],
            "nvrtcAddNameExpression": [ctypes.c_void_p, ctypes.c_char_p],
            "nvrtcCompileProgram": [ctypes.c_void_p, ctypes.c_int, c_char_pp],
            "nvrtcGetProgramLogSize": [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)],
            "nvrtcGetProgramLog": [ctypes.c_void_p, ctypes.c_char_p],
            "nvrtcGetLoweredName": [ctypes.c_void_p, ctypes.c_char_p, c_char_pp],
            "nvrtcGetCUBINSize": [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)],
        }
        for name, argtypes in sig.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
        lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        self.lib = lib

    def version(self) -> tuple[int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._ok(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        return major.value, minor.value

    def _ok(self, status: int, what: str, log: str = "") -> None:
        if status != 0:
            msg = self.lib.nvrtcGetErrorString(status).decode(errors="replace")
            raise NVRTCError(f"{what} failed: {msg} ({status})", log)


_loaded: dict[str, _NVRTC] = {}


def load_nvrtc(path: str | None = None) -> _NVRTC:
    """Load NVRTC (``path``, or :func:`find_nvrtc`'s); raise ``NVRTCError`` if there is none."""
    path = path or find_nvrtc()
    if path is None:
        raise NVRTCError("no NVRTC library found (install nvidia-cuda-nvrtc-cu12 or set SSMKIT_NVRTC)")
    if path not in _loaded:
        _loaded[path] = _NVRTC(path)
    return _loaded[path]


def compile_program(source: str, name_expressions, options, *, filename: str = "ssmkit.cu",
                    nvrtc: _NVRTC | None = None) -> dict:
    """Compile ``source`` with NVRTC and lower ``name_expressions``.

    Parameters
    ----------
    source : str
        CUDA C++ source (no include path is given).
    name_expressions : sequence of str
        Template instantiations to compile and look up.
    options : sequence of str
        NVRTC options, e.g. ``("-std=c++17", "--gpu-architecture=sm_90")``.

    Returns
    -------
    dict
        ``lowered``: name expression -> mangled name; ``log``: the compiler log
        (warnings, and ptxas's report when ``--ptxas-options=-v`` is given);
        ``cubin_bytes``: size of the machine code.

    Raises
    ------
    NVRTCError
        With the compile log, when compilation or a name lookup fails.
    """
    nv = nvrtc or load_nvrtc()
    lib = nv.lib
    prog = ctypes.c_void_p()
    nv._ok(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), filename.encode(), 0, None, None),
           "nvrtcCreateProgram")
    try:
        exprs = [e.encode() for e in name_expressions]
        for e in exprs:
            nv._ok(lib.nvrtcAddNameExpression(prog, e), "nvrtcAddNameExpression")
        opts = [o.encode() for o in options]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        status = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        nv._ok(lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
        buf = ctypes.create_string_buffer(size.value + 1)
        nv._ok(lib.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        log = buf.value.decode(errors="replace")
        nv._ok(status, f"nvrtcCompileProgram ({filename})", log)
        lowered = {}
        for name, e in zip(name_expressions, exprs):
            out = ctypes.c_char_p()
            nv._ok(lib.nvrtcGetLoweredName(prog, e, ctypes.byref(out)), f"nvrtcGetLoweredName({name})", log)
            lowered[name] = out.value.decode()
        cubin = ctypes.c_size_t()
        nv._ok(lib.nvrtcGetCUBINSize(prog, ctypes.byref(cubin)), "nvrtcGetCUBINSize", log)
        return {"lowered": lowered, "log": log, "cubin_bytes": cubin.value}
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


_PTXAS_FN = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")


def parse_ptxas_report(log: str) -> dict:
    """Per mangled kernel name: registers, stack frame and spill bytes, from ptxas's ``-v`` log."""
    out: dict = {}
    current = None
    for line in log.splitlines():
        m = _PTXAS_FN.search(line)
        if m:
            current = m.group(1)
            out[current] = {}
            continue
        if current is None:
            continue
        m = _PTXAS_SPILL.search(line)
        if m:
            out[current].update(stack=int(m.group(1)), spill_stores=int(m.group(2)),
                                spill_loads=int(m.group(3)))
        m = _PTXAS_REGS.search(line)
        if m:
            out[current]["registers"] = int(m.group(1))
    return out


def compile_kernels(filename: str, name_expressions, *, arch: str = ARCH, per_program: int = 4,
                    jobs: int | None = None, ptxas_report: bool = True,
                    nvrtc_path: str | None = None, defines: tuple = ()) -> dict:
    """Compile instantiations of ``cuda_src/<filename>`` exactly as the run-time path would.

    Parameters
    ----------
    filename : str
        Source file of :func:`ssmkit._gpu.compiler.cuda_src_dir`.
    name_expressions : sequence of str
        Template instantiations.
    arch : str
        NVRTC ``--gpu-architecture`` (real architecture, so ptxas runs too).
    per_program : int
        Name expressions per NVRTC program (the source is parsed once per program).
    jobs : int, optional
        Programs compiled at once (threads; NVRTC releases the GIL). Default: CPU count.
    ptxas_report : bool
        Ask ptxas for its resource report and attach it to each result.
    nvrtc_path : str, optional
        The NVRTC library (default: :func:`find_nvrtc`).
    defines : tuple of str, optional
        ``NAME=VALUE`` macros of a variant the run-time path also compiles
        (:func:`ssmkit._gpu.compiler.compile_options`).

    Returns
    -------
    dict
        Name expression -> ``lowered`` (mangled name) and, with ``ptxas_report``,
        ``registers``, ``stack``, ``spill_stores``, ``spill_loads``.

    Raises
    ------
    NVRTCError
        The first failing program, with its log and the name expressions it held.
    """
    from ssmkit._gpu import compiler

    nv = load_nvrtc(nvrtc_path)
    options = list(compiler.compile_options(tuple(defines))) + [f"--gpu-architecture={arch}"]
    if ptxas_report:
        options.append("--ptxas-options=-v")
    source = compiler.kernel_source(filename)
    exprs = list(name_expressions)
    batches = [exprs[i:i + per_program] for i in range(0, len(exprs), per_program)]

    def run(batch):
        try:
            res = compile_program(source, batch, options, filename=filename, nvrtc=nv)
        except NVRTCError as e:
            raise NVRTCError("while compiling " + ", ".join(batch) + ":\n" + str(e), e.log) from None
        report = parse_ptxas_report(res["log"]) if ptxas_report else {}
        return {e: {"lowered": res["lowered"][e], **report.get(res["lowered"][e], {})}
                for e in batch}

    results: dict = {}
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        for part in pool.map(run, batches):
            results.update(part)
    return results


def check_kernels(keys=None, *, arch: str = ARCH, per_program: int = 4, jobs: int | None = None,
                  ptxas_report: bool = True, nvrtc_path: str | None = None) -> list[dict]:
    """Compile the selective scan's kernels as the run-time path would, for ``arch``.

    Parameters
    ----------
    keys : sequence of KernelKey, optional
        Default: every key :func:`ssmkit._gpu.selective_scan.kernel_keys` lists.
    arch, per_program, jobs, ptxas_report, nvrtc_path
        As for :func:`compile_kernels`.

    Returns
    -------
    list of dict
        Per key: ``key``, ``name_expression``, ``lowered`` (mangled name) and,
        with ``ptxas_report``, ``registers``, ``stack``, ``spill_stores``,
        ``spill_loads``.

    Raises
    ------
    NVRTCError
        The first failing program, with its log and the name expressions it held.
    """
    from ssmkit._gpu import selective_scan

    keys = list(selective_scan.kernel_keys() if keys is None else keys)
    exprs = [selective_scan.name_expression(k) for k in keys]
    results = compile_kernels(selective_scan.SOURCE_FILE, exprs, arch=arch,
                              per_program=per_program, jobs=jobs, ptxas_report=ptxas_report,
                              nvrtc_path=nvrtc_path)
    return [{"key": k, "name_expression": e, **results[e]} for k, e in zip(keys, exprs)]


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="every instantiation (default: the CI set)")
    ap.add_argument("--arch", default=ARCH)
    ap.add_argument("--jobs", type=int, default=None)
    args = ap.parse_args(argv)
    from ssmkit._gpu import selective_scan

    path = find_nvrtc()
    if path is None:
        print("no NVRTC library found", file=sys.stderr)
        return 2
    nv = load_nvrtc(path)
    print(f"NVRTC {'.'.join(map(str, nv.version()))} at {path}")
    keys = selective_scan.kernel_keys(full=args.all)
    t = time.time()
    rows = check_kernels(keys, arch=args.arch, jobs=args.jobs, nvrtc_path=path)
    print(f"{len(rows)} kernels compiled for {args.arch} in {time.time() - t:.1f} s")
    bad = 0
    for r in rows:
        spill = r.get("spill_stores", 0) + r.get("spill_loads", 0) + r.get("stack", 0)
        bad += spill > 0
        print(f"  {r['name_expression']:<62} regs {r.get('registers', '?'):>3}  "
              f"stack {r.get('stack', '?'):>4}  spill st/ld {r.get('spill_stores', '?')}/{r.get('spill_loads', '?')}")
    if bad:
        print(f"{bad} kernels use local memory", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
