// Stream-K GEMV building blocks (k = 2..5), shared by the dense stream-K GEMV and the grouped (MoE)
// stream-K GEMV, and the wide pair table also used by the grouped MMA.
//
// Work unit = (tile of 128 rows, one 32-wide input block): in the tiled layout its k planes of
// 128 words start at word unit * 128k. A lane owns 4 rows: one uint4 per plane (rows 4l..4l+3)
// and one word of absmax per unit. A pair of codes becomes its table address in one byte permute
// (the pair byte next to the lane's byte offset, in a table with a 256-byte row per entry), then
// one shared load and one half2 FMA. k = 5 looks its 10-bit pair codes up in kbit_lut5.cuh's
// table with 32 lane copies (128 KB: every lane reads its own bank, as in the wide table). x is
// read straight from global memory (a warp-uniform address, so one L1 transaction per 16 bytes).
// Partial tiles are added into a zeroed fp32 accumulator with vector reductions in L2
// (red_add4, stream_k.cuh); the order of those additions varies from run to run.
#pragma once
#include "bf16_scaled.cuh"
#include "kbit_lut.cuh"
#include "kbit_lut5.cuh"
#include "stream_k.cuh"

#include <type_traits>

namespace kbit {

constexpr int kWideLutWords = 256 * 64;  // one 256-byte row per pair code, columns 0..31 used
constexpr int kSkLut5Copies = 32;                      // k = 5: one bank per lane
constexpr int kSkLut5Words = 1024 * kSkLut5Copies;     // 128 KB

// E4M4 without a branch: normal codes are the float bits (raw << 19) + (116 << 23); for e = 0
// that formula gives 2^-11 + m 2^-15, and the subnormal value m 2^-14 is twice the excess.
__device__ __forceinline__ float decode_e4m4_fast(uint32_t raw) {
    const float f = __uint_as_float((raw << 19) + (116u << 23));
    return raw < 16u ? fmaf(f, 2.f, -0x1p-10f) : f;
}

// Byte offset of the table entry for pair byte i of v (lane column included): one byte permute
// puts the lane's byte offset (lane * 4 < 256) in byte 0 and pair byte i in byte 1.
__device__ __forceinline__ uint32_t wide_lut_off(uint32_t v, int i, uint32_t lane4) {
    return __byte_perm(v, lane4, 0x5504u | (static_cast<uint32_t>(i) << 4));
}

// Every thread helps fill the [256][RowWords]-word table (columns 0..31 used) with 16-bit pairs of
// type P (half or __nv_bfloat16); caller synchronizes. RowWords = 32 is the compact table of
// kbit_wgmma.cu (offsets wide_lut_off(v, i, lane * 8) / 2).
template <int K, typename P = half, int RowWords = 64>
__device__ __forceinline__ void build_wide_lut(uint32_t* tbl, const float* __restrict__ codebook) {
    constexpr int kMask = (1 << K) - 1;
    for (int i = threadIdx.x; i < 256 * 8; i += blockDim.x) {
        const int e = i >> 3, q = i & 7;
        const uint32_t w = pack2<P>(__ldg(codebook + (e & kMask)), __ldg(codebook + ((e >> 4) & kMask)));
        reinterpret_cast<uint4*>(tbl + e * RowWords)[q] = make_uint4(w, w, w, w);
    }
}

// The four E4M4 scales of an absmax word (byte r = row r), exact. raw << 6 read as fp16 bits is
// exactly the value / 16 for every code (e >= 1: 2^(e-15) (1 + m/16) against 2^(e-11) (1 + m/16);
// e = 0: the fp16 subnormal m 2^-18 against m 2^-14), and times 16 it is a normal fp16: two byte
// permutes, two shifts, two half2 multiplies and four conversions for four rows.
__device__ __forceinline__ void decode_e4m4_x4(uint32_t a, float (&s)[4]) {
    const half2 k16 = __float2half2_rn(16.f);
    const float2 lo = __half22float2(__hmul2(bits_h2(__byte_perm(a, 0u, 0x4140u) << 6), k16));
    const float2 hi = __half22float2(__hmul2(bits_h2(__byte_perm(a, 0u, 0x4342u) << 6), k16));
    s[0] = lo.x;
    s[1] = lo.y;
    s[2] = hi.x;
    s[3] = hi.y;
}

// build_wide_lut from the lane codebook (lane l holds codebook[l mod 2^K]: lane_codebook) by
// shuffles, so no load waits inside the loop; every thread of full warps calls it. One row per
// thread: two shuffles per row, then the row's 8 uint4 stores, starting at column lane mod 8 so
// each quarter-warp's stores hit 8 distinct bank groups (with a thread per uint4 and two shuffles
// per store the table was ready ~0.35 us later, H200 session 23). The stream-K GEMVs' staged-x
// prologues use it; the other kernels keep build_wide_lut (the MMA built this way ran 0.3-1.7 us
// slower at M=16, H200 session 15).
template <int K, typename P = half, int RowWords = 64>
__device__ __forceinline__ void build_wide_lut_lanes(uint32_t* tbl, float cbl) {
    const int lane = threadIdx.x & 31;
    for (int e = threadIdx.x; e < 256; e += blockDim.x) {  // warp-uniform trip count
        const float lo = __shfl_sync(0xffffffffu, cbl, e & 15), hi = __shfl_sync(0xffffffffu, cbl, e >> 4);
        const uint32_t w = pack2<P>(lo, hi);
        const uint4 v = make_uint4(w, w, w, w);
        uint4* row = reinterpret_cast<uint4*>(tbl + e * RowWords);
#pragma unroll
        for (int q = 0; q < 8; ++q) row[(q + lane) & 7] = v;
    }
}

template <int K>
__device__ __forceinline__ void sk_load(const uint4* __restrict__ P, const uint32_t* __restrict__ A, long long u,
                                        int lane, uint4 (&p)[K], uint32_t& a) {
#pragma unroll
    for (int b = 0; b < K; ++b) p[b] = __ldg(P + (u * K + b) * 32 + lane);
    a = __ldg(A + u * 32 + lane);
}

// Word offset in the wide table of staged x block (slot) jb: the unused right half of table row
// jb / 2 (64 bytes per block of 32 fp16), so 512 slots fit beside the table.
constexpr int kStagedXSlots = 512;
__device__ __forceinline__ int staged_x_word(int jb) { return (jb >> 1) * 64 + 32 + (jb & 1) * 16; }

// Shared memory of a stream-K GEMV (dense and grouped) at k bits with W warps a CTA: the pair table
// (k <= 4 the wide table, k = 5 the kSkLut5Copies-copy one), then for k = 5 the kStagedXSlots
// staged x slots (k <= 4 keeps them in the wide table's unused right halves: staged_x_word).
template <int K, int W>
struct SkLayout {
    static constexpr int kWarps = W;
    static constexpr int kThreads = W * 32;
    static constexpr int kTblWords = K == 5 ? kSkLut5Words : kWideLutWords;
    static constexpr int kXWords = K == 5 ? kStagedXSlots * 16 : 0;
    static constexpr size_t kSmem = static_cast<size_t>(kTblWords + kXWords) * 4;
    static constexpr int kXsWarpSlots = kStagedXSlots / W;  // staging slots per warp (dense GEMV)
    // Word offset of staged x slot jb (64 bytes: one block of 32 fp16).
    __device__ __forceinline__ static int x_word(int jb) { return K == 5 ? kTblWords + jb * 16 : staged_x_word(jb); }
};

// The shape of both stream-K GEMVs (dense and grouped) at k bits: one CTA of 16 warps per SM for
// k = 5, beside its 128 KB table; kSkWarps (three CTAs per SM) for k <= 4. 16-warp CTAs for k <= 4
// measured no faster in either kernel (H200 session 34, benchmarks/RESULTS.md).
template <int K>
using SkCfg = SkLayout<K, K == 5 ? 16 : kSkWarps>;

// Host: warps per CTA and dynamic shared memory bytes of SkCfg<k> for a runtime k; {0, 0} outside 2..5.
struct SkShape {
    int warps, smem;
};
inline SkShape sk_shape(int k) {
    switch (k) {
        case 2: return {SkCfg<2>::kWarps, static_cast<int>(SkCfg<2>::kSmem)};
        case 3: return {SkCfg<3>::kWarps, static_cast<int>(SkCfg<3>::kSmem)};
        case 4: return {SkCfg<4>::kWarps, static_cast<int>(SkCfg<4>::kSmem)};
        case 5: return {SkCfg<5>::kWarps, static_cast<int>(SkCfg<5>::kSmem)};
        default: return {0, 0};
    }
}

// The pair table of SkLayout<K, W> from the lane codebook (lane_codebook<K>) by shuffles; every
// thread of the CTA's full warps (nthreads of them) calls it, the caller's barrier publishes it.
template <int K>
__device__ __forceinline__ void sk_build_table(uint32_t* tbl, float cbl, int nthreads) {
    if constexpr (K == 5)
        build_k5_lut<half, kSkLut5Copies>(tbl, cbl, threadIdx.x, nthreads);
    else
        build_wide_lut_lanes<K>(tbl, cbl);
}

// acc[r][m] += (row 4*lane + r of this unit) . x row m of the unit's block; that row's 32 values
// are the uint4s xb[xoff[m] + 0..3] (xoff lets a caller repeat a row for masked passes).
// kScaledBf16: bf16 x is turned into fp16 times xscale[m] (a power of two that keeps the row
// inside fp16, see row_scales) and runs the half2 loop; the caller divides the sums by it.
// kXShared: xb points into shared memory at x already in that scaled fp16 form.
// MA >= M is the width of the caller's arrays, of which the first M rows are used (the grouped
// GEMV runs an item of fewer rows than its pass width without touching the rest).
// tblc is the wide table (k <= 4) or, for k = 5, the kSkLut5Copies-copy table of build_k5_lut.
template <typename T, int K, int M, bool kScaledBf16 = false, bool kXShared = false, int MA = M>
__device__ __forceinline__ void sk_unit(const uint4 (&p)[K], uint32_t a, const uint4* __restrict__ xb,
                                        const int (&xoff)[MA], const char* tblc, uint32_t lane4,
                                        float (&acc)[4][MA], const float* xscale = nullptr) {
    static_assert(M >= 1 && M <= MA, "rows within the caller's arrays");
    uint32_t gw[4][4];  // group words: nibble n = code of field n
    uint32_t hi[4][4];  // k = 5: the fifth bits of each pair (k5_pair_hi)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        uint32_t wr[K];
#pragma unroll
        for (int b = 0; b < K; ++b) wr[b] = r == 0 ? p[b].x : r == 1 ? p[b].y : r == 2 ? p[b].z : p[b].w;
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            gw[r][g] = group_word<K>(wr, g);
            hi[r][g] = K == 5 ? k5_pair_hi(wr[K - 1], g) : 0u;
        }
    }
    // Byte offset of pair i of group g of row r in the table (lane column included).
    auto off = [&](int r, int g, int i) -> uint32_t {
        if constexpr (K == 5) return k5_lut_off<kSkLut5Copies>(gw[r][g], hi[r][g], i, lane4);
        return wide_lut_off(gw[r][g], i, lane4);
    };
    float s[4];
    decode_e4m4_x4(a, s);

    if constexpr (std::is_same<T, half>::value || kScaledBf16 || kXShared) {
        // half2 FMA, flushed to fp32 times the block scale every 8 pairs (16 products per half).
        // Scaled x (|x| < 2^10, see row_scales) flushes once per block (32 pairs): a half then
        // sums 16 products of |w| <= 1, below 2^14, and its rounding stays far under the bf16
        // output's. fp16 x is not scaled, so it keeps the shorter sums.
        constexpr bool kOneFlush = kScaledBf16 || kXShared;
        half2 hp[4][M];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint4 xi[M];
#pragma unroll
            for (int m = 0; m < M; ++m) {
                xi[m] = kXShared ? xb[xoff[m] + i] : __ldg(xb + xoff[m] + i);
                if constexpr (kScaledBf16 && !kXShared) xi[m] = bf16x8_to_scaled_h8(xi[m], xscale[m]);
            }
            if (i == 0 || (i == 2 && !kOneFlush)) {
#pragma unroll
                for (int r = 0; r < 4; ++r)
#pragma unroll
                    for (int m = 0; m < M; ++m) {
                        if (i == 2) {
                            const float2 f = __half22float2(hp[r][m]);
                            acc[r][m] = fmaf(f.x + f.y, s[r], acc[r][m]);
                        }
                        hp[r][m] = __float2half2_rn(0.f);
                    }
            }
#pragma unroll
            for (int r = 0; r < 4; ++r) {
#pragma unroll
                for (int g = 0; g < 4; ++g) {
                    const half2 w = *reinterpret_cast<const half2*>(tblc + off(r, g, i));
#pragma unroll
                    for (int m = 0; m < M; ++m) {
                        const uint32_t xw = g == 0 ? xi[m].x : g == 1 ? xi[m].y : g == 2 ? xi[m].z : xi[m].w;
                        hp[r][m] = __hfma2(w, bits_h2(xw), hp[r][m]);
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
            for (int m = 0; m < M; ++m) {
                const float2 f = __half22float2(hp[r][m]);
                acc[r][m] = fmaf(f.x + f.y, s[r], acc[r][m]);
            }
    } else {
        // bf16: table half2 -> float2, x bf16 pair -> float2, fp32 FMA.
        float part[4][M];
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
            for (int m = 0; m < M; ++m) part[r][m] = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint4 xi[M];
#pragma unroll
            for (int m = 0; m < M; ++m) xi[m] = __ldg(xb + xoff[m] + i);
#pragma unroll
            for (int g = 0; g < 4; ++g) {
                float2 xf[M];
#pragma unroll
                for (int m = 0; m < M; ++m)
                    xf[m] = bf16x2_to_float2(g == 0 ? xi[m].x : g == 1 ? xi[m].y : g == 2 ? xi[m].z : xi[m].w);
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const float2 w =
                        __half22float2(*reinterpret_cast<const half2*>(tblc + off(r, g, i)));
#pragma unroll
                    for (int m = 0; m < M; ++m) part[r][m] = fmaf(w.y, xf[m].y, fmaf(w.x, xf[m].x, part[r][m]));
                }
            }
        }
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
            for (int m = 0; m < M; ++m) acc[r][m] = fmaf(part[r][m], s[r], acc[r][m]);
    }
}

