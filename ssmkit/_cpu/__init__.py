"""CPU backend: Numba kernels on NumPy arrays.

Each submodule implements the backend contract of ``ssmkit._problem`` for one
operation; kernels compile on first use (and are cached on disk), never at import.
"""
