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
// Large batches (prefill: 65536 pairs at 8192 tokens of top-8 took one CTA 212 us on an H200) split
// into chunks of kRouteChunk pairs, one CTA each, in two launches: route_count_kernel writes each
// chunk's per-expert counts, then every route_kernel CTA sums the counts of all chunks (expert
// totals, scanned, give the offsets) and of the chunks before its own (its start within each
// expert), and places its chunk as the one CTA places everything: the same stable order.
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
constexpr int kRouteChunk = 1024;  // pairs per CTA when the routing is split (a multiple of kRouteThreads)

template <typename I>
__device__ __forceinline__ int local_expert(const I* ids, const int* emap, int n_global, int n_exp, int p,
                                            bool& local) {
    long long g = static_cast<long long>(ids[p]);
    if (emap != nullptr) g = (g >= 0 && g < n_global) ? emap[g] : -1;
    local = g >= 0 && g < n_exp;
    return local ? static_cast<int>(g) : n_exp - 1;
}

// Per-expert counts of chunk blockIdx.x (pairs [blockIdx.x * kRouteChunk, +kRouteChunk)) into
// counts[blockIdx.x][n_exp]; every entry is written, so the buffer needs no zeroing.
template <typename I>
__global__ void __launch_bounds__(kRouteThreads) route_count_kernel(const I* __restrict__ ids,
                                                                    const int* __restrict__ emap, int n_global,
                                                                    int n_pairs, int n_exp,
                                                                    int* __restrict__ counts) {
    extern __shared__ int smem_count[];  // [n_exp]
    const int tid = threadIdx.x;
    kbit::pdl_trigger();
    kbit::pdl_wait();
    for (int e = tid; e < n_exp; e += kRouteThreads) smem_count[e] = 0;
    __syncthreads();
    const int p0 = blockIdx.x * kRouteChunk, p1 = min(n_pairs, p0 + kRouteChunk);
    for (int p = p0 + tid; p < p1; p += kRouteThreads) {
        bool local;
        atomicAdd(&smem_count[local_expert(ids, emap, n_global, n_exp, p, local)], 1);
    }
    __syncthreads();
    for (int e = tid; e < n_exp; e += kRouteThreads) counts[static_cast<size_t>(blockIdx.x) * n_exp + e] = smem_count[e];
}

