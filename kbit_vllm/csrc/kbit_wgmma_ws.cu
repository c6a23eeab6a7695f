// kbit tensor-core GEMM on Hopper (sm_90a), warp-specialized, k = 2..5, for large M:
// y[M, N] = x[M, K] @ W^T (+ bias), W in the tiled layout.
//
// Why: the wgmma kernel (kbit_wgmma.cu) decodes the weights into the A registers of the warps that
// also issue the wgmmas, so every warp's chain of table lookups sits between its tensor groups;
// with 2 warps a scheduler that chain, not the tensor cores, sets the pace (RESULTS.md, sessions 29
// and 32). Here the roles are split:
// * Producer warpgroup (warps 0..3): waits for a stage's loads, decodes its 128 features x 64
//   inputs exactly as the wgmma kernel's 128-row tile does (warp w: features 32w..32w+31 as rows
//   of two m64 tiles, kbit_wgmma_tile.cuh), and stores the A fragments with stmatrix into a shared
//   A slot in the K-major 128-byte swizzled layout (m64 tile i: 64 rows x 128 bytes; row 16w + r +
//   8h of tile i is feature 32w + 4r + 2i + h of the layout tile). Its thread 0 issues the loads
//   (a TMA box of 256 x rows, bulk copies of the plane words and absmax bytes).
// * Consumer warpgroups (warps 4..11): warpgroup i runs m64n256k16 with A (tile i) and B (x) both
//   from shared memory, 128 accumulators a thread: each decoded weight feeds 256 rows and the
//   consumers issue little besides the wgmmas.
// * Row tile = one 128-feature layout tile x 256 x rows; stream-K over one wave of one CTA per SM,
//   unit = (row tile, stage of 2 blocks), partial row tiles as in kbit_wgmma.cu (fp32 vector
//   reductions into a zeroed accumulator, a per-tile counter, the last CTA writes y and leaves both
//   zero; the consumers' own named barrier).
// * Rings: 4 load slots ([x box][plane words][absmax], the tall tile's slot, kbit_wgmma_tile.cuh)
//   with a "full" mbarrier (bytes) and an "empty" one (one arrival per consumer warp once its
//   wgmmas of the stage are done), and 2 A slots with "full" (one arrival per producer warp after
//   its stores and an async-proxy fence) and "empty" (consumer warps). A load slot is refilled
//   once the consumers released it, after the producer decoded the next stage (so the wait can
//   never block the decode the consumers are waiting for).
// k = 5 decodes through its 8-copy pair table (the 32-copy one leaves no room for the slots).
#include "kbit_wgmma_tile.cuh"
#include "pdl.cuh"

