// kbit grouped GEMM on Hopper wgmma (MoE, any rows per expert), k = 2..5: for every expert e,
// y[rows of e] = x[rows of e] @ W_e^T, all experts in one launch, reading the stacked tiled layout
// packed_tiled [E, n_tiles, nb, k, 128] / absmax_tiled [E, n_tiles, nb, 128].
//
// Why: the grouped mma.sync kernel (kbit_grouped_mma.cu) loads with cp.async from every thread
// and issues one HMMA per 16 rows x 8 features x 16 inputs; the dense wgmma kernel's stages
// (kbit_wgmma_tile.cuh: weights decoded into the A registers by pair-table lookups, x the B
// operand, bulk / TMA loads counted on a per-slot mbarrier) run here on each expert's weights and
// rows, as awq_grouped_wgmma.cu does for awq_orin.
// Grid: x = row tile of 2 layout tiles (256 features); y = work item = (expert, R-row tile of its
// rows), found by moe::find_item over the device offsets (the host sizes y from an upper bound;
// surplus CTAs exit at once); z = K split. The x box's rows past the expert's last row belong to
// the next expert (or read as zeros past the last row): their accumulator rows are not stored.
// k = 5 looks its pair codes up in the 32-copy table (kbit_lut5.cuh) at one CTA per SM where the
// CTAs expected to find work are at most one per SM, else in the 8-copy one at two (the host
// decides: dispatch.grouped_wgmma_one_cta). H200 session
// 28, seed 002's 8 experts, k=5 µs 32-copy / 8-copy: 2048x512 at 8 / 64 tokens (128 CTAs) 9.4 /
// 12.8 against 11.1 / 14.7, 512x2048 8.7 / 13.2 against 11.1 / 16.6; the 32-copy table at one CTA
// per SM lost on larger grids (2048x512 at 256 tokens, 320 CTAs, 30.4 against 27.7).
// Split-K: every split stores its fp32 partial rows into workspace[split] ([splits, rows, N]),
// summed in split order by awq_mma.cu's split-K reduction (every row belongs to exactly one
// expert, so every partial is written): the same y in every run.
// Both kernels are launched with PDL (pdl.cuh). H200 session 46, k=4 µs before / after, fp16 x
// back to back: seed8 gate at 8 tokens 7.81 -> 7.22, down 8.70 -> 7.41, at 16 9.77 -> 8.66 and
// 10.2 -> 8.7; behind a writer of bf16 x 8.63 -> 7.55 and 8.70 -> 8.22 at 8 tokens, within 3.5%
// at 64 and 256 and on Qwen3-MoE shapes.
#include "kbit_wgmma_tile.cuh"
#include "moe_common.cuh"
#include "pdl.cuh"

namespace awq {
template <typename T>
int launch_splitk_reduce(const float* partial, const T* bias, T* y, int splits, int M, int out, cudaStream_t stream);
}  // namespace awq

