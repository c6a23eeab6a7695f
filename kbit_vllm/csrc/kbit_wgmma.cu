// kbit tensor-core GEMM on Hopper (sm_90a wgmma), k = 2..4, for mid and large M:
// y[M, N] = x[M, K] @ W^T (+ bias), W in the tiled layout.
//
// Why: the mma.sync kernel (kbit_mma.cu) issues one HMMA per 16 x rows x 8 features x 16 inputs
// plus an ldmatrix per 16 rows, so its instructions grow with M, and past M = 32 its 64-row tile
// runs one CTA per SM (RESULTS.md, session 7). Here the weights are the wgmma A operand, decoded
// into registers exactly like the mma.sync B fragments (one pair-table lookup and one 16-bit x2
// multiply by the block scale per register), and x is the B operand, read by the tensor cores
// from shared memory: one m64n64k16 covers 64 features x 64 x rows x 16 inputs, so the decode is
// the whole per-weight cost at any M up to 64 (more rows take more row tiles, each decoding again).
// * CTA = 2 warpgroups = two 128-feature layout tiles (a 256-feature row tile; a missing second
//   tile at the end of N is zero-filled and not stored). Warp w of a warpgroup owns features
//   32w..32w+31 of its layout tile as rows of two m64 tiles: lane row r = lane / 4 holds features
//   32w + 4r + 2i (A row r of m64 tile i) and 32w + 4r + 2i + 1 (A row r + 8), so a lane's plane
//   words and absmax bytes are 4 adjacent ones (one 16-byte and one 4-byte shared load) and its
//   accumulators hold 4 adjacent features per x row (one 8-byte store). (16 features per warp, one
//   m64 tile, ran ~1.5x the instructions per weight: RESULTS.md, session 8.)
// * Stream-K over one wave, unit = (row tile, stage of 2 quantization blocks), row tile = (256
//   features, 64 x rows), row tiles feature-major; partial row tiles as in kbit_mma.cu: fp32
//   vector reductions into a zeroed accumulator, a per-tile counter, the last CTA writes y and
//   leaves both zero. (No deterministic mode: backends/cuda picks kbit_mma.cu there.)
// * The stage's x rows live in the wide pair table's unused right halves, as 8-row x 16-byte core
//   matrices: core matrix (row group i, input chunk c) of slot s is the right half of table row
//   64s + 8i + c, read through a no-swizzle K-major descriptor (chunks 256 bytes apart, row groups
//   2048): 4 x slots. Weights and absmax go to 4 slots after the 65 KB table: 100 KB at k=4, 2 CTAs
//   per SM (128 registers).
// * Weights are loaded 3 stages ahead of the stage being decoded (a slot is refilled once every
//   warp decoded it: a block barrier sits between), x 2 stages ahead (a slot is refilled only
//   after every warp waited for its wgmmas of 2 stages back). Each k16 half's 2 wgmmas (both m64
//   tiles) are one commit group with their own A registers; before decoding a half a warp waits
//   until at most one group (the other half's) is pending, so the tensor cores run one half while
//   the warp decodes the next.
#include "kbit_mma_frag.cuh"
#include "kbit_sk.cuh"
#include "pdl.cuh"
#include "wgmma_ptx.cuh"

