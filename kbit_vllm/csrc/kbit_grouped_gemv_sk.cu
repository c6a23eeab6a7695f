// kbit grouped stream-K GEMV (MoE, few rows per expert, k = 2..5): for every expert e and each of
// its rows r, y[r, :] = x[r, :] @ W_e^T, all experts in one launch, reading the stacked tiled
// layout packed_tiled [E, n_tiles, nb, k, 128] / absmax_tiled [E, n_tiles, nb, 128].
//
// Items: an expert with n rows has ceil(n / M) passes of M rows (moe::find_item with M rows per
// item); only experts with rows have items. Work unit = (item, tile of 128 features, 32-wide input
// block), numbered item-major, then tile, then block, so an item's units are its expert's tiled
// weights in memory order. Every warp counts the items from the device offsets itself, and all
// units are split into equal contiguous ranges, one per warp of a grid that fills the GPU once
// (stream-K): 8 active experts of 128 get the whole GPU, and nothing waits on empty experts. A
// later pass of the same expert re-reads its weights at about the same time (mostly L2 hits).
// An item of fewer rows than M (an expert's last pass) runs the unit body for just its rows, so a
// pass width above the typical rows per expert costs the experts with fewer rows nothing but a
// branch per unit (routing rarely spreads rows evenly: at 64 rows over 128 experts most active
// experts have one row, some two or three).
//
// The unit body, table and reductions are the dense stream-K GEMV's (kbit_sk.cuh). A warp's range
// covers at most two partial tiles (head and tail); whole tiles are stored directly; partial ones
// are added into a zeroed fp32 accumulator slot per (item, tile) in L2, and the last warp of a
// tile (per-slot counter) converts the sums, writes y, and leaves slot and counter zero. The
// order of those fp32 additions varies from run to run, so the low bits of y may too:
// backends/cuda picks the slot GEMV (kbit_grouped_gemv.cu, fixed order) in deterministic mode.
//
// bf16 x (vLLM's MoE dtype) is staged per CTA as scaled fp16 (XS, gsx_* below) wherever the grid
// bounds what a CTA stages, so bf16 runs fp16's half2 loop; H200 (benchmarks/RESULTS.md, session
// 16) qwen128 k=4 gate bf16 T=16 41.6 -> 33.2 us (fp16 32.4), T=8 25.9 -> 22.7.
// k = 5 looks its pair codes up in the 128 KB 32-copy table (SkLayout), one CTA of 16 warps per SM,
// as the dense stream-K GEMV does (SkCfg, kbit_sk.cuh).
#include "kbit_sk.cuh"
#include "moe_common.cuh"
#include "pdl.cuh"

#include <algorithm>
#include <type_traits>

namespace kbit {

namespace {

constexpr long long kGskMinUnits = 2;  // units per warp at least, so the table build is amortized

template <typename T, int M>
__device__ __forceinline__ void gsk_store(T* __restrict__ y, int N, int frow, int m0, int mr, const float (&v)[4][M]) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int row = frow + r;
        if (row < N) {
#pragma unroll
            for (int m = 0; m < M; ++m)
                if (m < mr) y[static_cast<size_t>(m0 + m) * N + row] = from_float<T>(v[r][m]);
        }
    }
}

// sk_unit for the item's mr rows (1..R, warp-uniform) into the first mr columns of acc; XS: xb
// points at staged scaled fp16 x in shared memory.
template <typename T, int K, int M, bool XS, int R = M>
__device__ __forceinline__ void gsk_unit(int mr, const uint4 (&p)[K], uint32_t a, const uint4* __restrict__ xb,
                                         const int (&xoff)[M], const char* tblc, uint32_t lane4, float (&acc)[4][M]) {
    if constexpr (R > 1) {
        if (mr < R) {
            gsk_unit<T, K, M, XS, R - 1>(mr, p, a, xb, xoff, tblc, lane4, acc);
            return;
        }
    }
    sk_unit<T, K, R, false, XS, M>(p, a, xb, xoff, tblc, lane4, acc);
}

