// bf16 activations turned into fp16 times a power of two, so the GEMVs run their fp16 half2 FMA
// loops on bf16 x instead of converting every weight pair to fp32 (the dense and grouped stream-K
// GEMVs and the grouped slot GEMV stage x this way). The power of two is exact, and the caller
// multiplies its fp32 sums by the inverse.
#pragma once
#include "kbit_lut.cuh"

namespace kbit {

// The power of two that maps a row of max |x| = mx below 2^10 (so fp16 half2 partial sums of
// products with |w| <= 1, at most 16 per half in sk_unit and 8 in the slot GEMV, stay far from
// overflow), and its inverse, which undoes it on output. Inf rows keep scale 1 (NaN is ignored by
// fmaxf) and propagate.
__device__ __forceinline__ void x_pow2_scale(float mx, float& scale, float& inv) {
    int e = 0;
    if (mx > 0.f && mx < INFINITY) {
        frexpf(mx, &e);  // mx < 2^e
        e = min(max(10 - e, -120), 120);
    }
    scale = ldexpf(1.f, e);
    inv = ldexpf(1.f, -e);
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

// max |x| over the eight bf16 values of v (NaN ignored, as fmaxf does).
__device__ __forceinline__ float bf16x8_absmax(uint4 v) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    float mx = 0.f;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        const float2 f = bf16x2_to_float2(w[t]);
        mx = fmaxf(mx, fmaxf(fabsf(f.x), fabsf(f.y)));
    }
    return mx;
}

}  // namespace kbit
