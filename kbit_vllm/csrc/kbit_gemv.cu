// kbit GEMV for M = 1..4 rows of x: y[m, n] = sum_i x[m, i] * W[n, i] (+ bias[n]).
//
// k = 2..4 (gemv_lut_kernel): a warp owns 32 output rows (lane = row: the tiled planes of 32
// rows are 128 contiguous bytes) and a share of the input blocks. Codes are decoded two at a
// time through a shared-memory table: entry e = (codebook[e & 15], codebook[e >> 4]) as half2,
// replicated per lane ([256][32] words, so a warp's 32 random lookups hit 32 distinct banks).
// The tiled bit order gives, per group g, one word whose byte i holds the codes of elements
// 8i + 2g and 8i + 2g + 1 (three bit-selects + a rotate, kbit_tile.cuh), so one rotate + one
// lop3 makes the table address of a pair, and the pair multiplies the half2 (x[8i+2g],
// x[8i+2g+1]) of the activation, in half2 FMAs flushed to fp32 once per 32-element block (times
// the block scale). bf16 x is staged as fp16 times a power of two per (row, block) (bf16_scaled.cuh;
// the four threads that stage a block share its max by shuffles), and the inverse joins the block
// scale, so both dtypes run the same half2 loop. x is staged in shared memory in (group, pair)
// order. The CTA holds `rgpc` row groups x `wk` warps along K; `splits` CTAs of one thread-block
// cluster (sm_90) split K further: each CTA sums its warps, the other ranks write their sums into
// rank 0's shared memory and rank 0 adds them in rank order after one cluster barrier
// (deterministic; no workspace, no atomics). At entry the weights are pulled into L2 by the copy
// engine (l2_prefetch.cuh), so DRAM streams while the table is built and x is staged.
// k = 5 (gemv_shfl_kernel): the codebook lives in lane registers and is read with a shuffle.
#include "bf16_scaled.cuh"
#include "kbit_lut.cuh"
#include "l2_prefetch.cuh"

#include <cooperative_groups.h>

