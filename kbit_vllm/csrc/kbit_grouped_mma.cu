// kbit grouped tensor-core GEMM (MoE, any rows per expert): for every expert e,
// y[rows of e] = x[rows of e] @ W_e^T, all experts in one launch, reading the stacked tiled
// layout packed_tiled [E, n_tiles, nb, k, 128] / absmax_tiled [E, n_tiles, nb, 128].
//
// Grid: x = n-tile (128 output features of the layout); y = work item = (expert, BM-row tile of
// the expert's rows), found by moe::find_item over the device offsets (the host sizes y from an
// upper bound; surplus CTAs exit at once); z = K split.
// CTA tile: BM rows x 128 features x a K range; 8 warps as kWM (along M) x kWN (along N), each
// holding kMT m16 x kNT n8 fp32 accumulator tiles. BM <= 64: 1 x 8, each warp all rows x 16
// features, so every weight is decoded once per CTA (the decode, not the MMA, bounds these
// tiles); BM = 128: 2 x 4, each warp 64 rows x 32 features, halving the x fragments each warp
// reads from shared memory (shared-memory bandwidth bounds this tile). A 4- (bm16: 6-) stage
// cp.async pipeline brings per stage 2 quantization blocks (64 of K): the tile's plane words and
// absmax bytes (contiguous in the tiled layout) and the x rows (XOR-swizzled 16-byte chunks, read
// with ldmatrix; rows past the expert's end are zero-filled). Each thread decodes exactly its B
// fragments: lane % 4 is the layout's group g. k = 2..4: each fragment register is one
// pair-table lookup (kbit_lut.cuh, entries in the activation dtype) times the block scale (one
// 16-bit x2 multiply); k = 5: the lane codebook shuffle as in kbit_mma.cu.
// Split-K: every split stores its fp32 partial tile into workspace[split] ([splits, rows, N], plain
// 8-byte stores); the last CTA of a (work item, n-tile) (counter, atomicAdd) sums them in split
// order (one batch of independent loads per split), writes y and resets its counter to 0. The sum
// order is fixed, so y is bitwise reproducible in every mode. (Round 2 added the splits with
// red.global.add into one zeroed accumulator: on H200 that cost ~25 us at 512 x 2048 outputs and
// 2 splits, seed8 down T=64 bm64 41 us vs 17 us unsplit, while the awq grouped MMA's partials
// showed no such step.)
// Occupancy: BM <= 32 keeps 3 CTAs (24 warps) per SM, BM = 64 2 and BM = 128 1; bm16 uses 6
// stages (its stages are small), so every SM has more weight bytes in flight.
#include "kbit_mma_frag.cuh"
#include "kbit_sk.cuh"
#include "moe_common.cuh"

