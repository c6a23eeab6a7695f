// awq_orin device helpers: LOP3 int4 -> fp16x2 / bf16x2 dequantization (seed 000 §3.4).
//
// Resident CUDA layout (built by backends/cuda/awq_ops.py at load):
//   wq [out/8, in] int32: word (c, k) holds outputs 8c..8c+7 of input k in AWQ nibble order
//      (slot s <-> output AWQ_ORDER[s] = 0,2,4,6,1,3,5,7), so (w >> 4j) & 0x000f000f puts
//      outputs 2j (low half) and 2j+1 (high half) side by side: one LOP3 yields a pair.
//   sz [in/group, out, 2] in the activation dtype, per output pair p = (2p, 2p+1) the four values
//      (s_2p, s_2p+1, b_2p, b_2p+1) with w = q * s + b (b = -scale * zero): one 8-byte load per
//      pair gives the scale pair and the bias pair ready for hfma2.
// A thread's 16-byte load covers 4 consecutive inputs of 8 outputs.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace awq {

template <typename T> struct Vec2;
template <> struct Vec2<half> { using type = half2; };
template <> struct Vec2<__nv_bfloat16> { using type = __nv_bfloat162; };

__device__ __forceinline__ uint32_t lop3_and_or(uint32_t a, uint32_t mask, uint32_t magic) {
    uint32_t r;
    // (a & b) | c  ->  truth table 0xea
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(a), "r"(mask), "r"(magic));
    return r;
}

// The 4 pairs (outputs 2j, 2j+1) of one AWQ word as exact integer values 0..15.
template <typename T> __device__ __forceinline__ void unpack_pairs(uint32_t w, typename Vec2<T>::type (&q)[4]);

// fp16: magic 0x6400 = 1024.0. Pairs 0 and 2 sit in the low nibble of each half
// ((1024 + q) - 1024); pairs 1 and 3 in bits 4..7 ((1024 + 16q) / 16 - 64, one hfma2).
template <> __device__ __forceinline__ void unpack_pairs<half>(uint32_t w, half2 (&q)[4]) {
    const uint32_t lo = lop3_and_or(w, 0x000f000fu, 0x64006400u);
    const uint32_t hi = lop3_and_or(w, 0x00f000f0u, 0x64006400u);
    const uint32_t w8 = w >> 8;
    const uint32_t lo8 = lop3_and_or(w8, 0x000f000fu, 0x64006400u);
    const uint32_t hi8 = lop3_and_or(w8, 0x00f000f0u, 0x64006400u);
    const half2 k1024 = __half2half2(__ushort_as_half(0x6400));
    const half2 k16th = __half2half2(__ushort_as_half(0x2c00));   // 1/16
    const half2 km64 = __half2half2(__ushort_as_half(0xd400));    // -64
    q[0] = __hsub2(*reinterpret_cast<const half2*>(&lo), k1024);
    q[1] = __hfma2(*reinterpret_cast<const half2*>(&hi), k16th, km64);
    q[2] = __hsub2(*reinterpret_cast<const half2*>(&lo8), k1024);
    q[3] = __hfma2(*reinterpret_cast<const half2*>(&hi8), k16th, km64);
}

// bf16: 7 mantissa bits leave no room for the fp16 top-nibble trick, so each pair is shifted
// down and embedded in magic 0x4300 = 128.0: (128 + q) - 128.
template <> __device__ __forceinline__ void unpack_pairs<__nv_bfloat16>(uint32_t w, __nv_bfloat162 (&q)[4]) {
    const __nv_bfloat162 k128 = __bfloat162bfloat162(__ushort_as_bfloat16(0x4300));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const uint32_t r = lop3_and_or(w >> (4 * j), 0x000f000fu, 0x43004300u);
        q[j] = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&r), k128);
    }
}

template <typename T> __device__ __forceinline__ float2 to_float2(typename Vec2<T>::type v);
template <> __device__ __forceinline__ float2 to_float2<half>(half2 v) { return __half22float2(v); }
template <> __device__ __forceinline__ float2 to_float2<__nv_bfloat16>(__nv_bfloat162 v) { return __bfloat1622float2(v); }

