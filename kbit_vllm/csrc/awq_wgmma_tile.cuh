// Pieces shared by the awq_orin Hopper wgmma kernels (awq_wgmma.cu, dense stream-K, and
// awq_grouped_wgmma.cu, MoE): the tile and slot sizes, the A-fragment dequant of a lane, the decode
// + wgmma of one landed stage, the TMA loads of a stage and the host's tensor maps. The design is
// described in awq_wgmma.cu's header.
#pragma once
#include "awq_common.cuh"
#include "wgmma_ptx.cuh"

namespace awq {

constexpr int kAwThreads = 256;                   // 2 warpgroups
constexpr int kAwCols = 256;                      // outputs per row tile (128 per warpgroup)
constexpr int kAwBK = 64;                         // inputs per stage (two k32 segments)
constexpr int kAwGroups = kAwCols / 8;            // column groups per row tile
constexpr int kAwWSeg = kAwGroups * 32 * 4;       // weight words of a segment: [32 column groups][128 bytes, swizzled]
constexpr int kAwSSeg = kAwCols * 4;              // scale / offset pairs of a segment

// Shared memory of the kernel with R x rows per row tile (the wgmma N: 16, 32 or 64; the host
// picks the smallest that holds M, so a decode batch of 16 runs n16 wgmmas, not n64 on zero rows;
// 128 past 64 rows, dense and grouped, and 160 or 192 (dense), at one CTA per SM: kOneCta).
// Smaller R leaves room for more slots (stages in flight) at 2 CTAs per SM.
template <int R>
struct AwCfg {
    static constexpr bool kOneCta = R >= 128;  // 128+ accumulators a thread leave no room for a second CTA
    static constexpr int kXBytes = R * kAwBK * 2;                          // x rows of a stage (128-byte swizzled)
    static constexpr int kSlotBytes = kXBytes + 2 * kAwWSeg + 2 * kAwSSeg;  // x, weights, scales: 18 KB at R = 64
    static constexpr int kSlots = R >= 64 ? 5 : 6;
    static constexpr int kAhead = kSlots - 2;  // stages loaded ahead: the wgmmas read x until 2 stages later
    static constexpr int kBarOff = kSlots * kSlotBytes;  // one mbarrier per slot: its stage has landed
    static constexpr int kBytes = 1024 + kBarOff + kSlots * 8;  // + alignment of the slots to 1024 bytes
    static constexpr int kTileFloats = R * kAwCols;
    static_assert(kXBytes % 1024 == 0 && kAwWSeg % 1024 == 0 && kSlotBytes % 1024 == 0,
                  "swizzled TMA boxes start on 1024-byte boundaries");
    static_assert(kAhead >= 1 && kTileFloats == R * kAwCols, "a stage in flight at least");
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

// Per-lane constants of the A fragments: warp w of a warpgroup owns outputs 32w..32w+31 of the
// warpgroup's 128 (awq_wgmma.cu's header has the layout).
struct AwLane {
    int g;         // lane % 4: the inputs 2g, 2g + 1 (+ 8) of a k16 half
    int fl;        // the lane's first output in the 256-output row tile (4 adjacent ones)
    int cgl, csw;  // its column group (row of the weight boxes) and that row's swizzle
    uint32_t sel;  // byte permute gathering its outputs' bytes from words (c, k), (c, k + 1)
    __device__ __forceinline__ static AwLane make(int tid) {
        const int lane = tid & 31, warp = tid >> 5, r8 = lane >> 2;
        AwLane L;
        L.g = lane & 3;
        L.fl = (warp >> 2) * 128 + 32 * (warp & 3) + 4 * r8;
        L.cgl = L.fl / 8;
        L.csw = L.cgl & 7;
        // Bytes h and 2 + h of each word, h = which half of the column group.
        const uint32_t hb = static_cast<uint32_t>(r8 & 1);
        L.sel = hb | ((2u + hb) << 4) | ((4u + hb) << 8) | ((6u + hb) << 12);
        return L;
    }
};

// Keeps the compiler from moving accumulator reads / writes across a wgmma issue or wait.
template <int R>
__device__ __forceinline__ void aw_fence_acc(float (&acc)[2][R / 2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int r = 0; r < R / 2; ++r) ptx::reg_fence(acc[i][r]);
}

#if defined(KBIT_WGMMA)
// Decodes one landed stage (slot at generic pointer base, shared address base_s) into A fragments
// and issues its 4 k16 halves as one commit group each (both m64 tiles): acc[i] += W x^T. Before
// decoding a half the warp waits until at most one group (the previous half's) is pending, as the
// group two halves back read the same A registers. The caller waits for all groups (wgmma_wait<0>)
// before it reads acc or reuses the slot more than one stage later.
template <typename T, int R>
__device__ __forceinline__ void aw_stage(const unsigned char* base, uint32_t base_s, const AwLane& L,
                                         float (&acc)[2][R / 2], uint32_t (&a)[2][2][4]) {
    const uint32_t* wseg = reinterpret_cast<const uint32_t*>(base + AwCfg<R>::kXBytes) + L.cgl * 32;
    // x of the stage as the B operand; k16 half kk starts 2 core matrices (256 bytes, 16 in
    // the descriptor's address field) further.
    const uint64_t desc0 = ptx::wgmma_desc_sw128(base_s);
#pragma unroll
    for (int seg = 0; seg < 2; ++seg) {
        // Scale / offset pairs of outputs f..f+3 in this segment's group: (s_f, s_f+1),
        // (b_f, b_f+1), (s_f+2, s_f+3), (b_f+2, b_f+3).
        const uint4 sv =
            *reinterpret_cast<const uint4*>(base + AwCfg<R>::kXBytes + 2 * kAwWSeg + seg * kAwSSeg + L.fl * 4);
#pragma unroll
        for (int kh = 0; kh < 2; ++kh) {
            const int kk = 2 * seg + kh;  // k16 half of the stage
            // Words 16 kh + 2g (inputs 2g, 2g + 1) and + 8 of this segment: 16-byte chunks
            // 4 kh + g / 2 and + 2 of the column group's row, swizzled by the row.
            const uint32_t* wrow = wseg + seg * (kAwWSeg / 4);
            const int c = 4 * kh + (L.g >> 1);
            const uint2 lo = *reinterpret_cast<const uint2*>(wrow + ((c ^ L.csw) << 2) + 2 * (L.g & 1));
            const uint2 hi = *reinterpret_cast<const uint2*>(wrow + (((c + 2) ^ L.csw) << 2) + 2 * (L.g & 1));
            const uint32_t vl = __byte_perm(lo.x, lo.y, L.sel), vh = __byte_perm(hi.x, hi.y, L.sel);
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
            aw_fence_acc<R>(acc);
            ptx::wgmma_fence();
            const uint64_t desc = desc0 + static_cast<uint64_t>(kk * 2);  // 32 bytes a k16 step
#pragma unroll
            for (int i = 0; i < 2; ++i) ptx::wgmma_m64k16<T, R>(acc[i], a[kk & 1][i], desc, 1);
            ptx::wgmma_commit();
            aw_fence_acc<R>(acc);
        }
    }
}

// A stage's 5 TMA boxes, issued by lane 0 of warps 0..4, one box each (part): one warp issuing all
// of them every stage held the other warps at the next block barrier (as in kbit_wgmma_tile.cuh's
// kw_load_part; RESULTS.md session 27). Part 0 expects the slot's bytes on bar and loads the x box
// (R rows from xrow, inputs k0..k0 + 63); part 1 + seg the weight box of segment seg (rows wrow..,
// column groups), part 3 + seg its scale pairs (columns scol.. of pair row srow0 + the segment's
// group). A box may land before part 0's expectation: the transaction count goes negative and the
// phase waits for the arrival.
constexpr int kAwLoadParts = 5;

template <int R>
__device__ __forceinline__ void aw_load_part(int part, uint32_t base, uint32_t bar, const CUtensorMap* tm_x,
                                             const CUtensorMap* tm_w, const CUtensorMap* tm_s, int k0, int xrow,
                                             int wrow, int srow0, int scol, int gshift) {
    if (part == 0) {
        ptx::mbar_arrive_expect_tx(bar, AwCfg<R>::kSlotBytes);
        ptx::tma_load_2d(base, tm_x, k0, xrow, bar);
    } else if (part <= 2) {
        const int seg = part - 1;
        ptx::tma_load_2d(base + AwCfg<R>::kXBytes + seg * kAwWSeg, tm_w, k0 + 32 * seg, wrow, bar);
    } else {
        const int seg = part - 3;
        ptx::tma_load_2d(base + AwCfg<R>::kXBytes + 2 * kAwWSeg + seg * kAwSSeg, tm_s, scol,
                         srow0 + ((k0 + 32 * seg) >> gshift), bar);
    }
}
#endif

// Host: the three tensor maps of the kernels. x [x_rows, in] in 64-input x R-row boxes (128-byte
// swizzle, the wgmma B layout); weight words [w_rows, in] (w_rows = out / 8 per expert, stacked)
// in 32 x 32 boxes (128-byte swizzle, conflict-free lane reads); scale / offset pair words
// [s_rows, out] (s_rows = in / group per expert, stacked) in 256 x 1 boxes.
template <typename T>
inline bool aw_tensor_maps(CUtensorMap* tmx, CUtensorMap* tmw, CUtensorMap* tms, const void* x, int x_rows,
                           const int32_t* wq, long long w_rows, const void* sz, long long s_rows, int in, int out,
                           int rows) {
    const CUtensorMapDataType xdt =
        std::is_same<T, half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    return ptx::encode_2d(tmx, xdt, x, in, x_rows, static_cast<uint64_t>(in) * 2, kAwBK, rows,
                          CU_TENSOR_MAP_SWIZZLE_128B) &&
           ptx::encode_2d(tmw, CU_TENSOR_MAP_DATA_TYPE_UINT32, wq, in, w_rows, static_cast<uint64_t>(in) * 4, 32,
                          kAwGroups, CU_TENSOR_MAP_SWIZZLE_128B) &&
           ptx::encode_2d(tms, CU_TENSOR_MAP_DATA_TYPE_UINT32, sz, out, s_rows, static_cast<uint64_t>(out) * 4,
                          kAwCols, 1, CU_TENSOR_MAP_SWIZZLE_NONE);
}

}  // namespace awq