namespace kbit {

namespace {

constexpr int kWsThreads = 384;       // producer warpgroup + 2 consumer warpgroups
constexpr int kWsRows = kWgTallRows;  // x rows per row tile (the wgmma N)
constexpr int kWsLoadSlots = 4;
constexpr int kWsASlots = 2;
constexpr int kWsConsumers = 256;     // consumer threads
constexpr int kWsConsumerBar = 1;     // hardware barrier of the consumers' partial-tile handshake

template <int K>
struct WsCfg {
    static constexpr int C5 = 8;                        // k = 5 table lane copies (32 KB)
    using Slot = WgCfg<K, kWsRows, C5>;                 // load slot layout: [x][plane words][absmax]
    static constexpr int kLoadBytes = Slot::kSlotBytes;
    static constexpr int kABytes = 2 * 64 * 128;        // two m64 tiles of 64 rows x 64 inputs
    static constexpr int kLoadOff = Slot::kSlotsOff;    // after the pair and scale tables
    static constexpr int kAOff = kLoadOff + kWsLoadSlots * kLoadBytes;
    static constexpr int kBarOff = kAOff + kWsASlots * kABytes;
    static constexpr int kBars = 2 * kWsLoadSlots + 2 * kWsASlots;
    static constexpr int kBytes = 1024 + kBarOff + kBars * 8 + 16;  // alignment, tables, slots, barriers, flag
    static constexpr int kTileFloats = kWsRows * kTileN;
    static_assert(kBytes <= kWgOneCtaBytes, "one CTA per SM");
};

#if defined(KBIT_WGMMA)
// The consumers' form of sk_cta_arrive_last (the producer never joins): every consumer thread calls
// it after its reductions into the tile accumulator; true in every consumer thread of the tile's
// last CTA, which then reads every CTA's sums and leaves the accumulator zeroed.
__device__ __forceinline__ bool ws_consumers_arrive_last(int* counter, int others, int* flag, bool leader) {
    __threadfence();
    ptx::named_bar_sync(kWsConsumerBar, kWsConsumers);
    if (leader) {
        const bool last = atomic_add_acquire(counter, 1) == others;
        if (last) *counter = 0;
        *flag = last;
    }
    ptx::named_bar_sync(kWsConsumerBar, kWsConsumers);
    return *flag != 0;
}
#endif

template <typename T, int K>
__global__ void __launch_bounds__(kWsThreads, 1)
    wgmma_ws_kernel(const __grid_constant__ CUtensorMap tm_x, const uint32_t* __restrict__ packed_t,
                    const uint8_t* __restrict__ absmax_t, const float* __restrict__ codebook,
                    const T* __restrict__ bias, T* __restrict__ y, int M, int N, int nb, float* __restrict__ ws,
                    int* __restrict__ counters) {
#if defined(KBIT_WGMMA)
    using S = WsCfg<K>;
    constexpr int C5 = S::C5, LS = kWsLoadSlots, AS = kWsASlots;
    constexpr int kJ = kWsRows / 8;  // 8-row accumulator groups
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n_tiles = (N + kTileN - 1) / kTileN;  // row tiles along N: one layout tile each
    const int m_tiles = (M + kWsRows - 1) / kWsRows;
    const int nst = (nb + kWgBK - 1) / kWgBK;
    const long long ctas = gridDim.x, cta = blockIdx.x;
    const long long units = static_cast<long long>(n_tiles) * m_tiles * nst;
    const int u0 = static_cast<int>(sk_start(cta, units, ctas));
    const int u1 = static_cast<int>(sk_start(cta + 1, units, ctas));
    const int n_u = u1 - u0;
    const uint32_t raw_s = ptx::smem_u32(smem_raw);
    const uint32_t smem_s = (raw_s + 1023u) & ~1023u;
    unsigned char* smem_wg = smem_raw + (smem_s - raw_s);
    uint32_t* tbl = reinterpret_cast<uint32_t*>(smem_wg);
    const unsigned char* loads = smem_wg + S::kLoadOff;
    const uint32_t load_s = smem_s + S::kLoadOff, a_s = smem_s + S::kAOff, bars = smem_s + S::kBarOff;
    int* flag = reinterpret_cast<int*>(smem_wg + S::kBarOff + S::kBars * 8);
    auto full = [&](int i) { return bars + 8u * i; };
    auto empty = [&](int i) { return bars + 8u * (LS + i); };
    auto afull = [&](int i) { return bars + 8u * (2 * LS + i); };
    auto aempty = [&](int i) { return bars + 8u * (2 * LS + AS + i); };

    // Part `part` (0: byte expectation + x box, 1: plane words, 2: absmax bytes) of unit n's stage
    // into load slot `slot` (kw_load_part).
    auto load_part = [&](const SkUnit& n, int slot, int part) {
        const size_t blk = static_cast<size_t>(n.t) * nb + n.st * kWgBK;
        kw_load_part<K, kWsRows>(part, load_s + static_cast<uint32_t>(slot * S::kLoadBytes), full(slot), &tm_x,
                                 n.st * kWgBK * 32, n.mt * kWsRows, packed_t + blk * K * kTileN,
                                 absmax_t + blk * kTileN, nb, min(kWgBK, nb - n.st * kWgBK), 1);
    };

    // As kbit_wgmma.cu: the first stages' weights are requested and the tables built while the
    // previous kernel may still run (PDL); x follows pdl_wait.
    pdl_trigger();
    if (tid == 0) {
        for (int i = 0; i < LS; ++i) {
            ptx::mbar_init(full(i), 1);
            ptx::mbar_init(empty(i), kWsConsumers / 32);
        }
        for (int i = 0; i < AS; ++i) {
            ptx::mbar_init(afull(i), 4);
            ptx::mbar_init(aempty(i), kWsConsumers / 32);
        }
        ptx::mbar_init_fence();
        SkUnit n = SkUnit::at(u0, nst, m_tiles);
        for (int s = 0; s < LS && s < n_u; ++s, n.next(nst, m_tiles)) {
            load_part(n, s, 1);
            load_part(n, s, 2);
        }
    }
    kw_build_tables<K, T, C5>(tbl, codebook, tid, kWsThreads);
    __syncthreads();
    pdl_wait();
    if (tid == 0) {
        SkUnit n = SkUnit::at(u0, nst, m_tiles);
        for (int s = 0; s < LS && s < n_u; ++s, n.next(nst, m_tiles)) load_part(n, s, 0);
    }

    if (warp < 4) {
        // Producer: decode stage it into A slot it % AS once it landed and the slot is free; then
        // (thread 0) refill the load slot of stage it - 1 with stage it - 1 + LS.
        const KwLane L = KwLane::make<C5, 2>(tid);
        const char* tblc = reinterpret_cast<const char*>(tbl);
        // stmatrix row address of this lane: row 16 warp + lane % 8 + 8 (lane / 8 % 2) of an m64 tile,
        // 16-byte column (lane / 16) of the k16 step, swizzled by the row's position in its 8-row group.
        const uint32_t a_row = static_cast<uint32_t>((16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1)) * 128);
        const int a_chunk = lane >> 4, a_xor = lane & 7;
        SkUnit ld = SkUnit::at(u0 + LS < u1 ? u0 + LS : u0, nst, m_tiles);  // the next stage to load
        for (int it = 0; it < n_u; ++it) {
            const int ls = it % LS, as = it % AS;
            ptx::mbar_wait(full(ls), static_cast<uint32_t>(it / LS) & 1u);
            ptx::mbar_wait(aempty(as), (static_cast<uint32_t>(it / AS) & 1u) ^ 1u);
            const unsigned char* slot = loads + ls * S::kLoadBytes;
            const uint32_t a_base = a_s + static_cast<uint32_t>(as * S::kABytes) + a_row;
            uint32_t pw[K][4];
            uint32_t ab;
            kw_read_planes<K, kWsRows, 2>(slot, L, 0, pw, ab);
#pragma unroll
            for (int blk = 0; blk < kWgBK; ++blk) {
                uint32_t gw[4], s2[4], hi[4];
                kw_block_words<K, C5, 2>(pw, ab, tbl, L, gw, s2, hi);
                if (blk + 1 < kWgBK) kw_read_planes<K, kWsRows, 2>(slot, L, blk + 1, pw, ab);
#pragma unroll
                for (int kk = 0; kk < 2; ++kk) {
                    uint32_t w[2][4], a[2][4];
                    kw_lookup<K, C5, 2>(tblc, gw, hi, L, kk, w);
                    kw_scale<T, 2>(w, s2, a);
                    const uint32_t col = static_cast<uint32_t>(((blk * 4 + kk * 2 + a_chunk) ^ a_xor) << 4);
#pragma unroll
                    for (int i = 0; i < 2; ++i) ptx::stmatrix_x4(a_base + i * 64 * 128 + col, a[i]);
                }
            }
            ptx::fence_proxy_async_smem();  // the stores, before the consumers' wgmmas read them
            __syncwarp();
            if (lane == 0) ptx::mbar_arrive(afull(as));
            if (tid == 0 && it >= 1 && it - 1 + LS < n_u) {
                const int rs = (it - 1) % LS;
                ptx::mbar_wait(empty(rs), static_cast<uint32_t>((it - 1) / LS) & 1u);
                for (int part = 0; part < 3; ++part) load_part(ld, rs, part);
                ld.next(nst, m_tiles);
            }
        }
        return;
    }

