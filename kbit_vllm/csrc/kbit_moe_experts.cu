// kbit fused MoE experts for decode-sized batches (k = 2..5): for every token t,
//   y[t] = sum_s w[t, s] * W2_e (act(W13_e,gate x_t) * W13_e,up x_t),  e = ids[t, s],
// in ONE launch, where the unfused layer runs five (routing + gather, gate/up GEMM, gated
// activation, down GEMM, combine). H200, Qwen3-30B-A3B shapes, k=4, bf16: 21.0 us against the five
// ops' 29.0 at one token, 38.9 against 44.8 at four; at eight they tie (benchmarks/RESULTS.md,
// session 35), so dispatch.moe_fused stops at 32 (token, expert) pairs.
//
// Items: the T * top_k (token, slot) pairs in their given order, one x row each (no sort, no gather;
// two pairs of one expert read its weights twice, the second time mostly from L2). Work units are
// the stream-K GEMV's (kbit_sk.cuh: 128 rows x one 32-wide input block), in two phases, each split
// into equal contiguous ranges over the warps of a one-wave grid; every warp runs its A range, then
// its B range, so both phases read with the grid's warps (a grid split between the phases left a
// third of it idle in A and two thirds in B: Qwen3 shapes, T=8, 117 us a layer against 90 unfused):
//   A  (item, act tile a, half g, block j): the gate (g = 0) and up (g = 1) row tiles a and
//      I/128 + a of W13_e over x_t. One act tile's 2 * H/32 units are a "super tile": its gate and
//      up sums meet in a zeroed fp32 slot (red_add4); the warp that finishes it (sk_warp_arrive_last,
//      or a warp that ran all of it) rounds gate and up to the activation dtype, writes
//      act(gate) * up (fp32, one rounding: moe_gated_act's math) to the act scratch and releases
//      the tile's ready flag.
//   B  (token, out tile o, slot s, block j): W2_e's row tile o over act block j of pair (t, s),
//      each slot's sums times its router weight; a (token, out tile) is a super tile whose
//      finishing warp writes y. Before reading an act block a warp acquires its tile's flag.
// B units wait only on A units, and no warp waits before it has run its A range, so the waits end
// once every CTA is resident: the host sizes the grid to one wave (the occupancy query), and CTAs a
// busy GPU cannot place yet get SMs as the kernels before this one drain (a PDL dependent starts only
// after every CTA here has started). A token's last finished y tile resets its pairs' flags, so the
// counters, slots and flags are zero again for the next launch or graph replay.
//
// Each unit stages its 32 inputs (x for A, act for B) in the warp's own shared slot as fp16 times
// a power of two (x_pow2_scale of the block's max), so both phases run sk_unit's half2 loop, and
// undoes the scale on the unit's sums. Pairs whose (mapped) expert is not local contribute nothing
// (moe_route's rule). The fp32 sums meet in L2 in an order that varies from run to run, so
// deterministic mode takes the unfused path (backends/cuda/moe_experts.py).
#include "kbit_sk.cuh"
#include "moe_common.cuh"
#include "pdl.cuh"

