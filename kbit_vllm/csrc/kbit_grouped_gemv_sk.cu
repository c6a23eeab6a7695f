// kbit grouped stream-K GEMV (MoE, few rows per expert, k = 2..4): for every expert e and each of
// its rows r, y[r, :] = x[r, :] @ W_e^T, all experts in one launch, reading the stacked tiled
// layout packed_tiled [E, n_tiles, nb, k, 128] / absmax_tiled [E, n_tiles, nb, 128].
//
// Items: an expert with n rows has ceil(n / M) passes of M rows (moe::find_item with M rows per
// item); only experts with rows have items. Work unit = (item, tile of 128 features, 32-wide input
// block), numbered item-major, then tile, then block, so an item's units are its expert's tiled
// weights in memory order. Every warp counts the items from the device offsets itself, and all
// units are split into equal contiguous ranges, one per warp of a grid that fills the GPU once
// (stream-K): 8 active experts of 128 get the whole GPU, and nothing waits on empty experts. A
// later pass of the same expert re-reads its weights at about the same time (mostly L2 hits).
// An item of fewer rows than M (an expert's last pass) runs the unit body for just its rows, so a
// pass width above the typical rows per expert costs the experts with fewer rows nothing but a
// branch per unit (routing rarely spreads rows evenly: at 64 rows over 128 experts most active
// experts have one row, some two or three).
//
// The unit body, table and reductions are the dense stream-K GEMV's (kbit_sk.cuh). A warp's range
// covers at most two partial tiles (head and tail); whole tiles are stored directly; partial ones
// are added into a zeroed fp32 accumulator slot per (item, tile) in L2, and the last warp of a
// tile (per-slot counter) converts the sums, writes y, and leaves slot and counter zero. The
// order of those fp32 additions varies from run to run, so the low bits of y may too:
// backends/cuda picks the slot GEMV (kbit_grouped_gemv.cu, fixed order) in deterministic mode.
#include "kbit_sk.cuh"
#include "moe_common.cuh"
#include "pdl.cuh"

namespace kbit {

namespace {

constexpr long long kGskMinUnits = 2;  // units per warp at least, so the table build is amortized

template <typename T, int M>
__device__ __forceinline__ void gsk_store(T* __restrict__ y, int N, int frow, int m0, int mr, const float (&v)[4][M]) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int row = frow + r;
        if (row < N) {
#pragma unroll
            for (int m = 0; m < M; ++m)
                if (m < mr) y[static_cast<size_t>(m0 + m) * N + row] = from_float<T>(v[r][m]);
        }
    }
}

// sk_unit for the item's mr rows (1..R, warp-uniform) into the first mr columns of acc.
template <typename T, int K, int M, int R = M>
__device__ __forceinline__ void gsk_unit(int mr, const uint4 (&p)[K], uint32_t a, const uint4* __restrict__ xb,
                                         const int (&xoff)[M], const char* tblc, uint32_t lane4, float (&acc)[4][M]) {
    if constexpr (R > 1) {
        if (mr < R) {
            gsk_unit<T, K, M, R - 1>(mr, p, a, xb, xoff, tblc, lane4, acc);
            return;
        }
    }
    sk_unit<T, K, R, false, false, M>(p, a, xb, xoff, tblc, lane4, acc);
}

