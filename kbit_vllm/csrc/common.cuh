// Shared device helpers: E4M4 absmax decode/encode, warp reductions, error plumbing.
#pragma once
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

namespace kbit {

constexpr int kBlock = 32;       // quantization block: 32 input channels of one row
constexpr int kE4M4Bias = 11;

__device__ __forceinline__ float decode_e4m4(uint8_t raw) {
    const int e = raw >> 4;
    const int m = raw & 0xF;
    if (e == 0) return ldexpf(static_cast<float>(m), 1 - kE4M4Bias - 4);  // subnormal (and 0)
    return __uint_as_float(static_cast<uint32_t>(e - kE4M4Bias + 127) << 23 |
                           static_cast<uint32_t>(m) << 19);
}

// Nearest E4M4 code of v >= 0, ties to the larger code; values past the top saturate to 255.
// Same result as formats/e4m4.py's search over midpoints: find the largest code c with
// decode(c) <= v from v's float bits, then step up when v >= the midpoint to c + 1 (midpoints
// are exact in float32).
__host__ __device__ __forceinline__ float decode_e4m4_hd(int raw) {
    const int e = raw >> 4, m = raw & 0xF;
    return e == 0 ? ldexpf(static_cast<float>(m), 1 - kE4M4Bias - 4) : ldexpf(1.0f + m / 16.0f, e - kE4M4Bias);
}

__device__ __forceinline__ uint8_t encode_e4m4(float v) {
    if (!(v > 0.f)) return 0;
    int c;
    if (v < ldexpf(1.f, 1 - kE4M4Bias)) {  // subnormal range: step 2^-14
        c = static_cast<int>(floorf(ldexpf(v, kE4M4Bias + 3)));
    } else {
        const uint32_t bits = __float_as_uint(v);
        const int e = static_cast<int>((bits >> 23) & 0xFF) - 127 + kE4M4Bias;
        c = e > 15 ? 255 : (e << 4) | static_cast<int>((bits >> 19) & 0xF);
    }
    if (c < 255 && v >= 0.5f * (decode_e4m4_hd(c) + decode_e4m4_hd(c + 1))) ++c;
    return static_cast<uint8_t>(c);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <typename T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_float<half>(half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ half from_float<half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

}  // namespace kbit

// Host: return the first CUDA error of a launch as an int status (0 = success).
#define KBIT_RETURN_LAUNCH_STATUS() do { cudaError_t e_ = cudaGetLastError(); return static_cast<int>(e_); } while (0)

// Resident CTAs per SM of kernel f at `threads` threads and `smem` bytes of dynamic shared memory, for
// sizing a one-wave grid (every kernel's occupancy query, both formats); 0 where this GPU cannot run
// it (a request past its shared memory, e.g. the 160 KB of the k = 5 stream-K GEMVs on sm_86 /
// sm_89), with the runtime's last error cleared, so the failed query does not come back as a later
// launch's error (KBIT_RETURN_LAUNCH_STATUS).
namespace kbit {
inline int resident_ctas(const void* f, int threads, int smem) {
    int n = 0;
    if (cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, f, threads, smem) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}
}  // namespace kbit
