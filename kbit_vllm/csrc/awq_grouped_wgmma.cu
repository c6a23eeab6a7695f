// awq_orin grouped GEMM on Hopper wgmma (MoE, any rows per expert): for every expert e,
// y[rows of e] = x[rows of e] @ W_e^T, all experts in one launch, reading the stacked resident
// layout wq [E, out/8, in] / sz [E, in/group, out, 2].
//
// Why: the grouped mma.sync kernel (awq_grouped_mma.cu) runs the dense MMA tile per expert, whose
// instructions grow with the rows; the dense wgmma kernel (awq_wgmma.cu) beats that tile at every
// M >= 5 (RESULTS.md, session 10). This kernel runs the dense wgmma kernel's stages
// (awq_wgmma_tile.cuh: weights decoded into the A registers, x the B operand, every load a TMA box
// counted on a per-slot mbarrier) on each expert's weights and rows.
// Grid: x = 256-output row tile; y = work item = (expert, R-row tile of its rows), found by
// moe::find_item over the device offsets (the host sizes y from an upper bound; surplus CTAs exit
// at once); z = K split. The weight and scale tensor maps span all experts (rows stacked), so a
// box at the end of one expert may read the next expert's words: those feed outputs past `out`
// (never stored) or meet x past `in` (zeros). Likewise the x box's rows past the expert's last row
// belong to the next expert and their accumulator rows are not stored.
// Split-K: every split stores its fp32 partial rows into workspace[split] ([splits, rows, out]),
// summed in split order by the dense split-K reduction (every row belongs to exactly one expert,
// so every partial is written), so y is the same in every run.
#include "awq_mma_tile.cuh"
#include "awq_wgmma_tile.cuh"
#include "moe_common.cuh"
#include "pdl.cuh"

namespace awq {

namespace {

template <typename T, int R>
__global__ void __launch_bounds__(kAwThreads, AwCfg<R>::kOneCta ? 1 : 2)
    grouped_wgmma_kernel(const __grid_constant__ CUtensorMap tm_x, const __grid_constant__ CUtensorMap tm_w,
                         const __grid_constant__ CUtensorMap tm_s, const int* __restrict__ offs, T* __restrict__ y,
                         float* __restrict__ partial, int n_exp, int rows, int in, int out, int group,
                         int st_per_split) {
#if defined(KBIT_WGMMA)
    using C = AwCfg<R>;
    // Launched with PDL (pdl.cuh): the launch overlaps the previous kernel's tail; everything here
    // follows pdl_wait, as the item (the offsets) names the expert of every load.
    kbit::pdl_trigger();
    kbit::pdl_wait();
    moe::Item item;
    if (!moe::find_item(offs, n_exp, rows, R, static_cast<int>(blockIdx.y), item)) return;  // CTA-uniform
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int tid = threadIdx.x, g = tid & 3;
    const int t = blockIdx.x;  // 256-output row tile
    const int nst_all = (in + kAwBK - 1) / kAwBK;
    const int st0 = static_cast<int>(blockIdx.z) * st_per_split;
    const int n = min(nst_all, st0 + st_per_split) - st0;  // stages of this split
    const int gshift = __ffs(group) - 1;  // group is a power of two (host check)
    const int xrow0 = item.row0 + item.sub * R;
    const int wrow = item.expert * (out / 8) + t * kAwGroups;
    const int srow0 = item.expert * (in / group);
    // Slots start on a 1024-byte boundary (the swizzle atom of the TMA boxes).
    const uint32_t raw_s = ptx::smem_u32(smem_raw);
    const uint32_t smem_s = (raw_s + 1023u) & ~1023u;
    const unsigned char* smem_aw = smem_raw + (smem_s - raw_s);
    const uint32_t bars = smem_s + C::kBarOff;
    auto load_part = [&](int s, int part) {  // part `part` of stage st0 + s into its slot (aw_load_part)
        const uint32_t base = smem_s + static_cast<uint32_t>((s % C::kSlots) * C::kSlotBytes);
        aw_load_part<R>(part, base, bars + (s % C::kSlots) * 8, &tm_x, &tm_w, &tm_s, (st0 + s) * kAwBK, xrow0, wrow,
                        srow0, t * kAwCols, gshift);
    };
    if (tid == 0) {
        for (int i = 0; i < C::kSlots; ++i) ptx::mbar_init(bars + i * 8, 1);
        ptx::mbar_init_fence();
    }
    __syncthreads();  // the mbarriers are initialized before any copy counts on them
    if ((tid & 31) == 0 && (tid >> 5) < kAwLoadParts)  // one box per warp, as in the loop
        for (int s = 0; s < C::kAhead && s < n; ++s) load_part(s, tid >> 5);

    const AwLane L = AwLane::make(tid);
    float acc[2][R / 2];  // [m64 tile][fragment]
    uint32_t a[2][2][4];  // A fragments: [k16 half parity][m64 tile][register]
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int r = 0; r < R / 2; ++r) acc[i][r] = 0.f;
    // The host never makes an empty split, but without this exit ptxas saw the zeroed accumulators
    // reach the stores past a loop of no stages and serialized every wgmma (a wait after each
    // issue, warning C7515): 8 waits a stage instead of 4 overlapped halves.
    if (n <= 0) return;
    for (int s = 0; s < n; ++s) {
        const int slot = s % C::kSlots;
        ptx::mbar_wait(bars + slot * 8, static_cast<uint32_t>(s / C::kSlots) & 1u);  // stage s landed
        __syncthreads();  // every warp decoded stage s - 1 and its wgmmas of s - 2 are done
        if (s + C::kAhead < n && (tid & 31) == 0 && (tid >> 5) < kAwLoadParts)  // one box per warp
            load_part(s + C::kAhead, tid >> 5);
        aw_stage<T, R>(smem_aw + slot * C::kSlotBytes, smem_s + static_cast<uint32_t>(slot * C::kSlotBytes), L, acc,
                       a);
    }
    ptx::wgmma_wait<0>();
    aw_fence_acc<R>(acc);