namespace kbit {

namespace {

constexpr int kWgThreads = 256;        // 2 warpgroups
constexpr int kWgRows = 64;            // x rows per row tile (the wgmma N)
constexpr int kWgBK = 2;               // quantization blocks per stage
constexpr int kWgTW = 2;               // layout tiles per row tile (one per warpgroup)
constexpr int kWgCols = kTileN * kWgTW;  // features per row tile
constexpr int kWgWSlots = 4;           // weight / absmax stage slots (two layout tiles each)
[[maybe_unused]] constexpr int kWgWAhead = kWgWSlots - 1;  // weight stages loaded ahead of the one decoded
constexpr int kWgXSlots = 4;           // x stage slots (in the table's right halves)
[[maybe_unused]] constexpr int kWgXAhead = kWgXSlots - 2;  // x stages loaded ahead: the wgmmas read x asynchronously
[[maybe_unused]] constexpr int kWgTileFloats = kWgRows * kWgCols;

template <int K>
struct WgCfg {
    static constexpr int kLutBytes = kWideLutWords * 4 + 256 * 4;  // wide pair table + scale table
    static constexpr int kTileWords = kWgBK * K * kTileN;          // plane words of one layout tile per stage
    static constexpr int kBWords = kWgTW * kTileWords;             // [tile][block][plane][128]
    static constexpr int kAbsBytes = kWgTW * kWgBK * kTileN;       // [tile][block][128]
    static constexpr int kStageBytes = kBWords * 4 + kAbsBytes;
    static constexpr int kBytes = kLutBytes + kStageBytes * kWgWSlots;
    static constexpr int kXChunks = kWgRows * kWgBK * 4;           // 16-byte x chunks per stage
    static_assert(kWgXSlots * kWgRows <= 256, "x slots past the table");
    static_assert(kStageBytes % 16 == 0 && kLutBytes % 16 == 0, "16-byte copies");
    static_assert(kXChunks % kWgThreads == 0 && kAbsBytes / 16 <= kWgThreads && kWgTW == 2,
                  "whole copy rounds, one layout tile per warpgroup");
};

template <typename T, int K>
__global__ void __launch_bounds__(kWgThreads, 2)
    wgmma_sk_kernel(const T* __restrict__ x, const uint32_t* __restrict__ packed_t,
                    const uint8_t* __restrict__ absmax_t, const float* __restrict__ codebook,
                    const T* __restrict__ bias, T* __restrict__ y, int M, int N, int nb, float* __restrict__ ws,
                    int* __restrict__ counters) {
#if defined(KBIT_WGMMA)
    using S = WgCfg<K>;
    extern __shared__ __align__(128) unsigned char smem_wg[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane & 3, r8 = lane >> 2;
    const int n_tiles = (N + kTileN - 1) / kTileN;
    const int n_rt = (n_tiles + kWgTW - 1) / kWgTW;  // row tiles along N
    const int m_tiles = (M + kWgRows - 1) / kWgRows;
    const int nst = (nb + kWgBK - 1) / kWgBK;
    const long long ctas = gridDim.x, cta = blockIdx.x;
    const long long units = static_cast<long long>(n_rt) * m_tiles * nst;
    const int u0 = static_cast<int>(sk_start(cta, units, ctas));
    const int u1 = static_cast<int>(sk_start(cta + 1, units, ctas));
    const int in_f = nb * 32;
    uint32_t* tbl = reinterpret_cast<uint32_t*>(smem_wg);
    unsigned char* stages = smem_wg + S::kLutBytes;
    const uint32_t tbl_s = ptx::smem_u32(smem_wg);

    // Stage loads: weights and absmax of a unit into a weight slot, its x rows into an x slot,
    // each one cp.async commit group. The weight and x cursors each name the next unit to load
    // (layout tile t, row tile of x mt, stage st) and keep this thread's source pointers, stepped
    // by a constant per stage and recomputed only when a row tile ends (no per-stage address
    // arithmetic beyond that). A stage past nb (odd nb, the last of a row tile) zero-fills its
    // missing block.
    constexpr int kTChunks = S::kTileWords / 4;                  // 16-byte weight chunks per tile and stage
    constexpr int kWChunks = kWgTW * kTChunks;
    constexpr int kWPer = (kWChunks + kWgThreads - 1) / kWgThreads;
    constexpr int kXPer = S::kXChunks / kWgThreads;               // x chunks per thread and stage
    // This thread's x chunks c = tid + 256 i: input chunk xch, row xrow0 + 32 i of the row tile,
    // at shared byte xdst + 8192 i of the slot. A warp copies 64 contiguous bytes (chunks 0..3 or
    // 4..7) of 8 rows: 8 global lines, and 4 whole 128-byte core matrices in shared memory (4
    // wavefronts). (With lanes spread over 16 rows, ncu counted 5.6x the ideal L1 wavefronts for
    // the stage copies at M=64.)
    const int xch = ((tid >> 5) & 1) * 4 + (tid & 3), xrow0 = (tid >> 6) * 8 + ((tid >> 2) & 7);
    const int xdst = ((tid >> 6) * 8 + xch) * 256 + ((tid >> 2) & 7) * 16;
    static_assert(kXPer * kWgThreads == S::kXChunks && kWgThreads % 64 == 0, "x chunk rounds");
    // (t, mt, st) of a unit, and the unit after it.
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
    // Steps n to the next unit; true when a row tile ends (the pointers are sought again).
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
        const uint32_t* p[kWPer];  // this thread's weight chunks c = tid + 256 i of the stage
        const uint8_t* a;          // its absmax chunk (tid < kAbsBytes / 16)
        uint32_t zf;               // bit i: chunk i is in a layout tile past N (bit kWPer: the absmax chunk)
    };
    struct XCursor {
        Unit n;
        const T* p[kXPer];  // this thread's x chunks of the stage (row 0 where the row is past M)
        uint32_t zf;        // bit i: chunk i is past M (zero-filled)
    };
    auto w_seek = [&](WCursor& c) {
        c.zf = 0;
#pragma unroll
        for (int i = 0; i < kWPer; ++i) {
            const int ch = tid + i * kWgThreads, tw = ch / kTChunks, t = c.n.t * kWgTW + tw;
            c.zf |= t < n_tiles ? 0u : 1u << i;
            const size_t blk = static_cast<size_t>(t < n_tiles ? t : 0) * nb + c.n.st * kWgBK;
            c.p[i] = packed_t + blk * K * kTileN + (ch - tw * kTChunks) * 4;
        }
        constexpr int kAbsTile = kWgBK * kTileN / 16;  // absmax chunks per tile
        const int tw = tid / kAbsTile, t = c.n.t * kWgTW + tw;
        c.zf |= (t < n_tiles && tid < S::kAbsBytes / 16) ? 0u : 1u << kWPer;
        const size_t blk = static_cast<size_t>(t < n_tiles ? t : 0) * nb + c.n.st * kWgBK;
        c.a = absmax_t + blk * kTileN + (tid < S::kAbsBytes / 16 ? (tid - tw * kAbsTile) * 16 : 0);
    };
    auto x_seek = [&](XCursor& c) {
        c.zf = 0;
#pragma unroll
        for (int i = 0; i < kXPer; ++i) {
            const int row = c.n.mt * kWgRows + xrow0 + 32 * i;
            c.zf |= row < M ? 0u : 1u << i;
            c.p[i] = x + static_cast<size_t>(row < M ? row : 0) * in_f + c.n.st * kWgBK * 32 + xch * 8;
        }
    };
    auto load_w = [&](WCursor& c, int slot) {
        unsigned char* base = stages + slot * S::kStageBytes;
        const int jn = min(kWgBK, nb - c.n.st * kWgBK);  // valid blocks in this stage
#pragma unroll
        for (int i = 0; i < kWPer; ++i) {
            const int ch = tid + i * kWgThreads;
            if (kWChunks % kWgThreads == 0 || ch < kWChunks) {
                const int cc = ch % kTChunks;
                const bool ok = !((c.zf >> i) & 1u) && (jn == kWgBK || cc * 4 < jn * K * kTileN);
                ptx::cp_async16(base + ch * 16, ok ? c.p[i] : packed_t, ok);
            }
        }
        if (tid < S::kAbsBytes / 16) {
            const int cc = tid % (kWgBK * kTileN / 16);
            const bool ok = !((c.zf >> kWPer) & 1u) && (jn == kWgBK || cc * 16 < jn * kTileN);
            ptx::cp_async16(base + S::kBWords * 4 + tid * 16, ok ? c.a : absmax_t, ok);
        }
        if (next_unit(c.n)) {
            w_seek(c);
        } else {
#pragma unroll
            for (int i = 0; i < kWPer; ++i) c.p[i] += kWgBK * K * kTileN;
            c.a += kWgBK * kTileN;
        }
    };
    auto load_x = [&](XCursor& c, int slot) {
        unsigned char* xs = smem_wg + slot * kWgRows * 256 + 128 + xdst;
        const int jn = min(kWgBK, nb - c.n.st * kWgBK);
        const bool chunk_ok = jn == kWgBK || xch < jn * 4;
#pragma unroll
        for (int i = 0; i < kXPer; ++i) {
            const bool ok = chunk_ok && !((c.zf >> i) & 1u);
            ptx::cp_async16(xs + i * 8192, ok ? c.p[i] : x, ok);
        }
        if (next_unit(c.n)) {
            x_seek(c);
        } else {
#pragma unroll
            for (int i = 0; i < kXPer; ++i) c.p[i] += kWgBK * 32;
        }
    };
    WCursor wcur;
    XCursor xcur;
    wcur.n = xcur.n = unit_at(u0);
    w_seek(wcur);
    x_seek(xcur);

    // The tables are built while the previous kernel may still run (PDL, pdl.cuh); the stages
    // carry x and follow pdl_wait. The loop's first barrier publishes the tables.
    pdl_trigger();
    build_wide_lut<K, T>(tbl, codebook);
    {
        const float sc = decode_e4m4_fast(static_cast<uint32_t>(tid));  // scale pair of absmax byte tid
        tbl[kWideLutWords + tid] = pack2<T>(sc, sc);
    }
    pdl_wait();
    // Commit groups in issue order: w(0) .. w(kWgWAhead - kWgXAhead - 1), then per stage i from
    // -kWgXAhead on: w(i + kWgWAhead), x(i + kWgXAhead) (empty past the range). When stage i starts,
    // x(i) is followed by exactly 2 newer groups, and w(i) is older still.
    for (int s = 0; s < kWgWAhead - kWgXAhead; ++s) {
        if (u0 + s < u1) load_w(wcur, s);
        ptx::cp_async_commit();
    }
#pragma unroll
    for (int s = 0; s < kWgXAhead; ++s) {
        const int sw = s + kWgWAhead - kWgXAhead;
        if (u0 + sw < u1) load_w(wcur, sw);
        ptx::cp_async_commit();
        if (u0 + s < u1) load_x(xcur, s);
        ptx::cp_async_commit();
    }

    const uint32_t lane4 = static_cast<uint32_t>(lane) * 4u;
    const char* tblc = reinterpret_cast<const char*>(tbl);
    const int tw = warp >> 2;                    // this warpgroup's layout tile in the row tile
    const int c0 = 32 * (warp & 3) + 4 * r8;     // this lane's first feature in that layout tile
    float acc[2][32];                            // [m64 tile][fragment]
    uint32_t a[2][2][4];                         // A fragments: [k16 half][m64 tile][register]
    // This lane's plane words (features c0..c0 + 3) and absmax bytes of block blk of weight slot
    // wslot; the next block's are read once this block's group words are formed, so their loads
    // overlap this block's table lookups.
    auto read_planes = [&](int wslot, int blk, uint4 (&pw)[K], uint32_t& ab) {
        const unsigned char* base = stages + wslot * S::kStageBytes;
        const uint32_t* b_s = reinterpret_cast<const uint32_t*>(base) + tw * S::kTileWords;
#pragma unroll
        for (int b = 0; b < K; ++b) pw[b] = *reinterpret_cast<const uint4*>(b_s + (blk * K + b) * kTileN + c0);
        ab = *reinterpret_cast<const uint32_t*>(base + S::kBWords * 4 + (tw * kWgBK + blk) * kTileN + c0);
    };
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
            ptx::cp_async_wait<2>();          // this thread's copies of stage it (x and weights)
            ptx::fence_proxy_async_smem();    // visible to the tensor cores' reads of x
            __syncthreads();  // everyone's; every warp decoded stage it - 1 and its wgmmas of it - 2 are done
            if (u + kWgWAhead < u1) load_w(wcur, (it + kWgWAhead) % kWgWSlots);
            ptx::cp_async_commit();
            if (u + kWgXAhead < u1) load_x(xcur, (it + kWgXAhead) % kWgXSlots);
            ptx::cp_async_commit();
            const int slot = it % kWgXSlots, wslot = it % kWgWSlots;
            const uint32_t xs = tbl_s + static_cast<uint32_t>(slot * kWgRows * 256 + 128);
            static_assert(kWgBK == 2, "two blocks per stage");
            uint4 pw[K];
            uint32_t ab;
            read_planes(wslot, 0, pw, ab);
#pragma unroll
            for (int blk = 0; blk < kWgBK; ++blk) {
                uint32_t gw[4], s2[4];  // rotr(group word, g) and the scale pair of features c0 + s
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    uint32_t p[K];
#pragma unroll
                    for (int b = 0; b < K; ++b) p[b] = s == 0 ? pw[b].x : s == 1 ? pw[b].y : s == 2 ? pw[b].z : pw[b].w;
                    gw[s] = rotr32(group_word<K>(p, g), g);
                    s2[s] = tbl[kWideLutWords + __byte_perm(ab, 0u, 0x4440u | s)];
                }
                if (blk + 1 < kWgBK) read_planes(wslot, blk + 1, pw, ab);  // overlaps this block's decode
                // One commit group per k16 half (both m64 tiles), A registers a[kk]: the group two back
                // used them, so wait until at most one group (the previous half's) is pending.
#pragma unroll
                for (int kk = 0; kk < 2; ++kk) {
                    ptx::wgmma_wait<1>();
#pragma unroll
                    for (int i = 0; i < 2; ++i)
                        // m64 tile i, rows r8 / r8 + 8 = features c0 + 2i / c0 + 2i + 1: a0 / a1 at
                        // inputs 2g, 2g + 1 of the k16 half (pair byte 2kk), a2 / a3 at 2g + 8, 2g + 9.
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            const int sf = 2 * i + h;
                            const uint32_t o0 = wide_lut_off(gw[sf], 2 * kk, lane4);
                            const uint32_t o1 = wide_lut_off(gw[sf], 2 * kk + 1, lane4);
                            a[kk][i][h] = mul2<T>(*reinterpret_cast<const uint32_t*>(tblc + o0), s2[sf]);
                            a[kk][i][2 + h] = mul2<T>(*reinterpret_cast<const uint32_t*>(tblc + o1), s2[sf]);
                        }
                    fence_acc();
                    ptx::wgmma_fence();
                    const uint64_t desc =
                        ptx::wgmma_desc(xs + static_cast<uint32_t>((blk * 4 + kk * 2) * 256), 256, 8 * 256);
#pragma unroll
                    for (int i = 0; i < 2; ++i) ptx::wgmma_m64n64k16<T>(acc[i], a[kk][i], desc, 1);
                    ptx::wgmma_commit();
                    fence_acc();
                }
            }
        }
        ptx::wgmma_wait<0>();
        fence_acc();

        // End of this CTA's segment of row tile q. acc[i][4j + h]: feature f0 + 2i, x row 8j + 2g + h
        // of the tile; acc[i][4j + 2 + h]: feature f0 + 2i + 1, the same row.
        const int st_last = u - 1 - q * nst;
        const int rt = q / m_tiles, mt = q - rt * m_tiles;
        const int f0 = (rt * kWgTW + tw) * kTileN + c0;
        bool write = true;
        if (!(seg_from_start && st_last == nst - 1)) {
            const long long first = static_cast<long long>(q) * nst, lastu = first + nst - 1;
            const long long wf = sk_owner(first, units, ctas), wl = sk_owner(lastu, units, ctas);
            float* mine = ws + static_cast<size_t>(q) * kWgTileFloats + (warp * 2 * 8 * 32 + lane) * 4;
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
        if (write && f0 < N) {
            float bv[4];
#pragma unroll
            for (int s = 0; s < 4; ++s) bv[s] = (bias != nullptr && f0 + s < N) ? to_float(bias[f0 + s]) : 0.f;
            const bool vec = N % 4 == 0;  // f0 is a multiple of 4: all four features in range
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = mt * kWgRows + 8 * j + 2 * g + h;
                    if (row >= M) continue;
                    T* dst = y + static_cast<size_t>(row) * N + f0;
                    const float v[4] = {acc[0][4 * j + h] + bv[0], acc[0][4 * j + 2 + h] + bv[1],
                                        acc[1][4 * j + h] + bv[2], acc[1][4 * j + 2 + h] + bv[3]};
                    if (vec) {
                        *reinterpret_cast<uint2*>(dst) = make_uint2(pack2<T>(v[0], v[1]), pack2<T>(v[2], v[3]));
                    } else {
#pragma unroll
                        for (int s = 0; s < 4; ++s)
                            if (f0 + s < N) dst[s] = from_float<T>(v[s]);
                    }
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

template <typename T, int K>
const void* wgmma_kernel_ptr() {
    return reinterpret_cast<const void*>(wgmma_sk_kernel<T, K>);
}

template <typename T>
const void* wgmma_pick(int k, int* smem) {
    switch (k) {
        case 2: *smem = WgCfg<2>::kBytes; return wgmma_kernel_ptr<T, 2>();
        case 3: *smem = WgCfg<3>::kBytes; return wgmma_kernel_ptr<T, 3>();
        case 4: *smem = WgCfg<4>::kBytes; return wgmma_kernel_ptr<T, 4>();
        default: return nullptr;
    }
}

}  // namespace

using ptx::wgmma_device_ok;

// Resident CTAs per SM of the wgmma kernel for k bits, for sizing a one-wave grid; 0 on error, for
// k outside 2..4, or where !wgmma_device_ok().
template <typename T>
int wgmma_ctas_per_sm(int k) {
    int smem = 0;
    const void* f = wgmma_pick<T>(k, &smem);
    if (!wgmma_device_ok() || f == nullptr ||
        cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
        return 0;
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, f, kWgThreads, smem) != cudaSuccess) return 0;
    return n;
}
template int wgmma_ctas_per_sm<half>(int);
template int wgmma_ctas_per_sm<__nv_bfloat16>(int);

