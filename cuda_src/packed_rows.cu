// Rows of packed sequences (the selective scan's seq_idx / cu_seqlens) copied into the
// padded rows of a call of their own, and back; ssmkit/_selective_scan_packed.py plans
// them, ssmkit/_cpu/packed.py does the same on the CPU.
//
// Padded row r holds steps off[r] + j of batch row row[r] at its columns lo[r] <= j < hi[r]
// and zeros elsewhere. Arrays are (rows, C, steps), C-contiguous; T is an unsigned integer
// of the element's size (the bits are copied). One block per (padded row, c) line, its
// threads along the steps: no division per element, offsets in 64 bits.

template <typename T>
__global__ void ssm_pack_rows(const T* __restrict__ src, T* __restrict__ dst, const long long* __restrict__ row,
                              const long long* __restrict__ off, const int* __restrict__ lo,
                              const int* __restrict__ hi, int C, long long L, int Lp) {
    const long long rc = blockIdx.x;  // (padded row, c)
    const int r = (int)(rc / C), c = (int)(rc % C);
    const int a = lo[r], b = hi[r];
    const long long at = ((long long)row[r] * C + c) * L + off[r];  // + j: step j's element
    T* const out = dst + rc * Lp;
    for (int j = threadIdx.x; j < Lp; j += blockDim.x) out[j] = (j >= a && j < b) ? src[at + j] : T(0);
}

template <typename T>
__global__ void ssm_unpack_rows(const T* __restrict__ src, T* __restrict__ dst, const long long* __restrict__ row,
                                const long long* __restrict__ off, const int* __restrict__ lo,
                                const int* __restrict__ hi, int C, long long L, int Lp) {
    const long long rc = blockIdx.x;
    const int r = (int)(rc / C), c = (int)(rc % C);
    const T* const in = src + rc * Lp;
    const long long at = ((long long)row[r] * C + c) * L + off[r];
    for (int j = lo[r] + (int)threadIdx.x; j < hi[r]; j += blockDim.x) dst[at + j] = in[j];
}
