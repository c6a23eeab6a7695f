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
// reads from shared memory (shared-memory bandwidth bounds this tile). A 4-stage cp.async pipeline brings per stage 2
// quantization blocks (64 of K): the tile's plane words and absmax bytes (contiguous in the tiled
// layout) and the x rows (XOR-swizzled 16-byte chunks, read with ldmatrix; rows past the
// expert's end are zero-filled). Each thread decodes exactly its B fragments: lane % 4 is the
// layout's group g. k = 2..4: each fragment register is one pair-table lookup (kbit_lut.cuh,
// entries in the activation dtype) times the block scale (one 16-bit x2 multiply); k = 5: the
// lane codebook shuffle as in kbit_mma.cu.
// Split-K: the last CTA of a (work item, n-tile) (counter, atomicAdd) writes y and resets its
// counter to 0. Default mode: every split adds its fp32 sums into a zeroed accumulator [rows, N]
// with reductions in L2 (no waiting), and the last CTA reads each sum once and re-zeroes it; the
// order of those additions varies, so the low bits of y may too. Deterministic mode
// (KBIT_VLLM_DETERMINISTIC=1, backends/cuda/dispatch.py): partials go to workspace[split]
// ([splits, rows, N]) and the last CTA sums them in split order, one batch of independent loads
// per split (a load per split and value in series would cost ~splits x 64 L2 round trips).
#include "kbit_sk.cuh"
#include "mma_ptx.cuh"
#include "moe_common.cuh"