namespace kbit {

namespace {

// Units per warp at least, per phase: fewer warps per super tile, fewer reductions to wait for. H200
// (session 35, Qwen3-30B-A3B shapes, k=4, bf16, op us at T = 1 / 2 / 4 / 8) A, B at 1, 1: 23.4 / 28.1 /
// 38.8 / 63.7; 2, 2: 21.1 / 27.5 / 38.8 / 63.4; 3, 3: 21.6 / 27.5 / 38.6 / 63.2; 4, 4: 23.5 / 28.1 /
// 37.7 / 63.0; 4, 8: 28.6 / 34.4 / 42.1 / 60.9.
constexpr int kMxMinUnitsA = 2, kMxMinUnitsB = 2;

// The kernel's unit counts, from its shape arguments.
struct MxDims {
    int nta, nbH, nbI, ntH;  // act tiles (I / 128), x blocks (H / 32), act blocks (I / 32), y tiles
    int per_item_a, units_a, per_tok_b, units_b;
    __device__ __forceinline__ MxDims(int tokens, int topk, int H, int I)
        : nta(I / kTileN), nbH(H / kBlock), nbI(I / kBlock), ntH((H + kTileN - 1) / kTileN),
          per_item_a(2 * nta * nbH), units_a(tokens * topk * per_item_a), per_tok_b(ntH * topk * nbI),
          units_b(tokens * per_tok_b) {}
};

// Local expert of item i, or -1 when the pair is not served here (expert_map -1 or out of range).
__device__ __forceinline__ int mx_expert(const int* __restrict__ ids, const int* __restrict__ emap, int n_global,
                                         int n_exp, int i) {
    int e = __ldg(ids + i);
    if (emap != nullptr) e = (e >= 0 && e < n_global) ? __ldg(emap + e) : -1;
    return (e >= 0 && e < n_exp) ? e : -1;
}

// Stage the unit's 32 inputs (lane l holds input l as float) into the warp's shared slot as fp16
// times a power of two; returns the inverse to apply to the unit's sums.
template <int K>
__device__ __forceinline__ float mx_stage(uint32_t* tbl, int slot, float v) {
    float sc, inv;
    x_pow2_scale(warp_max(fabsf(v)), sc, inv);
    reinterpret_cast<half*>(tbl + SkCfg<K>::x_word(slot))[threadIdx.x & 31] = __float2half_rn(v * sc);
    __syncwarp();
    return inv;
}

template <int K>
__device__ __forceinline__ void mx_unit(const uint4 (&p)[K], uint32_t a, const uint32_t* tbl, int slot,
                                        const char* tblc, uint32_t lane4, float (&part)[4]) {
    const int xoff[1] = {0};
    float acc[4][1] = {{0.f}, {0.f}, {0.f}, {0.f}};
    sk_unit<half, K, 1, false, true, 1>(p, a, reinterpret_cast<const uint4*>(tbl + SkCfg<K>::x_word(slot)), xoff,
                                        tblc, lane4, acc);
#pragma unroll
    for (int r = 0; r < 4; ++r) part[r] = acc[r][0];
}

// Units [lo, hi) of one run of consecutive units: each unit's weights and input requested one unit
// ahead (load(u, p, absmax word, input value)), the input staged, the unit's 4 row sums and the
// staging inverse handed to add(u, part, inv).
template <int K, typename Load, typename Add>
__device__ __forceinline__ void mx_units(int lo, int hi, uint32_t* tbl, int& slot, const char* tblc, uint32_t lane4,
                                         Load load, Add add) {
    uint4 p[K];
    uint32_t am;
    float xv;
    load(lo, p, am, xv);
    for (int u = lo; u < hi; ++u) {
        uint4 pn[K];
        uint32_t an = 0;
        float xn = 0.f;
        if (u + 1 < hi) load(u + 1, pn, an, xn);
        slot ^= 1;
        const float inv = mx_stage<K>(tbl, slot, xv);
        float part[4];
        mx_unit<K>(p, am, tbl, slot, tblc, lane4, part);
        add(u, part, inv);
#pragma unroll
        for (int b = 0; b < K; ++b) p[b] = pn[b];
        am = an;
        xv = xn;
    }
}

__device__ __forceinline__ int ld_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release(int* p, int v) {
    asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

template <typename T>
__device__ __forceinline__ float act_of(int fn, float g, float u) {
    const float gr = to_float(from_float<T>(g)), ur = to_float(from_float<T>(u));  // the GEMM's rounding
    const float a = fn == 0 ? moe::gate_act<0>(gr) : fn == 1 ? moe::gate_act<1>(gr) : moe::gate_act<2>(gr);
    return a * ur;
}

template <typename T, int K>
__global__ void __launch_bounds__(SkCfg<K>::kThreads, SkCfg<K>::kWarps > kSkWarps ? 1 : 3)
moe_experts_kernel(const T* __restrict__ x, const int* __restrict__ ids, const float* __restrict__ tw,
                   const int* __restrict__ emap, int n_global, const uint4* __restrict__ p13,
                   const uint32_t* __restrict__ a13, const uint4* __restrict__ p2, const uint32_t* __restrict__ a2,
                   const float* __restrict__ codebook, T* __restrict__ y, T* act, float* accum, int* counters,
                   int tokens, int topk, int n_exp, int H, int I, int fn) {
    static_assert(K >= 2 && K <= 5, "k = 2..5");
    constexpr int W = SkCfg<K>::kWarps;
    extern __shared__ uint4 smem_mx[];
    uint32_t* tbl = reinterpret_cast<uint32_t*>(smem_mx);
    const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
    pdl_trigger();
    if constexpr (K == 5)
        sk_build_table<K>(tbl, lane_codebook<K>(codebook, lane), SkCfg<K>::kThreads);
    else
        build_wide_lut<K>(tbl, codebook);
    const MxDims d(tokens, topk, H, I);
    const int P = tokens * topk;
    // Scratch: fp32 [A slots: P * nta * 32 lanes * 8][B slots: tokens * ntH * 32 * 4];
    // int [A counters: P * nta][flags: P * nta][B counters: tokens * ntH][tokens] (moe_experts_scratch).
    float* acc_a = accum;
    float* acc_b = accum + static_cast<size_t>(P) * d.nta * 256;
    int* cnt_a = counters;
    int* flags = counters + P * d.nta;
    int* cnt_b = counters + 2 * P * d.nta;
    int* cnt_tok = cnt_b + tokens * d.ntH;  // y tiles finished per token
    // Each phase splits its units over its own warps (at least kMxMinUnits* units each, at most one
    // range per warp of the grid, never an empty one: sk_owner counts a tile's warps from the ranges);
    // a warp runs its A range, then its B range.
    const int warps_a = min(static_cast<int>(gridDim.x) * W, max(1, d.units_a / kMxMinUnitsA));
    const int warps_b = min(static_cast<int>(gridDim.x) * W, max(1, d.units_b / kMxMinUnitsB));
    const int warps = max(warps_a, warps_b);
    const int w = static_cast<int>(blockIdx.x) * W + wib;
    __syncthreads();  // the table
    if (w >= warps) return;  // warp-uniform; no block barrier follows
    pdl_wait();  // the routing (ids, weights), x, y and scratch only from here
    const uint32_t lane4 = static_cast<uint32_t>(lane) * 4u;
    const char* tblc = reinterpret_cast<const char*>(tbl);
    int slot = 2 * wib;  // this warp's two staging slots, alternating by unit

    const int st_b = topk * d.nbI;  // this warp's B range (after its A range)
    const int b_lo = w < warps_b ? static_cast<int>(sk_start(w, d.units_b, warps_b)) : 0;
    const int b_hi = w < warps_b ? static_cast<int>(sk_start(w + 1, d.units_b, warps_b)) : 0;

    // ---- phase A: super tiles (item, act tile) overlapped by this warp's A range [u0, a_end) ----
    const int st_a = 2 * d.nbH;
    const int u0 = w < warps_a ? static_cast<int>(sk_start(w, d.units_a, warps_a)) : 0;
    const int a_end = w < warps_a ? static_cast<int>(sk_start(w + 1, d.units_a, warps_a)) : 0;
    for (int s0 = u0 - u0 % st_a; s0 < a_end; s0 += st_a) {
        const int i = s0 / d.per_item_a, at = (s0 - i * d.per_item_a) / st_a;
        const int e = mx_expert(ids, emap, n_global, n_exp, i);
        if (e < 0) continue;  // no warp finishes a dead item's tiles; B skips its slot
        const int lo = max(u0, s0), hi = min(a_end, s0 + st_a);
        const T* xrow = x + static_cast<size_t>(i / topk) * H;
        auto load = [&](int u, uint4 (&p)[K], uint32_t& am, float& xv) {
            const int r = u - s0, g = r >= d.nbH, j = r - g * d.nbH;
            sk_load<K>(p13, a13, (static_cast<long long>(e) * 2 * d.nta + g * d.nta + at) * d.nbH + j, lane, p, am);
            xv = to_float(__ldg(xrow + j * kBlock + lane));
        };
        float accg[4] = {0.f, 0.f, 0.f, 0.f}, accu[4] = {0.f, 0.f, 0.f, 0.f};
        mx_units<K>(lo, hi, tbl, slot, tblc, lane4, load, [&](int u, const float (&part)[4], float inv) {
            const bool up = u - s0 >= d.nbH;
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                if (up)
                    accu[r] = fmaf(part[r], inv, accu[r]);
                else
                    accg[r] = fmaf(part[r], inv, accg[r]);
            }
        });
        const int tile = i * d.nta + at;
        if (lo != s0 || hi != s0 + st_a) {
            float* sl = acc_a + (static_cast<size_t>(tile) * 32 + lane) * 8;
            if (lo - s0 < d.nbH) red_add4(sl, accg[0], accg[1], accg[2], accg[3]);  // touched the gate half
            if (hi - s0 > d.nbH) red_add4(sl + 4, accu[0], accu[1], accu[2], accu[3]);  // the up half
            const int wf = static_cast<int>(sk_owner(s0, d.units_a, warps_a));
            const int wl = static_cast<int>(sk_owner(s0 + st_a - 1, d.units_a, warps_a));
            if (!sk_warp_arrive_last(cnt_a + tile, wl - wf)) continue;
            const float4 g4 = sk_take4(reinterpret_cast<float4*>(sl));
            const float4 u4 = sk_take4(reinterpret_cast<float4*>(sl + 4));
            accg[0] = g4.x, accg[1] = g4.y, accg[2] = g4.z, accg[3] = g4.w;
            accu[0] = u4.x, accu[1] = u4.y, accu[2] = u4.z, accu[3] = u4.w;
        }
        T v[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) v[r] = from_float<T>(act_of<T>(fn, accg[r], accu[r]));
        *reinterpret_cast<uint2*>(act + static_cast<size_t>(i) * I + at * kTileN + 4 * lane) =
            *reinterpret_cast<const uint2*>(v);
        __threadfence();
        __syncwarp();
        if (lane == 0) st_release(flags + tile, 1);
    }

    // ---- phase B: super tiles (token, out tile) overlapped by this warp's B range [b_lo, b_hi) ----
    for (int s0 = b_lo - b_lo % st_b; s0 < b_hi; s0 += st_b) {
        const int t = s0 / d.per_tok_b, o = (s0 - t * d.per_tok_b) / st_b;
        const int lo = max(b_lo, s0), hi = min(b_hi, s0 + st_b);
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        // slot runs [lo, hi) cut at slot boundaries; a slot's expert, weight and act row once per run
        for (int r0 = lo; r0 < hi;) {
            const int s = (r0 - s0) / d.nbI, r1 = min(hi, s0 + (s + 1) * d.nbI);
            const int i = t * topk + s;
            const int e = mx_expert(ids, emap, n_global, n_exp, i);
            if (e >= 0) {
                const float ws = __ldg(tw + i);
                const T* arow = act + static_cast<size_t>(i) * I;
                const int* fl = flags + i * d.nta;
                int seen = -1;  // highest act tile whose flag this warp has acquired
                auto load = [&](int u, uint4 (&p)[K], uint32_t& am, float& xv) {
                    const int j = u - s0 - s * d.nbI;
                    sk_load<K>(p2, a2, (static_cast<long long>(e) * d.ntH + o) * d.nbI + j, lane, p, am);
                    const int need = j * kBlock / kTileN;
                    if (need > seen) {  // act tiles are finished in any order; wait for this one
                        if (lane == 0)
                            while (ld_acquire(fl + need) == 0) __nanosleep(64);
                        __syncwarp();
                        seen = need;  // (a later tile may still be pending: need only grows)
                    }
                    xv = to_float(__ldcg(arow + j * kBlock + lane));  // written in this launch: L2
                };
                float accs[4] = {0.f, 0.f, 0.f, 0.f};
                mx_units<K>(r0, r1, tbl, slot, tblc, lane4, load, [&](int, const float (&part)[4], float inv) {
#pragma unroll
                    for (int r = 0; r < 4; ++r) accs[r] = fmaf(part[r], inv, accs[r]);
                });
#pragma unroll
                for (int r = 0; r < 4; ++r) acc[r] = fmaf(accs[r], ws, acc[r]);
            }
            r0 = r1;
        }
        const int tile = t * d.ntH + o;
        if (lo != s0 || hi != s0 + st_b) {
            float* sl = acc_b + (static_cast<size_t>(tile) * 32 + lane) * 4;
            red_add4(sl, acc[0], acc[1], acc[2], acc[3]);
            const int wf = static_cast<int>(sk_owner(s0, d.units_b, warps_b));
            const int wl = static_cast<int>(sk_owner(s0 + st_b - 1, d.units_b, warps_b));
            if (!sk_warp_arrive_last(cnt_b + tile, wl - wf)) continue;
            const float4 f = sk_take4(reinterpret_cast<float4*>(sl));
            acc[0] = f.x, acc[1] = f.y, acc[2] = f.z, acc[3] = f.w;
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int row = o * kTileN + 4 * lane + r;
            if (row < H) y[static_cast<size_t>(t) * H + row] = from_float<T>(acc[r]);
        }
        // The token's last y tile: every read of its pairs' ready flags is done (each reader counted
        // in at a y tile before), so they are reset for the next launch here.
        if (sk_warp_arrive_last(cnt_tok + t, d.ntH - 1))
            for (int q = lane; q < topk * d.nta; q += 32) flags[t * topk * d.nta + q] = 0;
    }
}

template <typename T, int K>
const void* mx_kernel() {
    return reinterpret_cast<const void*>(moe_experts_kernel<T, K>);
}

template <typename T>
const void* mx_pick(int k) {
    switch (k) {
        case 2: return mx_kernel<T, 2>();
        case 3: return mx_kernel<T, 3>();
        case 4: return mx_kernel<T, 4>();
        case 5: return mx_kernel<T, 5>();
        default: return nullptr;
    }
}

}  // namespace

// Resident CTAs per SM of the fused kernel at k bits, for sizing its one-wave grid; 0 where this GPU
// cannot run it (k = 5's 160 KB of shared memory on sm_86 / sm_89) or k is outside 2..5.
template <typename T>
int moe_experts_ctas_per_sm(int k) {
    const void* f = mx_pick<T>(k);
    if (f == nullptr) return 0;
    const SkShape s = sk_shape(k);
    return resident_ctas(f, s.warps * 32, s.smem);
}

// Scratch of one launch (P = tokens * topk pairs): zeroed fp32 accum and int counters, both left zeroed
// (sizes: moe_experts_scratch), and act, P * I values of T. H % 32 == 0, I % 128 == 0; ctas: at most
// one wave (moe_experts_ctas_per_sm x SMs).
template <typename T>
int launch_moe_experts(const void* x, const int* ids, const float* tw, const int* emap, int n_global, const void* p13,
                       const uint8_t* a13, const void* p2, const uint8_t* a2, const float* cb, void* y, void* act,
                       float* accum, int* counters, int k, int tokens, int topk, int n_exp, int H, int I, int fn,
                       int ctas, cudaStream_t stream) {
    if (tokens <= 0) return 0;
    if (topk < 1 || n_exp < 1 || H < kBlock || H % kBlock || I < kTileN || I % kTileN || fn < 0 || fn > 2 ||
        ctas < 1 || accum == nullptr || counters == nullptr || act == nullptr || (emap != nullptr && n_global < 1))
        return static_cast<int>(cudaErrorInvalidValue);
    const long long P = static_cast<long long>(tokens) * topk;
    const long long units = P * 2 * (I / kTileN) * (H / kBlock) +
                            static_cast<long long>(tokens) * ((H + kTileN - 1) / kTileN) * topk * (I / kBlock);
    if (units >= (1LL << 31) / 2) return static_cast<int>(cudaErrorInvalidValue);  // int unit numbers
    const void* f = mx_pick<T>(k);
    if (f == nullptr) return static_cast<int>(cudaErrorInvalidValue);
    const SkShape shape = sk_shape(k);
    const cudaError_t attr = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, shape.smem);
    if (attr != cudaSuccess) return static_cast<int>(attr);
    const T* xt = static_cast<const T*>(x);
    const uint4* p13_4 = static_cast<const uint4*>(p13);
    const uint4* p2_4 = static_cast<const uint4*>(p2);
    const uint32_t* a13_4 = reinterpret_cast<const uint32_t*>(a13);
    const uint32_t* a2_4 = reinterpret_cast<const uint32_t*>(a2);
    T* yt = static_cast<T*>(y);
    T* actt = static_cast<T*>(act);
    void* args[] = {&xt, &ids, &tw, &emap, &n_global, &p13_4, &a13_4, &p2_4, &a2_4, &cb, &yt, &actt,
                    &accum, &counters, &tokens, &topk, &n_exp, &H, &I, &fn};
    return pdl_launch_c(f, dim3(static_cast<unsigned>(ctas)), dim3(static_cast<unsigned>(shape.warps * 32)), shape.smem,
                        stream, args);
}

