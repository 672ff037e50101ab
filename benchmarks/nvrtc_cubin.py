"""Write the cubin NVRTC builds for one kernel of cuda_src/, with -lineinfo and the options
the library compiles with (for benchmarks/ncu_lines.py when the profiled machine's binary
cannot be read back): same NVRTC version, same source, same options, same machine code.

    python3 benchmarks/nvrtc_cubin.py ssd_mma.cu "ssd_mma_chunk_out<ssm_bf16, 64, 128>" out.cubin
"""
import ctypes
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ssmkit import _nvrtc_check  # noqa: E402
from ssmkit._gpu import compiler  # noqa: E402


def main(filename, expr, out, arch="sm_90"):
    nv = _nvrtc_check.load_nvrtc()
    lib = nv.lib
    lib.nvrtcGetCUBIN.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nvrtcGetCUBIN.restype = ctypes.c_int
    prog = ctypes.c_void_p()
    src = compiler.kernel_source(filename).encode()
    nv._ok(lib.nvrtcCreateProgram(ctypes.byref(prog), src, filename.encode(), 0, None, None),
           "nvrtcCreateProgram")
    nv._ok(lib.nvrtcAddNameExpression(prog, expr.encode()), "nvrtcAddNameExpression")
    opts = [o.encode() for o in compiler.compile_options() + ("-lineinfo", f"--gpu-architecture={arch}")]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    nv._ok(lib.nvrtcCompileProgram(prog, len(opts), arr), "nvrtcCompileProgram")
    size = ctypes.c_size_t()
    nv._ok(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
    buf = ctypes.create_string_buffer(size.value)
    nv._ok(lib.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
    open(out, "wb").write(buf.raw)
    print(f"{out}: {size.value} bytes, NVRTC {nv.version()}")


if __name__ == "__main__":
    main(*sys.argv[1:])
