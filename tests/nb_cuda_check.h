// nb_cuda_check.h: CUDA_OK(call), the GPU tests' and benchmarks' check of a
// CUDA runtime call: on an error it prints where and why and exits 1 (a
// harness failure, not a test verdict).
#ifndef NB_CUDA_CHECK_H
#define NB_CUDA_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#define CUDA_OK(call)                                                                   \
    do {                                                                                \
        cudaError_t e_ = (call);                                                        \
        if (e_ != cudaSuccess) {                                                        \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,               \
                    cudaGetErrorString(e_));                                            \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

#endif