namespace kbit {

constexpr int kGemvUnroll = 4;  // blocks in flight per warp

template <typename T>
__device__ __forceinline__ void load8(const T* src, float (&f)[8]) {
    union { uint4 u; T h[8]; } pk;
    pk.u = __ldg(reinterpret_cast<const uint4*>(src));
#pragma unroll
    for (int q = 0; q < 8; ++q) f[q] = to_float(pk.h[q]);
}

template <typename T, int K, int M>
__global__ void __launch_bounds__(1024) gemv_shfl_kernel(const T* __restrict__ x, const uint32_t* __restrict__ packed_t,
                                                    const uint8_t* __restrict__ absmax_t,
                                                    const float* __restrict__ codebook, const T* __restrict__ bias,
                                                    T* __restrict__ y, int N, int nb) {
    extern __shared__ float4 smem4[];
    float* smem = reinterpret_cast<float*>(smem4);
    constexpr int U = kGemvUnroll;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, WK = blockDim.x >> 5;
    const int CH = WK * U;  // blocks per chunk
    const int tile = blockIdx.x >> 2, sub = blockIdx.x & 3;
    const int row = tile * kTileN + sub * 32 + lane;
    const float cbl = lane_codebook<K>(codebook, lane);
    const uint32_t* P = packed_t + static_cast<size_t>(tile) * nb * K * kTileN + sub * 32 + lane;
    const uint8_t* A = absmax_t + static_cast<size_t>(tile) * nb * kTileN + sub * 32 + lane;
    const int in_f = nb * 32;

    float acc[M];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0.f;

    for (int c0 = 0; c0 < nb; c0 += CH) {
        const int cn = min(CH, nb - c0);
        // Issue this warp's plane loads first so they overlap the x staging below.
        uint32_t p[U][K];
        uint8_t a[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int jl = warp * U + u;
            const bool ok = jl < cn;
            const size_t j = static_cast<size_t>(c0 + (ok ? jl : 0));
#pragma unroll
            for (int b = 0; b < K; ++b) p[u][b] = ok ? __ldg(P + (j * K + b) * kTileN) : 0u;
            a[u] = ok ? __ldg(A + j * kTileN) : 0;
        }
        __syncthreads();  // previous chunk's x no longer read
        for (int i = threadIdx.x; i < M * cn * 4; i += blockDim.x) {
            const int m = i / (cn * 4), q = i - m * (cn * 4);  // q: 8-element run; block q/4, h = q%4
            float f[8];
            load8<T>(x + static_cast<size_t>(m) * in_f + static_cast<size_t>(c0) * 32 + q * 8, f);
            float* dst = smem + m * CH * 32 + (q >> 2) * 32;
            const int h = q & 3;
#pragma unroll
            for (int t = 0; t < 8; ++t) dst[(t >> 1) * 8 + (t & 1) + 2 * h] = f[t];  // (g, n) order
        }
        __syncthreads();
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int jl = warp * U + u;
            if (jl >= cn) break;  // warp-uniform
            const float s = decode_e4m4(a[u]);
            float part[M];
#pragma unroll
            for (int m = 0; m < M; ++m) part[m] = 0.f;
#pragma unroll
            for (int g = 0; g < 4; ++g) {
                float v[8];
                decode_group<K>(p[u], g, cbl, v);
#pragma unroll
                for (int m = 0; m < M; ++m) {
                    const float4* xv = reinterpret_cast<const float4*>(smem + m * CH * 32 + jl * 32 + g * 8);
                    const float4 x0 = xv[0], x1 = xv[1];
                    part[m] = fmaf(v[0], x0.x, part[m]); part[m] = fmaf(v[1], x0.y, part[m]);
                    part[m] = fmaf(v[2], x0.z, part[m]); part[m] = fmaf(v[3], x0.w, part[m]);
                    part[m] = fmaf(v[4], x1.x, part[m]); part[m] = fmaf(v[5], x1.y, part[m]);
                    part[m] = fmaf(v[6], x1.z, part[m]); part[m] = fmaf(v[7], x1.w, part[m]);
                }
            }
#pragma unroll
            for (int m = 0; m < M; ++m) acc[m] = fmaf(part[m], s, acc[m]);
        }
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < M; ++m) smem[(warp * M + m) * 32 + lane] = acc[m];
    __syncthreads();
    if (warp == 0 && row < N) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
            float s = 0.f;
            for (int w = 0; w < WK; ++w) s += smem[(w * M + m) * 32 + lane];
            if (bias != nullptr) s += to_float(bias[row]);
            y[static_cast<size_t>(m) * N + row] = from_float<T>(s);
        }
    }
}

template <typename T, int K, int M>
int launch_gemv_shfl_km(const void* x, const void* packed_t, const uint8_t* absmax_t, const float* codebook,
                   const void* bias, int N, int nb, void* y, int wk, cudaStream_t stream) {
    const int nt = (N + kTileN - 1) / kTileN;
    const size_t smem = static_cast<size_t>(M) * wk * kGemvUnroll * 32 * sizeof(float);
    auto kern = gemv_shfl_kernel<T, K, M>;
    if (smem > 48 * 1024) {
        const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(smem));
        if (e != cudaSuccess) return static_cast<int>(e);
    }
    kern<<<nt * 4, wk * 32, smem, stream>>>(static_cast<const T*>(x), static_cast<const uint32_t*>(packed_t),
                                            absmax_t, codebook, static_cast<const T*>(bias), static_cast<T*>(y),
                                            N, nb);
    KBIT_RETURN_LAUNCH_STATUS();
}

