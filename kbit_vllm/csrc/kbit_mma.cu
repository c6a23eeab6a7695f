// kbit tensor-core GEMM for mid M (5..~64 rows): y[M, N] = x[M, K] @ W^T (+ bias), W tiled.
//
// Why this shape: at these M the old split-K MMA was bound by per-warp decode latency and a
// serial split reduction (one L2 round trip per split and value), not by bytes. Here:
// * Stream-K over one wave: work unit = (row tile, stage of 2 quantization blocks), where a row
//   tile is 16*MB x rows times TW layout tiles (128*TW output features). The units are cut into
//   equal contiguous ranges, one per CTA of a grid sized to the resident CTAs of the GPU, so
//   every SM gets the same work whatever the shape, and no CTA waits for a second wave.
// * Every weight is decoded once per CTA: 8 warps split the 128*TW features (16*TW each) and
//   each warp runs all 16*MB rows. A warp's n8 sub-tile s, B column n, is feature
//   wbase + NS*n + s (NS = 2*TW sub-tiles), so a lane's plane words for its NS sub-tiles are
//   adjacent (one 8/16-byte shared load per plane) and its accumulators for one row are NS
//   adjacent features (one vector store / reduction).
// * k = 2..4 decode: each B fragment register (a pair of weights) is one pair-table lookup
//   (kbit_lut.cuh, entries in the activation dtype) times the block scale (one 16-bit x2
//   multiply). k = 5: the lane codebook shuffle.
// * A 4-stage cp.async pipeline brings, per unit, the planes and absmax bytes of the TW tiles
//   (contiguous per tile in the layout) and the x rows (XOR-swizzled 16-byte chunks, ldmatrix).
// A CTA's range covers at most two partial row tiles (head and tail); whole row tiles in between
// are written directly. Partials: default mode adds the fp32 sums into a zeroed accumulator per
// row tile with vector reductions in L2 (no waiting; order varies run to run); deterministic mode
// writes them to a slot per (CTA, head/tail) and the last CTA sums the slots in CTA order.
// Either way the last CTA of a row tile (per-tile counter) writes y, adds bias, and leaves the
// accumulator and counter zero for the next call (graph replays included).
#include "kbit_mma_frag.cuh"
#include "kbit_sk.cuh"
#include "pdl.cuh"