namespace kbit {

namespace {

template <typename T, int K, int R, int C5>
__global__ void __launch_bounds__(kWgThreads, WgCfg<K, R, C5>::kOneCta ? 1 : 2)
    grouped_wgmma_kernel(const __grid_constant__ CUtensorMap tm_x, const uint32_t* __restrict__ packed_t,
                         const uint8_t* __restrict__ absmax_t, const float* __restrict__ codebook,
                         const int* __restrict__ offs, T* __restrict__ y, float* __restrict__ partial, int n_exp,
                         int rows, int N, int nb, int st_per_split) {
#if defined(KBIT_WGMMA)
    using S = WgCfg<K, R, C5>;
    constexpr int TW = S::kTW;  // layout tiles per row tile
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int tid = threadIdx.x, g = tid & 3;
    const int n_tiles = (N + kTileN - 1) / kTileN;
    const int t = blockIdx.x;  // row tile: layout tiles 2t, 2t + 1
    const int tiles = min(TW, n_tiles - t * TW);
    const int nst_all = (nb + kWgBK - 1) / kWgBK;
    const int st0 = static_cast<int>(blockIdx.z) * st_per_split;
    const int n = min(nst_all, st0 + st_per_split) - st0;  // stages of this split
    // The tables, then the slots on 1024-byte boundaries (the swizzle atom of the x boxes). The 64 KB
    // pair table (WgCfg::kWide, 16-row tiles) sits at the start of shared memory, a constant address,
    // so a lookup is the byte permute and one load; the compact tables start at the first 1024-byte
    // boundary (at the start they measured 0-2% slower, RESULTS.md session 41).
    const uint32_t raw_s = ptx::smem_u32(smem_raw);
    const uint32_t smem_s = S::kWide ? raw_s : (raw_s + 1023u) & ~1023u;  // the tables
    unsigned char* smem_wg = smem_raw + (smem_s - raw_s);
    uint32_t* tbl = reinterpret_cast<uint32_t*>(smem_wg);
    const uint32_t slots_s = S::kWide ? (raw_s + S::kLutBytes + 1023u) & ~1023u : smem_s + S::kSlotsOff;
    const unsigned char* stages = S::kWide ? smem_raw + (slots_s - raw_s) : smem_wg + S::kSlotsOff;
    const uint32_t bars = S::kWide ? slots_s + (S::kBarOff - S::kSlotsOff) : smem_s + S::kBarOff;
    // Launched with PDL (pdl.cuh): the launch overlaps the previous kernel's tail, and everything
    // here follows pdl_wait, as the item (the offsets) names the expert of every stage. The first
    // stages are requested before the tables are built, so the build hides under their latency;
    // the barrier after it publishes the tables and the initialized mbarriers. (The tables built
    // before pdl_wait instead: H200 session 46, k=4, fp16 back to back as fast at 8..64 tokens,
    // behind a writer of bf16 x 3-8% slower at 64 and 256 and on Qwen3-MoE shapes.)
    pdl_trigger();
    pdl_wait();
    moe::Item item;
    if (!moe::find_item(offs, n_exp, rows, R, static_cast<int>(blockIdx.y), item)) return;  // CTA-uniform
    const int xrow0 = item.row0 + item.sub * R;
    // Blocks before this row tile's first layout tile of this expert.
    const size_t blk0 = (static_cast<size_t>(item.expert) * n_tiles + static_cast<size_t>(t) * TW) * nb;
    // Part `part` of stage st0 + s into its slot (kw_load_part).
    auto load_part = [&](int s, int part) {
        const int st = st0 + s, slot = s % S::kSlots;
        const size_t blk = blk0 + static_cast<size_t>(st) * kWgBK;
        kw_load_part<K, R>(part, slots_s + static_cast<uint32_t>(slot * S::kSlotBytes), bars + slot * 8, &tm_x,
                           st * kWgBK * 32, xrow0, packed_t + blk * K * kTileN, absmax_t + blk * kTileN, nb,
                           min(kWgBK, nb - st * kWgBK), tiles);
    };
    if (tid == 0) {
        for (int i = 0; i < S::kSlots; ++i) ptx::mbar_init(bars + i * 8, 1);
        ptx::mbar_init_fence();
        for (int s = 0; s < S::kAhead && s < n; ++s)
            for (int part = 0; part < S::kLoadParts; ++part) load_part(s, part);
    }
    kw_build_tables<K, T, C5, S::kWide>(tbl, codebook, tid);
    __syncthreads();

    const KwLane L = KwLane::make<C5>(tid);
    float acc[2][R / 2];  // [m64 tile][fragment]
    uint32_t a[2][2][4];  // A fragments: [k16 half][m64 tile][register]
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int r = 0; r < R / 2; ++r) acc[i][r] = 0.f;
    for (int s = 0; s < n; ++s) {
        const int slot = s % S::kSlots;
        ptx::mbar_wait(bars + slot * 8, static_cast<uint32_t>(s / S::kSlots) & 1u);  // stage s landed
        __syncthreads();  // every warp decoded stage s - 1 and its wgmmas of s - 2 are done
        if (s + S::kAhead < n && (tid & 31) == 0 && (tid >> 5) < S::kLoadParts)  // one part per warp
            load_part(s + S::kAhead, tid >> 5);
        kw_stage<T, K, R, C5>(stages + slot * S::kSlotBytes, slots_s + static_cast<uint32_t>(slot * S::kSlotBytes),
                              tbl, L, acc, a);
    }
    ptx::wgmma_wait<0>();
    kw_fence_acc(acc);

