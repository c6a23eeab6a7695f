// Asking the copy engine to pull a weight range into L2 at kernel entry (sm_90+; a no-op before).
//
// Why: behind a kernel without PDL (vLLM's norms and activations) a GEMV's prologue (table build,
// x staging, barriers) runs 1-3 us with DRAM idle, and issuing the first weight loads into
// registers before it delays the small x loads the prologue waits on (H200, session 18/19). A bulk
// L2 prefetch returns nothing to the SM, so the prologue keeps its L2 round trips while DRAM
// streams the weights the first loads will then find in L2. Weights are never written by a kernel,
// so this may run before pdl_wait.
#pragma once
#include <stdint.h>

namespace kbit {

// bytes (a multiple of 16) from 16-byte-aligned global src into L2; one thread issues it.
__device__ __forceinline__ void l2_prefetch(const void* src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (bytes != 0) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
#endif
}

}  // namespace kbit
