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
//   ran as slow as M = 64, RESULTS.md session 10).
// * Stream-K over one wave, unit = (row tile, stage), row tile = (256 outputs, R x rows); partial
//   row tiles reduce into a zeroed fp32 accumulator with a per-tile counter, as kbit_wgmma.cu.
//   No deterministic mode (backends/cuda/awq_ops.py picks the mma.sync kernel there).
#include "awq_common.cuh"
#include "mma_ptx.cuh"
#include "pdl.cuh"
#include "stream_k.cuh"
#include "wgmma_ptx.cuh"


namespace awq {

namespace {

using kbit::red_add4;
using kbit::sk_cta_arrive_last;
using kbit::sk_owner;
using kbit::sk_start;
using kbit::SkUnit;

constexpr int kAwThreads = 256;                   // 2 warpgroups
constexpr int kAwCols = 256;                      // outputs per row tile (128 per warpgroup)
constexpr int kAwBK = 64;                         // inputs per stage (two k32 segments)
constexpr int kAwGroups = kAwCols / 8;            // column groups per row tile
constexpr int kAwWSeg = kAwGroups * 32 * 4;       // weight words of a segment: [32 column groups][128 bytes, swizzled]
constexpr int kAwSSeg = kAwCols * 4;              // scale / offset pairs of a segment

// Shared memory of the kernel with R x rows per row tile (the wgmma N: 16, 32 or 64; the host
// picks the smallest that holds M, so a decode batch of 16 runs n16 wgmmas, not n64 on zero rows).
// Smaller R leaves room for more slots (stages in flight) at 2 CTAs per SM.
template <int R>
struct AwCfg {
    static constexpr int kXBytes = R * kAwBK * 2;                          // x rows of a stage (128-byte swizzled)
    static constexpr int kSlotBytes = kXBytes + 2 * kAwWSeg + 2 * kAwSSeg;  // x, weights, scales: 18 KB at R = 64
    static constexpr int kSlots = R == 64 ? 5 : 6;
    static constexpr int kAhead = kSlots - 2;  // stages loaded ahead: the wgmmas read x until 2 stages later
    static constexpr int kBarOff = kSlots * kSlotBytes;  // one mbarrier per slot: its stage has landed
    static constexpr int kBytes = 1024 + kBarOff + kSlots * 8;  // + alignment of the slots to 1024 bytes
    static constexpr int kTileFloats = R * kAwCols;
    static_assert(kXBytes % 1024 == 0 && kAwWSeg % 1024 == 0 && kSlotBytes % 1024 == 0,
                  "swizzled TMA boxes start on 1024-byte boundaries");
};

// Both halves set to the low (H = 0) or high (H = 1) half of v; ptxas folds it into the consumer's
// operand selector (HFMA2 ... R.H0_H0) instead of a byte permute.
template <typename T, int H>
__device__ __forceinline__ typename Vec2<T>::type bcast(uint32_t v) {
    using T2 = typename Vec2<T>::type;
    const T2 p = *reinterpret_cast<const T2*>(&v);
    if constexpr (std::is_same<T, half>::value) {
        return H == 0 ? __low2half2(p) : __high2half2(p);
    } else {
        return H == 0 ? __low2bfloat162(p) : __high2bfloat162(p);
    }
}

// {W[f'][k], W[f'][k + 1]} from the nibbles at bits 0..3 and 16..19 of v, dequantized as q * s + b
// with s, b half H of the scale pair word sp and the offset pair word bp.
template <typename T, int H>
__device__ __forceinline__ uint32_t a_pair(uint32_t v, uint32_t sp, uint32_t bp) {
    using T2 = typename Vec2<T>::type;
    const uint32_t magic = std::is_same<T, half>::value ? 0x64006400u : 0x43004300u;  // 1024 / 128
    const uint32_t h = lop3_and_or(v, 0x000f000fu, magic);
    const T2 q = __hsub2(*reinterpret_cast<const T2*>(&h), *reinterpret_cast<const T2*>(&magic));
    const T2 w = __hfma2(q, bcast<T, H>(sp), bcast<T, H>(bp));
    return *reinterpret_cast<const uint32_t*>(&w);
}

template <typename T, int R>
__global__ void __launch_bounds__(kAwThreads, 2)
    awq_wgmma_kernel(const __grid_constant__ CUtensorMap tm_x, const __grid_constant__ CUtensorMap tm_w,
                     const __grid_constant__ CUtensorMap tm_s, const T* __restrict__ bias, T* __restrict__ y, int M,
                     int in, int out, int group, float* __restrict__ ws, int* __restrict__ counters) {
#if defined(KBIT_WGMMA)
    using C = AwCfg<R>;
    constexpr int kAwRows = R, kAwXBytes = C::kXBytes, kAwSlotBytes = C::kSlotBytes, kAwSlots = C::kSlots;
    constexpr int kAwAhead = C::kAhead, kJ = R / 8;  // kJ: 8-row accumulator groups
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane & 3, r8 = lane >> 2;
    const int n_rt = (out + kAwCols - 1) / kAwCols;
    const int m_tiles = (M + kAwRows - 1) / kAwRows;
    const int nst = (in + kAwBK - 1) / kAwBK;
    const int gshift = __ffs(group) - 1;  // group is a power of two (host check)
    const long long ctas = gridDim.x, cta = blockIdx.x;
    const long long units = static_cast<long long>(n_rt) * m_tiles * nst;
    const int u0 = static_cast<int>(sk_start(cta, units, ctas));
    const int u1 = static_cast<int>(sk_start(cta + 1, units, ctas));
    // Slots start on a 1024-byte boundary (the swizzle atom of the TMA boxes).
    const uint32_t raw_s = ptx::smem_u32(smem_raw);
    const uint32_t smem_s = (raw_s + 1023u) & ~1023u;
    const unsigned char* smem_aw = smem_raw + (smem_s - raw_s);
    const uint32_t bars = smem_s + C::kBarOff;

    // Stage loads: thread 0 issues 5 TMA boxes per stage (x: R rows x 64 inputs; weights: 32
    // column groups x 32 words per segment; scale pairs: 256 outputs of each segment's group) into
    // a slot, all counted on the slot's mbarrier. Boxes past `in`, `out`, M or the last group
    // read as zeros, so a half stage (in % 64 == 32) has zero scales and x in its second segment.
    // The loader cursor names the next unit to load (row tile t, x row tile mt, stage st).
    SkUnit lc = SkUnit::at(u0, nst, m_tiles);  // the next unit to load
    constexpr uint32_t kStageTx = kAwSlotBytes;
    auto load_w = [&](const SkUnit& n, int slot) {  // weights and scales (before pdl_wait allowed)
        const uint32_t base = smem_s + static_cast<uint32_t>(slot * kAwSlotBytes), bar = bars + slot * 8;
        const int k0 = n.st * kAwBK;
        ptx::mbar_arrive_expect_tx(bar, kStageTx);
#pragma unroll
        for (int seg = 0; seg < 2; ++seg) {
            ptx::tma_load_2d(base + kAwXBytes + seg * kAwWSeg, &tm_w, k0 + 32 * seg, n.t * kAwGroups, bar);
            ptx::tma_load_2d(base + kAwXBytes + 2 * kAwWSeg + seg * kAwSSeg, &tm_s, n.t * kAwCols,
                             (k0 + 32 * seg) >> gshift, bar);
        }
    };
    auto load_x = [&](const SkUnit& n, int slot) {
        ptx::tma_load_2d(smem_s + static_cast<uint32_t>(slot * kAwSlotBytes), &tm_x, n.st * kAwBK, n.mt * kAwRows,
                         bars + slot * 8);
    };

    if (tid == 0) {
        for (int i = 0; i < kAwSlots; ++i) ptx::mbar_init(bars + i * 8, 1);
        ptx::mbar_init_fence();
    }
    __syncthreads();
    // Weights and scales (never written by another kernel) of the first stages load while the
    // previous kernel may still run (PDL, pdl.cuh); x follows pdl_wait.
    kbit::pdl_trigger();
    if (tid == 0) {
        SkUnit n = lc;
        for (int s = 0; s < kAwAhead && u0 + s < u1; ++s, n.next(nst, m_tiles)) load_w(n, s);
    }
    kbit::pdl_wait();
    if (tid == 0) {
        for (int s = 0; s < kAwAhead && u0 + s < u1; ++s, lc.next(nst, m_tiles)) load_x(lc, s);
    }

    const int tw = warp >> 2;                    // this warpgroup's half of the row tile
    const int c0 = 32 * (warp & 3) + 4 * r8;     // this lane's first output in that half
    const int fl = tw * 128 + c0;                // ... in the row tile
    const int cgl = fl / 8, csw = cgl & 7;       // its column group (row of the weight boxes), swizzle
    // Byte permute gathering, from words (c, k) and (c, k + 1), the bytes that hold outputs
    // f..f+3 (bytes h and 2 + h of each word, h = which half of the column group).
    const uint32_t hb = static_cast<uint32_t>(r8 & 1);
    const uint32_t sel = hb | ((2u + hb) << 4) | ((4u + hb) << 8) | ((6u + hb) << 12);
    float acc[2][R / 2];  // [m64 tile][fragment]
    uint32_t a[2][2][4];  // A fragments: [k16 half parity][m64 tile][register]
    auto fence_acc = [&]() {
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int r = 0; r < R / 2; ++r) ptx::reg_fence(acc[i][r]);
    };

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
            if (tid == 0 && u + kAwAhead < u1) {
                const int ls = (it + kAwAhead) % kAwSlots;
                load_w(lc, ls);
                load_x(lc, ls);
                lc.next(nst, m_tiles);
            }
            const unsigned char* base = smem_aw + slot * kAwSlotBytes;
            const uint32_t* wseg = reinterpret_cast<const uint32_t*>(base + kAwXBytes) + cgl * 32;
            // x of the stage as the B operand; k16 half kk starts 2 core matrices (256 bytes, 16 in
            // the descriptor's address field) further.
            const uint64_t desc0 = ptx::wgmma_desc_sw128(smem_s + static_cast<uint32_t>(slot * kAwSlotBytes));
#pragma unroll
            for (int seg = 0; seg < 2; ++seg) {
                // Scale / offset pairs of outputs f..f+3 in this segment's group: (s_f, s_f+1),
                // (b_f, b_f+1), (s_f+2, s_f+3), (b_f+2, b_f+3).
                const uint4 sv =
                    *reinterpret_cast<const uint4*>(base + kAwXBytes + 2 * kAwWSeg + seg * kAwSSeg + fl * 4);
#pragma unroll
                for (int kh = 0; kh < 2; ++kh) {
                    const int kk = 2 * seg + kh;  // k16 half of the stage
                    // Words 16 kh + 2g (inputs 2g, 2g + 1) and + 8 of this segment: 16-byte chunks
                    // 4 kh + g / 2 and + 2 of the column group's row, swizzled by the row.
                    const uint32_t* wrow = wseg + seg * (kAwWSeg / 4);
                    const int c = 4 * kh + (g >> 1);
                    const uint2 lo = *reinterpret_cast<const uint2*>(wrow + ((c ^ csw) << 2) + 2 * (g & 1));
                    const uint2 hi = *reinterpret_cast<const uint2*>(wrow + (((c + 2) ^ csw) << 2) + 2 * (g & 1));
                    const uint32_t vl = __byte_perm(lo.x, lo.y, sel), vh = __byte_perm(hi.x, hi.y, sel);
                    // The group two halves back read a[kk & 1]: wait until at most one is pending.
                    ptx::wgmma_wait<1>();
                    // Tile 0: outputs f (a0, a2) and f + 1 (a1, a3) at shifts 0 and 8 of the permuted words;
                    // tile 1: f + 2 and f + 3 at shifts 4 and 12. a0, a1: inputs 2g..; a2, a3: 2g + 8..
                    a[kk & 1][0][0] = a_pair<T, 0>(vl, sv.x, sv.y);
                    a[kk & 1][0][1] = a_pair<T, 1>(vl >> 8, sv.x, sv.y);
                    a[kk & 1][0][2] = a_pair<T, 0>(vh, sv.x, sv.y);
                    a[kk & 1][0][3] = a_pair<T, 1>(vh >> 8, sv.x, sv.y);
                    a[kk & 1][1][0] = a_pair<T, 0>(vl >> 4, sv.z, sv.w);
                    a[kk & 1][1][1] = a_pair<T, 1>(vl >> 12, sv.z, sv.w);
                    a[kk & 1][1][2] = a_pair<T, 0>(vh >> 4, sv.z, sv.w);
                    a[kk & 1][1][3] = a_pair<T, 1>(vh >> 12, sv.z, sv.w);
                    fence_acc();
                    ptx::wgmma_fence();
                    const uint64_t desc = desc0 + static_cast<uint64_t>(kk * 2);  // 32 bytes a k16 step
#pragma unroll
                    for (int i = 0; i < 2; ++i) ptx::wgmma_m64k16<T, R>(acc[i], a[kk & 1][i], desc, 1);
                    ptx::wgmma_commit();
                    fence_acc();
                }
            }
        }
        ptx::wgmma_wait<0>();
        fence_acc();

