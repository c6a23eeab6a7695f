// kbit grouped GEMV (MoE, few rows per expert): for every expert e and each of its rows r,
// y[r, :] = x[r, :] @ W_e^T, all experts in one launch, reading the stacked tiled layout
// packed_tiled [E, n_tiles, nb, k, 128] / absmax_tiled [E, n_tiles, nb, 128].
//
// Grid: x = CTAs over one expert's 32-row output groups (rgpc groups per CTA); y = expert slot:
// slot s serves the s-th expert that has rows (moe::find_item over the device offsets). The
// host sizes y as min(experts, rows); slots past the last non-empty expert exit at once. When that
// is every expert (rows >= experts), slot s is expert s, which no earlier kernel decides, so its
// weights are requested before pdl_wait: back to back a CTA starts only as the previous call's CTA
// on its SM leaves, and its weights' DRAM trip then runs beside the wait for that call's last CTA
// (H200 session 45, seed8 k=4 fp16 µs: gate T=1 4.41 -> 3.91, down T=1 4.06 -> 3.70, T=2 / T=4
// 9-12% too).
// As in the dense GEMV (kbit_gemv.cu) a warp owns 32 output rows (lane = row: one plane of 32
// rows is 128 contiguous bytes) and a share of K: the wk warps of a row group take turns over
// groups of kGU blocks. A warp keeps its next group's words in flight while it decodes the
// current one (register double buffer), and requests its first group (and the next step's) before
// x is staged, so the weight stream starts as soon as the offsets are read, or before pdl_wait
// where slot s is expert s; the host spreads K over as many warps as 16 an SM allow, down to one
// group each (ops.grouped_gemv_config). Launched with PDL (pdl.cuh): the decode table, built
// from the codebook alone, overlaps the previous kernel's tail;
// the offsets, x and y come after pdl_wait. H200 session 44, fp16 x back to back, k=4 T=1 µs before
// / after these three: seed8 gate 6.1 -> 4.4, down 6.4 -> 4.1, qwen128 gate 7.9 -> 6.0, down 7.9 -> 5.9.
// An expert's rows are taken in passes of MP rows (MP = 1, 2 or 4, picked per CTA from its row
// count; a later pass re-reads the weights, mostly from L2). All MP paths share one register
// allocation, so larger passes would slow the common 1-row path.
// Decode: k = 2..4 through the shared pair table (kbit_lut.cuh); k = 5 through the lane
// codebook shuffle (kbit_tile.cuh). half2 FMAs flushed to fp32 once per block (times the block
// scale). Each warp stages only the x of its own blocks (WarpX: one uint4 a lane, the next step's
// requested into registers while the current one is decoded) in shared memory in (group, pair)
// order as fp16, behind __syncwarp: the only CTA barriers are the table's (before pdl_wait) and
// the pass's reduction. bf16 x is staged as fp16 times a power of two per row and warp step
// (bf16_scaled.cuh), whose inverse joins the block scale. H200 session 46, fp16 back to back, k=4
// µs, CTA-wide chunks / per warp: seed8 gate T=1 3.94 -> 3.73, T=2 4.69 -> 4.41; down T=1 3.68 ->
// 3.47; qwen128 gate T=1 5.92 -> 5.56, T=2 10.2 -> 9.6.
// The wk warps' partial sums are added in a fixed order (deterministic; no atomics).
#include "bf16_scaled.cuh"
#include "kbit_lut.cuh"
#include "moe_common.cuh"
#include "pdl.cuh"

#include <type_traits>

