// awq_orin tensor-core tile (shared by awq_mma.cu and awq_grouped_mma.cu): mma.sync.m16n8k16
// (fp32 accumulate) over BM tokens x 128 outputs x 32 inputs per k-tile. Activations and the
// packed weight words both arrive by cp.async through a ring of kStages<BM> k-tiles (each thread
// copies, and later reads back, its own 16 weight bytes, so those need no barrier); one k-tile
// ahead of the MMA the words are dequantized with LOP3 (awq_common.cuh) into a padded,
// double-buffered shared tile W[n][k], and both operands feed the MMA through ldmatrix. With
// only one k-tile in flight (the earlier design) every k-tile waited a full HBM latency, which
// bounded M=16 at ~4x the weight-read floor. Split-K partials go to a torch-allocated fp32
// workspace; splitk_reduce sums them.
#pragma once
#include "awq_common.cuh"
#include "mma_ptx.cuh"

namespace awq {

constexpr int kBN = 128, kBK = 32, kPad = 8, kLd = kBK + kPad;  // smem row stride (elements)
constexpr int kThreads = 128;                                   // 4 warps, each 32 outputs
// k-tiles in flight: as many as fit the 48 KB of static shared memory with the A ring (BM x kLd),
// the weight-word ring (2 KB a stage) and the two dequantized W tiles (20 KB).
template <int BM>
constexpr int kStages = BM <= 16 ? 8 : (BM <= 32 ? 6 : 4);

using ptx::cp_async16;
using ptx::cp_async_commit;
using ptx::ldmatrix_x4;
using ptx::mma16816;

// Dequantize one thread's 4 words (column group c, inputs k..k+3) into W[8c'..8c'+7][k'..k'+3].
template <typename T>
__device__ __forceinline__ void dequant_to_smem(const int4& wv, const T* __restrict__ szp, T* w_s, int c_local, int k_local) {
    using T2 = typename Vec2<T>::type;
    T2 s2[4], b2[4], w[4][4];
    load_pair_scales<T>(szp, s2, b2);
    dequant_quad<T>(wv, s2, b2, w);
    store_quad_rows<T>(w, w_s + c_local * 8 * kLd + k_local, kLd);
}

// One CTA's tile: rows [m0, min(m0 + BM, M)) of x / y, outputs [n0, n0 + 128), k-tiles
// [kt_begin, kt_end) of one weight (wq [out/8, in], sz [in/group, out, 2]). With partial != nullptr
// the fp32 sums go to partial [rows, out] (this split's slice of the workspace) instead of y.
template <typename T, int BM>
__device__ __forceinline__ void mma_tile(const T* __restrict__ x, const int32_t* __restrict__ wq,
                                         const T* __restrict__ sz, const T* __restrict__ bias, T* __restrict__ y,
                                         float* __restrict__ partial, int m0, int M, int in, int out, int group,
                                         int n0, int kt_begin, int kt_end) {
    constexpr int S = kStages<BM>;
    __shared__ __align__(16) T a_s[S][BM * kLd];
    __shared__ __align__(16) int4 w_raw[S][kThreads];
    __shared__ __align__(16) T w_s[2][kBN * kLd];
    constexpr int MT = BM / 16;  // m16 tiles per warp
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    // Weight loads: thread -> (column group tid / 8 of this tile, inputs 4 * (tid % 8) .. +3).
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
    // This thread's 16 weight bytes of k-tile kt (zeros past the last column group).
    auto load_w = [&](int stage, int kt) {
        cp_async16(&w_raw[stage][tid], wrow + (kt * kBK + k_local) / 4, c_ok);
    };
    // Ring slot s of k-tile kt_begin + i is i % S; a group is committed for every slot, empty
    // past kt_end, so cp.async.wait_group counts stay uniform.
    auto issue = [&](int i) {
        const int kt = kt_begin + i;
        if (kt < kt_end) {
            load_a(i % S, kt);
            load_w(i % S, kt);
        }
        cp_async_commit();
    };
    // This thread's scale pairs for input k = kt * kBK + k_local, stepped along with the k-tiles
    // store_w visits in order (kt_begin, kt_begin + 1, ...): k / group is kept as a group
    // pointer and a remainder instead of a 32-bit division per k-tile (~25 instructions).
    const int k_first = kt_begin * kBK + k_local;
    const T* szp = sz + pair_scale_offset(k_first, group, out, c_ok ? c_global : 0);
    int sz_rem = k_first % group;
    auto store_w = [&](int stage, const int4& wv) {
        if (c_ok) {
            dequant_to_smem<T>(wv, szp, w_s[stage], c_local, k_local);
        } else {
            const uint2 z = make_uint2(0, 0);
#pragma unroll
            for (int o = 0; o < 8; ++o) *reinterpret_cast<uint2*>(w_s[stage] + (c_local * 8 + o) * kLd + k_local) = z;
        }
        for (sz_rem += kBK; sz_rem >= group; sz_rem -= group) szp += static_cast<size_t>(out) * 2;
    };

    float acc[MT][4][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

    // Prologue: k-tiles 0 .. S-2 in flight; k-tile 0's weights dequantized into W tile 0.
#pragma unroll
    for (int i = 0; i < S - 1; ++i) issue(i);
    if (kt_begin < kt_end) {
        ptx::cp_async_wait<S - 2>();  // this thread's copies of k-tile 0
        store_w(0, w_raw[0][tid]);
    }
    for (int kt = kt_begin; kt < kt_end; ++kt) {
        const int n = kt - kt_begin, slot = n % S, stage = n & 1;
        // Groups committed: k-tiles 0 .. n + S - 2. Complete through n + 1: A of this k-tile (all
        // threads' copies, published by the barrier) and this thread's weights of the next one.
        ptx::cp_async_wait<S - 3>();
        __syncthreads();  // also: every warp is done with slot (n - 1) % S and W tile stage ^ 1
        issue(n + S - 1);
        const bool more = kt + 1 < kt_end;
#pragma unroll
        for (int ks = 0; ks < kBK; ks += 16) {
            uint32_t af[MT][4];
#pragma unroll
            for (int i = 0; i < MT; ++i)
                ldmatrix_x4(af[i], &a_s[slot][(i * 16 + (lane & 15)) * kLd + ks + (lane >> 4) * 8]);
#pragma unroll
            for (int jp = 0; jp < 2; ++jp) {  // two n8 tiles per ldmatrix.x4
                uint32_t bf[4];
                const int n_row = warp * 32 + jp * 16 + (lane & 7) + ((lane >> 4) << 3);
                ldmatrix_x4(bf, &w_s[stage][n_row * kLd + ks + ((lane >> 3) & 1) * 8]);
#pragma unroll
                for (int i = 0; i < MT; ++i) {
                    mma16816<T>(acc[i][jp * 2], af[i], bf[0], bf[1]);
                    mma16816<T>(acc[i][jp * 2 + 1], af[i], bf[2], bf[3]);
                }
            }
        }
        if (more) store_w(stage ^ 1, w_raw[(n + 1) % S][tid]);  // k-tile kt + 1
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
