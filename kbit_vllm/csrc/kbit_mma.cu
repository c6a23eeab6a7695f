// kbit tensor-core GEMM for mid M: y[M, N] = x[M, K] @ W^T (+ bias), W in the tiled layout.
//
// CTA tile: 16*MB rows of x  x  128 output rows (one n-tile)  x  a K range (split-K).
// 8 warps; warp w owns output rows [16w, 16w+16) of the tile (two n8 MMA sub-tiles) for all
// 16*MB x rows. A 4-stage cp.async pipeline brings, per stage, 2 quantization blocks (64 of K):
// the tile's plane words and absmax bytes (contiguous in the tiled layout) and the x tile
// (XOR-swizzled 16-byte chunks, read with ldmatrix). Each thread decodes exactly its B
// fragment: lane%4 is the layout's group g, whose 8 elements are the fragment's k-rows
// 2g,2g+1,2g+8,2g+9 (+16), so one plane gather + 8 shuffles give 2 x m16n8k16 B fragments.
// Split-K: every split writes its fp32 partial to workspace[split]; the last CTA of a tile
// (tile counter, atomicAdd) sums the splits in a fixed order (deterministic), adds bias, writes
// y and resets the counter to 0 for the next call.
#include "kbit_tile.cuh"
#include "mma_ptx.cuh"

namespace kbit {

constexpr int kMmaThreads = 256;
constexpr int kMmaStages = 4;
constexpr int kMmaBK = 2;  // quantization blocks per stage

using ptx::cp_async16;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::ldmatrix_x4;
using ptx::mma16816;
using ptx::smem_u32;

template <int K, int MB>
struct MmaSmem {
    static constexpr int kRowsA = 16 * MB;
    static constexpr int kBWords = kMmaBK * K * kTileN;           // per stage
    static constexpr int kABytes = kRowsA * kMmaBK * 32 * 2;      // per stage (16-bit x)
    static constexpr int kAbsBytes = kMmaBK * kTileN;             // per stage
    static constexpr int kStageBytes = kBWords * 4 + kABytes + kAbsBytes;
    static constexpr int kBytes = kStageBytes * kMmaStages;
};

template <typename T, int K, int MB>
__global__ void __launch_bounds__(kMmaThreads) mma_kernel(const T* __restrict__ x, const uint32_t* __restrict__ packed_t,
                                                          const uint8_t* __restrict__ absmax_t,
                                                          const float* __restrict__ codebook,
                                                          const T* __restrict__ bias, T* __restrict__ y, int M, int N,
                                                          int nb, int splits, float* __restrict__ ws,
                                                          int* __restrict__ counters) {
    using S = MmaSmem<K, MB>;
    extern __shared__ __align__(16) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane & 3, col8 = lane >> 2;
    const int tile = blockIdx.x, mt = blockIdx.y, split = blockIdx.z;
    const int m0 = mt * S::kRowsA;
    const int in_f = nb * 32;
    const int nst = (nb + kMmaBK - 1) / kMmaBK;
    const int st0 = static_cast<int>(static_cast<long long>(nst) * split / splits);
    const int st1 = static_cast<int>(static_cast<long long>(nst) * (split + 1) / splits);
    const uint32_t* Pt = packed_t + static_cast<size_t>(tile) * nb * K * kTileN;
    const uint8_t* At = absmax_t + static_cast<size_t>(tile) * nb * kTileN;

    auto stage_ptr = [&](int s) { return smem + s * S::kStageBytes; };

    auto load_stage = [&](int st, int slot) {
        unsigned char* base = stage_ptr(slot);
        const int j0 = st * kMmaBK;
        const int jn = min(kMmaBK, nb - j0);  // valid blocks in this stage
        // B planes: jn*K*128 words contiguous from block j0.
        constexpr int kBChunks = S::kBWords / 4;
        for (int c = tid; c < kBChunks; c += kMmaThreads) {
            const bool ok = c * 4 < jn * K * kTileN;
            cp_async16(base + c * 16, Pt + static_cast<size_t>(j0) * K * kTileN + (ok ? c * 4 : 0), ok);
        }
        constexpr int kAbsChunks = S::kAbsBytes / 16;
        unsigned char* abs_s = base + S::kBWords * 4 + S::kABytes;
        for (int c = tid; c < kAbsChunks; c += kMmaThreads) {
            const bool ok = c * 16 < jn * kTileN;
            cp_async16(abs_s + c * 16, At + static_cast<size_t>(j0) * kTileN + (ok ? c * 16 : 0), ok);
        }
        // x tile: rows m0.., 64 elements from column j0*32: 8 chunks of 16 B per row, swizzled.
        unsigned char* a_s = base + S::kBWords * 4;
        constexpr int kAChunks = S::kRowsA * 8;
        for (int c = tid; c < kAChunks; c += kMmaThreads) {
            const int r = c >> 3, ch = c & 7;
            const bool ok = (m0 + r < M) && (ch < jn * 4);
            const T* src = x + (ok ? static_cast<size_t>(m0 + r) * in_f + static_cast<size_t>(j0) * 32 + ch * 8 : 0);
            cp_async16(a_s + r * 128 + ((ch ^ (r & 7)) << 4), src, ok);
        }
    };

    float acc[MB][2][4];
#pragma unroll
    for (int i = 0; i < MB; ++i)
#pragma unroll
        for (int s = 0; s < 2; ++s)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][s][q] = 0.f;

