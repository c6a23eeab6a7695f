// awq_orin tensor-core GEMV for M = 1..8 rows of x (Hopper, sm_90a): y[m, o] = sum_k x[m, k] W[o, k]
// (+ bias), reading the resident layout of awq_common.cuh (wq [out/8, in] int32, sz [in/group,
// out, 2]) as is.
//
// Why: the CUDA-core GEMVs (awq_gemv_sk.cu) spend ~4 instructions per weight (dequantize, scale,
// one fp16 FMA per row and the copies) and are bound by issue slots, not by HBM. Here a weight
// costs one LOP3 (+ a shift and byte permute per 4 or 8): the LOP3's magic-number half goes to the
// tensor cores as is, they multiply by x (up to 8 rows at the same cost) and sum in fp32, and the
// scale, zero point and magic offset are applied once per group and output (kernel body).
//
// Tile = 64 outputs (8 column groups); work unit = (tile, 64 inputs): 2 KB of weights. Units are
// numbered tile-major and split into equal contiguous ranges, one per warp of a one-wave grid
// (stream-K, no wave tail). Each warp runs its own ring of kStages TMA stages (weights as two
// 8-row x 128-byte boxes, 128-byte swizzled; the scale / bias pair words of each 32-input segment's
// group) on its own mbarriers: no block barrier anywhere.
//
// Fragments (mma.sync.m16n8k16, weights = A, x = B): lane (r = lane / 4, t = lane % 4) owns column
// group r of the tile; m16 tile i (0..3) maps its row r to output 2i and row r + 8 to output 2i + 1
// of that column group (the rows' order is free), so one byte permute of words (c, k), (c, k + 1)
// puts both outputs of two tiles side by side in k, and every nibble of the words the lane reads
// is used. x row n sits in column n of B (lanes with r >= M hold zeros), read from global memory
// (L1 / L2) per unit.
//
// At the end of its segment of a tile a warp stores the tile (whole) or adds it into a zeroed
// fp32 accumulator in L2; the last warp to arrive (per-tile counter) stores y (+ bias) and leaves
// accumulator and counter zero (stream_k.cuh). The addition order varies from run to run:
// deterministic mode runs other kernels (backends/cuda/awq_ops.py).
#include "awq_wgmma_tile.cuh"
#include "mma_ptx.cuh"
#include "pdl.cuh"
#include "stream_k.cuh"

