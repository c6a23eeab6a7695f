// MoE routing in one launch: the (token, k) pairs of a batch ordered by expert, stable.
//
// Why: the torch version (int64 cast, sort, arange, searchsorted, divide, inverse permutation,
// weight cast and mask) was ~8 kernel launches per MoE layer; at decode each costs more GPU time
// than the work. One CTA does it all: a shared-memory histogram gives the expert offsets; then the
// pairs are placed chunk by chunk in pair order (rank among the chunk's same-expert pairs from
// __match_any_sync within a warp and per-warp counts across warps), so the order is exactly a
// stable sort by expert: deterministic, and the same as the reference.
//
// Pair p = t * top_k + k has global expert id ids[p]; expert_map (optional) maps it to a local id
// (-1: another rank owns it). A pair whose local id is outside [0, n_exp) goes to the last expert
// with weight 0, so every row belongs to a group, offsets end at n_pairs, and no id addresses
// memory out of range. Outputs: offs [n_exp + 1], src_row [n_pairs] (token of each sorted row),
// slot [n_pairs] (sorted row of each pair), w_out [n_pairs] (fp32 weight of each pair, 0 if foreign).
//
// With x (moe_route_gather, small batches), the same CTA then copies the rows of x in sorted order
// (rows[i] = x[src_row[i]], 16-byte chunks): at decode the gather is a few KB, and as a kernel of
// its own it waited on the routing's completion and paid a launch (H200, Qwen3-30B-A3B shapes,
// T=1: route 3.1 + gather 2.6 us).
#include "common.cuh"
#include "pdl.cuh"

namespace moe {

namespace {

constexpr int kRouteThreads = 1024;
constexpr int kRouteWarps = kRouteThreads / 32;

template <typename I>
__device__ __forceinline__ int local_expert(const I* ids, const int* emap, int n_global, int n_exp, int p,
                                            bool& local) {
    long long g = static_cast<long long>(ids[p]);
    if (emap != nullptr) g = (g >= 0 && g < n_global) ? emap[g] : -1;
    local = g >= 0 && g < n_exp;
    return local ? static_cast<int>(g) : n_exp - 1;
}

template <typename I>
__global__ void __launch_bounds__(kRouteThreads) route_kernel(const I* __restrict__ ids,
                                                              const float* __restrict__ w_in,
                                                              const int* __restrict__ emap, int n_global,
                                                              int n_pairs, int top_k, int n_exp,
                                                              int* __restrict__ offs, int* __restrict__ src_row,
                                                              int* __restrict__ slot, float* __restrict__ w_out,
                                                              const uint4* __restrict__ x, uint4* __restrict__ rows,
                                                              int row_chunks, int n_src) {
    extern __shared__ int smem_route[];
    int* base = smem_route;                                                   // [n_exp] first row of expert
    int* run = base + n_exp;                                                  // [n_exp] rows placed so far
    unsigned short* whist = reinterpret_cast<unsigned short*>(run + n_exp);  // [warps][n_exp] chunk counts
    __shared__ int warp_tot[kRouteWarps];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    kbit::pdl_trigger();
    kbit::pdl_wait();  // ids and weights, and every output, only after the kernels before are done

    for (int e = tid; e < n_exp; e += kRouteThreads) base[e] = 0, run[e] = 0;
    for (int i = tid; i < kRouteWarps * n_exp; i += kRouteThreads) whist[i] = 0;
    __syncthreads();
    for (int p = tid; p < n_pairs; p += kRouteThreads) {
        bool local;
        atomicAdd(&base[local_expert(ids, emap, n_global, n_exp, p, local)], 1);
    }
    __syncthreads();

    // Exclusive scan of the counts (n_exp <= kRouteThreads: one expert per thread).
    const int cnt = tid < n_exp ? base[tid] : 0;
    int inc = cnt;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += v;
    }
    if (lane == 31) warp_tot[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        int t = warp_tot[lane], ti = t;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, ti, o);
            if (lane >= o) ti += v;
        }
        warp_tot[lane] = ti - t;
    }
    __syncthreads();
    if (tid < n_exp) {
        const int first = warp_tot[warp] + inc - cnt;
        base[tid] = first;
        offs[tid] = first;
    }
    if (tid == 0) offs[n_exp] = n_pairs;
    __syncthreads();

    const unsigned lt_mask = (1u << lane) - 1u;
    for (int c0 = 0; c0 < n_pairs; c0 += kRouteThreads) {
        const int p = c0 + tid;
        const bool valid = p < n_pairs;
        bool local = false;
        const int e = valid ? local_expert(ids, emap, n_global, n_exp, p, local) : -1;
        const unsigned peers = __match_any_sync(0xffffffffu, e);
        const int rank = __popc(peers & lt_mask);
        const bool leader = (peers & lt_mask) == 0;
        if (valid && leader) whist[warp * n_exp + e] = static_cast<unsigned short>(__popc(peers));
        __syncthreads();
        int pos = 0;
        if (valid) {
            int before = 0;
            for (int w = 0; w < warp; ++w) before += whist[w * n_exp + e];
            pos = base[e] + run[e] + before + rank;
        }
        __syncthreads();
        if (valid && leader) {
            atomicAdd(&run[e], __popc(peers));
            whist[warp * n_exp + e] = 0;
        }
        __syncthreads();
        if (valid) {
            slot[p] = pos;
            src_row[pos] = p / top_k;
            w_out[p] = local ? w_in[p] : 0.f;
        }
    }
    if (rows == nullptr) return;

    // The gather: src_row was written above by this CTA (visible to it after the barrier). Four
    // chunks in flight per thread; a token index past x is clamped (p / top_k < n_src by the caller).
    __syncthreads();
    constexpr int kG = 4;
    const int total = n_pairs * row_chunks;
    for (int i0 = tid; i0 < total; i0 += kG * kRouteThreads) {
        uint4 v[kG];
#pragma unroll
        for (int u = 0; u < kG; ++u) {
            const int i = i0 + u * kRouteThreads;
            if (i < total) {
                const int r = i / row_chunks, c = i - r * row_chunks;
                const int s = min(src_row[r], n_src - 1);
                v[u] = x[static_cast<size_t>(s) * row_chunks + c];
            }
        }
#pragma unroll
        for (int u = 0; u < kG; ++u) {
            const int i = i0 + u * kRouteThreads;
            if (i < total) rows[i] = v[u];
        }
    }
}

