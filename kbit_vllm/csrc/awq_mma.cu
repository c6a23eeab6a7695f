// awq_orin tensor-core kernel for mid M: mma.sync.m16n8k16 (fp32 accumulate) over tiles of
// BM tokens x 128 outputs x 32 inputs (the tile body, shared with the grouped MoE kernel, is in
// awq_mma_tile.cuh). Split-K writes fp32 partial sums to a torch-allocated workspace
// [splits, M, out]; splitk_reduce sums them in a fixed order (deterministic), adds the bias and
// converts.
#include "awq_mma_tile.cuh"
#include "pdl.cuh"

namespace awq {

template <typename T, int BM>
__global__ void __launch_bounds__(kThreads, kMinCtas<BM>)
mma_kernel(const T* __restrict__ x, const int32_t* __restrict__ wq, const T* __restrict__ sz,
           const T* __restrict__ bias, T* __restrict__ y, float* __restrict__ partial,
           int M, int in, int out, int group, int k_tiles_per_split) {
    const int kt_begin = blockIdx.z * k_tiles_per_split;
    const int kt_end = min(in / kBK, kt_begin + k_tiles_per_split);
    mma_tile<T, BM>(x, wq, sz, bias, y, partial != nullptr ? partial + static_cast<size_t>(blockIdx.z) * M * out : nullptr,
                    blockIdx.y * BM, M, in, out, group, blockIdx.x * kBN, kt_begin, kt_end);
}

// Sum of the split-K partials [splits, M, out] in a fixed order (deterministic), + bias, -> y.
template <typename T>
__global__ void splitk_reduce(const float* __restrict__ partial, const T* __restrict__ bias, T* __restrict__ y,
                              int splits, int M, int out) {
    kbit::pdl_trigger();
    kbit::pdl_wait();  // the partials are the previous kernel's
    const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    const long long total = static_cast<long long>(M) * out;
    if (idx >= total) return;
    float v = 0.f;
    for (int s = 0; s < splits; ++s) v += partial[s * total + idx];  // fixed order: deterministic
    if (bias != nullptr) v += to_f<T>(bias[idx % out]);
    y[idx] = from_f<T>(v);
}

template <typename T>
int launch_splitk_reduce(const float* partial, const T* bias, T* y, int splits, int M, int out, cudaStream_t stream) {
    const long long total = static_cast<long long>(M) * out;
    if (total == 0) return 0;
    return kbit::pdl_launch(splitk_reduce<T>, dim3(static_cast<unsigned>((total + 255) / 256)), dim3(256), 0, stream,
                            partial, bias, y, splits, M, out);
}

template int launch_splitk_reduce<half>(const float*, const half*, half*, int, int, int, cudaStream_t);
template int launch_splitk_reduce<__nv_bfloat16>(const float*, const __nv_bfloat16*, __nv_bfloat16*, int, int, int,
                                                 cudaStream_t);

static int sm_count() {
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    return sms > 0 ? sms : 1;
}

// Split count: about 6 CTAs per SM (the tile is latency-bound, so more resident CTAs run faster
// even past one wave), each split keeping >= 16 k-tiles (two passes of the 8-stage ring), and at
// most 16 splits (past that the partial sums and their reduction cost more than they gain). H200
// session 7 (benchmarks/RESULTS.md), g128 fp16 M=8 µs, old rule (~2 CTAs per SM) -> this one:
// 4096x6144 6 -> 8 splits 15.9 -> 13.4, 4096x28672 2 -> 4 51.0 -> 45.1, 14336x4096 9 -> 16
// ~30 -> 25.1 (24 splits: 26.9).
int mma_splits(int m, int in, int out) {
    const int bm = m <= 16 ? 16 : (m <= 32 ? 32 : 64);
    const int tiles = ((out + kBN - 1) / kBN) * ((m + bm - 1) / bm);
    const int k_tiles = in / kBK;
    const int splits = (6 * sm_count() + tiles - 1) / tiles;
    return max(1, min(min(splits, 16), k_tiles / 16));
}

template <typename T>
int mma(const void* x, const int32_t* wq, const void* sz, const void* bias, void* y, float* workspace,
        int splits, int m, int in, int out, int group, cudaStream_t stream) {
    if (in % kBK || in % group || out % 8 || m < 1 || splits < 1) return static_cast<int>(cudaErrorInvalidValue);
    const int k_tiles = in / kBK;
    const int per_split = (k_tiles + splits - 1) / splits;
    splits = (k_tiles + per_split - 1) / per_split;  // no empty splits
    float* partial = splits > 1 ? workspace : nullptr;
    if (splits > 1 && workspace == nullptr) return static_cast<int>(cudaErrorInvalidValue);
    const T* xt = static_cast<const T*>(x);
    const T* st = static_cast<const T*>(sz);
    const T* bt = static_cast<const T*>(bias);
    T* yt = static_cast<T*>(y);
    const unsigned gx = static_cast<unsigned>((out + kBN - 1) / kBN);
    if (m <= 16) {
        mma_kernel<T, 16><<<dim3(gx, (m + 15) / 16, splits), kThreads, 0, stream>>>(xt, wq, st, bt, yt, partial, m, in, out, group, per_split);
    } else if (m <= 32) {
        mma_kernel<T, 32><<<dim3(gx, (m + 31) / 32, splits), kThreads, 0, stream>>>(xt, wq, st, bt, yt, partial, m, in, out, group, per_split);
    } else {
        mma_kernel<T, 64><<<dim3(gx, (m + 63) / 64, splits), kThreads, 0, stream>>>(xt, wq, st, bt, yt, partial, m, in, out, group, per_split);
    }
    if (cudaError_t e = cudaGetLastError()) return static_cast<int>(e);
    if (splits > 1) return launch_splitk_reduce<T>(partial, bt, yt, splits, m, out, stream);
    return 0;
}

template int mma<half>(const void*, const int32_t*, const void*, const void*, void*, float*, int, int, int, int, int, cudaStream_t);
template int mma<__nv_bfloat16>(const void*, const int32_t*, const void*, const void*, void*, float*, int, int, int, int, int, cudaStream_t);

}  // namespace awq
