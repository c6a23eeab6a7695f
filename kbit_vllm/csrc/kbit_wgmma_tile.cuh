// Pieces shared by the kbit Hopper wgmma kernels (kbit_wgmma.cu, dense stream-K, and
// kbit_grouped_wgmma.cu, MoE): the tile and slot sizes, the shared tables, the loads of a stage
// and the decode + wgmma of one landed stage. The design is described in kbit_wgmma.cu's header.
#pragma once
#include "kbit_lut5.cuh"
#include "kbit_mma_frag.cuh"
#include "kbit_sk.cuh"
#include "wgmma_ptx.cuh"

namespace kbit {

constexpr int kWgThreads = 256;        // 2 warpgroups
constexpr int kWgBK = 2;               // quantization blocks per stage
// The tall tiles (dense kernel only): 160, 192, 256, 320 or 384 x rows, one m64 tile of 64 features
// per warpgroup, so one 128-feature layout tile per row tile and 16 features a warp (2 a lane). Their
// m64n256k16 wgmmas give each decoded weight twice the rows of the 128-row tile at the same 128
// accumulators a thread; the 320- and 384-row ones run two m64n160k16 / m64n192k16 (kw_nt).
constexpr int kWgTallRows = 256;
// m64 tiles per warpgroup (= layout tiles per row tile) of an R-row tile: past 128 rows, the tall tiles.
__host__ __device__ constexpr int kw_mt(int R) { return R > 128 ? 1 : 2; }
// wgmmas per m64 tile and k16 step (row halves of the tile, each its own x box): past kWgTallRows
// rows two, so the 320-row tile runs two m64n160k16 on every decoded A fragment (one decode for 320
// rows at 160 accumulators a thread).
__host__ __device__ constexpr int kw_nt(int R) { return R > kWgTallRows ? 2 : 1; }
constexpr int kWgLutWords = 256 * 32;  // compact pair table: one 128-byte row per pair code
static_assert(kLut5Words == kWgLutWords, "the k = 5 table (kbit_lut5.cuh) fills the k <= 4 table's words");
// Shared memory two CTAs per SM may each take on sm_90 (228 KB per SM, 1 KB of it reserved per CTA).
constexpr int kWgTwoCtaBytes = 113 * 1024;

// Words of the pair table: k = 5 with C5 lane copies per code (8: two CTAs per SM; 32: one, no bank
// conflicts), else the compact k <= 4 table. The scale-pair table follows it.
__host__ __device__ constexpr int kw_lut_words(int K, int C5) { return K == 5 ? 1024 * C5 : kWgLutWords; }
constexpr int kWgOneCtaBytes = 227 * 1024;  // the most shared memory one CTA may take on sm_90
// Words of the pair table as laid out: kWide (k <= 4) takes the stream-K GEMV's table of 256-byte rows
// (64 KB, kbit_sk.cuh), whose lookup offset is one byte permute with no shift (WgCfg::kWide).
__host__ __device__ constexpr int kw_pair_words(int K, int C5, bool kWide) {
    return kWide && K <= 4 ? kWideLutWords : kw_lut_words(K, C5);
}

// Shared memory of the kernel for k = K with R x rows per row tile (the wgmma N: 16, 32 or 64; the
// host picks the smallest that holds M, so a decode batch of 16 runs n16 wgmmas, not n64 on zero
// rows; 128 past 64 rows, dense and grouped, one decode for twice the rows, one CTA per SM: its
// 128 accumulators a thread leave no registers for a second; 160..384, the dense tall tiles, one CTA
// per SM) and C5 lane copies in the k = 5 table. Smaller R leaves room for more slots (stages in
// flight); at R = 384 3 fit. kDense: the dense kernel (kbit_wgmma.cu), whose k <= 4 rings are
// shallower below 128 rows (kSlotsCap); the grouped kernel keeps the deeper ones.
template <int K, int R, int C5 = kLut5Copies, bool kDense = false>
struct WgCfg {
    static constexpr int kMT = kw_mt(R);                             // m64 tiles per warpgroup
    static constexpr int kNT = kw_nt(R);                             // row halves (wgmmas per m64 tile)
    static constexpr int kRH = R / kNT;                              // x rows of one wgmma (its N)
    static constexpr int kXHalfBytes = kRH * kWgBK * 32 * 2;         // x of one row half (its own box)
    static constexpr int kTW = kMT;                                  // layout tiles per row tile
    static constexpr int kCols = kTileN * kTW;                       // features per row tile
    static constexpr int kLoadParts = 1 + 2 * kTW;                   // stage copies (kw_load_part)
    static constexpr bool kOneCta = (K == 5 && C5 == 32) || R >= 128;
    static constexpr int kXBytes = kNT * kXHalfBytes;                // x rows of a stage (128-byte swizzled)
    static constexpr int kTileFloats = R * kCols;
    // The dense kernel at k <= 4 and R <= 32 lays out the 64 KB pair table (kw_pair_words): with the table
    // at the start of shared memory a lookup is one byte permute and a load (the compact table's
    // offset takes a shift and an add more; 32 of ~340 instructions a stage and warp at R = 16). H200
    // session 40, bf16 behind a writer, µs compact / wide (R = 32 then runs 3 slots): k=4 M=16
    // 4096x28672 35.2 / 33.2, 14336x4096 20.7 / 19.4, 4096x6144 12.2 / 11.8; M=32 41.3 / 39.0, 23.9 /
    // 22.3, 14.8 / 14.8; k=2 M=16 14336x4096 20.8 / 18.3, k=3 21.5 / 18.6. The table does not fit
    // beside 3 slots at R = 64. The grouped kernel takes it at R = 16 (4 slots beside it, was 6): H200
    // session 41, qwen128 (128 experts) op µs, k=4 gate T=64 / 128 54.7 / 56.0 -> 52.0 / 52.6, down
    // 57.3 / 57.9 -> 53.5 / 54.0, k=2 5-8% alike; at R = 32 it lost (session 40: gate T=256 +3%).
    static constexpr bool kWide = K <= 4 && (kDense ? R <= 32 : R == 16);
    static constexpr int kLutBytes = kw_pair_words(K, C5, kWide) * 4 + 256 * 4;   // pair table + scale table
    static constexpr int kTileWords = kWgBK * K * kTileN;          // plane words of one layout tile per stage
    static constexpr int kBWords = kTW * kTileWords;               // [tile][block][plane][128]
    static constexpr int kAbsBytes = kTW * kWgBK * kTileN;         // [tile][block][128]
    static constexpr int kSlotBytes = (kXBytes + kBWords * 4 + kAbsBytes + 1023) / 1024 * 1024;
    static constexpr int kSlotsOff = (kLutBytes + 1023) / 1024 * 1024;
    // Stage slots (x, weights, absmax): k <= 4 as measured (sessions 9-10); k = 5's larger stages
    // take as many as fit (two CTAs per SM with the 8-copy table, one with the 32-copy one), at
    // most k <= 4's count (8 copies: R = 64: 4, 32: 5, 16: 6; 32 copies: 4, 6, 6).
    static constexpr int kSmemCap = kOneCta ? kWgOneCtaBytes : kWgTwoCtaBytes;
    static constexpr int kSlotsFit = (kSmemCap - 1024 - kSlotsOff - 6 * 8) / kSlotBytes;
    // R = 128: 6 slots measured the same as 4 (RESULTS.md, session 29). The dense kernel at k <= 4
    // runs 4 slots at R <= 32 and 3 at R = 64: H200 session 39, bf16 k=4 behind a writer, µs with the
    // deeper / shallower rings, M=16 4096x28672 37.7 / 36.0, 14336x4096 21.6 / 20.6, 4096x6144 13.1 /
    // 12.2; M=32 42.6 / 41.1, 25.1 / 23.9; M=64 52.0 / 51.1, 31.3 / 30.4, 4096x6144 19.4 / 19.6; 3 slots
    // at R = 128 lost (4096x28672 M=128 72.9 / 74.8, M=256 111.7 / 121.7). R = 32 with the wide table: 3;
    // the grouped kernel's R = 16 with it: 4.
    static constexpr int kSlotsCap = K <= 4 && (kDense ? R <= 64 : R == 16) ? (R == 16 ? 4 : 3) : R >= 64 ? 4 : 6;
    static constexpr int kSlots = (K <= 4 && R <= 64) || kSlotsFit > kSlotsCap ? kSlotsCap : kSlotsFit;
    static constexpr int kAhead = kSlots - 2;  // stages loaded ahead: the wgmmas read x until 2 stages later
    // Both k16 halves' table words looked up before a block's first wgmma wait (kw_stage): at one
    // CTA per SM 2-6% (RESULTS.md, session 29); the dense kernel at k <= 4 and R = 64 (two CTAs per SM)
    // 0-2% (session 40: M=64 4096x28672 51.4 / 50.4 µs, 4096x6144 19.8 / 19.3); at R <= 32 0-2% slower.
    static constexpr bool kEarly = kOneCta || (kDense && K <= 4 && R == 64);
    static constexpr int kBarOff = kSlotsOff + kSlots * kSlotBytes;  // one mbarrier per slot
    static constexpr int kBytes = 1024 + kBarOff + kSlots * 8;      // + alignment to 1024 bytes
    static_assert(kAhead >= 1, "a stage in flight at least");
    static_assert(kRH <= kWgTallRows && kRH * kNT == R && (kNT == 1 || kMT == 1),
                  "row halves only in the tall tiles");
    static_assert(kBytes <= kSmemCap, "the CTAs per SM fit");
};

// Per-lane constants (kbit_wgmma.cu's header has the layout). Up to 128 rows (MT = 2) warp w of a
// warpgroup owns features 32w..32w+31 of the warpgroup's layout tile, 4 adjacent ones a lane; in
// the tall tile (MT = 1) warp w of the CTA owns features 16w..16w+15 of the row tile's one layout
// tile, 2 adjacent ones a lane.
struct KwLane {
    int g;           // lane % 4: the layout's group of the lane
    int tw;          // this warpgroup's layout tile in the row tile
    int c0;          // this lane's first feature in that layout tile (2 MT adjacent ones)
    uint32_t lane8;  // wide_lut_off(.., lane8) / 2: the lane's copy in the 128-byte table rows
    uint32_t copy4;  // k = 5: byte offset of the lane's copy (lane % C5) in a table entry of C5 words
    template <int C5 = kLut5Copies, int MT = 2>
    __device__ __forceinline__ static KwLane make(int tid) {
        const int lane = tid & 31, warp = tid >> 5;
        KwLane L;
        L.g = lane & 3;
        L.tw = MT == 2 ? warp >> 2 : 0;
        L.c0 = MT == 2 ? 32 * (warp & 3) + 4 * (lane >> 2) : 16 * warp + 2 * (lane >> 2);
        L.lane8 = static_cast<uint32_t>(lane) * 8u;
        L.copy4 = static_cast<uint32_t>(lane % C5) * 4u;
        return L;
    }
};

// The pair table (k <= 4: the compact [256][32] words, kWide the [256][64]; k = 5: build_k5_lut) and
// the scale-pair table of all 256 absmax bytes after it, built by the CTA's 256 threads (the
// caller's barrier publishes them).
template <int K, typename T, int C5 = kLut5Copies, bool kWide = false>
__device__ __forceinline__ void kw_build_tables(uint32_t* tbl, const float* __restrict__ codebook, int tid) {
    if constexpr (K == 5)
        build_k5_lut<T, C5>(tbl, lane_codebook<5>(codebook, tid & 31), tid, kWgThreads);
    else
        build_wide_lut<K, T, kw_pair_words(K, C5, kWide) / 256>(tbl, codebook);
    const float sc = decode_e4m4_fast(static_cast<uint32_t>(tid));  // scale pair of absmax byte tid
    tbl[kw_pair_words(K, C5, kWide) + tid] = pack2<T>(sc, sc);
}

// acc[m64 tile x row half][fragment]: every accumulator a thread.
template <int A, int B>
__device__ __forceinline__ void kw_fence_acc(float (&acc)[A][B]) {
#pragma unroll
    for (int i = 0; i < A; ++i)
#pragma unroll
        for (int r = 0; r < B; ++r) ptx::reg_fence(acc[i][r]);
}

// This lane's plane words pw[b][s] (features c0 + s, s < 2 MT) and absmax bytes (byte s of ab) of
// block blk of the landed slot at generic pointer slot (slot layout: [x][plane words][absmax]).
template <int K, int R, int MT = kw_mt(R)>
__device__ __forceinline__ void kw_read_planes(const unsigned char* slot, const KwLane& L, int blk,
                                               uint32_t (&pw)[K][2 * MT], uint32_t& ab) {
    using S = WgCfg<K, R>;
    const unsigned char* base = slot + S::kXBytes;
    const uint32_t* b_s = reinterpret_cast<const uint32_t*>(base) + L.tw * S::kTileWords;
    const unsigned char* a_s = base + S::kBWords * 4 + (L.tw * kWgBK + blk) * kTileN + L.c0;
#pragma unroll
    for (int b = 0; b < K; ++b) {
        const uint32_t* src = b_s + (blk * K + b) * kTileN + L.c0;
        if constexpr (MT == 2) {
            const uint4 v = *reinterpret_cast<const uint4*>(src);
            pw[b][0] = v.x, pw[b][1] = v.y, pw[b][2] = v.z, pw[b][3] = v.w;
        } else {
            const uint2 v = *reinterpret_cast<const uint2*>(src);
            pw[b][0] = v.x, pw[b][1] = v.y;
        }
    }
    if constexpr (MT == 2)
        ab = *reinterpret_cast<const uint32_t*>(a_s);
    else
        ab = *reinterpret_cast<const uint16_t*>(a_s);
}

// The group words gw, scale pairs s2 and (k = 5) pair high bits hi of this lane's 2 MT features c0 + s
// in one block, from its plane words and absmax bytes (kw_read_planes).
template <int K, int C5, int MT, bool kWide = false>
__device__ __forceinline__ void kw_block_words(const uint32_t (&pw)[K][2 * MT], uint32_t ab, const uint32_t* tbl,
                                               const KwLane& L, uint32_t (&gw)[2 * MT], uint32_t (&s2)[2 * MT],
                                               uint32_t (&hi)[2 * MT]) {
#pragma unroll
    for (int s = 0; s < 2 * MT; ++s) {
        uint32_t p[K];
#pragma unroll
        for (int b = 0; b < K; ++b) p[b] = pw[b][s];
        gw[s] = group_word<K>(p, L.g);
        hi[s] = K == 5 ? k5_pair_hi(p[K - 1], L.g) : 0u;
        s2[s] = tbl[kw_pair_words(K, C5, kWide) + __byte_perm(ab, 0u, 0x4440u | s)];
    }
}

// The unscaled table words of k16 half kk of one block: m64 tile i, rows r8 / r8 + 8 = features c0 +
// 2i / c0 + 2i + 1: w[i][0] / w[i][1] at inputs 2g, 2g + 1 of the half (pair byte 2kk), w[i][2] /
// w[i][3] at 2g + 8, 2g + 9 (the mma A fragment registers). kWide: the table of 256-byte rows.
template <int K, int C5, int MT, bool kWide = false>
__device__ __forceinline__ void kw_lookup(const char* tblc, const uint32_t (&gw)[2 * MT], const uint32_t (&hi)[2 * MT],
                                          const KwLane& L, int kk, uint32_t (&w)[MT][4]) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int sf = 2 * i + h;
            uint32_t o0, o1;
            if constexpr (K == 5) {
                o0 = k5_lut_off<C5>(gw[sf], hi[sf], 2 * kk, L.copy4);
                o1 = k5_lut_off<C5>(gw[sf], hi[sf], 2 * kk + 1, L.copy4);
            } else if constexpr (kWide) {
                o0 = wide_lut_off(gw[sf], 2 * kk, L.lane8 >> 1);
                o1 = wide_lut_off(gw[sf], 2 * kk + 1, L.lane8 >> 1);
            } else {
                o0 = wide_lut_off(gw[sf], 2 * kk, L.lane8) >> 1;
                o1 = wide_lut_off(gw[sf], 2 * kk + 1, L.lane8) >> 1;
            }
            w[i][h] = *reinterpret_cast<const uint32_t*>(tblc + o0);
            w[i][2 + h] = *reinterpret_cast<const uint32_t*>(tblc + o1);
        }
}