namespace kbit {

namespace {

constexpr int kGmThreads = 256;
constexpr int kGmStages = 4;
constexpr int kGmBK = 2;  // quantization blocks per stage

using ptx::cp_async16;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::ldmatrix_x4;
using ptx::mma16816;
using ptx::smem_u32;

template <int K, int BM>
struct GmmaCfg {
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
    static constexpr int kBytes = kLutBytes + kStageBytes * kGmStages;
    static_assert(kMT >= 1 && kNT >= 1 && kStageBytes % 16 == 0, "bad grouped MMA tile");
};

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

// Add (a, b) into dst[0], dst[1] (b only if has_b) in L2 without waiting; pair: one 8-byte reduction.
__device__ __forceinline__ void red_add_pair(float* dst, bool pair, float a, float b, bool has_b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (pair) {
        asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(dst), "f"(a), "f"(b) : "memory");
        return;
    }
#endif
    atomicAdd(dst, a);
    if (has_b) atomicAdd(dst + 1, b);
}

template <typename T, int K, int BM>
__global__ void __launch_bounds__(kGmThreads, BM >= 128 ? 1 : 2) grouped_mma_kernel(
    const T* __restrict__ x, const uint32_t* __restrict__ packed_t, const uint8_t* __restrict__ absmax_t,
    const float* __restrict__ codebook, const int* __restrict__ offs, T* __restrict__ y, int n_exp, int rows, int N,
    int nb, int splits, int det, float* __restrict__ ws, int* __restrict__ counters) {
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
        constexpr int kBChunks = S::kBWords / 4;
        for (int c = tid; c < kBChunks; c += kGmThreads) {
            const bool ok = c * 4 < jn * K * kTileN;
            cp_async16(base + c * 16, Pt + static_cast<size_t>(j0) * K * kTileN + (ok ? c * 4 : 0), ok);
        }
        constexpr int kAbsChunks = S::kAbsBytes / 16;
        unsigned char* abs_s = base + S::kBWords * 4 + S::kABytes;
        for (int c = tid; c < kAbsChunks; c += kGmThreads) {
            const bool ok = c * 16 < jn * kTileN;
            cp_async16(abs_s + c * 16, At + static_cast<size_t>(j0) * kTileN + (ok ? c * 16 : 0), ok);
        }
        // x rows m0.., 64 elements from column j0*32: 8 chunks of 16 B per row, swizzled.
        unsigned char* a_s = base + S::kBWords * 4;
        constexpr int kAChunks = BM * 8;
        for (int c = tid; c < kAChunks; c += kGmThreads) {
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
    for (int s = 0; s < kGmStages - 1; ++s) {
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
        cp_async_wait<kGmStages - 2>();
        __syncthreads();
        {
            const int nxt = st + kGmStages - 1;
            if (nxt < st1) load_stage(nxt, (itn + kGmStages - 1) % kGmStages);
            cp_async_commit();
        }
        const unsigned char* base = stages + (itn % kGmStages) * S::kStageBytes;
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
                    bf[s][0] = mul2<T>(*reinterpret_cast<const uint32_t*>(tblc + lut_off<0>(gw, g, lane4)), s2);
                    bf[s][1] = mul2<T>(*reinterpret_cast<const uint32_t*>(tblc + lut_off<1>(gw, g, lane4)), s2);
                    bf[s][2] = mul2<T>(*reinterpret_cast<const uint32_t*>(tblc + lut_off<2>(gw, g, lane4)), s2);
                    bf[s][3] = mul2<T>(*reinterpret_cast<const uint32_t*>(tblc + lut_off<3>(gw, g, lane4)), s2);
                } else {
                    float v[8];
                    decode_group<K>(p, g, cbl, v);
#pragma unroll
                    for (int q = 0; q < 4; ++q) bf[s][q] = pack2<T>(v[2 * q] * sc, v[2 * q + 1] * sc);
                }
            }
#pragma unroll
            for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
                for (int i = 0; i < S::kMT; ++i) {
                    const int r = (wm * S::kMT + i) * 16 + (lane & 15);
                    const int ch = blk * 4 + kk * 2 + (lane >> 4);
                    uint32_t af[4];
                    ldmatrix_x4(af, a_base + r * 128 + ((ch ^ (r & 7)) << 4));
#pragma unroll
                    for (int s = 0; s < S::kNT; ++s) mma16816<T>(acc[i][s], af, bf[s][2 * kk], bf[s][2 * kk + 1]);
                }
            }
        }
    }
    cp_async_wait<0>();

    // Epilogue. Fragment (i, s, q): row m0 + 16(wm*kMT + i) + lane/4 + 8*(q>>1),
    // feature tile*128 + 8(wn*kNT + s) + 2g + (q&1).
    const int rbase = m0 + wm * S::kMT * 16 + (lane >> 2);
    const int cbase = tile * kTileN + wn * S::kNT * 8 + 2 * g;
    if (splits > 1) {
        if (det) {
            float* wsp = ws + static_cast<size_t>(split) * rows * N;
#pragma unroll
            for (int i = 0; i < S::kMT; ++i)
#pragma unroll
                for (int s = 0; s < S::kNT; ++s)
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        const int r = rbase + 16 * i + 8 * (q >> 1), c = cbase + 8 * s + (q & 1);
                        if (r < m1 && c < N) wsp[static_cast<size_t>(r) * N + c] = acc[i][s][q];
                    }
        } else {
#pragma unroll
            for (int i = 0; i < S::kMT; ++i)
#pragma unroll
                for (int s = 0; s < S::kNT; ++s)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int r = rbase + 16 * i + 8 * h, c = cbase + 8 * s;
                        if (r < m1 && c < N) red_add_pair(ws + static_cast<size_t>(r) * N + c, c + 1 < N && !(N & 1),
                                                          acc[i][s][2 * h], acc[i][s][2 * h + 1], c + 1 < N);
                    }
        }
        __threadfence();
        __syncthreads();
        __shared__ int last;
        int* ctr = counters + static_cast<size_t>(blockIdx.y) * gridDim.x + tile;
        if (tid == 0) last = atomicAdd(ctr, 1) == splits - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
        if (det) {
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
                        for (int q = 0; q < 4; ++q) {
                            const int r = rbase + 16 * i + 8 * (q >> 1), c = cbase + 8 * s + (q & 1);
                            if (r < m1 && c < N)
                                acc[i][s][q] += z == split ? own[i][s][q] : __ldcg(src + static_cast<size_t>(r) * N + c);
                        }
            }
        } else {
#pragma unroll
            for (int i = 0; i < S::kMT; ++i)
#pragma unroll
                for (int s = 0; s < S::kNT; ++s)
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        const int r = rbase + 16 * i + 8 * (q >> 1), c = cbase + 8 * s + (q & 1);
                        if (r < m1 && c < N) {
                            float* src = ws + static_cast<size_t>(r) * N + c;
                            acc[i][s][q] = __ldcg(src);
                            __stcg(src, 0.f);
                        }
                    }
        }
        if (tid == 0) *ctr = 0;
    }