    // Consumers: warpgroup wg runs m64 tile wg of every stage.
    const int ct = tid - 128, cw = ct >> 5, wg = ct >> 7, wq = cw & 3;
    const int g = lane & 3, r = lane >> 2;
    float acc[kWsRows / 2];
    auto fence_acc = [&]() {
#pragma unroll
        for (int i = 0; i < kWsRows / 2; ++i) ptx::reg_fence(acc[i]);
    };
    auto release = [&](int v) {  // this warp's wgmmas of stage v are done
        __syncwarp();
        if (lane == 0) {
            ptx::mbar_arrive(empty(v % LS));
            ptx::mbar_arrive(aempty(v % AS));
        }
    };
    int q = u0 / nst;  // row tile of the current segment
    bool seg_from_start = u0 == q * nst;
    int it = 0, rel = 0;  // stages issued, stages released
    for (int u = u0; u < u1;) {
        const int seg_end = min(u1, (q + 1) * nst);
#pragma unroll
        for (int i = 0; i < kWsRows / 2; ++i) acc[i] = 0.f;
        for (; u < seg_end; ++u, ++it) {
            const int ls = it % LS, as = it % AS;
            ptx::mbar_wait(full(ls), static_cast<uint32_t>(it / LS) & 1u);  // x landed
            ptx::mbar_wait(afull(as), static_cast<uint32_t>(it / AS) & 1u);  // A decoded
            const uint64_t da = ptx::wgmma_desc_sw128(a_s + static_cast<uint32_t>(as * S::kABytes + wg * 64 * 128));
            const uint64_t db = ptx::wgmma_desc_sw128(load_s + static_cast<uint32_t>(ls * S::kLoadBytes));
            fence_acc();
            ptx::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)  // k16 steps: 32 bytes along both K-major rows
                ptx::wgmma_ss_m64n256k16<T>(acc, da + static_cast<uint64_t>(2 * kk), db + static_cast<uint64_t>(2 * kk));
            ptx::wgmma_commit();
            fence_acc();
            ptx::wgmma_wait<1>();  // stage it - 1 is done
            fence_acc();
            if (rel < it) release(rel++);
        }
        ptx::wgmma_wait<0>();
        fence_acc();
        while (rel < it) release(rel++);

