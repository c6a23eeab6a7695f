// C API of the MoE grouped kernels (loaded by backends/cuda through ctypes). Every function
// returns 0 on success or a cudaError_t value. offs is the device int32 [n_exp + 1] expert
// offset tensor; rows of x are sorted by expert. Grid sizes (slots, items, splits) come from
// host-known shapes only, so every launch can be captured in a CUDA graph.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

namespace kbit {
template <typename T>
int launch_grouped_gemv(const void* x, const void* pt, const uint8_t* at, const float* cb, const int* offs, void* y,
                        int k, int n_exp, int rows, int N, int nb, int slots, int rgpc, int wk, cudaStream_t s);
template <typename T>
int launch_grouped_gemv_sk(const void* x, const void* pt, const uint8_t* at, const float* cb, const int* offs,
                           void* y, int k, int n_exp, int rows, int N, int nb, int mp, int max_items, int ctas,
                           float* accum, int* counters, cudaStream_t stream);
template <typename T>
int grouped_gemv_sk_ctas_per_sm(int k, int mp);
template <typename T>
int launch_grouped_mma(const void* x, const void* pt, const uint8_t* at, const float* cb, const int* offs, void* y,
                       int k, int n_exp, int rows, int N, int nb, int bm, int items, int splits, float* ws,
                       int* counters, cudaStream_t s);
}  // namespace kbit

namespace kbit {
template <typename T>
int launch_moe_experts(const void* x, const int* ids, const float* tw, const int* emap, int n_global, const void* p13,
                       const uint8_t* a13, const void* p2, const uint8_t* a2, const float* cb, void* y, void* act,
                       float* accum, int* counters, int k, int tokens, int topk, int n_exp, int H, int I, int fn,
                       int ctas, cudaStream_t stream);
template <typename T>
int moe_experts_ctas_per_sm(int k);
void moe_experts_scratch(int tokens, int topk, int H, int I, long long* accum_floats, long long* counter_ints);
template <typename T>
int launch_grouped_wgmma(const void* x, const void* pt, const uint8_t* at, const float* cb, const int* offs, void* y,
                         int k, int n_exp, int rows, int N, int nb, int rows_per_tile, int items, int splits,
                         int one_cta, float* workspace, cudaStream_t stream);
}  // namespace kbit

namespace awq {
template <typename T>
int grouped_gemv(const void* x, const int32_t* wq, const void* sz, const int* offs, void* y, int n_exp, int rows,
                 int in, int out, int group, int slots, cudaStream_t stream);
template <typename T>
int grouped_mma(const void* x, const int32_t* wq, const void* sz, const int* offs, void* y, float* workspace,
                int n_exp, int rows, int in, int out, int group, int bm, int items, int splits, cudaStream_t stream);
template <typename T>
int grouped_wgmma(const void* x, const int32_t* wq, const void* sz, const int* offs, void* y, float* workspace,
                  int n_exp, int rows, int in, int out, int group, int rows_per_tile, int items, int splits,
                  cudaStream_t stream);
}  // namespace awq