// XS staging (bf16 x): the x rows of the items a CTA's units belong to, only the blocks those units
// read, once per CTA as fp16 times a power of two per row (x_pow2_scale of that row's staged
// blocks), in the slots of SkLayout::x_word (k <= 4: the wide table's unused right halves), so the
// unit loop runs sk_unit's half2 loop on shared x instead of the fp32 path on global bf16 x. Item i
// of the CTA (i = item - first item of the CTA, at most one per warp) stages its rows' blocks jb0,
// jb0 + 1, ... (mod nb), span of them, row m at slot base + m * stride (stride = span rounded up to
// even, so a row is a fixed uint4 offset from the previous one). The host launches XS only where the
// bound on the CTA's units keeps that within kStagedXSlots (gsx_wins).
// Items staged by a CTA of W warps: at most W (one warp finds each item's rows).
template <int M, int W>
struct GsxItems {
    int row0[W];    // x row of the item's first row
    int rows[W];    // its rows (1..M)
    int expert[W];  // its expert
    int jb0[W];     // first staged block
    int span[W];    // staged blocks per row
    int base[W];    // slot of row 0's first staged block
    unsigned mx[W * M];  // max |x| per staged row, as float bits
};
template <int K, int M>
using GsxOf = GsxItems<M, SkCfg<K>::kWarps>;

__device__ __forceinline__ int gsx_stride(int span) { return (span + 1) & ~1; }

// (item index in the CTA, row, staged block) of uint4 q of item i's staging and its shared word.
template <int K, int M>
__device__ __forceinline__ void gsx_slot(const GsxOf<K, M>& g, int i, int q, int nb, int& m, int& x_uint4,
                                         int& word) {
    const int per_row = g.span[i] * 4;
    m = q / per_row;
    const int rem = q - m * per_row, b = rem >> 2;
    int jb = g.jb0[i] + b;
    if (jb >= nb) jb -= nb;
    x_uint4 = (g.row0[i] + m) * nb * 4 + jb * 4 + (rem & 3);
    word = SkCfg<K>::x_word(g.base[i] + m * gsx_stride(g.span[i]) + b) + 4 * (rem & 3);
}

// Every thread of the CTA: the items of units [c0, c1) and their staging slots (n_it of them).
// Ends with a block barrier.
template <int K, int M>
__device__ __forceinline__ void gsx_items(GsxOf<K, M>& g, const int* offs, int n_exp, int rows, int nb,
                                          long long per_item, long long c0, long long c1, int n_it) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int item_a = static_cast<int>(c0 / per_item);
    if (n_it > SkCfg<K>::kWarps) __trap();  // the host's bound (gsx_wins) excludes it
    if (warp < n_it) {
        const int item = item_a + warp;
        moe::Item it;
        moe::find_item(offs, n_exp, rows, M, item, it);
        if (lane == 0) {
            const long long first = static_cast<long long>(item) * per_item;
            const long long ua = max(c0, first), ub = min(c1, first + per_item);
            g.row0[warp] = it.row0 + it.sub * M;
            g.rows[warp] = min(M, it.row1 - g.row0[warp]);
            g.expert[warp] = it.expert;
            g.jb0[warp] = static_cast<int>((ua - first) % nb);
            g.span[warp] = static_cast<int>(min(static_cast<long long>(nb), ub - ua));
        }
    }
    if (threadIdx.x < SkCfg<K>::kWarps * M) g.mx[threadIdx.x] = 0u;
    __syncthreads();
    if (threadIdx.x == 0) {
        int slots = 0;
        for (int i = 0; i < n_it; ++i) {
            g.base[i] = slots;
            slots += g.rows[i] * gsx_stride(g.span[i]);
        }
        if (slots > kStagedXSlots) __trap();  // likewise
    }
    __syncthreads();
}