    // acc[i][4j + h]: output f0 + 2i, x row 8j + 2g + h of the tile; acc[i][4j + 2 + h]: output
    // f0 + 2i + 1, the same row. out % 8 == 0: all four outputs of a lane are in range or none.
    const int f0 = t * kAwCols + L.fl;
    if (f0 >= out) return;
    float* part = partial != nullptr ? partial + static_cast<size_t>(blockIdx.z) * rows * out : nullptr;
#pragma unroll
    for (int j = 0; j < R / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = xrow0 + 8 * j + 2 * g + h;
            if (row >= item.row1) continue;
            const float v0 = acc[0][4 * j + h], v1 = acc[0][4 * j + 2 + h];
            const float v2 = acc[1][4 * j + h], v3 = acc[1][4 * j + 2 + h];
            if (part != nullptr) {
                *reinterpret_cast<float4*>(part + static_cast<size_t>(row) * out + f0) = make_float4(v0, v1, v2, v3);
            } else {
                using T2 = typename Vec2<T>::type;
                T2 lo, hi;
                lo.x = from_f<T>(v0);
                lo.y = from_f<T>(v1);
                hi.x = from_f<T>(v2);
                hi.y = from_f<T>(v3);
                *reinterpret_cast<uint2*>(y + static_cast<size_t>(row) * out + f0) =
                    make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
            }
        }
#else
    __trap();  // only sm_90a has wgmma; the host launches this kernel on compute capability 9.0 only
#endif
}

template <typename T, int R>
int launch_rows(const CUtensorMap& tmx, const CUtensorMap& tmw, const CUtensorMap& tms, const int* offs, T* y,
                float* partial, int n_exp, int rows, int in, int out, int group, int items, int splits,
                int st_per_split, cudaStream_t stream) {
    const void* f = reinterpret_cast<const void*>(grouped_wgmma_kernel<T, R>);
    const cudaError_t attr = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, AwCfg<R>::kBytes);
    if (attr != cudaSuccess) return static_cast<int>(attr);
    const dim3 grid(static_cast<unsigned>((out + kAwCols - 1) / kAwCols), static_cast<unsigned>(items),
                    static_cast<unsigned>(splits));
    return kbit::pdl_launch(grouped_wgmma_kernel<T, R>, grid, dim3(kAwThreads), AwCfg<R>::kBytes, stream, tmx, tmw, tms,
                            offs, y, partial, n_exp, rows, in, out, group, st_per_split);
}

}  // namespace

