// awq_orin dequantize: resident wq + sz -> dense W [out, in] (activation dtype) for the
// dequantize + cuBLAS path at large M. One thread per (column group, 4 inputs).
#include "awq_common.cuh"

namespace awq {

template <typename T>
__global__ void dequant_kernel(const int4* __restrict__ wq, const T* __restrict__ sz, T* __restrict__ w_out,
                               int in, int out, int group) {
    using T2 = typename Vec2<T>::type;
    const int quads = in / 4;
    const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= static_cast<long long>(out / 8) * quads) return;
    const int c = static_cast<int>(idx / quads), kq = static_cast<int>(idx % quads), k0 = kq * 4;
    const int4 wv = __ldg(wq + idx);
    const int4* szp = reinterpret_cast<const int4*>(sz + (static_cast<size_t>(k0 / group) * out + c * 8) * 2);
    const int4 sa = __ldg(szp), sb = __ldg(szp + 1);
    const T2* sv = reinterpret_cast<const T2*>(&sa);
    const T2* sw = reinterpret_cast<const T2*>(&sb);
    const T2 s2[4] = {sv[0], sv[2], sw[0], sw[2]};
    const T2 b2[4] = {sv[1], sv[3], sw[1], sw[3]};
    const uint32_t words[4] = {static_cast<uint32_t>(wv.x), static_cast<uint32_t>(wv.y),
                               static_cast<uint32_t>(wv.z), static_cast<uint32_t>(wv.w)};
    T2 w[4][4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        T2 q[4];
        unpack_pairs<T>(words[t], q);
#pragma unroll
        for (int j = 0; j < 4; ++j) w[t][j] = __hfma2(q[j], s2[j], b2[j]);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        T lo[4], hi[4];
#pragma unroll
        for (int t = 0; t < 4; ++t) { lo[t] = w[t][j].x; hi[t] = w[t][j].y; }
        *reinterpret_cast<uint2*>(w_out + static_cast<size_t>(c * 8 + 2 * j) * in + k0) = *reinterpret_cast<const uint2*>(lo);
        *reinterpret_cast<uint2*>(w_out + static_cast<size_t>(c * 8 + 2 * j + 1) * in + k0) = *reinterpret_cast<const uint2*>(hi);
    }
}

template <typename T>
int dequant(const int32_t* wq, const void* sz, void* w_out, int in, int out, int group, cudaStream_t stream) {
    if (in % group || in % 32 || out % 8) return static_cast<int>(cudaErrorInvalidValue);
    const long long items = static_cast<long long>(out / 8) * (in / 4);
    if (items == 0) return 0;
    const unsigned grid = static_cast<unsigned>((items + 255) / 256);
    dequant_kernel<T><<<grid, 256, 0, stream>>>(reinterpret_cast<const int4*>(wq), static_cast<const T*>(sz),
                                                static_cast<T*>(w_out), in, out, group);
    return static_cast<int>(cudaGetLastError());
}

template int dequant<half>(const int32_t*, const void*, void*, int, int, int, cudaStream_t);
template int dequant<__nv_bfloat16>(const int32_t*, const void*, void*, int, int, int, cudaStream_t);

}  // namespace awq