namespace kbit {

namespace {

constexpr int kMmaThreads = 256;
constexpr int kMmaWarps = kMmaThreads / 32;

// Variants of the kernel, selected at run time so they can be timed side by side (variant 0 is
// the plain kernel; backends/cuda/dispatch.py runs v5 and v2, the forced paths "mma_v1".."mma_v5"
// any of them).
// kBK: quantization blocks per stage (unit); kStages: cp.async stages; kMinBlocks: the
// __launch_bounds__ minimum (2: 128-register cap, 1: 255); kFastLoad: each thread keeps its
// stage-load source pointers and zero-fill flags per row tile and advances the pointers by
// constant strides (the generic load recomputes every address: ~1/3 of the loop's instructions
// at M = 64); kScaleLut (k <= 4): each block scale pair comes from a 256-entry table of
// pack2(decode(absmax byte)) in shared memory (one byte permute and one load instead of ~6
// instructions per n8 sub-tile and block); kWideLut (k <= 4): the pair table with 256-byte rows
// (kbit_sk.cuh, 64 KB: no second CTA per SM fits), whose entry offset is one byte permute of the
// group word rotated once per sub-tile, instead of a rotate and a mask per B register. Every
// variant but 0 also keeps partial row tiles in accumulator-fragment order (kFragWs below),
// which removes ~2 register moves per HMMA from the main loop.
//   v0: 2 blocks, 4 stages, 2 CTAs/SM, generic loads (default).
//   v1: 2 blocks, 6 stages, 1 CTA/SM (255 registers), fast loads, scale table, wide pair table.
//   v2: 4 blocks, 4 stages, 1 CTA/SM, fast loads, scale table, wide pair table (half the
//       barriers and load steps per HMMA).
//   v3: v0 with fragment-order partials only (the smallest change to the default).
//   v4: 2 blocks, 4 stages, 2 CTAs/SM, fast loads, scale table (some pointer spills at 128
//       registers).
//   v5 (k <= 4, mb 1 / 2): v4 with the wide pair table, whose unused right halves (128 bytes of
//       each 256-byte row) hold the stages' x rows (kXInLut: x row r of a stage slot is a right
//       half, 256 bytes from the next), so 2 CTAs of 8 warps fit per SM beside the 64 KB table.
//       mb 1 serves M <= 16 without the zero rows of a 32-row tile.
template <int V>
struct MmaVar;
// What every variant shares unless it says otherwise.
struct MmaVarBase {
    static constexpr bool kXInLut = false;
};
template <>
struct MmaVar<0> : MmaVarBase {
    static constexpr int kBK = 2, kStages = 4, kMinBlocks = 2;
    static constexpr bool kFastLoad = false, kScaleLut = false, kWideLut = false;
};
template <>
struct MmaVar<1> : MmaVarBase {
    static constexpr int kBK = 2, kStages = 6, kMinBlocks = 1;
    static constexpr bool kFastLoad = true, kScaleLut = true, kWideLut = true;
};
template <>
struct MmaVar<2> : MmaVarBase {
    static constexpr int kBK = 4, kStages = 4, kMinBlocks = 1;
    static constexpr bool kFastLoad = true, kScaleLut = true, kWideLut = true;
};
template <>
struct MmaVar<3> : MmaVarBase {
    static constexpr int kBK = 2, kStages = 4, kMinBlocks = 2;
    static constexpr bool kFastLoad = false, kScaleLut = false, kWideLut = false;
};
template <>
struct MmaVar<4> : MmaVarBase {
    static constexpr int kBK = 2, kStages = 4, kMinBlocks = 2;
    static constexpr bool kFastLoad = true, kScaleLut = true, kWideLut = false;
};
template <>
struct MmaVar<5> {
    static constexpr int kBK = 2, kStages = 4, kMinBlocks = 2;
    static constexpr bool kFastLoad = true, kScaleLut = true, kWideLut = true;
    static constexpr bool kXInLut = true;
};
constexpr int kMmaVariants = 6;

// Quantization blocks per stage of variant v (0 for an unknown variant).
constexpr int mma_stage_blocks_of(int v) {
    return v == 0   ? MmaVar<0>::kBK
           : v == 1 ? MmaVar<1>::kBK
           : v == 2 ? MmaVar<2>::kBK
           : v == 3 ? MmaVar<3>::kBK
           : v == 4 ? MmaVar<4>::kBK
           : v == 5 ? MmaVar<5>::kBK
                    : 0;
}

using ptx::cp_async16;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::ldmatrix_x4;
using ptx::mma16816;
using ptx::smem_u32;

// 16-byte async copy to a 32-bit shared address; zfill != 0 zero-fills the destination instead
// (the ignore-src predicate: one LDGSTS.ZFILL, no source-size arithmetic per copy).
__device__ __forceinline__ void cp_async16_zf(uint32_t dst, const void* src, uint32_t zfill) {
    asm volatile(
        "{\n .reg .pred z;\n setp.ne.b32 z, %2, 0;\n cp.async.cg.shared.global [%0], [%1], 16, z;\n}\n" ::"r"(dst),
        "l"(src), "r"(zfill));
}

template <int K, int MB, int TW, int V = 0>
struct MmaCfg {
    static constexpr int kBK = MmaVar<V>::kBK;            // quantization blocks per stage
    static constexpr int kStages = MmaVar<V>::kStages;
    static constexpr int kHalves = kBK / 2;               // x tile: [kHalves][kRows][64 elements]
    static constexpr int kRows = 16 * MB;                 // x rows per row tile
    static constexpr int kCols = kTileN * TW;             // features per row tile
    static constexpr int kNS = 2 * TW;                    // n8 sub-tiles per warp
    static constexpr int kWarpsPerTile = kMmaWarps / TW;  // warps per layout tile
    static constexpr bool kLut = K <= 4;
    static constexpr bool kScaleLut = kLut && MmaVar<V>::kScaleLut;
    static constexpr bool kWideLut = kLut && MmaVar<V>::kWideLut;
    static constexpr int kPairWords = kWideLut ? kWideLutWords : kLutWords;  // pair table words
    static constexpr int kLutBytes = (kLut ? kPairWords * 4 : 0) + (kScaleLut ? 256 * 4 : 0);  // pair + scale tables
    static constexpr int kBWords = TW * kBK * K * kTileN;  // per stage: [TW][BK][K][128]
    // x rows: in the stage (128 bytes apart) or, kXInLut, in the pair table's right halves (one
    // row per table row, 256 bytes apart; slot s starts at table row s * kHalves * kRows).
    static constexpr bool kXInLut = kWideLut && MmaVar<V>::kXInLut;
    static constexpr int kARowBytes = kXInLut ? 256 : 128;
    static constexpr int kABytes = kXInLut ? 0 : kRows * kBK * 32 * 2;  // per stage (16-bit x)
    static constexpr int kAbsBytes = TW * kBK * kTileN;    // per stage: [TW][BK][128]
    static constexpr int kStageBytes = kBWords * 4 + kABytes + kAbsBytes;
    static constexpr int kBytes = kLutBytes + kStageBytes * kStages;
    static constexpr int kMinBlocks = MmaVar<V>::kMinBlocks;
    static_assert(kBK % 2 == 0 && kStageBytes % 16 == 0 && kLutBytes % 16 == 0 && kNS * 8 * kWarpsPerTile == kTileN,
                  "bad MMA tile");
    static_assert(!kScaleLut || kMmaThreads == 256, "one scale table entry per thread");
    static_assert(!kXInLut || kStages * kHalves * kRows <= 256, "x slots past the table");
};

// NS adjacent plane words / absmax bytes of one lane (NS = 2 or 4).
template <int NS>
struct Words;
template <>
struct Words<2> {
    using V = uint2;
    __device__ static uint32_t at(const uint2& v, int s) { return s ? v.y : v.x; }
    __device__ static uint32_t abs(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
};
template <>
struct Words<4> {
    using V = uint4;
    __device__ static uint32_t at(const uint4& v, int s) { return s == 0 ? v.x : s == 1 ? v.y : s == 2 ? v.z : v.w; }
    __device__ static uint32_t abs(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
};

// NS adjacent floats into an fp32 accumulator in L2 (16-byte aligned for NS = 4, 8 for NS = 2).
template <int NS>
__device__ __forceinline__ void red_add_ns(float* dst, const float (&v)[NS]) {
    if constexpr (NS == 4) {
        red_add4(dst, v[0], v[1], v[2], v[3]);
    } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(dst), "f"(v[0]), "f"(v[1]) : "memory");
#else
        atomicAdd(dst, v[0]);
        atomicAdd(dst + 1, v[1]);
#endif
    }
}

template <int NS>
__device__ __forceinline__ void st_ns(float* dst, const float (&v)[NS]) {
    if constexpr (NS == 4) {
        __stcg(reinterpret_cast<float4*>(dst), make_float4(v[0], v[1], v[2], v[3]));
    } else {
        __stcg(reinterpret_cast<float2*>(dst), make_float2(v[0], v[1]));
    }
}

template <int NS>
__device__ __forceinline__ void ld_ns(const float* src, float (&v)[NS]) {
    if constexpr (NS == 4) {
        const float4 f = __ldcg(reinterpret_cast<const float4*>(src));
        v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    } else {
        const float2 f = __ldcg(reinterpret_cast<const float2*>(src));
        v[0] = f.x, v[1] = f.y;
    }
}

template <typename T, int K, int MB, int TW, int V>
__global__ void __launch_bounds__(kMmaThreads, MmaCfg<K, MB, TW, V>::kMinBlocks) mma_sk_kernel(
    const T* __restrict__ x, const uint32_t* __restrict__ packed_t, const uint8_t* __restrict__ absmax_t,
    const float* __restrict__ codebook, const T* __restrict__ bias, T* __restrict__ y, int M, int N, int nb,
    int det, float* __restrict__ ws, int* __restrict__ counters) {
    using S = MmaCfg<K, MB, TW, V>;
    constexpr int NS = S::kNS;
    constexpr int kBK = S::kBK;
    constexpr int kStages = S::kStages;
    extern __shared__ __align__(16) unsigned char smem_mma[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane & 3, col8 = lane >> 2;
    const int tw_w = warp / S::kWarpsPerTile;                        // layout tile of this warp in the row tile
    const int wbase = (warp - tw_w * S::kWarpsPerTile) * NS * 8;     // first feature of the warp in that tile
    const int n_tiles = (N + kTileN - 1) / kTileN;
    const int n_rt = (n_tiles + TW - 1) / TW;                        // row tiles along N
    const int nst = (nb + kBK - 1) / kBK;
    const int m_tiles = (M + S::kRows - 1) / S::kRows;
    const long long ctas = gridDim.x, cta = blockIdx.x;
    const long long units = static_cast<long long>(m_tiles) * n_rt * nst;
    const int u0 = static_cast<int>(sk_start(cta, units, ctas));
    const int u1 = static_cast<int>(sk_start(cta + 1, units, ctas));
    const int in_f = nb * 32;
    uint32_t* tbl = reinterpret_cast<uint32_t*>(smem_mma);
    unsigned char* stages = smem_mma + S::kLutBytes;

    // Load cursor: the next unit to stage is always the previous one + 1 (prologue u0, u0 + 1, ..;
    // then u + kStages - 1 per iteration), so (row tile, stage) advance without a division
    // except when a row tile ends (the divisions were ~1/8 of the instructions per unit).
    int l_rt = u0 / nst, l_st = u0 - l_rt * nst;
    int l_mt = l_rt / n_rt, l_t0 = (l_rt - l_mt * n_rt) * TW;
    constexpr int kTileChunks = kBK * K * kTileN / 4;  // 16-byte chunks of one tile's planes per stage
    constexpr int kAbsChunks = S::kAbsBytes / 16;
    constexpr int kAbsTileChunks = kBK * kTileN / 16;
    // Every address computed from (row tile, stage): all of variant 0's loads, and the other
    // variants' last stage of a row tile when nb is no multiple of kBK (jn < kBK blocks).
    // Shared address of x row 0, half 0 of stage slot `slot` (rows kARowBytes apart).
    auto a_slot = [&](int slot) -> uint32_t {
        if constexpr (S::kXInLut) {
            return smem_u32(smem_mma) + static_cast<uint32_t>(slot * S::kHalves * S::kRows * 256 + 128);
        } else {
            return smem_u32(stages + slot * S::kStageBytes + S::kBWords * 4);
        }
    };
    auto load_generic = [&](unsigned char* base, int slot, int mt, int t0, int j0) {
        const int jn = min(kBK, nb - j0);  // valid blocks in this stage
#pragma unroll
        for (int tw = 0; tw < TW; ++tw) {
            const bool tile_ok = t0 + tw < n_tiles;
            const uint32_t* src = packed_t + (static_cast<size_t>(t0 + tw) * nb + j0) * K * kTileN;
            for (int c = tid; c < kTileChunks; c += kMmaThreads) {
                const bool ok = tile_ok && c * 4 < jn * K * kTileN;
                cp_async16(base + (tw * kTileChunks + c) * 16, ok ? src + c * 4 : packed_t, ok);
            }
        }
        unsigned char* abs_s = base + S::kBWords * 4 + S::kABytes;
        for (int c = tid; c < kAbsChunks; c += kMmaThreads) {
            const int tw = c / kAbsTileChunks, cc = c - tw * kAbsTileChunks;
            const bool ok = t0 + tw < n_tiles && cc * 16 < jn * kTileN;
            const uint8_t* src = absmax_t + (static_cast<size_t>(t0 + tw) * nb + j0) * kTileN + cc * 16;
            cp_async16(abs_s + c * 16, ok ? src : absmax_t, ok);
        }
        // x rows mt*kRows.., 32 * kBK elements from column j0*32, as kHalves tiles of 64 columns:
        // 8 chunks of 16 B per row and half, swizzled.
        const uint32_t a_s = a_slot(slot);
        const int m0 = mt * S::kRows;
        constexpr int kHalfChunks = S::kRows * 8;
        constexpr int kAChunks = kHalfChunks * S::kHalves;
        for (int c = tid; c < kAChunks; c += kMmaThreads) {
            const int h = S::kHalves == 1 ? 0 : c / kHalfChunks, hc = S::kHalves == 1 ? c : c - h * kHalfChunks;
            const int r = hc >> 3, ch = hc & 7;
            const bool ok = (m0 + r < M) && (h * 8 + ch < jn * 4);
            const T* src =
                ok ? x + static_cast<size_t>(m0 + r) * in_f + static_cast<size_t>(j0) * 32 + (h * 8 + ch) * 8 : x;
            cp_async16_zf(a_s + (h * S::kRows + r) * S::kARowBytes + ((ch ^ (r & 7)) << 4), src, ok ? 0u : 1u);
        }
    };

    // Fast loads (variants 1, 2, 4): per row tile, each thread's source pointers and zero-fill flags
    // (a tile past N / a row past M; their pointers are clamped to tile / row 0, valid for every
    // full stage); every full stage then issues its copies from those pointers,
    // advanced by constant strides, to fixed shared offsets of the stage slot.
    constexpr bool kFast = MmaVar<V>::kFastLoad;
    constexpr int kBPer = kFast ? (kTileChunks + kMmaThreads - 1) / kMmaThreads : 1;  // chunks per thread and tile
    constexpr int kXRows = kFast ? (MB + 1) / 2 : 1;  // x rows per thread (chunk rows tid/8 + 32j)
    constexpr bool kXHalfThreads = kFast && MB == 1;  // 16 rows: threads 0..127 copy x
    static_assert(!kFast || ((MB % 2 == 0 || MB == 1) && kAbsChunks <= kMmaThreads), "fast loads: MB 1, 2 or 4");
    const uint32_t* pb[TW];
    uint32_t zfb[TW];
    const uint8_t* pa = absmax_t;
    uint32_t zfa = 1;
    const T* px[kXRows];
    uint32_t zfx[kXRows];
    const uint32_t stages_s = smem_u32(stages);
    // Per-thread shared offsets inside a stage slot: B chunk (tw, i) at tw * kTileChunks * 16 +
    // tid * 16 + i * 4096; absmax at kBWords * 4 + kABytes + tid * 16; x row j, half h at
    // a_slot(slot) + (h * kRows + 32 j) * kARowBytes + xoff.
    const int xr = tid >> 3, xch = tid & 7;
    const uint32_t xoff = static_cast<uint32_t>(xr * S::kARowBytes + ((xch ^ (xr & 7)) << 4));
    auto fast_setup = [&](int mt, int t0, int j0) {
#pragma unroll
        for (int tw = 0; tw < TW; ++tw) {
            const bool ok = t0 + tw < n_tiles;
            pb[tw] = packed_t + (static_cast<size_t>(ok ? t0 + tw : 0) * nb + j0) * K * kTileN + tid * 4;
            zfb[tw] = ok ? 0u : 1u;
        }
        {
            const int tw = tid / kAbsTileChunks, cc = tid - tw * kAbsTileChunks;
            const bool ok = tid < kAbsChunks && t0 + tw < n_tiles;
            pa = absmax_t + (static_cast<size_t>(ok ? t0 + tw : 0) * nb + j0) * kTileN + (ok ? cc * 16 : 0);
            zfa = ok ? 0u : 1u;
        }
        const int m0 = mt * S::kRows;
#pragma unroll
        for (int j = 0; j < kXRows; ++j) {
            const bool ok = m0 + xr + 32 * j < M;
            px[j] = x + static_cast<size_t>(ok ? m0 + xr + 32 * j : 0) * in_f + static_cast<size_t>(j0) * 32 + xch * 8;
            zfx[j] = ok ? 0u : 1u;
        }
    };
    auto fast_issue = [&](uint32_t sb, int slot) {
#pragma unroll
        for (int tw = 0; tw < TW; ++tw)
#pragma unroll
            for (int i = 0; i < kBPer; ++i)
                if ((i + 1) * kMmaThreads <= kTileChunks || tid + i * kMmaThreads < kTileChunks)
                    cp_async16_zf(sb + (tw * kTileChunks + tid + i * kMmaThreads) * 16, pb[tw] + i * kMmaThreads * 4,
                                  zfb[tw]);
        if (kAbsChunks == kMmaThreads || tid < kAbsChunks)
            cp_async16_zf(sb + S::kBWords * 4 + S::kABytes + tid * 16, pa, zfa);
        const uint32_t xa_s = a_slot(slot) + xoff;
#pragma unroll
        for (int h = 0; h < S::kHalves; ++h)
#pragma unroll
            for (int j = 0; j < kXRows; ++j)
                if (!kXHalfThreads || tid < S::kRows * 8)
                    cp_async16_zf(xa_s + (h * S::kRows + j * 32) * S::kARowBytes, px[j] + h * 64, zfx[j]);
#pragma unroll
        for (int tw = 0; tw < TW; ++tw) pb[tw] += kBK * K * kTileN;
        pa += kBK * kTileN;
#pragma unroll
        for (int j = 0; j < kXRows; ++j) px[j] += kBK * 32;
    };
    if constexpr (kFast) fast_setup(l_mt, l_t0, l_st * kBK);

    auto load_stage = [&](int slot) {
        unsigned char* base = stages + slot * S::kStageBytes;
        const int mt = l_mt, t0 = l_t0;
        const int j0 = l_st * kBK;
        const bool row_end = ++l_st == nst;
        if (row_end) {
            l_st = 0;
            ++l_rt;
            l_mt = l_rt / n_rt;
            l_t0 = (l_rt - l_mt * n_rt) * TW;
        }
        if constexpr (kFast) {
            if (j0 + kBK <= nb) {
                fast_issue(stages_s + slot * S::kStageBytes, slot);
            } else {
                load_generic(base, slot, mt, t0, j0);
            }
            if (row_end) fast_setup(l_mt, l_t0, 0);
        } else {
            load_generic(base, slot, mt, t0, j0);
        }
    };

    // The table is built while the previous kernel may still run (PDL, pdl.cuh); the stages carry x
    // and follow pdl_wait. The loop's first barrier publishes the table.
    pdl_trigger();
    float cbl = 0.f;
    if constexpr (S::kLut) {
        if constexpr (S::kWideLut) {
            build_wide_lut<K, T>(tbl, codebook);
        } else {
            build_pair_lut<K, T>(tbl, codebook, tid, kMmaThreads);
        }
        if constexpr (S::kScaleLut) {  // scale pair of absmax byte tid (kMmaThreads == 256)
            const float sc = decode_e4m4_fast(static_cast<uint32_t>(tid));
            tbl[S::kPairWords + tid] = pack2<T>(sc, sc);
        }
    } else {
        cbl = lane_codebook<K>(codebook, lane);
    }
    pdl_wait();
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (u0 + s < u1) load_stage(s);
        cp_async_commit();
    }
    const uint32_t lane4 = static_cast<uint32_t>(lane) * 4u;
    const char* tblc = reinterpret_cast<const char*>(tbl);

    float acc[MB][NS][4];
#pragma unroll
    for (int i = 0; i < MB; ++i)
#pragma unroll
        for (int s = 0; s < NS; ++s)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][s][q] = 0.f;

