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
template <typename T>
int launch_dequant(const void* packed, const uint8_t* absmax, const float* codebook, int k, int rows, int nb,
                   void* out, cudaStream_t stream);
template <typename T>
int launch_dequant_tiled(const void* packed_t, const uint8_t* absmax_t, const float* codebook, int k, int out_f,
                         int nb, void* out, cudaStream_t stream);
int launch_repack(const void* packed, const uint8_t* absmax, int k, int out_f, int nb, void* packed_t,
                  uint8_t* absmax_t, bool inverse, cudaStream_t stream);
template <typename T>
int launch_gemv(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int k, int M,
                int N, int nb, void* y, int rgpc, int wk, int splits, cudaStream_t s);
template <typename T>
int launch_gemv_sk(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int k, int M,
                   int N, int nb, void* y, int ctas, float* ws, int* counters, cudaStream_t s);
template <typename T>
int gemv_sk_ctas_per_sm(int k, int M);
int gemv_sk_warps(int k);
template <typename T>
int launch_gemv_rows(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int k,
                     int M, int N, int nb, void* y, int rows, cudaStream_t s);
template <typename T>
int gemv_rows_ctas_per_sm(int k, int nb, int rows);
template <typename T>
int launch_mma(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int k, int M,
               int N, int nb, void* y, int mb, int tw, int variant, int ctas, int det, float* ws, int* counters,
               cudaStream_t s);
template <typename T>
int mma_ctas_per_sm(int k, int mb, int tw, int variant);
int mma_stage_blocks(int variant);
template <typename T>
int launch_wgmma(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int k, int M,
                 int N, int nb, void* y, int rows, int ctas, float* ws, int* counters, int splits, cudaStream_t s);
template <typename T>
int wgmma_ctas_per_sm(int k, int rows);
template <typename T>
int wgmma_ck_clusters(int k, int rows, int splits);
template <typename T>
int launch_gemv_tc(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int k, int M,
                   int N, int nb, void* y, int ctas, float* ws, int* counters, cudaStream_t s);
template <typename T>
int gemv_tc_ctas_per_sm(int k);
int launch_stream_read(const void* src, long long bytes, uint32_t* sink, int ctas, int unroll, int wait_first,
                       cudaStream_t stream);
int stream_read_ctas_per_sm(int unroll);
}

