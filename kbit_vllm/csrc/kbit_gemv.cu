// kbit GEMV for M = 1..4 rows of x: y[m, n] = sum_i x[m, i] * W[n, i] (+ bias[n]).
//
// CTA = 32 output rows (one lane per row: the tiled planes of 32 rows are 128 contiguous
// bytes) x WK warps splitting the input blocks. x is staged per chunk into shared memory as
// fp32, permuted into (group, field) order so a lane reads its group's 8 values with two
// broadcast 16-byte loads. Each lane decodes its row's codes 8 at a time (kbit_tile.cuh:
// bit-selects + one rotate + one shuffle per weight), accumulates the block's dot product in
// fp32 and applies the block scale once. Warps reduce through shared memory at the end.
#include "kbit_tile.cuh"

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
__global__ void __launch_bounds__(1024) gemv_kernel(const T* __restrict__ x, const uint32_t* __restrict__ packed_t,
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
int launch_gemv_km(const void* x, const void* packed_t, const uint8_t* absmax_t, const float* codebook,
                   const void* bias, int N, int nb, void* y, int wk, cudaStream_t stream) {
    const int nt = (N + kTileN - 1) / kTileN;
    const size_t smem = static_cast<size_t>(M) * wk * kGemvUnroll * 32 * sizeof(float);
    auto kern = gemv_kernel<T, K, M>;
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
int launch_gemv_k(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int M,
                  int N, int nb, void* y, int wk, cudaStream_t s) {
    switch (M) {
        case 1: return launch_gemv_km<T, K, 1>(x, pt, at, cb, bias, N, nb, y, wk, s);
        case 2: return launch_gemv_km<T, K, 2>(x, pt, at, cb, bias, N, nb, y, wk, s);
        case 3: return launch_gemv_km<T, K, 3>(x, pt, at, cb, bias, N, nb, y, wk, s);
        case 4: return launch_gemv_km<T, K, 4>(x, pt, at, cb, bias, N, nb, y, wk, s);
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
}

template <typename T>
int launch_gemv(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int k,
                int M, int N, int nb, void* y, int wk, cudaStream_t s) {
    if (M == 0 || N <= 0) return 0;
    if (wk < 1 || wk > 32 || nb <= 0) return static_cast<int>(cudaErrorInvalidValue);
    switch (k) {
        case 2: return launch_gemv_k<T, 2>(x, pt, at, cb, bias, M, N, nb, y, wk, s);
        case 3: return launch_gemv_k<T, 3>(x, pt, at, cb, bias, M, N, nb, y, wk, s);
        case 4: return launch_gemv_k<T, 4>(x, pt, at, cb, bias, M, N, nb, y, wk, s);
        case 5: return launch_gemv_k<T, 5>(x, pt, at, cb, bias, M, N, nb, y, wk, s);
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
}

template int launch_gemv<half>(const void*, const void*, const uint8_t*, const float*, const void*, int, int, int,
                                int, void*, int, cudaStream_t);
template int launch_gemv<__nv_bfloat16>(const void*, const void*, const uint8_t*, const float*, const void*, int,
                                         int, int, int, void*, int, cudaStream_t);

}  // namespace kbit
