// kbit tensor-core GEMV for M = 1..8 rows of x, k = 2..5 (Hopper, sm_90a): y[m, o] = sum_i x[m, i]
// W[o, i] (+ bias), reading the tiled layout (kbit_tile.cuh: packed_tiled [n_tiles, nb, k, 128],
// absmax_tiled [n_tiles, nb, 128]) as is.
//
// Why: the CUDA-core GEMV (kbit_gemv_sk.cu) pays a half2 FMA per weight pair and x row on top of
// the pair-table decode, so its cost grows with M (M=8 and 16 ran on the MMA kernel at ~1.6x
// cuBLAS), and the MMA / wgmma kernels stage x and synchronize whole CTAs per stage. Here the
// decoded pairs go to mma.sync as the A operand (weights = rows), up to 8 x rows are B's columns,
// so M=8 costs little more than M=1, and no x staging or block barrier is needed after the tables
// are built. (A second n8 tile for M <= 16 needed 168 registers, 12 warps per SM, and lost to the
// MMA kernel at M=16: H200 4096x28672 k=4 42.6 vs 37.6 µs.)
//
// Work unit = (layout tile of 128 features, one 32-input block): the layout stores units in
// (tile, block) order, K planes of 128 words each, so a warp's range of units is one contiguous
// run of words (and of absmax bytes). Units are split into equal contiguous ranges, one per warp of
// a one-wave grid (stream-K, no wave tail). Each warp runs its own ring of kStages slots (a unit's
// planes and absmax bytes, two bulk copies) on its own mbarriers.
//
// Fragments (mma.sync.m16n8k16): lane (r = lane / 4, g = lane % 4) owns features 32j + 4r + e (j,
// e = 0..3; one uint4 per plane and j, conflict-free) in the layout's group g, whose pair I is
// exactly A register a0 / a2 (I = 2kk / 2kk + 1) of k16 half kk for the lane's row. m16 tile
// i = 2j + jj takes feature e = 2jj as row r and e = 2jj + 1 as row r + 8. A pair comes from the
// wide pair table (one byte permute, one shared load) unscaled: as a unit is one block, the mma
// sums the block's products in fp32 and the feature's scale multiplies that sum (one FMA per
// output and x row), not every weight pair. x row n is B's column n, read from global memory (L1 /
// L2) one unit ahead. k = 5 looks its 10-bit pair codes up in the 32 KB table of kbit_lut5.cuh
// (8 lane copies per code), which also leaves room for the warps' rings of 5-plane units.
//
// At the end of its segment of a tile a warp stores the tile (whole) or adds it into a zeroed fp32
// accumulator in L2; the last warp to arrive (per-tile counter) stores y (+ bias) and leaves
// accumulator and counter zero (stream_k.cuh). The addition order varies from run to run:
// deterministic mode runs other kernels (backends/cuda/ops.py).
#include "kbit_lut5.cuh"
#include "kbit_mma_frag.cuh"
#include "kbit_sk.cuh"
#include "pdl.cuh"
#include "wgmma_ptx.cuh"