namespace kbit {

namespace {

constexpr int kGmThreads = 256;
constexpr int kGmBK = 2;  // quantization blocks per stage

using ptx::cp_async16;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::ldmatrix_x4;
using ptx::mma16816;
using ptx::smem_u32;

template <int K, int BM>
struct GmmaCfg {
    static constexpr int kStages = BM <= 16 ? 6 : 4;
    static constexpr int kMinCtas = BM <= 32 ? 3 : (BM <= 64 ? 2 : 1);  // resident CTAs per SM
    static constexpr int kWM = BM >= 128 ? 2 : 1;  // warps along M
    static constexpr int kWN = 8 / kWM;           // warps along N
    static constexpr int kMT = BM / kWM / 16;     // m16 tiles per warp
    static constexpr int kNT = kTileN / kWN / 8;  // n8 tiles per warp
    static constexpr bool kLut = K <= 4;
    static constexpr int kLutBytes = kLut ? kLutWords * 4 : 0;
    static constexpr int kBWords = kGmBK * K * kTileN;    // per stage
    static constexpr int kABytes = BM * kGmBK * 32 * 2;  // per stage (16-bit x)
    static constexpr int kAbsBytes = kGmBK * kTileN;     // per stage
    static constexpr int kStageBytes = kBWords * 4 + kABytes + kAbsBytes;
    static constexpr int kBytes = kLutBytes + kStageBytes * kStages;
    static_assert(kMT >= 1 && kNT >= 1 && kStageBytes % 16 == 0, "bad grouped MMA tile");
    static_assert(kMinCtas * (kBytes + 1024) <= 228 * 1024, "kMinCtas CTAs must fit one SM's shared memory");
};

// fp32 pair (a, b) at features c, c + 1 of a row (b only if c + 1 < N): one 8-byte store when
// pairs (N even, so c even is 8-byte aligned in an aligned buffer).
__device__ __forceinline__ void st_pair(float* dst, bool pairs, int c, int N, float a, float b) {
    if (c >= N) return;
    if (pairs) {
        *reinterpret_cast<float2*>(dst) = make_float2(a, b);
        return;
    }
    dst[0] = a;
    if (c + 1 < N) dst[1] = b;
}

// The pair st_pair stored, read past L1 (another CTA wrote it); zeros outside the row.
__device__ __forceinline__ float2 ld_pair(const float* src, bool pairs, int c, int N) {
    if (c >= N) return make_float2(0.f, 0.f);
    if (pairs) return __ldcg(reinterpret_cast<const float2*>(src));
    return make_float2(__ldcg(src), c + 1 < N ? __ldcg(src + 1) : 0.f);
}

template <typename T, int K, int BM>
__global__ void __launch_bounds__(kGmThreads, GmmaCfg<K, BM>::kMinCtas) grouped_mma_kernel(
    const T* __restrict__ x, const uint32_t* __restrict__ packed_t, const uint8_t* __restrict__ absmax_t,
    const float* __restrict__ codebook, const int* __restrict__ offs, T* __restrict__ y, int n_exp, int rows, int N,
    int nb, int splits, float* __restrict__ ws, int* __restrict__ counters) {
    using S = GmmaCfg<K, BM>;
    extern __shared__ __align__(16) unsigned char smem_gmma[];
    moe::Item it;
    if (!moe::find_item(offs, n_exp, rows, BM, static_cast<int>(blockIdx.y), it)) return;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / S::kWN, wn = warp - wm * S::kWN;
    const int g = lane & 3, col8 = lane >> 2;
    const int tile = blockIdx.x, split = blockIdx.z;
    const int m0 = it.row0 + it.sub * BM;
    const int m1 = min(it.row1, m0 + BM);  // rows [m0, m1) of x / y
    const int in_f = nb * 32;
    const int nst = (nb + kGmBK - 1) / kGmBK;
    const int st0 = static_cast<int>(static_cast<long long>(nst) * split / splits);
    const int st1 = static_cast<int>(static_cast<long long>(nst) * (split + 1) / splits);
    const size_t et = static_cast<size_t>(it.expert) * gridDim.x + tile;
    const uint32_t* Pt = packed_t + et * nb * K * kTileN;
    const uint8_t* At = absmax_t + et * nb * kTileN;
    uint32_t* tbl = reinterpret_cast<uint32_t*>(smem_gmma);
    unsigned char* stages = smem_gmma + S::kLutBytes;

    auto load_stage = [&](int st, int slot) {
        unsigned char* base = stages + slot * S::kStageBytes;
        const int j0 = st * kGmBK;
        const int jn = min(kGmBK, nb - j0);  // valid blocks in this stage
        // Chunk c = tid + i * kGmThreads of each part (tid < kGmThreads): fixed trip counts, fully
        // unrolled (a loop from tid compiled to a generic 4x-unrolled loop with a remainder, whose
        // per-copy address arithmetic was ~40% of the main loop's issued instructions).
        constexpr int kBChunks = S::kBWords / 4;
#pragma unroll
        for (int i = 0; i < (kBChunks + kGmThreads - 1) / kGmThreads; ++i) {
            const int c = tid + i * kGmThreads;
            if (kBChunks % kGmThreads != 0 && c >= kBChunks) break;
            const bool ok = c * 4 < jn * K * kTileN;
            cp_async16(base + c * 16, Pt + static_cast<size_t>(j0) * K * kTileN + (ok ? c * 4 : 0), ok);
        }
        constexpr int kAbsChunks = S::kAbsBytes / 16;
        static_assert(kAbsChunks <= kGmThreads, "one absmax chunk per thread at most");
        unsigned char* abs_s = base + S::kBWords * 4 + S::kABytes;
        if (tid < kAbsChunks) {
            const int c = tid;
            const bool ok = c * 16 < jn * kTileN;
            cp_async16(abs_s + c * 16, At + static_cast<size_t>(j0) * kTileN + (ok ? c * 16 : 0), ok);
        }
        // x rows m0.., 64 elements from column j0*32: 8 chunks of 16 B per row, swizzled.
        unsigned char* a_s = base + S::kBWords * 4;
        constexpr int kAChunks = BM * 8;
#pragma unroll
        for (int i = 0; i < (kAChunks + kGmThreads - 1) / kGmThreads; ++i) {
            const int c = tid + i * kGmThreads;
            if (kAChunks % kGmThreads != 0 && c >= kAChunks) break;
            const int r = c >> 3, ch = c & 7;
            const bool ok = (m0 + r < m1) && (ch < jn * 4);
            const T* src = x + (ok ? static_cast<size_t>(m0 + r) * in_f + static_cast<size_t>(j0) * 32 + ch * 8 : 0);
            cp_async16(a_s + r * 128 + ((ch ^ (r & 7)) << 4), src, ok);
        }
    };

    float acc[S::kMT][S::kNT][4];
#pragma unroll
    for (int i = 0; i < S::kMT; ++i)
#pragma unroll
        for (int s = 0; s < S::kNT; ++s)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][s][q] = 0.f;

#pragma unroll
    for (int s = 0; s < S::kStages - 1; ++s) {
        if (st0 + s < st1) load_stage(st0 + s, s);
        cp_async_commit();
    }
    // The table is built while the first stages are in flight; the loop's first barrier publishes it.
    float cbl = 0.f;
    if constexpr (S::kLut) {
        build_pair_lut<K, T>(tbl, codebook, tid, kGmThreads);
    } else {
        cbl = lane_codebook<K>(codebook, lane);
    }
    const uint32_t lane4 = static_cast<uint32_t>(lane) * 4u;
    const char* tblc = reinterpret_cast<const char*>(tbl);

