// awq_orin stream-K GEMV, M = 1..4 rows of x: y[m, o] = sum_k x[m, k] * W[o, k] (+ bias), reading
// the resident layout of awq_common.cuh (wq [out/8, in] int32, sz [in/group, out, 2]) as is.
//
// Tile = one 8-output column group c (row c of wq, contiguous over K). Work unit = (c, 512 inputs):
// lane l holds quads 32i + l (i = 0..3) of the unit, so every warp-wide copy is 512 contiguous
// bytes. Units are numbered tile-major (memory order) and split into equal contiguous ranges, one
// per warp of a grid that fills the GPU once (stream-K), so every SM streams the same number of
// units whatever the shape, with no wave tail.
// Each warp runs its own kStages-deep cp.async pipeline in shared memory: per unit its weights
// (2 KB) and the scale / bias pairs of the groups it covers (32 bytes per group), zero-filled past
// K; only __syncwarp is needed, and the scale loads never sit between a weight and its use.
// A word is dequantized once (LOP3 magic numbers + one FMA with the group's scale and folded
// bias b = -scale * zero, awq_common.cuh) and FMAd into all M rows in the activation dtype; fp16
// rows add a unit's 4 quads (16 products per output) in half2 before fp32, bf16 rows (8-bit
// mantissa) every quad's 4, as the warp GEMV does.
// At the end of its segment of a tile a warp reduce-scatters its 8M sums over the lanes. A whole
// tile is stored directly; partial tiles are added into a zeroed fp32 accumulator in L2 and the
// last warp to arrive (per-tile counter) stores y (+ bias) and leaves accumulator and counter zero
// (stream_k.cuh). The order of those additions varies from run to run, so the low bits of y may
// too: backends/cuda/awq_ops.py runs the warp GEMV (awq_gemv.cu, fixed order) in deterministic mode.
#include "awq_common.cuh"
#include "mma_ptx.cuh"
#include "pdl.cuh"
#include "stream_k.cuh"

#include <type_traits>