namespace kbit {

namespace {

constexpr int kTcWarps = 16;  // one CTA per SM: the 64 KB wide table is built once per SM
constexpr int kTcThreads = kTcWarps * 32;
// Ring slots per warp: one unit in flight while one is summed. H200 session 39, bf16 behind a
// writer, µs with 4 / 2 slots: k=4 M=1 4096x28672 29.4 / 27.2, 14336x4096 18.6 / 16.7, 4096x6144
// 11.5 / 9.9; M=4 31.7 / 29.6, 20.2 / 18.1, 14.1 / 12.4; M=8 34.9 / 32.8, 24.3 / 20.7, 16.1 / 14.2;
// k=2 0.5-1.5 faster too; 3 slots in between (benchmarks/RESULTS.md). As in awq_gemv_tc.cu.
constexpr int kTcStages = 2;

template <int K>
struct TcCfg {
    static constexpr int kTblWords = K == 5 ? kLut5Words : kWideLutWords;  // pair table, then 256 scales
    static constexpr int kTblBytes = (kTblWords + 256) * 4;
    static constexpr int kUnitBytes = K * kTileN * 4 + kTileN;  // a unit's planes + absmax bytes
    static constexpr int kWarpBytes = kTcStages * kUnitBytes;
    static constexpr int kBarOff = kTblBytes + kTcWarps * kWarpBytes;
    static constexpr int kSmem = kBarOff + kTcWarps * kTcStages * 8;
    static_assert(kUnitBytes % 16 == 0 && kBarOff % 8 == 0, "bulk copy and mbarrier alignment");
    static_assert(kSmem <= 227 * 1024, "one CTA per SM fits");
};

// M (1..8) only gates loads and stores, so it is a runtime argument.
template <typename T, int K>
__global__ void __launch_bounds__(kTcThreads, 1)
    kbit_gemv_tc_kernel(const uint32_t* __restrict__ packed, const uint8_t* __restrict__ absmax,
                        const float* __restrict__ codebook, const T* __restrict__ x, const T* __restrict__ bias,
                        T* __restrict__ y, int M, int out, int nb, float* __restrict__ accum,
                        int* __restrict__ counters) {
#if defined(KBIT_WGMMA)
    using C = TcCfg<K>;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    uint32_t* tbl = reinterpret_cast<uint32_t*>(smem_raw);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r = lane >> 2, g = lane & 3;
    const int n_tiles = (out + kTileN - 1) / kTileN;
    const long long units = static_cast<long long>(n_tiles) * nb;
    const long long warps = static_cast<long long>(gridDim.x) * kTcWarps;
    const long long w = static_cast<long long>(blockIdx.x) * kTcWarps + warp;
    const long long u0 = sk_start(w, units, warps);
    const int n = static_cast<int>(sk_start(w + 1, units, warps) - u0);  // >= 1 (host check)

    const uint32_t ring_s = ptx::smem_u32(smem_raw) + C::kTblBytes + warp * C::kWarpBytes;
    const unsigned char* ring = smem_raw + C::kTblBytes + warp * C::kWarpBytes;
    const uint32_t bars = ptx::smem_u32(smem_raw) + C::kBarOff + warp * kTcStages * 8;
    long long lu = u0;  // next unit lane 0 loads
    auto issue = [&](int slot) {
        const uint32_t dst = ring_s + slot * C::kUnitBytes, bar = bars + slot * 8;
        ptx::mbar_arrive_expect_tx(bar, C::kUnitBytes);
        ptx::bulk_copy(dst, packed + lu * (K * kTileN), K * kTileN * 4, bar);
        ptx::bulk_copy(dst + K * kTileN * 4, absmax + lu * kTileN, kTileN, bar);
        ++lu;
    };
    if (lane == 0) {
        for (int s = 0; s < kTcStages; ++s) ptx::mbar_init(bars + s * 8, 1);
        ptx::mbar_init_fence();
    }
    __syncwarp();
    // Weights, absmax and codebook (never written by another kernel) may load before the previous
    // kernel is done (PDL, pdl.cuh); x, y and the scratch follow pdl_wait.
    pdl_trigger();
    if (lane == 0)
        for (int s = 0; s < kTcStages - 1 && s < n; ++s) issue(s);
    if constexpr (K == 5)
        build_k5_lut<T>(tbl, lane_codebook<5>(codebook, lane), threadIdx.x, kTcThreads);
    else
        build_wide_lut<K, T, kWideLutWords / 256>(tbl, codebook);
    if (threadIdx.x < 256)  // the scale of absmax byte threadIdx.x
        reinterpret_cast<float*>(tbl)[C::kTblWords + threadIdx.x] = decode_e4m4_fast(threadIdx.x);
    __syncthreads();  // the tables; the only block barrier
    pdl_wait();

    const char* tblc = reinterpret_cast<const char*>(tbl);
    const float* stbl = reinterpret_cast<const float*>(tbl) + C::kTblWords;
    const uint32_t lane4 = static_cast<uint32_t>(lane) * 4u;
    const uint32_t copy4 = static_cast<uint32_t>(lane % kLut5Copies) * 4u;  // k = 5
    const int in = nb * 32;
    const T* xrow = x + static_cast<size_t>(r) * in + 2 * g;
    const size_t stride = static_cast<size_t>(n_tiles) * kTileN;  // accumulator row length
    int c = static_cast<int>(u0 / nb), blk = static_cast<int>(u0 - static_cast<long long>(c) * nb);
    int blk_first = blk;
    float acc[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int v = 0; v < 4; ++v) acc[i][v] = 0.f;
    // x of a block as B fragments: b[kk][h] = x[r][32 blk + 16kk + 8h + 2g, + 1] (zero for r >= M);
    // the next unit's are loaded while this one decodes (at M = 8 x is 64 KB: L2, not L1).
    const bool x_ok = r < M;
    auto load_x = [&](int bk, uint32_t(&bx)[2][2]) {
#pragma unroll
        for (int kk = 0; kk < 2; ++kk)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                bx[kk][h] = x_ok ? __ldg(reinterpret_cast<const uint32_t*>(xrow + 32 * bk + 16 * kk + 8 * h)) : 0u;
    };
    uint32_t b[2][2];
    load_x(blk, b);
    int slot = 0;
    uint32_t phase = 0;
    for (int it = 0; it < n; ++it) {
        __syncwarp();  // every lane is done with the slot of unit it - 1, which the next issue reuses
        if (lane == 0 && it + kTcStages - 1 < n) issue(slot == 0 ? kTcStages - 1 : slot - 1);
        uint32_t bn[2][2];
        if (it + 1 < n) load_x(blk == nb - 1 ? 0 : blk + 1, bn);
        ptx::mbar_wait(bars + slot * 8, phase);
        const unsigned char* sl = ring + slot * C::kUnitBytes;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            uint4 pw[K];
#pragma unroll
            for (int p = 0; p < K; ++p)
                pw[p] = *reinterpret_cast<const uint4*>(sl + (p * kTileN + 32 * j + 4 * r) * 4);
            const uint32_t ab = *reinterpret_cast<const uint32_t*>(sl + K * kTileN * 4 + 32 * j + 4 * r);
            uint32_t gw[4];  // group word (nibble n = field n) of feature 32j + 4r + e
            uint32_t hi[4];  // k = 5: its pairs' fifth bits (k5_pair_hi)
            float sc[4];     // its block scale
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                uint32_t pv[K];
#pragma unroll
                for (int p = 0; p < K; ++p) pv[p] = e == 0 ? pw[p].x : e == 1 ? pw[p].y : e == 2 ? pw[p].z : pw[p].w;
                gw[e] = group_word<K>(pv, g);
                hi[e] = K == 5 ? k5_pair_hi(pv[K - 1], g) : 0u;
                sc[e] = stbl[__byte_perm(ab, 0u, 0x4440u | e)];
            }
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {
                // The block's products with the unscaled codebook values (exact in fp32), then
                // times the feature's scale: rows r (q[0..1]) and r + 8 (q[2..3]).
                float q[4];
#pragma unroll
                for (int kk = 0; kk < 2; ++kk) {
                    uint32_t a[4];
#pragma unroll
                    for (int v = 0; v < 4; ++v) {  // a0 / a1: pair 2kk of rows r / r + 8; a2 / a3: pair 2kk + 1
                        const int e = 2 * jj + (v & 1), pair = 2 * kk + (v >> 1);
                        const uint32_t off = K == 5 ? k5_lut_off(gw[e], hi[e], pair, copy4)
                                                    : wide_lut_off(gw[e], pair, lane4);
                        a[v] = *reinterpret_cast<const uint32_t*>(tblc + off);
                    }
                    if (kk == 0)
                        ptx::mma16816_zc<T>(q, a, b[0][0], b[0][1]);
                    else
                        ptx::mma16816<T>(q, a, b[1][0], b[1][1]);
                }
                float(&ac)[4] = acc[2 * j + jj];
                const float s0 = sc[2 * jj], s1 = sc[2 * jj + 1];
                ac[0] = fmaf(s0, q[0], ac[0]);
                ac[1] = fmaf(s0, q[1], ac[1]);
                ac[2] = fmaf(s1, q[2], ac[2]);
                ac[3] = fmaf(s1, q[3], ac[3]);
            }
        }
        if (it + 1 < n) {
#pragma unroll
            for (int kk = 0; kk < 2; ++kk) b[kk][0] = bn[kk][0], b[kk][1] = bn[kk][1];
        }
        if (++slot == kTcStages) {
            slot = 0;
            phase ^= 1u;
        }
        if (blk != nb - 1 && it + 1 != n) {
            ++blk;
            continue;
        }
        // End of this warp's segment of tile c. acc[2j + jj][h]: feature 32j + 4r + 2jj, x row
        // 2g + h; acc[2j + jj][2 + h]: the next feature, the same row.
        const int o_lane = c * kTileN + 4 * r;
        bool write = true;
        if (!(blk_first == 0 && blk == nb - 1)) {
            const long long first = static_cast<long long>(c) * nb;
            const int others = static_cast<int>(sk_owner(first + nb - 1, units, warps) - sk_owner(first, units, warps));
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int m = 2 * g + h;
                if (m >= M) continue;
                float* dst = accum + static_cast<size_t>(m) * stride + o_lane;
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    red_add4(dst + 32 * j, acc[2 * j][h], acc[2 * j][2 + h], acc[2 * j + 1][h], acc[2 * j + 1][2 + h]);
            }
            write = sk_warp_arrive_last(counters + c, others);
            if (write) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int m = 2 * g + h;
                    if (m >= M) continue;
                    float4* src = reinterpret_cast<float4*>(accum + static_cast<size_t>(m) * stride + o_lane);
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const float4 v = sk_take4(src + 8 * j);
                        acc[2 * j][h] = v.x, acc[2 * j][2 + h] = v.y, acc[2 * j + 1][h] = v.z, acc[2 * j + 1][2 + h] = v.w;
                    }
                }
            }
        }
        if (write) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int o = o_lane + 32 * j;
                if (o >= out) continue;
                float bv[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) bv[e] = bias != nullptr && o + e < out ? to_float<T>(bias[o + e]) : 0.f;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int m = 2 * g + h;
                    if (m >= M) continue;
                    const T vals[4] = {from_float<T>(acc[2 * j][h] + bv[0]), from_float<T>(acc[2 * j][2 + h] + bv[1]),
                                       from_float<T>(acc[2 * j + 1][h] + bv[2]),
                                       from_float<T>(acc[2 * j + 1][2 + h] + bv[3])};
                    T* dst = y + static_cast<size_t>(m) * out + o;
                    if ((out & 3) == 0) {  // o + 3 < out and 8-byte aligned
                        *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(vals);
                    } else {
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            if (o + e < out) dst[e] = vals[e];
                    }
                }
            }
        }
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int v = 0; v < 4; ++v) acc[i][v] = 0.f;
        ++c;
        blk = blk_first = 0;
    }