extern "C" {

// Zeroed scratch elements of one kbit_vllm_moe_experts_* launch (fp32 accum, int counters).
void kbit_vllm_moe_experts_scratch(int tokens, int topk, int H, int I, long long* accum_floats,
                                   long long* counter_ints) {
    kbit::moe_experts_scratch(tokens, topk, H, I, accum_floats, counter_ints);
}


#define KBIT_MOE_API(SUFFIX, T)                                                                                    \
    int kbit_vllm_grouped_gemv_##SUFFIX(const void* x, const void* pt, const uint8_t* at, const float* cb,        \
                                        const int* offs, void* y, int k, int n_exp, int rows, int N, int nb,       \
                                        int slots, int rgpc, int wk, void* stream) {                               \
        return kbit::launch_grouped_gemv<T>(x, pt, at, cb, offs, y, k, n_exp, rows, N, nb, slots, rgpc, wk,        \
                                            static_cast<cudaStream_t>(stream));                                    \
    }                                                                                                              \
    int kbit_vllm_grouped_gemv_sk_##SUFFIX(const void* x, const void* pt, const uint8_t* at, const float* cb,     \
                                           const int* offs, void* y, int k, int n_exp, int rows, int N, int nb,    \
                                           int mp, int max_items, int ctas, float* accum, int* counters,           \
                                           void* stream) {                                                         \
        return kbit::launch_grouped_gemv_sk<T>(x, pt, at, cb, offs, y, k, n_exp, rows, N, nb, mp, max_items, ctas, \
                                               accum, counters, static_cast<cudaStream_t>(stream));                \
    }                                                                                                              \
    int kbit_vllm_grouped_gemv_sk_ctas_per_sm_##SUFFIX(int k, int mp) {                                            \
        return kbit::grouped_gemv_sk_ctas_per_sm<T>(k, mp);                                                        \
    }                                                                                                              \
    int kbit_vllm_moe_experts_##SUFFIX(const void* x, const int* ids, const float* tw, const int* emap,           \
                                       int n_global, const void* p13, const uint8_t* a13, const void* p2,          \
                                       const uint8_t* a2, const float* cb, void* y, void* act, float* accum,       \
                                       int* counters, int k, int tokens, int topk, int n_exp, int H, int I, int fn, \
                                       int ctas, void* stream) {                                                   \
        return kbit::launch_moe_experts<T>(x, ids, tw, emap, n_global, p13, a13, p2, a2, cb, y, act, accum,        \
                                           counters, k, tokens, topk, n_exp, H, I, fn, ctas,                       \
                                           static_cast<cudaStream_t>(stream));                                     \
    }                                                                                                              \
    int kbit_vllm_moe_experts_ctas_per_sm_##SUFFIX(int k) { return kbit::moe_experts_ctas_per_sm<T>(k); }          \
    int kbit_vllm_grouped_mma_##SUFFIX(const void* x, const void* pt, const uint8_t* at, const float* cb,         \
                                       const int* offs, void* y, int k, int n_exp, int rows, int N, int nb, int bm, \
                                       int items, int splits, float* ws, int* counters, void* stream) {            \
        return kbit::launch_grouped_mma<T>(x, pt, at, cb, offs, y, k, n_exp, rows, N, nb, bm, items, splits, ws,   \
                                           counters, static_cast<cudaStream_t>(stream));                           \
    }                                                                                                              \
    int kbit_vllm_grouped_wgmma_##SUFFIX(const void* x, const void* pt, const uint8_t* at, const float* cb,       \
                                         const int* offs, void* y, int k, int n_exp, int rows, int N, int nb,      \
                                         int rows_per_tile, int items, int splits, int one_cta, float* ws,         \
                                         void* stream) {                                                           \
        return kbit::launch_grouped_wgmma<T>(x, pt, at, cb, offs, y, k, n_exp, rows, N, nb, rows_per_tile, items,  \
                                             splits, one_cta, ws, static_cast<cudaStream_t>(stream));              \
    }                                                                                                              \
    int kbit_vllm_awq_grouped_gemv_##SUFFIX(const void* x, const int32_t* wq, const void* sz, const int* offs,    \
                                            void* y, int n_exp, int rows, int in, int out, int group, int slots,   \
                                            void* stream) {                                                        \
        return awq::grouped_gemv<T>(x, wq, sz, offs, y, n_exp, rows, in, out, group, slots,                        \
                                    static_cast<cudaStream_t>(stream));                                            \
    }                                                                                                              \
    int kbit_vllm_awq_grouped_mma_##SUFFIX(const void* x, const int32_t* wq, const void* sz, const int* offs,     \
                                           void* y, float* workspace, int n_exp, int rows, int in, int out,        \
                                           int group, int bm, int items, int splits, void* stream) {               \
        return awq::grouped_mma<T>(x, wq, sz, offs, y, workspace, n_exp, rows, in, out, group, bm, items, splits,  \
                                   static_cast<cudaStream_t>(stream));                                            \
    }                                                                                                              \
    int kbit_vllm_awq_grouped_wgmma_##SUFFIX(const void* x, const int32_t* wq, const void* sz, const int* offs,   \
                                             void* y, float* workspace, int n_exp, int rows, int in, int out,      \
                                             int group, int rows_per_tile, int items, int splits, void* stream) {  \
        return awq::grouped_wgmma<T>(x, wq, sz, offs, y, workspace, n_exp, rows, in, out, group, rows_per_tile,   \
                                     items, splits, static_cast<cudaStream_t>(stream));                            \
    }
