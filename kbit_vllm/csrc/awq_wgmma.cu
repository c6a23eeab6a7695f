// awq_orin tensor-core GEMM on Hopper (sm_90a wgmma) for mid M: y[M, out] = x[M, in] @ W^T (+ bias),
// W in the resident layout of awq_common.cuh (wq [out/8, in] words of 8 outputs, sz [in/group,
// out, 2] scale / offset pairs).
//
// Why: the mma.sync tile (awq_mma_tile.cuh) issues one HMMA per 16 x rows x 8 outputs x 16
// inputs and one ldmatrix per 16 rows, so its instructions grow with M; past M = 32 it loses to
// cuBLAS fp16 (RESULTS.md, session 6). Here the weights are the wgmma A operand, dequantized into
// registers (byte permute, LOP3 magic-number dequant, one fused multiply-add by scale and offset),
// and x is the B operand, read by the tensor cores from shared memory: one m64n64k16 covers 64
// outputs x 64 x rows x 16 inputs, so the dequant is the whole per-weight cost at any M up to 64.
// The structure is kbit_wgmma.cu's (read that header first); what differs:
// * A fragments: warp w of a warpgroup owns outputs 32w..32w+31 of the warpgroup's 128 as rows of
//   two m64 tiles: lane row r = lane / 4 holds outputs f = 32w + 4r + 2i (A row r of tile i) and
//   f + 1 (row r + 8). Those 4 outputs are one half of a column group c = f / 8 (word (c, k)
//   holds outputs 8c..8c+7 of input k in AWQ nibble order: output 2j at bit 4j, 2j + 1 at bit 16 +
//   4j), so one byte permute of words (c, k), (c, k + 1) gathers all 16 nibbles a lane needs for
//   inputs k, k + 1, and each A register {W[f'][k], W[f'][k + 1]} is one shift, one LOP3, one
//   subtract and one fused multiply-add away.
// * A stage is 64 inputs (two k32 segments, each inside one quantization group as groups are 32,
//   64 or 128). All loads are TMA boxes that one thread issues and a per-slot mbarrier counts:
//   x (R rows x 64 inputs, 128-byte swizzle: the canonical K-major wgmma B layout), the weight
//   words of each segment (32 column groups x 32 words, 128-byte swizzle, so the 4 column groups a
//   warp reads per load hit different banks) and each segment's scale / offset pairs (256
//   outputs). Boxes past `in`, `out`, M or the last group read as zeros. 18 KB a slot at R = 64
//   (5 slots), 12 KB at R = 16 (6 slots); 2 CTAs per SM. Stages are loaded 3 ahead of the one decoded: a slot is refilled only after
//   every warp waited for its wgmmas (2 stages back) and decoded it (1 stage back), with a block
//   barrier between. (With cp.async from every thread the loads alone took ~90% of the kernel's
//   time: H200 session 9, RESULTS.md; TMA cut 4096x28672 at M=64 from 56 to 45 us.)
// * Row tiles of R = 16, 32 or 64 x rows (the wgmma N; the host picks the smallest that holds M:
//   at M <= 16 an n64 wgmma would spend 3/4 of its tensor work on zero rows, and the M = 16 kernel
//   ran as slow as M = 64, RESULTS.md session 10), or 128, 160 or 192 past 64 rows
//   (awq_ops.wgmma_rows): one dequant for 2-3x the rows, at one CTA per SM (128, 160 or 192
//   accumulators a thread; 190, 222 and 248 registers). The 160- and 192-row tiles cost ~1.9 and
//   ~2.1 64-row tiles against the 128-row one's ~1.6 (RESULTS.md, session 33).
// * Stream-K over one wave, unit = (row tile, stage), row tile = (256 outputs, R x rows); partial
//   row tiles reduce into a zeroed fp32 accumulator with a per-tile counter, as kbit_wgmma.cu.
//   No deterministic mode (backends/cuda/awq_ops.py picks the mma.sync kernel there).
// * Or split-K over a cluster (splits > 0; awq_ops.WGMMA_CK_RULES: layers of at most 26 M weights at
//   33..64 rows): a cluster of `splits` CTAs per row tile, one an SM, each summing an even share of
//   its stages, the sums meeting in distributed shared memory (wgmma_cluster.cuh).
#include "awq_wgmma_tile.cuh"
#include "mma_ptx.cuh"
#include "pdl.cuh"
#include "stream_k.cuh"
#include "wgmma_cluster.cuh"