#pragma unroll
    for (int i = 0; i < S::kMT; ++i)
#pragma unroll
        for (int s = 0; s < S::kNT; ++s)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int r = rbase + 16 * i + 8 * (q >> 1), c = cbase + 8 * s + (q & 1);
                if (r < m1 && c < N) y[static_cast<size_t>(r) * N + c] = from_float<T>(acc[i][s][q]);
            }
}

template <typename T, int K, int BM>
int launch_grouped_mma_kbm(const void* x, const void* pt, const uint8_t* at, const float* cb, const int* offs, void* y,
                           int n_exp, int rows, int N, int nb, int items, int splits, int det, float* ws,
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
                                                   offs, static_cast<T*>(y), n_exp, rows, N, nb, splits, det, ws, counters);
    KBIT_RETURN_LAUNCH_STATUS();
}

template <typename T, int K>
int launch_grouped_mma_k(const void* x, const void* pt, const uint8_t* at, const float* cb, const int* offs, void* y,
                         int n_exp, int rows, int N, int nb, int bm, int items, int splits, int det, float* ws,
                         int* counters, cudaStream_t s) {
    switch (bm) {
        case 16: return launch_grouped_mma_kbm<T, K, 16>(x, pt, at, cb, offs, y, n_exp, rows, N, nb, items, splits, det, ws, counters, s);
        case 32: return launch_grouped_mma_kbm<T, K, 32>(x, pt, at, cb, offs, y, n_exp, rows, N, nb, items, splits, det, ws, counters, s);
        case 64: return launch_grouped_mma_kbm<T, K, 64>(x, pt, at, cb, offs, y, n_exp, rows, N, nb, items, splits, det, ws, counters, s);
        case 128: return launch_grouped_mma_kbm<T, K, 128>(x, pt, at, cb, offs, y, n_exp, rows, N, nb, items, splits, det, ws, counters, s);
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
}

}  // namespace

// bm: x rows per CTA tile (16, 32, 64, 128). items: grid rows, an upper bound on the number of
// (expert, bm-row tile) items: (rows + min(n_exp, rows) * (bm - 1)) / bm. splits: K splits; > 1
// needs counters [items * n_tiles] int32 (zero on entry, left zero) and ws: det != 0, the fp32
// partials [splits, rows, N] (any contents); det == 0, a zeroed fp32 accumulator [rows, N] (left zero).
template <typename T>
int launch_grouped_mma(const void* x, const void* pt, const uint8_t* at, const float* cb, const int* offs, void* y,
                       int k, int n_exp, int rows, int N, int nb, int bm, int items, int splits, int det, float* ws,
                       int* counters, cudaStream_t s) {
    if (rows <= 0 || N <= 0) return 0;
    if (nb <= 0 || n_exp <= 0 || items < 1 || items > 65535 || splits < 1 || splits > 65535 ||
        (splits > 1 && (ws == nullptr || counters == nullptr)))
        return static_cast<int>(cudaErrorInvalidValue);
    switch (k) {
        case 2: return launch_grouped_mma_k<T, 2>(x, pt, at, cb, offs, y, n_exp, rows, N, nb, bm, items, splits, det, ws, counters, s);
        case 3: return launch_grouped_mma_k<T, 3>(x, pt, at, cb, offs, y, n_exp, rows, N, nb, bm, items, splits, det, ws, counters, s);
        case 4: return launch_grouped_mma_k<T, 4>(x, pt, at, cb, offs, y, n_exp, rows, N, nb, bm, items, splits, det, ws, counters, s);
        case 5: return launch_grouped_mma_k<T, 5>(x, pt, at, cb, offs, y, n_exp, rows, N, nb, bm, items, splits, det, ws, counters, s);
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
}

template int launch_grouped_mma<half>(const void*, const void*, const uint8_t*, const float*, const int*, void*, int,
                                      int, int, int, int, int, int, int, int, float*, int*, cudaStream_t);
template int launch_grouped_mma<__nv_bfloat16>(const void*, const void*, const uint8_t*, const float*, const int*,
                                               void*, int, int, int, int, int, int, int, int, int, float*, int*,
                                               cudaStream_t);

}  // namespace kbit