    for (int st = st0; st < st1; ++st) {
        const int itn = st - st0;
        cp_async_wait<S::kStages - 2>();
        __syncthreads();
        {
            const int nxt = st + S::kStages - 1;
            if (nxt < st1) load_stage(nxt, (itn + S::kStages - 1) % S::kStages);
            cp_async_commit();
        }
        const unsigned char* base = stages + (itn % S::kStages) * S::kStageBytes;
        const uint32_t* b_s = reinterpret_cast<const uint32_t*>(base);
        const uint32_t a_base = smem_u32(base + S::kBWords * 4);
        const uint8_t* abs_s = base + S::kBWords * 4 + S::kABytes;
#pragma unroll
        for (int blk = 0; blk < kGmBK; ++blk) {
            uint32_t bf[S::kNT][4];  // [n8 tile][b0, b1 of k16 #0, b0, b1 of k16 #1]
#pragma unroll
            for (int s = 0; s < S::kNT; ++s) {
                const int c = wn * (S::kNT * 8) + s * 8 + col8;
                uint32_t p[K];
#pragma unroll
                for (int b = 0; b < K; ++b) p[b] = b_s[(blk * K + b) * kTileN + c];
                const float sc = decode_e4m4_fast(abs_s[blk * kTileN + c]);
                if constexpr (S::kLut) {
                    const uint32_t gw = group_word<K>(p, g);
                    const uint32_t s2 = pack2<T>(sc, sc);
                    bf[s][0] = lut_b<T, 0>(tblc, gw, lane4, s2);
                    bf[s][1] = lut_b<T, 1>(tblc, gw, lane4, s2);
                    bf[s][2] = lut_b<T, 2>(tblc, gw, lane4, s2);
                    bf[s][3] = lut_b<T, 3>(tblc, gw, lane4, s2);
                } else {
                    shfl_b4<T, K>(p, g, cbl, sc, bf[s]);
                }
            }
#pragma unroll
            for (int kk = 0; kk < 2; ++kk) {
                uint32_t bk[S::kNT][2];
#pragma unroll
                for (int s = 0; s < S::kNT; ++s) bk[s][0] = bf[s][2 * kk], bk[s][1] = bf[s][2 * kk + 1];
                mma_k16<T, S::kMT, S::kNT>(acc, a_base, wm * S::kMT * 16, blk, kk, lane, bk);
            }
        }
    }
    cp_async_wait<0>();