namespace kbit {

namespace {

constexpr int kGU = 4;                // blocks per load group of a warp
constexpr int kGMaxRows = 4;          // largest rows per pass (8 would cost the 1-row path registers)
// Most threads per CTA: 16 warps, all of one row group's K when a layer's row groups fill the
// SMs once (one CTA an SM, the same 128 registers a thread as two CTAs of 8 warps). H200 session
// 44, seed8 gate k=4 fp16 back to back, 8 / 16 warps along K: T=1 5.3 / 4.4 us, T=4 8.8 / 6.4.
constexpr int kGThreads = 512;
constexpr int kGMaxWK = kGThreads / 32;  // warps of a row group along K at most
constexpr int kGXWords = kGMaxRows * kGU * 16;  // staged x words a warp: 16 half2 pairs a row and block

struct GemvWarp {
    const uint32_t* P;  // plane words of this lane's row at block 0; block j plane b at P[(j * K + b) * 128]
    const uint8_t* A;   // absmax of this lane's row at block 0; block j at A[j * 128]
    int row;            // output row (feature) of this lane
    int wk;             // this warp's index along K
    int WK;             // warps along K per row group
    int rgl;            // row group within the CTA
    bool active;        // the row group exists
};

template <int K>
__device__ __forceinline__ void load_group(const GemvWarp& w, int nb, int j0, uint32_t (&p)[kGU][K],
                                           uint8_t (&a)[kGU]) {
#pragma unroll
    for (int u = 0; u < kGU; ++u) {
        const bool ok = w.active && j0 + u < nb;
        const size_t j = static_cast<size_t>(ok ? j0 + u : 0);
#pragma unroll
        for (int b = 0; b < K; ++b) p[u][b] = ok ? __ldg(w.P + (j * K + b) * kTileN) : 0u;
        a[u] = ok ? __ldg(w.A + j * kTileN) : static_cast<uint8_t>(0);
    }
}

// Unscaled weights of the 4 pairs of group g of one block (pair i = elements 8i+2g, 8i+2g+1).
template <int K>
__device__ __forceinline__ void pairs_half(const uint32_t (&p)[K], int g, float cbl, const char* tblc,
                                           uint32_t lane4, half2 (&w)[4]) {
    if constexpr (K <= 4) {
        const uint32_t gw = group_word<K>(p, g);
        w[0] = *reinterpret_cast<const half2*>(tblc + lut_off<0>(gw, lane4));
        w[1] = *reinterpret_cast<const half2*>(tblc + lut_off<1>(gw, lane4));
        w[2] = *reinterpret_cast<const half2*>(tblc + lut_off<2>(gw, lane4));
        w[3] = *reinterpret_cast<const half2*>(tblc + lut_off<3>(gw, lane4));
    } else {
        float v[8];
        decode_group<K>(p, g, cbl, v);
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
    }
}

// This warp's x for one step: MP rows x its kGU blocks, 16 uint4 (8-element runs) a row, at most
// two a lane (lane + 32 v -> row m = idx / 16, block u = idx / 4 % 4, run i = idx % 4), raw.
template <typename T, int MP>
struct WarpX {
    static_assert(kGU == 4 && MP <= 4, "the lane mapping packs 4 blocks x 4 runs a row, 2 rows a 32-lane load");
    static constexpr int kV = MP == 4 ? 2 : 1;
    uint4 v[kV];

    __device__ __forceinline__ void load(const T* __restrict__ x, const GemvWarp& w, int in_f, int nb, int j0, int m0,
                                         int mr) {
        const int lane = threadIdx.x & 31;
#pragma unroll
        for (int q = 0; q < kV; ++q) {
            const int idx = lane + 32 * q, m = idx >> 4, j = j0 + ((idx >> 2) & 3);
            const bool ok = w.active && idx < 16 * MP && m < mr && j < nb;
            v[q] = ok ? __ldg(reinterpret_cast<const uint4*>(x + static_cast<size_t>(m0 + m) * in_f) + j * 4 +
                              (idx & 3))
                      : make_uint4(0u, 0u, 0u, 0u);
        }
    }