// Every thread of the CTA, after gsx_items: stage x (see above) and build the pair table from the
// lane codebook under the first loads; x_in() runs once this thread's x words are in, before the
// first barrier. Ends with a block barrier.
template <int K, int M, typename XIn>
__device__ __forceinline__ void gsx_fill(GsxOf<K, M>& g, uint32_t* tbl, float cbl, const __nv_bfloat16* x, int nb,
                                         int n_it, XIn x_in) {
    // Raw bf16 words into their slots and each row's max, up to kLoads uint4 per thread in flight.
    constexpr int kLoads = 4;
    const uint4* x4 = reinterpret_cast<const uint4*>(x);
    const int nt = static_cast<int>(blockDim.x);
    bool built = false;
    for (int i = 0; i < n_it; ++i) {  // block-uniform
        const int n_q = g.rows[i] * g.span[i] * 4;
        for (int base = 0; base < n_q; base += kLoads * nt) {
            uint4 v[kLoads];
            int m[kLoads], word[kLoads];
#pragma unroll
            for (int r = 0; r < kLoads; ++r) {
                const int q = base + r * nt + static_cast<int>(threadIdx.x);
                word[r] = -1;
                if (q < n_q) {
                    int xu;
                    gsx_slot<K, M>(g, i, q, nb, m[r], xu, word[r]);
                    v[r] = __ldg(x4 + xu);
                }
            }
            if (!built) {  // under the first round's loads
                sk_build_table<K>(tbl, cbl, nt);
                built = true;
            }
#pragma unroll
            for (int r = 0; r < kLoads; ++r) {
                if (word[r] >= 0) {
                    *reinterpret_cast<uint4*>(tbl + word[r]) = v[r];
                    // >= 0: the float bits order as the values
                    atomicMax(&g.mx[i * M + m[r]], __float_as_uint(bf16x8_absmax(v[r])));
                }
            }
        }
    }
    x_in();
    __syncthreads();
    // Each thread scales the slots it wrote.
    for (int i = 0; i < n_it; ++i) {
        const int n_q = g.rows[i] * g.span[i] * 4;
        for (int q = static_cast<int>(threadIdx.x); q < n_q; q += nt) {
            int m, xu, word;
            gsx_slot<K, M>(g, i, q, nb, m, xu, word);
            float sc, inv;
            x_pow2_scale(__uint_as_float(g.mx[i * M + m]), sc, inv);
            uint4* s4 = reinterpret_cast<uint4*>(tbl + word);
            *s4 = bf16x8_to_scaled_h8(*s4, sc);
        }
    }
    __syncthreads();
}

