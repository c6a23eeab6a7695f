// kbit row-slice GEMV, M = 1, k = 2..4: y[n] = sum_i x[i] * W[n, i] (+ bias), with no partial sums
// leaving the CTA.
//
// Why: the stream-K GEMV (kbit_gemv_sk.cu) splits a 128-row layout tile's K over many warps of
// many CTAs, and each split adds its 128 sums into an fp32 accumulator in L2, fences and counts in
// at the tile's counter; on layers of 12-60 M weights that arrival costs ~2-3 µs of a ~9-14 µs
// call (RESULTS.md, session 38). Here a CTA owns P consecutive output rows (a slice: P = 8, 16, 32
// or 64, a sixteenth to a half of a layout tile) over the whole K, so its warps' sums meet in shared
// memory and it writes y itself: no workspace, no atomics, no fence, and a fixed order of additions
// (deterministic).
//
// Lanes: a slice's rows are P / 4 lanes' worth of a tiled unit (lane l of a unit holds rows 4l..4l+3,
// one uint4 per plane, kbit_sk.cuh), so a warp runs G = 128 / P lane groups side by side, each on its
// own input block of the slice: lane (group g, index j) reads what unit lane (slice * P / 4 + j)
// would, with sk_unit's body (one byte permute, one shared load and one half2 FMA a pair). The lane
// groups of the CTA's W warps take blocks g + W G n, n = 0, 1, .., so at any time the CTA reads W G
// consecutive blocks, and the slices of one tile (other CTAs) read the rest of the same units.
// Every CTA stages all of x (nb <= kStagedXSlots blocks) as fp16 times one power of two in the wide
// table's unused right halves (staged_x_word), as the stream-K GEMV stages its units' x.
// Loads: D = 1 keeps one block a lane group in flight beside the one it sums (79 registers, three CTAs
// an SM); D = 4 requests a lane group's blocks four at a time, the first four before pdl_wait, so a
// slice with up to four blocks a group waits on one DRAM round trip instead of one a block (126-128
// registers, two CTAs an SM). k = 3, 4 on 3072+ inputs take D = 4 (rows_depth below).
#include "kbit_sk.cuh"
#include "pdl.cuh"

#include <type_traits>

