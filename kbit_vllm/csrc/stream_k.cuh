// Stream-K pieces shared by the one-wave GEMVs of both formats (kbit_gemv_sk.cu,
// kbit_grouped_gemv_sk.cu, awq_gemv_sk.cu) and the kbit MMA: the split of all work units into
// equal contiguous ranges (one per warp or CTA), the vector reduction into a zeroed fp32
// accumulator in L2, the per-tile arrival counter that elects the warp which finishes a tile, and
// a warp reduce-scatter for kernels whose lanes split K.
//
// Accumulators and counters are zero on entry and left zero by the warp that finishes each tile,
// so one zeroed scratch buffer serves every launch and every CUDA-graph replay. The order of the
// fp32 additions varies from run to run (deterministic mode picks other kernels).
#pragma once
#include "common.cuh"

namespace kbit {

constexpr int kSkWarps = 8;  // warps per CTA of the stream-K GEMVs
constexpr int kSkThreads = kSkWarps * 32;

// First unit of range w of `ranges` equal ranges over `units`: [start(w), start(w + 1)).
__device__ __forceinline__ long long sk_start(long long w, long long units, long long ranges) {
    return w * units / ranges;
}
// The range that holds unit u (ranges are never empty when ranges <= units).
__device__ __forceinline__ long long sk_owner(long long u, long long units, long long ranges) {
    return ((u + 1) * ranges - 1) / units;
}

// A work unit of the stream-K wgmma kernels (kbit_wgmma.cu, awq_wgmma.cu): row tile t (of
// features), x row tile mt, stage st; units are numbered stage-fastest, then x row tiles, then row
// tiles, so a range of units walks whole row tiles in K order.
struct SkUnit {
    int t, mt, st;
    __device__ __forceinline__ static SkUnit at(int u, int nst, int m_tiles) {
        const int q = u / nst;
        SkUnit n;
        n.st = u - q * nst;
        n.t = q / m_tiles;
        n.mt = q - n.t * m_tiles;
        return n;
    }
    __device__ __forceinline__ void next(int nst, int m_tiles) {
        if (++st != nst) return;
        st = 0;
        if (++mt == m_tiles) {
            mt = 0;
            ++t;
        }
    }
};

// The finishing warp's (or CTA's) read of 4 sums from a tile accumulator in L2, which it leaves
// zeroed for the next launch.
__device__ __forceinline__ float4 sk_take4(float4* src) {
    const float4 v = __ldcg(src);
    __stcg(src, make_float4(0.f, 0.f, 0.f, 0.f));
    return v;
}

// atomicAdd with acquire semantics at GPU scope: what the releasing writers ordered before their
// own increments is visible to this thread's later reads.
__device__ __forceinline__ int atomic_add_acquire(int* p, int v) {
    int old;
    asm volatile("atom.add.acquire.gpu.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

// y-row sums: add 4 floats into the tile accumulator in L2 without waiting for the result.
__device__ __forceinline__ void red_add4(float* dst, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(a), "f"(b), "f"(c), "f"(d)
                 : "memory");
#else
    atomicAdd(dst, a);
    atomicAdd(dst + 1, b);
    atomicAdd(dst + 2, c);
    atomicAdd(dst + 3, d);
#endif
}

// Called by a whole warp after its reductions into a tile's accumulator: counts the warp in at
// the tile's counter and returns true (in every lane) for the last of the tile's `others` + 1
// warps, which then sees every warp's sums (read them with __ldcg) and must leave the
// accumulator zeroed; the counter is reset here.
// Release: every lane's fence, then lane 0's atomic. Acquire: that atomic itself (.acquire), and
// the warp barrier orders it before the other lanes' reads. A second fence in the last warp cost
// ~0.3 us on the path that ends the kernel (H200 session 22, stream-K GEMV 4096x28672 20.5 ->
// 20.2 us, 14336x4096 13.3 -> 13.0).
__device__ __forceinline__ bool sk_warp_arrive_last(int* counter, int others) {
    __threadfence();
    __syncwarp();
    int old = 0;
    if ((threadIdx.x & 31) == 0) old = atomic_add_acquire(counter, 1);
    old = __shfl_sync(0xffffffffu, old, 0);
    if (old != others) return false;
    __syncwarp();
    if ((threadIdx.x & 31) == 0) *counter = 0;  // no other warp touches it again in this launch
    return true;
}

// The CTA-wide form of sk_warp_arrive_last, for kernels whose CTAs (not warps) share a tile: called
// by every thread after its reductions into the tile's accumulator; returns true in every thread
// of the last of the tile's `others` + 1 CTAs, which then sees every CTA's sums (read them with
// __ldcg) and must leave the accumulator zeroed; the counter is reset here.
__device__ __forceinline__ bool sk_cta_arrive_last(int* counter, int others) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomic_add_acquire(counter, 1) == others;  // acquire: see sk_warp_arrive_last
        if (last) *counter = 0;  // every other CTA of this tile has counted
    }
    __syncthreads();
    return last != 0;
}

// One step of warp_reduce_scatter per H = N/2, N/4, ..., 1: trade H values with the lane
// 32H / N away; lanes with that bit set keep the upper half v[H..2H) (moved down), the others
// the lower half. (Template recursion: every index stays a constant, so v stays in registers.)
template <int N, int H>
__device__ __forceinline__ void reduce_scatter_steps(float (&v)[N], int lane) {
    if constexpr (H >= 1) {
        constexpr int o = 32 * H / N;
        const bool up = (lane & o) != 0;
#pragma unroll
        for (int i = 0; i < H; ++i) {
            const float send = up ? v[i] : v[i + H];
            const float keep = up ? v[i + H] : v[i];
            v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
        reduce_scatter_steps<N, H / 2>(v, lane);
    }
}

// Warp reduce-scatter of N (a power of two, 1..32) values per lane: returns the warp-wide sum of
// v[lane / (32 / N)] (lanes of one group of 32 / N hold the same sum). N - 1 + log2(32 / N)
// shuffles; v is clobbered.
template <int N>
__device__ __forceinline__ float warp_reduce_scatter(float (&v)[N]) {
    static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "N must be a power of two <= 32");
    reduce_scatter_steps<N, N / 2>(v, threadIdx.x & 31);
    float r = v[0];
#pragma unroll
    for (int o = 16 / N; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
    return r;
}

}  // namespace kbit