    // acc[i][4j + h]: feature f0 + 2i, x row 8j + 2g + h of the tile; acc[i][4j + 2 + h]: feature
    // f0 + 2i + 1, the same row.
    const int f0 = (t * TW + L.tw) * kTileN + L.c0;
    if (f0 >= N) return;
    const bool vec = N % 4 == 0;  // f0 is a multiple of 4: all four features in range
    float* part = partial != nullptr ? partial + static_cast<size_t>(blockIdx.z) * rows * N : nullptr;
#pragma unroll
    for (int j = 0; j < R / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = xrow0 + 8 * j + 2 * g + h;
            if (row >= item.row1) continue;
            const float v[4] = {acc[0][4 * j + h], acc[0][4 * j + 2 + h], acc[1][4 * j + h], acc[1][4 * j + 2 + h]};
            if (part != nullptr) {
                float* dst = part + static_cast<size_t>(row) * N + f0;
                if (vec) {
                    *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
                } else {
#pragma unroll
                    for (int q = 0; q < 4; ++q)
                        if (f0 + q < N) dst[q] = v[q];
                }
            } else {
                T* dst = y + static_cast<size_t>(row) * N + f0;
                if (vec) {
                    *reinterpret_cast<uint2*>(dst) = make_uint2(pack2<T>(v[0], v[1]), pack2<T>(v[2], v[3]));
                } else {
#pragma unroll
                    for (int q = 0; q < 4; ++q)
                        if (f0 + q < N) dst[q] = from_float<T>(v[q]);
                }
            }
        }
#else
    __trap();  // only sm_90a has wgmma; the host launches this kernel on compute capability 9.0 only
#endif
}

template <typename T, int K, int R, int C5>
int launch_rows(const CUtensorMap& tmx, const uint32_t* pt, const uint8_t* at, const float* cb, const int* offs,
                T* y, float* partial, int n_exp, int rows, int N, int nb, int items, int splits, int per_split,
                cudaStream_t stream) {
    using S = WgCfg<K, R, C5>;
    const void* f = reinterpret_cast<const void*>(grouped_wgmma_kernel<T, K, R, C5>);
    const cudaError_t attr = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kBytes);
    if (attr != cudaSuccess) return static_cast<int>(attr);
    const int n_tiles = (N + kTileN - 1) / kTileN;
    const dim3 grid(static_cast<unsigned>((n_tiles + S::kTW - 1) / S::kTW), static_cast<unsigned>(items),
                    static_cast<unsigned>(splits));
    return pdl_launch(grouped_wgmma_kernel<T, K, R, C5>, grid, dim3(kWgThreads), S::kBytes, stream, tmx, pt, at, cb,
                      offs, y, partial, n_exp, rows, N, nb, per_split);
}

template <typename T, int K, int C5 = kLut5Copies>
int launch_k(const CUtensorMap& tmx, const uint32_t* pt, const uint8_t* at, const float* cb, const int* offs, T* y,
             float* partial, int n_exp, int rows, int N, int nb, int rows_per_tile, int items, int splits,
             int per_split, cudaStream_t stream) {
    switch (rows_per_tile) {
        case 16: return launch_rows<T, K, 16, C5>(tmx, pt, at, cb, offs, y, partial, n_exp, rows, N, nb, items, splits, per_split, stream);
        case 32: return launch_rows<T, K, 32, C5>(tmx, pt, at, cb, offs, y, partial, n_exp, rows, N, nb, items, splits, per_split, stream);
        case 64: return launch_rows<T, K, 64, C5>(tmx, pt, at, cb, offs, y, partial, n_exp, rows, N, nb, items, splits, per_split, stream);
        case 128: return launch_rows<T, K, 128, C5>(tmx, pt, at, cb, offs, y, partial, n_exp, rows, N, nb, items, splits, per_split, stream);
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
}

}  // namespace