    // Into the warp's staging words in (block, group, pair) order: pair g of run i of block u at
    // word 16 u + 4 g + i of the row (so a group is one uint4). bf16 x as fp16 times a power of two
    // per row (bf16_scaled.cuh); xinv gets each row's inverse. The caller fences with __syncwarp.
    __device__ __forceinline__ void store(uint32_t* xw, float (&xinv)[MP]) const {
        constexpr bool kBf16 = std::is_same<T, __nv_bfloat16>::value;
        const int lane = threadIdx.x & 31;
#pragma unroll
        for (int q = 0; q < kV; ++q) {
            const int idx = lane + 32 * q, m = idx >> 4;
            uint4 u = v[q];
            if constexpr (kBf16) {
                // Row max |x| over its 16 lanes, as bits (a NaN wins: scale 1, as in bf16x8_absmax's callers).
                unsigned mx = __float_as_uint(bf16x8_absmax(u));
#pragma unroll
                for (int o = 1; o < 16; o <<= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
                float sc, inv;
                x_pow2_scale(__uint_as_float(mx), sc, inv);
                u = bf16x8_to_scaled_h8(u, sc);
#pragma unroll
                for (int h = 0; h < 2; ++h) {  // rows 2q and 2q + 1: lanes 0 and 16
                    const float r = __shfl_sync(0xffffffffu, inv, 16 * h);
                    if (2 * q + h < MP) xinv[2 * q + h] = r;
                }
            }
            if (idx < 16 * MP) {
                uint32_t* d = xw + (idx >> 2) * 16 + (idx & 3);
                d[0] = u.x, d[4] = u.y, d[8] = u.z, d[12] = u.w;
            }
        }
    }
};

// All rows [row0, row1) of one expert for this CTA's row groups, in passes of MP rows. The caller
// has requested the warp's first load group into pc / ac, and, when pn_loaded, the group the first
// step prefetches into pn / an. Each warp stages the x of its own blocks (xw, 16 MP uint4), one step
// ahead in registers: no CTA barrier until the pass's sums meet.
template <typename T, int K, int MP>
__device__ __forceinline__ void gemv_expert(const T* __restrict__ x, float cbl, T* __restrict__ y, const GemvWarp& w,
                                            int row0, int row1, int N, int nb, const uint32_t* tbl, uint32_t* xw,
                                            float* red, uint32_t (&pc)[kGU][K], uint8_t (&ac)[kGU],
                                            uint32_t (&pn)[kGU][K], uint8_t (&an)[kGU], bool pn_loaded) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sb = w.WK * kGU;  // blocks per step (all warps of a row group)
    const int steps = (nb + sb - 1) / sb;
    const int in_f = nb * 32;
    const uint32_t lane4 = static_cast<uint32_t>(lane) * 4u;
    const char* tblc = reinterpret_cast<const char*>(tbl);
    const uint4* xv4 = reinterpret_cast<const uint4*>(xw);