template <typename T, int K, int M>
__global__ void __launch_bounds__(kSkThreads, M == 1 ? 3 : 2) grouped_gemv_sk_kernel(
    const T* __restrict__ x, const uint4* __restrict__ packed_t, const uint32_t* __restrict__ absmax_t,
    const float* __restrict__ codebook, const int* __restrict__ offs, T* __restrict__ y, int n_exp, int rows, int N,
    int nb, int max_items, float* __restrict__ accum, int* __restrict__ counters) {
    static_assert(K >= 2 && K <= 4, "table GEMV takes k = 2..4");
    extern __shared__ uint4 smem_gsk[];
    uint32_t* tbl = reinterpret_cast<uint32_t*>(smem_gsk);
    const int lane = threadIdx.x & 31;
    const int n_tiles = (N + kTileN - 1) / kTileN;
    const long long per_item = static_cast<long long>(n_tiles) * nb;
    pdl_trigger();
    build_wide_lut<K>(tbl, codebook);  // while the previous kernel may still run; offs, x, y after (pdl.cuh)
    pdl_wait();
    const int items = min(moe::count_items(offs, n_exp, rows, M), max_items);  // grid-uniform
    const long long units = items * per_item;
    const long long warps =
        min(static_cast<long long>(gridDim.x) * kSkWarps, max(1LL, units / kGskMinUnits));  // ranges never empty
    if (units == 0 || static_cast<long long>(blockIdx.x) * kSkWarps >= warps) return;  // CTA-uniform
    const long long w = static_cast<long long>(blockIdx.x) * kSkWarps + (threadIdx.x >> 5);
    const bool active = w < warps;  // warp-uniform

    long long u0 = 0, u1 = 0;
    int item = 0, t = 0, j = 0, expert = 0;
    uint4 p[K];
    uint32_t a = 0;
    if (active) {
        u0 = sk_start(w, units, warps);
        u1 = sk_start(w + 1, units, warps);
        item = static_cast<int>(u0 / per_item);
        const long long rem = u0 - item * per_item;
        t = static_cast<int>(rem / nb);
        j = static_cast<int>(rem - static_cast<long long>(t) * nb);
        moe::Item it;
        moe::find_item(offs, n_exp, rows, M, item, it);
        expert = it.expert;
        sk_load<K>(packed_t, absmax_t, (static_cast<long long>(expert) * n_tiles + t) * nb + j, lane, p, a);
    }
    __syncthreads();  // the table
    if (!active) return;

    const uint32_t lane4 = static_cast<uint32_t>(lane) * 4u;
    const char* tblc = reinterpret_cast<const char*>(tbl);
    const int x_stride4 = nb * 4;  // uint4 per x row
    const int nwarps = static_cast<int>(warps);
    int m0 = 0, mr = 0;  // this item's rows of x / y: [m0, m0 + mr)
    const uint4* xrow = nullptr;
    auto set_rows = [&]() {  // find_item again: nothing of it stays live across the unit body
        moe::Item it;
        moe::find_item(offs, n_exp, rows, M, item, it);
        m0 = it.row0 + it.sub * M;
        mr = min(M, it.row1 - m0);
        xrow = reinterpret_cast<const uint4*>(x) + static_cast<size_t>(m0) * x_stride4;
    };
    set_rows();
    int j_first = j;
    float acc[4][M];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[r][m] = 0.f;

    for (int left = static_cast<int>(u1 - u0); left > 0; --left) {
        int jn = j + 1, tn = t;
        bool next_item = false;
        if (jn == nb) {
            jn = 0;
            if (++tn == n_tiles) {
                tn = 0;
                next_item = true;
            }
        }
        uint4 pn[K];
        uint32_t an = 0;
        if (left > 1) {
            int en = expert;
            if (next_item) {
                moe::Item itn;
                moe::find_item(offs, n_exp, rows, M, item + 1, itn);
                en = itn.expert;
            }
            sk_load<K>(packed_t, absmax_t, (static_cast<long long>(en) * n_tiles + tn) * nb + jn, lane, pn, an);
            expert = en;
        }
        int xoff[M];
#pragma unroll
        for (int m = 0; m < M; ++m) xoff[m] = min(m, mr - 1) * x_stride4;
        gsk_unit<T, K, M>(mr, p, a, xrow + j * 4, xoff, tblc, lane4, acc);
#pragma unroll
        for (int b = 0; b < K; ++b) p[b] = pn[b];
        a = an;
        if (jn != 0 && left > 1) {
            j = jn;
            continue;
        }
        // End of this warp's segment of tile t of the item (units j_first..j).
        const int frow = t * kTileN + 4 * lane;
        if (j_first == 0 && j == nb - 1) {
            gsk_store<T, M>(y, N, frow, m0, mr, acc);
        } else {
            const long long slot = static_cast<long long>(item) * n_tiles + t;
            float* tacc = accum + (static_cast<size_t>(slot) * 32 + lane) * (4 * M);  // [r][m] per lane
            sk_red_tile<M>(tacc, acc);
            const long long tb = item * (static_cast<long long>(n_tiles) * nb) + static_cast<long long>(t) * nb;
            const long long n_units = static_cast<long long>(items) * n_tiles * nb;
            const long long wf = sk_owner(tb, n_units, nwarps), wl = sk_owner(tb + nb - 1, n_units, nwarps);
            if (sk_warp_arrive_last(counters + slot, static_cast<int>(wl - wf))) {  // last of this tile's warps
                float sum[4][M];
                sk_take_tile<M>(tacc, sum);
                gsk_store<T, M>(y, N, frow, m0, mr, sum);
            }
        }
        if (left == 1) break;
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
            for (int m = 0; m < M; ++m) acc[r][m] = 0.f;
        if (next_item) {
            ++item;
            set_rows();
        }
        t = tn;
        j = jn;
        j_first = 0;
    }
}

