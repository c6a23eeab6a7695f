// kbit tensor-core GEMM on Hopper (sm_90a wgmma), k = 2..5, for mid and large M:
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
//   tile at the end of N is not loaded and not stored). Warp w of a warpgroup owns features
//   32w..32w+31 of its layout tile as rows of two m64 tiles: lane row r = lane / 4 holds features
//   32w + 4r + 2i (A row r of m64 tile i) and 32w + 4r + 2i + 1 (A row r + 8), so a lane's plane
//   words and absmax bytes are 4 adjacent ones (one 16-byte and one 4-byte shared load) and its
//   accumulators hold 4 adjacent features per x row (one 8-byte store). (16 features per warp, one
//   m64 tile, ran ~1.5x the instructions per weight: RESULTS.md, session 8.)
// * Row tiles of R = 16, 32 or 64 x rows (the wgmma N; the host picks the smallest that holds M,
//   so small M does not pay n64 tensor work on zero rows), or 128 past 64 rows on large layers
//   (dispatch.wgmma_dense_rows): one decode of a stage then feeds twice the rows, at one CTA per SM
//   (128 accumulators a thread). A 128-row tile costs ~1.6x a 64-row one at k <= 4 and ~1.4x at
//   k = 5, whose decode is dearer: the kernel is bound by the latency of each warp's decode chain
//   at 2 warps a scheduler, not by the tensor cores (43% busy; RESULTS.md, session 29).
// * The tall tiles (R = 160, 192, kWgTallRows = 256): one 128-feature layout tile per row tile, one m64
//   tile of 64 features per warpgroup, so warp w of the CTA owns features 16w + 2r + {0, 1} (A rows
//   r, r + 8; 8-byte plane reads, 2-byte absmax reads, 4-byte stores) and runs m64n256k16 wgmmas:
//   each decoded weight feeds 256 rows at the same 128 accumulators a thread, so a warp decodes
//   half the weights per tensor work of the 128-row tile. Its groups are a block each (2 k16
//   halves, kw_stage_blocks), not a half: 7% faster. It costs ~2.7 64-row tiles against the 128-row
//   tile's ~1.55 (k = 5: ~2.35 on a 16-copy table, 4 slots of 38 KB beside it). The 192- and
//   160-row tall tiles (m64n192k16, m64n160k16) cost ~2.2 and ~1.95 (RESULTS.md, session 32).
//   The 320- and 384-row tiles (kw_nt: two row halves) issue two m64n160k16 / m64n192k16 on each
//   decoded A fragment, one per half, from two x boxes of 160 / 192 rows: one decode for all 320 /
//   384 rows at 160 / 192 accumulators a thread (218-255 registers, no spills; the 384-row tile
//   has room for 3 slots). They cost ~3.2 and ~3.9 64-row tiles (k = 5 ~3.0, ~3.35), against ~3.9
//   and ~4.4 for the two 160- or 192-row tiles they replace (RESULTS.md, session 33).
// * Stream-K over one wave, unit = (row tile, stage of 2 quantization blocks), row tile = (256
//   features, 128 in the tall tiles, R x rows), row tiles feature-major; partial row tiles as in
//   kbit_mma.cu: fp32 vector reductions into a zeroed accumulator, a per-tile counter, the last CTA
//   writes y and leaves both zero. (No deterministic mode: backends/cuda picks kbit_mma.cu there.)
// * Or split-K over a cluster (splits > 0, k <= 4 where dispatch.WGMMA_CK_RULES ask: layers of at
//   most 26 M weights at 33..64 rows): grid = row tiles x splits, one CTA an SM, a cluster of
//   `splits` CTAs per row tile, each summing an even share of its stages; the cluster's sums meet in
//   distributed shared memory (wgmma_cluster.cuh). On those layers stream-K's L2 reduction, counter
//   and read back cost about as much as the stages (RESULTS.md, session 49).
// * Loads are asynchronous copies that lane 0 of warps 0..4 issue, one copy each (kw_load_part),
//   and a per-slot mbarrier counts in bytes: a bulk copy of each layout tile's plane words and of
//   its absmax bytes (a stage's blocks are contiguous in the tiled layout) and a TMA box of the
//   stage's x rows (R rows x 64 inputs, 128-byte swizzle, read by the wgmmas through a swizzled
//   K-major descriptor; rows past M and inputs past the layer read as zeros). The pair table is the
//   compact one (one 128-byte row of 32 lane copies per pair code, 32 KB) from R = 64, with 3 slots
//   of x + weights + absmax beside it at R = 64, 2 CTAs per SM (128 registers); at R <= 32 it is the
//   64 KB table of 256-byte rows, whose lookup offset is one byte permute, with 4 slots at R = 16
//   and 3 at R = 32 (WgCfg has the measurements; before session 39 R = 64 ran 4 slots, R <= 32 6).
//   (cp.async from every thread, with x in a 64 KB table's spare halves, was the limiter:
//   RESULTS.md, session 9.) k = 5 looks its 10-bit pair codes up in a table of 32 lane
//   copies per code (128 KB, kbit_lut5.cuh: one bank per lane, as k <= 4) and runs one CTA per SM
//   with 4 / 6 / 6 slots at R = 64 / 32 / 16; the 8-copy table (32 KB, 2-3 wavefronts per lookup)
//   at two CTAs per SM was slower on every Llama layer and M = 16..128 (RESULTS.md, session 28).
// * Stages are loaded slots - 2 ahead of the one decoded (WgCfg::kAhead: 1 at k <= 4 and R = 32, 64,
//   else 2 or more): a slot is refilled only after every warp decoded it and waited for its
//   wgmmas (a block barrier sits between). Each k16 half's 2 wgmmas
//   (both m64 tiles) are one commit group with their own A registers; before decoding a half a
//   warp waits until at most one group (the other half's) is pending, so the tensor cores run one
//   half while the warp decodes the next.
#include "kbit_wgmma_tile.cuh"
#include "pdl.cuh"
#include "wgmma_cluster.cuh"

