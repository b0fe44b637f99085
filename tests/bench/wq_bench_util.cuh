// wq_bench_util.cuh: what the quantized-linear benchmark and the trace
// harness share: a CUDA error check that exits, and random weights, scales,
// zeros and activations filled on the device.
#ifndef NB_WQ_BENCH_UTIL_CUH
#define NB_WQ_BENCH_UTIL_CUH

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#include "../nb_cuda_check.h"

__device__ __forceinline__ uint32_t hash32(uint64_t i, uint32_t seed) {
    uint64_t z = i * 0x9e3779b97f4a7c15ull + seed;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (uint32_t)(z ^ (z >> 31));
}

// kind 0: random bytes; 1: f16 in [-0.25, 0.25); 2: f16 scale in [2^-10, 2^-6);
// 3: f16 zero in [-2^-3, -2^-7].
static __global__ void fill_kernel(void *p, size_t n_elems, int kind, uint32_t seed) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_elems; i += stride) {
        const uint32_t h = hash32(i, seed);
        if (kind == 0) {
            static_cast<uint8_t *>(p)[i] = (uint8_t)h;
        } else {
            uint16_t v;
            if (kind == 1) v = (uint16_t)((h & 0x8000u) | (0x2000u + (h % 0x1400u))); // < 0.25
            else if (kind == 2) v = (uint16_t)(0x1400u + (h % 0x1000u));
            else v = (uint16_t)(0x8000u | (0x2000u + (h % 0x1000u)));
            static_cast<uint16_t *>(p)[i] = v;
        }
    }
}

static void fill(void *p, size_t n_elems, int kind, uint32_t seed) {
    fill_kernel<<<1024, 256>>>(p, n_elems, kind, seed);
    CUDA_OK(cudaGetLastError());
}

#endif // NB_WQ_BENCH_UTIL_CUH