namespace awq {

namespace {

using kbit::kSkThreads;
using kbit::kSkWarps;

constexpr int kSkQuads = 4;                   // 16-byte copies per lane per unit
constexpr int kUnitQuads = 32 * kSkQuads;     // quads (4 inputs of 8 outputs) per unit
constexpr int kUnitInputs = 4 * kUnitQuads;   // 512: a multiple of every group size
constexpr int kUnitGroups = kUnitInputs / 32; // groups per unit at most (group 32)
// Units per warp in the pipeline: one in flight while one is summed. H200 session 39, behind a
// writer, µs with 3 / 2 stages: fp16 M=1 4096x28672 27.2 / 26.8, 14336x4096 17.7 / 16.7, 4096x4096
// 9.4 / 8.1, M=2 4096x28672 32.7 / 31.4; bf16 M=1 14336x4096 19.3 / 17.9, 4096x4096 9.9 / 8.3.
constexpr int kStages = 2;
constexpr int kStageW = kUnitQuads * 16;      // bytes of weights per stage
constexpr int kStageBytes = kStageW + kUnitGroups * 32;
constexpr int kSkSmem = kSkWarps * kStages * kStageBytes;  // 40 KB per CTA

// Start the copies of unit (c, ch) into stage st: quad 32i + lane of the unit at st + (32i + lane) * 16,
// then the 32-byte scale / bias pairs of the unit's groups (512 >> group_shift of them), group j at
// st + kStageW + 32j. Quads and groups past K are zero-filled.
template <typename T>
__device__ __forceinline__ void issue_unit(char* st, const int4* __restrict__ wq, const T* __restrict__ sz, int c,
                                           int ch, int quads, int out, int group_shift, int lane) {
    const int kq0 = ch * kUnitQuads;
    const int4* wrow = wq + static_cast<size_t>(c) * quads;
#pragma unroll
    for (int i = 0; i < kSkQuads; ++i) {
        const int kq = kq0 + 32 * i + lane;
        const bool ok = kq < quads;
        ptx::cp_async16(st + (32 * i + lane) * 16, ok ? wrow + kq : wq, ok);
    }
    if (lane < 2 * (kUnitInputs >> group_shift)) {  // two 16-byte halves per group
        const int grp = ((kq0 * 4) >> group_shift) + (lane >> 1);
        const bool ok = grp < ((quads * 4) >> group_shift);
        const T* src = sz + (static_cast<size_t>(grp) * out + 8 * c) * 2 + (lane & 1) * 8;
        ptx::cp_async16(st + kStageW + lane * 16, ok ? src : sz, ok);
    }
}

// acc[m][o] += this lane's part of unit (c, kq0 / kUnitQuads) times x row m, from stage st.
template <typename T, int M>
__device__ __forceinline__ void unit_fma(const char* st, const T* __restrict__ x, int in, int kq0, int quads,
                                         int group_shift, int lane, float (&acc)[M][8]) {
    using T2 = typename Vec2<T>::type;
    constexpr bool kHalf = std::is_same<T, half>::value;
    T2 part[M][4];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int j = 0; j < 4; ++j) part[m][j] = zero2<T>();
#pragma unroll
    for (int i = 0; i < kSkQuads; ++i) {
        const int ql = 32 * i + lane;
        const int kq = kq0 + ql;
        const bool ok = kq < quads;
        const int4 wv = *reinterpret_cast<const int4*>(st + ql * 16);
        const int4* sp = reinterpret_cast<const int4*>(st + kStageW + ((ql * 4) >> group_shift) * 32);
        T2 s2[4], b2[4], w[4][4];
        split_pair_scales<T>(sp[0], sp[1], s2, b2);
        dequant_quad<T>(wv, s2, b2, w);
#pragma unroll
        for (int m = 0; m < M; ++m) {
            const uint2 xr =
                ok ? __ldg(reinterpret_cast<const uint2*>(x + static_cast<size_t>(m) * in) + kq) : make_uint2(0u, 0u);
            fma_quad<T>(w, xr, part[m]);
            if constexpr (!kHalf) flush_pairs<T>(part[m], acc[m]);
        }
    }
    if constexpr (kHalf) {
#pragma unroll
        for (int m = 0; m < M; ++m) flush_pairs<T>(part[m], acc[m]);
    }
}

template <typename T>
__device__ __forceinline__ void store_out(T* __restrict__ y, const T* __restrict__ bias, int out, int m, int o,
                                          float v) {
    if (bias != nullptr) v += to_f<T>(bias[o]);
    y[static_cast<size_t>(m) * out + o] = from_f<T>(v);
}

// End of a warp's segment of tile c: sum acc over the lanes and store the tile (whole) or add it
// into the tile's accumulator, the last of its others + 1 warps storing the total.
template <typename T, int M>
__device__ __forceinline__ void finish_segment(const float (&acc)[M][8], bool whole, int c, int others,
                                               const T* __restrict__ bias, T* __restrict__ y, int out,
                                               float* __restrict__ accum, int* __restrict__ counters, int lane) {
    constexpr int V = M == 1 ? 8 : M == 2 ? 16 : 32;  // 8M sums, padded to a power of two
    float v[V];
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = i < 8 * M ? acc[i / 8][i % 8] : 0.f;
    const float s = kbit::warp_reduce_scatter<V>(v);
    const int idx = lane / (32 / V);  // this lane's sum: row idx / 8, output 8c + idx % 8
    const bool writer = lane % (32 / V) == 0 && idx < 8 * M;
    const int m = idx / 8, o = 8 * c + idx % 8;
    if (whole) {
        if (writer) store_out<T>(y, bias, out, m, o, s);
        return;
    }
    float* tacc = accum + static_cast<size_t>(c) * (8 * M) + idx;
    if (writer) atomicAdd(tacc, s);  // result unused: a red.global.add
    if (kbit::sk_warp_arrive_last(counters + c, others) && writer) {
        const float total = __ldcg(tacc);
        __stcg(tacc, 0.f);
        store_out<T>(y, bias, out, m, o, total);
    }
}

template <typename T, int M>
__global__ void __launch_bounds__(kSkThreads, M <= 2 ? 3 : 2)
gemv_sk_kernel(const T* __restrict__ x, const int4* __restrict__ wq, const T* __restrict__ sz,
               const T* __restrict__ bias, T* __restrict__ y, int in, int out, int group_shift,
               float* __restrict__ accum, int* __restrict__ counters) {
    extern __shared__ int4 smem_awq_sk[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    char* stages = reinterpret_cast<char*>(smem_awq_sk) + warp * (kStages * kStageBytes);
    const int quads = in / 4;
    const int nu = (quads + kUnitQuads - 1) / kUnitQuads;  // units per tile
    const long long units = static_cast<long long>(out / 8) * nu;
    const long long warps = static_cast<long long>(gridDim.x) * kSkWarps;
    const long long w = static_cast<long long>(blockIdx.x) * kSkWarps + warp;
    const long long u0 = kbit::sk_start(w, units, warps);
    const int n = static_cast<int>(kbit::sk_start(w + 1, units, warps) - u0);  // >= 1 units of this warp
    int c = static_cast<int>(u0 / nu), ch = static_cast<int>(u0 - static_cast<long long>(c) * nu);

    int ic = c, ich = ch;  // next unit to copy
    auto issue_next = [&](int stage) {
        issue_unit<T>(stages + stage * kStageBytes, wq, sz, ic, ich, quads, out, group_shift, lane);
        if (++ich == nu) {
            ich = 0;
            ++ic;
        }
    };
    kbit::pdl_trigger();
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < n) issue_next(s);
        ptx::cp_async_commit();  // one group per stage, empty or not, so the wait count below holds
    }
    kbit::pdl_wait();  // the stages above are weights and scales only; x, y and scratch follow (pdl.cuh)

