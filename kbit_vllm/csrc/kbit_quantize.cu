// kbit quantize: one warp per block of 32 weights; bit-exact with formats/kbit.py.
#include "common.cuh"

namespace kbit {

template <typename T, int K>
__global__ void quantize_kernel(const T* __restrict__ w, const float* __restrict__ codebook,
                                int rows, int cols, int32_t* __restrict__ packed,
                                uint8_t* __restrict__ absmax) {
    const int lane = threadIdx.x & 31;
    const int blocks_per_row = cols / kBlock;
    const long long block = static_cast<long long>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    if (block >= static_cast<long long>(rows) * blocks_per_row) return;  // whole warp exits together
    const float x = to_float(w[block * kBlock + lane]);
    const float amax = warp_max(fabsf(x));
    const uint8_t code = encode_e4m4(amax);
    const float scale = decode_e4m4(code);
    const float normalized = scale > 0.f ? __fdiv_rn(x, scale) : 0.f;
    int best = 0;
    float best_dist = fabsf(normalized - codebook[0]);
#pragma unroll
    for (int i = 1; i < (1 << K); ++i) {
        const float d = fabsf(normalized - codebook[i]);
        if (d < best_dist) { best_dist = d; best = i; }
    }
#pragma unroll
    for (int b = 0; b < K; ++b) {
        const unsigned plane = __ballot_sync(0xffffffffu, (best >> b) & 1);
        if (lane == b) packed[block * K + b] = static_cast<int32_t>(plane);
    }
    if (lane == 0) absmax[block] = code;
}

template <typename T>
int launch_quantize(const void* w, const float* codebook, int k, int rows, int cols,
                    int32_t* packed, uint8_t* absmax, cudaStream_t stream) {
    if (cols % kBlock != 0 || rows < 0) return static_cast<int>(cudaErrorInvalidValue);
    const long long blocks = static_cast<long long>(rows) * (cols / kBlock);
    if (blocks == 0) return 0;
    constexpr int kWarps = 8;
    const unsigned grid = static_cast<unsigned>((blocks + kWarps - 1) / kWarps);
    const T* wt = static_cast<const T*>(w);
    switch (k) {
        case 2: quantize_kernel<T, 2><<<grid, kWarps * 32, 0, stream>>>(wt, codebook, rows, cols, packed, absmax); break;
        case 3: quantize_kernel<T, 3><<<grid, kWarps * 32, 0, stream>>>(wt, codebook, rows, cols, packed, absmax); break;
        case 4: quantize_kernel<T, 4><<<grid, kWarps * 32, 0, stream>>>(wt, codebook, rows, cols, packed, absmax); break;
        case 5: quantize_kernel<T, 5><<<grid, kWarps * 32, 0, stream>>>(wt, codebook, rows, cols, packed, absmax); break;
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
    KBIT_RETURN_LAUNCH_STATUS();
}

template int launch_quantize<half>(const void*, const float*, int, int, int, int32_t*, uint8_t*, cudaStream_t);
template int launch_quantize<__nv_bfloat16>(const void*, const float*, int, int, int, int32_t*, uint8_t*, cudaStream_t);
template int launch_quantize<float>(const void*, const float*, int, int, int, int32_t*, uint8_t*, cudaStream_t);

}  // namespace kbit
