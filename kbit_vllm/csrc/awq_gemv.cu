// awq_orin GEMV / small batch (M = 1..8): each warp streams one 8-output column group of the
// resident wq over a slice of K with 16-byte loads, dequantizes each word once (LOP3 + one
// hfma2 per pair) and FMAs it into all M rows; lanes and warps then reduce. Launched with PDL
// (pdl.cuh): the launch overlaps the previous kernel's tail.
#include "awq_common.cuh"
#include "pdl.cuh"

namespace awq {

constexpr int kWarps = kGemvWarps;

template <typename T, int M>
__global__ void __launch_bounds__(kWarps * 32)
gemv_kernel(const T* __restrict__ x, const int4* __restrict__ wq, const T* __restrict__ sz,
            const T* __restrict__ bias, T* __restrict__ y, int in, int out, int group, int wpo) {
    __shared__ float red[kWarps][M * 8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c = blockIdx.x * (kWarps / wpo) + warp / wpo;  // column group: outputs 8c..8c+7
    const int wi = warp % wpo;
    const bool valid = c < out / 8;
    float acc[M][8];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int o = 0; o < 8; ++o) acc[m][o] = 0.f;

    kbit::pdl_trigger();
    kbit::pdl_wait();  // everything below reads x or writes y
    if (valid) {
        const int4* wrow = wq + static_cast<size_t>(c) * (in / 4);
        gemv_accumulate<T, M>(x, in, M - 1, wrow, sz, out, group, c, wi * 32 + lane, wpo * 32, acc);
    }
    warp_sums_to_shared<M>(acc, red[warp], lane);
    __syncthreads();
    if (valid && wi == 0) {
        for (int i = lane; i < M * 8; i += 32) {
            float v = 0.f;
            for (int w = 0; w < wpo; ++w) v += red[warp + w][i];
            const int m = i / 8, o = c * 8 + i % 8;
            if (bias != nullptr) v += to_f<T>(bias[o]);
            y[static_cast<size_t>(m) * out + o] = from_f<T>(v);
        }
    }
}

template <typename T, int M>
static int launch(const T* x, const int4* wq, const T* sz, const T* bias, T* y, int in, int out, int group, int wpo,
                  cudaStream_t stream) {
    const int groups = out / 8;
    const int per_cta = kWarps / wpo;
    const unsigned grid = static_cast<unsigned>((groups + per_cta - 1) / per_cta);
    return kbit::pdl_launch(gemv_kernel<T, M>, dim3(grid), dim3(kWarps * 32), 0, stream, x, wq, sz, bias, y, in, out,
                            group, wpo);
}

template <typename T>
int gemv(const void* x, const int32_t* wq, const void* sz, const void* bias, void* y, int m, int in,
         int out, int group, cudaStream_t stream) {
    if (in % group || in % 32 || out % 8 || m < 1 || m > 8) return static_cast<int>(cudaErrorInvalidValue);
    const T* xt = static_cast<const T*>(x);
    const int4* w4 = reinterpret_cast<const int4*>(wq);
    const T* st = static_cast<const T*>(sz);
    const T* bt = static_cast<const T*>(bias);
    T* yt = static_cast<T*>(y);
    const int wpo = warps_per_group(in, out / 8);
    switch (m) {
        case 1: return launch<T, 1>(xt, w4, st, bt, yt, in, out, group, wpo, stream);
        case 2: return launch<T, 2>(xt, w4, st, bt, yt, in, out, group, wpo, stream);
        case 3: return launch<T, 3>(xt, w4, st, bt, yt, in, out, group, wpo, stream);
        case 4: return launch<T, 4>(xt, w4, st, bt, yt, in, out, group, wpo, stream);
        case 5: return launch<T, 5>(xt, w4, st, bt, yt, in, out, group, wpo, stream);
        case 6: return launch<T, 6>(xt, w4, st, bt, yt, in, out, group, wpo, stream);
        case 7: return launch<T, 7>(xt, w4, st, bt, yt, in, out, group, wpo, stream);
        default: return launch<T, 8>(xt, w4, st, bt, yt, in, out, group, wpo, stream);
    }
}

template int gemv<half>(const void*, const int32_t*, const void*, const void*, void*, int, int, int, int, cudaStream_t);
template int gemv<__nv_bfloat16>(const void*, const int32_t*, const void*, const void*, void*, int, int, int, int, cudaStream_t);

}  // namespace awq
