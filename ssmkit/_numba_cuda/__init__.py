"""GPU kernels written in Numba CUDA: the alternative parallel scans.

They run on CuPy arrays (through ``__cuda_array_interface__``, no copies to the
host) and sit beside the fused CUDA C++ kernels of :mod:`ssmkit._gpu`, so the
two can be measured against each other.
"""