namespace awq {

namespace {

using kbit::red_add4;
using kbit::sk_cta_arrive_last;
using kbit::sk_owner;
using kbit::sk_start;
using kbit::SkUnit;

template <typename T, int R>
__global__ void __launch_bounds__(kAwThreads, AwCfg<R>::kOneCta ? 1 : 2)
    awq_wgmma_kernel(const __grid_constant__ CUtensorMap tm_x, const __grid_constant__ CUtensorMap tm_w,
                     const __grid_constant__ CUtensorMap tm_s, const T* __restrict__ bias, T* __restrict__ y, int M,
                     int in, int out, int group, float* __restrict__ ws, int* __restrict__ counters, int splits) {
#if defined(KBIT_WGMMA)
    using C = AwCfg<R>;
    constexpr int kAwRows = R, kAwSlotBytes = C::kSlotBytes, kAwSlots = C::kSlots;
    constexpr int kAwAhead = C::kAhead, kJ = R / 8;  // kJ: 8-row accumulator groups
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane & 3;
    const int n_rt = (out + kAwCols - 1) / kAwCols;
    const int m_tiles = (M + kAwRows - 1) / kAwRows;
    const int nst = (in + kAwBK - 1) / kAwBK;
    const int gshift = __ffs(group) - 1;  // group is a power of two (host check)
    const long long ctas = gridDim.x, cta = blockIdx.x;
    const long long units = static_cast<long long>(n_rt) * m_tiles * nst;
    // Stream-K: CTA cta sums units [u0, u1). Split-K over a cluster (splits > 0, wgmma_cluster.cuh): row
    // tile blockIdx.x / splits, its stages split evenly among the cluster's CTAs (splits <= nst).
    const int ck_q = static_cast<int>(cta) / max(splits, 1), ck_r = static_cast<int>(cta) - ck_q * max(splits, 1);
    const int u0 = splits > 0 ? ck_q * nst + static_cast<int>(sk_start(ck_r, nst, splits))
                              : static_cast<int>(sk_start(cta, units, ctas));
    const int u1 = splits > 0 ? ck_q * nst + static_cast<int>(sk_start(ck_r + 1, nst, splits))
                              : static_cast<int>(sk_start(cta + 1, units, ctas));
    // Slots start on a 1024-byte boundary (the swizzle atom of the TMA boxes).
    const uint32_t raw_s = ptx::smem_u32(smem_raw);
    const uint32_t smem_s = (raw_s + 1023u) & ~1023u;
    const unsigned char* smem_aw = smem_raw + (smem_s - raw_s);
    const uint32_t bars = smem_s + C::kBarOff;

    // Stage loads: 5 TMA boxes per stage (x: R rows x 64 inputs; weights: 32 column groups x 32
    // words per segment; scale pairs: 256 outputs of each segment's group) into a slot, all counted
    // on the slot's mbarrier, one per warp (aw_load_part). Boxes past `in`, `out`, M or the last
    // group read as zeros, so a half stage (in % 64 == 32) has zero scales and x in its second
    // segment. The loader cursor names the next unit to load (row tile t, x row tile mt, stage st);
    // every thread tracks it.
    SkUnit lc = SkUnit::at(u0, nst, m_tiles);  // the next unit to load
    auto load_part = [&](const SkUnit& n, int slot, int part) {
        aw_load_part<R>(part, smem_s + static_cast<uint32_t>(slot * kAwSlotBytes), bars + slot * 8, &tm_x, &tm_w,
                        &tm_s, n.st * kAwBK, n.mt * kAwRows, n.t * kAwGroups, 0, n.t * kAwCols, gshift);
    };

    if (tid == 0) {
        for (int i = 0; i < kAwSlots; ++i) ptx::mbar_init(bars + i * 8, 1);
        ptx::mbar_init_fence();
    }
    __syncthreads();
    // Weights and scales (never written by another kernel) of the first stages load while the
    // previous kernel may still run (PDL, pdl.cuh); x and the expectation (part 0) follow pdl_wait.
    kbit::pdl_trigger();
    if ((tid & 31) == 0 && (tid >> 5) >= 1 && (tid >> 5) < kAwLoadParts) {  // one box per warp, as in the loop
        SkUnit n = lc;
        for (int s = 0; s < kAwAhead && u0 + s < u1; ++s, n.next(nst, m_tiles)) load_part(n, s, tid >> 5);
    }
    kbit::pdl_wait();
    for (int s = 0; s < kAwAhead && u0 + s < u1; ++s, lc.next(nst, m_tiles))
        if (tid == 0) load_part(lc, s, 0);

    const AwLane L = AwLane::make(tid);
    const int fl = L.fl;
    float acc[2][R / 2];  // [m64 tile][fragment]
    uint32_t a[2][2][4];  // A fragments: [k16 half parity][m64 tile][register]

    int q = u0 / nst;  // row tile of the current segment
    bool seg_from_start = u0 == q * nst;
    int it = 0;
    for (int u = u0; u < u1;) {
        const int seg_end = min(u1, (q + 1) * nst);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int r = 0; r < R / 2; ++r) acc[i][r] = 0.f;
        for (; u < seg_end; ++u, ++it) {
            const int slot = it % kAwSlots;
            ptx::mbar_wait(bars + slot * 8, static_cast<uint32_t>(it / kAwSlots) & 1u);  // stage it landed
            __syncthreads();  // every warp decoded stage it - 1 and its wgmmas of it - 2 are done
            if (u + kAwAhead < u1) {  // refill the slot of stage it - 2: one box per warp
                if ((tid & 31) == 0 && (tid >> 5) < kAwLoadParts) load_part(lc, (it + kAwAhead) % kAwSlots, tid >> 5);
                lc.next(nst, m_tiles);
            }
            aw_stage<T, R>(smem_aw + slot * kAwSlotBytes, smem_s + static_cast<uint32_t>(slot * kAwSlotBytes), L, acc, a);
        }
        ptx::wgmma_wait<0>();
        aw_fence_acc<R>(acc);

        // End of this CTA's segment of row tile q: as kbit_wgmma.cu. acc[i][4j + h]: output f0 + 2i,
        // x row 8j + 2g + h of the tile; acc[i][4j + 2 + h]: output f0 + 2i + 1, the same row.
        const int st_last = u - 1 - q * nst;
        const int rt = q / m_tiles, mt = q - rt * m_tiles;
        const int f0 = rt * kAwCols + fl;
        bool write = true;
        if constexpr (R <= 64) {
            static_assert(kbit::ck_sums_bytes(R) <= C::kBarOff && kAwThreads == kbit::kCkThreads,
                          "a CTA's sums fit below its mbarriers");
            if (splits > 1) {  // the cluster's sums meet in shared memory; this CTA writes its share of y
                kbit::ck_cluster_reduce<T, R>(reinterpret_cast<float*>(smem_raw), acc, fl, g, tid, splits, y, bias,
                                              M, out, mt * kAwRows, rt * kAwCols);
                break;  // one row tile per CTA
            }
        }
        if (!(seg_from_start && st_last == nst - 1)) {
            const long long first = static_cast<long long>(q) * nst, lastu = first + nst - 1;
            const long long wf = sk_owner(first, units, ctas), wl = sk_owner(lastu, units, ctas);
            float* mine = ws + static_cast<size_t>(q) * C::kTileFloats + (warp * 2 * kJ * 32 + lane) * 4;
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < kJ; ++j)
                    red_add4(mine + (i * kJ + j) * 128, acc[i][4 * j], acc[i][4 * j + 1], acc[i][4 * j + 2],
                             acc[i][4 * j + 3]);
            write = sk_cta_arrive_last(counters + q, static_cast<int>(wl - wf));
            if (write) {
#pragma unroll
                for (int i = 0; i < 2; ++i)
#pragma unroll
                    for (int j = 0; j < kJ; ++j) {
                        const float4 v = kbit::sk_take4(reinterpret_cast<float4*>(mine + (i * kJ + j) * 128));
                        acc[i][4 * j] = v.x, acc[i][4 * j + 1] = v.y, acc[i][4 * j + 2] = v.z, acc[i][4 * j + 3] = v.w;
                    }
            }
        }
        if (write && f0 < out) {  // out % 8 == 0: all four outputs are in range
            float bv[4];
#pragma unroll
            for (int s = 0; s < 4; ++s) bv[s] = bias != nullptr ? to_f<T>(bias[f0 + s]) : 0.f;
#pragma unroll
            for (int j = 0; j < kJ; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = mt * kAwRows + 8 * j + 2 * g + h;
                    if (row >= M) continue;
                    using T2 = typename Vec2<T>::type;
                    T2 lo, hi;
                    lo.x = from_f<T>(acc[0][4 * j + h] + bv[0]);
                    lo.y = from_f<T>(acc[0][4 * j + 2 + h] + bv[1]);
                    hi.x = from_f<T>(acc[1][4 * j + h] + bv[2]);
                    hi.y = from_f<T>(acc[1][4 * j + 2 + h] + bv[3]);
                    *reinterpret_cast<uint2*>(y + static_cast<size_t>(row) * out + f0) =
                        make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
                }
        }
        ++q;
        seg_from_start = true;
    }
#else
    __trap();  // only sm_90a has wgmma; the host launches this kernel on compute capability 9.0 only
#endif
}