namespace awq {

namespace {

constexpr int kTcWarps = 8;
constexpr int kTcThreads = kTcWarps * 32;
constexpr int kTcCols = 64;                  // outputs per tile
constexpr int kTcBK = 64;                    // inputs per unit (two 32-input segments)
// Ring slots per warp: one unit in flight while one is summed. Deeper rings lost: H200 session 39,
// behind a writer, µs with 4 / 2 slots (8 warps a CTA, two CTAs an SM): fp16 M=1 4096x28672 26.1 /
// 24.9, 14336x4096 16.6 / 14.9, M=8 29.1 / 28.0; bf16 M=1 28.6 / 27.4, 17.6 / 15.9; 3 slots in
// between; a 4-slot ring filled one unit at a time from the start, 10 or 12 warps a CTA and (on the
// large layers) one slot all slower (benchmarks/RESULTS.md).
constexpr int kTcStages = 2;
constexpr int kTcWBox = (kTcCols / 8) * 128;  // one segment's weights: 8 column groups x 32 words
constexpr int kTcSBox = kTcCols * 4;          // one segment's scale / bias pair words
constexpr int kTcSlot = 3 * 1024;             // 2 weight boxes (1024-aligned) + 2 scale boxes
constexpr int kTcStageBytes = 2 * kTcWBox + 2 * kTcSBox;  // bytes a stage's TMA boxes bring
constexpr int kTcWarpBytes = kTcStages * kTcSlot;
constexpr int kTcBarOff = kTcWarps * kTcWarpBytes;
constexpr int kTcSmem = 1024 + kTcBarOff + kTcWarps * kTcStages * 8;  // + alignment of the slots
static_assert(kTcStageBytes <= kTcSlot && kTcWBox == 1024, "slot layout");

// M (1..8) only gates loads and stores, so it is a runtime argument: one kernel per dtype.
template <typename T>
__global__ void __launch_bounds__(kTcThreads, 2)
    awq_gemv_tc_kernel(const __grid_constant__ CUtensorMap tm_w, const __grid_constant__ CUtensorMap tm_s,
                       const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y, int M, int in,
                       int out, int group, float* __restrict__ accum, int* __restrict__ counters) {
#if defined(KBIT_WGMMA)
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r = lane >> 2, t = lane & 3;
    const int nst = (in + kTcBK - 1) / kTcBK;
    const int gshift = __ffs(group) - 1;  // group is a power of two (host check)
    const long long units = static_cast<long long>((out + kTcCols - 1) / kTcCols) * nst;
    const long long warps = static_cast<long long>(gridDim.x) * kTcWarps;
    const long long w = static_cast<long long>(blockIdx.x) * kTcWarps + warp;
    const long long u0 = kbit::sk_start(w, units, warps);
    const int n = static_cast<int>(kbit::sk_start(w + 1, units, warps) - u0);  // >= 1 (host check)

    const uint32_t raw_s = ptx::smem_u32(smem_raw);
    const uint32_t base_s = (raw_s + 1023u) & ~1023u;  // swizzle atom of the weight boxes
    const unsigned char* base = smem_raw + (base_s - raw_s);
    const uint32_t ring_s = base_s + warp * kTcWarpBytes;
    const unsigned char* ring = base + warp * kTcWarpBytes;
    const uint32_t bars = base_s + kTcBarOff + warp * kTcStages * 8;

    // The unit being summed (tile c, stage st) and the next one lane 0 loads (lc; one x row tile).
    const kbit::SkUnit first_unit = kbit::SkUnit::at(static_cast<int>(u0), nst, 1);
    int c = first_unit.t, st = first_unit.st;
    kbit::SkUnit lc = first_unit;
    auto issue = [&](int slot) {  // lane 0: unit lc's boxes into slot
        const uint32_t dst = ring_s + slot * kTcSlot, bar = bars + slot * 8;
        ptx::mbar_arrive_expect_tx(bar, kTcStageBytes);
#pragma unroll
        for (int seg = 0; seg < 2; ++seg) {
            const int k = lc.st * kTcBK + 32 * seg;
            ptx::tma_load_2d(dst + seg * kTcWBox, &tm_w, k, lc.t * (kTcCols / 8), bar);
            ptx::tma_load_2d(dst + 2 * kTcWBox + seg * kTcSBox, &tm_s, lc.t * kTcCols, k >> gshift, bar);
        }
        lc.next(nst, 1);
    };
    if (lane == 0) {
        for (int s = 0; s < kTcStages; ++s) ptx::mbar_init(bars + s * 8, 1);
        ptx::mbar_init_fence();
    }
    __syncwarp();
    // Weights and scales (never written by another kernel) may load before the previous kernel
    // is done (PDL, pdl.cuh); x, y and the scratch follow pdl_wait.
    kbit::pdl_trigger();
    if (lane == 0)
        for (int s = 0; s < kTcStages - 1 && s < n; ++s) issue(s);
    kbit::pdl_wait();

    // Byte permutes: v_j = (byte j, 2 + j of word k; byte j, 2 + j of word k + 1) holds output pairs
    // 2j, 2j + 1 of the column group (nibble slots 2j, 2j + 1 and 2j + 4, 2j + 5) in k order.
    constexpr uint32_t kSel0 = 0x6420u, kSel1 = 0x7531u;
    const T* xrow = x + static_cast<size_t>(r) * in + 2 * t;
    // A fragments are the raw magic-number halves M + mult q (fp16: M = 1024, mult 1 on even tiles
    // and 16 on odd ones, which take the nibbles at bits 4..7 without a shift; bf16: M = 128,
    // mult 1): no subtraction or scale per weight. The mma sums them times x in fp32 (exact
    // products) into q; a fifth mma with A = 1 sums x into sx; at the end of each group the exact
    // per-group correction turns q into y (see below). acc: y so far.
    constexpr bool kHalf = std::is_same<T, half>::value;
    constexpr uint32_t kMagic = kHalf ? 0x64006400u : 0x43004300u;
    constexpr float kMagicF = kHalf ? 1024.f : 128.f;
    constexpr uint32_t kOne = kHalf ? 0x3c003c00u : 0x3f803f80u;
    const uint32_t kOnes[4] = {kOne, kOne, kOne, kOne};
    float acc[4][4], q[4][4], sx[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int v = 0; v < 4; ++v) acc[i][v] = q[i][v] = 0.f;
    int st_first = st;
    for (int it = 0; it < n; ++it) {
        const int slot = it % kTcStages;
        __syncwarp();  // every lane is done with the slot of unit it - 1, which the next issue reuses
        if (lane == 0 && it + kTcStages - 1 < n) issue((it + kTcStages - 1) % kTcStages);
        // x of this unit as B fragments: b[kk][0] = x[r][k0 + 16kk + 2t, +1], b[kk][1] = 8 further.
        uint32_t b[4][2];
        const int k0 = st * kTcBK;
#pragma unroll
        for (int seg = 0; seg < 2; ++seg) {
            const bool ok = r < M && k0 + 32 * seg < in;  // in % 32 == 0: a segment is in or past K
#pragma unroll
            for (int kh = 0; kh < 2; ++kh)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    b[2 * seg + kh][h] =
                        ok ? __ldg(reinterpret_cast<const uint32_t*>(xrow + k0 + 32 * seg + 16 * kh + 8 * h)) : 0u;
        }
        ptx::mbar_wait(bars + slot * 8, static_cast<uint32_t>(it / kTcStages) & 1u);
        const unsigned char* sl = ring + slot * kTcSlot;
#pragma unroll
        for (int seg = 0; seg < 2; ++seg) {
            const unsigned char* row = sl + seg * kTcWBox + 128 * r;
#pragma unroll
            for (int kh = 0; kh < 2; ++kh) {
                // Words 16kh + 2t, + 1 (16-byte chunk 4kh + t/2, swizzled by the row) and 8 further.
                const int ch = 4 * kh + (t >> 1);
                const uint2 lo = *reinterpret_cast<const uint2*>(row + ((ch ^ r) << 4) + 8 * (t & 1));
                const uint2 hi = *reinterpret_cast<const uint2*>(row + (((ch + 2) ^ r) << 4) + 8 * (t & 1));
                uint32_t a[4][4];
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const uint32_t sel = j == 0 ? kSel0 : kSel1;
                    const uint32_t v[2] = {__byte_perm(lo.x, lo.y, sel), __byte_perm(hi.x, hi.y, sel)};
#pragma unroll
                    for (int e = 0; e < 2; ++e) {  // a0 / a1 from the low words, a2 / a3 from the high ones
                        if constexpr (kHalf) {
                            const uint32_t v8 = v[e] >> 8;
                            a[2 * j][2 * e] = lop3_and_or(v[e], 0x000f000fu, kMagic);
                            a[2 * j + 1][2 * e] = lop3_and_or(v[e], 0x00f000f0u, kMagic);
                            a[2 * j][2 * e + 1] = lop3_and_or(v8, 0x000f000fu, kMagic);
                            a[2 * j + 1][2 * e + 1] = lop3_and_or(v8, 0x00f000f0u, kMagic);
                        } else {
#pragma unroll
                            for (int nb = 0; nb < 2; ++nb) {
                                a[2 * j + nb][2 * e] = lop3_and_or(v[e] >> (4 * nb), 0x000f000fu, kMagic);
                                a[2 * j + nb][2 * e + 1] = lop3_and_or(v[e] >> (8 + 4 * nb), 0x000f000fu, kMagic);
                            }
                        }
                    }
                }
                const uint32_t b0 = b[2 * seg + kh][0], b1 = b[2 * seg + kh][1];
#pragma unroll
                for (int i = 0; i < 4; ++i) ptx::mma16816<T>(q[i], a[i], b0, b1);
                ptx::mma16816<T>(sx, kOnes, b0, b1);
            }
            // End of a group (or of this warp's range inside one): y += s' q + c' sum(x) per output
            // with the group's scale s and offset b (w = q s + b): s' = s / mult, c' = b - magic s'.
            if (((k0 + 32 * seg + 32) & (group - 1)) == 0 || (seg == 1 && it + 1 == n)) {
                const unsigned char* sw = sl + 2 * kTcWBox + seg * kTcSBox + 32 * r;
                const uint4 s0 = *reinterpret_cast<const uint4*>(sw), s1 = *reinterpret_cast<const uint4*>(sw + 16);
                const uint32_t sp[4] = {s0.x, s0.z, s1.x, s1.z}, bp[4] = {s0.y, s0.w, s1.y, s1.w};
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const float2 sv = to_float2<T>(*reinterpret_cast<const typename Vec2<T>::type*>(&sp[i]));
                    const float2 bv = to_float2<T>(*reinterpret_cast<const typename Vec2<T>::type*>(&bp[i]));
                    const float inv = kHalf && (i & 1) ? 0.0625f : 1.f;  // fp16 odd tiles hold 16q
                    const float f0 = sv.x * inv, f1 = sv.y * inv;
                    const float c0 = fmaf(-kMagicF, f0, bv.x), c1 = fmaf(-kMagicF, f1, bv.y);
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        acc[i][h] = fmaf(f0, q[i][h], fmaf(c0, sx[h], acc[i][h]));
                        acc[i][2 + h] = fmaf(f1, q[i][2 + h], fmaf(c1, sx[h], acc[i][2 + h]));
                    }
#pragma unroll
                    for (int v = 0; v < 4; ++v) q[i][v] = 0.f;
                }
#pragma unroll
                for (int v = 0; v < 4; ++v) sx[v] = 0.f;
            }
        }
        if (st != nst - 1 && it + 1 != n) {
            ++st;
            continue;
        }
        // End of this warp's segment of tile c. acc[i][h]: output 8r + 2i, x row 2t + h;
        // acc[i][2 + h]: output 8r + 2i + 1, the same row.
        const int o0 = c * kTcCols + 8 * r;
        bool write = true;
        if (!(st_first == 0 && st == nst - 1)) {
            const long long first = static_cast<long long>(c) * nst;
            const int others = static_cast<int>(kbit::sk_owner(first + nst - 1, units, warps) -
                                                kbit::sk_owner(first, units, warps));
            // Row m = 2t + h of the lane: outputs o0..o0 + 7 are acc[i][h], acc[i][2 + h], i = 0..3.
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int m = 2 * t + h;
                if (m >= M || o0 >= out) continue;
                float* dst = accum + static_cast<size_t>(m) * out + o0;
                kbit::red_add4(dst, acc[0][h], acc[0][2 + h], acc[1][h], acc[1][2 + h]);
                kbit::red_add4(dst + 4, acc[2][h], acc[2][2 + h], acc[3][h], acc[3][2 + h]);
            }
            write = kbit::sk_warp_arrive_last(counters + c, others);
            if (write) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int m = 2 * t + h;
                    if (m >= M || o0 >= out) continue;
                    float4* src = reinterpret_cast<float4*>(accum + static_cast<size_t>(m) * out + o0);
                    const float4 p0 = kbit::sk_take4(src), p1 = kbit::sk_take4(src + 1);
                    acc[0][h] = p0.x, acc[0][2 + h] = p0.y, acc[1][h] = p0.z, acc[1][2 + h] = p0.w;
                    acc[2][h] = p1.x, acc[2][2 + h] = p1.y, acc[3][h] = p1.z, acc[3][2 + h] = p1.w;
                }
            }
        }
        if (write && o0 < out) {  // out % 8 == 0: the column group is whole
            float bv[8];
#pragma unroll
            for (int o = 0; o < 8; ++o) bv[o] = bias != nullptr ? to_f<T>(bias[o0 + o]) : 0.f;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int m = 2 * t + h;
                if (m >= M) continue;
                T vals[8];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    vals[2 * i] = from_f<T>(acc[i][h] + bv[2 * i]);
                    vals[2 * i + 1] = from_f<T>(acc[i][2 + h] + bv[2 * i + 1]);
                }
                *reinterpret_cast<uint4*>(y + static_cast<size_t>(m) * out + o0) = *reinterpret_cast<const uint4*>(vals);
            }
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int v = 0; v < 4; ++v) acc[i][v] = 0.f;
        ++c;
        st = 0;
        st_first = 0;
    }
