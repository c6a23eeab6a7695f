// awq_orin dequantize: resident wq + sz -> dense W [out, in] (activation dtype) for the
// dequantize + cuBLAS path at large M, or a stack of n_exp experts (wq [E, out/8, in], sz
// [E, G, out, 2] -> W [E, out, in]) for the MoE dequantize + grouped GEMM path, in one launch.
// One thread per (column group, 4 inputs); grid y = expert.
#include "awq_common.cuh"

namespace awq {

template <typename T>
__global__ void dequant_kernel(const int4* __restrict__ wq, const T* __restrict__ sz, T* __restrict__ w_out,
                               int in, int out, int group) {
    using T2 = typename Vec2<T>::type;
    const int quads = in / 4;
    const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    const long long items = static_cast<long long>(out / 8) * quads;
    if (idx >= items) return;
    wq += blockIdx.y * items;
    sz += static_cast<size_t>(blockIdx.y) * (in / group) * out * 2;
    w_out += static_cast<size_t>(blockIdx.y) * out * in;
    const int c = static_cast<int>(idx / quads), kq = static_cast<int>(idx % quads), k0 = kq * 4;
    T2 s2[4], b2[4], w[4][4];
    load_pair_scales<T>(sz + pair_scale_offset(k0, group, out, c), s2, b2);
    dequant_quad<T>(__ldg(wq + idx), s2, b2, w);
    store_quad_rows<T>(w, w_out + static_cast<size_t>(c) * 8 * in + k0, static_cast<size_t>(in));
}

template <typename T>
int dequant(const int32_t* wq, const void* sz, void* w_out, int in, int out, int group, int n_exp,
            cudaStream_t stream) {
    if (in % group || in % 32 || out % 8 || n_exp < 1 || n_exp > 65535) return static_cast<int>(cudaErrorInvalidValue);
    const long long items = static_cast<long long>(out / 8) * (in / 4);
    if (items == 0) return 0;
    const dim3 grid(static_cast<unsigned>((items + 255) / 256), n_exp);
    dequant_kernel<T><<<grid, 256, 0, stream>>>(reinterpret_cast<const int4*>(wq), static_cast<const T*>(sz),
                                                static_cast<T*>(w_out), in, out, group);
    return static_cast<int>(cudaGetLastError());
}

template int dequant<half>(const int32_t*, const void*, void*, int, int, int, int, cudaStream_t);
template int dequant<__nv_bfloat16>(const int32_t*, const void*, void*, int, int, int, int, cudaStream_t);

}  // namespace awq