namespace kbit {

namespace {

template <typename T, int K, int R, int C5>
__global__ void __launch_bounds__(kWgThreads, WgCfg<K, R, C5, true>::kOneCta ? 1 : 2)
    wgmma_sk_kernel(const __grid_constant__ CUtensorMap tm_x, const uint32_t* __restrict__ packed_t,
                    const uint8_t* __restrict__ absmax_t, const float* __restrict__ codebook,
                    const T* __restrict__ bias, T* __restrict__ y, int M, int N, int nb, float* __restrict__ ws,
                    int* __restrict__ counters, int splits) {
#if defined(KBIT_WGMMA)
    using S = WgCfg<K, R, C5, true>;
    constexpr int kWgRows = R, kWgSlots = S::kSlots, kWgAhead = S::kAhead;
    constexpr int kJ = R / 8;  // 8-row accumulator groups
    constexpr int MT = S::kMT, TW = S::kTW;  // m64 tiles per warpgroup, layout tiles per row tile
    constexpr int NT = S::kNT, kJH = S::kRH / 8;  // row halves, 8-row groups a half
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane & 3;
    const int n_tiles = (N + kTileN - 1) / kTileN;
    const int n_rt = (n_tiles + TW - 1) / TW;  // row tiles along N
    const int m_tiles = (M + kWgRows - 1) / kWgRows;
    const int nst = (nb + kWgBK - 1) / kWgBK;
    const long long ctas = gridDim.x, cta = blockIdx.x;
    const long long units = static_cast<long long>(n_rt) * m_tiles * nst;
    // Stream-K: CTA cta sums units [u0, u1). Split-K over a cluster (splits > 0): row tile blockIdx.x /
    // splits, its stages split evenly among the cluster's CTAs (at least one each: splits <= nst).
    const int ck_q = static_cast<int>(cta) / max(splits, 1), ck_r = static_cast<int>(cta) - ck_q * max(splits, 1);
    const int u0 = splits > 0 ? ck_q * nst + static_cast<int>(sk_start(ck_r, nst, splits))
                              : static_cast<int>(sk_start(cta, units, ctas));
    const int u1 = splits > 0 ? ck_q * nst + static_cast<int>(sk_start(ck_r + 1, nst, splits))
                              : static_cast<int>(sk_start(cta + 1, units, ctas));
    // The tables at the start of shared memory (a constant address, so a lookup adds no base to its
    // offset: WgCfg::kWide), then the slots on 1024-byte boundaries (the swizzle atom of the x boxes).
    const uint32_t raw_s = ptx::smem_u32(smem_raw);
    const uint32_t slots_s = (raw_s + S::kLutBytes + 1023u) & ~1023u;
    uint32_t* tbl = reinterpret_cast<uint32_t*>(smem_raw);
    const unsigned char* stages = smem_raw + (slots_s - raw_s);
    const uint32_t bars = slots_s + (S::kBarOff - S::kSlotsOff);

    // Stage loads, issued by thread 0 and counted in bytes on the slot's mbarrier: one bulk copy of
    // each layout tile's plane words (the stage's blocks are contiguous in the tiled layout) and one
    // of its absmax bytes, and a TMA box of the x rows (R rows x 64 inputs, 128-byte swizzle: the
    // canonical K-major wgmma B layout; rows past M and inputs past nb * 32 read as zeros). A
    // layout tile past N or a block past nb is not copied: its stale weights are finite and meet
    // zero x, or feed outputs that are never stored. (With cp.async from every thread the loads
    // were the limiter: RESULTS.md, session 9.) Slot layout: [x][plane words][absmax].
    SkUnit lc = SkUnit::at(u0, nst, m_tiles);  // the next unit to load (every thread tracks it)
    // Part `part` of the stage of unit n into slot (kw_load_part).
    auto load_part = [&](const SkUnit& n, int slot, int part) {
        const size_t blk = static_cast<size_t>(n.t * TW) * nb + n.st * kWgBK;
        kw_load_part<K, R>(part, slots_s + static_cast<uint32_t>(slot * S::kSlotBytes), bars + slot * 8, &tm_x,
                           n.st * kWgBK * 32, n.mt * kWgRows, packed_t + blk * K * kTileN, absmax_t + blk * kTileN,
                           nb, min(kWgBK, nb - n.st * kWgBK), min(TW, n_tiles - n.t * TW));
    };

    // The first stages' weights are requested, then the tables built, while the previous kernel
    // may still run (PDL, pdl.cuh); x follows pdl_wait. Weights first, so that after a kernel
    // without PDL (vLLM's norms and activations) the build hides under their latency: 1-3 µs per
    // call at M = 32..64 (RESULTS.md, session 14). The barrier after the build publishes the tables
    // and the initialized mbarriers. Part 0 (the expectation of the stage's bytes and the x box)
    // follows pdl_wait; its weight parts may land before it (kw_load_part).
    pdl_trigger();
    if (tid == 0) {
        for (int i = 0; i < kWgSlots; ++i) ptx::mbar_init(bars + i * 8, 1);
        ptx::mbar_init_fence();
        SkUnit n = lc;
        for (int s = 0; s < kWgAhead && u0 + s < u1; ++s, n.next(nst, m_tiles))
            for (int part = 1; part < S::kLoadParts; ++part) load_part(n, s, part);
    }
    kw_build_tables<K, T, C5, S::kWide>(tbl, codebook, tid);
    __syncthreads();
    pdl_wait();
    for (int s = 0; s < kWgAhead && u0 + s < u1; ++s, lc.next(nst, m_tiles))
        if (tid == 0) load_part(lc, s, 0);

    const KwLane L = KwLane::make<C5, MT>(tid);
    const int tw = L.tw, c0 = L.c0;
    float acc[MT * NT][R / NT / 2];  // [m64 tile x row half][fragment]
    uint32_t a[2][MT][4];  // A fragments: [k16 half][m64 tile][register]
    uint32_t ab[kWgBK][2][MT][4];  // the tall tile's: [block][k16 half][m64 tile][register]

    int q = u0 / nst;  // row tile of the current segment
    bool seg_from_start = u0 == q * nst;
    int it = 0;
    for (int u = u0; u < u1;) {
        const int seg_end = min(u1, (q + 1) * nst);
#pragma unroll
        for (int i = 0; i < MT * NT; ++i)
#pragma unroll
            for (int r = 0; r < R / NT / 2; ++r) acc[i][r] = 0.f;
        // Two stages a trip below 128 rows: H200 session 41, k=4 µs one / two, M=32 14336x4096 22.5 / 21.8,
        // 4096x28672 39.3 / 38.9, M=64 30.6 / 30.0, 51.1 / 49.7; M=16 and 4096x6144 alike either way.
#pragma unroll(R <= 64 ? 2 : 1)
        for (; u < seg_end; ++u, ++it) {
            const int slot = it % kWgSlots;
            ptx::mbar_wait(bars + slot * 8, static_cast<uint32_t>(it / kWgSlots) & 1u);  // stage it landed
            __syncthreads();  // every warp decoded stage it - 1 and its wgmmas of it - 2 are done
            if (u + kWgAhead < u1) {  // refill the slot of stage it - 2: one part per warp
                if (lane == 0 && warp < S::kLoadParts) load_part(lc, (it + kWgAhead) % kWgSlots, warp);
                lc.next(nst, m_tiles);
            }
            const unsigned char* st = stages + slot * S::kSlotBytes;
            const uint32_t st_s = slots_s + static_cast<uint32_t>(slot * S::kSlotBytes);
            if constexpr (MT == 1)  // the tall tiles
                kw_stage_blocks<T, K, R, C5>(st, st_s, tbl, L, acc, ab);
            else
                kw_stage<T, K, R, C5, MT, true>(st, st_s, tbl, L, acc, a);
        }
        ptx::wgmma_wait<0>();
        kw_fence_acc(acc);

        // End of this CTA's segment of row tile q. With J(i, j) = acc[i NT + j / kJH] at 4 (j % kJH):
        // J[h] is feature f0 + 2i, x row 8j + 2g + h of the tile; J[2 + h] feature f0 + 2i + 1, the
        // same row (i < MT, j < kJ).
        auto accj = [&](int i, int j) -> float* { return &acc[i * NT + j / kJH][4 * (j % kJH)]; };
        const int st_last = u - 1 - q * nst;
        const int rt = q / m_tiles, mt = q - rt * m_tiles;
        const int f0 = (rt * TW + tw) * kTileN + c0;
        bool write = true;
        if constexpr (MT == 2 && R <= 64) {
            static_assert(ck_sums_bytes(R) + 1024 <= S::kBarOff && kWgThreads == kCkThreads,
                          "a CTA's sums fit below its mbarriers");
            if (splits > 1) {  // the cluster's sums meet in shared memory; this CTA writes its share of y
                ck_cluster_reduce<T, R>(reinterpret_cast<float*>(smem_raw), acc, L.tw * kTileN + L.c0, L.g, tid,
                                        splits, y, bias, M, N, mt * kWgRows, rt * TW * kTileN);
                break;  // one row tile per CTA
            }
        }
        if (!(seg_from_start && st_last == nst - 1)) {
            const long long first = static_cast<long long>(q) * nst, lastu = first + nst - 1;
            const long long wf = sk_owner(first, units, ctas), wl = sk_owner(lastu, units, ctas);
            float* mine = ws + static_cast<size_t>(q) * S::kTileFloats + (warp * MT * kJ * 32 + lane) * 4;
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < kJ; ++j) {
                    const float* v = accj(i, j);
                    red_add4(mine + (i * kJ + j) * 128, v[0], v[1], v[2], v[3]);
                }
            write = sk_cta_arrive_last(counters + q, static_cast<int>(wl - wf));
            if (write) {
#pragma unroll
                for (int i = 0; i < MT; ++i)
#pragma unroll
                    for (int j = 0; j < kJ; ++j) {
                        const float4 v = kbit::sk_take4(reinterpret_cast<float4*>(mine + (i * kJ + j) * 128));
                        float* d = accj(i, j);
                        d[0] = v.x, d[1] = v.y, d[2] = v.z, d[3] = v.w;
                    }
            }
        }
        if (write && f0 < N) {
            constexpr int kF = 2 * MT;  // adjacent features of the lane
            float bv[kF];
#pragma unroll
            for (int s = 0; s < kF; ++s) bv[s] = (bias != nullptr && f0 + s < N) ? to_float(bias[f0 + s]) : 0.f;
            const bool vec = N % kF == 0;  // f0 is a multiple of kF: all its features in range
#pragma unroll
            for (int j = 0; j < kJ; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = mt * kWgRows + 8 * j + 2 * g + h;
                    if (row >= M) continue;
                    T* dst = y + static_cast<size_t>(row) * N + f0;
                    float v[kF];
#pragma unroll
                    for (int i = 0; i < MT; ++i) {
                        v[2 * i] = accj(i, j)[h] + bv[2 * i];
                        v[2 * i + 1] = accj(i, j)[2 + h] + bv[2 * i + 1];
                    }
                    if (vec) {
                        if constexpr (MT == 2)
                            *reinterpret_cast<uint2*>(dst) = make_uint2(pack2<T>(v[0], v[1]), pack2<T>(v[2], v[3]));
                        else
                            *reinterpret_cast<uint32_t*>(dst) = pack2<T>(v[0], v[1]);
                    } else {
#pragma unroll
                        for (int s = 0; s < kF; ++s)
                            if (f0 + s < N) dst[s] = from_float<T>(v[s]);
                    }
                }
        }
        ++q;
        seg_from_start = true;
    }
#else
    __trap();  // only sm_90a has wgmma; the host launches this kernel on compute capability 9.0 only
#endif
}

template <typename T, int K, int R, int C5>
const void* wgmma_kernel_ptr(int* smem) {
    *smem = WgCfg<K, R, C5, true>::kBytes;
    return reinterpret_cast<const void*>(wgmma_sk_kernel<T, K, R, C5>);
}

// k = 5's tall tiles: the 32-copy table (128 KB) leaves no room for their 26-55 KB slots. The 160-
// to 256-row ones run 16 copies (64 KB, lanes 16 apart meet in a bank when their codes differ in
// parity alike), 4 slots beside it: 3-7% faster than on the 8-copy table (RESULTS.md, session 33);
// the 320- and 384-row ones 8 copies, as 16 would leave them 3 and 2 slots.
template <typename T, int K, int C5 = kLut5Copies>
const void* wgmma_pick_rows(int rows, int* smem) {
    switch (rows) {
        case 16: return wgmma_kernel_ptr<T, K, 16, C5>(smem);
        case 32: return wgmma_kernel_ptr<T, K, 32, C5>(smem);
        case 64: return wgmma_kernel_ptr<T, K, 64, C5>(smem);
        case 128: return wgmma_kernel_ptr<T, K, 128, C5>(smem);
        case 160: return wgmma_kernel_ptr<T, K, 160, K == 5 ? 16 : C5>(smem);
        case 192: return wgmma_kernel_ptr<T, K, 192, K == 5 ? 16 : C5>(smem);
        case kWgTallRows: return wgmma_kernel_ptr<T, K, kWgTallRows, K == 5 ? 16 : C5>(smem);
        case 320: return wgmma_kernel_ptr<T, K, 320, K == 5 ? 8 : C5>(smem);
        case 384: return wgmma_kernel_ptr<T, K, 384, K == 5 ? 8 : C5>(smem);
        default: return nullptr;
    }
}

// The kernel for k bits and `rows` x rows per row tile (16, 32, 64, 128, 160, 192, 256, 320 or 384); nullptr
// for others. k = 5 runs the 32-copy table at one CTA per SM (header), but the tall tiles 16 or 8 copies.
template <typename T>
const void* wgmma_pick(int k, int rows, int* smem) {
    switch (k) {
        case 2: return wgmma_pick_rows<T, 2>(rows, smem);
        case 3: return wgmma_pick_rows<T, 3>(rows, smem);
        case 4: return wgmma_pick_rows<T, 4>(rows, smem);
        case 5: return wgmma_pick_rows<T, 5, 32>(rows, smem);
        default: return nullptr;
    }
}

}  // namespace