template <typename T, int K, int M>
const void* gsk_kernel() {
    return reinterpret_cast<const void*>(grouped_gemv_sk_kernel<T, K, M>);
}

template <typename T>
const void* gsk_pick(int k, int m) {
#define KBIT_GSK_CASE(KK, MM) \
    if (k == KK && m == MM) return gsk_kernel<T, KK, MM>();
    KBIT_GSK_CASE(2, 1) KBIT_GSK_CASE(2, 2) KBIT_GSK_CASE(2, 3) KBIT_GSK_CASE(2, 4)
    KBIT_GSK_CASE(3, 1) KBIT_GSK_CASE(3, 2) KBIT_GSK_CASE(3, 3) KBIT_GSK_CASE(3, 4)
    KBIT_GSK_CASE(4, 1) KBIT_GSK_CASE(4, 2) KBIT_GSK_CASE(4, 3) KBIT_GSK_CASE(4, 4)
#undef KBIT_GSK_CASE
    return nullptr;
}

}  // namespace

// Resident CTAs per SM of the kernel for (k, rows per pass), for sizing a one-wave grid; 0 on error.
template <typename T>
int grouped_gemv_sk_ctas_per_sm(int k, int mp) {
    const void* f = gsk_pick<T>(k, mp);
    if (f == nullptr) return 0;
    constexpr int smem = static_cast<int>(kSkSmem);
    int n = 0;
    if (cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) return 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, f, kSkThreads, smem) != cudaSuccess) return 0;
    return n;
}

// mp: rows per pass (1..4); max_items: an upper bound on the items, (rows + min(n_exp, rows) *
// (mp - 1)) / mp; ctas: grid size (one wave); accum: max_items * n_tiles * 128 * mp zeroed floats,
// counters: max_items * n_tiles zeroed ints (both left zeroed). offs: int32 [n_exp + 1] on the device.
template <typename T>
int launch_grouped_gemv_sk(const void* x, const void* pt, const uint8_t* at, const float* cb, const int* offs,
                           void* y, int k, int n_exp, int rows, int N, int nb, int mp, int max_items, int ctas,
                           float* accum, int* counters, cudaStream_t stream) {
    if (rows <= 0 || N <= 0) return 0;
    if (nb <= 0 || n_exp <= 0 || max_items < 1 || ctas < 1 || accum == nullptr || counters == nullptr)
        return static_cast<int>(cudaErrorInvalidValue);
    const void* f = gsk_pick<T>(k, mp);
    if (f == nullptr) return static_cast<int>(cudaErrorInvalidValue);
    constexpr int smem = static_cast<int>(kSkSmem);
    const cudaError_t attr = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (attr != cudaSuccess) return static_cast<int>(attr);
    const T* xt = static_cast<const T*>(x);
    const uint4* p4 = static_cast<const uint4*>(pt);
    const uint32_t* a4 = reinterpret_cast<const uint32_t*>(at);
    T* yt = static_cast<T*>(y);
    void* args[] = {&xt, &p4, &a4, &cb, &offs, &yt, &n_exp, &rows, &N, &nb, &max_items, &accum, &counters};
    cudaLaunchAttribute attrs[1];
    const cudaLaunchConfig_t cfg = pdl_config(dim3(static_cast<unsigned>(ctas)), dim3(kSkThreads), smem, stream, attrs);
    const cudaError_t e = cudaLaunchKernelExC(&cfg, f, args);
    if (e != cudaSuccess) return static_cast<int>(e);
    KBIT_RETURN_LAUNCH_STATUS();
}

template int grouped_gemv_sk_ctas_per_sm<half>(int, int);
template int grouped_gemv_sk_ctas_per_sm<__nv_bfloat16>(int, int);
template int launch_grouped_gemv_sk<half>(const void*, const void*, const uint8_t*, const float*, const int*, void*,
                                          int, int, int, int, int, int, int, int, float*, int*, cudaStream_t);
template int launch_grouped_gemv_sk<__nv_bfloat16>(const void*, const void*, const uint8_t*, const float*, const int*,
                                                   void*, int, int, int, int, int, int, int, int, float*, int*,
                                                   cudaStream_t);

}  // namespace kbit
