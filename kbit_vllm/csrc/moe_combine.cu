// MoE combine: out[t, h] = sum_k w[t * top_k + k] * down[slot[t * top_k + k], h], summed in fp32 in
// k order and rounded once, one launch (the torch version was six: allocation, index_copy_, cast,
// product, sum, cast back). Deterministic: no atomics. Launched with PDL (pdl.cuh): its launch
// overlaps the down GEMM's tail; it reads and writes only after pdl_wait.
#include "common.cuh"
#include "pdl.cuh"

namespace moe {

namespace {

constexpr int kCombineThreads = 128;

// Grid (tokens, column chunks); a thread owns V adjacent columns of one token.
template <typename T, int V>
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const T* __restrict__ down,
                                                                  const int* __restrict__ slot,
                                                                  const float* __restrict__ w, T* __restrict__ out,
                                                                  int hidden, int top_k, int n_rows) {
    kbit::pdl_trigger();
    kbit::pdl_wait();  // down, slot and w, and out, only after the kernels before are done (pdl.cuh)
    const int t = blockIdx.x;
    const int h = (blockIdx.y * kCombineThreads + threadIdx.x) * V;
    if (h >= hidden) return;
    float acc[V];
#pragma unroll
    for (int q = 0; q < V; ++q) acc[q] = 0.f;
    for (int k = 0; k < top_k; ++k) {
        const int p = t * top_k + k;
        const float wk = w[p];
        const int r = min(max(slot[p], 0), n_rows - 1);  // slots come from moe_route; clamp keeps reads in x
        const T* src = down + static_cast<size_t>(r) * hidden + h;
        if constexpr (V == 8) {
            const uint4 v = *reinterpret_cast<const uint4*>(src);
            const T* a = reinterpret_cast<const T*>(&v);
#pragma unroll
            for (int q = 0; q < 8; ++q) acc[q] += wk * kbit::to_float(a[q]);
        } else {
            acc[0] += wk * kbit::to_float(src[0]);
        }
    }
    T* dst = out + static_cast<size_t>(t) * hidden + h;
    if constexpr (V == 8) {
        uint4 o;
        T* a = reinterpret_cast<T*>(&o);
#pragma unroll
        for (int q = 0; q < 8; ++q) a[q] = kbit::from_float<T>(acc[q]);
        *reinterpret_cast<uint4*>(dst) = o;
    } else {
        dst[0] = kbit::from_float<T>(acc[0]);
    }
}

}  // namespace

template <typename T>
int combine(const void* down, const int* slot, const float* w, void* out, int tokens, int hidden, int top_k,
            cudaStream_t stream) {
    if (tokens < 0 || hidden < 1 || hidden > 65535 * kCombineThreads || top_k < 1)
        return static_cast<int>(cudaErrorInvalidValue);
    if (tokens == 0) return 0;
    const bool vec = hidden % 8 == 0 && reinterpret_cast<uintptr_t>(down) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(out) % 16 == 0;
    const int v = vec ? 8 : 1;
    const dim3 grid(tokens, (hidden / v + kCombineThreads - 1) / kCombineThreads);
    const int n_rows = tokens * top_k;
    const T* d = static_cast<const T*>(down);
    T* o = static_cast<T*>(out);
    return kbit::pdl_launch(vec ? combine_kernel<T, 8> : combine_kernel<T, 1>, grid, dim3(kCombineThreads), 0, stream,
                            d, slot, w, o, hidden, top_k, n_rows);
}

template int combine<half>(const void*, const int*, const float*, void*, int, int, int, cudaStream_t);
template int combine<__nv_bfloat16>(const void*, const int*, const float*, void*, int, int, int, cudaStream_t);

}  // namespace moe
