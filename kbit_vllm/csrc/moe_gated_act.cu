// MoE gated activation: act[r, j] = f(gate_up[r, j]) * gate_up[r, I + j], computed in fp32 and
// rounded once to the activation dtype (as vLLM's silu_and_mul), one launch (the torch version
// was five: two casts, the activation, the product, the cast back).
// f: 0 silu, 1 gelu (erf), 2 gelu (tanh approximation), with torch's formulas.
// Launched with PDL (pdl.cuh) between the two grouped GEMMs: it reads gate_up only after
// pdl_wait, and lets the down GEMM start its table build at once.
#include "common.cuh"
#include "moe_common.cuh"
#include "pdl.cuh"

namespace moe {

namespace {

constexpr int kActThreads = 256;

// One thread per 8 outputs when inter % 8 == 0 (16-byte loads and stores), else per output.
template <typename T, int F, int V>
__global__ void __launch_bounds__(kActThreads) gated_act_kernel(const T* __restrict__ gu, T* __restrict__ out,
                                                                long long rows, int inter) {
    kbit::pdl_trigger();  // the down GEMM's table build may start; gate_up only after the GEMM is done
    kbit::pdl_wait();
    const int per_row = inter / V;
    const long long n = rows * per_row;
    for (long long i = blockIdx.x * static_cast<long long>(kActThreads) + threadIdx.x; i < n;
         i += static_cast<long long>(gridDim.x) * kActThreads) {
        const long long r = i / per_row;
        const int j = static_cast<int>(i - r * per_row) * V;
        const T* g = gu + r * 2 * inter + j;
        T* o = out + r * inter + j;
        if constexpr (V == 8) {
            const uint4 gv = *reinterpret_cast<const uint4*>(g);
            const uint4 uv = *reinterpret_cast<const uint4*>(g + inter);
            const T* ga = reinterpret_cast<const T*>(&gv);
            const T* ua = reinterpret_cast<const T*>(&uv);
            uint4 ov;
            T* oa = reinterpret_cast<T*>(&ov);
#pragma unroll
            for (int q = 0; q < 8; ++q)
                oa[q] = kbit::from_float<T>(gate_act<F>(kbit::to_float(ga[q])) * kbit::to_float(ua[q]));
            *reinterpret_cast<uint4*>(o) = ov;
        } else {
            o[0] = kbit::from_float<T>(gate_act<F>(kbit::to_float(g[0])) * kbit::to_float(g[inter]));
        }
    }
}

template <typename T, int F>
int launch_f(const void* gu, void* out, long long rows, int inter, int sms, cudaStream_t stream) {
    const bool vec = inter % 8 == 0 && reinterpret_cast<uintptr_t>(gu) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(out) % 16 == 0;
    const long long items = rows * (vec ? inter / 8 : inter);
    const long long want = (items + kActThreads - 1) / kActThreads;
    const int grid = static_cast<int>(want < 8LL * sms ? want : 8LL * sms);
    if (grid == 0) return 0;
    const T* g = static_cast<const T*>(gu);
    T* o = static_cast<T*>(out);
    return kbit::pdl_launch(vec ? gated_act_kernel<T, F, 8> : gated_act_kernel<T, F, 1>, dim3(grid), dim3(kActThreads),
                            0, stream, g, o, rows, inter);
}

}  // namespace

template <typename T>
int gated_act(const void* gu, void* out, long long rows, int inter, int fn, int sms, cudaStream_t stream) {
    if (inter < 1 || rows < 0 || sms < 1) return static_cast<int>(cudaErrorInvalidValue);
    switch (fn) {
        case 0: return launch_f<T, 0>(gu, out, rows, inter, sms, stream);
        case 1: return launch_f<T, 1>(gu, out, rows, inter, sms, stream);
        case 2: return launch_f<T, 2>(gu, out, rows, inter, sms, stream);
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
}

template int gated_act<half>(const void*, void*, long long, int, int, int, cudaStream_t);
template int gated_act<__nv_bfloat16>(const void*, void*, long long, int, int, int, cudaStream_t);

}  // namespace moe
