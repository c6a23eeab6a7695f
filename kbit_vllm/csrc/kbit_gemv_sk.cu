// kbit stream-K GEMV, M = 1..4 rows of x, k = 2..5: y[m, n] = sum_i x[m, i] * W[n, i] (+ bias).
//
// Work unit = (tile of 128 rows, one 32-wide input block). The tiled layout stores the units in
// (tile, block) order, each as k planes of 128 words, so unit u's planes start at word u * 128k.
// All units are split into equal contiguous ranges, one per warp of a grid that fills the GPU
// once (stream-K), so every SM gets the same number of units whatever the shape. A lane owns 4
// rows: it reads one uint4 per plane (rows 4l..4l+3) and one word of absmax per unit, and it
// prefetches the next unit (M=2: the next two) into registers while it decodes the current one. A
// pair of codes becomes its table address in one byte permute (the pair byte next to the lane's
// byte offset, in a table with a 256-byte row per entry), then one shared load and one half2 FMA.
// At M <= 4, where each CTA has enough units, every warp stages its units' x blocks in shared
// memory as fp16 times a power of two per row (XS below); otherwise x is read straight from global
// memory (a warp-uniform address, so one L1 transaction per 16 bytes), bf16 turned into fp16 times
// a power of two per row (chosen from the row's max |x| by each CTA up front). Either way, no block
// barrier after the table is built, and bf16 runs the same half2 FMA loop as fp16 instead of
// converting every weight pair to fp32.
//
// A warp's range covers at most two partial tiles (its head and its tail) and any number of
// whole tiles between them. Whole tiles are written directly. Partials are added into a zeroed
// fp32 accumulator per tile row (vector reductions in L2, no waiting); the last warp to finish a
// tile (per-tile counter) converts the sums, writes y, and leaves accumulator and counter zero.
// The order of those fp32 additions varies from run to run, so the low bits of y may too;
// backends/cuda/dispatch.py picks the cluster GEMV (fixed order) in deterministic mode.
//
// k = 5 (SkCfg): its pair codes are 10 bits, and a table with a lane copy per bank (no conflicts,
// as the wide table for k <= 4) takes 128 KB, so a CTA holds that table and the staged x slots
// beside it: one CTA of 16 warps per SM (k <= 4: three of 8), 128 registers a thread at most.
// H200 (bf16 M=1 behind a writer of x), 4096x28672 25.7 us against 43.5 for the best k=5 kernel
// before it (the tensor-core GEMV on an 8-copy table), 1.40x the floor (k=4: 1.47x).
#include "kbit_sk.cuh"
#include "pdl.cuh"

#include <type_traits>

namespace kbit {

// From each thread's max |x| per row: the CTA's x_pow2_scale per row. Starts and ends with a block
// barrier's worth of ordering: call it from every thread.
template <int W, int M>
__device__ __forceinline__ void block_scales(const float (&mx)[M], float (&xscale)[M], float (&xinv)[M]) {
    __shared__ float red[W][M];
    __shared__ float sc[2][M];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int m = 0; m < M; ++m) {
        const float v = warp_max(mx[m]);
        if (lane == 0) red[warp][m] = v;
    }
    __syncthreads();
    if (threadIdx.x < M) {
        float v = 0.f;
        for (int w = 0; w < W; ++w) v = fmaxf(v, red[w][threadIdx.x]);
        x_pow2_scale(v, sc[0][threadIdx.x], sc[1][threadIdx.x]);
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < M; ++m) {
        xscale[m] = sc[0][m];
        xinv[m] = sc[1][m];
    }
}

