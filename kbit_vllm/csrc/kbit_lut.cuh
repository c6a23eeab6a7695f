// The shared-memory pair table used by the table-decode GEMVs (k = 2..4).
//
// Entry e (e = two 4-bit codes) holds (codebook[e & 15], codebook[e >> 4]) as half2 and is
// replicated once per lane ([256][32] words, 32 KB), so a warp's 32 random lookups hit 32
// distinct banks. The tiled bit order (kbit_tile.cuh) gives, per group g, one word whose
// byte i holds the codes of elements 8i + 2g and 8i + 2g + 1, so one rotate + one lop3 makes the
// table address of a pair, and the pair multiplies the half2 (x[8i+2g], x[8i+2g+1]).
#pragma once
#include "kbit_tile.cuh"

namespace kbit {

constexpr int kLutWords = 256 * 32;  // [pair code][lane] half2 words (32 KB)

__device__ __forceinline__ uint32_t h2_bits(half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ half2 bits_h2(uint32_t u) { return *reinterpret_cast<half2*>(&u); }

// Shared address offset (bytes, lane column included) of the table entry for pair i of group g.
template <int I>
__device__ __forceinline__ uint32_t lut_off(uint32_t gw, int g, uint32_t lane4) {
    // rotr(gw, g) has code (g, n) in nibble n; rotating a further 8i - 7 puts byte i at bits 7..14.
    const uint32_t v = rotr32(gw, (g + 8 * I + 25) & 31);
    return (v & 0x7F80u) | lane4;
}

// Every thread of the block helps fill the table; the caller synchronizes before use.
template <int K>
__device__ __forceinline__ void build_pair_lut(uint32_t* tbl, const float* __restrict__ codebook) {
    constexpr int kMask = (1 << K) - 1;
    for (int i = threadIdx.x; i < 256 * 8; i += blockDim.x) {
        const int e = i >> 3, q = i & 7;
        const uint32_t w = h2_bits(__floats2half2_rn(__ldg(codebook + (e & kMask)), __ldg(codebook + ((e >> 4) & kMask))));
        reinterpret_cast<uint4*>(tbl + e * 32)[q] = make_uint4(w, w, w, w);
    }
}

// bf16 pair (lo, hi) of one 32-bit word as two floats (exact).
__device__ __forceinline__ float2 bf16x2_to_float2(uint32_t u) {
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xFFFF0000u));
}

}  // namespace kbit