template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<half>(half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ half from_f<half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Scale and bias pairs of one column group (8 outputs) in one group of inputs: 32 bytes at
// sz + ((g * out) + 8c) * 2, as (s01, b01, s23, b23) (s45, b45, s67, b67) = the two 16-byte
// halves sa, sb.
template <typename T>
__device__ __forceinline__ void split_pair_scales(const int4& sa, const int4& sb, typename Vec2<T>::type (&s2)[4],
                                                  typename Vec2<T>::type (&b2)[4]) {
    using T2 = typename Vec2<T>::type;
    const T2* sv = reinterpret_cast<const T2*>(&sa);
    const T2* sw = reinterpret_cast<const T2*>(&sb);
    s2[0] = sv[0]; s2[1] = sv[2]; s2[2] = sw[0]; s2[3] = sw[2];
    b2[0] = sv[1]; b2[1] = sv[3]; b2[2] = sw[1]; b2[3] = sw[3];
}
template <typename T>
__device__ __forceinline__ void load_pair_scales(const T* __restrict__ szp, typename Vec2<T>::type (&s2)[4],
                                                 typename Vec2<T>::type (&b2)[4]) {
    split_pair_scales<T>(__ldg(reinterpret_cast<const int4*>(szp)), __ldg(reinterpret_cast<const int4*>(szp) + 1),
                         s2, b2);
}

// One thread's 16-byte load (4 inputs of one column group) -> w[t][j] = pair j (outputs 2j, 2j+1)
// of input t, dequantized as q * s + b.
template <typename T>
__device__ __forceinline__ void dequant_quad(const int4& wv, const typename Vec2<T>::type (&s2)[4],
                                             const typename Vec2<T>::type (&b2)[4],
                                             typename Vec2<T>::type (&w)[4][4]) {
    using T2 = typename Vec2<T>::type;
    const uint32_t words[4] = {static_cast<uint32_t>(wv.x), static_cast<uint32_t>(wv.y),
                               static_cast<uint32_t>(wv.z), static_cast<uint32_t>(wv.w)};
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        T2 q[4];
        unpack_pairs<T>(words[t], q);
#pragma unroll
        for (int j = 0; j < 4; ++j) w[t][j] = __hfma2(q[j], s2[j], b2[j]);
    }
}

// Store dequant_quad's result as 8 rows (outputs) of 4 consecutive inputs: row o at
// dst + o * row_stride, one 8-byte store per row.
template <typename T>
__device__ __forceinline__ void store_quad_rows(const typename Vec2<T>::type (&w)[4][4], T* dst, size_t row_stride) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        T lo[4], hi[4];  // outputs 2j and 2j+1 over the 4 inputs
#pragma unroll
        for (int t = 0; t < 4; ++t) { lo[t] = w[t][j].x; hi[t] = w[t][j].y; }
        *reinterpret_cast<uint2*>(dst + (2 * j) * row_stride) = *reinterpret_cast<const uint2*>(lo);
        *reinterpret_cast<uint2*>(dst + (2 * j + 1) * row_stride) = *reinterpret_cast<const uint2*>(hi);
    }
}

template <typename T> __device__ __forceinline__ typename Vec2<T>::type zero2() {
    const uint32_t z = 0;
    return *reinterpret_cast<const typename Vec2<T>::type*>(&z);
}

// part[j] += sum over the quad's 4 inputs t of w[t][j] * x_t (pair j: outputs 2j, 2j+1), with
// xr = x at those 4 inputs (8 bytes): 16 FMAs in the activation dtype.
template <typename T>
__device__ __forceinline__ void fma_quad(const typename Vec2<T>::type (&w)[4][4], const uint2& xr,
                                         typename Vec2<T>::type (&part)[4]) {
    using T2 = typename Vec2<T>::type;
    const T* xv = reinterpret_cast<const T*>(&xr);
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        T2 xt;
        xt.x = xv[t];
        xt.y = xv[t];
#pragma unroll
        for (int j = 0; j < 4; ++j) part[j] = __hfma2(w[t][j], xt, part[j]);
    }
}

