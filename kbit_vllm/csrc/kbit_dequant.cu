// kbit dequantize: serialized or tiled layout -> dense W [out, in] (fp16/bf16/fp32).
// Values are codebook[code] * decode_e4m4(absmax) in fp32, rounded once: bit-exact with
// formats/kbit.py. The tiled variant feeds the large-M dequantize + cuBLAS path.
// One kernel family (serialized and tiled variants of the same decode).
#include "kbit_tile.cuh"

namespace kbit {

template <typename T>
__device__ __forceinline__ void store32(T* dst, const float (&v)[32]) {
    // 32 outputs of one block row: 16-byte stores (dst is 16-byte aligned: rows hold in % 32 == 0).
    if constexpr (sizeof(T) == 4) {
#pragma unroll
        for (int i = 0; i < 8; ++i)
            reinterpret_cast<float4*>(dst)[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            union { uint4 u; T h[8]; } pk;
#pragma unroll
            for (int q = 0; q < 8; ++q) pk.h[q] = from_float<T>(v[8 * i + q]);
            reinterpret_cast<uint4*>(dst)[i] = pk.u;
        }
    }
}

// Serialized: one thread per (row, block); consecutive threads walk one row's blocks.
template <typename T, int K>
__global__ void dequant_kernel(const uint32_t* __restrict__ packed, const uint8_t* __restrict__ absmax,
                               const float* __restrict__ codebook, long long nblocks, T* __restrict__ out) {
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= nblocks) return;
    uint32_t p[K];
#pragma unroll
    for (int b = 0; b < K; ++b) p[b] = packed[i * K + b];
    const float s = decode_e4m4(absmax[i]);
    float v[32];
#pragma unroll
    for (int e = 0; e < 32; ++e) {
        int c = 0;
#pragma unroll
        for (int b = 0; b < K; ++b) c |= ((p[b] >> e) & 1) << b;
        v[e] = __fmul_rn(__ldg(codebook + c), s);
    }
    store32<T>(out + i * 32, v);
}

// Tiled: CTA = the 128 rows of one n-tile x kDqJB blocks. Thread r decodes row r (lanes = rows:
// coalesced plane reads) into a shared-memory tile, then the CTA writes each row's
// kDqJB * 32 outputs as contiguous 16-byte stores (full, coalesced row segments).
constexpr int kDqJB = 4;                     // blocks per CTA: 128 outputs of each row
constexpr int kDqStride = kDqJB * 32 + 8;    // smem row stride in elements (16-byte pad: no bank conflicts)

template <typename T, int K>
__global__ void __launch_bounds__(kTileN) dequant_tiled_kernel(const uint32_t* __restrict__ packed_t,
                                                               const uint8_t* __restrict__ absmax_t,
                                                               const float* __restrict__ codebook, int out_f, int nb,
                                                               T* __restrict__ out) {
    static_assert(sizeof(T) == 2, "tiled dequant writes 16-bit outputs");
    __shared__ __align__(16) T tile_s[kTileN * kDqStride];
    const int t = blockIdx.y, r = threadIdx.x, lane = r & 31;
    const float cbl = lane_codebook<K>(codebook, lane);
    const int j0 = blockIdx.x * kDqJB;
    const int jn = min(kDqJB, nb - j0);
    uint32_t p[kDqJB][K];
    uint8_t a[kDqJB];
#pragma unroll
    for (int jj = 0; jj < kDqJB; ++jj) {
        const bool ok = jj < jn;
        const size_t tb = static_cast<size_t>(t) * nb + j0 + (ok ? jj : 0);
#pragma unroll
        for (int b = 0; b < K; ++b) p[jj][b] = ok ? __ldg(packed_t + (tb * K + b) * kTileN + r) : 0u;
        a[jj] = ok ? __ldg(absmax_t + tb * kTileN + r) : 0;
    }
#pragma unroll
    for (int jj = 0; jj < kDqJB; ++jj) {
        if (jj >= jn) break;  // CTA-uniform
        const float s = decode_e4m4(a[jj]);
        float v[32];
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            float c[8];
            decode_group<K>(p[jj], g, cbl, c);
#pragma unroll
            for (int n = 0; n < 8; ++n) v[elem_of(g, n)] = __fmul_rn(c[n], s);
        }
        uint4* dst = reinterpret_cast<uint4*>(tile_s + r * kDqStride + jj * 32);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            union { uint4 u; T h[8]; } pk;
#pragma unroll
            for (int q = 0; q < 8; ++q) pk.h[q] = from_float<T>(v[8 * i + q]);
            dst[i] = pk.u;
        }
    }
    __syncthreads();
    constexpr int kChunks = kDqJB * 4;  // 16-byte chunks per row segment
    const int cols = jn * 4;
    const size_t in_f = static_cast<size_t>(nb) * 32;
    for (int i = threadIdx.x; i < kTileN * kChunks; i += kTileN) {
        const int rr = i / kChunks, c = i - rr * kChunks;
        const int row = t * kTileN + rr;
        if (row < out_f && c < cols)
            *reinterpret_cast<uint4*>(out + row * in_f + static_cast<size_t>(j0) * 32 + c * 8) =
                *reinterpret_cast<const uint4*>(tile_s + rr * kDqStride + c * 8);
    }
}