// The A fragments of table words w: each times its feature's block scale pair.
template <typename T, int MT>
__device__ __forceinline__ void kw_scale(const uint32_t (&w)[MT][4], const uint32_t (&s2)[2 * MT],
                                         uint32_t (&a)[MT][4]) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) a[i][j] = mul2<T>(w[i][j], s2[2 * i + (j & 1)]);
}

#if defined(KBIT_WGMMA)
// Stage loads are split into S::kLoadParts copies (WgCfg) so that lanes of different warps issue
// them (lane 0 of warp `part`): each bulk copy takes ~20 issue slots of address and uniform-register
// work, and one warp issuing all of them every stage held every other warp at the next block barrier (ncu,
// RESULTS.md session 27). Part 0 expects the stage's bytes on bar and loads its x box (rows xrow..
// of tm_x, inputs xcol..); part 1 + 2 tw copies the plane words of layout tile tw, part 2 + 2 tw its
// absmax bytes. `tiles` layout tiles (1 or 2) whose first tile's stage starts at packed / absmax,
// later tiles nb blocks further; jn blocks (1 or 2). A layout tile or block not copied keeps stale
// finite words that meet zero x or feed outputs never stored. A copy may land before part 0's
// expectation: the mbarrier's transaction count goes negative and its phase waits for the arrival.

