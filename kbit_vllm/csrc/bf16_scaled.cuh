// bf16 activations turned into fp16 times a power of two, so the GEMVs run their fp16 half2 FMA
// loops on bf16 x instead of converting every weight pair to fp32 (the dense and grouped stream-K
// GEMVs and the grouped slot GEMV stage x this way). The power of two is exact, and the caller
// multiplies its fp32 sums by the inverse.
#pragma once
#include "kbit_lut.cuh"

namespace kbit {

// The power of two that maps a row of max |x| = mx below 2^10 (so fp16 half2 partial sums of
// products with |w| <= 1, at most 16 per half in sk_unit and 8 in the slot and table GEMVs, stay
// far from overflow), and its inverse, which undoes it on output. From mx's exponent bits (mx <
// 2^(be - 126) for biased exponent be; subnormal mx clamps like tiny normals): no frexpf / ldexpf
// calls in the staging loops. Inf and NaN rows keep scale 1 and propagate.
__device__ __forceinline__ void x_pow2_scale(float mx, float& scale, float& inv) {
    int e = 0;
    if (mx > 0.f && mx < INFINITY) {
        const int be = (__float_as_int(mx) >> 23) & 0xff;
        e = min(max(136 - be, -120), 120);  // 10 - (be - 126)
    }
    scale = __int_as_float((127 + e) << 23);
    inv = __int_as_float((127 - e) << 23);
}

// (bf16, bf16) word -> (fp16, fp16) word of the values times a power of two (exact unless tiny).
__device__ __forceinline__ uint32_t bf16x2_to_scaled_h2(uint32_t u, float scale) {
    const float2 f = bf16x2_to_float2(u);
    return h2_bits(__floats2half2_rn(f.x * scale, f.y * scale));
}

// The eight bf16 values of v as fp16 times scale (bf16x2_to_scaled_h2 per word).
__device__ __forceinline__ uint4 bf16x8_to_scaled_h8(uint4 v, float scale) {
    return make_uint4(bf16x2_to_scaled_h2(v.x, scale), bf16x2_to_scaled_h2(v.y, scale),
                      bf16x2_to_scaled_h2(v.z, scale), bf16x2_to_scaled_h2(v.w, scale));
}

// max |x| over the eight bf16 values of v, compared as sign-cleared bits (monotonic for every
// non-NaN value). A NaN wins here and in the callers' atomicMax (scale 1), fmaxf callers drop
// it; either way the NaN itself reaches the outputs.
__device__ __forceinline__ float bf16x8_absmax(uint4 v) {
    constexpr uint32_t kAbs = 0x7fff7fffu;
    const uint32_t m2 = __vmaxu2(__vmaxu2(v.x & kAbs, v.y & kAbs), __vmaxu2(v.z & kAbs, v.w & kAbs));
    return __uint_as_float(max(m2 & 0xffffu, m2 >> 16) << 16);
}

// The same for fp16 x, which the dense GEMV's XS staging scales too so that its one flush per
// block holds for any fp16 row: max |x| of eight fp16 values (sign-cleared bits, as above) and the
// values times a power of two (exact unless tiny).
__device__ __forceinline__ float h8_absmax(uint4 v) {
    constexpr uint32_t kAbs = 0x7fff7fffu;
    const uint32_t m2 = __vmaxu2(__vmaxu2(v.x & kAbs, v.y & kAbs), __vmaxu2(v.z & kAbs, v.w & kAbs));
    return __half2float(__ushort_as_half(static_cast<unsigned short>(max(m2 & 0xffffu, m2 >> 16))));
}
__device__ __forceinline__ uint32_t h2_scaled(uint32_t u, float scale) {
    const float2 f = __half22float2(bits_h2(u));
    return h2_bits(__floats2half2_rn(f.x * scale, f.y * scale));
}
__device__ __forceinline__ uint4 h8_scaled(uint4 v, float scale) {
    return make_uint4(h2_scaled(v.x, scale), h2_scaled(v.y, scale), h2_scaled(v.z, scale), h2_scaled(v.w, scale));
}

}  // namespace kbit
