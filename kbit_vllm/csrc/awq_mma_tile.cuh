// awq_orin tensor-core tile (shared by awq_mma.cu and awq_grouped_mma.cu): mma.sync.m16n8k16
// (fp32 accumulate) over BM tokens x 128 outputs x 32 inputs per k-tile. Activations and the
// packed weight words both arrive by cp.async through a ring of kStages<BM> k-tiles. A feeds the
// MMA through ldmatrix; B fragments are built in registers straight from the packed words in
// the ring (the resident layout, awq_common.cuh: word (c, k) = 8 outputs of input k): the lane
// holding output n of an n8 tile reads words k, k+1 (and k+8, k+9) of that column group with
// one 8-byte shared load each, and one byte permute + LOP3 puts output n's two nibbles side by
// side for the magic-number dequant. The earlier design dequantized every k-tile into a shared
// W tile and read it back with ldmatrix; that round trip kept the L1 pipe 85% busy at M=16 (ncu)
// and was the limiter. Split-K partials go to a torch-allocated fp32 workspace; splitk_reduce
// sums them.
#pragma once
#include "awq_common.cuh"
#include "mma_ptx.cuh"

#include <type_traits>

namespace awq {

constexpr int kBN = 128, kBK = 32, kPad = 8, kLd = kBK + kPad;  // A row stride (elements)
constexpr int kThreads = 128;                                   // 4 warps, each 32 outputs
// k-tiles in flight: the A ring (BM x kLd) and the weight-word ring (2 KB a stage) within 48 KB.
template <int BM>
constexpr int kStages = BM <= 32 ? 8 : 6;
// Resident CTAs per SM the kernels ask registers for: BM=64 compiled to 130 registers (3 CTAs per
// SM) and lost to the shared-W design on 4096x28672 at M=64; 4 caps it at 128.
template <int BM>
constexpr int kMinCtas = BM >= 64 ? 4 : 1;

using ptx::cp_async16;
using ptx::cp_async_commit;
using ptx::ldmatrix_x4;
using ptx::mma16816;

// Output n's (n = lane / 4 of an n8 tile) nibbles of words w0 (input k) and w1 (input k + 1) as
// the B-fragment pair {W[n][k], W[n][k+1]}, dequantized as q * s + b. In a word, output n sits at
// bit sh = 4 (n / 2) + 16 (n % 2): byte sh / 8, high nibble of it when (sh / 4) is odd. sel puts
// that byte of w0 in byte 0 and of w1 in byte 2; hs = 4 for a high nibble.
template <typename T>
__device__ __forceinline__ uint32_t b_pair(uint32_t w0, uint32_t w1, uint32_t sel, uint32_t hs,
                                           typename Vec2<T>::type s2, typename Vec2<T>::type b2) {
    using T2 = typename Vec2<T>::type;
    const uint32_t v = __byte_perm(w0, w1, sel) >> hs;
    const uint32_t magic = std::is_same<T, half>::value ? 0x64006400u : 0x43004300u;  // 1024 / 128
    const uint32_t h = lop3_and_or(v, 0x000f000fu, magic);
    const T2 q = __hsub2(*reinterpret_cast<const T2*>(&h), *reinterpret_cast<const T2*>(&magic));
    const T2 w = __hfma2(q, s2, b2);
    return *reinterpret_cast<const uint32_t*>(&w);
}

// One CTA's tile: rows [m0, min(m0 + BM, M)) of x / y, outputs [n0, n0 + 128), k-tiles
// [kt_begin, kt_end) of one weight (wq [out/8, in], sz [in/group, out, 2]). With partial != nullptr
// the fp32 sums go to partial [rows, out] (this split's slice of the workspace) instead of y.
template <typename T, int BM>
__device__ __forceinline__ void mma_tile(const T* __restrict__ x, const int32_t* __restrict__ wq,
                                         const T* __restrict__ sz, const T* __restrict__ bias, T* __restrict__ y,
                                         float* __restrict__ partial, int m0, int M, int in, int out, int group,
                                         int n0, int kt_begin, int kt_end) {
    using T2 = typename Vec2<T>::type;
    constexpr int S = kStages<BM>;
    __shared__ __align__(16) T a_s[S][BM * kLd];
    __shared__ __align__(16) uint32_t w_raw[S][kThreads * 4];  // [16 column groups][32 inputs]
    constexpr int MT = BM / 16;  // m16 tiles per warp
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    // Weight copies: thread -> (column group tid / 8 of this tile, inputs 4 * (tid % 8) .. +3),
    // i.e. words [tid * 4, tid * 4 + 4) of the stage's [16][32] word array.
    const int c_local = tid >> 3, k_local = (tid & 7) * 4;
    const int c_global = n0 / 8 + c_local;
    const bool c_ok = c_global < out / 8;
    const int4* wrow = reinterpret_cast<const int4*>(wq + static_cast<size_t>(c_ok ? c_global : 0) * in);

    auto load_a = [&](int stage, int kt) {
        // Chunk i = tid + j * kThreads (tid < kThreads): a fixed trip count, fully unrolled (a loop
        // from tid compiled to a generic loop with a remainder and per-copy address arithmetic).
        constexpr int chunks = BM * kBK / 8;  // 16-byte chunks
#pragma unroll
        for (int j = 0; j < (chunks + kThreads - 1) / kThreads; ++j) {
            const int i = tid + j * kThreads;
            if (chunks % kThreads != 0 && i >= chunks) break;
            const int r = i / (kBK / 8), ch = i % (kBK / 8);
            const bool ok = m0 + r < M;
            const T* src = x + static_cast<size_t>(ok ? m0 + r : 0) * in + kt * kBK + ch * 8;
            cp_async16(&a_s[stage][r * kLd + ch * 8], src, ok);
        }
    };
    // Ring slot of k-tile kt_begin + i is i % S; a group is committed for every slot, empty past
    // kt_end, so cp.async.wait_group counts stay uniform.
    auto issue = [&](int i) {
        const int kt = kt_begin + i;
        if (kt < kt_end) {
            load_a(i % S, kt);
            cp_async16(&w_raw[i % S][tid * 4], wrow + (kt * kBK + k_local) / 4, c_ok);
        }
        cp_async_commit();
    };

    // This lane's B-fragment role: output n = lane / 4 of each of its 4 n8 tiles (column groups
    // warp * 4 + j), inputs 2 (lane % 4) + {0, 1} and + 8 of each k16 half.
    const int nl = lane >> 2, ql = lane & 3;
    const uint32_t sh = 4u * (nl >> 1) + 16u * (nl & 1);
    const uint32_t bp = sh >> 3, hs = ((sh >> 2) & 1u) * 4u;
    const uint32_t sel = bp | (bp << 4) | ((bp + 4u) << 8) | ((bp + 4u) << 12);
    // Scale / bias of output n of each tile's column group (clamped past the last group: those
    // outputs are never stored): sz + g * out * 2 + 8c * 2 + 4 (n / 2) + n % 2, bias 2 further.
    int sz_off[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int c = min(n0 / 8 + warp * 4 + j, out / 8 - 1);
        sz_off[j] = c * 16 + 4 * (nl >> 1) + (nl & 1);
    }
    const T* szg = sz + static_cast<size_t>(kt_begin * kBK / group) * out * 2;  // this k-tile's group
    int g_rem = (kt_begin * kBK) % group;

    float acc[MT][4][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

#pragma unroll
    for (int i = 0; i < S - 1; ++i) issue(i);
    for (int kt = kt_begin; kt < kt_end; ++kt) {
        const int n = kt - kt_begin, slot = n % S;
        T2 s2[4], b2[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const T sv = szg[sz_off[j]], bv = szg[sz_off[j] + 2];
            s2[j] = T2(sv, sv);
            b2[j] = T2(bv, bv);
        }
        // Groups committed: k-tiles 0 .. n + S - 2; complete through n: this k-tile's A and
        // weights (every thread's copies, published by the barrier).
        ptx::cp_async_wait<S - 2>();
        __syncthreads();  // also: every warp is done with slot (n - 1) % S
        issue(n + S - 1);
        const uint32_t* wr = w_raw[slot] + warp * 4 * 32 + 2 * ql;
#pragma unroll
        for (int ks = 0; ks < kBK; ks += 16) {
            uint32_t af[MT][4];
#pragma unroll
            for (int i = 0; i < MT; ++i)
                ldmatrix_x4(af[i], &a_s[slot][(i * 16 + (lane & 15)) * kLd + ks + (lane >> 4) * 8]);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const uint2 lo = *reinterpret_cast<const uint2*>(wr + j * 32 + ks);      // inputs 2q, 2q+1
                const uint2 hi = *reinterpret_cast<const uint2*>(wr + j * 32 + ks + 8);  // 2q+8, 2q+9
                const uint32_t b0 = b_pair<T>(lo.x, lo.y, sel, hs, s2[j], b2[j]);
                const uint32_t b1 = b_pair<T>(hi.x, hi.y, sel, hs, s2[j], b2[j]);
#pragma unroll
                for (int i = 0; i < MT; ++i) mma16816<T>(acc[i][j], af[i], b0, b1);
            }
        }
        if ((g_rem += kBK) == group) {
            g_rem = 0;
            szg += static_cast<size_t>(out) * 2;
        }
    }
    ptx::cp_async_wait<0>();  // no copy outlives the CTA's shared memory (the empty tail groups)

    // Epilogue: accumulator (i, j, e) -> row m0 + 16i + lane/4 (+8 for e >= 2),
    // col n0 + 32*warp + 8j + 2*(lane%4) + (e & 1).
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = m0 + i * 16 + (lane >> 2) + h * 8;
                const int col = n0 + warp * 32 + j * 8 + (lane & 3) * 2;
                if (row >= M || col >= out) continue;
                float v0 = acc[i][j][h * 2], v1 = acc[i][j][h * 2 + 1];
                if (partial != nullptr) {
                    float* p = partial + static_cast<size_t>(row) * out + col;
                    *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
                } else {
                    if (bias != nullptr) { v0 += to_f<T>(bias[col]); v1 += to_f<T>(bias[col + 1]); }
                    typename Vec2<T>::type o;
                    o.x = from_f<T>(v0);
                    o.y = from_f<T>(v1);
                    *reinterpret_cast<typename Vec2<T>::type*>(y + static_cast<size_t>(row) * out + col) = o;
                }
            }
}

// Sum of the split-K partials [splits, M, out] in a fixed order (deterministic), + bias, -> y
// (awq_mma.cu; one definition of the kernel serves the dense and the grouped MMA).
template <typename T>
int launch_splitk_reduce(const float* partial, const T* bias, T* y, int splits, int M, int out, cudaStream_t stream);

}  // namespace awq
