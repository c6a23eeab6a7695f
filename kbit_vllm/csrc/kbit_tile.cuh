// The tiled kbit layout (formats/kbit_layout.py) and its cheap decode, shared by every kernel
// that reads packed_tiled [n_tiles, nb, k, 128] / absmax_tiled [n_tiles, nb, 128].
//
// Element e of a block is (group g, field n): g = (e >> 1) & 3, n = (e & 1) | (e >> 3) << 1.
// For k = 2, 3 bit b of element (g, n) sits at bit (4n + g + b) mod 32 of word b (bit planes);
// for k = 4, 5 bits 0..3 sit at bit 4n + b of word g (group words) and bit 4 (k = 5) at bit
// (4n + g + 4) mod 32 of word 4. group_word gives group g's codes as one word whose nibble n is
// field n's code (bits 0..3): the stored word for k >= 4, bit-selects of the planes and a
// rotation for k < 4. The codebook lives in lane registers (lane l holds codebook[l mod 2^k]) and
// is read with __shfl_sync, which only looks at the low 5 index bits, so no masking is needed:
// bits above k (garbage, see swap_groups) are ignored by the modulo.
#pragma once
#include "common.cuh"

namespace kbit {

constexpr int kTileN = 128;

__host__ __device__ constexpr int elem_group(int e) { return (e >> 1) & 3; }
__host__ __device__ constexpr int elem_field(int e) { return (e & 1) | ((e >> 3) << 1); }
__host__ __device__ constexpr int elem_of(int g, int n) { return 2 * g + (n & 1) + 8 * (n >> 1); }
__host__ __device__ constexpr int tiled_bit_pos(int e, int b) {
    return (4 * elem_field(e) + elem_group(e) + b) & 31;
}

__device__ __forceinline__ uint32_t rotr32(uint32_t x, int s) { return __funnelshift_r(x, x, s); }

// Lane register of the shuffle codebook.
template <int K>
__device__ __forceinline__ float lane_codebook(const float* codebook, int lane) {
    return codebook[lane & ((1 << K) - 1)];
}

// The bit-select of m ? a : b, written as lop3 in PTX: from (a & m) | (b & ~m) with constant masks
// the compiler regroups a tree of them into and-or chains of about 5 LOP3 per word.
__device__ __forceinline__ uint32_t bitsel(uint32_t m, uint32_t a, uint32_t b) {
    uint32_t d;  // truth table of m ? a : b over inputs (m, a, b) = (0xF0, 0xCC, 0xAA)
    asm("lop3.b32 %0, %1, %2, %3, 0xCA;" : "=r"(d) : "r"(m), "r"(a), "r"(b));
    return d;
}

// Words 0..3 in the other order: plane words -> unrotated group words, or back (the swap is its
// own inverse). Word g takes the bits at positions q with (q - g) mod 4 = b from word b, a tree of
// three bit-selects. The repack runs it (then rotates word g right by g) for k >= 4; for k < 4 it
// is the decode (bits of planes b >= k then hold bits of other planes, which every decoder
// ignores: the pair tables mask them, the lane codebook repeats with period 2^k).
template <int K>
__device__ __forceinline__ uint32_t swap_groups(const uint32_t* p, int g) {
    const uint32_t m0 = 0x11111111u << g;                    // bit 0 of each code
    const uint32_t m01 = m0 | (0x11111111u << ((g + 1) & 3));  // bits 0 and 1
    if constexpr (K == 2) return bitsel(m0, p[0], p[1]);
    if constexpr (K == 3) return bitsel(m01, bitsel(m0, p[0], p[1]), p[2]);
    return bitsel(m01, bitsel(m0, p[0], p[1]), bitsel(0x11111111u << ((g + 2) & 3), p[2], p[3]));
}

// Bits 0..min(K,4)-1 of group g's codes, one word, nibble n = field n: for K >= 4 the stored
// group word (a select when g is not a compile-time constant), for K < 4 the planes' bit-selects
// (positions 4n + g + b) rotated right by g.
template <int K>
__device__ __forceinline__ uint32_t group_word(const uint32_t* p, int g) {
    if constexpr (K >= 4) return g == 0 ? p[0] : g == 1 ? p[1] : g == 2 ? p[2] : p[3];
    return rotr32(swap_groups<K>(p, g), g);
}

// Codebook index of field n given xr = group_word and zr = rotr(word 4, g) (k=5 only).
template <int K>
__device__ __forceinline__ uint32_t field_index(uint32_t xr, uint32_t zr, int n) {
    if constexpr (K == 5) {
        const uint32_t a = n ? rotr32(xr, 4 * n) : xr;
        const uint32_t c = n ? rotr32(zr, 4 * n) : zr;
        return (a & 0xFu) | (c & 0x10u);
    } else {
        return n ? (xr >> (4 * n)) : xr;  // bits >= 5 are ignored by the shuffle
    }
}

// Decode the 8 codebook values (unscaled) of group g from the k plane words.
template <int K>
__device__ __forceinline__ void decode_group(const uint32_t* p, int g, float cbl, float (&v)[8]) {
    const uint32_t xr = group_word<K>(p, g);
    const uint32_t zr = K == 5 ? rotr32(p[K == 5 ? 4 : 0], g) : 0u;
#pragma unroll
    for (int n = 0; n < 8; ++n)
        v[n] = __shfl_sync(0xffffffffu, cbl, static_cast<int>(field_index<K>(xr, zr, n)));
}

// Two floats -> one 32-bit register of two 16-bit values (a in the low half), round to nearest.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b);
template <>
__device__ __forceinline__ uint32_t pack2<half>(float a, float b) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
}

}  // namespace kbit