// Elements of the zeroed scratch a launch needs: fp32 accum (every super tile's slots) and
// int counters (A counters and ready flags per (pair, act tile), B counters per (token, y tile), and
// finished y tiles per token).
void moe_experts_scratch(int tokens, int topk, int H, int I, long long* accum_floats, long long* counter_ints) {
    const long long P = static_cast<long long>(tokens) * topk, nta = I / kTileN, nth = (H + kTileN - 1) / kTileN;
    *accum_floats = P * nta * 256 + tokens * nth * 128LL;
    *counter_ints = 2 * P * nta + tokens * nth + tokens;
}

template int moe_experts_ctas_per_sm<half>(int);
template int moe_experts_ctas_per_sm<__nv_bfloat16>(int);
template int launch_moe_experts<half>(const void*, const int*, const float*, const int*, int, const void*,
                                      const uint8_t*, const void*, const uint8_t*, const float*, void*, void*, float*,
                                      int*, int, int, int, int, int, int, int, int, cudaStream_t);
template int launch_moe_experts<__nv_bfloat16>(const void*, const int*, const float*, const int*, int, const void*,
                                               const uint8_t*, const void*, const uint8_t*, const float*, void*, void*,
                                               float*, int*, int, int, int, int, int, int, int, int, cudaStream_t);

}  // namespace kbit