// acc[4][M] <-> 4M consecutive floats [r][m] of a lane's accumulator slot, 4 at a time.
template <int M>
__device__ __forceinline__ void sk_red_tile(float* tacc, const float (&acc)[4][M]) {
#pragma unroll
    for (int q = 0; q < M; ++q)
        red_add4(tacc + 4 * q, acc[(4 * q) / M][(4 * q) % M], acc[(4 * q + 1) / M][(4 * q + 1) % M],
                 acc[(4 * q + 2) / M][(4 * q + 2) % M], acc[(4 * q + 3) / M][(4 * q + 3) % M]);
}
// Read the finished sums back and leave the slot zeroed for the next call.
template <int M>
__device__ __forceinline__ void sk_take_tile(float* tacc, float (&sum)[4][M]) {
    float4* t4 = reinterpret_cast<float4*>(tacc);
#pragma unroll
    for (int q = 0; q < M; ++q) {
        const float4 f = sk_take4(t4 + q);
        sum[(4 * q) / M][(4 * q) % M] = f.x;
        sum[(4 * q + 1) / M][(4 * q + 1) % M] = f.y;
        sum[(4 * q + 2) / M][(4 * q + 2) % M] = f.z;
        sum[(4 * q + 3) / M][(4 * q + 3) % M] = f.w;
    }
}

}  // namespace kbit
