// Pair decode table for k = 5 (the wgmma kernels and the tensor-core GEMV): the k <= 4 pair code
// of kbit_lut.cuh (one byte of the group word: two 4-bit codes) plus the two fields' fifth bits is
// a 10-bit code, 1024 of them with C lane copies each: copy lane % C of code c at word C c + lane %
// C. With C = kLut5Copies = 8 (32 KB) lanes with another copy never share a bank, and the 4 lanes
// of one copy do when their codes differ and agree mod 4 (random codes: about 2-3 wavefronts per
// lookup). With C = 32 (128 KB, the dense wgmma kernel at one CTA per SM) every lane reads its own
// bank, as in the 32-copy k <= 4 tables: one wavefront.
#pragma once
#include "kbit_tile.cuh"

namespace kbit {

constexpr int kLut5Copies = 8;
constexpr int kLut5Words = 1024 * kLut5Copies;

// Code c: bits 0..3 and 4..7 are the low parts of the pair's first and second field (byte i of
// the group word), bits 8 and 9 their fifth bits. Entry: (codebook[first], codebook[second]) as two
// 16-bit values of type T, the first in the low half (as the k <= 4 tables), Copies times. Built
// from the lane codebook (lane l holds codebook[l]: lane_codebook<5>) by shuffles, so no load waits
// inside the loop; every thread of full warps calls it (tid's warp-uniform trip count needs
// nthreads a multiple of 32). One code per thread and iteration, its Copies / 4 16-byte stores
// starting at a lane-rotated chunk, so the 8 lanes of a quarter-warp (one store wavefront) hit 8
// distinct 16-byte bank groups (chunk 0 for every lane put 2 lanes (8 copies) or all 8 (32 copies)
// on one group). The caller's barrier publishes it.
template <typename T, int Copies = kLut5Copies>
__device__ __forceinline__ void build_k5_lut(uint32_t* tbl, float cbl, int tid, int nthreads) {
    constexpr int kQ = Copies / 4;  // 16-byte chunks per code: 2, 4 or 8
    static_assert(kQ == 2 || kQ == 4 || kQ == 8, "8, 16 or 32 copies");
    const int rot = ((tid & 31) >> (kQ == 8 ? 0 : kQ == 4 ? 1 : 2)) & (kQ - 1);
    for (int c = tid; c < 1024; c += nthreads) {
        const int lo = (c & 15) | ((c >> 8) & 1) << 4, hi = ((c >> 4) & 15) | ((c >> 9) & 1) << 4;
        const uint32_t w = pack2<T>(__shfl_sync(0xffffffffu, cbl, lo), __shfl_sync(0xffffffffu, cbl, hi));
        uint4* row = reinterpret_cast<uint4*>(tbl + c * Copies);
#pragma unroll
        for (int q = 0; q < kQ; ++q) row[(q + rot) & (kQ - 1)] = make_uint4(w, w, w, w);
    }
}

// The fifth bits of group g's fields as the four pairs' high code bits, byte i = (bit of field 2i)
// | (bit of field 2i + 1) << 1. Field n's fifth bit sits at bit (4n + g + 4) mod 32 of plane word 4
// (kbit_tile.cuh): rotated right by g + 4 (even fields) or g + 7 (odd ones).
__device__ __forceinline__ uint32_t k5_pair_hi(uint32_t w4, int g) {
    return (rotr32(w4, g + 4) & 0x01010101u) | (rotr32(w4, g + 7) & 0x02020202u);
}

// Byte offset of the table entry for pair byte i of group word gw whose high code bits are byte i
// of hi (k5_pair_hi), lane copy (copy4 = lane % Copies * 4) included. prmt puts the pair byte in byte 0,
// the high bits in byte 1 and zeros above (selector msb: the sign of hi's byte, which is 0).
template <int Copies = kLut5Copies>
__device__ __forceinline__ uint32_t k5_lut_off(uint32_t gw, uint32_t hi, int i, uint32_t copy4) {
    uint32_t c;
    const uint32_t sel = static_cast<uint32_t>(i) | (4u + i) << 4 | (0xCu + i) << 8 | (0xCu + i) << 12;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(c) : "r"(gw), "r"(hi), "r"(sel));
    return c * (Copies * 4u) + copy4;
}

}  // namespace kbit
