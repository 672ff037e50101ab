"""The tensor-core convolution kernels on the CPU, through the host emulation.

CI has no GPU; tests/emulation builds the CUDA source as C++ with the warp-level operations
(mma.sync, movmatrix, shuffles) emulated per the PTX ISA and checks cc1d_fwd_mma and
cc1d_bwd_mma against the float64 reference on a few lengths around the chunk and span edges.
The full sweep (every width and both 16-bit types) is
``python3 tests/emulation/causal_conv1d/emu.py mma``.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ (C++20) for the emulation")
def test_tensor_core_convolution_kernels_in_emulation():
    pytest.importorskip("ml_dtypes")
    sys.path.insert(0, os.path.join(HERE, "emulation", "causal_conv1d"))
    try:
        import emu
    finally:
        sys.path.pop(0)
    cases = [(8, 128), (130, 128), (264, 256), (390, 384)]
    worst, fails = emu.run_mma(["bfloat16"], [3, 8], cases=cases, asan=False)
    assert not fails, fails
    assert {name for _, name in worst} == {"y", "final", "dx", "dw", "db"}