// ctas: grid size, 1..units where units = ceil(N / 256) * ceil(M / 64) * ceil(nb / 2). ws: a
// zeroed fp32 accumulator of ceil(N / 256) * ceil(M / 64) row tiles of 64 x 256 floats, counters
// as many zeroed int32; both are left zero.
template <typename T>
int launch_wgmma(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int k, int M,
                 int N, int nb, void* y, int ctas, float* ws, int* counters, cudaStream_t stream) {
    if (M == 0 || N <= 0) return 0;
    int smem = 0;
    const void* f = wgmma_pick<T>(k, &smem);
    const long long units = ((N + kWgCols - 1) / kWgCols) * static_cast<long long>((M + kWgRows - 1) / kWgRows) *
                            ((nb + kWgBK - 1) / kWgBK);
    if (f == nullptr || nb <= 0 || M < 0 || ctas < 1 || ctas > units || units > (1LL << 30) || ws == nullptr ||
        counters == nullptr || !wgmma_device_ok())
        return static_cast<int>(cudaErrorInvalidValue);
    const cudaError_t attr = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (attr != cudaSuccess) return static_cast<int>(attr);
    const T* xt = static_cast<const T*>(x);
    const uint32_t* p = static_cast<const uint32_t*>(pt);
    const T* bt = static_cast<const T*>(bias);
    T* yt = static_cast<T*>(y);
    void* args[] = {&xt, &p, &at, &cb, &bt, &yt, &M, &N, &nb, &ws, &counters};
    cudaLaunchAttribute attrs[1];
    const cudaLaunchConfig_t cfg = pdl_config(dim3(ctas), dim3(kWgThreads), smem, stream, attrs);
    const cudaError_t e = cudaLaunchKernelExC(&cfg, f, args);
    if (e != cudaSuccess) return static_cast<int>(e);
    KBIT_RETURN_LAUNCH_STATUS();
}

template int launch_wgmma<half>(const void*, const void*, const uint8_t*, const float*, const void*, int, int, int,
                                int, void*, int, float*, int*, cudaStream_t);
template int launch_wgmma<__nv_bfloat16>(const void*, const void*, const uint8_t*, const float*, const void*, int,
                                         int, int, int, void*, int, float*, int*, cudaStream_t);

}  // namespace kbit