#else
    __trap();  // TMA and this kernel exist on sm_90a only; the host launches it on compute capability 9.0 only
#endif
}

}  // namespace

// Resident CTAs per SM (for a one-wave grid; the same for every M); 0 where the kernel cannot run
// (not sm_90a / 9.0).
template <typename T>
int gemv_tc_ctas_per_sm() {
    const void* f = reinterpret_cast<const void*>(awq_gemv_tc_kernel<T>);
    if (!ptx::wgmma_device_ok()) return 0;
    return kbit::resident_ctas(f, kTcThreads, kTcSmem);
}

// y [m, out] for m = 1..8 with a grid of ctas CTAs of 8 warps, 8 * ctas <= ceil(out / 64) *
// ceil(in / 64) units; accum holds out * m zeroed floats and counters ceil(out / 64) zeroed ints
// (both left zeroed).
template <typename T>
int gemv_tc(const void* x, const int32_t* wq, const void* sz, const void* bias, void* y, int m, int in, int out,
            int group, int ctas, float* accum, int* counters, cudaStream_t stream) {
    const void* f = reinterpret_cast<const void*>(awq_gemv_tc_kernel<T>);
    if (m < 1 || m > 8 || in <= 0 || out <= 0 || in % 32 || out % 8 || group < 32 || (group & (group - 1)) ||
        in % group || ctas < 1 || accum == nullptr || counters == nullptr || !ptx::wgmma_device_ok())
        return static_cast<int>(cudaErrorInvalidValue);
    const long long units = static_cast<long long>((out + kTcCols - 1) / kTcCols) * ((in + kTcBK - 1) / kTcBK);
    if (static_cast<long long>(ctas) * kTcWarps > units || units > (1LL << 30))
        return static_cast<int>(cudaErrorInvalidValue);
    // Weight words [out / 8, in] in 32-word x 8-row boxes (128-byte swizzle); scale / offset pair
    // words [in / group, out] in 64 x 1 boxes. Boxes past in / out / the last group read as zeros.
    CUtensorMap tmw, tms;
    if (!ptx::encode_2d(&tmw, CU_TENSOR_MAP_DATA_TYPE_UINT32, wq, in, out / 8, static_cast<uint64_t>(in) * 4, 32,
                        kTcCols / 8, CU_TENSOR_MAP_SWIZZLE_128B) ||
        !ptx::encode_2d(&tms, CU_TENSOR_MAP_DATA_TYPE_UINT32, sz, out, in / group, static_cast<uint64_t>(out) * 4,
                        kTcCols, 1, CU_TENSOR_MAP_SWIZZLE_NONE))
        return static_cast<int>(cudaErrorInvalidValue);
    const cudaError_t attr = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, kTcSmem);
    if (attr != cudaSuccess) return static_cast<int>(attr);
    const T* xt = static_cast<const T*>(x);
    const T* bt = static_cast<const T*>(bias);
    T* yt = static_cast<T*>(y);
    void* args[] = {&tmw, &tms, &xt, &bt, &yt, &m, &in, &out, &group, &accum, &counters};
    return kbit::pdl_launch_c(f, dim3(static_cast<unsigned>(ctas)), dim3(kTcThreads), kTcSmem, stream, args);
}

template int gemv_tc_ctas_per_sm<half>();
template int gemv_tc_ctas_per_sm<__nv_bfloat16>();
template int gemv_tc<half>(const void*, const int32_t*, const void*, const void*, void*, int, int, int, int, int,
                           float*, int*, cudaStream_t);
template int gemv_tc<__nv_bfloat16>(const void*, const int32_t*, const void*, const void*, void*, int, int, int, int,
                                    int, float*, int*, cudaStream_t);

}  // namespace awq
