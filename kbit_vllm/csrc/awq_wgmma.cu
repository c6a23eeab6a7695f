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
//   64 or 128). One shared slot holds a stage's weight words ([32 column groups][64 words], rows
//   padded to 72 words so the 4 column groups a warp reads per load hit different banks), the
//   scale / offset pairs of both segments, and its 64 x rows as 8-row x 16-byte core matrices
//   (K-major, no swizzle: chunks 128 bytes apart, row groups 1024): 19 KB, 5 slots (2 CTAs per SM).
//   Stages are loaded 3 ahead of the one decoded: a slot is refilled only after every warp waited
//   for its wgmmas (2 stages back) and decoded it (1 stage back), with a block barrier between.
// * Stream-K over one wave, unit = (row tile, stage), row tile = (256 outputs, 64 x rows); partial
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

constexpr int kAwThreads = 256;                   // 2 warpgroups
constexpr int kAwRows = 64;                       // x rows per row tile (the wgmma N)
constexpr int kAwCols = 256;                      // outputs per row tile (128 per warpgroup)
constexpr int kAwBK = 64;                         // inputs per stage (two k32 segments)
constexpr int kAwGroups = kAwCols / 8;            // column groups per row tile
constexpr int kAwWLd = kAwBK + 8;                 // words per column-group row in shared memory
constexpr int kAwWBytes = kAwGroups * kAwWLd * 4;  // weight words of a stage
constexpr int kAwSBytes = 2 * kAwCols * 4;        // scale / offset pairs of both segments (16-bit)
constexpr int kAwXBytes = kAwRows * kAwBK * 2;    // x rows of a stage
constexpr int kAwSlotBytes = kAwWBytes + kAwSBytes + kAwXBytes;
constexpr int kAwSlots = 5;
constexpr int kAwAhead = kAwSlots - 2;  // stages loaded ahead: the wgmmas read x until 2 stages later
constexpr int kAwBytes = kAwSlots * kAwSlotBytes;
constexpr int kAwTileFloats = kAwRows * kAwCols;
constexpr int kAwWPer = kAwGroups * (kAwBK / 4) / kAwThreads;  // 16-byte weight chunks per thread
constexpr int kAwXPer = kAwRows * (kAwBK / 8) / kAwThreads;    // 16-byte x chunks per thread
static_assert(kAwWPer == 2 && kAwXPer == 2 && kAwSBytes / 16 <= kAwThreads, "whole copy rounds");
static_assert(kAwWBytes % 128 == 0 && kAwSlotBytes % 128 == 0, "aligned slots and x core matrices");

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