    const int total = (row1 - row0 + MP - 1) / MP * steps;
    float acc[MP];
#pragma unroll
    for (int m = 0; m < MP; ++m) acc[m] = 0.f;
    float xinv[MP];  // bf16: the staged step's inverse row scales (fp16 x: 1)
#pragma unroll
    for (int m = 0; m < MP; ++m) xinv[m] = 1.f;
    WarpX<T, MP> xn;
    xn.load(x, w, in_f, nb, w.wk * kGU, row0, min(MP, row1 - row0));
    xn.store(xw, xinv);
    __syncwarp();
    int t = 0, m0 = row0;
    for (int s = 0; s < total; ++s) {
        const int mr = min(MP, row1 - m0);
        const bool last_t = t + 1 == steps;
        const int tn = last_t ? 0 : t + 1, mn = last_t ? m0 + MP : m0;  // the next step
        if (s + 1 < total) {
            if (!(s == 0 && pn_loaded)) load_group<K>(w, nb, tn * sb + w.wk * kGU, pn, an);
            xn.load(x, w, in_f, nb, tn * sb + w.wk * kGU, mn, min(MP, row1 - mn));
        }
        const int jb = t * sb + w.wk * kGU;
        if (w.active) {  // warp-uniform
#pragma unroll
            for (int u = 0; u < kGU; ++u) {
                if (jb + u >= nb) break;  // warp-uniform
                const float sc = decode_e4m4(ac[u]);
                half2 hp[MP][2];
#pragma unroll
                for (int m = 0; m < MP; ++m) hp[m][0] = hp[m][1] = __float2half2_rn(0.f);
#pragma unroll
                for (int g = 0; g < 4; ++g) {
                    half2 wv[4];
                    pairs_half<K>(pc[u], g, cbl, tblc, lane4, wv);
#pragma unroll
                    for (int m = 0; m < MP; ++m) hp[m][g & 1] = hfma2_x4(wv, xv4[(m * kGU + u) * 4 + g], hp[m][g & 1]);
                }
#pragma unroll
                for (int m = 0; m < MP; ++m) {
                    const float2 f0 = __half22float2(hp[m][0]), f1 = __half22float2(hp[m][1]);
                    acc[m] = fmaf((f0.x + f0.y) + (f1.x + f1.y), sc * xinv[m], acc[m]);
                }
            }
        }
        if (last_t) {
            // End of a pass: the WK partials of each row go through shared memory, summed in a fixed order.
            if (m0 != row0) __syncthreads();  // the previous pass's sums are read
#pragma unroll
            for (int m = 0; m < MP; ++m) {
                red[(warp * MP + m) * 32 + lane] = acc[m];
                acc[m] = 0.f;
            }
            __syncthreads();
            // Rows of a multi-row pass are summed by the row group's warps side by side (row m by
            // warp m mod WK), all WK partials requested before the first add, in the same order;
            // the first warp's loop over every row, one dependent shared load after the other, kept
            // the pass ~0.15 µs a row longer (H200 session 47, seed8 k=4 fp16 back to back, gate
            // T=4 5.76 -> 5.27 µs, T=2 4.37 -> 4.18). One-row passes keep that loop: the unrolled
            // form ran them 0-5% slower.
            if constexpr (MP == 1) {
                if (w.wk == 0 && w.active && w.row < N) {
                    float sum = 0.f;
                    for (int v = 0; v < w.WK; ++v) sum += red[(w.rgl * w.WK + v) * 32 + lane];
                    y[static_cast<size_t>(m0) * N + w.row] = from_float<T>(sum);
                }
            } else if (w.active && w.row < N) {
                for (int m = w.wk; m < mr; m += w.WK) {  // warp-uniform
                    const float* rp = red + (w.rgl * w.WK * MP + m) * 32 + lane;  // warp v's at rp[v * MP * 32]
                    float part[kGMaxWK];
#pragma unroll
                    for (int v = 0; v < kGMaxWK; ++v) part[v] = v < w.WK ? rp[v * MP * 32] : 0.f;
                    float sum = 0.f;
#pragma unroll
                    for (int v = 0; v < kGMaxWK; ++v)
                        if (v < w.WK) sum += part[v];
                    y[static_cast<size_t>(m0 + m) * N + w.row] = from_float<T>(sum);
                }
            }
        }
        t = tn, m0 = mn;
        if (s + 1 < total) {
            __syncwarp();  // this step's x is read
            xn.store(xw, xinv);
            __syncwarp();
        }
#pragma unroll
        for (int u = 0; u < kGU; ++u) {
#pragma unroll
            for (int b = 0; b < K; ++b) pc[u][b] = pn[u][b];
            ac[u] = an[u];
        }
    }
}

template <typename T, int K>
__global__ void __launch_bounds__(kGThreads, 1) grouped_gemv_kernel(
    const T* __restrict__ x, const uint32_t* __restrict__ packed_t, const uint8_t* __restrict__ absmax_t,
    const float* __restrict__ codebook, const int* __restrict__ offs, T* __restrict__ y, int n_exp, int rows, int N,
    int nb, int rgpc) {
    extern __shared__ uint4 smem_ggemv[];
    uint32_t* tbl = reinterpret_cast<uint32_t*>(smem_ggemv);
    pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_tiles = (N + kTileN - 1) / kTileN;
    GemvWarp w;
    w.WK = (blockDim.x >> 5) / rgpc;
    w.rgl = warp / w.WK;
    w.wk = warp - w.rgl * w.WK;
    const int rg = static_cast<int>(blockIdx.x) * rgpc + w.rgl;
    w.active = rg < 4 * n_tiles;
    w.row = rg * 32 + lane;
    const int col = (rg & 3) * 32 + lane;
    auto at_expert = [&](int e) {
        const size_t tile = static_cast<size_t>(e) * n_tiles + (w.active ? rg >> 2 : 0);
        w.P = packed_t + tile * nb * K * kTileN + col;
        w.A = absmax_t + tile * nb * kTileN + col;
    };
    uint32_t pc[kGU][K], pn[kGU][K];
    uint8_t ac[kGU], an[kGU];
    // One slot per expert (the host's slots = min(experts, rows) reached the expert count): slot =
    // expert, known before pdl_wait, so the weights (which no kernel writes) are requested before
    // the table is built; an expert without rows exits after the offsets.
    // Otherwise slot s is the s-th expert with rows, found from the offsets.
    const bool direct = static_cast<int>(gridDim.y) == n_exp;
    const bool pn_loaded = direct && nb > w.WK * kGU;  // a second step: its group is the first prefetch
    if (direct) {
        at_expert(static_cast<int>(blockIdx.y));
        load_group<K>(w, nb, w.wk * kGU, pc, ac);
        if (pn_loaded) load_group<K>(w, nb, w.WK * kGU + w.wk * kGU, pn, an);
    }
    // The decode table (or k = 5's lane codebook) depends on no earlier kernel: built before
    // pdl_wait, so it overlaps the previous kernel's tail.
    float cbl = 0.f;
    if constexpr (K <= 4) {
        build_pair_lut<K, half>(tbl, codebook, threadIdx.x, blockDim.x);
    } else {
        cbl = lane_codebook<K>(codebook, lane);
    }
    __syncthreads();  // the table is built
    pdl_wait();
    moe::Item it;
    if (direct) {
        if (!moe::expert_rows(offs, static_cast<int>(blockIdx.y), rows, it)) return;
    } else {
        if (!moe::find_item(offs, n_exp, rows, 0, static_cast<int>(blockIdx.y), it)) return;
        at_expert(it.expert);
        load_group<K>(w, nb, w.wk * kGU, pc, ac);  // first group in flight before x
    }
    uint32_t* xs = tbl + (K <= 4 ? kLutWords : 0);  // kGXWords a warp
    uint32_t* xw = xs + warp * kGXWords;
    float* red = reinterpret_cast<float*>(xs + (blockDim.x >> 5) * kGXWords);
    const int n = it.row1 - it.row0;  // CTA-uniform
    if (n == 1) {
        gemv_expert<T, K, 1>(x, cbl, y, w, it.row0, it.row1, N, nb, tbl, xw, red, pc, ac, pn, an, pn_loaded);
    } else if (n == 2) {
        gemv_expert<T, K, 2>(x, cbl, y, w, it.row0, it.row1, N, nb, tbl, xw, red, pc, ac, pn, an, pn_loaded);
    } else {
        gemv_expert<T, K, kGMaxRows>(x, cbl, y, w, it.row0, it.row1, N, nb, tbl, xw, red, pc, ac, pn, an, pn_loaded);
    }
}

template <typename T, int K>
int launch_grouped_gemv_k(const void* x, const void* pt, const uint8_t* at, const float* cb, const int* offs, void* y,
                          int n_exp, int rows, int N, int nb, int slots, int rgpc, int wk, cudaStream_t stream) {
    const int threads = rgpc * wk * 32;
    const size_t smem = static_cast<size_t>(K <= 4 ? kLutWords * 4 : 0) +
                        static_cast<size_t>(threads / 32) * kGXWords * sizeof(uint32_t) +
                        static_cast<size_t>(threads / 32) * kGMaxRows * 32 * sizeof(float);
    auto kern = grouped_gemv_kernel<T, K>;
    if (smem > 48 * 1024) {
        const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(smem));
        if (e != cudaSuccess) return static_cast<int>(e);
    }
    const int n_rg = 4 * ((N + kTileN - 1) / kTileN);
    const dim3 grid(static_cast<unsigned>((n_rg + rgpc - 1) / rgpc), static_cast<unsigned>(slots));
    return pdl_launch(kern, grid, dim3(threads), smem, stream, static_cast<const T*>(x),
                      static_cast<const uint32_t*>(pt), at, cb, offs, static_cast<T*>(y), n_exp, rows, N, nb, rgpc);
}

}  // namespace

