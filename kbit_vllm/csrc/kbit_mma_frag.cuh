// Tensor-core pieces shared by the dense and the grouped kbit MMA: B fragment registers from the
// pair table (k = 2..4) or the lane-codebook shuffle (k = 5), and one k16 step of MT x NS
// m16n8k16 MMAs over an x tile stored as 128-byte rows of XOR-swizzled 16-byte chunks.
#pragma once
#include "kbit_lut.cuh"
#include "mma_ptx.cuh"

namespace kbit {

// Product of two registers of two 16-bit values each (round to nearest).
template <typename T>
__device__ __forceinline__ uint32_t mul2(uint32_t a, uint32_t b);
template <>
__device__ __forceinline__ uint32_t mul2<half>(uint32_t a, uint32_t b) {
    return h2_bits(__hmul2(bits_h2(a), bits_h2(b)));
}
template <>
__device__ __forceinline__ uint32_t mul2<__nv_bfloat16>(uint32_t a, uint32_t b) {
    const __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a),
                                     *reinterpret_cast<const __nv_bfloat162*>(&b));
    return *reinterpret_cast<const uint32_t*>(&r);
}

// B register I (pair I of group g: b0 / b1 of the block's k16 half I / 2) of one n8 sub-tile:
// the table pair times the block scale pair s2.
template <typename T, int I>
__device__ __forceinline__ uint32_t lut_b(const char* tblc, uint32_t gw, uint32_t lane4, uint32_t s2) {
    return mul2<T>(*reinterpret_cast<const uint32_t*>(tblc + lut_off<I>(gw, lane4)), s2);
}

// The four B registers of one n8 sub-tile for k = 5 (codebook values by lane shuffle, times sc).
template <typename T, int K>
__device__ __forceinline__ void shfl_b4(const uint32_t (&p)[K], int g, float cbl, float sc, uint32_t (&b)[4]) {
    float v[8];
    decode_group<K>(p, g, cbl, v);
#pragma unroll
    for (int q = 0; q < 4; ++q) b[q] = pack2<T>(v[2 * q] * sc, v[2 * q + 1] * sc);
}

// acc[i][s] += x rows row0 + 16 i .. + 15 times B sub-tile s (registers b[s][0], b[s][1]) over
// k16 half kk of quantization block blk of the staged x tile at shared address a_base (rows
// kRowBytes apart).
template <typename T, int MT, int NS, int kRowBytes = 128>
__device__ __forceinline__ void mma_k16(float (&acc)[MT][NS][4], uint32_t a_base, int row0, int blk, int kk,
                                        int lane, const uint32_t (&b)[NS][2]) {
#pragma unroll
    for (int i = 0; i < MT; ++i) {
        const int r = row0 + i * 16 + (lane & 15);
        const int ch = blk * 4 + kk * 2 + (lane >> 4);
        uint32_t af[4];
        ptx::ldmatrix_x4(af, a_base + r * kRowBytes + ((ch ^ (r & 7)) << 4));
#pragma unroll
        for (int s = 0; s < NS; ++s) ptx::mma16816<T>(acc[i][s], af, b[s][0], b[s][1]);
    }
}

}  // namespace kbit