template <typename T>
__global__ void __launch_bounds__(kAwThreads, 2)
    awq_wgmma_kernel(const T* __restrict__ x, const int32_t* __restrict__ wq, const T* __restrict__ sz,
                     const T* __restrict__ bias, T* __restrict__ y, int M, int in, int out, int group,
                     float* __restrict__ ws, int* __restrict__ counters) {
#if defined(KBIT_WGMMA)
    extern __shared__ __align__(128) unsigned char smem_aw[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane & 3, r8 = lane >> 2;
    const int n_rt = (out + kAwCols - 1) / kAwCols;
    const int m_tiles = (M + kAwRows - 1) / kAwRows;
    const int nst = (in + kAwBK - 1) / kAwBK;
    const int col_groups = out / 8;
    const int gshift = __ffs(group) - 1;  // group is a power of two (host check)
    const long long ctas = gridDim.x, cta = blockIdx.x;
    const long long units = static_cast<long long>(n_rt) * m_tiles * nst;
    const int u0 = static_cast<int>(sk_start(cta, units, ctas));
    const int u1 = static_cast<int>(sk_start(cta + 1, units, ctas));
    const uint32_t smem_s = ptx::smem_u32(smem_aw);

    // Stage loads as in kbit_wgmma.cu: a weight cursor (weight words and scale pairs) and an x
    // cursor name the next unit to load (row tile t, x row tile mt, stage st) and keep this
    // thread's source pointers, stepped by a constant per stage and sought again when a row tile
    // ends. A stage past `in` (in % 64 == 32, the last of a row tile) zero-fills its second segment.
    // Weight chunk c = tid + 256 i: column group c / 16 of the row tile, words 4 (c % 16) .. + 3.
    // Scale chunk tid < 128: segment tid / 64, outputs 4 (tid % 64) .. + 3 of the row tile.
    // x chunks: as kbit_wgmma.cu (a warp copies 64 contiguous bytes of 8 rows: 4 core matrices).
    const int xch = ((tid >> 5) & 1) * 4 + (tid & 3), xrow0 = (tid >> 6) * 8 + ((tid >> 2) & 7);
    const int xdst = kAwWBytes + kAwSBytes + (tid >> 6) * 1024 + xch * 128 + ((tid >> 2) & 7) * 16;
    struct Unit {
        int t, mt, st;
    };
    auto unit_at = [&](int u) {
        const int q = u / nst;
        Unit n;
        n.st = u - q * nst;
        n.t = q / m_tiles;
        n.mt = q - n.t * m_tiles;
        return n;
    };
    auto next_unit = [&](Unit& n) {
        if (++n.st != nst) return false;
        n.st = 0;
        if (++n.mt == m_tiles) {
            n.mt = 0;
            ++n.t;
        }
        return true;
    };
    struct WCursor {
        Unit n;
        const int32_t* p[kAwWPer];  // this thread's weight chunks of the stage
        const T* s;                 // its scale chunk at group 0 (tid < 128)
        uint32_t zf;                // bit i: chunk i is past `out` (bit kAwWPer: the scale chunk)
    };
    struct XCursor {
        Unit n;
        const T* p[kAwXPer];  // this thread's x chunks of the stage (row 0 where the row is past M)
        uint32_t zf;          // bit i: chunk i is past M (zero-filled)
    };
    auto w_seek = [&](WCursor& c) {
        c.zf = 0;
#pragma unroll
        for (int i = 0; i < kAwWPer; ++i) {
            const int ch = tid + i * kAwThreads, cg = c.n.t * kAwGroups + ch / 16;
            c.zf |= cg < col_groups ? 0u : 1u << i;
            c.p[i] = wq + static_cast<size_t>(cg < col_groups ? cg : 0) * in + c.n.st * kAwBK + (ch % 16) * 4;
        }
        const int f = c.n.t * kAwCols + 4 * (tid & 63);
        c.zf |= (f < out && tid < kAwSBytes / 16) ? 0u : 1u << kAwWPer;
        c.s = sz + static_cast<size_t>(f < out ? f : 0) * 2;
    };
    auto x_seek = [&](XCursor& c) {
        c.zf = 0;
#pragma unroll
        for (int i = 0; i < kAwXPer; ++i) {
            const int row = c.n.mt * kAwRows + xrow0 + 32 * i;
            c.zf |= row < M ? 0u : 1u << i;
            c.p[i] = x + static_cast<size_t>(row < M ? row : 0) * in + c.n.st * kAwBK + xch * 8;
        }
    };
    auto load_w = [&](WCursor& c, int slot) {
        unsigned char* base = smem_aw + slot * kAwSlotBytes;
        const int k0 = c.n.st * kAwBK;
        const bool full = k0 + kAwBK <= in;  // else only the first segment is in range
#pragma unroll
        for (int i = 0; i < kAwWPer; ++i) {
            const int ch = tid + i * kAwThreads;
            const bool ok = !((c.zf >> i) & 1u) && (full || (ch % 16) < 8);
            ptx::cp_async16(base + (ch / 16) * kAwWLd * 4 + (ch % 16) * 16, ok ? c.p[i] : wq, ok);
        }
        if (tid < kAwSBytes / 16) {
            const int seg = tid >> 6;
            const bool ok = !((c.zf >> kAwWPer) & 1u) && (full || seg == 0);
            const T* src = c.s + static_cast<size_t>((k0 + 32 * seg) >> gshift) * out * 2;
            ptx::cp_async16(base + kAwWBytes + tid * 16, ok ? src : sz, ok);
        }
        if (next_unit(c.n)) {
            w_seek(c);
        } else {
#pragma unroll
            for (int i = 0; i < kAwWPer; ++i) c.p[i] += kAwBK;
        }
    };
    auto load_x = [&](XCursor& c, int slot) {
        unsigned char* xs = smem_aw + slot * kAwSlotBytes + xdst;
        const bool chunk_ok = c.n.st * kAwBK + kAwBK <= in || xch < 4;
#pragma unroll
        for (int i = 0; i < kAwXPer; ++i) {
            const bool ok = chunk_ok && !((c.zf >> i) & 1u);
            ptx::cp_async16(xs + i * 4096, ok ? c.p[i] : x, ok);
        }
        if (next_unit(c.n)) {
            x_seek(c);
        } else {
#pragma unroll
            for (int i = 0; i < kAwXPer; ++i) c.p[i] += kAwBK;
        }
    };
    WCursor wcur;
    XCursor xcur;
    wcur.n = xcur.n = unit_at(u0);
    w_seek(wcur);
    x_seek(xcur);

    // Weights and scales (never written by another kernel) of the first stages load while the
    // previous kernel may still run (PDL, pdl.cuh); x follows pdl_wait. All of those weight copies
    // join x(0)'s commit group, so when stage i starts, its group is followed by kAwAhead - 1 newer.
    kbit::pdl_trigger();
#pragma unroll
    for (int s = 0; s < kAwAhead; ++s)
        if (u0 + s < u1) load_w(wcur, s);
    kbit::pdl_wait();
#pragma unroll
    for (int s = 0; s < kAwAhead; ++s) {
        if (u0 + s < u1) load_x(xcur, s);
        ptx::cp_async_commit();
    }

    const int tw = warp >> 2;                    // this warpgroup's half of the row tile
    const int c0 = 32 * (warp & 3) + 4 * r8;     // this lane's first output in that half
    const int fl = tw * 128 + c0;                // ... in the row tile
    // Byte permute gathering, from words (c, k) and (c, k + 1), the bytes that hold outputs
    // f..f+3 (bytes h and 2 + h of each word, h = which half of the column group).
    const uint32_t hb = static_cast<uint32_t>(r8 & 1);
    const uint32_t sel = hb | ((2u + hb) << 4) | ((4u + hb) << 8) | ((6u + hb) << 12);
    float acc[2][32];    // [m64 tile][fragment]
    uint32_t a[2][2][4];  // A fragments: [k16 half parity][m64 tile][register]
    auto fence_acc = [&]() {
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int r = 0; r < 32; ++r) ptx::reg_fence(acc[i][r]);
    };

    int q = u0 / nst;  // row tile of the current segment
    bool seg_from_start = u0 == q * nst;
    int it = 0;
    for (int u = u0; u < u1;) {
        const int seg_end = min(u1, (q + 1) * nst);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int r = 0; r < 32; ++r) acc[i][r] = 0.f;
        for (; u < seg_end; ++u, ++it) {
            ptx::cp_async_wait<kAwAhead - 1>();  // this thread's copies of stage it
            ptx::fence_proxy_async_smem();        // visible to the tensor cores' reads of x
            __syncthreads();  // everyone's; every warp decoded stage it - 1 and its wgmmas of it - 2 are done
            if (u + kAwAhead < u1) {
                load_w(wcur, (it + kAwAhead) % kAwSlots);
                load_x(xcur, (it + kAwAhead) % kAwSlots);
            }
            ptx::cp_async_commit();
            const int slot = it % kAwSlots;
            const unsigned char* base = smem_aw + slot * kAwSlotBytes;
            const uint32_t* wr = reinterpret_cast<const uint32_t*>(base) + (fl / 8) * kAwWLd + 2 * g;
            // x of the stage as the B operand; k16 half kk starts 2 core matrices (256 bytes, 16 in
            // the descriptor's address field) further.
            const uint64_t desc0 = ptx::wgmma_desc(
                smem_s + static_cast<uint32_t>(slot * kAwSlotBytes + kAwWBytes + kAwSBytes), 128, 1024);
#pragma unroll
            for (int seg = 0; seg < 2; ++seg) {
                // Scale / offset pairs of outputs f..f+3 in this segment's group: (s_f, s_f+1),
                // (b_f, b_f+1), (s_f+2, s_f+3), (b_f+2, b_f+3).
                const uint4 sv = *reinterpret_cast<const uint4*>(base + kAwWBytes + seg * (kAwCols * 4) + fl * 4);
#pragma unroll
                for (int kh = 0; kh < 2; ++kh) {
                    const int kk = 2 * seg + kh;  // k16 half of the stage
                    const uint2 lo = *reinterpret_cast<const uint2*>(wr + 16 * kk);      // inputs 2g, 2g + 1
                    const uint2 hi = *reinterpret_cast<const uint2*>(wr + 16 * kk + 8);  // 2g + 8, 2g + 9
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
                    const uint64_t desc = desc0 + static_cast<uint64_t>(kk * 16);
#pragma unroll
                    for (int i = 0; i < 2; ++i) ptx::wgmma_m64n64k16<T>(acc[i], a[kk & 1][i], desc, 1);
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
            float* mine = ws + static_cast<size_t>(q) * kAwTileFloats + (warp * 2 * 8 * 32 + lane) * 4;
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j)
                    red_add4(mine + (i * 8 + j) * 128, acc[i][4 * j], acc[i][4 * j + 1], acc[i][4 * j + 2],
                             acc[i][4 * j + 3]);
            write = sk_cta_arrive_last(counters + q, static_cast<int>(wl - wf));
            if (write) {
#pragma unroll
                for (int i = 0; i < 2; ++i)
#pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        float4* src = reinterpret_cast<float4*>(mine + (i * 8 + j) * 128);
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
            for (int j = 0; j < 8; ++j)
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
    ptx::cp_async_wait<0>();
#else
    __trap();  // only sm_90a has wgmma; the host launches this kernel on compute capability 9.0 only
#endif
}

}  // namespace

// Resident CTAs per SM, for sizing a one-wave grid; 0 on error or where !wgmma_device_ok().
template <typename T>
int wgmma_ctas_per_sm() {
    const void* f = reinterpret_cast<const void*>(awq_wgmma_kernel<T>);
    if (!ptx::wgmma_device_ok() ||
        cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, kAwBytes) != cudaSuccess)
        return 0;
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, f, kAwThreads, kAwBytes) != cudaSuccess) return 0;
    return n;
}
template int wgmma_ctas_per_sm<half>();
template int wgmma_ctas_per_sm<__nv_bfloat16>();