namespace kbit {

constexpr int kRowsWarps = kSkWarps;  // warps per CTA (three CTAs an SM beside the 64 KB table)

template <typename T, int K, int P, int D>
__global__ void __launch_bounds__(kRowsWarps * 32, D == 1 ? 3 : 2)
    gemv_rows_kernel(const T* __restrict__ x, const uint4* __restrict__ packed_t, const uint32_t* __restrict__ absmax_t,
                     const float* __restrict__ codebook, const T* __restrict__ bias, T* __restrict__ y, int N, int nb) {
    static_assert(K >= 2 && K <= 4, "the row-slice GEMV runs on the wide table (k <= 4)");
    static_assert(P == 8 || P == 16 || P == 32 || P == 64, "a slice is a half to a sixteenth of a layout tile");
    static_assert(D == 1 || D == 4, "one block in flight beside the summed one, or four requested together");
    constexpr int W = kRowsWarps;
    constexpr int LPG = P / 4;         // lanes per group (a slice's rows)
    constexpr int G = 32 / LPG;        // lane groups per warp (blocks side by side)
    constexpr int kStride = W * G;     // blocks the CTA runs at once
    extern __shared__ uint4 smem_rows[];
    __shared__ __align__(16) float red[W][P];
    __shared__ float xmax[W];
    uint32_t* tbl = reinterpret_cast<uint32_t*>(smem_rows);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int grp = lane / LPG, j = lane % LPG;
    const int slices = kTileN / P;
    const int t = blockIdx.x / slices, col = (blockIdx.x - t * slices) * LPG + j;  // tile, unit lane
    const uint4* pt = packed_t + static_cast<size_t>(t) * nb * K * 32 + col;
    const uint32_t* at = absmax_t + static_cast<size_t>(t) * nb * 32 + col;
    auto load = [&](int blk, uint4 (&p)[K], uint32_t& a) {
#pragma unroll
        for (int b = 0; b < K; ++b) p[b] = __ldg(pt + (static_cast<size_t>(blk) * K + b) * 32);
        a = __ldg(at + static_cast<size_t>(blk) * 32);
    };

    // Weights and table only until pdl_wait (pdl.cuh).
    pdl_trigger();
    const float cbl = lane_codebook<K>(codebook, lane);
    int blk = warp * G + grp;
    uint4 pb[D][K];  // D = 1: the block summed next; D = 4: the batch
    uint32_t ab[D];
#pragma unroll
    for (int d = 0; d < D; ++d) {
        ab[d] = 0;
        if (blk + d * kStride < nb) load(blk + d * kStride, pb[d], ab[d]);
    }
    sk_build_table<K>(tbl, cbl, W * 32);
    pdl_wait();

    // x into the slots as it is, its max on the way; then one scale for the CTA and the conversion.
    constexpr bool kHalf = std::is_same<T, half>::value;
    const uint4* x4 = reinterpret_cast<const uint4*>(x);
    auto slot = [&](int q) -> uint4* { return reinterpret_cast<uint4*>(tbl + staged_x_word(q >> 2)) + (q & 3); };
    float mx = 0.f;
    for (int q = tid; q < nb * 4; q += W * 32) {
        const uint4 v = __ldg(x4 + q);
        *slot(q) = v;
        mx = fmaxf(mx, kHalf ? h8_absmax(v) : bf16x8_absmax(v));
    }
    mx = warp_max(mx);
    if (lane == 0) xmax[warp] = mx;
    __syncthreads();
    mx = xmax[0];
#pragma unroll
    for (int w = 1; w < W; ++w) mx = fmaxf(mx, xmax[w]);
    float xscale, xinv;
    x_pow2_scale(mx, xscale, xinv);
    for (int q = tid; q < nb * 4; q += W * 32) {
        uint4* s = slot(q);
        *s = kHalf ? h8_scaled(*s, xscale) : bf16x8_to_scaled_h8(*s, xscale);
    }
    __syncthreads();  // the table and every x slot

    const uint32_t lane4 = static_cast<uint32_t>(lane) * 4u;
    const char* tblc = reinterpret_cast<const char*>(tbl);
    const int xoff[1] = {0};
    float acc[4][1] = {{0.f}, {0.f}, {0.f}, {0.f}};
    if constexpr (D == 1) {
        for (; blk < nb; blk += kStride) {
            uint4 pn[K];
            uint32_t an = 0;
            if (blk + kStride < nb) load(blk + kStride, pn, an);
            sk_unit<T, K, 1, false, true>(pb[0], ab[0], reinterpret_cast<const uint4*>(tbl + staged_x_word(blk)), xoff,
                                          tblc, lane4, acc);
#pragma unroll
            for (int b = 0; b < K; ++b) pb[0][b] = pn[b];
            ab[0] = an;
        }
    } else {
        for (int b0 = blk; b0 < nb; b0 += D * kStride) {
            if (b0 != blk) {  // later batches: requested once the previous one is summed
#pragma unroll
                for (int d = 0; d < D; ++d)
                    if (b0 + d * kStride < nb) load(b0 + d * kStride, pb[d], ab[d]);
            }
#pragma unroll
            for (int d = 0; d < D; ++d)
                if (b0 + d * kStride < nb)
                    sk_unit<T, K, 1, false, true>(
                        pb[d], ab[d], reinterpret_cast<const uint4*>(tbl + staged_x_word(b0 + d * kStride)), xoff,
                        tblc, lane4, acc);
        }
    }

    // The G groups' sums of each row (lanes LPG apart), then the W warps' in a fixed order.
#pragma unroll
    for (int off = LPG; off < 32; off <<= 1)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[r][0] += __shfl_xor_sync(0xffffffffu, acc[r][0], off);
    if (grp == 0)
        *reinterpret_cast<float4*>(&red[warp][4 * j]) = make_float4(acc[0][0], acc[1][0], acc[2][0], acc[3][0]);
    __syncthreads();
    if (tid < P) {
        float s = red[0][tid];
#pragma unroll
        for (int w = 1; w < W; ++w) s += red[w][tid];
        const int row = t * kTileN + (col - j) * 4 + tid;
        if (row < N) y[row] = from_float<T>(fmaf(s, xinv, bias != nullptr ? to_float(bias[row]) : 0.f));
    }
}

// Blocks a lane group requests together (the kernel's D): four at k = 3, 4 from 96 input blocks,
// where a slice's groups run 2-8 blocks each; one elsewhere, at three CTAs an SM (k = 2 and 2048-input
// layers lost 1-5% with four at two CTAs an SM). H200 session 42, bf16 behind a writer, µs D = 1 / 4,
// best slice: k=4 4096x2048 6.07 / 5.53, 5120x2048 6.98 / 6.28, 4096x4096 7.55 / 7.06, 8192x2048
// 8.25 / 7.42, 3072x5120 7.63 / 7.46, 14336x4096 18.0 / 16.2; k=3 4096x2048 5.58 / 4.93, 8192x1024
// 7.78 / 6.28, 4096x4096 7.69 / 6.95; k=4 2048x8192 (nb = 64) 6.41 / 6.72. Back to back the first
// batch streams under the call before: k=4 4096x2048 6.6 / 3.8.
constexpr int kRowsDeepMinBlocks = 96;
template <int K>
constexpr int rows_depth(int nb) {
    return K >= 3 && nb >= kRowsDeepMinBlocks ? 4 : 1;
}

namespace {

template <typename T>
using RowsKernel = void (*)(const T*, const uint4*, const uint32_t*, const float*, const T*, T*, int, int);

template <typename T, int K, int P>
RowsKernel<T> rows_kernel_p(int nb) {
    if constexpr (K >= 3) {  // D = 4 is built for k = 3, 4 only
        if (rows_depth<K>(nb) == 4) return gemv_rows_kernel<T, K, P, 4>;
    }
    return gemv_rows_kernel<T, K, P, 1>;
}

// The kernel of slice `rows` (8, 16, 32 or 64) and depth rows_depth<K>(nb) for k = K, or nullptr for a
// slice there is none of: both the launch and the occupancy query take it from here.
template <typename T>
RowsKernel<T> rows_kernel(int k, int nb, int rows) {
#define KBIT_ROWS_K(KK)                                            \
    if (k == KK) {                                                 \
        switch (rows) {                                            \
            case 8: return rows_kernel_p<T, KK, 8>(nb);            \
            case 16: return rows_kernel_p<T, KK, 16>(nb);          \
            case 32: return rows_kernel_p<T, KK, 32>(nb);          \
            case 64: return rows_kernel_p<T, KK, 64>(nb);          \
            default: return nullptr;                               \
        }                                                          \
    }
    KBIT_ROWS_K(2) KBIT_ROWS_K(3) KBIT_ROWS_K(4)
#undef KBIT_ROWS_K
    return nullptr;
}

// Dynamic shared memory of the row-slice GEMV at k bits (its table and x slots: SkCfg's).
int rows_smem(int k) { return sk_shape(k).smem; }

}  // namespace

// Resident CTAs per SM of the kernel launch_gemv_rows runs for (k, nb, rows): three at D = 1, two
// where rows_depth gives D = 4, as the device reports them; 0 for a k, nb or slice it does not take.
// The host sizes its slices with it, so no copy of rows_depth's rule lives outside this file.
template <typename T>
int gemv_rows_ctas_per_sm(int k, int nb, int rows) {
    if (nb <= 0 || nb > kStagedXSlots) return 0;
    const RowsKernel<T> kern = rows_kernel<T>(k, nb, rows);
    if (kern == nullptr) return 0;
    return resident_ctas(reinterpret_cast<const void*>(kern), kRowsWarps * 32, rows_smem(k));
}
template int gemv_rows_ctas_per_sm<half>(int, int, int);
template int gemv_rows_ctas_per_sm<__nv_bfloat16>(int, int, int);

// One x row (M = 1) through CTAs of `rows` (8, 16, 32 or 64) output rows each, ceil(N / rows) of them;
// k = 2..4, nb <= kStagedXSlots (x staged whole). No workspace.
template <typename T>
int launch_gemv_rows(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int k,
                     int M, int N, int nb, void* y, int rows, cudaStream_t s) {
    if (M == 0 || N <= 0) return 0;
    if (M != 1 || nb <= 0 || nb > kStagedXSlots) return static_cast<int>(cudaErrorInvalidValue);
    const RowsKernel<T> kern = rows_kernel<T>(k, nb, rows);
    if (kern == nullptr) return static_cast<int>(cudaErrorInvalidValue);
    const int smem = rows_smem(k);
    const cudaError_t attr = cudaFuncSetAttribute(reinterpret_cast<const void*>(kern),
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (attr != cudaSuccess) return static_cast<int>(attr);
    return pdl_launch(kern, dim3((N + rows - 1) / rows), dim3(kRowsWarps * 32), static_cast<size_t>(smem), s,
                      static_cast<const T*>(x), static_cast<const uint4*>(pt), reinterpret_cast<const uint32_t*>(at),
                      cb, static_cast<const T*>(bias), static_cast<T*>(y), N, nb);
}

template int launch_gemv_rows<half>(const void*, const void*, const uint8_t*, const float*, const void*, int, int,
                                    int, int, void*, int, cudaStream_t);
template int launch_gemv_rows<__nv_bfloat16>(const void*, const void*, const uint8_t*, const float*, const void*, int,
                                             int, int, int, void*, int, cudaStream_t);

}  // namespace kbit