    // Epilogue. Fragment (i, s, q): row m0 + 16(wm*kMT + i) + lane/4 + 8*(q>>1),
    // feature tile*128 + 8(wn*kNT + s) + 2g + (q&1).
    const int rbase = m0 + wm * S::kMT * 16 + (lane >> 2);
    const int cbase = tile * kTileN + wn * S::kNT * 8 + 2 * g;
    const bool pairs = !(N & 1);
    if (splits > 1) {
        float* wsp = ws + static_cast<size_t>(split) * rows * N;
#pragma unroll
        for (int i = 0; i < S::kMT; ++i)
#pragma unroll
            for (int s = 0; s < S::kNT; ++s)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = rbase + 16 * i + 8 * h, c = cbase + 8 * s;
                    if (r < m1) st_pair(wsp + static_cast<size_t>(r) * N + c, pairs, c, N, acc[i][s][2 * h],
                                        acc[i][s][2 * h + 1]);
                }
        if (!sk_cta_arrive_last(counters + static_cast<size_t>(blockIdx.y) * gridDim.x + tile, splits - 1)) return;
        float own[S::kMT][S::kNT][4];
#pragma unroll
        for (int i = 0; i < S::kMT; ++i)
#pragma unroll
            for (int s = 0; s < S::kNT; ++s)
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    own[i][s][q] = acc[i][s][q];
                    acc[i][s][q] = 0.f;
                }
        for (int z = 0; z < splits; ++z) {  // fixed order; each split's loads are independent
            const float* src = ws + static_cast<size_t>(z) * rows * N;
#pragma unroll
            for (int i = 0; i < S::kMT; ++i)
#pragma unroll
                for (int s = 0; s < S::kNT; ++s)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int r = rbase + 16 * i + 8 * h, c = cbase + 8 * s;
                        if (r < m1) {
                            float2 v;
                            if (z == split) {
                                v = make_float2(own[i][s][2 * h], own[i][s][2 * h + 1]);
                            } else {
                                v = ld_pair(src + static_cast<size_t>(r) * N + c, pairs, c, N);
                            }
                            acc[i][s][2 * h] += v.x;
                            acc[i][s][2 * h + 1] += v.y;
                        }
                    }
        }
    }
    const bool ypairs = pairs && (reinterpret_cast<uintptr_t>(y) & 3) == 0;
#pragma unroll
    for (int i = 0; i < S::kMT; ++i)
#pragma unroll
        for (int s = 0; s < S::kNT; ++s)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = rbase + 16 * i + 8 * h, c = cbase + 8 * s;
                if (r >= m1 || c >= N) continue;
                T* dst = y + static_cast<size_t>(r) * N + c;
                if (ypairs) {
                    *reinterpret_cast<uint32_t*>(dst) = pack2<T>(acc[i][s][2 * h], acc[i][s][2 * h + 1]);
                } else {
                    dst[0] = from_float<T>(acc[i][s][2 * h]);
                    if (c + 1 < N) dst[1] = from_float<T>(acc[i][s][2 * h + 1]);
                }
            }
}