// ctas: grid size, 1..units where units = ceil(out / 256) * ceil(m / 64) * ceil(in / 64). ws: a
// zeroed fp32 accumulator of ceil(out / 256) * ceil(m / 64) row tiles of 64 x 256 floats, counters
// as many zeroed int32; both are left zero.
template <typename T>
int wgmma(const void* x, const int32_t* wq, const void* sz, const void* bias, void* y, int m, int in, int out,
          int group, int ctas, float* ws, int* counters, cudaStream_t stream) {
    if (m == 0 || out == 0) return 0;
    const long long units = static_cast<long long>((out + kAwCols - 1) / kAwCols) * ((m + kAwRows - 1) / kAwRows) *
                            ((in + kAwBK - 1) / kAwBK);
    if (m < 0 || in <= 0 || out < 0 || in % 32 || out % 8 || group < 32 || (group & (group - 1)) || in % group || ctas < 1 ||
        ctas > units || units > (1LL << 30) || ws == nullptr || counters == nullptr || !ptx::wgmma_device_ok())
        return static_cast<int>(cudaErrorInvalidValue);
    const void* f = reinterpret_cast<const void*>(awq_wgmma_kernel<T>);
    const cudaError_t attr = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, kAwBytes);
    if (attr != cudaSuccess) return static_cast<int>(attr);
    const T* xt = static_cast<const T*>(x);
    const T* st = static_cast<const T*>(sz);
    const T* bt = static_cast<const T*>(bias);
    T* yt = static_cast<T*>(y);
    void* args[] = {&xt, &wq, &st, &bt, &yt, &m, &in, &out, &group, &ws, &counters};
    cudaLaunchAttribute attrs[1];
    const cudaLaunchConfig_t cfg = kbit::pdl_config(dim3(ctas), dim3(kAwThreads), kAwBytes, stream, attrs);
    const cudaError_t e = cudaLaunchKernelExC(&cfg, f, args);
    if (e != cudaSuccess) return static_cast<int>(e);
    return static_cast<int>(cudaGetLastError());
}

template int wgmma<half>(const void*, const int32_t*, const void*, const void*, void*, int, int, int, int, int, float*,
                         int*, cudaStream_t);
template int wgmma<__nv_bfloat16>(const void*, const int32_t*, const void*, const void*, void*, int, int, int, int,
                                  int, float*, int*, cudaStream_t);

}  // namespace awq