    // Row tile of the current segment and whether the segment began at its first unit.
    const int rt_first = u0 / nst;
    int rt = rt_first;
    bool seg_from_start = u0 == rt * nst;
    const int lcol = tw_w * kTileN + wbase + NS * col8;  // this lane's B columns in the row tile
    // Partial row tiles in the fp32 scratch: variant 0 keeps the row tile's row-major layout
    // (NS adjacent columns per vector, which are NS different accumulator quads); the others
    // store each accumulator quad acc[i][s][0..3] as one float4 at [warp][i][s][lane] (a layout
    // private to the kernel). The row-major vectors made ptxas keep the accumulators in
    // transposed register quads across the main loop and move all of them twice per iteration
    // (2 IMAD.MOV per HMMA at mb 4, tw 2) to meet the HMMA register quads.
    constexpr bool kFragWs = V != 0;
    auto frag_off = [&](int i, int s) { return ((warp * MB + i) * NS + s) * 128 + lane * 4; };
    // Stage slots read / written next (variant 0: from the iteration count modulo kStages).
    int rd_slot = 0, wr_slot = kStages - 1;

    // Outer loop: one segment (this CTA's units of one row tile) per pass; the inner loop is the
    // pipelined main loop alone, so the accumulators keep fixed registers around its back edge
    // (with the epilogue inside one loop the allocator moved them with ~2 moves per HMMA).
    for (int u = u0; u < u1;) {
        const int seg_end = min(u1, (rt + 1) * nst);
        for (; u < seg_end; ++u) {
            const int itn = u - u0;
            cp_async_wait<kStages - 2>();
            __syncthreads();
            {
                const int nxt = u + kStages - 1;
                if constexpr (V == 0) {
                    if (nxt < u1) load_stage((itn + kStages - 1) % kStages);
                } else {
                    if (nxt < u1) load_stage(wr_slot);
                    wr_slot = wr_slot == kStages - 1 ? 0 : wr_slot + 1;
                }
                cp_async_commit();
            }
            const int slot = V == 0 ? itn % kStages : rd_slot;
            if constexpr (V != 0) rd_slot = rd_slot == kStages - 1 ? 0 : rd_slot + 1;
            const unsigned char* base = stages + slot * S::kStageBytes;
            const uint32_t* b_s = reinterpret_cast<const uint32_t*>(base) + tw_w * kBK * K * kTileN;
            const uint32_t a_base = a_slot(slot);
            const uint8_t* abs_s = base + S::kBWords * 4 + S::kABytes + tw_w * kBK * kTileN;
            const int c0 = wbase + NS * col8;  // column in the layout tile
#pragma unroll
            for (int blk = 0; blk < kBK; ++blk) {
                // x half of this block and the block's place in it
                const uint32_t a_half = a_base + (blk >> 1) * S::kRows * S::kARowBytes;
                const int hb = blk & 1;
                using Wd = Words<NS>;
                typename Wd::V pw[K];
#pragma unroll
                for (int b = 0; b < K; ++b)
                    pw[b] = *reinterpret_cast<const typename Wd::V*>(b_s + (blk * K + b) * kTileN + c0);
                const uint32_t ab = Wd::abs(abs_s + blk * kTileN + c0);
                if constexpr (S::kLut) {
                    // Group words and scales first; each k16 half's B registers only when its MMAs run
                    // (8 fewer live registers at NS = 4: at the 128-register cap the allocator was
                    // shuffling accumulators with ~2 moves per HMMA).
                    uint32_t gw[NS], s2[NS];
#pragma unroll
                    for (int s = 0; s < NS; ++s) {
                        uint32_t p[K];
#pragma unroll
                        for (int b = 0; b < K; ++b) p[b] = Wd::at(pw[b], s);
                        if constexpr (S::kScaleLut) {
                            gw[s] = group_word<K>(p, g);
                            s2[s] = tbl[S::kPairWords + __byte_perm(ab, 0u, 0x4440u | s)];  // byte s of ab
                        } else {
                            const float sc = decode_e4m4_fast((ab >> (8 * s)) & 0xFFu);
                            gw[s] = group_word<K>(p, g);
                            s2[s] = pack2<T>(sc, sc);
                        }
                    }
#pragma unroll
                    for (int kk = 0; kk < 2; ++kk) {
                        uint32_t bf[NS][2];  // b0, b1 of k16 half kk
#pragma unroll
                        for (int s = 0; s < NS; ++s) {
                            uint32_t o0, o1;
                            if constexpr (S::kWideLut) {  // pair bytes 2kk, 2kk + 1 of the group word
                                const uint32_t v = gw[s];
                                o0 = wide_lut_off(v, 2 * kk, lane4);
                                o1 = wide_lut_off(v, 2 * kk + 1, lane4);
                            } else {
                                o0 = kk == 0 ? lut_off<0>(gw[s], lane4) : lut_off<2>(gw[s], lane4);
                                o1 = kk == 0 ? lut_off<1>(gw[s], lane4) : lut_off<3>(gw[s], lane4);
                            }
                            bf[s][0] = mul2<T>(*reinterpret_cast<const uint32_t*>(tblc + o0), s2[s]);
                            bf[s][1] = mul2<T>(*reinterpret_cast<const uint32_t*>(tblc + o1), s2[s]);
                        }
                        mma_k16<T, MB, NS, S::kARowBytes>(acc, a_half, 0, hb, kk, lane, bf);
                    }
                } else {
                    uint32_t bf[NS][4];  // [n8 sub-tile][b0, b1 of k16 #0, b0, b1 of k16 #1]
#pragma unroll
                    for (int s = 0; s < NS; ++s) {
                        uint32_t p[K];
#pragma unroll
                        for (int b = 0; b < K; ++b) p[b] = Wd::at(pw[b], s);
                        shfl_b4<T, K>(p, g, cbl, decode_e4m4_fast((ab >> (8 * s)) & 0xFFu), bf[s]);
                    }
#pragma unroll
                    for (int kk = 0; kk < 2; ++kk) {
                        uint32_t bk[NS][2];
#pragma unroll
                        for (int s = 0; s < NS; ++s) bk[s][0] = bf[s][2 * kk], bk[s][1] = bf[s][2 * kk + 1];
                        mma_k16<T, MB, NS, S::kARowBytes>(acc, a_half, 0, hb, kk, lane, bk);
                    }
                }
            }
        }
        const int st = u - 1 - rt * nst;  // stage of the segment's last unit

        // End of this CTA's segment of row tile rt. Fragment (i, s, q): row 16i + lane/4 + 8(q>>1),
        // column lcol + NS*(2g + (q&1)) - NS*col8 + s of the row tile: for fixed (i, q), NS adjacent columns.
        const int mt = rt / n_rt, t0 = (rt - mt * n_rt) * TW;
        const int fcol0 = t0 * kTileN + lcol - NS * col8;  // feature of (s = 0, n = 0)
        const int tcol0 = lcol - NS * col8;                // row-tile column of (s = 0, n = 0)
        bool write = true;
        if (!(seg_from_start && st == nst - 1)) {
            // Partial: publish, count, and let the last CTA of the row tile finish it.
            const long long first = static_cast<long long>(rt) * nst, lastu = first + nst - 1;
            const long long wf = sk_owner(first, units, ctas), wl = sk_owner(lastu, units, ctas);
            constexpr int kTileFloats = S::kRows * S::kCols;
            float* mine = det ? ws + (static_cast<size_t>(cta) * 2 + (rt == rt_first ? 0 : 1)) * kTileFloats
                              : ws + static_cast<size_t>(rt) * kTileFloats;
            if constexpr (kFragWs) {
#pragma unroll
                for (int i = 0; i < MB; ++i)
#pragma unroll
                    for (int s = 0; s < NS; ++s) {
                        float* dst = mine + frag_off(i, s);
                        if (det) {
                            __stcg(reinterpret_cast<float4*>(dst),
                                   make_float4(acc[i][s][0], acc[i][s][1], acc[i][s][2], acc[i][s][3]));
                        } else {
                            red_add4(dst, acc[i][s][0], acc[i][s][1], acc[i][s][2], acc[i][s][3]);
                        }
                    }
            } else {
#pragma unroll
                for (int i = 0; i < MB; ++i)
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        float v[NS];
#pragma unroll
                        for (int s = 0; s < NS; ++s) v[s] = acc[i][s][q];
                        const int rr = 16 * i + (lane >> 2) + 8 * (q >> 1);
                        float* dst = mine + rr * S::kCols + tcol0 + NS * (2 * g + (q & 1));
                        if (det) {
                            st_ns<NS>(dst, v);
                        } else {
                            red_add_ns<NS>(dst, v);
                        }
                    }
            }
            write = sk_cta_arrive_last(counters + rt, static_cast<int>(wl - wf));
            if (write) {
                if (det) {
#pragma unroll
                    for (int i = 0; i < MB; ++i)
#pragma unroll
                        for (int s = 0; s < NS; ++s)
#pragma unroll
                            for (int q = 0; q < 4; ++q) acc[i][s][q] = 0.f;
                    for (long long c = wf; c <= wl; ++c) {  // fixed CTA order; each CTA's loads independent
                        const bool head = sk_start(c, units, ctas) >= first;
                        const float* src = ws + (static_cast<size_t>(c) * 2 + (head ? 0 : 1)) * kTileFloats;
                        if constexpr (kFragWs) {
#pragma unroll
                            for (int i = 0; i < MB; ++i)
#pragma unroll
                                for (int s = 0; s < NS; ++s) {
                                    const float4 v = __ldcg(reinterpret_cast<const float4*>(src + frag_off(i, s)));
                                    acc[i][s][0] += v.x, acc[i][s][1] += v.y, acc[i][s][2] += v.z, acc[i][s][3] += v.w;
                                }
                        } else {
#pragma unroll
                            for (int i = 0; i < MB; ++i)
#pragma unroll
                                for (int q = 0; q < 4; ++q) {
                                    const int rr = 16 * i + (lane >> 2) + 8 * (q >> 1);
                                    float v[NS];
                                    ld_ns<NS>(src + rr * S::kCols + tcol0 + NS * (2 * g + (q & 1)), v);
#pragma unroll
                                    for (int s = 0; s < NS; ++s) acc[i][s][q] += v[s];
                                }
                        }
                    }
                } else if constexpr (kFragWs) {
#pragma unroll
                    for (int i = 0; i < MB; ++i)
#pragma unroll
                        for (int s = 0; s < NS; ++s) {
                            const float4 v = sk_take4(reinterpret_cast<float4*>(mine + frag_off(i, s)));
                            acc[i][s][0] = v.x, acc[i][s][1] = v.y, acc[i][s][2] = v.z, acc[i][s][3] = v.w;
                        }
                } else {
#pragma unroll
                    for (int i = 0; i < MB; ++i)
#pragma unroll
                        for (int q = 0; q < 4; ++q) {
                            const int rr = 16 * i + (lane >> 2) + 8 * (q >> 1);
                            float* src = mine + rr * S::kCols + tcol0 + NS * (2 * g + (q & 1));
                            float v[NS];
                            ld_ns<NS>(src, v);
                            const float z[NS] = {};
                            st_ns<NS>(src, z);
#pragma unroll
                            for (int s = 0; s < NS; ++s) acc[i][s][q] = v[s];
                        }
                }
            }
        }
        if (write) {
            float bv[2][NS];
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int s = 0; s < NS; ++s) {
                    const int c = fcol0 + NS * (2 * g + h) + s;
                    bv[h][s] = (bias != nullptr && c < N) ? to_float(bias[c]) : 0.f;
                }
            const bool vec = N % NS == 0;
#pragma unroll
            for (int i = 0; i < MB; ++i)
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const int r = mt * S::kRows + 16 * i + (lane >> 2) + 8 * (q >> 1);
                    const int c = fcol0 + NS * (2 * g + (q & 1));
                    if (r >= M) continue;
                    T* dst = y + static_cast<size_t>(r) * N + c;
                    if (vec && c + NS <= N) {
                        uint32_t w[NS / 2];
#pragma unroll
                        for (int s = 0; s < NS; s += 2)
                            w[s / 2] = pack2<T>(acc[i][s][q] + bv[q & 1][s], acc[i][s + 1][q] + bv[q & 1][s + 1]);
                        if constexpr (NS == 4) {
                            *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
                        } else {
                            *reinterpret_cast<uint32_t*>(dst) = w[0];
                        }
                    } else {
#pragma unroll
                        for (int s = 0; s < NS; ++s)
                            if (c + s < N) dst[s] = from_float<T>(acc[i][s][q] + bv[q & 1][s]);
                    }
                }
        }