// Per row m of x: bf16 -> block_scales over the whole row; fp16 x keeps scale 1. Ends with a
// block barrier. W: warps per CTA.
template <typename T, int W, int M>
__device__ __forceinline__ void row_scales(const T* __restrict__ x, int in_f, float (&xscale)[M], float (&xinv)[M]) {
    if constexpr (std::is_same<T, half>::value) {
        __syncthreads();
#pragma unroll
        for (int m = 0; m < M; ++m) xscale[m] = xinv[m] = 1.f;
    } else {
        float mx[M];
#pragma unroll
        for (int m = 0; m < M; ++m) {
            const uint4* row = reinterpret_cast<const uint4*>(x + static_cast<size_t>(m) * in_f);
            mx[m] = 0.f;
            for (int q = threadIdx.x; q < in_f / 8; q += blockDim.x) {
                mx[m] = fmaxf(mx[m], bf16x8_absmax(__ldg(row + q)));
            }
        }
        block_scales<W, M>(mx, xscale, xinv);
    }
}

template <typename T, int M>
__device__ __forceinline__ void sk_store_rows(T* __restrict__ y, const T* __restrict__ bias, int N, int row0,
                                              const float (&v)[4][M], const float (&xinv)[M]) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int row = row0 + r;
        if (row < N) {
            const float bv = bias != nullptr ? to_float(bias[row]) : 0.f;
#pragma unroll
            for (int m = 0; m < M; ++m)
                y[static_cast<size_t>(m) * N + row] = from_float<T>(fmaf(v[r][m], xinv[m], bv));
        }
    }
}

// x is staged at M <= 4 (see gemv_sk_kernel's XS) when each CTA has at least kStageXMinUnits units to
// amortize the staging pass. H200 (benchmarks/RESULTS.md, session 6, staged per CTA then), k=4 bf16
// M=1 us without -> with: 4096x28672 (72 units per CTA) 26.0 -> 23.3, 14336x4096 (36) 16.7 ->
// 15.3, 4096x6144 (15.5) 9.7 -> 9.2, 4096x4096 (10) 8.0 -> 8.4, 2048x5120 (6.5) 6.6 -> 6.9.
constexpr int kStageXMinUnits = 12;
// Staging slots (one 32-wide block of x each) per warp (SkCfg::kXsWarpSlots), shared by its M
// rows: a warp with more units than a row's share reads x from global memory instead (k <= 4, M=1:
// more than 64 * 8 * CTAs units, 4096 inputs x 203k rows on an H200).

// Units a warp loads ahead of the one it sums (into registers): two at M = 2 (k <= 4; ~125
// registers, so two CTAs per SM), one otherwise. H200 session 37, behind a writer, stream-K µs one /
// two ahead: M=2 fp16 k=4 4096x28672 28.5 / 27.3, 14336x4096 20.0 / 17.6, 4096x6144 13.5 / 11.7,
// bf16 k=4 4096x28672 31.6 / 28.9, 14336x4096 23.3 / 21.0; at M = 3, 4 two ahead lost 0.4-1.5
// everywhere (M=4 4096x28672 fp16 34.2 / 36.1), at M=1 session 21 found it 1 µs slower on 4096x28672.
template <int K, int M>
constexpr int kSkAhead = M == 2 && K <= 4 ? 2 : 1;

// XS: each of the M rows' share of a warp's staging slots (above), an even count so every row's
// slot sits at one uint4 offset from row 0's (staged_x_word pairs slots in a table row).
template <int K, int M>
constexpr int kXsRowSlots = (SkCfg<K>::kXsWarpSlots / M) & ~1;