// k = 2..5; rows_per_tile: x rows per work item (16, 32, 64 or 128; the wgmma N); items: grid rows, an
// upper bound on the (expert, rows_per_tile-row tile) items: (rows + min(n_exp, rows) *
// (rows_per_tile - 1)) / rows_per_tile; splits > 1 needs workspace [splits, rows, N] fp32 (no
// zeroing needed); one_cta (k = 5 only, else 0): the 32-copy table at one CTA per SM instead of the
// 8-copy one at two (the host's choice: dispatch.grouped_wgmma_one_cta). Needs compute capability
// 9.0 and sm_90a code (ptx::wgmma_device_ok).
template <typename T>
int launch_grouped_wgmma(const void* x, const void* pt, const uint8_t* at, const float* cb, const int* offs, void* y,
                         int k, int n_exp, int rows, int N, int nb, int rows_per_tile, int items, int splits,
                         int one_cta, float* workspace, cudaStream_t stream) {
    if (rows <= 0 || N <= 0) return 0;
    if (k < 2 || k > 5 || nb <= 0 || n_exp <= 0 || splits < 1 || items < 1 || items > 65535 ||
        (one_cta != 0 && (one_cta != 1 || k != 5)) || !ptx::wgmma_device_ok())
        return static_cast<int>(cudaErrorInvalidValue);
    const int nst = (nb + kWgBK - 1) / kWgBK;
    const int per_split = (nst + splits - 1) / splits;
    splits = (nst + per_split - 1) / per_split;  // no empty splits
    float* partial = splits > 1 ? workspace : nullptr;
    if (splits > 1 && workspace == nullptr) return static_cast<int>(cudaErrorInvalidValue);
    // x [rows, nb * 32] in rows_per_tile-row x 64-input boxes with the 128-byte swizzle (the wgmma B layout).
    CUtensorMap tmx;
    const CUtensorMapDataType xdt =
        std::is_same<T, half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    if (!ptx::encode_2d(&tmx, xdt, x, static_cast<uint64_t>(nb) * 32, rows, static_cast<uint64_t>(nb) * 64,
                        kWgBK * 32, static_cast<uint32_t>(rows_per_tile), CU_TENSOR_MAP_SWIZZLE_128B))
        return static_cast<int>(cudaErrorInvalidValue);
    const uint32_t* p = static_cast<const uint32_t*>(pt);
    T* yt = static_cast<T*>(y);
    int e = 0;
    switch (k) {
        case 2: e = launch_k<T, 2>(tmx, p, at, cb, offs, yt, partial, n_exp, rows, N, nb, rows_per_tile, items, splits, per_split, stream); break;
        case 3: e = launch_k<T, 3>(tmx, p, at, cb, offs, yt, partial, n_exp, rows, N, nb, rows_per_tile, items, splits, per_split, stream); break;
        case 4: e = launch_k<T, 4>(tmx, p, at, cb, offs, yt, partial, n_exp, rows, N, nb, rows_per_tile, items, splits, per_split, stream); break;
        default:
            e = one_cta ? launch_k<T, 5, 32>(tmx, p, at, cb, offs, yt, partial, n_exp, rows, N, nb, rows_per_tile, items, splits, per_split, stream)
                        : launch_k<T, 5>(tmx, p, at, cb, offs, yt, partial, n_exp, rows, N, nb, rows_per_tile, items, splits, per_split, stream);
            break;
    }
    if (e != 0) return e;
    if (splits > 1) return awq::launch_splitk_reduce<T>(partial, nullptr, yt, splits, rows, N, stream);
    return 0;
}

template int launch_grouped_wgmma<half>(const void*, const void*, const uint8_t*, const float*, const int*, void*, int,
                                        int, int, int, int, int, int, int, int, float*, cudaStream_t);
template int launch_grouped_wgmma<__nv_bfloat16>(const void*, const void*, const uint8_t*, const float*, const int*,
                                                 void*, int, int, int, int, int, int, int, int, int, float*,
                                                 cudaStream_t);

}  // namespace kbit