template <typename T, int K, int M, bool XS>
__global__ void __launch_bounds__(SkCfg<K>::kThreads, SkCfg<K>::kWarps > kSkWarps ? 1 : M == 1 ? 3 : 2)
grouped_gemv_sk_kernel(
    const T* __restrict__ x, const uint4* __restrict__ packed_t, const uint32_t* __restrict__ absmax_t,
    const float* __restrict__ codebook, const int* __restrict__ offs, T* __restrict__ y, int n_exp, int rows, int N,
    int nb, int max_items, float* __restrict__ accum, int* __restrict__ counters) {
    static_assert(K >= 2 && K <= 5, "table GEMV takes k = 2..5");
    static_assert(!XS || std::is_same<T, __nv_bfloat16>::value, "XS stages bf16 x");
    constexpr int W = SkCfg<K>::kWarps;
    extern __shared__ uint4 smem_gsk[];
    __shared__ GsxOf<K, M> gsx;
    uint32_t* tbl = reinterpret_cast<uint32_t*>(smem_gsk);
    const int lane = threadIdx.x & 31;
    const int n_tiles = (N + kTileN - 1) / kTileN;
    const long long per_item = static_cast<long long>(n_tiles) * nb;
    pdl_trigger();
    // The table while the previous kernel may still run; offs, x, y after (pdl.cuh). XS builds it
    // from the lane codebook under its first loads of x instead (as the dense GEMV's XS).
    float cbl = 0.f;
    if constexpr (XS || K == 5)
        cbl = lane_codebook<K>(codebook, lane);
    if constexpr (!XS) {
        if constexpr (K == 5)
            sk_build_table<K>(tbl, cbl, SkCfg<K>::kThreads);
        else
            build_wide_lut<K>(tbl, codebook);
    }
    pdl_wait();
    const int items = min(moe::count_items(offs, n_exp, rows, M), max_items);  // grid-uniform
    const long long units = items * per_item;
    const long long warps =
        min(static_cast<long long>(gridDim.x) * W, max(1LL, units / kGskMinUnits));  // ranges never empty
    if (units == 0 || static_cast<long long>(blockIdx.x) * W >= warps) return;  // CTA-uniform
    const long long w = static_cast<long long>(blockIdx.x) * W + (threadIdx.x >> 5);
    const bool active = w < warps;  // warp-uniform

    long long u0 = 0, u1 = 0;
    int item = 0, t = 0, j = 0, expert = 0;
    uint4 p[K];
    uint32_t a = 0;
    if (active) {
        u0 = sk_start(w, units, warps);
        u1 = sk_start(w + 1, units, warps);
        item = static_cast<int>(u0 / per_item);
        const long long rem = u0 - item * per_item;
        t = static_cast<int>(rem / nb);
        j = static_cast<int>(rem - static_cast<long long>(t) * nb);
    }
    int item_a = 0;  // XS: the CTA's first item
    if constexpr (XS) {
        const long long cw0 = static_cast<long long>(blockIdx.x) * W;
        const long long c0 = sk_start(cw0, units, warps), c1 = sk_start(min(cw0 + W, warps), units, warps);
        item_a = static_cast<int>(c0 / per_item);
        const int n_it = static_cast<int>((c1 - 1) / per_item) - item_a + 1;
        gsx_items<K, M>(gsx, offs, n_exp, rows, nb, per_item, c0, c1, n_it);
        // The first unit's weights once this thread's x is in, under the barriers and the scaling:
        // requested before, they queue ahead of other CTAs' x (the dense GEMV's XS, session 22).
        if (active) expert = gsx.expert[item - item_a];
        gsx_fill<K, M>(gsx, tbl, cbl, reinterpret_cast<const __nv_bfloat16*>(x), nb, n_it, [&] {
            if (active)
                sk_load<K>(packed_t, absmax_t, (static_cast<long long>(expert) * n_tiles + t) * nb + j, lane, p, a);
        });
        if (!active) return;
    } else {
        if (active) {
            moe::Item it;
            moe::find_item(offs, n_exp, rows, M, item, it);
            expert = it.expert;
            sk_load<K>(packed_t, absmax_t, (static_cast<long long>(expert) * n_tiles + t) * nb + j, lane, p, a);
        }
        __syncthreads();  // the table
        if (!active) return;
    }

    const uint32_t lane4 = static_cast<uint32_t>(lane) * 4u;
    const char* tblc = reinterpret_cast<const char*>(tbl);
    const int x_stride4 = nb * 4;  // uint4 per x row
    const int nwarps = static_cast<int>(warps);
    int m0 = 0, mr = 0;  // this item's rows of x / y: [m0, m0 + mr)
    const uint4* xrow = nullptr;
    int s_base = 0, s_jb0 = 0, s_row4 = 0;  // XS: the item's staged slots (gsx), row stride in uint4
    float xinv[M];  // XS: the item's row scales undone
    auto set_rows = [&]() {
        if constexpr (XS) {
            const int i = item - item_a;
            m0 = gsx.row0[i];
            mr = gsx.rows[i];
            s_base = gsx.base[i];
            s_jb0 = gsx.jb0[i];
            // uint4 from one staged row to the next: stride slots (k <= 4: 32 words a slot pair apart)
            s_row4 = (SkCfg<K>::x_word(gsx_stride(gsx.span[i])) - SkCfg<K>::x_word(0)) / 4;
#pragma unroll
            for (int m = 0; m < M; ++m) {
                float sc;
                x_pow2_scale(__uint_as_float(gsx.mx[i * M + min(m, mr - 1)]), sc, xinv[m]);
            }
        } else {  // find_item again: nothing of it stays live across the unit body
            moe::Item it;
            moe::find_item(offs, n_exp, rows, M, item, it);
            m0 = it.row0 + it.sub * M;
            mr = min(M, it.row1 - m0);
            xrow = reinterpret_cast<const uint4*>(x) + static_cast<size_t>(m0) * x_stride4;
        }
    };
    set_rows();
    int j_first = j;
    float acc[4][M];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[r][m] = 0.f;

    for (int left = static_cast<int>(u1 - u0); left > 0; --left) {
        int jn = j + 1, tn = t;
        bool next_item = false;
        if (jn == nb) {
            jn = 0;
            if (++tn == n_tiles) {
                tn = 0;
                next_item = true;
            }
        }
        uint4 pn[K];
        uint32_t an = 0;
        if (left > 1) {
            int en = expert;
            if (next_item) {
                if constexpr (XS) {
                    en = gsx.expert[item + 1 - item_a];
                } else {
                    moe::Item itn;
                    moe::find_item(offs, n_exp, rows, M, item + 1, itn);
                    en = itn.expert;
                }
            }
            sk_load<K>(packed_t, absmax_t, (static_cast<long long>(en) * n_tiles + tn) * nb + jn, lane, pn, an);
            expert = en;
        }
        int xoff[M];
        const uint4* xb;
        if constexpr (XS) {
            int d = j - s_jb0;
            if (d < 0) d += nb;
            xb = reinterpret_cast<const uint4*>(tbl + SkCfg<K>::x_word(s_base + d));
#pragma unroll
            for (int m = 0; m < M; ++m) xoff[m] = min(m, mr - 1) * s_row4;
        } else {
            xb = xrow + j * 4;
#pragma unroll
            for (int m = 0; m < M; ++m) xoff[m] = min(m, mr - 1) * x_stride4;
        }
        gsk_unit<T, K, M, XS>(mr, p, a, xb, xoff, tblc, lane4, acc);
#pragma unroll
        for (int b = 0; b < K; ++b) p[b] = pn[b];
        a = an;
        if (jn != 0 && left > 1) {
            j = jn;
            continue;
        }
        // End of this warp's segment of tile t of the item (units j_first..j).
        if constexpr (XS) {  // the item's row scales, undone before the sums meet other CTAs'
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int m = 0; m < M; ++m) acc[r][m] *= xinv[m];
        }
        const int frow = t * kTileN + 4 * lane;
        if (j_first == 0 && j == nb - 1) {
            gsk_store<T, M>(y, N, frow, m0, mr, acc);
        } else {
            const long long slot = static_cast<long long>(item) * n_tiles + t;
            float* tacc = accum + (static_cast<size_t>(slot) * 32 + lane) * (4 * M);  // [r][m] per lane
            sk_red_tile<M>(tacc, acc);
            const long long tb = item * (static_cast<long long>(n_tiles) * nb) + static_cast<long long>(t) * nb;
            const long long n_units = static_cast<long long>(items) * n_tiles * nb;
            const long long wf = sk_owner(tb, n_units, nwarps), wl = sk_owner(tb + nb - 1, n_units, nwarps);
            if (sk_warp_arrive_last(counters + slot, static_cast<int>(wl - wf))) {  // last of this tile's warps
                float sum[4][M];
                sk_take_tile<M>(tacc, sum);
                gsk_store<T, M>(y, N, frow, m0, mr, sum);
            }
        }
        if (left == 1) break;
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
            for (int m = 0; m < M; ++m) acc[r][m] = 0.f;
        if (next_item) {
            ++item;
            set_rows();
        }
        t = tn;
        j = jn;
        j_first = 0;
    }
}

