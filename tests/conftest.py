"""Fixtures shared by the test files."""

from __future__ import annotations

import os

import pytest

from ssmkit import _nvrtc_check


@pytest.fixture(scope="session")
def nvrtc_path():
    """The NVRTC library the CUDA compile tests use.

    Skips without one, unless ``SSMKIT_REQUIRE_NVRTC=1`` (CI), which makes a
    missing NVRTC a failure: every CUDA source must be checked there.
    """
    path = _nvrtc_check.find_nvrtc()
    if path is None:
        if os.environ.get("SSMKIT_REQUIRE_NVRTC") == "1":
            pytest.fail("SSMKIT_REQUIRE_NVRTC=1 but no NVRTC library was found "
                        "(pip install nvidia-cuda-nvrtc-cu12, or set SSMKIT_NVRTC to its path)")
        pytest.skip("no NVRTC library found (pip install nvidia-cuda-nvrtc-cu12)")
    return path