#else
    __trap();  // bulk copies + this kernel exist on sm_90a only; the host launches it on compute capability 9.0 only
#endif
}

// The kernel for k bits (2..5, else nullptr) and its dynamic shared memory.
template <typename T>
const void* tc_kernel(int k, int& smem) {
    switch (k) {
        case 2: smem = TcCfg<2>::kSmem; return reinterpret_cast<const void*>(kbit_gemv_tc_kernel<T, 2>);
        case 3: smem = TcCfg<3>::kSmem; return reinterpret_cast<const void*>(kbit_gemv_tc_kernel<T, 3>);
        case 4: smem = TcCfg<4>::kSmem; return reinterpret_cast<const void*>(kbit_gemv_tc_kernel<T, 4>);
        case 5: smem = TcCfg<5>::kSmem; return reinterpret_cast<const void*>(kbit_gemv_tc_kernel<T, 5>);
        default: return nullptr;
    }
}

}  // namespace

// Resident CTAs per SM of the kernel for k bits (for a one-wave grid; the same for every M); 0 where
// it cannot run (k outside 2..5, not sm_90a / 9.0).
template <typename T>
int gemv_tc_ctas_per_sm(int k) {
    int smem = 0;
    const void* f = tc_kernel<T>(k, smem);
    if (f == nullptr || !ptx::wgmma_device_ok()) return 0;
    return resident_ctas(f, kTcThreads, smem);
}