    const float cbl = lane_codebook<K>(codebook, lane);

#pragma unroll
    for (int s = 0; s < kMmaStages - 1; ++s) {
        if (st0 + s < st1) load_stage(st0 + s, s);
        cp_async_commit();
    }

    for (int st = st0; st < st1; ++st) {
        const int it = st - st0;
        cp_async_wait<kMmaStages - 2>();
        __syncthreads();
        {
            const int nxt = st + kMmaStages - 1;
            if (nxt < st1) load_stage(nxt, (it + kMmaStages - 1) % kMmaStages);
            cp_async_commit();
        }
        const unsigned char* base = stage_ptr(it % kMmaStages);
        const uint32_t* b_s = reinterpret_cast<const uint32_t*>(base);
        const uint32_t a_base = smem_u32(base + S::kBWords * 4);
        const uint8_t* abs_s = base + S::kBWords * 4 + S::kABytes;
#pragma unroll
        for (int blk = 0; blk < kMmaBK; ++blk) {
            uint32_t bf[2][4];  // [n8 sub-tile][b0,b1 of k16 #0, b0,b1 of k16 #1]
#pragma unroll
            for (int s = 0; s < 2; ++s) {
                const int c = warp * 16 + s * 8 + col8;
                uint32_t p[K];
#pragma unroll
                for (int b = 0; b < K; ++b) p[b] = b_s[(blk * K + b) * kTileN + c];
                const float sc = decode_e4m4(abs_s[blk * kTileN + c]);
                float v[8];
                decode_group<K>(p, g, cbl, v);
#pragma unroll
                for (int q = 0; q < 4; ++q) bf[s][q] = pack2<T>(v[2 * q] * sc, v[2 * q + 1] * sc);
            }
#pragma unroll
            for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
                for (int i = 0; i < MB; ++i) {
                    const int r = i * 16 + (lane & 15);
                    const int ch = blk * 4 + kk * 2 + (lane >> 4);
                    uint32_t af[4];
                    ldmatrix_x4(af, a_base + r * 128 + ((ch ^ (r & 7)) << 4));
#pragma unroll
                    for (int s = 0; s < 2; ++s) mma16816<T>(acc[i][s], af, bf[s][2 * kk], bf[s][2 * kk + 1]);
                }
            }
        }
    }
    cp_async_wait<0>();

    // Epilogue. Fragment (i, s, q): row m0 + 16i + lane/4 + 8*(q>>1), col tile*128 + 16w + 8s + 2g + (q&1).
    const int rbase = m0 + (lane >> 2);
    const int cbase = tile * kTileN + warp * 16 + 2 * g;
    if (splits > 1) {
        float* wsp = ws + static_cast<size_t>(split) * M * N;
#pragma unroll
        for (int i = 0; i < MB; ++i)
#pragma unroll
            for (int s = 0; s < 2; ++s)
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const int r = rbase + 16 * i + 8 * (q >> 1), c = cbase + 8 * s + (q & 1);
                    if (r < M && c < N) wsp[static_cast<size_t>(r) * N + c] = acc[i][s][q];
                }
        __threadfence();
        __syncthreads();
        __shared__ int last;
        int* ctr = counters + mt * gridDim.x + tile;
        if (tid == 0) last = atomicAdd(ctr, 1) == splits - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
#pragma unroll
        for (int i = 0; i < MB; ++i)