template <typename T, int K, int M, bool XS>
const void* gsk_kernel() {
    return reinterpret_cast<const void*>(grouped_gemv_sk_kernel<T, K, M, XS>);
}

// The kernel for (k, rows per pass); xs (bf16 only) the staged-x one.
template <typename T>
const void* gsk_pick(int k, int m, bool xs) {
    constexpr bool kBf16 = std::is_same<T, __nv_bfloat16>::value;
#define KBIT_GSK_CASE(KK, MM) \
    if (k == KK && m == MM) return xs ? gsk_kernel<T, KK, MM, kBf16>() : gsk_kernel<T, KK, MM, false>();
    KBIT_GSK_CASE(2, 1) KBIT_GSK_CASE(2, 2) KBIT_GSK_CASE(2, 3) KBIT_GSK_CASE(2, 4)
    KBIT_GSK_CASE(3, 1) KBIT_GSK_CASE(3, 2) KBIT_GSK_CASE(3, 3) KBIT_GSK_CASE(3, 4)
    KBIT_GSK_CASE(4, 1) KBIT_GSK_CASE(4, 2) KBIT_GSK_CASE(4, 3) KBIT_GSK_CASE(4, 4)
    KBIT_GSK_CASE(5, 1) KBIT_GSK_CASE(5, 2) KBIT_GSK_CASE(5, 3) KBIT_GSK_CASE(5, 4)
#undef KBIT_GSK_CASE
    return nullptr;
}

// Whether XS fits every CTA whatever the routing (and pays): a warp's range is at most max(3, ceil(max units /
// warps of the grid)) units (the kernel's warps = min(grid warps, units / kGskMinUnits)), so a CTA's
// at most 8 times that; such a range of consecutive units touches at most n_it items, and stages at
// most mp rows of min(units, nb) blocks (+1 for the even stride) per item.
// XS also needs kGsxMinHalfUnits / 2 units per warp of a CTA at the most items: with fewer the
// staging round trip and barriers cost what the half2 loop saves (H200, qwen128 k=4 bf16 (8 warps a
// CTA), 8 rows = 16 units per CTA: gate 8.8 / 8.9 us in bench_moe, 12.0 / 12.5 us per layer behind
// vLLM's kernels; 16 rows (31 per CTA) 11.4 / 11.2, 32 rows 17.2 / 15.8; k=5 (16 warps), 8 rows =
// 32 units per CTA: gate 11.3 / 10.0, 16 rows (46.5) 11.0 / 11.8).
constexpr long long kGsxMinHalfUnits = 5;