#pragma unroll
        for (int i = 0; i < MB; ++i)
#pragma unroll
            for (int s = 0; s < NS; ++s)
#pragma unroll
                for (int q = 0; q < 4; ++q) acc[i][s][q] = 0.f;
        ++rt;
        seg_from_start = true;
    }
    cp_async_wait<0>();
}

template <typename T, int K, int MB, int TW, int V>
const void* mma_kernel_ptr() {
    return reinterpret_cast<const void*>(mma_sk_kernel<T, K, MB, TW, V>);
}

template <typename T, int K, int MB, int TW, int V>
int launch_mma_kmt(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int M, int N,
                   int nb, void* y, int ctas, int det, float* ws, int* counters, cudaStream_t stream) {
    using S = MmaCfg<K, MB, TW, V>;
    auto kern = mma_sk_kernel<T, K, MB, TW, V>;
    if (S::kBytes > 48 * 1024) {
        const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kBytes);
        if (e != cudaSuccess) return static_cast<int>(e);
    }
    return pdl_launch(kern, dim3(ctas), dim3(kMmaThreads), S::kBytes, stream, static_cast<const T*>(x),
                      static_cast<const uint32_t*>(pt), at, cb, static_cast<const T*>(bias), static_cast<T*>(y), M, N,
                      nb, det, ws, counters);
}

