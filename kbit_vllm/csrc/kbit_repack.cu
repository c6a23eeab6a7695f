// kbit repack / unrepack: serialized [out, nb*k] + [out, nb]  <->  tiled layout (load time).
// One thread per (tile row, block); threads of a CTA are the 128 rows of one n-tile, so the
// tiled side is read and written coalesced. Bit order per kbit_tile.cuh (planes, then for k >= 4
// the group swap and word g rotated right by g).
#include "kbit_tile.cuh"

namespace kbit {

template <int K>
__global__ void repack_kernel(const uint32_t* __restrict__ packed, const uint8_t* __restrict__ absmax,
                              int out_f, int nb, uint32_t* __restrict__ packed_t,
                              uint8_t* __restrict__ absmax_t) {
    const int j = blockIdx.x, t = blockIdx.y, r = threadIdx.x;
    const int row = t * kTileN + r;
    const bool valid = row < out_f;
    const size_t tb = (static_cast<size_t>(t) * nb + j);
    uint32_t o[K];
#pragma unroll
    for (int b = 0; b < K; ++b) {
        const uint32_t w = valid ? packed[static_cast<size_t>(row) * nb * K + static_cast<size_t>(j) * K + b] : 0u;
        o[b] = 0;
#pragma unroll
        for (int e = 0; e < 32; ++e) o[b] |= ((w >> e) & 1u) << tiled_bit_pos(e, b);
    }
#pragma unroll
    for (int b = 0; b < K; ++b)
        packed_t[(tb * K + b) * kTileN + r] = K >= 4 && b < 4 ? rotr32(swap_groups<4>(o, b), b) : o[b];
    absmax_t[tb * kTileN + r] = valid ? absmax[static_cast<size_t>(row) * nb + j] : 0;
}

template <int K>
__global__ void unrepack_kernel(const uint32_t* __restrict__ packed_t, const uint8_t* __restrict__ absmax_t,
                                int out_f, int nb, uint32_t* __restrict__ packed, uint8_t* __restrict__ absmax) {
    const int j = blockIdx.x, t = blockIdx.y, r = threadIdx.x;
    const int row = t * kTileN + r;
    if (row >= out_f) return;
    const size_t tb = (static_cast<size_t>(t) * nb + j);
    uint32_t pt[K];
#pragma unroll
    for (int b = 0; b < K; ++b) {
        const uint32_t w = packed_t[(tb * K + b) * kTileN + r];
        pt[b] = K >= 4 && b < 4 ? rotr32(w, (32 - b) & 31) : w;  // group word b back to its unrotated bits
    }
#pragma unroll
    for (int b = 0; b < K; ++b) {
        const uint32_t w = K >= 4 && b < 4 ? swap_groups<4>(pt, b) : pt[b];  // planes
        uint32_t o = 0;
#pragma unroll
        for (int e = 0; e < 32; ++e) o |= ((w >> tiled_bit_pos(e, b)) & 1u) << e;
        packed[static_cast<size_t>(row) * nb * K + static_cast<size_t>(j) * K + b] = o;
    }
    absmax[static_cast<size_t>(row) * nb + j] = absmax_t[tb * kTileN + r];
}

int launch_repack(const void* packed, const uint8_t* absmax, int k, int out_f, int nb,
                  void* packed_t, uint8_t* absmax_t, bool inverse, cudaStream_t stream) {
    if (out_f <= 0 || nb <= 0) return 0;
    const dim3 grid(nb, (out_f + kTileN - 1) / kTileN);
    const auto* src = static_cast<const uint32_t*>(inverse ? packed_t : packed);
    auto* dst = static_cast<uint32_t*>(inverse ? const_cast<void*>(packed) : packed_t);
#define KBIT_REPACK_CASE(KK)                                                                          \
    case KK:                                                                                          \
        if (inverse) unrepack_kernel<KK><<<grid, kTileN, 0, stream>>>(src, absmax_t, out_f, nb, dst,  \
                                                                      const_cast<uint8_t*>(absmax));  \
        else repack_kernel<KK><<<grid, kTileN, 0, stream>>>(src, absmax, out_f, nb, dst, absmax_t);   \
        break;
    switch (k) {
        KBIT_REPACK_CASE(2) KBIT_REPACK_CASE(3) KBIT_REPACK_CASE(4) KBIT_REPACK_CASE(5)
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
#undef KBIT_REPACK_CASE
    KBIT_RETURN_LAUNCH_STATUS();
}

}  // namespace kbit