bool gsx_wins(int mp, int max_items, int n_tiles, int nb, int ctas, int warps) {
    const long long per_item = static_cast<long long>(n_tiles) * nb;
    const long long units = static_cast<long long>(max_items) * per_item;
    const long long grid_warps = static_cast<long long>(ctas) * warps;
    if (2 * units < kGsxMinHalfUnits * ctas * warps) return false;
    const long long range = warps * std::max(3LL, (units + grid_warps - 1) / grid_warps);
    const long long n_it = (range - 1 + per_item - 1) / per_item + 1;
    if (n_it > warps) return false;
    return mp * std::min(range + n_it, n_it * (nb + 1LL)) <= kStagedXSlots;
}

}  // namespace

// Resident CTAs per SM of the kernel for (k, rows per pass), for sizing a one-wave grid; 0 on error.
template <typename T>
int grouped_gemv_sk_ctas_per_sm(int k, int mp) {
    const void* f = gsk_pick<T>(k, mp, false);  // XS: the same registers bound, 0.2 KB more static shared
    if (f == nullptr) return 0;
    const SkShape s = sk_shape(k);
    return resident_ctas(f, s.warps * 32, s.smem);
}

// mp: rows per pass (1..4); max_items: an upper bound on the items, (rows + min(n_exp, rows) *
// (mp - 1)) / mp; ctas: grid size (one wave); accum: max_items * n_tiles * 128 * mp zeroed floats,
// counters: max_items * n_tiles zeroed ints (both left zeroed). offs: int32 [n_exp + 1] on the device.
template <typename T>
int launch_grouped_gemv_sk(const void* x, const void* pt, const uint8_t* at, const float* cb, const int* offs,
                           void* y, int k, int n_exp, int rows, int N, int nb, int mp, int max_items, int ctas,
                           float* accum, int* counters, cudaStream_t stream) {
    if (rows <= 0 || N <= 0) return 0;
    if (nb <= 0 || n_exp <= 0 || max_items < 1 || ctas < 1 || accum == nullptr || counters == nullptr)
        return static_cast<int>(cudaErrorInvalidValue);
    const int n_tiles = (N + kTileN - 1) / kTileN;
    const SkShape shape = sk_shape(k);
    const int warps = shape.warps, smem = shape.smem;
    const bool xs = std::is_same<T, __nv_bfloat16>::value && warps > 0 &&
                    gsx_wins(mp, max_items, n_tiles, nb, ctas, warps);
    const void* f = gsk_pick<T>(k, mp, xs);
    if (f == nullptr) return static_cast<int>(cudaErrorInvalidValue);
    const cudaError_t attr = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (attr != cudaSuccess) return static_cast<int>(attr);
    const T* xt = static_cast<const T*>(x);
    const uint4* p4 = static_cast<const uint4*>(pt);
    const uint32_t* a4 = reinterpret_cast<const uint32_t*>(at);
    T* yt = static_cast<T*>(y);
    void* args[] = {&xt, &p4, &a4, &cb, &offs, &yt, &n_exp, &rows, &N, &nb, &max_items, &accum, &counters};
    return pdl_launch_c(f, dim3(static_cast<unsigned>(ctas)), dim3(static_cast<unsigned>(warps * 32)), smem, stream,
                        args);
}

template int grouped_gemv_sk_ctas_per_sm<half>(int, int);
template int grouped_gemv_sk_ctas_per_sm<__nv_bfloat16>(int, int);
template int launch_grouped_gemv_sk<half>(const void*, const void*, const uint8_t*, const float*, const int*, void*,
                                          int, int, int, int, int, int, int, int, float*, int*, cudaStream_t);
template int launch_grouped_gemv_sk<__nv_bfloat16>(const void*, const void*, const uint8_t*, const float*, const int*,
                                                   void*, int, int, int, int, int, int, int, int, float*, int*,
                                                   cudaStream_t);

}  // namespace kbit