namespace kbit {

namespace {
int g_pdl = 1;           // kbit_vllm_set_pdl
int g_cc_major[64] = {}; // per device ordinal, 0 = not looked up yet
}  // namespace

bool pdl_enabled() {
    if (!g_pdl) return false;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) return false;
    if (dev >= 64) return false;
    if (g_cc_major[dev] == 0 &&
        cudaDeviceGetAttribute(&g_cc_major[dev], cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
        return false;
    return g_cc_major[dev] >= 9;
}

}  // namespace kbit

extern "C" {

const char* kbit_vllm_archs() { return KBIT_ARCHS; }

// Programmatic dependent launch for the kernels that support it (pdl.cuh): 1 on (the default,
// used on sm_90+ only), 0 off. Returns the previous setting.
int kbit_vllm_set_pdl(int on) {
    const int old = kbit::g_pdl;
    kbit::g_pdl = on != 0;
    return old;
}

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

int kbit_vllm_repack(const void* packed, const uint8_t* absmax, int k, int out_f, int nb, void* packed_t,
                     uint8_t* absmax_t, void* stream) {
    return kbit::launch_repack(packed, absmax, k, out_f, nb, packed_t, absmax_t, false,
                               static_cast<cudaStream_t>(stream));
}

int kbit_vllm_unrepack(const void* packed_t, const uint8_t* absmax_t, int k, int out_f, int nb, void* packed,
                       uint8_t* absmax, void* stream) {
    return kbit::launch_repack(packed, absmax, k, out_f, nb, const_cast<void*>(packed_t),
                               const_cast<uint8_t*>(absmax_t), true, static_cast<cudaStream_t>(stream));
}

#define KBIT_DEQUANT_API(SUFFIX, T)                                                                       \
    int kbit_vllm_dequantize_##SUFFIX(const void* packed, const uint8_t* absmax, const float* codebook,   \
                                      int k, int rows, int nb, void* out, void* stream) {                 \
        return kbit::launch_dequant<T>(packed, absmax, codebook, k, rows, nb, out,                        \
                                       static_cast<cudaStream_t>(stream));                                \
    }
KBIT_DEQUANT_API(fp16, half)
KBIT_DEQUANT_API(bf16, __nv_bfloat16)
KBIT_DEQUANT_API(fp32, float)

#define KBIT_LINEAR_API(SUFFIX, T)                                                                        \
    int kbit_vllm_dequantize_tiled_##SUFFIX(const void* pt, const uint8_t* at, const float* codebook,     \
                                            int k, int out_f, int nb, void* out, void* stream) {          \
        return kbit::launch_dequant_tiled<T>(pt, at, codebook, k, out_f, nb, out,                         \
                                             static_cast<cudaStream_t>(stream));                          \
    }                                                                                                     \
    int kbit_vllm_gemv_##SUFFIX(const void* x, const void* pt, const uint8_t* at, const float* cb,        \
                                const void* bias, int k, int M, int N, int nb, void* y, int rgpc, int wk, \
                                int splits, void* stream) {                                               \
        return kbit::launch_gemv<T>(x, pt, at, cb, bias, k, M, N, nb, y, rgpc, wk, splits,                \
                                    static_cast<cudaStream_t>(stream));                                   \
    }                                                                                                     \
    int kbit_vllm_gemv_sk_##SUFFIX(const void* x, const void* pt, const uint8_t* at, const float* cb,     \
                                   const void* bias, int k, int M, int N, int nb, void* y, int ctas,      \
                                   float* ws, int* counters, void* stream) {                              \
        return kbit::launch_gemv_sk<T>(x, pt, at, cb, bias, k, M, N, nb, y, ctas, ws, counters,           \
                                       static_cast<cudaStream_t>(stream));                                \
    }                                                                                                     \
    int kbit_vllm_gemv_sk_ctas_per_sm_##SUFFIX(int k, int M) { return kbit::gemv_sk_ctas_per_sm<T>(k, M); } \
    int kbit_vllm_gemv_rows_##SUFFIX(const void* x, const void* pt, const uint8_t* at, const float* cb,   \
                                     const void* bias, int k, int M, int N, int nb, void* y, int rows,    \
                                     void* stream) {                                                      \
        return kbit::launch_gemv_rows<T>(x, pt, at, cb, bias, k, M, N, nb, y, rows,                       \
                                         static_cast<cudaStream_t>(stream));                              \
    }                                                                                                     \
    int kbit_vllm_gemv_rows_ctas_per_sm_##SUFFIX(int k, int nb, int rows) {                               \
        return kbit::gemv_rows_ctas_per_sm<T>(k, nb, rows);                                               \
    }                                                                                                     \
    int kbit_vllm_mma_##SUFFIX(const void* x, const void* pt, const uint8_t* at, const float* cb,         \
                               const void* bias, int k, int M, int N, int nb, void* y, int mb, int tw,    \
                               int ctas, int det, float* ws, int* counters, void* stream) {               \
        return kbit::launch_mma<T>(x, pt, at, cb, bias, k, M, N, nb, y, mb, tw, 0, ctas, det, ws,         \
                                   counters, static_cast<cudaStream_t>(stream));                          \
    }                                                                                                     \
    int kbit_vllm_mma_ctas_per_sm_##SUFFIX(int k, int mb, int tw) {                                       \
        return kbit::mma_ctas_per_sm<T>(k, mb, tw, 0);                                                    \
    }                                                                                                     \
    int kbit_vllm_mma_variant_##SUFFIX(const void* x, const void* pt, const uint8_t* at, const float* cb, \
                                       const void* bias, int k, int M, int N, int nb, void* y, int mb,    \
                                       int tw, int variant, int ctas, int det, float* ws, int* counters,  \
                                       void* stream) {                                                    \
        return kbit::launch_mma<T>(x, pt, at, cb, bias, k, M, N, nb, y, mb, tw, variant, ctas, det, ws,   \
                                   counters, static_cast<cudaStream_t>(stream));                          \
    }                                                                                                     \
    int kbit_vllm_mma_variant_ctas_per_sm_##SUFFIX(int k, int mb, int tw, int variant) {                  \
        return kbit::mma_ctas_per_sm<T>(k, mb, tw, variant);                                              \
    }                                                                                                     \
    int kbit_vllm_wgmma_##SUFFIX(const void* x, const void* pt, const uint8_t* at, const float* cb,       \
                                 const void* bias, int k, int M, int N, int nb, void* y, int rows,        \
                                 int ctas, float* ws, int* counters, void* stream) {                      \
        return kbit::launch_wgmma<T>(x, pt, at, cb, bias, k, M, N, nb, y, rows, ctas, ws, counters, 0,    \
                                     static_cast<cudaStream_t>(stream));                                  \
    }                                                                                                     \
    int kbit_vllm_wgmma_ck_##SUFFIX(const void* x, const void* pt, const uint8_t* at, const float* cb,    \
                                    const void* bias, int k, int M, int N, int nb, void* y, int rows,     \
                                    int splits, int ctas, void* stream) {                                 \
        return kbit::launch_wgmma<T>(x, pt, at, cb, bias, k, M, N, nb, y, rows, ctas, nullptr, nullptr,   \
                                     splits, static_cast<cudaStream_t>(stream));                          \
    }                                                                                                     \
    int kbit_vllm_wgmma_ctas_per_sm_##SUFFIX(int k, int rows) { return kbit::wgmma_ctas_per_sm<T>(k, rows); } \
    int kbit_vllm_wgmma_ck_clusters_##SUFFIX(int k, int rows, int splits) {                               \
        return kbit::wgmma_ck_clusters<T>(k, rows, splits);                                               \
    }                                                                                                     \
    int kbit_vllm_gemv_tc_##SUFFIX(const void* x, const void* pt, const uint8_t* at, const float* cb,     \
                                   const void* bias, int k, int M, int N, int nb, void* y, int ctas,      \
                                   float* ws, int* counters, void* stream) {                              \
        return kbit::launch_gemv_tc<T>(x, pt, at, cb, bias, k, M, N, nb, y, ctas, ws, counters,           \
                                       static_cast<cudaStream_t>(stream));                                \
    }                                                                                                     \
    int kbit_vllm_gemv_tc_ctas_per_sm_##SUFFIX(int k) { return kbit::gemv_tc_ctas_per_sm<T>(k); }