template <typename T, int R>
int ctas_per_sm_rows() {
    return kbit::resident_ctas(reinterpret_cast<const void*>(awq_wgmma_kernel<T, R>), kAwThreads, AwCfg<R>::kBytes);
}

template <typename T, int R>
int launch_rows(const CUtensorMap& tmx, const CUtensorMap& tmw, const CUtensorMap& tms, const void* bias, void* y,
                int m, int in, int out, int group, int ctas, float* ws, int* counters, int splits,
                cudaStream_t stream) {
    const void* f = reinterpret_cast<const void*>(awq_wgmma_kernel<T, R>);
    const int smem = splits > 0 ? kbit::ck_smem(AwCfg<R>::kBytes) : AwCfg<R>::kBytes;
    const cudaError_t attr = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (attr != cudaSuccess) return static_cast<int>(attr);
    const T* bt = static_cast<const T*>(bias);
    T* yt = static_cast<T*>(y);
    CUtensorMap mx = tmx, mw = tmw, ms = tms;
    void* args[] = {&mx, &mw, &ms, &bt, &yt, &m, &in, &out, &group, &ws, &counters, &splits};
    return kbit::pdl_launch_c(f, dim3(ctas), dim3(kAwThreads), smem, stream, args, splits > 1 ? splits : 1);
}