// XS (M <= 4, at most kXsWarpSlots / M units per warp, rounded down to even): each warp stages the
// x blocks of its own units (consecutive blocks from its first unit's, at most nb of them) as
// scaled fp16 in its own kXsWarpSlots slots (SkCfg::x_word; row m in the m-th such share), at its
// own scale per row (a warp max: no block barrier on the way), so the unit loop reads x from shared
// memory instead of every lane converting (bf16) or reading from L1 (fp16) every x word of every
// unit. fp16 x is scaled too, so both run sk_unit's one flush per block. Each warp multiplies its
// partial sums by its own inverses before they meet other warps' in the accumulator.
// H200 session 38, behind a writer, k=4 stream-K µs x read per unit / staged: M=3 bf16 4096x28672
// 37.9 / 27.2, 14336x4096 27.4 / 19.0, 4096x6144 15.4 / 12.3; fp16 31.1 / 26.6, 19.3 / 17.9; M=4 bf16
// 45.1 / 32.4, 32.1 / 21.2.
template <typename T, int K, int M, bool XS = false>
__global__ void __launch_bounds__(SkCfg<K>::kThreads, K == 5 ? 1 : M == 1 ? 3 : 2) gemv_sk_kernel(
    const T* __restrict__ x, const uint4* __restrict__ packed_t, const uint32_t* __restrict__ absmax_t,
    const float* __restrict__ codebook, const T* __restrict__ bias, T* __restrict__ y, int N, int nb,
    float* __restrict__ accum, int* __restrict__ counters) {
    static_assert(K >= 2 && K <= 5, "table GEMV takes k = 2..5");
    using C = SkCfg<K>;
    constexpr int kXsWarpSlots = C::kXsWarpSlots;
    constexpr int kAhead = kSkAhead<K, M>;
    constexpr int kRowSlots = kXsRowSlots<K, M>;  // XS: row m of x in slots m * kRowSlots.. of the warp's
    static_assert(!XS || kRowSlots >= 2, "XS stages each row in an even share of the warp's slots");
    extern __shared__ uint4 smem_sk[];
    uint32_t* tbl = reinterpret_cast<uint32_t*>(smem_sk);
    const int lane = threadIdx.x & 31;
    const long long warps = static_cast<long long>(gridDim.x) * C::kWarps;
    const long long w = static_cast<long long>(blockIdx.x) * C::kWarps + (threadIdx.x >> 5);
    const long long units = static_cast<long long>((N + kTileN - 1) / kTileN) * nb;
    const long long u0 = sk_start(w, units, warps), u1 = sk_start(w + 1, units, warps);

    pdl_trigger();
    // Weights, codebook and table only until pdl_wait (pdl.cuh): the first unit's loads and the
    // table build overlap the previous kernel's tail. XS loads its x first and builds the table and
    // requests the first unit only once that x is in: behind a kernel without PDL (vLLM's norms)
    // nothing overlaps, and the prologue waits on x (the codebook's round trip runs beside it), not
    // on weights queued ahead of it (H200, bf16 M=1 behind such a kernel: building under the x loads
    // took 4096x28672 23.2 -> 22.1 us, 14336x4096 15.4 -> 14.7; without XS, where x is read in the
    // unit loop, the earlier build is faster).
    const float cbl = lane_codebook<K>(codebook, lane);
    uint4 p[K], p1[K];  // units u and (kAhead = 2) u + 1
    uint32_t a, a1 = 0;
    auto load_first_units = [&] {  // the loop's first kAhead units into p (and p1)
        sk_load<K>(packed_t, absmax_t, u0, lane, p, a);
        if (kAhead == 2 && u0 + 1 < u1) sk_load<K>(packed_t, absmax_t, u0 + 1, lane, p1, a1);
    };
    if constexpr (!XS) {
        load_first_units();
        sk_build_table<K>(tbl, cbl, C::kThreads);
    }
    pdl_wait();
    int t = static_cast<int>(u0 / nb), j = static_cast<int>(u0 - static_cast<long long>(t) * nb);
    const int slot0 = (threadIdx.x >> 5) * kXsWarpSlots;  // XS: this warp's first x slot
    float xscale[M], xinv[M];
    if constexpr (XS) {
        // Per warp: x in (up to kXsLoads uint4 per lane in flight, raw bf16 into the slots while the
        // max is taken), then its first unit requested, its scale and the conversion of the slots
        // each lane wrote itself, then the table; one block barrier (for the table) before the loop.
        // H200 session 23 (per-warp timestamps, .carry/diag/s22_sk.cu): staged per CTA, x waited
        // behind the table build and two barriers of block_scales, and the loop started ~3.0 us
        // after entry; per warp, 4096x28672 20.4 -> 19.8 us, 14336x4096 13.3 -> 12.9, 4096x128256
        // (40 units per warp, two load rounds) 71.5 either way.
        constexpr int kXsLoads = 4;
        constexpr bool kHalf = std::is_same<T, half>::value;
        const int cnt = static_cast<int>(u1 - u0 < nb ? u1 - u0 : nb);
        auto slot_of = [&](int m, int q) -> uint4* {  // uint4 q of row m's blocks: slot q / 4, quarter q % 4
            return reinterpret_cast<uint4*>(tbl + C::x_word(slot0 + m * kRowSlots + (q >> 2))) + (q & 3);
        };
        float mx[M];
#pragma unroll
        for (int m = 0; m < M; ++m) {
            const uint4* xq = reinterpret_cast<const uint4*>(x + static_cast<size_t>(m) * nb * 32);
            mx[m] = 0.f;
            for (int base = 0; base < cnt * 4; base += kXsLoads * 32) {  // warp-uniform
                uint4 v[kXsLoads];
#pragma unroll
                for (int r = 0; r < kXsLoads; ++r) {
                    const int q = base + r * 32 + lane;
                    if (q < cnt * 4) {
                        int jb = j + (q >> 2);
                        if (jb >= nb) jb -= nb;
                        v[r] = __ldg(xq + jb * 4 + (q & 3));
                    }
                }
#pragma unroll
                for (int r = 0; r < kXsLoads; ++r) {
                    const int q = base + r * 32 + lane;
                    if (q < cnt * 4) {
                        *slot_of(m, q) = v[r];
                        mx[m] = fmaxf(mx[m], kHalf ? h8_absmax(v[r]) : bf16x8_absmax(v[r]));
                    }
                }
            }
        }
        // The first unit's weights only once x is in: requested earlier, the 396 CTAs' first units
        // (6.5 MB on 4096x28672) sit in the memory queues ahead of the slower warps' x (per-warp
        // timestamps, H200 session 22).
        load_first_units();
#pragma unroll
        for (int m = 0; m < M; ++m) {
            x_pow2_scale(warp_max(mx[m]), xscale[m], xinv[m]);
            for (int q = lane; q < cnt * 4; q += 32) {
                uint4* sl = slot_of(m, q);
                *sl = kHalf ? h8_scaled(*sl, xscale[m]) : bf16x8_to_scaled_h8(*sl, xscale[m]);
            }
        }
        sk_build_table<K>(tbl, cbl, C::kThreads);
        __syncthreads();
    } else {
        row_scales<T, C::kWarps, M>(x, nb * 32, xscale, xinv);  // synchronizes the block
    }

    const uint32_t lane4 = static_cast<uint32_t>(lane) * 4u;
    const char* tblc = reinterpret_cast<const char*>(tbl);
    int xoff[M];  // uint4 offset of x row m: in global memory, or (XS) from row 0's slot to row m's
#pragma unroll
    for (int m = 0; m < M; ++m) xoff[m] = XS ? (C::x_word(m * kRowSlots) - C::x_word(0)) / 4 : m * nb * 4;
    const uint4* x4 = reinterpret_cast<const uint4*>(x);
    int j_first = j;
    [[maybe_unused]] int slot = slot0;  // XS: x slot of unit u (wraps after nb)
    [[maybe_unused]] const int slot_end = slot0 + nb;
    float acc[4][M];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[r][m] = 0.f;

    for (long long u = u0; u < u1; ++u) {
        uint4 pn[K];
        uint32_t an = 0;
        if (u + kAhead < u1) sk_load<K>(packed_t, absmax_t, u + kAhead, lane, pn, an);
        if constexpr (XS) {
            const uint4* xs = reinterpret_cast<const uint4*>(tbl + C::x_word(slot));
            sk_unit<T, K, M, false, true>(p, a, xs, xoff, tblc, lane4, acc);
            if (++slot == slot_end) slot -= nb;
        } else {
            sk_unit<T, K, M, !std::is_same<T, half>::value>(p, a, x4 + j * 4, xoff, tblc, lane4, acc, xscale);
        }
        if constexpr (kAhead == 2) {
#pragma unroll
            for (int b = 0; b < K; ++b) {
                p[b] = p1[b];
                p1[b] = pn[b];
            }
            a = a1;
            a1 = an;
        } else {
#pragma unroll
            for (int b = 0; b < K; ++b) p[b] = pn[b];
            a = an;
        }
        if (j != nb - 1 && u + 1 != u1) {
            ++j;
            continue;
        }
        // End of this warp's segment of tile t (units j_first..j).
        const int row0 = t * kTileN + 4 * lane;
        if (j_first == 0 && j == nb - 1) {
            sk_store_rows<T, M>(y, bias, N, row0, acc, xinv);
        } else {
            const long long tb = static_cast<long long>(t) * nb;
            float* tacc = accum + (static_cast<size_t>(t) * 32 + lane) * (4 * M);  // [r][m] per lane
            if constexpr (XS) {  // this warp's scale, undone before the partial meets other warps'
#pragma unroll
                for (int r = 0; r < 4; ++r)
#pragma unroll
                    for (int m = 0; m < M; ++m) acc[r][m] *= xinv[m];
            }
            sk_red_tile<M>(tacc, acc);
            const long long wf = sk_owner(tb, units, warps), wl = sk_owner(tb + nb - 1, units, warps);
            if (sk_warp_arrive_last(counters + t, static_cast<int>(wl - wf))) {  // last of this tile's warps
                float sum[4][M];
                sk_take_tile<M>(tacc, sum);
                float out_inv[M];  // XS: the partials are unscaled already
#pragma unroll
                for (int m = 0; m < M; ++m) out_inv[m] = XS ? 1.f : xinv[m];
                sk_store_rows<T, M>(y, bias, N, row0, sum, out_inv);
            }
        }
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
            for (int m = 0; m < M; ++m) acc[r][m] = 0.f;
        ++t;
        j = 0;
        j_first = 0;
    }
}