// slots: grid rows = min(experts, rows) (one per possible non-empty expert); rgpc: 32-row groups
// per CTA; wk: warps per row group along K (rgpc * wk <= 16). offs: int32 [n_exp + 1] on the device.
template <typename T>
int launch_grouped_gemv(const void* x, const void* pt, const uint8_t* at, const float* cb, const int* offs, void* y,
                        int k, int n_exp, int rows, int N, int nb, int slots, int rgpc, int wk, cudaStream_t s) {
    if (rows <= 0 || N <= 0) return 0;
    if (nb <= 0 || n_exp <= 0 || slots < 1 || slots > 65535 || rgpc < 1 || wk < 1 || rgpc * wk * 32 > kGThreads)
        return static_cast<int>(cudaErrorInvalidValue);
    switch (k) {
        case 2: return launch_grouped_gemv_k<T, 2>(x, pt, at, cb, offs, y, n_exp, rows, N, nb, slots, rgpc, wk, s);
        case 3: return launch_grouped_gemv_k<T, 3>(x, pt, at, cb, offs, y, n_exp, rows, N, nb, slots, rgpc, wk, s);
        case 4: return launch_grouped_gemv_k<T, 4>(x, pt, at, cb, offs, y, n_exp, rows, N, nb, slots, rgpc, wk, s);
        case 5: return launch_grouped_gemv_k<T, 5>(x, pt, at, cb, offs, y, n_exp, rows, N, nb, slots, rgpc, wk, s);
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
}

template int launch_grouped_gemv<half>(const void*, const void*, const uint8_t*, const float*, const int*, void*, int,
                                       int, int, int, int, int, int, int, cudaStream_t);
template int launch_grouped_gemv<__nv_bfloat16>(const void*, const void*, const uint8_t*, const float*, const int*,
                                                void*, int, int, int, int, int, int, int, int, cudaStream_t);

}  // namespace kbit