// rows_per_tile: x rows per work item (16, 32, 64 or 128; the wgmma N; 128 runs one CTA per SM as in
// the dense kernel, past 64 expected rows per expert: dispatch.grouped_wgmma_config); items: grid
// rows, an upper bound on the (expert, rows_per_tile-row tile) items: (rows + min(n_exp, rows) *
// (rows_per_tile - 1)) / rows_per_tile; splits > 1 needs workspace [splits, rows, out] fp32 (no
// zeroing needed). Needs compute capability 9.0 and sm_90a code (ptx::wgmma_device_ok), group a
// power of two.
template <typename T>
int grouped_wgmma(const void* x, const int32_t* wq, const void* sz, const int* offs, void* y, float* workspace,
                  int n_exp, int rows, int in, int out, int group, int rows_per_tile, int items, int splits,
                  cudaStream_t stream) {
    if (rows <= 0) return 0;
    if (in <= 0 || in % 32 || group < 32 || (group & (group - 1)) || in % group || out % 8 || out <= 0 ||
        n_exp <= 0 || splits < 1 || items < 1 || items > 65535 || !ptx::wgmma_device_ok() ||
        static_cast<long long>(n_exp) * (out / 8) > (1LL << 31) - 1 ||
        static_cast<long long>(n_exp) * (in / group) > (1LL << 31) - 1)
        return static_cast<int>(cudaErrorInvalidValue);
    const int nst = (in + kAwBK - 1) / kAwBK;
    const int per_split = (nst + splits - 1) / splits;
    splits = (nst + per_split - 1) / per_split;  // no empty splits
    float* partial = splits > 1 ? workspace : nullptr;
    if (splits > 1 && workspace == nullptr) return static_cast<int>(cudaErrorInvalidValue);
    CUtensorMap tmx, tmw, tms;
    if (!aw_tensor_maps<T>(&tmx, &tmw, &tms, x, rows, wq, static_cast<long long>(n_exp) * (out / 8), sz,
                           static_cast<long long>(n_exp) * (in / group), in, out, rows_per_tile))
        return static_cast<int>(cudaErrorInvalidValue);
    T* yt = static_cast<T*>(y);
    int e = 0;
    switch (rows_per_tile) {
        case 16: e = launch_rows<T, 16>(tmx, tmw, tms, offs, yt, partial, n_exp, rows, in, out, group, items, splits, per_split, stream); break;
        case 32: e = launch_rows<T, 32>(tmx, tmw, tms, offs, yt, partial, n_exp, rows, in, out, group, items, splits, per_split, stream); break;
        case 64: e = launch_rows<T, 64>(tmx, tmw, tms, offs, yt, partial, n_exp, rows, in, out, group, items, splits, per_split, stream); break;
        case 128: e = launch_rows<T, 128>(tmx, tmw, tms, offs, yt, partial, n_exp, rows, in, out, group, items, splits, per_split, stream); break;
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
    if (e != 0) return e;
    if (splits > 1) return launch_splitk_reduce<T>(partial, nullptr, yt, splits, rows, out, stream);
    return 0;
}

template int grouped_wgmma<half>(const void*, const int32_t*, const void*, const int*, void*, float*, int, int, int,
                                 int, int, int, int, int, cudaStream_t);
template int grouped_wgmma<__nv_bfloat16>(const void*, const int32_t*, const void*, const int*, void*, float*, int,
                                          int, int, int, int, int, int, int, cudaStream_t);

}  // namespace awq
