// C API of the awq_orin kernels (loaded by backends/cuda/awq_ops.py through ctypes).
// Every function returns 0 on success or a cudaError_t value.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

namespace awq {
template <typename T>
int gemv(const void* x, const int32_t* wq, const void* sz, const void* bias, void* y, int m, int in,
         int out, int group, cudaStream_t stream);
template <typename T>
int gemv_sk(const void* x, const int32_t* wq, const void* sz, const void* bias, void* y, int m, int in, int out,
            int group, int ctas, float* accum, int* counters, cudaStream_t stream);
template <typename T>
int gemv_sk_ctas_per_sm(int m);
template <typename T>
int gemv_tc(const void* x, const int32_t* wq, const void* sz, const void* bias, void* y, int m, int in, int out,
            int group, int ctas, float* accum, int* counters, cudaStream_t stream);
template <typename T>
int gemv_tc_ctas_per_sm();
template <typename T>
int mma(const void* x, const int32_t* wq, const void* sz, const void* bias, void* y, float* workspace,
        int splits, int m, int in, int out, int group, cudaStream_t stream);
int mma_splits(int m, int in, int out);
template <typename T>
int wgmma(const void* x, const int32_t* wq, const void* sz, const void* bias, void* y, int m, int in, int out,
          int group, int rows, int ctas, float* ws, int* counters, int splits, cudaStream_t stream);
template <typename T>
int wgmma_ctas_per_sm(int rows);
template <typename T>
int wgmma_ck_clusters(int rows, int splits);
template <typename T>
int dequant(const int32_t* wq, const void* sz, void* w_out, int in, int out, int group, int n_exp,
            cudaStream_t stream);
}

extern "C" {

#define KBIT_AWQ_API(SUFFIX, T)                                                                             \
    int kbit_vllm_awq_gemv_##SUFFIX(const void* x, const int32_t* wq, const void* sz, const void* bias,     \
                                    void* y, int m, int in, int out, int group, void* stream) {             \
        return awq::gemv<T>(x, wq, sz, bias, y, m, in, out, group, static_cast<cudaStream_t>(stream));      \
    }                                                                                                       \
    int kbit_vllm_awq_gemv_sk_##SUFFIX(const void* x, const int32_t* wq, const void* sz, const void* bias,  \
                                       void* y, int m, int in, int out, int group, int ctas, float* accum,  \
                                       int* counters, void* stream) {                                       \
        return awq::gemv_sk<T>(x, wq, sz, bias, y, m, in, out, group, ctas, accum, counters,                \
                               static_cast<cudaStream_t>(stream));                                          \
    }                                                                                                       \
    int kbit_vllm_awq_gemv_sk_ctas_per_sm_##SUFFIX(int m) { return awq::gemv_sk_ctas_per_sm<T>(m); }        \
    int kbit_vllm_awq_gemv_tc_##SUFFIX(const void* x, const int32_t* wq, const void* sz, const void* bias,  \
                                       void* y, int m, int in, int out, int group, int ctas, float* accum,  \
                                       int* counters, void* stream) {                                       \
        return awq::gemv_tc<T>(x, wq, sz, bias, y, m, in, out, group, ctas, accum, counters,                \
                               static_cast<cudaStream_t>(stream));                                          \
    }                                                                                                       \
    int kbit_vllm_awq_gemv_tc_ctas_per_sm_##SUFFIX() { return awq::gemv_tc_ctas_per_sm<T>(); }              \
    int kbit_vllm_awq_mma_##SUFFIX(const void* x, const int32_t* wq, const void* sz, const void* bias,      \
                                   void* y, float* workspace, int splits, int m, int in, int out,           \
                                   int group, void* stream) {                                               \
        return awq::mma<T>(x, wq, sz, bias, y, workspace, splits, m, in, out, group,                        \
                           static_cast<cudaStream_t>(stream));                                              \
    }                                                                                                       \
    int kbit_vllm_awq_wgmma_##SUFFIX(const void* x, const int32_t* wq, const void* sz, const void* bias,    \
                                     void* y, int m, int in, int out, int group, int rows, int ctas,        \
                                     float* ws, int* counters, void* stream) {                              \
        return awq::wgmma<T>(x, wq, sz, bias, y, m, in, out, group, rows, ctas, ws, counters, 0,            \
                             static_cast<cudaStream_t>(stream));                                            \
    }                                                                                                       \
    int kbit_vllm_awq_wgmma_ck_##SUFFIX(const void* x, const int32_t* wq, const void* sz, const void* bias, \
                                        void* y, int m, int in, int out, int group, int rows, int splits,   \
                                        int ctas, void* stream) {                                           \
        return awq::wgmma<T>(x, wq, sz, bias, y, m, in, out, group, rows, ctas, nullptr, nullptr, splits,   \
                             static_cast<cudaStream_t>(stream));                                            \
    }                                                                                                       \
    int kbit_vllm_awq_wgmma_ctas_per_sm_##SUFFIX(int rows) { return awq::wgmma_ctas_per_sm<T>(rows); }      \
    int kbit_vllm_awq_wgmma_ck_clusters_##SUFFIX(int rows, int splits) {                                    \
        return awq::wgmma_ck_clusters<T>(rows, splits);                                                     \
    }                                                                                                       \
    int kbit_vllm_awq_dequant_##SUFFIX(const int32_t* wq, const void* sz, void* w_out, int in, int out,     \
                                       int group, int n_exp, void* stream) {                                \
        return awq::dequant<T>(wq, sz, w_out, in, out, group, n_exp, static_cast<cudaStream_t>(stream));    \
    }
int kbit_vllm_awq_mma_splits(int m, int in, int out) { return awq::mma_splits(m, in, out); }

KBIT_AWQ_API(fp16, half)
KBIT_AWQ_API(bf16, __nv_bfloat16)

}  // extern "C"