using ptx::wgmma_device_ok;

// Resident CTAs per SM of the wgmma kernel for k bits and `rows` x rows per row tile, for sizing a
// one-wave grid; 0 on error, for k outside 2..5, rows other than 16, 32, 64, 128, 160, 192, 256, 320, 384,
// or where !wgmma_device_ok().
template <typename T>
int wgmma_ctas_per_sm(int k, int rows) {
    int smem = 0;
    const void* f = wgmma_pick<T>(k, rows, &smem);
    if (!wgmma_device_ok() || f == nullptr) return 0;
    return resident_ctas(f, kWgThreads, smem);
}
template int wgmma_ctas_per_sm<half>(int, int);
template int wgmma_ctas_per_sm<__nv_bfloat16>(int, int);

// Clusters of `splits` CTAs of the kernel for k bits and `rows` x rows that can be resident at once
// (split-K launches, splits 2..8, rows <= 64); 0 on error or where !wgmma_device_ok().
template <typename T>
int wgmma_ck_clusters(int k, int rows, int splits) {
    int smem = 0;
    const void* f = wgmma_pick<T>(k, rows, &smem);
    if (!wgmma_device_ok() || f == nullptr || rows > 64) return 0;
    return ck_max_clusters(f, smem, splits);
}
template int wgmma_ck_clusters<half>(int, int, int);
template int wgmma_ck_clusters<__nv_bfloat16>(int, int, int);