// Returns CALL(k, mb, tw, variant) for an instantiated (k, mb, tw, variant); falls through
// otherwise. Variant 0: every k, mb 1/2/4, tw 1/2; variants 1..4: every k, mb 2/4, tw 2;
// variant 5: k 2..4, mb 1/2, tw 2.
#define KBIT_MMA_DISPATCH(CALL)                                                         \
    if (k < 2 || k > 5 || (mb != 1 && mb != 2 && mb != 4) || (tw != 1 && tw != 2)) {   \
    } else if (variant == 0) switch (k * 100 + mb * 10 + tw) {                          \
        case 211: return CALL(2, 1, 1, 0); case 212: return CALL(2, 1, 2, 0);           \
        case 221: return CALL(2, 2, 1, 0); case 222: return CALL(2, 2, 2, 0);           \
        case 241: return CALL(2, 4, 1, 0); case 242: return CALL(2, 4, 2, 0);           \
        case 311: return CALL(3, 1, 1, 0); case 312: return CALL(3, 1, 2, 0);           \
        case 321: return CALL(3, 2, 1, 0); case 322: return CALL(3, 2, 2, 0);           \
        case 341: return CALL(3, 4, 1, 0); case 342: return CALL(3, 4, 2, 0);           \
        case 411: return CALL(4, 1, 1, 0); case 412: return CALL(4, 1, 2, 0);           \
        case 421: return CALL(4, 2, 1, 0); case 422: return CALL(4, 2, 2, 0);           \
        case 441: return CALL(4, 4, 1, 0); case 442: return CALL(4, 4, 2, 0);           \
        case 511: return CALL(5, 1, 1, 0); case 512: return CALL(5, 1, 2, 0);           \
        case 521: return CALL(5, 2, 1, 0); case 522: return CALL(5, 2, 2, 0);           \
        case 541: return CALL(5, 4, 1, 0); case 542: return CALL(5, 4, 2, 0);           \
        default: break;                                                                 \
    } else switch (variant * 1000 + k * 100 + mb * 10 + tw) {                           \
        case 1222: return CALL(2, 2, 2, 1); case 1242: return CALL(2, 4, 2, 1);         \
        case 1322: return CALL(3, 2, 2, 1); case 1342: return CALL(3, 4, 2, 1);         \
        case 1422: return CALL(4, 2, 2, 1); case 1442: return CALL(4, 4, 2, 1);         \
        case 1522: return CALL(5, 2, 2, 1); case 1542: return CALL(5, 4, 2, 1);         \
        case 2222: return CALL(2, 2, 2, 2); case 2242: return CALL(2, 4, 2, 2);         \
        case 2322: return CALL(3, 2, 2, 2); case 2342: return CALL(3, 4, 2, 2);         \
        case 2422: return CALL(4, 2, 2, 2); case 2442: return CALL(4, 4, 2, 2);         \
        case 2522: return CALL(5, 2, 2, 2); case 2542: return CALL(5, 4, 2, 2);         \
        case 3222: return CALL(2, 2, 2, 3); case 3242: return CALL(2, 4, 2, 3);         \
        case 3322: return CALL(3, 2, 2, 3); case 3342: return CALL(3, 4, 2, 3);         \
        case 3422: return CALL(4, 2, 2, 3); case 3442: return CALL(4, 4, 2, 3);         \
        case 3522: return CALL(5, 2, 2, 3); case 3542: return CALL(5, 4, 2, 3);         \
        case 4222: return CALL(2, 2, 2, 4); case 4242: return CALL(2, 4, 2, 4);         \
        case 4322: return CALL(3, 2, 2, 4); case 4342: return CALL(3, 4, 2, 4);         \
        case 4422: return CALL(4, 2, 2, 4); case 4442: return CALL(4, 4, 2, 4);         \
        case 4522: return CALL(5, 2, 2, 4); case 4542: return CALL(5, 4, 2, 4);         \
        case 5212: return CALL(2, 1, 2, 5); case 5222: return CALL(2, 2, 2, 5);         \
        case 5312: return CALL(3, 1, 2, 5); case 5322: return CALL(3, 2, 2, 5);         \
        case 5412: return CALL(4, 1, 2, 5); case 5422: return CALL(4, 2, 2, 5);         \
        default: break;                                                                 \
    }