template <typename T, int K, int BM>
int launch_grouped_mma_kbm(const void* x, const void* pt, const uint8_t* at, const float* cb, const int* offs, void* y,
                           int n_exp, int rows, int N, int nb, int items, int splits, float* ws,
                           int* counters, cudaStream_t stream) {
    using S = GmmaCfg<K, BM>;
    auto kern = grouped_mma_kernel<T, K, BM>;
    if (S::kBytes > 48 * 1024) {
        const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kBytes);
        if (e != cudaSuccess) return static_cast<int>(e);
    }
    const dim3 grid(static_cast<unsigned>((N + kTileN - 1) / kTileN), static_cast<unsigned>(items),
                    static_cast<unsigned>(splits));
    kern<<<grid, kGmThreads, S::kBytes, stream>>>(static_cast<const T*>(x), static_cast<const uint32_t*>(pt), at, cb,
                                                   offs, static_cast<T*>(y), n_exp, rows, N, nb, splits, ws, counters);
    KBIT_RETURN_LAUNCH_STATUS();
}

template <typename T, int K>
int launch_grouped_mma_k(const void* x, const void* pt, const uint8_t* at, const float* cb, const int* offs, void* y,
                         int n_exp, int rows, int N, int nb, int bm, int items, int splits, float* ws,
                         int* counters, cudaStream_t s) {
    switch (bm) {
        case 16: return launch_grouped_mma_kbm<T, K, 16>(x, pt, at, cb, offs, y, n_exp, rows, N, nb, items, splits, ws, counters, s);
        case 32: return launch_grouped_mma_kbm<T, K, 32>(x, pt, at, cb, offs, y, n_exp, rows, N, nb, items, splits, ws, counters, s);
        case 64: return launch_grouped_mma_kbm<T, K, 64>(x, pt, at, cb, offs, y, n_exp, rows, N, nb, items, splits, ws, counters, s);
        case 128: return launch_grouped_mma_kbm<T, K, 128>(x, pt, at, cb, offs, y, n_exp, rows, N, nb, items, splits, ws, counters, s);
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
}

}  // namespace

// bm: x rows per CTA tile (16, 32, 64, 128). items: grid rows, an upper bound on the number of
// (expert, bm-row tile) items: (rows + min(n_exp, rows) * (bm - 1)) / bm. splits: K splits; > 1
// needs counters [items * n_tiles] int32 (zero on entry, left zero) and ws, the fp32 partials
// [splits, rows, N] (any contents).
template <typename T>
int launch_grouped_mma(const void* x, const void* pt, const uint8_t* at, const float* cb, const int* offs, void* y,
                       int k, int n_exp, int rows, int N, int nb, int bm, int items, int splits, float* ws,
                       int* counters, cudaStream_t s) {
    if (rows <= 0 || N <= 0) return 0;
    if (nb <= 0 || n_exp <= 0 || items < 1 || items > 65535 || splits < 1 || splits > 65535 ||
        (splits > 1 && (ws == nullptr || counters == nullptr)))
        return static_cast<int>(cudaErrorInvalidValue);
    switch (k) {
        case 2: return launch_grouped_mma_k<T, 2>(x, pt, at, cb, offs, y, n_exp, rows, N, nb, bm, items, splits, ws, counters, s);
        case 3: return launch_grouped_mma_k<T, 3>(x, pt, at, cb, offs, y, n_exp, rows, N, nb, bm, items, splits, ws, counters, s);
        case 4: return launch_grouped_mma_k<T, 4>(x, pt, at, cb, offs, y, n_exp, rows, N, nb, bm, items, splits, ws, counters, s);
        case 5: return launch_grouped_mma_k<T, 5>(x, pt, at, cb, offs, y, n_exp, rows, N, nb, bm, items, splits, ws, counters, s);
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
}

template int launch_grouped_mma<half>(const void*, const void*, const uint8_t*, const float*, const int*, void*, int,
                                      int, int, int, int, int, int, int, float*, int*, cudaStream_t);
template int launch_grouped_mma<__nv_bfloat16>(const void*, const void*, const uint8_t*, const float*, const int*,
                                               void*, int, int, int, int, int, int, int, int, float*, int*,
                                               cudaStream_t);

}  // namespace kbit