#pragma unroll
            for (int s = 0; s < 2; ++s)
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const int r = rbase + 16 * i + 8 * (q >> 1), c = cbase + 8 * s + (q & 1);
                    float sum = 0.f;
                    if (r < M && c < N)
                        for (int z = 0; z < splits; ++z)
                            sum += z == split ? acc[i][s][q] : __ldcg(ws + (static_cast<size_t>(z) * M + r) * N + c);
                    acc[i][s][q] = sum;
                }
        if (tid == 0) *ctr = 0;
    }
#pragma unroll
    for (int i = 0; i < MB; ++i)
#pragma unroll
        for (int s = 0; s < 2; ++s)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int r = rbase + 16 * i + 8 * (q >> 1), c = cbase + 8 * s + (q & 1);
                if (r < M && c < N) {
                    float v = acc[i][s][q];
                    if (bias != nullptr) v += to_float(bias[c]);
                    y[static_cast<size_t>(r) * N + c] = from_float<T>(v);
                }
            }
}

template <typename T, int K, int MB>
int launch_mma_kmb(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int M,
                   int N, int nb, void* y, int splits, float* ws, int* counters, cudaStream_t stream) {
    using S = MmaSmem<K, MB>;
    auto kern = mma_kernel<T, K, MB>;
    if (S::kBytes > 48 * 1024) {
        const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kBytes);
        if (e != cudaSuccess) return static_cast<int>(e);
    }
    const int nt = (N + kTileN - 1) / kTileN;
    const int mts = (M + S::kRowsA - 1) / S::kRowsA;
    const dim3 grid(nt, mts, splits);
    kern<<<grid, kMmaThreads, S::kBytes, stream>>>(static_cast<const T*>(x), static_cast<const uint32_t*>(pt), at,
                                                   cb, static_cast<const T*>(bias), static_cast<T*>(y), M, N, nb,
                                                   splits, ws, counters);
    KBIT_RETURN_LAUNCH_STATUS();
}

template <typename T, int K>
int launch_mma_k(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int M, int N,
                 int nb, void* y, int mb, int splits, float* ws, int* counters, cudaStream_t s) {
    switch (mb) {
        case 1: return launch_mma_kmb<T, K, 1>(x, pt, at, cb, bias, M, N, nb, y, splits, ws, counters, s);
        case 2: return launch_mma_kmb<T, K, 2>(x, pt, at, cb, bias, M, N, nb, y, splits, ws, counters, s);
        case 4: return launch_mma_kmb<T, K, 4>(x, pt, at, cb, bias, M, N, nb, y, splits, ws, counters, s);
        case 8: return launch_mma_kmb<T, K, 8>(x, pt, at, cb, bias, M, N, nb, y, splits, ws, counters, s);
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
}

// mb: x rows per CTA / 16 (1, 2, 4, 8). splits: K splits (>1 needs ws [splits, M, N] fp32 and
// counters [ceil(M / 16mb) * n_tiles] int32, zero on entry; left zero on exit).
template <typename T>
int launch_mma(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int k, int M,
               int N, int nb, void* y, int mb, int splits, float* ws, int* counters, cudaStream_t s) {
    if (M == 0 || N <= 0) return 0;
    if (nb <= 0 || splits < 1 || splits > 65535 || (splits > 1 && (ws == nullptr || counters == nullptr)))
        return static_cast<int>(cudaErrorInvalidValue);
    switch (k) {
        case 2: return launch_mma_k<T, 2>(x, pt, at, cb, bias, M, N, nb, y, mb, splits, ws, counters, s);
        case 3: return launch_mma_k<T, 3>(x, pt, at, cb, bias, M, N, nb, y, mb, splits, ws, counters, s);
        case 4: return launch_mma_k<T, 4>(x, pt, at, cb, bias, M, N, nb, y, mb, splits, ws, counters, s);
        case 5: return launch_mma_k<T, 5>(x, pt, at, cb, bias, M, N, nb, y, mb, splits, ws, counters, s);
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
}

template int launch_mma<half>(const void*, const void*, const uint8_t*, const float*, const void*, int, int, int, int,
                              void*, int, int, float*, int*, cudaStream_t);
template int launch_mma<__nv_bfloat16>(const void*, const void*, const uint8_t*, const float*, const void*, int, int,
                                       int, int, void*, int, int, float*, int*, cudaStream_t);

}  // namespace kbit