template <typename T>
int mma_ctas_per_sm_impl(int k, int mb, int tw, int variant) {
    const void* f = nullptr;
    int smem = 0;
#define KBIT_MMA_PTR(KK, MM, TT, VV) \
    (f = mma_kernel_ptr<T, KK, MM, TT, VV>(), smem = MmaCfg<KK, MM, TT, VV>::kBytes, 0)
    [&]() -> int { KBIT_MMA_DISPATCH(KBIT_MMA_PTR) return 0; }();
#undef KBIT_MMA_PTR
    if (f == nullptr) return 0;
    return resident_ctas(f, kMmaThreads, smem);
}

}  // namespace

// Quantization blocks per stage (work unit) of an MMA variant; 0 for an unknown variant.
int mma_stage_blocks(int variant) {
    return variant >= 0 && variant < kMmaVariants ? mma_stage_blocks_of(variant) : 0;
}

// Resident CTAs per SM of the MMA kernel for (k, mb, tw, variant), for sizing a one-wave grid;
// 0 on error or where that combination is not instantiated.
template <typename T>
int mma_ctas_per_sm(int k, int mb, int tw, int variant) {
    return mma_ctas_per_sm_impl<T>(k, mb, tw, variant);
}
template int mma_ctas_per_sm<half>(int, int, int, int);
template int mma_ctas_per_sm<__nv_bfloat16>(int, int, int, int);

