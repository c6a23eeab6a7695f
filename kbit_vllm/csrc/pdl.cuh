// Programmatic dependent launch (PDL, sm_90+): a kernel launched through pdl_launch or pdl_launch_c
// (below) may start while the kernel before it in the stream is still finishing, so its launch, its
// weight loads and its shared-table build overlap that kernel's tail instead of following it.
//
// The rule for such a kernel: before pdl_wait() it may only read weights (never written by a
// kernel after load) and fill shared memory; everything an earlier kernel may write or read
// (x, expert offsets, y, scratch accumulators and counters) comes after pdl_wait(), which returns
// once every earlier grid has completed and its writes are visible. pdl_trigger() lets the next
// PDL kernel start its own prologue; kernels without PDL after ours wait for it as usual.
#pragma once
#include <cuda_runtime.h>

namespace kbit {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// Host: whether launches use PDL (the kbit_vllm_set_pdl switch, on by default, and a current
// device of compute capability 9.0 or newer). Defined in api.cpp.
bool pdl_enabled();

// Append the PDL attribute to cfg (attrs must have room for one more) when pdl_enabled().
inline void pdl_attach(cudaLaunchConfig_t& cfg, cudaLaunchAttribute* attrs) {
    if (!pdl_enabled()) return;
    cudaLaunchAttribute& a = attrs[cfg.numAttrs];
    a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attrs;
    ++cfg.numAttrs;
}

// A launch config for grid x block with dynamic smem on stream, PDL attached when enabled.
inline cudaLaunchConfig_t pdl_config(dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                     cudaLaunchAttribute* attrs) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    pdl_attach(cfg, attrs);
    return cfg;
}

// Launch kernel(args...) on grid x block with smem bytes of dynamic shared memory on stream, PDL
// attached when enabled (every PDL launch of the library goes through here or pdl_launch_c): the
// launch's error, else any error left pending after it (cudaGetLastError), as an int (0 = success).
template <typename... Params, typename... Args>
inline int pdl_launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      Args... args) {
    cudaLaunchAttribute attrs[1];
    const cudaLaunchConfig_t cfg = pdl_config(grid, block, smem, stream, attrs);
    const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
    return static_cast<int>(e != cudaSuccess ? e : cudaGetLastError());
}

// pdl_launch for a kernel picked at run time: kernel as a function pointer, args as
// cudaLaunchKernelExC takes them (one pointer to each parameter, in order); cluster > 1 launches
// clusters of that many CTAs along x.
inline int pdl_launch_c(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void** args,
                        int cluster = 1) {
    cudaLaunchAttribute attrs[2];
    cudaLaunchConfig_t cfg = pdl_config(grid, block, smem, stream, attrs);
    if (cluster > 1) {
        cudaLaunchAttribute& a = attrs[cfg.numAttrs];
        a.id = cudaLaunchAttributeClusterDimension;
        a.val.clusterDim.x = static_cast<unsigned>(cluster);
        a.val.clusterDim.y = 1;
        a.val.clusterDim.z = 1;
        cfg.attrs = attrs;
        ++cfg.numAttrs;
    }
    const cudaError_t e = cudaLaunchKernelExC(&cfg, kernel, args);
    return static_cast<int>(e != cudaSuccess ? e : cudaGetLastError());
}

}  // namespace kbit