// acc[o] (outputs o = 0..7 of a column group) += the pair sums part[j] in fp32; part is zeroed.
template <typename T>
__device__ __forceinline__ void flush_pairs(typename Vec2<T>::type (&part)[4], float (&acc)[8]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float2 f = to_float2<T>(part[j]);
        acc[2 * j] += f.x;
        acc[2 * j + 1] += f.y;
        part[j] = zero2<T>();
    }
}

// Offset of column group c's scale pairs for input k in the resident sz [in/group, out, 2].
__device__ __forceinline__ size_t pair_scale_offset(int k, int group, int out, int c) {
    return (static_cast<size_t>(k / group) * out + c * 8) * 2;
}

// ---- GEMV / small batch (awq_gemv.cu, awq_grouped_gemv.cu) ----------------------------------

constexpr int kGemvWarps = 8;  // warps per GEMV CTA

__device__ __forceinline__ int4 load_stream(const int4* p) {
    int4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// acc[m][o] += sum over k in this warp's quads (kq0, kq0 + kq_step, ...) of x[m, k] * W[8c + o, k],
// for one column group c of one weight (wrow = its row of 16-byte quads of the resident wq).
// Rows m > last_row read row last_row (the caller ignores their sums), so a partial pass never
// reads outside x. Each word is dequantized once (LOP3 + one hfma2 per pair) and used for all M rows.
template <typename T, int M>
__device__ __forceinline__ void gemv_accumulate(const T* __restrict__ x, int in, int last_row,
                                                const int4* __restrict__ wrow, const T* __restrict__ sz, int out,
                                                int group, int c, int kq0, int kq_step, float (&acc)[M][8]) {
    using T2 = typename Vec2<T>::type;
    const int quads = in / 4;
    // Deeper unrolling keeps more 16-byte loads in flight where registers allow (small M).
#pragma unroll(M <= 2 ? 4 : 2)
    for (int kq = kq0; kq < quads; kq += kq_step) {
        const int4 wv = load_stream(wrow + kq);
        const int k0 = kq * 4;
        T2 s2[4], b2[4], w[4][4];
        load_pair_scales<T>(sz + pair_scale_offset(k0, group, out, c), s2, b2);
        dequant_quad<T>(wv, s2, b2, w);
#pragma unroll
        for (int m = 0; m < M; ++m) {
            const uint2 xr =
                __ldg(reinterpret_cast<const uint2*>(x + static_cast<size_t>(min(m, last_row)) * in + k0));
            T2 part[4] = {zero2<T>(), zero2<T>(), zero2<T>(), zero2<T>()};
            fma_quad<T>(w, xr, part);
            flush_pairs<T>(part, acc[m]);
        }
    }
}

// Warps per column group: the fewest K splits that still give ~32 warps per SM (4 CTAs of 8) over
// `col_groups` column groups in all, so long per-warp streams amortize the reduction while every
// SM stays busy; each warp keeps >= 2 loop iterations. Host side.
inline int warps_per_group(int in, long long col_groups) {
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    const long long target = 32LL * (sms > 0 ? sms : 132);
    int wpo = 1;
    while (wpo < kGemvWarps && col_groups * wpo < target && in / (128 * wpo * 2) >= 2) wpo <<= 1;
    return wpo;
}

// Butterfly-reduce each of the M * 8 per-lane sums of a warp's column group over its lanes; lane
// (i % 32) writes sum i to red_w[i] (the caller syncs before other warps read red_w).
template <int M>
__device__ __forceinline__ void warp_sums_to_shared(const float (&acc)[M][8], float* red_w, int lane) {
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int o = 0; o < 8; ++o) {
            float v = acc[m][o];
#pragma unroll
            for (int s = 16; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);
            if (lane == (m * 8 + o) % 32) red_w[m * 8 + o] = v;
        }
}

}  // namespace awq