        // End of this CTA's segment of row tile q: as kbit_wgmma.cu. acc[i][4j + h]: output f0 + 2i,
        // x row 8j + 2g + h of the tile; acc[i][4j + 2 + h]: output f0 + 2i + 1, the same row.
        const int st_last = u - 1 - q * nst;
        const int rt = q / m_tiles, mt = q - rt * m_tiles;
        const int f0 = rt * kAwCols + fl;
        bool write = true;
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
                        float4* src = reinterpret_cast<float4*>(mine + (i * kJ + j) * 128);
                        const float4 v = __ldcg(src);
                        __stcg(src, make_float4(0.f, 0.f, 0.f, 0.f));
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
    const void* f = reinterpret_cast<const void*>(awq_wgmma_kernel<T, R>);
    if (cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, AwCfg<R>::kBytes) != cudaSuccess) return 0;
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, f, kAwThreads, AwCfg<R>::kBytes) != cudaSuccess) return 0;
    return n;
}

template <typename T, int R>
int launch_rows(const CUtensorMap& tmx, const CUtensorMap& tmw, const CUtensorMap& tms, const void* bias, void* y,
                int m, int in, int out, int group, int ctas, float* ws, int* counters, cudaStream_t stream) {
    const void* f = reinterpret_cast<const void*>(awq_wgmma_kernel<T, R>);
    const cudaError_t attr = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, AwCfg<R>::kBytes);
    if (attr != cudaSuccess) return static_cast<int>(attr);
    const T* bt = static_cast<const T*>(bias);
    T* yt = static_cast<T*>(y);
    CUtensorMap mx = tmx, mw = tmw, ms = tms;
    void* args[] = {&mx, &mw, &ms, &bt, &yt, &m, &in, &out, &group, &ws, &counters};
    cudaLaunchAttribute attrs[1];
    const cudaLaunchConfig_t cfg = kbit::pdl_config(dim3(ctas), dim3(kAwThreads), AwCfg<R>::kBytes, stream, attrs);
    const cudaError_t e = cudaLaunchKernelExC(&cfg, f, args);
    if (e != cudaSuccess) return static_cast<int>(e);
    return static_cast<int>(cudaGetLastError());
}

}  // namespace

