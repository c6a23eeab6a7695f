// awq_orin grouped tensor-core GEMM (MoE, any rows per expert): for every expert e,
// y[rows of e] = x[rows of e] @ W_e^T, all experts in one launch, reading the stacked resident
// layout wq [E, out/8, in] / sz [E, in/group, out, 2].
//
// Grid: x = 128-output tile; y = work item = (expert, BM-row tile of its rows), found by
// moe::find_item over the device offsets (the host sizes y from an upper bound; surplus CTAs
// exit at once); z = K split. Each CTA runs the dense kernel's tile (awq_mma_tile.cuh) on its
// expert's weight and rows. Split-K: fp32 partials [splits, rows, out] in a torch-allocated
// workspace, summed in a fixed order by the dense splitk reduction (every row belongs to exactly
// one expert, so every partial is written).
#include "awq_mma_tile.cuh"
#include "moe_common.cuh"

namespace awq {

namespace {

template <typename T, int BM>
__global__ void __launch_bounds__(kThreads, kMinCtas<BM>)
grouped_mma_kernel(const T* __restrict__ x, const int32_t* __restrict__ wq, const T* __restrict__ sz,
                   const int* __restrict__ offs, T* __restrict__ y, float* __restrict__ partial, int n_exp, int rows,
                   int in, int out, int group, int k_tiles_per_split) {
    moe::Item it;
    if (!moe::find_item(offs, n_exp, rows, BM, static_cast<int>(blockIdx.y), it)) return;
    const int kt_begin = blockIdx.z * k_tiles_per_split;
    const int kt_end = min(in / kBK, kt_begin + k_tiles_per_split);
    const int32_t* wq_e = wq + static_cast<size_t>(it.expert) * (out / 8) * in;
    const T* sz_e = sz + static_cast<size_t>(it.expert) * (in / group) * out * 2;
    float* part = partial != nullptr ? partial + static_cast<size_t>(blockIdx.z) * rows * out : nullptr;
    mma_tile<T, BM>(x, wq_e, sz_e, nullptr, y, part, it.row0 + it.sub * BM, it.row1, in, out, group,
                    blockIdx.x * kBN, kt_begin, kt_end);
}

template <typename T, int BM>
void launch_bm(const T* x, const int32_t* wq, const T* sz, const int* offs, T* y, float* partial, int n_exp, int rows,
               int in, int out, int group, int items, int splits, int per_split, cudaStream_t stream) {
    const dim3 grid(static_cast<unsigned>((out + kBN - 1) / kBN), static_cast<unsigned>(items),
                    static_cast<unsigned>(splits));
    grouped_mma_kernel<T, BM><<<grid, kThreads, 0, stream>>>(x, wq, sz, offs, y, partial, n_exp, rows, in, out, group,
                                                            per_split);
}

}  // namespace

// bm: rows per CTA tile (16, 32, 64); items: grid rows, an upper bound on the (expert, bm-row
// tile) items: (rows + min(n_exp, rows) * (bm - 1)) / bm; splits > 1 needs workspace
// [splits, rows, out] fp32 (no zeroing needed).
template <typename T>
int grouped_mma(const void* x, const int32_t* wq, const void* sz, const int* offs, void* y, float* workspace,
                int n_exp, int rows, int in, int out, int group, int bm, int items, int splits, cudaStream_t stream) {
    if (rows <= 0) return 0;
    if (in % kBK || in % group || out % 8 || out <= 0 || n_exp <= 0 || splits < 1 || items < 1 || items > 65535)
        return static_cast<int>(cudaErrorInvalidValue);
    const int k_tiles = in / kBK;
    const int per_split = (k_tiles + splits - 1) / splits;
    splits = (k_tiles + per_split - 1) / per_split;  // no empty splits
    float* partial = splits > 1 ? workspace : nullptr;
    if (splits > 1 && workspace == nullptr) return static_cast<int>(cudaErrorInvalidValue);
    const T* xt = static_cast<const T*>(x);
    const T* st = static_cast<const T*>(sz);
    T* yt = static_cast<T*>(y);
    switch (bm) {
        case 16: launch_bm<T, 16>(xt, wq, st, offs, yt, partial, n_exp, rows, in, out, group, items, splits, per_split, stream); break;
        case 32: launch_bm<T, 32>(xt, wq, st, offs, yt, partial, n_exp, rows, in, out, group, items, splits, per_split, stream); break;
        case 64: launch_bm<T, 64>(xt, wq, st, offs, yt, partial, n_exp, rows, in, out, group, items, splits, per_split, stream); break;
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
    if (cudaError_t e = cudaGetLastError()) return static_cast<int>(e);
    if (splits > 1) return launch_splitk_reduce<T>(partial, nullptr, yt, splits, rows, out, stream);
    return 0;
}

template int grouped_mma<half>(const void*, const int32_t*, const void*, const int*, void*, float*, int, int, int, int,
                               int, int, int, int, cudaStream_t);
template int grouped_mma<__nv_bfloat16>(const void*, const int32_t*, const void*, const int*, void*, float*, int, int,
                                        int, int, int, int, int, int, cudaStream_t);

}  // namespace awq