template <typename T, int K, int M, bool XS>
int launch_gemv_sk_kmx(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int N,
                       int nb, void* y, int ctas, float* ws, int* counters, cudaStream_t stream) {
    auto kern = gemv_sk_kernel<T, K, M, XS>;
    constexpr size_t smem = SkCfg<K>::kSmem;
    const cudaError_t attr =
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (attr != cudaSuccess) return static_cast<int>(attr);
    return pdl_launch(kern, dim3(ctas), dim3(SkCfg<K>::kThreads), smem, stream, static_cast<const T*>(x),
                      static_cast<const uint4*>(pt), reinterpret_cast<const uint32_t*>(at), cb,
                      static_cast<const T*>(bias), static_cast<T*>(y), N, nb, ws, counters);
}

template <typename T, int K, int M>
int launch_gemv_sk_km(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int N,
                      int nb, void* y, int ctas, float* ws, int* counters, cudaStream_t stream) {
    const long long units = static_cast<long long>((N + kTileN - 1) / kTileN) * nb;
    const long long warps = static_cast<long long>(ctas) * SkCfg<K>::kWarps;
    if (units >= static_cast<long long>(kStageXMinUnits) * ctas &&
        (units + warps - 1) / warps <= kXsRowSlots<K, M>)
        return launch_gemv_sk_kmx<T, K, M, true>(x, pt, at, cb, bias, N, nb, y, ctas, ws, counters, stream);
    return launch_gemv_sk_kmx<T, K, M, false>(x, pt, at, cb, bias, N, nb, y, ctas, ws, counters, stream);
}

