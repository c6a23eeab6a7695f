// Pair decode table for k = 2..4 (shared by the dense GEMV, the grouped GEMV and the grouped MMA).
//
// Shared memory holds [256 pair codes][32 lanes] 32-bit words: entry e = (codebook[e & 15],
// codebook[e >> 4]) as two 16-bit values, replicated per lane so a warp's 32 random lookups hit
// 32 distinct banks. Byte i of group_word(g) (kbit_tile.cuh) holds the codes of elements
// 8i + 2g (low nibble) and 8i + 2g + 1 (high nibble): one rotate and one mask give the table
// address of that pair. Pair i of group g is exactly one register of an
// mma.m16n8k16 B fragment for lane % 4 == g: i = 0 / 1 are b0 / b1 of the block's first k16,
// i = 2 / 3 those of its second k16.
#pragma once
#include "kbit_tile.cuh"

namespace kbit {

constexpr int kLutWords = 256 * 32;  // [pair code][lane] words (32 KB)

__device__ __forceinline__ uint32_t h2_bits(half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ half2 bits_h2(uint32_t u) { return *reinterpret_cast<half2*>(&u); }

// h + the four weight pairs w times the four fp16 x pairs of xv (one group of a staged block), in
// half2: the inner step of the table GEMVs' fp16 loops.
__device__ __forceinline__ half2 hfma2_x4(const half2 (&w)[4], uint4 xv, half2 h) {
    h = __hfma2(w[0], bits_h2(xv.x), h);
    h = __hfma2(w[1], bits_h2(xv.y), h);
    h = __hfma2(w[2], bits_h2(xv.z), h);
    return __hfma2(w[3], bits_h2(xv.w), h);
}

// bf16 pair (lo, hi) of one 32-bit word as two floats (exact).
__device__ __forceinline__ float2 bf16x2_to_float2(uint32_t u) {
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xFFFF0000u));
}

// Shared address offset (bytes, lane column included) of the table entry for pair I of a group
// whose group word (nibble n = field n) is v.
template <int I>
__device__ __forceinline__ uint32_t lut_off(uint32_t v, uint32_t lane4) {
    // rotating right by 8i - 7 puts byte i at bits 7..14
    return (rotr32(v, (8 * I + 25) & 31) & 0x7F80u) | lane4;
}

// Fill the table with 16-bit values of type P (half or __nv_bfloat16); bits of a code above k
// are masked, so entries for unused codes repeat valid ones. Caller synchronizes before use.
template <int K, typename P>
__device__ __forceinline__ void build_pair_lut(uint32_t* tbl, const float* __restrict__ codebook, int tid,
                                               int nthreads) {
    constexpr int kMask = (1 << K) - 1;
    for (int i = tid; i < 256 * 8; i += nthreads) {
        const int e = i >> 3, q = i & 7;
        const uint32_t w = pack2<P>(__ldg(codebook + (e & kMask)), __ldg(codebook + ((e >> 4) & kMask)));
        reinterpret_cast<uint4*>(tbl + e * 32)[q] = make_uint4(w, w, w, w);
    }
}

}  // namespace kbit
