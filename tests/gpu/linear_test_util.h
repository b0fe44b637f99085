// linear_test_util.h: what the linear-layer GPU tests (test_linear_cuda,
// test_dense_ri_cuda) share: a seeded xorshift stream of uniforms and the
// unit roundoff of an output dtype (their tolerances' u_out).
#ifndef NB_LINEAR_TEST_UTIL_H
#define NB_LINEAR_TEST_UTIL_H

#include <math.h>
#include <stdint.h>

#include "nb_dtype.h"

// [0, 1) from the xorshift64 state *s (nonzero).
static inline double lt_urand(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (double)(*s >> 11) * (1.0 / 9007199254740992.0);
}

// One round-to-nearest of an output in dtype t: 0 for f32, 2^-11 for f16,
// 2^-8 for bf16.
static inline float lt_out_u(nb_dtype t) {
    return t == NB_DTYPE_F32 ? 0.0f : t == NB_DTYPE_F16 ? ldexpf(1.0f, -11) : ldexpf(1.0f, -8);
}

#endif // NB_LINEAR_TEST_UTIL_H
