"""Fixtures shared by the test files."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from ssmkit import _nvrtc_check

# Hypothesis draws fresh examples on every run. SSMKIT_HYPOTHESIS_PROFILE=ci (set by .ci/run)
# makes them the same on every run instead: a gate should not pass or fail by chance. Fresh
# examples still come from every other run (a developer's, the GPU runs).
settings.register_profile("ci", derandomize=True)
settings.load_profile(os.environ.get("SSMKIT_HYPOTHESIS_PROFILE", "default"))


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
