// Read-only stream: the least work a kernel that reads a weight tensor can do, so the benchmarks can
// time it beside the GEMVs (benchmarks/bench_floor.py). Its best time behind the same writer, in the
// same CUDA graph, over the same rotated copies, is what reading those bytes costs as measured:
// launch, DRAM latency and the wave's tail included, no decode, no x, no reduction.
//
// Each CTA streams chunks of U x kReadThreads 16-byte words (U loads a thread issued together, with
// ld.global.nc and no L1 allocation; ptxas starts the XORs after 5 of 8), the grid striding over
// the tensor; the caller sweeps U and CTAs per SM for the fastest; the words are XORed so
// the loads stay live, and CTA b writes its XOR to sink[b] (the caller's check: the XOR of the
// sinks is the XOR of the tensor's words). PDL as the GEMVs (pdl.cuh): a dense layer's weights may
// be read before pdl_wait (only the sink store waits), as a GEMV may stream them before its x is
// ready; wait_first waits before any read, as a grouped (MoE) kernel must, whose experts come from
// the routing the kernel before it writes.
#include "common.cuh"
#include "pdl.cuh"

namespace kbit {

namespace {

constexpr int kReadThreads = 256;

__device__ __forceinline__ uint4 ld_stream16(const uint4* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

template <int U>
__global__ void __launch_bounds__(kReadThreads) stream_read_kernel(const uint4* __restrict__ src, long long words,
                                                                   uint32_t* __restrict__ sink, int wait_first) {
    pdl_trigger();
    if (wait_first) pdl_wait();
    constexpr long long kChunk = static_cast<long long>(U) * kReadThreads;
    const long long step = static_cast<long long>(gridDim.x) * kChunk;
    uint32_t acc = 0;
    long long base = blockIdx.x * kChunk;
    for (; base + kChunk <= words; base += step) {  // whole chunks: all U loads issued before any use
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) v[u] = ld_stream16(src + base + u * kReadThreads + threadIdx.x);
#pragma unroll
        for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (long long i = base + threadIdx.x; i < words; i += kReadThreads) {  // the one partial chunk, if any
        const uint4 v = ld_stream16(src + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    __shared__ uint32_t warp_acc[kReadThreads / 32];
    if ((threadIdx.x & 31) == 0) warp_acc[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t s = 0;
#pragma unroll
        for (int w = 0; w < kReadThreads / 32; ++w) s ^= warp_acc[w];
        pdl_wait();  // the sink may be read or written by an earlier kernel
        sink[blockIdx.x] = s;
    }
}

template <int U>
int launch_stream_read_u(const void* src, long long words, uint32_t* sink, int ctas, int wait_first,
                         cudaStream_t stream) {
    return pdl_launch(stream_read_kernel<U>, dim3(static_cast<unsigned>(ctas)), dim3(kReadThreads), 0, stream,
                      static_cast<const uint4*>(src), words, sink, wait_first);
}

}  // namespace

// Stream `bytes` (a multiple of 16) from 16-byte-aligned src with `ctas` CTAs (sink holds ctas words)
// and `unroll` (2, 4 or 8) loads a thread in flight, waiting for the kernel before (PDL) before the first
// read when wait_first, else only before the sink store. bytes = 0 launches the kernel with nothing to read.
int launch_stream_read(const void* src, long long bytes, uint32_t* sink, int ctas, int unroll, int wait_first,
                       cudaStream_t stream) {
    if (bytes < 0 || bytes % 16 || ctas < 1 || sink == nullptr || (bytes > 0 && src == nullptr) ||
        reinterpret_cast<uintptr_t>(src) % 16)
        return static_cast<int>(cudaErrorInvalidValue);
    const long long words = bytes / 16;
    switch (unroll) {
        case 2: return launch_stream_read_u<2>(src, words, sink, ctas, wait_first, stream);
        case 4: return launch_stream_read_u<4>(src, words, sink, ctas, wait_first, stream);
        case 8: return launch_stream_read_u<8>(src, words, sink, ctas, wait_first, stream);
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
}

// CTAs of the read kernel an SM holds at once (for a one-wave grid); 0 if the query fails.
int stream_read_ctas_per_sm(int unroll) {
    switch (unroll) {
        case 2: return resident_ctas(reinterpret_cast<const void*>(stream_read_kernel<2>), kReadThreads, 0);
        case 4: return resident_ctas(reinterpret_cast<const void*>(stream_read_kernel<4>), kReadThreads, 0);
        case 8: return resident_ctas(reinterpret_cast<const void*>(stream_read_kernel<8>), kReadThreads, 0);
        default: return 0;
    }
}

}  // namespace kbit