// counts == nullptr: one CTA routes every pair (histogram in shared memory). Else CTA c places the
// pairs of chunk c from the per-chunk counts of route_count_kernel.
template <typename I>
__global__ void __launch_bounds__(kRouteThreads) route_kernel(const I* __restrict__ ids,
                                                              const float* __restrict__ w_in,
                                                              const int* __restrict__ emap, int n_global,
                                                              int n_pairs, int top_k, int n_exp,
                                                              int* __restrict__ offs, int* __restrict__ src_row,
                                                              int* __restrict__ slot, float* __restrict__ w_out,
                                                              const uint4* __restrict__ x, uint4* __restrict__ rows,
                                                              int row_chunks, int n_src,
                                                              const int* __restrict__ counts) {
    extern __shared__ int smem_route[];
    int* base = smem_route;                                                   // [n_exp] first row of expert
    int* run = base + n_exp;                                                  // [n_exp] rows placed so far
    unsigned short* whist = reinterpret_cast<unsigned short*>(run + n_exp);  // [warps][n_exp] chunk counts
    __shared__ int warp_tot[kRouteWarps];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    kbit::pdl_trigger();
    kbit::pdl_wait();  // ids and weights, and every output, only after the kernels before are done

    const int p_begin = counts == nullptr ? 0 : blockIdx.x * kRouteChunk;
    const int p_end = counts == nullptr ? n_pairs : min(n_pairs, p_begin + kRouteChunk);
    for (int e = tid; e < n_exp; e += kRouteThreads) base[e] = 0, run[e] = 0;
    for (int i = tid; i < kRouteWarps * n_exp; i += kRouteThreads) whist[i] = 0;
    __syncthreads();
    int before_me = 0;  // this CTA's start within expert tid (split mode)
    if (counts == nullptr) {
        for (int p = tid; p < n_pairs; p += kRouteThreads) {
            bool local;
            atomicAdd(&base[local_expert(ids, emap, n_global, n_exp, p, local)], 1);
        }
    } else if (tid < n_exp) {
        int tot = 0;
        for (int c = 0; c < static_cast<int>(gridDim.x); ++c) {
            const int v = counts[static_cast<size_t>(c) * n_exp + tid];
            tot += v;
            before_me += c < static_cast<int>(blockIdx.x) ? v : 0;
        }
        base[tid] = tot;
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
        base[tid] = first + before_me;
        if (blockIdx.x == 0) offs[tid] = first;
    }
    if (tid == 0 && blockIdx.x == 0) offs[n_exp] = n_pairs;
    __syncthreads();

    const unsigned lt_mask = (1u << lane) - 1u;
    for (int c0 = p_begin; c0 < p_end; c0 += kRouteThreads) {
        const int p = c0 + tid;
        const bool valid = p < p_end;
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
                 int n_src, int* counts, cudaStream_t stream) {
    if (n_exp < 1 || n_exp > kRouteThreads || top_k < 1 || n_pairs < 0) return static_cast<int>(cudaErrorInvalidValue);
    if (counts != nullptr && rows != nullptr) return static_cast<int>(cudaErrorInvalidValue);  // gather: one CTA only
    if (n_pairs == 0) counts = nullptr;  // no pairs: the one-CTA kernel writes the offsets
    const int n_chunks = counts != nullptr ? (n_pairs + kRouteChunk - 1) / kRouteChunk : 1;
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
    if (counts != nullptr) {
        const size_t csmem = static_cast<size_t>(n_exp) * sizeof(int);
        const int ce = kbit::pdl_launch(route_count_kernel<I>, dim3(n_chunks), dim3(kRouteThreads), csmem, stream, ids,
                                        emap, n_global, n_pairs, n_exp, counts);
        if (ce != 0) return ce;
    }
    return kbit::pdl_launch(route_kernel<I>, dim3(n_chunks), dim3(kRouteThreads), smem, stream, ids, w, emap, n_global,
                            n_pairs, top_k, n_exp, offs, src_row, slot, w_out, static_cast<const uint4*>(x),
                            static_cast<uint4*>(rows), row_chunks, n_src, static_cast<const int*>(counts));
}

}  // namespace

// x / rows null: routing only; else rows [n_pairs, row_chunks] = x [n_src, row_chunks] in sorted
// order (16-byte chunks, both 16-byte aligned). counts (routing only): int scratch of
// route_chunks(n_pairs) * n_exp entries, which splits the routing over that many CTAs; null: one CTA.
int route(const void* ids, int ids_bytes, const float* w, const int* emap, int n_global, int n_pairs, int top_k,
          int n_exp, int* offs, int* src_row, int* slot, float* w_out, const void* x, void* rows, int row_chunks,
          int n_src, int* counts, cudaStream_t stream) {
    if (ids_bytes == 8)
        return launch_route(static_cast<const long long*>(ids), w, emap, n_global, n_pairs, top_k, n_exp, offs,
                            src_row, slot, w_out, x, rows, row_chunks, n_src, counts, stream);
    if (ids_bytes == 4)
        return launch_route(static_cast<const int*>(ids), w, emap, n_global, n_pairs, top_k, n_exp, offs, src_row,
                            slot, w_out, x, rows, row_chunks, n_src, counts, stream);
    return static_cast<int>(cudaErrorInvalidValue);
}

// CTAs (and rows of the counts scratch) of a split routing of n_pairs pairs.
int route_chunks(int n_pairs) { return (n_pairs + kRouteChunk - 1) / kRouteChunk; }

}  // namespace moe