        // End of this CTA's segment of row tile q. acc[4j + h]: feature f0, x row 8j + 2g + h of the
        // tile; acc[4j + 2 + h]: feature f0 + 1, the same row.
        const int st_last = u - 1 - q * nst;
        const int rt = q / m_tiles, mt = q - rt * m_tiles;
        const int f0 = rt * kTileN + 32 * wq + 4 * r + 2 * wg;
        bool write = true;
        if (!(seg_from_start && st_last == nst - 1)) {
            const long long first = static_cast<long long>(q) * nst, lastu = first + nst - 1;
            const long long wf = sk_owner(first, units, ctas), wl = sk_owner(lastu, units, ctas);
            float* mine = ws + static_cast<size_t>(q) * S::kTileFloats + (cw * kJ * 32 + lane) * 4;
#pragma unroll
            for (int j = 0; j < kJ; ++j)
                red_add4(mine + j * 128, acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
            write = ws_consumers_arrive_last(counters + q, static_cast<int>(wl - wf), flag, ct == 0);
            if (write) {
#pragma unroll
                for (int j = 0; j < kJ; ++j) {
                    const float4 v = sk_take4(reinterpret_cast<float4*>(mine + j * 128));
                    acc[4 * j] = v.x, acc[4 * j + 1] = v.y, acc[4 * j + 2] = v.z, acc[4 * j + 3] = v.w;
                }
            }
        }
        if (write && f0 < N) {
            const float b0 = bias != nullptr ? to_float(bias[f0]) : 0.f;
            const float b1 = bias != nullptr && f0 + 1 < N ? to_float(bias[f0 + 1]) : 0.f;
            const bool vec = N % 2 == 0;  // f0 is even: both features in range
#pragma unroll
            for (int j = 0; j < kJ; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = mt * kWsRows + 8 * j + 2 * g + h;
                    if (row >= M) continue;
                    T* dst = y + static_cast<size_t>(row) * N + f0;
                    const float v0 = acc[4 * j + h] + b0, v1 = acc[4 * j + 2 + h] + b1;
                    if (vec) {
                        *reinterpret_cast<uint32_t*>(dst) = pack2<T>(v0, v1);
                    } else {
                        dst[0] = from_float<T>(v0);
                        if (f0 + 1 < N) dst[1] = from_float<T>(v1);
                    }
                }
        }
        ++q;
        seg_from_start = true;
    }
#else
    __trap();  // only sm_90a has wgmma; the host launches this kernel on compute capability 9.0 only
#endif
}

template <typename T>
const void* ws_pick(int k, int* smem) {
    switch (k) {
        case 2: *smem = WsCfg<2>::kBytes; return reinterpret_cast<const void*>(wgmma_ws_kernel<T, 2>);
        case 3: *smem = WsCfg<3>::kBytes; return reinterpret_cast<const void*>(wgmma_ws_kernel<T, 3>);
        case 4: *smem = WsCfg<4>::kBytes; return reinterpret_cast<const void*>(wgmma_ws_kernel<T, 4>);
        case 5: *smem = WsCfg<5>::kBytes; return reinterpret_cast<const void*>(wgmma_ws_kernel<T, 5>);
        default: return nullptr;
    }
}

}  // namespace