template <typename T>
int launch_dequant(const void* packed, const uint8_t* absmax, const float* codebook, int k, int rows,
                   int nb, void* out, cudaStream_t stream) {
    const long long nblocks = static_cast<long long>(rows) * nb;
    if (nblocks <= 0) return 0;
    const unsigned grid = static_cast<unsigned>((nblocks + 127) / 128);
    const auto* p = static_cast<const uint32_t*>(packed);
    T* o = static_cast<T*>(out);
    switch (k) {
        case 2: dequant_kernel<T, 2><<<grid, 128, 0, stream>>>(p, absmax, codebook, nblocks, o); break;
        case 3: dequant_kernel<T, 3><<<grid, 128, 0, stream>>>(p, absmax, codebook, nblocks, o); break;
        case 4: dequant_kernel<T, 4><<<grid, 128, 0, stream>>>(p, absmax, codebook, nblocks, o); break;
        case 5: dequant_kernel<T, 5><<<grid, 128, 0, stream>>>(p, absmax, codebook, nblocks, o); break;
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
    KBIT_RETURN_LAUNCH_STATUS();
}

template <typename T>
int launch_dequant_tiled(const void* packed_t, const uint8_t* absmax_t, const float* codebook, int k,
                         int out_f, int nb, void* out, cudaStream_t stream) {
    if (out_f <= 0 || nb <= 0) return 0;
    const int nt = (out_f + kTileN - 1) / kTileN;
    const dim3 grid((nb + kDqJB - 1) / kDqJB, nt);
    const auto* p = static_cast<const uint32_t*>(packed_t);
    T* o = static_cast<T*>(out);
    switch (k) {
        case 2: dequant_tiled_kernel<T, 2><<<grid, kTileN, 0, stream>>>(p, absmax_t, codebook, out_f, nb, o); break;
        case 3: dequant_tiled_kernel<T, 3><<<grid, kTileN, 0, stream>>>(p, absmax_t, codebook, out_f, nb, o); break;
        case 4: dequant_tiled_kernel<T, 4><<<grid, kTileN, 0, stream>>>(p, absmax_t, codebook, out_f, nb, o); break;
        case 5: dequant_tiled_kernel<T, 5><<<grid, kTileN, 0, stream>>>(p, absmax_t, codebook, out_f, nb, o); break;
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
    KBIT_RETURN_LAUNCH_STATUS();
}

template int launch_dequant<half>(const void*, const uint8_t*, const float*, int, int, int, void*, cudaStream_t);
template int launch_dequant<__nv_bfloat16>(const void*, const uint8_t*, const float*, int, int, int, void*, cudaStream_t);
template int launch_dequant<float>(const void*, const uint8_t*, const float*, int, int, int, void*, cudaStream_t);
template int launch_dequant_tiled<half>(const void*, const uint8_t*, const float*, int, int, int, void*, cudaStream_t);
template int launch_dequant_tiled<__nv_bfloat16>(const void*, const uint8_t*, const float*, int, int, int, void*, cudaStream_t);

}  // namespace kbit