template <int K, int R>
__device__ __forceinline__ void kw_load_part(int part, uint32_t base, uint32_t bar, const CUtensorMap* tm_x,
                                             int xcol, int xrow, const uint32_t* packed, const uint8_t* absmax,
                                             int nb, int jn, int tiles) {
    using S = WgCfg<K, R>;
    if (part == 0) {
        ptx::mbar_arrive_expect_tx(bar, static_cast<uint32_t>(S::kXBytes + tiles * jn * (K * kTileN * 4 + kTileN)));
#pragma unroll
        for (int h = 0; h < S::kNT; ++h)  // a box per row half (kRH rows); one past M reads as zeros
            ptx::tma_load_2d(base + h * S::kXHalfBytes, tm_x, xcol, xrow + h * S::kRH, bar);
        return;
    }
    const int tw = (part - 1) >> 1;
    if (tw >= tiles) return;
    const size_t blk = static_cast<size_t>(tw) * nb;
    if (part & 1)
        ptx::bulk_copy(base + S::kXBytes + tw * S::kTileWords * 4, packed + blk * K * kTileN,
                       static_cast<uint32_t>(jn * K * kTileN * 4), bar);
    else
        ptx::bulk_copy(base + S::kXBytes + S::kBWords * 4 + tw * kWgBK * kTileN, absmax + blk * kTileN,
                       static_cast<uint32_t>(jn * kTileN), bar);
}