// mb: x rows per row tile / 16 (1, 2, 4); tw: 128-feature layout tiles per row tile (1, 2);
// variant: 0 (default) or 1..4 (mb 2 / 4, tw 2 only; see MmaVar), bk = mma_stage_blocks(variant);
// ctas: grid size, 1..units where units = ceil(M / 16mb) * ceil(n_tiles / tw) * ceil(nb / bk).
// counters: ceil(M / 16mb) * ceil(n_tiles / tw) int32, zero on entry, left zero. ws: det == 0, a
// zeroed fp32 accumulator of units / ceil(nb / bk) row tiles of 16mb x 128tw floats (left zero);
// det != 0, 2 * ctas such row tiles (any contents).
template <typename T>
int launch_mma(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int k, int M,
               int N, int nb, void* y, int mb, int tw, int variant, int ctas, int det, float* ws, int* counters,
               cudaStream_t s) {
    if (M == 0 || N <= 0) return 0;
    const int bk = mma_stage_blocks(variant);
    if (nb <= 0 || M < 0 || ctas < 1 || ws == nullptr || counters == nullptr || (tw != 1 && tw != 2) ||
        (mb != 1 && mb != 2 && mb != 4) || bk == 0)
        return static_cast<int>(cudaErrorInvalidValue);
    const long long n_rt = ((N + kTileN - 1) / kTileN + tw - 1) / tw;
    const long long units = (M + 16LL * mb - 1) / (16LL * mb) * n_rt * ((nb + bk - 1) / bk);
    if (ctas > units || units > (1LL << 30)) return static_cast<int>(cudaErrorInvalidValue);
#define KBIT_MMA_LAUNCH(KK, MM, TT, VV) \
    launch_mma_kmt<T, KK, MM, TT, VV>(x, pt, at, cb, bias, M, N, nb, y, ctas, det, ws, counters, s)
    KBIT_MMA_DISPATCH(KBIT_MMA_LAUNCH)
#undef KBIT_MMA_LAUNCH
    return static_cast<int>(cudaErrorInvalidValue);
}

#undef KBIT_MMA_DISPATCH

template int launch_mma<half>(const void*, const void*, const uint8_t*, const float*, const void*, int, int, int, int,
                              void*, int, int, int, int, int, float*, int*, cudaStream_t);
template int launch_mma<__nv_bfloat16>(const void*, const void*, const uint8_t*, const float*, const void*, int, int,
                                       int, int, void*, int, int, int, int, int, float*, int*, cudaStream_t);

}  // namespace kbit