// Resident CTAs per SM of the warp-specialized kernel for k bits (1 where it runs), for sizing its
// one-wave grid; 0 on error, for k outside 2..5, or where !wgmma_device_ok().
template <typename T>
int wgmma_ws_ctas_per_sm(int k) {
    int smem = 0;
    const void* f = ws_pick<T>(k, &smem);
    if (!ptx::wgmma_device_ok() || f == nullptr ||
        cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
        return 0;
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, f, kWsThreads, smem) != cudaSuccess) return 0;
    return n;
}
template int wgmma_ws_ctas_per_sm<half>(int);
template int wgmma_ws_ctas_per_sm<__nv_bfloat16>(int);

// ctas: grid size, 1..units where units = ceil(N / 128) * ceil(M / 256) * ceil(nb / 2). ws: a zeroed
// fp32 accumulator of ceil(N / 128) * ceil(M / 256) row tiles of 256 x 128 floats, counters as many
// zeroed int32; both are left zero.
template <typename T>
int launch_wgmma_ws(const void* x, const void* pt, const uint8_t* at, const float* cb, const void* bias, int k,
                    int M, int N, int nb, void* y, int ctas, float* ws, int* counters, cudaStream_t stream) {
    if (M == 0 || N <= 0) return 0;
    int smem = 0;
    const void* f = ws_pick<T>(k, &smem);
    const long long units = ((N + kTileN - 1) / kTileN) * static_cast<long long>((M + kWsRows - 1) / kWsRows) *
                            ((nb + kWgBK - 1) / kWgBK);
    if (f == nullptr || nb <= 0 || M < 0 || ctas < 1 || ctas > units || units > (1LL << 30) || ws == nullptr ||
        counters == nullptr || !ptx::wgmma_device_ok())
        return static_cast<int>(cudaErrorInvalidValue);
    // x [M, nb * 32] in 256-row x 64-input boxes with the 128-byte swizzle (the wgmma B layout).
    CUtensorMap tmx;
    const CUtensorMapDataType xdt =
        std::is_same<T, half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    if (!ptx::encode_2d(&tmx, xdt, x, static_cast<uint64_t>(nb) * 32, M, static_cast<uint64_t>(nb) * 64,
                        kWgBK * 32, kWsRows, CU_TENSOR_MAP_SWIZZLE_128B))
        return static_cast<int>(cudaErrorInvalidValue);
    const cudaError_t attr = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (attr != cudaSuccess) return static_cast<int>(attr);
    const uint32_t* p = static_cast<const uint32_t*>(pt);
    const T* bt = static_cast<const T*>(bias);
    T* yt = static_cast<T*>(y);
    void* args[] = {&tmx, &p, &at, &cb, &bt, &yt, &M, &N, &nb, &ws, &counters};
    cudaLaunchAttribute attrs[1];
    const cudaLaunchConfig_t cfg = pdl_config(dim3(ctas), dim3(kWsThreads), smem, stream, attrs);
    const cudaError_t e = cudaLaunchKernelExC(&cfg, f, args);
    if (e != cudaSuccess) return static_cast<int>(e);
    KBIT_RETURN_LAUNCH_STATUS();
}

template int launch_wgmma_ws<half>(const void*, const void*, const uint8_t*, const float*, const void*, int, int,
                                   int, int, void*, int, float*, int*, cudaStream_t);
template int launch_wgmma_ws<__nv_bfloat16>(const void*, const void*, const uint8_t*, const float*, const void*, int,
                                            int, int, int, void*, int, float*, int*, cudaStream_t);

}  // namespace kbit