template <typename T, int R>
int ck_clusters_rows(int splits) {
    return kbit::ck_max_clusters(reinterpret_cast<const void*>(awq_wgmma_kernel<T, R>), AwCfg<R>::kBytes, splits);
}

}  // namespace

// Resident CTAs per SM of the kernel with `rows` x rows per row tile (16, 32, 64, 128, 160 or 192), for sizing a
// one-wave grid; 0 on error, for other rows, or where !wgmma_device_ok().
template <typename T>
int wgmma_ctas_per_sm(int rows) {
    if (!ptx::wgmma_device_ok()) return 0;
    switch (rows) {
        case 16: return ctas_per_sm_rows<T, 16>();
        case 32: return ctas_per_sm_rows<T, 32>();
        case 64: return ctas_per_sm_rows<T, 64>();
        case 128: return ctas_per_sm_rows<T, 128>();
        case 160: return ctas_per_sm_rows<T, 160>();
        case 192: return ctas_per_sm_rows<T, 192>();
        default: return 0;
    }
}
template int wgmma_ctas_per_sm<half>(int);
template int wgmma_ctas_per_sm<__nv_bfloat16>(int);

// Clusters of `splits` (2..8) CTAs of the kernel with `rows` x rows per row tile (16, 32 or 64) resident
// at once (split-K launches); 0 on error, for other rows, or where !wgmma_device_ok().
template <typename T>
int wgmma_ck_clusters(int rows, int splits) {
    if (!ptx::wgmma_device_ok()) return 0;
    switch (rows) {
        case 16: return ck_clusters_rows<T, 16>(splits);
        case 32: return ck_clusters_rows<T, 32>(splits);
        case 64: return ck_clusters_rows<T, 64>(splits);
        default: return 0;
    }
}
template int wgmma_ck_clusters<half>(int, int);
template int wgmma_ck_clusters<__nv_bfloat16>(int, int);

