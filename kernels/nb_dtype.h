// nb_dtype.h: element types of weights, activations and the KV cache, and
// exact scalar conversions between them (round-to-nearest-even), shared by
// the C reference and (as host code) the CUDA side.
#ifndef NB_DTYPE_H
#define NB_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum nb_dtype {
    NB_DTYPE_F32 = 0,
    NB_DTYPE_F16 = 1,
    NB_DTYPE_BF16 = 2,
} nb_dtype;

static inline size_t nb_dtype_size(nb_dtype t) { return t == NB_DTYPE_F32 ? 4 : 2; }

static inline const char *nb_dtype_name(nb_dtype t) {
    return t == NB_DTYPE_F32 ? "f32" : t == NB_DTYPE_F16 ? "f16" : "bf16";
}

static inline uint32_t nb_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float nb_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline float nb_bf16_to_f32(uint16_t h) { return nb_bits_f32((uint32_t)h << 16); }

// Round to nearest even; NaN stays NaN (quiet).
static inline uint16_t nb_f32_to_bf16(float f) {
    uint32_t u = nb_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float nb_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0) return nb_bits_f32(sign);
        // subnormal: value = man * 2^-24
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (exp == 31) return nb_bits_f32(sign | 0x7f800000u | (man << 13));
    return nb_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

// Round to nearest even, overflow to Inf, NaN stays NaN.
static inline uint16_t nb_f32_to_f16(float f) {
    uint32_t u = nb_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;            // NaN
    if (a >= 0x477ff000u) return sign | 0x7c00u;           // >= 65520 rounds to Inf
    if (a < 0x38800000u) {                                 // below 2^-14: subnormal or 0
        // value / 2^-24, rounded to nearest even (exact in f32 arithmetic)
        float v = nb_bits_f32(a) * 16777216.0f;
        uint32_t m = (uint32_t)v;
        float rem = v - (float)m;
        if (rem > 0.5f || (rem == 0.5f && (m & 1u))) m++;
        return sign | (uint16_t)m;
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);            // round mantissa to 10 bits
    return sign | (uint16_t)(((r >> 13) - (112u << 10)) & 0xffffu);
}

// As nb_f32_to_f16, but finite values beyond the f16 range become +-65504
// (the largest finite f16) instead of Inf; Inf and NaN stay Inf and NaN.
static inline uint16_t nb_f32_to_f16_sat(float f) {
    uint32_t a = nb_f32_bits(f) & 0x7fffffffu;
    if (a < 0x7f800000u && a >= 0x477ff000u) return (uint16_t)(((nb_f32_bits(f) >> 16) & 0x8000u) | 0x7bffu);
    return nb_f32_to_f16(f);
}

// Round a float to the nearest value representable in dtype t.
static inline float nb_round_to_dtype(float f, nb_dtype t) {
    if (t == NB_DTYPE_F16) return nb_f16_to_f32(nb_f32_to_f16(f));
    if (t == NB_DTYPE_BF16) return nb_bf16_to_f32(nb_f32_to_bf16(f));
    return f;
}

// Load element i of a buffer of dtype t as f32.
static inline float nb_load_f32(const void *p, nb_dtype t, size_t i) {
    if (t == NB_DTYPE_F32) return ((const float *)p)[i];
    if (t == NB_DTYPE_F16) return nb_f16_to_f32(((const uint16_t *)p)[i]);
    return nb_bf16_to_f32(((const uint16_t *)p)[i]);
}

// Store f32 value v as element i of a buffer of dtype t (rounding to nearest even).
static inline void nb_store_f32(void *p, nb_dtype t, size_t i, float v) {
    if (t == NB_DTYPE_F32) ((float *)p)[i] = v;
    else if (t == NB_DTYPE_F16) ((uint16_t *)p)[i] = nb_f32_to_f16(v);
    else ((uint16_t *)p)[i] = nb_f32_to_bf16(v);
}

#endif // NB_DTYPE_H
