// mbarrier_cuda.cuh: shared-memory mbarrier primitives (sm_90), used by the
// tensor-core attention kernels (paged_attention_tc.cuh wraps them for
// pointers) and the quantized linear decode kernel (linear_cuda.cu). Each
// takes the barrier's shared-state-space address (__cvta_generic_to_shared).
#ifndef NB_MBARRIER_CUDA_CUH
#define NB_MBARRIER_CUDA_CUH

#include <stdint.h>

namespace nb_mbar {

// An mbarrier whose phases complete after `count` arrivals.
__device__ __forceinline__ void init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Arrives once (release: this thread's earlier writes are seen by the waiters).
__device__ __forceinline__ void arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrives once and expects `bytes` of bulk copies (0: the phase completes now).
__device__ __forceinline__ void arrive_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Waits for the phase of parity `parity` to complete.
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
    asm volatile("{\n .reg .pred P1;\n TC_WAIT:\n"
                 " mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
                 " @P1 bra TC_DONE;\n bra TC_WAIT;\n TC_DONE:\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}

} // namespace nb_mbar

#endif