// Decodes one landed stage (slot at generic pointer slot, shared address slot_s) into A fragments
// and issues its 4 k16 halves as one commit group each (its MT m64 tiles): acc[i] += W x^T. Before
// decoding a half the warp waits until at most one group (the previous half's) is pending. The
// caller waits for all groups (wgmma_wait<0>) before it reads acc. kDense: the dense kernel's
// WgCfg (its table and lookup order).
template <typename T, int K, int R, int C5 = kLut5Copies, int MT = kw_mt(R), bool kDense = false>
__device__ __forceinline__ void kw_stage(const unsigned char* slot, uint32_t slot_s, const uint32_t* tbl,
                                         const KwLane& L, float (&acc)[MT][R / 2], uint32_t (&a)[2][MT][4]) {
    using S = WgCfg<K, R, C5, kDense>;
    const char* tblc = reinterpret_cast<const char*>(tbl);
    const uint64_t desc0 = ptx::wgmma_desc_sw128(slot_s);
    static_assert(kWgBK == 2, "two blocks per stage");
    uint32_t pw[K][2 * MT];
    uint32_t ab;
    kw_read_planes<K, R, MT>(slot, L, 0, pw, ab);
#pragma unroll
    for (int blk = 0; blk < kWgBK; ++blk) {
        uint32_t gw[2 * MT], s2[2 * MT], hi[2 * MT];
        kw_block_words<K, C5, MT, S::kWide>(pw, ab, tbl, L, gw, s2, hi);
        if (blk + 1 < kWgBK) kw_read_planes<K, R, MT>(slot, L, blk + 1, pw, ab);  // overlaps this block's decode
        auto lookup = [&](int kk, uint32_t (&w)[MT][4]) { kw_lookup<K, C5, MT, S::kWide>(tblc, gw, hi, L, kk, w); };
        // S::kEarly: both halves' table words are looked up at once, before the first wgmma wait, so
        // their shared-memory latency overlaps the previous groups' tensor work (at one CTA per SM, 2
        // warps a scheduler). Elsewhere at two CTAs per SM the other CTA's warps hide it, and the live
        // words would press the 128-register budget.
        constexpr bool kEarly = S::kEarly;
        uint32_t w[2][MT][4];
        if constexpr (kEarly) {
            lookup(0, w[0]);
            lookup(1, w[1]);
        }
        // One commit group per k16 half (its MT m64 tiles), A registers a[kk]: the group two back
        // used them, so wait until at most one group (the previous half's) is pending.
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
            ptx::wgmma_wait<1>();
            if constexpr (!kEarly) lookup(kk, w[kk]);
            kw_scale<T, MT>(w[kk], s2, a[kk]);
            kw_fence_acc(acc);
            ptx::wgmma_fence();
            const uint64_t desc = desc0 + static_cast<uint64_t>((blk * 2 + kk) * 2);  // 32 bytes a k16 step
#pragma unroll
            for (int i = 0; i < MT; ++i) ptx::wgmma_m64k16<T, R>(acc[i], a[kk][i], desc, 1);
            ptx::wgmma_commit();
            kw_fence_acc(acc);
        }
    }
}