// y [M, N] for M = 1..8 with a grid of ctas CTAs of 16 warps, 16 * ctas <= ceil(N / 128) * nb units;
// ws holds ceil(N / 128) * 128 * M zeroed floats and counters ceil(N / 128) zeroed ints (both left
// zeroed).
template <typename T>
int launch_gemv_tc(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int k, int M,
                   int N, int nb, void* y, int ctas, float* ws, int* counters, cudaStream_t stream) {
    int smem = 0;
    const void* f = tc_kernel<T>(k, smem);
    if (f == nullptr || M < 1 || M > 8 || N <= 0 || nb <= 0 || ctas < 1 || ws == nullptr || counters == nullptr ||
        !ptx::wgmma_device_ok())
        return static_cast<int>(cudaErrorInvalidValue);
    const long long units = static_cast<long long>((N + kTileN - 1) / kTileN) * nb;
    if (static_cast<long long>(ctas) * kTcWarps > units || units > (1LL << 30) ||
        static_cast<long long>(nb) * 32 > (1LL << 30))
        return static_cast<int>(cudaErrorInvalidValue);
    const cudaError_t attr = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (attr != cudaSuccess) return static_cast<int>(attr);
    const uint32_t* p = static_cast<const uint32_t*>(pt);
    const T* xt = static_cast<const T*>(x);
    const T* bt = static_cast<const T*>(bias);
    T* yt = static_cast<T*>(y);
    void* args[] = {&p, &at, &cb, &xt, &bt, &yt, &M, &N, &nb, &ws, &counters};
    return pdl_launch_c(f, dim3(static_cast<unsigned>(ctas)), dim3(kTcThreads), smem, stream, args);
}

template int gemv_tc_ctas_per_sm<half>(int);
template int gemv_tc_ctas_per_sm<__nv_bfloat16>(int);
template int launch_gemv_tc<half>(const void*, const void*, const uint8_t*, const float*, const void*, int, int, int,
                                  int, void*, int, float*, int*, cudaStream_t);
template int launch_gemv_tc<__nv_bfloat16>(const void*, const void*, const uint8_t*, const float*, const void*, int,
                                           int, int, int, void*, int, float*, int*, cudaStream_t);

}  // namespace kbit