template <typename T, int K>
int launch_gemv_sk_k(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int M,
                     int N, int nb, void* y, int ctas, float* ws, int* ctr, cudaStream_t s) {
    switch (M) {
        case 1: return launch_gemv_sk_km<T, K, 1>(x, pt, at, cb, bias, N, nb, y, ctas, ws, ctr, s);
        case 2: return launch_gemv_sk_km<T, K, 2>(x, pt, at, cb, bias, N, nb, y, ctas, ws, ctr, s);
        case 3: return launch_gemv_sk_km<T, K, 3>(x, pt, at, cb, bias, N, nb, y, ctas, ws, ctr, s);
        case 4: return launch_gemv_sk_km<T, K, 4>(x, pt, at, cb, bias, N, nb, y, ctas, ws, ctr, s);
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
}

// Warps per CTA of the stream-K GEMVs (dense and grouped: SkCfg) at k bits, by which the host sizes
// their grids; 0 for other k.
int gemv_sk_warps(int k) { return sk_shape(k).warps; }

// Resident CTAs per SM of the kernel for (k, M), for sizing a one-wave grid; 0 on error.
template <typename T>
int gemv_sk_ctas_per_sm(int k, int M) {
    const void* f = nullptr;
#define KBIT_SK_CASE(KK, MM) if (k == KK && M == MM) f = reinterpret_cast<const void*>(gemv_sk_kernel<T, KK, MM>);
    KBIT_SK_CASE(2, 1) KBIT_SK_CASE(2, 2) KBIT_SK_CASE(2, 3) KBIT_SK_CASE(2, 4)
    KBIT_SK_CASE(3, 1) KBIT_SK_CASE(3, 2) KBIT_SK_CASE(3, 3) KBIT_SK_CASE(3, 4)
    KBIT_SK_CASE(4, 1) KBIT_SK_CASE(4, 2) KBIT_SK_CASE(4, 3) KBIT_SK_CASE(4, 4)
    KBIT_SK_CASE(5, 1) KBIT_SK_CASE(5, 2) KBIT_SK_CASE(5, 3) KBIT_SK_CASE(5, 4)
#undef KBIT_SK_CASE
    if (f == nullptr) return 0;
    const SkShape s = sk_shape(k);
    return resident_ctas(f, s.warps * 32, s.smem);
}
template int gemv_sk_ctas_per_sm<half>(int, int);
template int gemv_sk_ctas_per_sm<__nv_bfloat16>(int, int);

// ctas * gemv_sk_warps(k) warps must not exceed the units (tiles * nb); ws holds tiles * 128 * M
// zeroed floats and counters one zeroed int per tile; both are left zeroed.
template <typename T>
int launch_gemv_sk(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int k,
                   int M, int N, int nb, void* y, int ctas, float* ws, int* counters, cudaStream_t s) {
    if (M == 0 || N <= 0) return 0;
    const long long units = static_cast<long long>((N + kTileN - 1) / kTileN) * nb;
    const int warps = sk_shape(k).warps;
    if (nb <= 0 || ctas < 1 || warps == 0 || static_cast<long long>(ctas) * warps > units || ws == nullptr ||
        counters == nullptr)
        return static_cast<int>(cudaErrorInvalidValue);
    switch (k) {
        case 2: return launch_gemv_sk_k<T, 2>(x, pt, at, cb, bias, M, N, nb, y, ctas, ws, counters, s);
        case 3: return launch_gemv_sk_k<T, 3>(x, pt, at, cb, bias, M, N, nb, y, ctas, ws, counters, s);
        case 4: return launch_gemv_sk_k<T, 4>(x, pt, at, cb, bias, M, N, nb, y, ctas, ws, counters, s);
        case 5: return launch_gemv_sk_k<T, 5>(x, pt, at, cb, bias, M, N, nb, y, ctas, ws, counters, s);
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
}

template int launch_gemv_sk<half>(const void*, const void*, const uint8_t*, const float*, const void*, int, int, int,
                                  int, void*, int, float*, int*, cudaStream_t);
template int launch_gemv_sk<__nv_bfloat16>(const void*, const void*, const uint8_t*, const float*, const void*, int,
                                           int, int, int, void*, int, float*, int*, cudaStream_t);

}  // namespace kbit