// rows: x rows per row tile (16, 32, 64, 128, 160 or 192; the wgmma N). splits = 0: stream-K, ctas the grid
// size, 1..units where units = ceil(out / 256) * ceil(m / rows) * ceil(in / 64); ws a zeroed fp32
// accumulator of ceil(out / 256) * ceil(m / rows) row tiles of rows x 256 floats, counters as many
// zeroed int32; both are left zero. splits = 1..8 (rows <= 64, at most the ceil(in / 64) stages):
// split-K, each row tile's stages split evenly over a cluster of `splits` CTAs, one an SM, whose sums
// meet in distributed shared memory (wgmma_cluster.cuh); ctas must be row tiles x splits, ws and
// counters are not touched.
template <typename T>
int wgmma(const void* x, const int32_t* wq, const void* sz, const void* bias, void* y, int m, int in, int out,
          int group, int rows, int ctas, float* ws, int* counters, int splits, cudaStream_t stream) {
    if (m == 0 || out == 0) return 0;
    if (rows != 16 && rows != 32 && rows != 64 && rows != 128 && rows != 160 && rows != 192)
        return static_cast<int>(cudaErrorInvalidValue);
    const long long row_tiles = static_cast<long long>((out + kAwCols - 1) / kAwCols) * ((m + rows - 1) / rows);
    const long long units = row_tiles * ((in + kAwBK - 1) / kAwBK);
    if (m < 0 || in <= 0 || out < 0 || in % 32 || out % 8 || group < 32 || (group & (group - 1)) || in % group || ctas < 1 ||
        ctas > units || units > (1LL << 30) || !ptx::wgmma_device_ok())
        return static_cast<int>(cudaErrorInvalidValue);
    if (splits == 0 ? (ws == nullptr || counters == nullptr)
                    : (splits < 0 || splits > 8 || rows > 64 || splits > (in + kAwBK - 1) / kAwBK ||
                       ctas != row_tiles * splits))
        return static_cast<int>(cudaErrorInvalidValue);
    CUtensorMap tmx, tmw, tms;
    if (!aw_tensor_maps<T>(&tmx, &tmw, &tms, x, m, wq, out / 8, sz, in / group, in, out, rows))
        return static_cast<int>(cudaErrorInvalidValue);
    switch (rows) {
        case 16: return launch_rows<T, 16>(tmx, tmw, tms, bias, y, m, in, out, group, ctas, ws, counters, splits,
                                           stream);
        case 32: return launch_rows<T, 32>(tmx, tmw, tms, bias, y, m, in, out, group, ctas, ws, counters, splits,
                                           stream);
        case 64: return launch_rows<T, 64>(tmx, tmw, tms, bias, y, m, in, out, group, ctas, ws, counters, splits,
                                           stream);
        case 128: return launch_rows<T, 128>(tmx, tmw, tms, bias, y, m, in, out, group, ctas, ws, counters, splits,
                                             stream);
        case 160: return launch_rows<T, 160>(tmx, tmw, tms, bias, y, m, in, out, group, ctas, ws, counters, splits,
                                             stream);
        default: return launch_rows<T, 192>(tmx, tmw, tms, bias, y, m, in, out, group, ctas, ws, counters, splits,
                                            stream);
    }
}

template int wgmma<half>(const void*, const int32_t*, const void*, const void*, void*, int, int, int, int, int, int,
                         float*, int*, int, cudaStream_t);
template int wgmma<__nv_bfloat16>(const void*, const int32_t*, const void*, const void*, void*, int, int, int, int,
                                  int, int, float*, int*, int, cudaStream_t);

}  // namespace awq
