// The library's plain C API (loaded by backends/cuda/library.py through ctypes).
// Every function returns 0 on success or a cudaError_t value.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef KBIT_ARCHS
#define KBIT_ARCHS ""
#endif

namespace kbit {
template <typename T>
int launch_quantize(const void* w, const float* codebook, int k, int rows, int cols,
                    int32_t* packed, uint8_t* absmax, cudaStream_t stream);
}

extern "C" {

const char* kbit_vllm_archs() { return KBIT_ARCHS; }

const char* kbit_vllm_error_string(int code) {
    return cudaGetErrorString(static_cast<cudaError_t>(code));
}

#define KBIT_QUANTIZE_API(SUFFIX, T)                                                             \
    int kbit_vllm_quantize_##SUFFIX(const void* w, const float* codebook, int k, int rows,      \
                                    int cols, int32_t* packed, uint8_t* absmax, void* stream) { \
        return kbit::launch_quantize<T>(w, codebook, k, rows, cols, packed, absmax,             \
                                        static_cast<cudaStream_t>(stream));                     \
    }
KBIT_QUANTIZE_API(fp16, half)
KBIT_QUANTIZE_API(bf16, __nv_bfloat16)
KBIT_QUANTIZE_API(fp32, float)

}  // extern "C"