KBIT_LINEAR_API(fp16, half)
KBIT_LINEAR_API(bf16, __nv_bfloat16)

// Quantization blocks per work unit of MMA variant v (variant 0 is the default kernel; 1.. are
// alternatives timed beside it); 0 for an unknown variant.
int kbit_vllm_mma_stage_blocks(int variant) { return kbit::mma_stage_blocks(variant); }
// Warps per CTA of the stream-K GEMVs, dense and grouped, at k bits; 0 for other k.
int kbit_vllm_gemv_sk_warps(int k) { return kbit::gemv_sk_warps(k); }

// The read-only stream of stream_read.cu (a measured floor for the benchmarks): `bytes` (a multiple
// of 16) from 16-byte-aligned src by `ctas` CTAs with `unroll` (2, 4, 8) loads a thread in flight, after
// the kernel before it (PDL) when wait_first; CTA b writes the XOR of the words it read to sink[b].
int kbit_vllm_stream_read(const void* src, long long bytes, uint32_t* sink, int ctas, int unroll, int wait_first,
                          void* stream) {
    return kbit::launch_stream_read(src, bytes, sink, ctas, unroll, wait_first, static_cast<cudaStream_t>(stream));
}
int kbit_vllm_stream_read_ctas_per_sm(int unroll) { return kbit::stream_read_ctas_per_sm(unroll); }

}  // extern "C"
