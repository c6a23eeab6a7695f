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
// scale). x is staged in shared memory in (group, pair) order as fp16; bf16 x as fp16 times a
// power of two per row and staged chunk (bf16_scaled.cuh), whose inverse joins the block scale.
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
constexpr int kGXBudget = 16 * 1024;  // bytes of staged x, at least

constexpr int kGXBlockBytes = 64;     // staged x per row and block: 16 half2 pairs

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

// All rows [row0, row1) of one expert for this CTA's row groups, in passes of MP rows. The caller
// has requested the warp's first load group into pc / ac, and, when pn_loaded, the group the first
// step prefetches into pn / an.
template <typename T, int K, int MP>
__device__ __forceinline__ void gemv_expert(const T* __restrict__ x, float cbl, T* __restrict__ y, const GemvWarp& w,
                                            int row0, int row1, int N, int nb, uint32_t* tbl, char* xs, int xbytes,
                                            float* red, unsigned (&xmax)[2][kGMaxRows], uint32_t (&pc)[kGU][K],
                                            uint8_t (&ac)[kGU], uint32_t (&pn)[kGU][K], uint8_t (&an)[kGU],
                                            bool pn_loaded) {
    constexpr bool kBf16 = std::is_same<T, __nv_bfloat16>::value;
    constexpr int XB = kGXBlockBytes;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sb = w.WK * kGU;                      // blocks per step (all warps of a row group)
    const int steps = (nb + sb - 1) / sb;
    const int q = max(1, xbytes / (MP * XB * sb));  // steps per staged x chunk
    const int CH = q * sb;                          // blocks per staged x chunk
    const int in_f = nb * 32;
    const uint32_t lane4 = static_cast<uint32_t>(lane) * 4u;
    const char* tblc = reinterpret_cast<const char*>(tbl);

    const int total = (row1 - row0 + MP - 1) / MP * steps;
    float acc[MP];
#pragma unroll
    for (int m = 0; m < MP; ++m) acc[m] = 0.f;
    float xinv[MP];  // bf16: the staged chunk's inverse row scales (fp16 x: 1)
#pragma unroll
    for (int m = 0; m < MP; ++m) xinv[m] = 1.f;
    int t = 0, m0 = row0, chunk = 0;
    for (int s = 0; s < total; ++s) {
        const int mr = min(MP, row1 - m0);
        const int c0 = (t - t % q) * sb;  // first block of the staged chunk
        if (s + 1 < total && !(s == 0 && pn_loaded))
            load_group<K>(w, nb, (t + 1 == steps ? 0 : (t + 1) * sb) + w.wk * kGU, pn, an);
        if (t % q == 0) {
            __syncthreads();  // table built; the previous chunk's x (and its xmax half) no longer read
            const int cn = min(CH, nb - c0);
            const int par = chunk++ & 1;  // xmax half of this chunk; the other is zeroed for the next
            // (x[8i+2g], x[8i+2g+1]) of 8-element run r (block r / 4, i = r % 4) at word 4g + i.
            auto words = [&](int i, int& m, uint32_t*& dst) {
                m = i / (cn * 4);
                const int r = i - m * (cn * 4);
                dst = reinterpret_cast<uint32_t*>(xs) + (m * CH + (r >> 2)) * 16 + (r & 3);
                return r;
            };
            for (int i = threadIdx.x; i < MP * cn * 4; i += blockDim.x) {
                int m;
                uint32_t* dst;
                const int r = words(i, m, dst);
                uint4 v = make_uint4(0u, 0u, 0u, 0u);
                if (m < mr)
                    v = __ldg(reinterpret_cast<const uint4*>(x + static_cast<size_t>(m0 + m) * in_f +
                                                             static_cast<size_t>(c0) * 32 + r * 8));
                dst[0] = v.x, dst[4] = v.y, dst[8] = v.z, dst[12] = v.w;
                if constexpr (kBf16)  // >= 0: the float bits order as the values
                    atomicMax(&xmax[par][m], __float_as_uint(bf16x8_absmax(v)));
            }
            __syncthreads();
            if constexpr (kBf16) {  // each thread scales the words it staged
                if (threadIdx.x < kGMaxRows) xmax[par ^ 1][threadIdx.x] = 0u;
                float xsc[MP];
#pragma unroll
                for (int m = 0; m < MP; ++m) x_pow2_scale(__uint_as_float(xmax[par][m]), xsc[m], xinv[m]);
                for (int i = threadIdx.x; i < MP * cn * 4; i += blockDim.x) {
                    int m;
                    uint32_t* dst;
                    words(i, m, dst);
                    float sc = xsc[0];
#pragma unroll
                    for (int mm = 1; mm < MP; ++mm) sc = m == mm ? xsc[mm] : sc;
#pragma unroll
                    for (int g = 0; g < 4; ++g) dst[4 * g] = bf16x2_to_scaled_h2(dst[4 * g], sc);
                }
                __syncthreads();
            }
        }
        const int jb = t * sb + w.wk * kGU;
        if (w.active) {  // warp-uniform
#pragma unroll
            for (int u = 0; u < kGU; ++u) {
                const int jl = jb + u - c0;
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
                    for (int m = 0; m < MP; ++m) {
                        const uint4 xv = reinterpret_cast<const uint4*>(xs)[(m * CH + jl) * 4 + g];
                        hp[m][g & 1] = hfma2_x4(wv, xv, hp[m][g & 1]);
                    }
                }
#pragma unroll
                for (int m = 0; m < MP; ++m) {
                    const float2 f0 = __half22float2(hp[m][0]), f1 = __half22float2(hp[m][1]);
                    acc[m] = fmaf((f0.x + f0.y) + (f1.x + f1.y), sc * xinv[m], acc[m]);
                }
            }
        }
        if (t == steps - 1) {
            // End of a pass: the WK partials of each row go through shared memory, summed in a fixed order.
#pragma unroll
            for (int m = 0; m < MP; ++m) {
                red[(warp * MP + m) * 32 + lane] = acc[m];
                acc[m] = 0.f;
            }
            __syncthreads();
            if (w.wk == 0 && w.active && w.row < N) {
#pragma unroll
                for (int m = 0; m < MP; ++m) {
                    if (m < mr) {
                        float sum = 0.f;
                        for (int v = 0; v < w.WK; ++v) sum += red[((w.rgl * w.WK + v) * MP + m) * 32 + lane];
                        y[static_cast<size_t>(m0 + m) * N + w.row] = from_float<T>(sum);
                    }
                }
            }
            // red is next written at the end of the next pass, after its first staging barrier.
            t = 0;
            m0 += MP;
        } else {
            ++t;
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
    int nb, int rgpc, int xbytes) {
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
    // pdl_wait, so it overlaps the previous kernel's tail; the loop's first barrier publishes it.
    float cbl = 0.f;
    if constexpr (K <= 4) {
        build_pair_lut<K, half>(tbl, codebook, threadIdx.x, blockDim.x);
    } else {
        cbl = lane_codebook<K>(codebook, lane);
    }
    pdl_wait();
    moe::Item it;
    if (direct) {
        if (!moe::expert_rows(offs, static_cast<int>(blockIdx.y), rows, it)) return;
    } else {
        if (!moe::find_item(offs, n_exp, rows, 0, static_cast<int>(blockIdx.y), it)) return;
        at_expert(it.expert);
        load_group<K>(w, nb, w.wk * kGU, pc, ac);  // first group in flight before x
    }
    char* xs = reinterpret_cast<char*>(tbl + (K <= 4 ? kLutWords : 0));
    float* red = reinterpret_cast<float*>(xs + xbytes);
    __shared__ unsigned xmax[2][kGMaxRows];  // bf16: max |x| bits per staged row, two chunks in turn
    if (threadIdx.x < 2 * kGMaxRows) xmax[threadIdx.x / kGMaxRows][threadIdx.x % kGMaxRows] = 0u;
    const int n = it.row1 - it.row0;  // CTA-uniform
    if (n == 1) {
        gemv_expert<T, K, 1>(x, cbl, y, w, it.row0, it.row1, N, nb, tbl, xs, xbytes, red, xmax, pc, ac, pn,
                             an, pn_loaded);
    } else if (n == 2) {
        gemv_expert<T, K, 2>(x, cbl, y, w, it.row0, it.row1, N, nb, tbl, xs, xbytes, red, xmax, pc, ac, pn,
                             an, pn_loaded);
    } else {
        gemv_expert<T, K, kGMaxRows>(x, cbl, y, w, it.row0, it.row1, N, nb, tbl, xs, xbytes, red, xmax, pc, ac, pn,
                                     an, pn_loaded);
    }
}

template <typename T, int K>
int launch_grouped_gemv_k(const void* x, const void* pt, const uint8_t* at, const float* cb, const int* offs, void* y,
                          int n_exp, int rows, int N, int nb, int slots, int rgpc, int wk, cudaStream_t stream) {
    const int threads = rgpc * wk * 32;
    const int xbytes = max(kGXBudget, wk * kGU * kGMaxRows * kGXBlockBytes);
    const size_t smem = static_cast<size_t>(K <= 4 ? kLutWords * 4 : 0) + static_cast<size_t>(xbytes) +
                        static_cast<size_t>(threads / 32) * kGMaxRows * 32 * sizeof(float);
    auto kern = grouped_gemv_kernel<T, K>;
    if (smem > 48 * 1024) {
        const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(smem));
        if (e != cudaSuccess) return static_cast<int>(e);
    }
    const int n_rg = 4 * ((N + kTileN - 1) / kTileN);
    const dim3 grid(static_cast<unsigned>((n_rg + rgpc - 1) / rgpc), static_cast<unsigned>(slots));
    cudaLaunchAttribute attrs[1];
    const cudaLaunchConfig_t cfg = pdl_config(grid, dim3(threads), smem, stream, attrs);
    const cudaError_t e = cudaLaunchKernelEx(&cfg, kern, static_cast<const T*>(x), static_cast<const uint32_t*>(pt), at,
                                             cb, offs, static_cast<T*>(y), n_exp, rows, N, nb, rgpc, xbytes);
    if (e != cudaSuccess) return static_cast<int>(e);
    KBIT_RETURN_LAUNCH_STATUS();
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
