// bench_fill.cuh: deterministic device fills for the attention benchmarks
// (bench_attention_cuda, bench_prefill_attention): a hash of the element
// index and a seed, so a run's data does not depend on the launch shape;
// and the spin both queue before a timed call.
#ifndef NB_BENCH_FILL_CUH
#define NB_BENCH_FILL_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stddef.h>
#include <stdint.h>

// Keeps the GPU busy for ~cycles clocks (one thread) before a timed call's
// start event, so the call is queued before the GPU reaches that event and
// no host time is inside the events (the SDPA scripts do the same with
// torch.cuda._sleep for PyTorch's dispatch). ~0.5 ms on an H100 or H200.
constexpr long long kBenchSpinCycles = 1000000;
__global__ void bench_spin(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

__device__ __forceinline__ uint32_t bench_hash(size_t i, uint32_t seed) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return h;
}
// Random bytes.
__global__ void fill_bytes(uint8_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = (uint8_t)bench_hash(i, seed);
}
// Values in [lo, hi) as f16.
__global__ void fill_half(__half *p, size_t n, float lo, float hi, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = __float2half(lo + (hi - lo) * (float)(bench_hash(i, seed) >> 8) * (1.0f / 16777216.0f));
}
// Values in [lo, hi) as bf16.
__global__ void fill_bf16(__nv_bfloat16 *p, size_t n, float lo, float hi, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = __float2bfloat16(lo + (hi - lo) * (float)(bench_hash(i, seed) >> 8) * (1.0f / 16777216.0f));
}
// Values in [-1, 1) as f32.
__global__ void fill_float(float *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = (float)(bench_hash(i, seed) >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

#endif // NB_BENCH_FILL_CUH