    int ch_first = ch;
    float acc[M][8];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int o = 0; o < 8; ++o) acc[m][o] = 0.f;
    int rd = 0, wr = kStages - 1;  // stage of unit it, stage that unit it + kStages - 1 goes to
    for (int it = 0; it < n; ++it) {
        __syncwarp();  // every lane is done with stage wr (summed in iteration it - 1)
        if (it + kStages - 1 < n) issue_next(wr);
        ptx::cp_async_commit();
        ptx::cp_async_wait<kStages - 1>();  // this lane's copies of unit it have landed
        __syncwarp();                       // and every lane's (the scale pairs are shared)
        unit_fma<T, M>(stages + rd * kStageBytes, x, in, ch * kUnitQuads, quads, group_shift, lane, acc);
        rd = rd + 1 == kStages ? 0 : rd + 1;
        wr = wr + 1 == kStages ? 0 : wr + 1;
        if (ch != nu - 1 && it + 1 != n) {
            ++ch;
            continue;
        }
        // End of this warp's segment of tile c (units ch_first..ch).
        const long long t0 = static_cast<long long>(c) * nu;
        const int others =
            static_cast<int>(kbit::sk_owner(t0 + nu - 1, units, warps) - kbit::sk_owner(t0, units, warps));
        finish_segment<T, M>(acc, ch_first == 0 && ch == nu - 1, c, others, bias, y, out, accum, counters, lane);
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
            for (int o = 0; o < 8; ++o) acc[m][o] = 0.f;
        ++c;
        ch = 0;
        ch_first = 0;
    }
}

// The kernels this file instantiates: activation dtype x rows 1..4.
template <typename T>
const void* sk_pick(int m) {
    switch (m) {
        case 1: return reinterpret_cast<const void*>(gemv_sk_kernel<T, 1>);
        case 2: return reinterpret_cast<const void*>(gemv_sk_kernel<T, 2>);
        case 3: return reinterpret_cast<const void*>(gemv_sk_kernel<T, 3>);
        case 4: return reinterpret_cast<const void*>(gemv_sk_kernel<T, 4>);
        default: return nullptr;
    }
}

int group_shift_of(int group) { return group == 32 ? 5 : group == 64 ? 6 : group == 128 ? 7 : -1; }

}  // namespace

// Resident CTAs per SM of the kernel for m rows, for sizing a one-wave grid; 0 on error.
template <typename T>
int gemv_sk_ctas_per_sm(int m) {
    const void* f = sk_pick<T>(m);
    if (f == nullptr) return 0;
    return kbit::resident_ctas(f, kSkThreads, kSkSmem);
}

// y [m, out] for m = 1..4 with a grid of ctas CTAs of 8 warps, 8 * ctas <= (out / 8) * ceil(in / 512)
// units; accum holds out * m zeroed floats and counters out / 8 zeroed ints (both left zeroed).
template <typename T>
int gemv_sk(const void* x, const int32_t* wq, const void* sz, const void* bias, void* y, int m, int in, int out,
            int group, int ctas, float* accum, int* counters, cudaStream_t stream) {
    int gshift = group_shift_of(group);
    const void* f = sk_pick<T>(m);
    if (f == nullptr || gshift < 0 || in <= 0 || out <= 0 || in % group || out % 8 || ctas < 1 ||
        accum == nullptr || counters == nullptr)
        return static_cast<int>(cudaErrorInvalidValue);
    const long long units = static_cast<long long>(out / 8) * ((in / 4 + kUnitQuads - 1) / kUnitQuads);
    if (static_cast<long long>(ctas) * kSkWarps > units) return static_cast<int>(cudaErrorInvalidValue);
    const cudaError_t attr = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, kSkSmem);
    if (attr != cudaSuccess) return static_cast<int>(attr);
    const T* xt = static_cast<const T*>(x);
    const int4* w4 = reinterpret_cast<const int4*>(wq);
    const T* st = static_cast<const T*>(sz);
    const T* bt = static_cast<const T*>(bias);
    T* yt = static_cast<T*>(y);
    void* args[] = {&xt, &w4, &st, &bt, &yt, &in, &out, &gshift, &accum, &counters};
    return kbit::pdl_launch_c(f, dim3(static_cast<unsigned>(ctas)), dim3(kSkThreads), kSkSmem, stream, args);
}

template int gemv_sk_ctas_per_sm<half>(int);
template int gemv_sk_ctas_per_sm<__nv_bfloat16>(int);
template int gemv_sk<half>(const void*, const int32_t*, const void*, const void*, void*, int, int, int, int, int,
                           float*, int*, cudaStream_t);
template int gemv_sk<__nv_bfloat16>(const void*, const int32_t*, const void*, const void*, void*, int, int, int, int,
                                    int, float*, int*, cudaStream_t);

}  // namespace awq
