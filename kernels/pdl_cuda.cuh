// pdl_cuda.cuh: programmatic dependent launch (PDL), written once for every
// kernel file that uses it (ops_cuda.cu, paged_attention_cuda.cu and its
// .cuh parts, linear_cuda.cu and linear_dense_ri.cuh).
//
// The contract, the same everywhere: a kernel launched with the attribute
// (launch() with pdl true) may be scheduled before the kernel ahead of it on
// the stream has finished, once every CTA of that kernel has called
// trigger() or exited. It may read what no earlier kernel of the stream
// writes (weights, quantized pools, tables) before wait(); everything else
// only after it. wait() returns when the grid ahead (and what it waited for)
// has finished and its writes are visible; in a grid launched without the
// attribute it returns at once. So where a kernel triggers, and whether it
// is launched with the attribute, changes when it runs, never a result.
#ifndef NB_PDL_CUDA_CUH
#define NB_PDL_CUDA_CUH

#include <cuda_runtime.h>
#include <stdlib.h>

#include <utility>

namespace nb_pdl {

__device__ __forceinline__ void wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void trigger() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

// kern<<<grid, block, smem, stream>>>(args...), with programmatic stream
// serialization when pdl. Returns the launch's own error (callers that also
// want an earlier asynchronous error call cudaGetLastError).
template <typename... KArgs, typename... Args>
inline cudaError_t launch(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                          bool pdl, Args &&...args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kern, std::forward<Args>(args)...);
}

// An on/off switch from the environment: "0..." off, "1..." on, anything
// else (or unset) dflt.
inline bool env_switch(const char *name, bool dflt) {
    const char *e = getenv(name);
    return e && e[0] == '0' ? false : e && e[0] == '1' ? true : dflt;
}
// The same, read once into *cache (which starts at -1).
inline bool env_switch_once(const char *name, bool dflt, int *cache) {
    if (*cache < 0) *cache = env_switch(name, dflt) ? 1 : 0;
    return *cache == 1;
}

} // namespace nb_pdl

#endif