template <typename I>
int launch_route(const I* ids, const float* w, const int* emap, int n_global, int n_pairs, int top_k, int n_exp,
                 int* offs, int* src_row, int* slot, float* w_out, const void* x, void* rows, int row_chunks,
                 int n_src, cudaStream_t stream) {
    if (n_exp < 1 || n_exp > kRouteThreads || top_k < 1 || n_pairs < 0) return static_cast<int>(cudaErrorInvalidValue);
    if (rows != nullptr && (x == nullptr || row_chunks < 1 || n_src < (n_pairs + top_k - 1) / top_k ||
                            static_cast<long long>(n_pairs) * row_chunks > (1LL << 30) ||
                            reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(rows) % 16 != 0))
        return static_cast<int>(cudaErrorInvalidValue);
    const size_t smem = static_cast<size_t>(n_exp) * (2 * sizeof(int) + kRouteWarps * sizeof(unsigned short));
    if (smem > 48 * 1024) {
        const cudaError_t e = cudaFuncSetAttribute(route_kernel<I>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(smem));
        if (e != cudaSuccess) return static_cast<int>(e);
    }
    cudaLaunchAttribute attrs[1];
    const cudaLaunchConfig_t cfg = kbit::pdl_config(dim3(1), dim3(kRouteThreads), smem, stream, attrs);
    const cudaError_t e = cudaLaunchKernelEx(&cfg, route_kernel<I>, ids, w, emap, n_global, n_pairs, top_k, n_exp,
                                             offs, src_row, slot, w_out, static_cast<const uint4*>(x),
                                             static_cast<uint4*>(rows), row_chunks, n_src);
    if (e != cudaSuccess) return static_cast<int>(e);
    KBIT_RETURN_LAUNCH_STATUS();
}

}  // namespace

// x / rows null: routing only; else rows [n_pairs, row_chunks] = x [n_src, row_chunks] in sorted
// order (16-byte chunks, both 16-byte aligned).
int route(const void* ids, int ids_bytes, const float* w, const int* emap, int n_global, int n_pairs, int top_k,
          int n_exp, int* offs, int* src_row, int* slot, float* w_out, const void* x, void* rows, int row_chunks,
          int n_src, cudaStream_t stream) {
    if (ids_bytes == 8)
        return launch_route(static_cast<const long long*>(ids), w, emap, n_global, n_pairs, top_k, n_exp, offs,
                            src_row, slot, w_out, x, rows, row_chunks, n_src, stream);
    if (ids_bytes == 4)
        return launch_route(static_cast<const int*>(ids), w, emap, n_global, n_pairs, top_k, n_exp, offs, src_row,
                            slot, w_out, x, rows, row_chunks, n_src, stream);
    return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace moe
