// awq_orin grouped GEMV / small batch (MoE, few rows per expert): for every expert e and each of
// its rows r, y[r, :] = x[r, :] @ W_e^T, all experts in one launch, reading the stacked resident
// layout wq [E, out/8, in] / sz [E, in/group, out, 2] (awq_repack per expert).
//
// Grid: x = CTAs over one expert's 8-output column groups (8 / wpo groups per CTA, wpo warps
// along K per group, as awq_gemv.cu); y = expert slot: slot s serves the s-th expert that has
// rows (moe::find_item over the device offsets). The host sizes y as min(experts, rows); slots
// past the last non-empty expert exit at once. Each warp streams its column group with 16-byte
// loads, dequantizes each word once and FMAs it into all rows of the pass (gemv_accumulate,
// shared with the dense GEMV); an expert's rows go in passes of MP = 1, 2 or 4 rows, picked per
// CTA from its row count (a later pass re-reads the weights, mostly from L2; all paths share one
// register allocation, so 8-row passes would cost the common 1-row path its occupancy). Lanes
// reduce by butterfly, warps through shared memory in a fixed order. Launched with PDL (pdl.cuh),
// as the dense GEMV: the launch overlaps the previous kernel's tail; everything but an L2 prefetch of
// the CTA's weights where slot s is expert s (rows >= experts) reads the offsets first.
#include "awq_common.cuh"
#include "l2_prefetch.cuh"
#include "moe_common.cuh"
#include "pdl.cuh"

namespace awq {

namespace {

template <typename T, int MP>
__device__ __forceinline__ void grouped_gemv_rows(const T* __restrict__ x, const int4* __restrict__ wq_e,
                                                  const T* __restrict__ sz_e, T* __restrict__ y, int row0, int row1,
                                                  int in, int out, int group, int wpo) {
    __shared__ float red[kGemvWarps][MP * 8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c = blockIdx.x * (kGemvWarps / wpo) + warp / wpo;  // column group: outputs 8c..8c+7
    const int wi = warp % wpo;
    const bool valid = c < out / 8;
    const int4* wrow = wq_e + static_cast<size_t>(valid ? c : 0) * (in / 4);
    for (int m0 = row0; m0 < row1; m0 += MP) {
        const int mr = min(MP, row1 - m0);
        float acc[MP][8];
#pragma unroll
        for (int m = 0; m < MP; ++m)
#pragma unroll
            for (int o = 0; o < 8; ++o) acc[m][o] = 0.f;
        if (valid)
            gemv_accumulate<T, MP>(x + static_cast<size_t>(m0) * in, in, mr - 1, wrow, sz_e, out, group, c,
                                   wi * 32 + lane, wpo * 32, acc);
        warp_sums_to_shared<MP>(acc, red[warp], lane);
        __syncthreads();
        if (valid && wi == 0) {
            for (int i = lane; i < mr * 8; i += 32) {
                float v = 0.f;
                for (int w = 0; w < wpo; ++w) v += red[warp + w][i];
                y[static_cast<size_t>(m0 + i / 8) * out + c * 8 + i % 8] = from_f<T>(v);
            }
        }
        __syncthreads();  // red is rewritten by the next pass
    }
}

template <typename T>
__global__ void __launch_bounds__(kGemvWarps * 32, 2)
grouped_gemv_kernel(const T* __restrict__ x, const int4* __restrict__ wq, const T* __restrict__ sz,
                    const int* __restrict__ offs, T* __restrict__ y, int n_exp, int rows, int in, int out, int group,
                    int wpo) {
    kbit::pdl_trigger();
    if (static_cast<int>(gridDim.y) == n_exp && threadIdx.x < 32) {
        // One slot per expert (rows >= experts): slot = expert, so this CTA's weights and scales,
        // which no kernel writes, go into L2 now and their DRAM trip overlaps the kernel before.
        const int per_cta = kGemvWarps / wpo, c0 = blockIdx.x * per_cta, cn = min(per_cta, out / 8 - c0);
        const size_t e = blockIdx.y;
        if (threadIdx.x == 0)
            kbit::l2_prefetch(wq + (e * (out / 8) + c0) * (in / 4), static_cast<uint32_t>(cn) * (in / 4) * 16u);
        for (int g = threadIdx.x; g < in / group; g += 32)  // scale rows [g][8 c0 .. 8 (c0 + cn)][2]
            kbit::l2_prefetch(sz + ((e * (in / group) + g) * out + c0 * 8) * 2,
                              static_cast<uint32_t>(cn) * 16u * sizeof(T));
    }
    kbit::pdl_wait();  // the offsets, x and y belong to the kernels around this one
    moe::Item it;
    if (!moe::find_item(offs, n_exp, rows, 0, static_cast<int>(blockIdx.y), it)) return;
    const int4* wq_e = wq + static_cast<size_t>(it.expert) * (out / 8) * (in / 4);
    const T* sz_e = sz + static_cast<size_t>(it.expert) * (in / group) * out * 2;
    const int n = it.row1 - it.row0;  // CTA-uniform
    if (n == 1) {
        grouped_gemv_rows<T, 1>(x, wq_e, sz_e, y, it.row0, it.row1, in, out, group, wpo);
    } else if (n == 2) {
        grouped_gemv_rows<T, 2>(x, wq_e, sz_e, y, it.row0, it.row1, in, out, group, wpo);
    } else {
        grouped_gemv_rows<T, 4>(x, wq_e, sz_e, y, it.row0, it.row1, in, out, group, wpo);
    }
}

}  // namespace

// slots: grid rows = min(experts, rows). offs: int32 [n_exp + 1] on the device.
template <typename T>
int grouped_gemv(const void* x, const int32_t* wq, const void* sz, const int* offs, void* y, int n_exp, int rows,
                 int in, int out, int group, int slots, cudaStream_t stream) {
    if (rows <= 0) return 0;
    if (in % group || in % 32 || out % 8 || out <= 0 || n_exp <= 0 || slots < 1 || slots > 65535)
        return static_cast<int>(cudaErrorInvalidValue);
    const int wpo = warps_per_group(in, static_cast<long long>(out / 8) * slots);
    const int per_cta = kGemvWarps / wpo;
    const dim3 grid(static_cast<unsigned>((out / 8 + per_cta - 1) / per_cta), static_cast<unsigned>(slots));
    return kbit::pdl_launch(grouped_gemv_kernel<T>, grid, dim3(kGemvWarps * 32), 0, stream, static_cast<const T*>(x),
                            reinterpret_cast<const int4*>(wq), static_cast<const T*>(sz), offs, static_cast<T*>(y),
                            n_exp, rows, in, out, group, wpo);
}

template int grouped_gemv<half>(const void*, const int32_t*, const void*, const int*, void*, int, int, int, int, int,
                                int, cudaStream_t);
template int grouped_gemv<__nv_bfloat16>(const void*, const int32_t*, const void*, const int*, void*, int, int, int,
                                         int, int, int, cudaStream_t);

}  // namespace awq
