// ssm_tf32.cuh: float products at nearly float32 accuracy on TF32 tensor cores (sm_80 and later),
// for the float32 kernels of ssd.cu and ssd_mma.cu ("3 x TF32").
// A float operand x is split into hi = tf32(x) and lo = x - hi cut to TF32, and a b is summed as
// a_lo b_hi + a_hi b_lo + a_hi b_hi (the dropped a_lo b_lo is below float32's rounding). hi + lo
// keeps about 22 of x's 24 significant bits (lo's last bits are cut).
// Fragments of mma.m16n8k8 .tf32 (PTX ISA; g = lane / 4, t = lane % 4):
//   A (16 x 8): a0 = A[g][t], a1 = A[g+8][t], a2 = A[g][t+4], a3 = A[g+8][t+4];
//   B (8 x 8):  b0 = B[t][g], b1 = B[t+4][g];
//   C/D (16 x 8): d0, d1 = D[g][2t, 2t+1], d2, d3 = D[g+8][2t, 2t+1].
// The k index may be permuted, alike in A and B: with k slot t <-> k 2t and slot t + 4 <->
// 2t + 1, an accumulator tile (columns 2t, 2t + 1 in d0, d1) is the A fragment
// {d0, d2, d1, d3} of the next product.
//
// SSM_TF32_PASSES 1 (a module compiled for ssd's allow_tf32) makes every such product one
// TF32 product a_hi b_hi, the precision of a plain TF32 matrix product: lo is zero, so the
// compiler drops its splits and its two products, and the same kernels run about a third of
// their tensor-core work.
#pragma once

#ifndef SSM_TF32_PASSES
#define SSM_TF32_PASSES 3
#endif
#if SSM_TF32_PASSES != 1 && SSM_TF32_PASSES != 3
#error "SSM_TF32_PASSES must be 1 or 3"
#endif

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define SSM_TC_ARCH 1
#else
#define SSM_TC_ARCH 0  // compiled for older devices only so that the module builds
#endif

// hi = x rounded to TF32, to nearest with ties away from zero (cvt.rna.tf32.f32's result for
// finite x, as an integer add on the bits: the magnitude rounds half up, and a carry into the
// exponent is the right result; 2 instructions where cvt.rna took about 5); lo = x - hi
// (exact) cut to TF32, an error of at most 2^-21 |x| (rounding it too would cost more).
__device__ __forceinline__ void ssm_tf32_split(float x, unsigned& hi, unsigned& lo) {
    hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
#if SSM_TF32_PASSES == 3
    lo = __float_as_uint(x - __uint_as_float(hi)) & 0xffffe000u;
#else
    lo = 0u;
#endif
}

// d += a b, one m16n8k8 TF32 product.
__device__ __forceinline__ void ssm_mma_tf32(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                             unsigned b1) {
#if SSM_TC_ARCH
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

// A 3 x TF32 operand fragment: hi and lo parts.
struct ssm_tc_a { unsigned hi[4], lo[4]; };
struct ssm_tc_b { unsigned hi0, hi1, lo0, lo1; };

// d += a b in 3 x TF32, the small terms first (SSM_TF32_PASSES 1: a_hi b_hi only).
__device__ __forceinline__ void ssm_mma3(float (&d)[4], const ssm_tc_a& a, const ssm_tc_b& b) {
#if SSM_TF32_PASSES == 3
    ssm_mma_tf32(d, a.lo, b.hi0, b.hi1);
    ssm_mma_tf32(d, a.hi, b.lo0, b.lo1);
#endif
    ssm_mma_tf32(d, a.hi, b.hi0, b.hi1);
}

// The A fragment of a product from an accumulator tile d (16 rows x 8 columns as mma leaves
// it): columns 2t, 2t + 1 become k slots t, t + 4, split into hi and lo.
__device__ __forceinline__ ssm_tc_a ssm_tc_frag_acc(const float (&d)[4]) {
    ssm_tc_a a;
    ssm_tf32_split(d[0], a.hi[0], a.lo[0]);
    ssm_tf32_split(d[2], a.hi[1], a.lo[1]);
    ssm_tf32_split(d[1], a.hi[2], a.lo[2]);
    ssm_tf32_split(d[3], a.hi[3], a.lo[3]);
    return a;
}
