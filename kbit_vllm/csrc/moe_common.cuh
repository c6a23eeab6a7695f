// MoE grouped kernels: map a CTA's work index to (expert, row range) from the device-resident
// expert offsets, with no host sync, so one launch covers every expert and a CUDA graph can
// replay it under any routing.
//
// Rows offs[e] .. offs[e+1] of x (sorted by expert) belong to expert e. An expert with n rows
// contributes ceil(n / rows_per_item) work items (exactly one when rows_per_item <= 0 and n > 0),
// numbered in expert order. The host sizes the grid from an upper bound on the item count that
// needs only host-known shapes (total rows, number of experts); CTAs past the last item exit.
#pragma once
#include <cuda_runtime.h>

namespace moe {

struct Item {
    int expert;  // expert index
    int row0;    // the expert's first row in x / y
    int row1;    // one past its last row
    int sub;     // index of this item among the expert's items
};

// An expert's rows [a, b) from its two offsets, clamped to [0, rows] and made non-decreasing, so
// bad offsets never address memory outside x / y (every kernel reads offsets through this).
__device__ __forceinline__ int2 clamp_rows(int lo, int hi, int rows) {
    const int a = min(max(lo, 0), rows);
    return make_int2(a, min(max(hi, a), rows));
}

// Work items of an expert with rows [a, b): ceil((b - a) / rows_per_item), or one for any rows
// when rows_per_item <= 0.
__device__ __forceinline__ int span_items(int2 r, int rows_per_item) {
    return rows_per_item > 0 ? (r.y - r.x + rows_per_item - 1) / rows_per_item : (r.y > r.x ? 1 : 0);
}

// Item w (>= 0) of the list above; false when there are fewer items. Every lane of the calling
// warp gets the same answer, so every warp of a CTA can call it with the same w (no barrier).
// Offsets are clamped (clamp_rows). Reads 128 experts' offsets per round trip.
__device__ __forceinline__ bool find_item(const int* __restrict__ offs, int n_exp, int rows, int rows_per_item,
                                          int w, Item& it) {
    constexpr unsigned kAll = 0xffffffffu;
    const int lane = threadIdx.x & 31;
    int before = 0;  // items of the experts already scanned
    for (int e0 = 0; e0 < n_exp; e0 += 128) {
        int lo[4], hi[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int e = e0 + 32 * u + lane;
            lo[u] = e < n_exp ? offs[e] : 0;
            hi[u] = e < n_exp ? offs[e + 1] : 0;
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int2 r = clamp_rows(lo[u], hi[u], rows);
            const int n = span_items(r, rows_per_item);
            int incl = n;  // inclusive prefix sum of the item counts over the lanes
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int t = __shfl_up_sync(kAll, incl, o);
                if (lane >= o) incl += t;
            }
            const int total = __shfl_sync(kAll, incl, 31);
            if (w < before + total) {  // warp-uniform
                const int excl = incl - n;
                const unsigned hit = __ballot_sync(kAll, n > 0 && w >= before + excl && w < before + incl);
                const int src = __ffs(hit) - 1;
                it.expert = e0 + 32 * u + src;
                it.row0 = __shfl_sync(kAll, r.x, src);
                it.row1 = __shfl_sync(kAll, r.y, src);
                it.sub = w - before - __shfl_sync(kAll, excl, src);
                return true;
            }
            before += total;
        }
    }
    return false;
}

// Expert e's rows, clamped (clamp_rows; every lane gets them): false when it has none.
__device__ __forceinline__ bool expert_rows(const int* __restrict__ offs, int e, int rows, Item& it) {
    const int2 r = clamp_rows(offs[e], offs[e + 1], rows);
    it.expert = e;
    it.row0 = r.x;
    it.row1 = r.y;
    it.sub = 0;
    return r.y > r.x;
}

// Total item count of the list above (every lane gets it): the same clamping and the same
// per-expert counts as find_item, so find_item(w) succeeds exactly for w < count_items().
__device__ __forceinline__ int count_items(const int* __restrict__ offs, int n_exp, int rows, int rows_per_item) {
    const int lane = threadIdx.x & 31;
    int total = 0;
    for (int e = lane; e < n_exp; e += 32) {
        total += span_items(clamp_rows(offs[e], offs[e + 1], rows), rows_per_item);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    return total;
}

// The gated activations' gate functions, in fp32 with torch's formulas (moe_gated_act, and the fused
// MoE experts kernel's act tiles): F = 0 silu, 1 gelu (erf), 2 gelu (tanh approximation).
template <int F>
__device__ __forceinline__ float gate_act(float g) {
    if constexpr (F == 0) {
        return g / (1.f + expf(-g));
    } else if constexpr (F == 1) {
        return 0.5f * g * (1.f + erff(g * 0.70710678118654752f));
    } else {
        const float u = 0.79788456080286536f * (g + 0.044715f * g * g * g);
        return 0.5f * g * (1.f + tanhf(u));
    }
}

}  // namespace moe