// The tall tile's stage: one commit group a block (its 2 k16 halves, MT m64 tiles each) with its own
// A registers a[blk], so the tensor cores hold a whole block of this warp's work while it decodes
// the next (kw_stage's groups are a half). Before issuing a block the warp waits until at most one
// group (the other block's) is pending: the group that last read a[blk] is done. The caller waits
// for all groups (wgmma_wait<0>) before it reads acc. 7% faster than kw_stage on the tall tile; on
// the 128-row tiles (dense and grouped) it measured 0-3% slower (RESULTS.md, session 32).
template <typename T, int K, int R, int C5, int MT = kw_mt(R), int NT = kw_nt(R)>
__device__ __forceinline__ void kw_stage_blocks(const unsigned char* slot, uint32_t slot_s, const uint32_t* tbl,
                                                const KwLane& L, float (&acc)[MT * NT][R / NT / 2],
                                                uint32_t (&a)[kWgBK][2][MT][4]) {
    using S = WgCfg<K, R, C5>;
    constexpr uint64_t kHalfDesc = S::kXHalfBytes >> 4;  // the next row half's x box (16-byte units)
    const char* tblc = reinterpret_cast<const char*>(tbl);
    const uint64_t desc0 = ptx::wgmma_desc_sw128(slot_s);
    uint32_t pw[K][2 * MT];
    uint32_t ab;
    kw_read_planes<K, R, MT>(slot, L, 0, pw, ab);
#pragma unroll
    for (int blk = 0; blk < kWgBK; ++blk) {
        uint32_t gw[2 * MT], s2[2 * MT], hi[2 * MT];
        kw_block_words<K, C5, MT>(pw, ab, tbl, L, gw, s2, hi);
        if (blk + 1 < kWgBK) kw_read_planes<K, R, MT>(slot, L, blk + 1, pw, ab);
        uint32_t w[2][MT][4];
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) kw_lookup<K, C5, MT>(tblc, gw, hi, L, kk, w[kk]);
        ptx::wgmma_wait<1>();
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) kw_scale<T, MT>(w[kk], s2, a[blk][kk]);
        kw_fence_acc(acc);
        ptx::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
            const uint64_t desc = desc0 + static_cast<uint64_t>((blk * 2 + kk) * 2);  // 32 bytes a k16 step
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int h = 0; h < NT; ++h)
                    ptx::wgmma_m64k16<T, S::kRH>(acc[i * NT + h], a[blk][kk][i], desc + h * kHalfDesc, 1);
        }
        ptx::wgmma_commit();
        kw_fence_acc(acc);
    }
}

#endif

}  // namespace kbit