// rows: x rows per row tile (16, 32, 64, 128, 160, 192, 256, 320 or 384; the wgmma N, or twice it).
// cols: features per row tile, 256 (128 for the tall tiles, rows > 128). splits = 0: stream-K, ctas
// the grid size, 1..units where units = ceil(N / cols) * ceil(M / rows) * ceil(nb / 2); ws a zeroed
// fp32 accumulator of ceil(N / cols) * ceil(M / rows) row tiles of rows x cols floats, counters as
// many zeroed int32; both are left zero. splits = 1..8 (at most the ceil(nb / 2) stages; past 1 only
// rows <= 64): split-K, each row tile's stages split evenly over a cluster of `splits` CTAs, one an SM,
// whose sums meet in distributed shared memory; ctas must be row tiles x splits, ws and counters are
// not touched.
template <typename T>
int launch_wgmma(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int k, int M,
                 int N, int nb, void* y, int rows, int ctas, float* ws, int* counters, int splits,
                 cudaStream_t stream) {
    if (M == 0 || N <= 0) return 0;
    int smem = 0;
    const void* f = wgmma_pick<T>(k, rows, &smem);
    if (f == nullptr) return static_cast<int>(cudaErrorInvalidValue);
    const int cols = kTileN * kw_mt(rows);  // features per row tile
    const long long row_tiles = ((N + cols - 1) / cols) * static_cast<long long>((M + rows - 1) / rows);
    const long long units = row_tiles * ((nb + kWgBK - 1) / kWgBK);
    if (f == nullptr || nb <= 0 || M < 0 || ctas < 1 || ctas > units || units > (1LL << 30) || !wgmma_device_ok())
        return static_cast<int>(cudaErrorInvalidValue);
    if (splits == 0 ? (ws == nullptr || counters == nullptr)
                    : (splits < 0 || splits > 8 || (splits > 1 && rows > 64) || splits > (nb + kWgBK - 1) / kWgBK ||
                       ctas != row_tiles * splits))
        return static_cast<int>(cudaErrorInvalidValue);
    if (splits > 0) smem = ck_smem(smem);
    // x [M, nb * 32] in rows x 64-input boxes with the 128-byte swizzle (the wgmma B layout).
    CUtensorMap tmx;
    const CUtensorMapDataType xdt =
        std::is_same<T, half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    if (!ptx::encode_2d(&tmx, xdt, x, static_cast<uint64_t>(nb) * 32, M, static_cast<uint64_t>(nb) * 64,
                        kWgBK * 32, static_cast<uint32_t>(rows / kw_nt(rows)), CU_TENSOR_MAP_SWIZZLE_128B))
        return static_cast<int>(cudaErrorInvalidValue);
    const cudaError_t attr = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (attr != cudaSuccess) return static_cast<int>(attr);
    const uint32_t* p = static_cast<const uint32_t*>(pt);
    const T* bt = static_cast<const T*>(bias);
    T* yt = static_cast<T*>(y);
    void* args[] = {&tmx, &p, &at, &cb, &bt, &yt, &M, &N, &nb, &ws, &counters, &splits};
    return pdl_launch_c(f, dim3(ctas), dim3(kWgThreads), smem, stream, args, splits > 1 ? splits : 1);
}

template int launch_wgmma<half>(const void*, const void*, const uint8_t*, const float*, const void*, int, int, int,
                                int, void*, int, int, float*, int*, int, cudaStream_t);
template int launch_wgmma<__nv_bfloat16>(const void*, const void*, const uint8_t*, const float*, const void*, int,
                                         int, int, int, void*, int, int, float*, int*, int, cudaStream_t);

}  // namespace kbit
