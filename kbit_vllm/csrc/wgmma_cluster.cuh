// Split-K over a cluster for the stream-K wgmma kernels of both formats (kbit_wgmma.cu,
// awq_wgmma.cu): a grid of row tiles x splits CTAs, one an SM, a cluster of `splits` CTAs per 256-
// feature row tile, each summing an even share of its stages; the end of a CTA's share is
// ck_cluster_reduce. On small layers at 64-row tiles the stream-K launch's partial row tiles (fp32
// reductions into L2, a counter and the last CTA's read back) cost about as much as its stages
// (RESULTS.md, session 49); here no sums leave the cluster.
#pragma once
#include <cooperative_groups.h>

#include "common.cuh"

namespace kbit {

constexpr int kCkStride = 256 + 4;  // floats per row of a CTA's sums (256 features, padded)
constexpr int kCkThreads = 256;     // threads of both kernels' CTAs (two warpgroups)
// Bytes of a CTA's sums of an R-row tile (they overwrite its tables and slots: the host checks the
// kernel's shared memory holds them, ck_fits).
__host__ __device__ constexpr int ck_sums_bytes(int R) { return R * kCkStride * 4; }
// Dynamic shared memory a split-K launch asks for: the kernel's own, but more than half an SM's
// 228 KB, so the scheduler places one CTA of a cluster an SM.
constexpr int kCkOneCtaBytes = 114 * 1024;
inline int ck_smem(int kernel_bytes) { return kernel_bytes > kCkOneCtaBytes ? kernel_bytes : kCkOneCtaBytes; }

// The end of a CTA's share of a row tile: acc[i][4j + h] is feature fl + 2i, row 8j + 2g + h of the
// tile, acc[i][4j + 2 + h] feature fl + 2i + 1, the same row (fl: the lane's 4 adjacent features in
// the row tile, g = lane % 4). Every CTA of the cluster writes its sums into its own shared memory
// at buf (its tables and slots, free once its last stage is done) as [row][feature] floats (rows
// padded, so a warp's 16-byte stores meet no bank twice); after a cluster barrier CTA `rank` adds
// up its 1/`splits` share of the tile's floats across the cluster in rank order (distributed shared
// memory: the same sums in the same order every run) and writes them, bias added, to y [M, N] at
// rows row0.., features f_base..; a second barrier keeps every CTA's shared memory alive until the
// others have read it. (Each CTA storing its rows into their owner's shared memory instead, with one
// barrier, ran 6-16% slower at 64 rows: RESULTS.md, session 49.)
template <typename T, int R>
__device__ __forceinline__ void ck_cluster_reduce(float* buf, const float (&acc)[2][R / 2], int fl, int g, int tid,
                                                  int splits, T* __restrict__ y, const T* __restrict__ bias, int M,
                                                  int N, int row0, int f_base) {
    namespace cg = cooperative_groups;
    const cg::cluster_group cluster = cg::this_cluster();
    __syncthreads();  // every warp is done with the tables and slots
#pragma unroll
    for (int j = 0; j < R / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            *reinterpret_cast<float4*>(buf + (8 * j + 2 * g + h) * kCkStride + fl) =
                make_float4(acc[0][4 * j + h], acc[0][4 * j + 2 + h], acc[1][4 * j + h], acc[1][4 * j + 2 + h]);
    cluster.sync();
    const int rank = static_cast<int>(cluster.block_rank());
    const float* src[8];
#pragma unroll
    for (int s = 0; s < 8; ++s) src[s] = cluster.map_shared_rank(buf, s < splits ? s : 0);
    constexpr int kF4 = R * 64;  // float4s of the row tile
    const int lo = kF4 * rank / splits, hi = kF4 * (rank + 1) / splits;
    for (int idx = lo + tid; idx < hi; idx += kCkThreads) {
        const int row = idx >> 6, f = 4 * (idx & 63);
        const int off = row * kCkStride + f;
        float4 v = *reinterpret_cast<const float4*>(src[0] + off);
#pragma unroll
        for (int s = 1; s < 8; ++s)
            if (s < splits) {
                const float4 w = *reinterpret_cast<const float4*>(src[s] + off);
                v.x += w.x, v.y += w.y, v.z += w.z, v.w += w.w;
            }
        const int gr = row0 + row, gf = f_base + f;
        if (gr >= M || gf >= N) continue;
        float o[4] = {v.x, v.y, v.z, v.w};
        T* dst = y + static_cast<size_t>(gr) * N + gf;
        if (N % 4 == 0) {  // gf is a multiple of 4: all four in range
            __align__(8) T t[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) t[e] = from_float<T>(o[e] + (bias != nullptr ? to_float(bias[gf + e]) : 0.f));
            *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(t);
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (gf + e < N) dst[e] = from_float<T>(o[e] + (bias != nullptr ? to_float(bias[gf + e]) : 0.f));
        }
    }
    cluster.sync();  // the other CTAs have read this one's sums
}

// Host: clusters of `splits` (2..8) CTAs of kernel f (kCkThreads threads, ck_smem(kernel_bytes) of
// dynamic shared memory) resident at once; 0 on error (the error cleared).
inline int ck_max_clusters(const void* f, int kernel_bytes, int splits) {
    const int smem = ck_smem(kernel_bytes);
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = static_cast<unsigned>(splits);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.gridDim = dim3(splits);
    cfg.blockDim = dim3(kCkThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int n = 0;
    if (splits < 2 || splits > 8 ||
        cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess ||
        cudaOccupancyMaxActiveClusters(&n, f, &cfg) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

}  // namespace kbit
