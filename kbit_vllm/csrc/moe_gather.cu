// MoE gather: rows[i, :] = x[src_row[i], :], the rows of x in expert order for the gate/up grouped
// GEMM, as raw 16-byte chunks (any 2- or 4-byte dtype whose rows are whole chunks).
//
// Why: torch's index_select between moe_route and the gate/up GEMM cannot take part in PDL, so the
// GEMM's launch and table build followed it (H200, Qwen3-30B-A3B shapes in vLLM, batch 1: 3.4 us
// per layer for 8 rows of 4 KB). Launched with PDL (pdl.cuh), this copy overlaps the routing's
// tail, and the GEMM after it builds its table while it runs. It reads src_row and x and writes
// rows only after pdl_wait.
#include "common.cuh"
#include "pdl.cuh"

namespace moe {

namespace {

constexpr int kGatherThreads = 128;
// From this many rows a CTA copies kGatherRows rows (four 16-byte loads in flight per thread before
// any store): H200, rows of 4 KB, µs one / four rows per CTA: 65536 rows 159 / 98, 16384 rows 41 /
// 22, 2048 rows 5.9 / 3.9, 128 rows 1.5 / 1.8.
constexpr int kGatherManyRows = 1024;
constexpr int kGatherRows = 4;

// Grid (rows / R, chunk blocks); a thread copies one 16-byte chunk of each of the CTA's R rows.
// src_row comes from moe_route; clamping keeps a bad index inside x.
template <int R>
__global__ void __launch_bounds__(kGatherThreads) gather_kernel(const uint4* __restrict__ x,
                                                                const int* __restrict__ src_row,
                                                                uint4* __restrict__ out, int rows, int row_chunks,
                                                                int n_src) {
    kbit::pdl_trigger();
    kbit::pdl_wait();
    const int c = blockIdx.y * kGatherThreads + threadIdx.x;
    if (c >= row_chunks) return;
    const int r0 = blockIdx.x * R;
    uint4 v[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
        if (r0 + i < rows) {
            const int s = min(max(src_row[r0 + i], 0), n_src - 1);
            v[i] = x[static_cast<size_t>(s) * row_chunks + c];
        }
    }
#pragma unroll
    for (int i = 0; i < R; ++i)
        if (r0 + i < rows) out[static_cast<size_t>(r0 + i) * row_chunks + c] = v[i];
}

}  // namespace

// x [n_src, row_chunks] and out [rows, row_chunks] in 16-byte chunks, both 16-byte aligned.
int gather(const void* x, const int* src_row, void* out, int rows, int row_chunks, int n_src, cudaStream_t stream) {
    if (rows < 0 || row_chunks < 1 || row_chunks > 65535 * kGatherThreads || (rows > 0 && n_src < 1) ||
        reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0)
        return static_cast<int>(cudaErrorInvalidValue);
    if (rows == 0) return 0;
    const int r = rows >= kGatherManyRows ? kGatherRows : 1;
    const dim3 grid((rows + r - 1) / r, (row_chunks + kGatherThreads - 1) / kGatherThreads);
    return kbit::pdl_launch(r == 1 ? gather_kernel<1> : gather_kernel<kGatherRows>, grid, dim3(kGatherThreads), 0,
                            stream, static_cast<const uint4*>(x), src_row, static_cast<uint4*>(out), rows, row_chunks,
                            n_src);
}

}  // namespace moe