// Resident CTAs per SM of the kernel with `rows` x rows per row tile (16, 32 or 64), for sizing a
// one-wave grid; 0 on error, for other rows, or where !wgmma_device_ok().
template <typename T>
int wgmma_ctas_per_sm(int rows) {
    if (!ptx::wgmma_device_ok()) return 0;
    switch (rows) {
        case 16: return ctas_per_sm_rows<T, 16>();
        case 32: return ctas_per_sm_rows<T, 32>();
        case 64: return ctas_per_sm_rows<T, 64>();
        default: return 0;
    }
}
template int wgmma_ctas_per_sm<half>(int);
template int wgmma_ctas_per_sm<__nv_bfloat16>(int);

// rows: x rows per row tile (16, 32 or 64; the wgmma N). ctas: grid size, 1..units where units =
// ceil(out / 256) * ceil(m / rows) * ceil(in / 64). ws: a zeroed fp32 accumulator of
// ceil(out / 256) * ceil(m / rows) row tiles of rows x 256 floats, counters as many zeroed int32;
// both are left zero.
template <typename T>
int wgmma(const void* x, const int32_t* wq, const void* sz, const void* bias, void* y, int m, int in, int out,
          int group, int rows, int ctas, float* ws, int* counters, cudaStream_t stream) {
    if (m == 0 || out == 0) return 0;
    if (rows != 16 && rows != 32 && rows != 64) return static_cast<int>(cudaErrorInvalidValue);
    const long long units = static_cast<long long>((out + kAwCols - 1) / kAwCols) * ((m + rows - 1) / rows) *
                            ((in + kAwBK - 1) / kAwBK);
    if (m < 0 || in <= 0 || out < 0 || in % 32 || out % 8 || group < 32 || (group & (group - 1)) || in % group || ctas < 1 ||
        ctas > units || units > (1LL << 30) || ws == nullptr || counters == nullptr || !ptx::wgmma_device_ok())
        return static_cast<int>(cudaErrorInvalidValue);
    // Tensor maps: x [m, in] in 64-input x rows boxes (128-byte swizzle, the wgmma B layout), wq
    // [out/8, in] words in 32 x 32 boxes (128-byte swizzle, conflict-free lane reads), sz [in/group,
    // out] as 32-bit (scale, offset) pair words in 256 x 1 boxes.
    CUtensorMap tmx, tmw, tms;
    const CUtensorMapDataType xdt =
        std::is_same<T, half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    if (!ptx::encode_2d(&tmx, xdt, x, in, m, static_cast<uint64_t>(in) * 2, kAwBK, rows, CU_TENSOR_MAP_SWIZZLE_128B) ||
        !ptx::encode_2d(&tmw, CU_TENSOR_MAP_DATA_TYPE_UINT32, wq, in, out / 8, static_cast<uint64_t>(in) * 4, 32, kAwGroups,
                   CU_TENSOR_MAP_SWIZZLE_128B) ||
        !ptx::encode_2d(&tms, CU_TENSOR_MAP_DATA_TYPE_UINT32, sz, out, in / group, static_cast<uint64_t>(out) * 4, kAwCols,
                   1, CU_TENSOR_MAP_SWIZZLE_NONE))
        return static_cast<int>(cudaErrorInvalidValue);
    switch (rows) {
        case 16: return launch_rows<T, 16>(tmx, tmw, tms, bias, y, m, in, out, group, ctas, ws, counters, stream);
        case 32: return launch_rows<T, 32>(tmx, tmw, tms, bias, y, m, in, out, group, ctas, ws, counters, stream);
        default: return launch_rows<T, 64>(tmx, tmw, tms, bias, y, m, in, out, group, ctas, ws, counters, stream);
    }
}

template int wgmma<half>(const void*, const int32_t*, const void*, const void*, void*, int, int, int, int, int, int,
                         float*, int*, cudaStream_t);
template int wgmma<__nv_bfloat16>(const void*, const int32_t*, const void*, const void*, void*, int, int, int, int,
                                  int, int, float*, int*, cudaStream_t);

}  // namespace awq