template <typename T, int K>
int launch_gemv_shfl_k(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int M,
                  int N, int nb, void* y, int wk, cudaStream_t s) {
    switch (M) {
        case 1: return launch_gemv_shfl_km<T, K, 1>(x, pt, at, cb, bias, N, nb, y, wk, s);
        case 2: return launch_gemv_shfl_km<T, K, 2>(x, pt, at, cb, bias, N, nb, y, wk, s);
        case 3: return launch_gemv_shfl_km<T, K, 3>(x, pt, at, cb, bias, N, nb, y, wk, s);
        case 4: return launch_gemv_shfl_km<T, K, 4>(x, pt, at, cb, bias, N, nb, y, wk, s);
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
}


// ---- table-decode GEMV (k = 2..4) ------------------------------------------------------------

constexpr int kLutU = 4;                 // blocks in flight per warp
constexpr int kLutXBudget = 16 * 1024;   // bytes of staged x per chunk
constexpr int kLutMaxThreads = 256;
constexpr long long kL2PrefetchMaxBytes = 32ll << 20;  // weights pulled into L2 at entry up to this layer size

// Staged bytes per (row, block): 32 fp16 values, plus the block's inverse scale for bf16.
template <typename T> struct LutMath { static constexpr bool kScaled = true; static constexpr int kXBytes = 68; };
template <> struct LutMath<half> { static constexpr bool kScaled = false; static constexpr int kXBytes = 64; };

template <typename T, int K, int M>
__global__ void __launch_bounds__(kLutMaxThreads, 4) gemv_lut_kernel(
    const T* __restrict__ x, const uint32_t* __restrict__ packed_t, const uint8_t* __restrict__ absmax_t,
    const float* __restrict__ codebook, const T* __restrict__ bias, T* __restrict__ y, int N, int nb, int rgpc,
    int splits, int chunk) {
    static_assert(K >= 2 && K <= 4, "table GEMV takes k = 2..4");
    constexpr bool SC = LutMath<T>::kScaled;
    extern __shared__ uint4 smem_lut[];
    uint32_t* tbl = reinterpret_cast<uint32_t*>(smem_lut);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5, WK = nwarps / rgpc;
    const int rgl = warp / WK, wk = warp - rgl * WK;
    const int split = blockIdx.x % splits;
    const int rg = (blockIdx.x / splits) * rgpc + rgl;  // 32-row group
    const int n_rg = ((N + kTileN - 1) / kTileN) * 4;
    const bool active = rg < n_rg;
    const int row = rg * 32 + lane;
    const int per = (nb + splits - 1) / splits;
    const int kb0 = split * per, kb1 = min(nb, kb0 + per);
    char* xs_raw = reinterpret_cast<char*>(tbl + kLutWords);
    float* xinv = reinterpret_cast<float*>(xs_raw + static_cast<size_t>(chunk) * M * 64);  // [M][chunk], bf16 only
    float* red = reinterpret_cast<float*>(xs_raw + static_cast<size_t>(chunk) * M * LutMath<T>::kXBytes);
    float* xred = red + nwarps * M * 32;  // [split][rgl][m][lane]: the cluster's row-group sums, in rank 0

    // The units of this K split hold all four 32-row groups of a 128-row tile: each row group pulls
    // a quarter of its tile's units into L2 (l2_prefetch.cuh), thread r for the CTA's row group r.
    // H200, bf16 M=1 behind a writer, us: 2048x4096 6.0 -> 5.4, 4096x2048 6.3 -> 5.7, 2048x5120
    // 6.8 -> 6.5, 4096x4096 7.7 -> 7.4, 4096x6144 9.4 -> 9.6 (the one loss); vLLM Llama-3-8B decode
    // step, 64 calls: 540 -> 513 us (with the one-barrier reduction below).
    // Only layers well inside L2 (50 MB on H100 / H200): 4096x28672 (61 MB, deterministic mode)
    // went 31.2 -> 35.9 us with it.
    const bool prefetch = static_cast<long long>(n_rg / 4) * nb * (K * kTileN * 4 + kTileN) <= kL2PrefetchMaxBytes;
    if (prefetch && static_cast<int>(threadIdx.x) < rgpc) {
        const int rgr = (blockIdx.x / splits) * rgpc + threadIdx.x, q = rgr & 3;
        const int q0 = kb0 + (kb1 - kb0) * q / 4, q1 = kb0 + (kb1 - kb0) * (q + 1) / 4;
        if (rgr < n_rg && q1 > q0) {
            const size_t u = static_cast<size_t>(rgr >> 2) * nb + q0;
            l2_prefetch(packed_t + u * K * kTileN, static_cast<uint32_t>(q1 - q0) * K * kTileN * 4);
            l2_prefetch(absmax_t + u * kTileN, static_cast<uint32_t>(q1 - q0) * kTileN);
        }
    }
    // Table: entry e (word e * 32 + lane) = (codebook[e & 15], codebook[e >> 4]) for every lane.
    build_pair_lut<K, half>(tbl, codebook, threadIdx.x, blockDim.x);

    const int tile = rg >> 2, sub = rg & 3;
    const uint32_t* P = packed_t + static_cast<size_t>(tile) * nb * K * kTileN + sub * 32 + lane;
    const uint8_t* A = absmax_t + static_cast<size_t>(tile) * nb * kTileN + sub * 32 + lane;
    const uint32_t lane4 = static_cast<uint32_t>(lane) * 4u;
    const char* tblc = reinterpret_cast<const char*>(tbl);
    const int in_f = nb * 32;

    float acc[M];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0.f;

    for (int c0 = kb0; c0 < kb1; c0 += chunk) {
        const int cn = min(chunk, kb1 - c0);
        __syncthreads();  // table built / previous chunk's x no longer read
        // Warp-uniform trips (blockDim is a multiple of 32): the four lanes that stage a block are
        // four neighbours of one warp, all in or all out, so their shuffles see each other.
        const int total = M * cn * 4;
        for (int base = 0; base < total; base += blockDim.x) {
            const int i = base + threadIdx.x;
            const bool ok = i < total;
            const int m = ok ? i / (cn * 4) : 0, q = ok ? i - m * (cn * 4) : 0;  // q: 8-element run; block q / 4, pair index q % 4
            const int jl = q >> 2, ii = q & 3;
            uint4 v = ok ? __ldg(reinterpret_cast<const uint4*>(x + static_cast<size_t>(m) * in_f + static_cast<size_t>(c0) * 32 + q * 8))
                         : make_uint4(0u, 0u, 0u, 0u);
            if constexpr (SC) {
                float mx = bf16x8_absmax(v);
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                float sc, inv;
                x_pow2_scale(mx, sc, inv);
                v = bf16x8_to_scaled_h8(v, sc);
                if (ok && ii == 0) xinv[m * chunk + jl] = inv;
            }
            if (ok) {
                uint32_t* dst = reinterpret_cast<uint32_t*>(xs_raw) + (m * chunk + jl) * 16;
                dst[ii] = v.x; dst[4 + ii] = v.y; dst[8 + ii] = v.z; dst[12 + ii] = v.w;  // (x[8i+2g], x[8i+2g+1]) at word 4g + i
            }
        }
        __syncthreads();
        if (!active) continue;
        for (int jb = wk * kLutU; jb < cn; jb += WK * kLutU) {
            uint32_t p[kLutU][K];
            uint8_t a[kLutU];
#pragma unroll
            for (int u = 0; u < kLutU; ++u) {
                const bool ok = jb + u < cn;
                const size_t j = static_cast<size_t>(c0 + (ok ? jb + u : 0));
#pragma unroll
                for (int b = 0; b < K; ++b) p[u][b] = ok ? __ldg(P + (j * K + b) * kTileN) : 0u;
                a[u] = ok ? __ldg(A + j * kTileN) : 0;
            }
#pragma unroll
            for (int u = 0; u < kLutU; ++u) {
                const int jl = jb + u;
                if (jl >= cn) break;  // warp-uniform
                const float s = decode_e4m4(a[u]);
                half2 hp[M][2];
#pragma unroll
                for (int m = 0; m < M; ++m) hp[m][0] = hp[m][1] = __float2half2_rn(0.f);
#pragma unroll
                for (int g = 0; g < 4; ++g) {
                    const uint32_t gw = group_word<K>(p[u], g);
                    half2 w[4];
                    w[0] = *reinterpret_cast<const half2*>(tblc + lut_off<0>(gw, lane4));
                    w[1] = *reinterpret_cast<const half2*>(tblc + lut_off<1>(gw, lane4));
                    w[2] = *reinterpret_cast<const half2*>(tblc + lut_off<2>(gw, lane4));
                    w[3] = *reinterpret_cast<const half2*>(tblc + lut_off<3>(gw, lane4));
#pragma unroll
                    for (int m = 0; m < M; ++m) {
                        const uint4 xv = reinterpret_cast<const uint4*>(xs_raw)[(m * chunk + jl) * 4 + g];
                        hp[m][g & 1] = hfma2_x4(w, xv, hp[m][g & 1]);
                    }
                }
#pragma unroll
                for (int m = 0; m < M; ++m) {
                    const float2 f0 = __half22float2(hp[m][0]), f1 = __half22float2(hp[m][1]);
                    const float sm = SC ? s * xinv[m * chunk + jl] : s;
                    acc[m] = fmaf((f0.x + f0.y) + (f1.x + f1.y), sm, acc[m]);
                }
            }
        }
    }

    // Each CTA sums its row groups' WK warps in a fixed order; the cluster's other ranks write
    // those sums into rank 0's shared memory and one cluster barrier publishes them (no rank
    // reads another's memory after it, so ranks > 0 may exit), then rank 0 adds them in rank order.
#pragma unroll
    for (int m = 0; m < M; ++m) red[(warp * M + m) * 32 + lane] = acc[m];
    __syncthreads();
    float sum[M];
#pragma unroll
    for (int m = 0; m < M; ++m) sum[m] = 0.f;
    const bool lead = wk == 0 && active;
    if (lead) {
        for (int w = 0; w < WK; ++w) {
#pragma unroll
            for (int m = 0; m < M; ++m) sum[m] += red[((rgl * WK + w) * M + m) * 32 + lane];
        }
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (splits > 1) {
        namespace cg = cooperative_groups;
        if (lead && split > 0) {
            float* dst = cg::this_cluster().map_shared_rank(xred, 0);
#pragma unroll
            for (int m = 0; m < M; ++m) dst[((split * rgpc + rgl) * M + m) * 32 + lane] = sum[m];
        }
        cg::this_cluster().sync();
        if (split > 0) return;
        if (lead) {
            for (int r = 1; r < splits; ++r) {
#pragma unroll
                for (int m = 0; m < M; ++m) sum[m] += xred[((r * rgpc + rgl) * M + m) * 32 + lane];
            }
        }
    }
#endif
    if (lead && row < N) {
        const float bv = bias != nullptr ? to_float(bias[row]) : 0.f;
#pragma unroll
        for (int m = 0; m < M; ++m) y[static_cast<size_t>(m) * N + row] = from_float<T>(sum[m] + bv);
    }
}

template <typename T, int K, int M>
int launch_gemv_lut_km(const void* x, const void* packed_t, const uint8_t* absmax_t, const float* codebook,
                       const void* bias, int N, int nb, void* y, int rgpc, int wk, int splits, cudaStream_t stream) {
    const int n_rg = ((N + kTileN - 1) / kTileN) * 4;
    const int per = (nb + splits - 1) / splits;
    // Chunks of equal size: a short last chunk would cost a staging round and a barrier for a few
    // blocks that leave most warps idle.
    const int max_chunk = max(1, kLutXBudget / (M * LutMath<T>::kXBytes));
    const int n_chunks = (per + max_chunk - 1) / max_chunk;
    const int chunk = (per + n_chunks - 1) / n_chunks;
    const int threads = rgpc * wk * 32;
    const size_t smem = static_cast<size_t>(kLutWords) * 4 + static_cast<size_t>(chunk) * M * LutMath<T>::kXBytes +
                        static_cast<size_t>(rgpc) * (wk + (splits > 1 ? splits : 0)) * M * 32 * sizeof(float);
    auto kern = gemv_lut_kernel<T, K, M>;
    if (smem > 48 * 1024) {
        const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(smem));
        if (e != cudaSuccess) return static_cast<int>(e);
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>((n_rg + rgpc - 1) / rgpc * splits));
    cfg.blockDim = dim3(static_cast<unsigned>(threads));
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    if (splits > 1) {
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = static_cast<unsigned>(splits);
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    const cudaError_t e = cudaLaunchKernelEx(&cfg, kern, static_cast<const T*>(x), static_cast<const uint32_t*>(packed_t),
                                             absmax_t, codebook, static_cast<const T*>(bias), static_cast<T*>(y), N,
                                             nb, rgpc, splits, chunk);
    if (e != cudaSuccess) return static_cast<int>(e);
    KBIT_RETURN_LAUNCH_STATUS();
}

template <typename T, int K>
int launch_gemv_lut_k(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int M,
                      int N, int nb, void* y, int rgpc, int wk, int splits, cudaStream_t s) {
    switch (M) {
        case 1: return launch_gemv_lut_km<T, K, 1>(x, pt, at, cb, bias, N, nb, y, rgpc, wk, splits, s);
        case 2: return launch_gemv_lut_km<T, K, 2>(x, pt, at, cb, bias, N, nb, y, rgpc, wk, splits, s);
        case 3: return launch_gemv_lut_km<T, K, 3>(x, pt, at, cb, bias, N, nb, y, rgpc, wk, splits, s);
        case 4: return launch_gemv_lut_km<T, K, 4>(x, pt, at, cb, bias, N, nb, y, rgpc, wk, splits, s);
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
}

// rgpc: 32-row groups per CTA; wk: warps per row group along K; splits: CTAs of one cluster along
// K (sm_90 only; 1 elsewhere). k = 5 takes the shuffle kernel with wk * splits warps per row group.
template <typename T>
int launch_gemv(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int k,
                int M, int N, int nb, void* y, int rgpc, int wk, int splits, cudaStream_t s) {
    if (M == 0 || N <= 0) return 0;
    if (nb <= 0 || rgpc < 1 || wk < 1 || splits < 1 || splits > 8 || rgpc * wk * 32 > kLutMaxThreads)
        return static_cast<int>(cudaErrorInvalidValue);
    switch (k) {
        case 2: return launch_gemv_lut_k<T, 2>(x, pt, at, cb, bias, M, N, nb, y, rgpc, wk, splits, s);
        case 3: return launch_gemv_lut_k<T, 3>(x, pt, at, cb, bias, M, N, nb, y, rgpc, wk, splits, s);
        case 4: return launch_gemv_lut_k<T, 4>(x, pt, at, cb, bias, M, N, nb, y, rgpc, wk, splits, s);
        case 5: return launch_gemv_shfl_k<T, 5>(x, pt, at, cb, bias, M, N, nb, y,
                                                min(32, max(1, min(wk * splits, (nb + 3) / 4))), s);
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
}

template int launch_gemv<half>(const void*, const void*, const uint8_t*, const float*, const void*, int, int, int,
                                int, void*, int, int, int, cudaStream_t);
template int launch_gemv<__nv_bfloat16>(const void*, const void*, const uint8_t*, const float*, const void*, int,
                                         int, int, int, void*, int, int, int, cudaStream_t);

}  // namespace kbit