KBIT_MOE_API(fp16, half)
KBIT_MOE_API(bf16, __nv_bfloat16)

}  // extern "C"

namespace moe {
int route(const void* ids, int ids_bytes, const float* w, const int* emap, int n_global, int n_pairs, int top_k,
          int n_exp, int* offs, int* src_row, int* slot, float* w_out, const void* x, void* rows, int row_chunks,
          int n_src, int* counts, cudaStream_t stream);
int route_chunks(int n_pairs);
template <typename T>
int gated_act(const void* gu, void* out, long long rows, int inter, int fn, int sms, cudaStream_t stream);
template <typename T>
int combine(const void* down, const int* slot, const float* w, void* out, int tokens, int hidden, int top_k,
            cudaStream_t stream);
int gather(const void* x, const int* src_row, void* out, int rows, int row_chunks, int n_src, cudaStream_t stream);
}  // namespace moe

extern "C" {

// Routing of one MoE batch (moe_route.cu); ids int32 or int64 (ids_bytes 4 or 8), emap may be null.
// counts: null (one CTA) or int scratch of kbit_vllm_moe_route_chunks(n_pairs) * n_exp entries (split
// over that many CTAs, for large batches).
int kbit_vllm_moe_route(const void* ids, int ids_bytes, const float* w, const int* emap, int n_global, int n_pairs,
                        int top_k, int n_exp, int* offs, int* src_row, int* slot, float* w_out, int* counts,
                        void* stream) {
    return moe::route(ids, ids_bytes, w, emap, n_global, n_pairs, top_k, n_exp, offs, src_row, slot, w_out, nullptr,
                      nullptr, 0, 0, counts, static_cast<cudaStream_t>(stream));
}

int kbit_vllm_moe_route_chunks(int n_pairs) { return moe::route_chunks(n_pairs); }

// Routing, then the rows of x in routed order by the same CTA (moe_route.cu; small batches):
// rows[i] = x[src_row[i]], rows of row_chunks 16-byte chunks, x of n_src rows.
int kbit_vllm_moe_route_gather(const void* ids, int ids_bytes, const float* w, const int* emap, int n_global,
                               int n_pairs, int top_k, int n_exp, int* offs, int* src_row, int* slot, float* w_out,
                               const void* x, void* rows, int row_chunks, int n_src, void* stream) {
    if (x == nullptr || rows == nullptr) return static_cast<int>(cudaErrorInvalidValue);
    return moe::route(ids, ids_bytes, w, emap, n_global, n_pairs, top_k, n_exp, offs, src_row, slot, w_out, x, rows,
                      row_chunks, n_src, nullptr, static_cast<cudaStream_t>(stream));
}

// Rows of x in routed order (moe_gather.cu): out[i] = x[src_row[i]], rows of row_chunks 16-byte chunks.
int kbit_vllm_moe_gather(const void* x, const int* src_row, void* out, int rows, int row_chunks, int n_src,
                         void* stream) {
    return moe::gather(x, src_row, out, rows, row_chunks, n_src, static_cast<cudaStream_t>(stream));
}

#define KBIT_MOE_EPILOGUE_API(SUFFIX, T)                                                                           \
    int kbit_vllm_moe_gated_act_##SUFFIX(const void* gu, void* out, long long rows, int inter, int fn, int sms,    \
                                         void* stream) {                                                           \
        return moe::gated_act<T>(gu, out, rows, inter, fn, sms, static_cast<cudaStream_t>(stream));                \
    }                                                                                                              \
    int kbit_vllm_moe_combine_##SUFFIX(const void* down, const int* slot, const float* w, void* out, int tokens,   \
                                       int hidden, int top_k, void* stream) {                                      \
        return moe::combine<T>(down, slot, w, out, tokens, hidden, top_k, static_cast<cudaStream_t>(stream));      \
    }
KBIT_MOE_EPILOGUE_API(fp16, half)
KBIT_MOE_EPILOGUE_API(bf16, __nv_bfloat16)

}  // extern "C"
