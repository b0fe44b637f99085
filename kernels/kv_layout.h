// kv_layout.h: the byte layout of the paged KV cache, the one contract shared
// by the block manager (sizes, block ids), the C reference and the CUDA
// kernels (offsets). Plain C, usable from C and CUDA; no libc calls.
//
// The one idea: a quantized block stores each cached value as an INT8 code
// C8 = 16*U + L split into two nibble planes held in SEPARATE buffers, so the
// draft (which reads only U) moves the upper plane plus scales, and the target
// reads both planes. docs/kv-cache.md has the full story and the numbers.
//
// Buffers (one of each per worker; all four indexed by block id):
//   upper, lower  uint8  [layer][qblock][kv_head][kv][G tokens][D/2 bytes]
//   scales        dtype  [layer][qblock][kv_head] { K_scale[D], K_zero[D],
//                                                   V_scale[G], V_zero[G] }
//   fp            dtype  [layer][fpblock][kv_head][kv][G tokens][D]
// kv is 0 for K, 1 for V. K is quantized per channel over the block's G
// tokens (D scale/zero pairs), V per token over its D channels (G pairs).
//
// Nibbles: byte j of a D/2-byte token row holds channel 2j in bits 0-3 and
// channel 2j+1 in bits 4-7. The upper nibble U in [0,15] is stored as is; the
// lower nibble L in [-8,7] is stored offset-binary as L+8, so
// C8 = 16*U + (Lstored - 8).
#ifndef NB_KV_LAYOUT_H
#define NB_KV_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "nb_dtype.h"

#ifdef __CUDACC__
#define NB_KV_HD __host__ __device__
#else
#define NB_KV_HD
#endif

typedef struct nb_kv_layout {
    int32_t n_layers;
    int32_t n_kv_heads;
    int32_t head_dim;   // D, channels per head; even (two per byte)
    int32_t group_size; // G, tokens per block (quantized and FP alike)
    nb_dtype dtype;     // of FP blocks AND of scales/zeros
    int32_t n_qblocks;  // quantized pool size, blocks
    int32_t n_fpblocks; // full-precision pool size, blocks
} nb_kv_layout;

// Which reading of a quantized block: DRAFT = U*S + Z (upper plane + scales),
// TARGET = (16*U + L)*(S/16) + Z (both planes + scales).
typedef enum nb_kv_view {
    NB_KV_VIEW_DRAFT = 0,
    NB_KV_VIEW_TARGET = 1,
} nb_kv_view;

// The four cache buffers, host or device pointers (the layout above). A
// draft-only consumer may leave lower NULL.
typedef struct nb_kv_pools {
    void *upper;  // uint8 [n_layers][n_qblocks][n_kv_heads][2][G][D/2]
    void *lower;  // uint8 [n_layers][n_qblocks][n_kv_heads][2][G][D/2]
    void *scales; // dtype [n_layers][n_qblocks][n_kv_heads][2*D + 2*G]
    void *fp;     // dtype [n_layers][n_fpblocks][n_kv_heads][2][G][D]
} nb_kv_pools;

// Parts of one (layer, qblock, kv_head) scales record, in storage order.
typedef enum nb_kv_scale_part {
    NB_KV_K_SCALE = 0, // [D] per channel
    NB_KV_K_ZERO = 1,  // [D] per channel
    NB_KV_V_SCALE = 2, // [G] per token
    NB_KV_V_ZERO = 3,  // [G] per token
} nb_kv_scale_part;

#define NB_KV_LOWER_BIAS 8 // Lstored = L + 8

// 1 if the layout is usable (positive sizes, D even, known dtype, pools >= 0).
static inline NB_KV_HD int nb_kv_layout_valid(const nb_kv_layout *l) {
    return l && l->n_layers > 0 && l->n_kv_heads > 0 && l->head_dim > 0 &&
           (l->head_dim & 1) == 0 && l->group_size > 0 && l->n_qblocks >= 0 &&
           l->n_fpblocks >= 0 &&
           (l->dtype == NB_DTYPE_F32 || l->dtype == NB_DTYPE_F16 || l->dtype == NB_DTYPE_BF16);
}

static inline NB_KV_HD size_t nb_kv_dtype_bytes(nb_dtype t) { return t == NB_DTYPE_F32 ? 4 : 2; }

// ---- nibble planes (upper and lower share this layout) ----

// Bytes of one token row in a plane.
static inline NB_KV_HD size_t nb_kv_row_bytes(const nb_kv_layout *l) { return (size_t)l->head_dim / 2; }

// Byte offset of token `token` of (layer, qblock, kv_head, kv) in a plane.
static inline NB_KV_HD size_t nb_kv_plane_offset(const nb_kv_layout *l, int32_t layer, int32_t qblock,
                                                 int32_t kv_head, int32_t kv, int32_t token) {
    size_t i = ((size_t)layer * l->n_qblocks + qblock) * l->n_kv_heads + kv_head;
    return ((i * 2 + kv) * l->group_size + token) * nb_kv_row_bytes(l);
}

// Bytes of one whole plane buffer (upper or lower).
static inline NB_KV_HD size_t nb_kv_plane_bytes(const nb_kv_layout *l) {
    return (size_t)l->n_layers * l->n_qblocks * l->n_kv_heads * 2 * l->group_size * nb_kv_row_bytes(l);
}

// Nibble of channel c (0..15 as stored) in a token row of D/2 bytes.
static inline NB_KV_HD int nb_kv_nibble_get(const uint8_t *row, int c) {
    uint8_t b = row[c >> 1];
    return (c & 1) ? (b >> 4) : (b & 0xf);
}

// One plane byte from the stored nibbles of channels 2j (even) and 2j+1 (odd).
static inline NB_KV_HD uint8_t nb_kv_nibble_pack(int even, int odd) {
    return (uint8_t)((even & 0xf) | ((odd & 0xf) << 4));
}

// ---- scales ----

// Elements (not bytes) in one (layer, qblock, kv_head) scales record.
static inline NB_KV_HD size_t nb_kv_scales_record_elems(const nb_kv_layout *l) {
    return 2 * (size_t)l->head_dim + 2 * (size_t)l->group_size;
}

// Element offset (in dtype elements, not bytes) of `part` of the record of
// (layer, qblock, kv_head); the part is D (K) or G (V) elements long.
static inline NB_KV_HD size_t nb_kv_scales_offset(const nb_kv_layout *l, int32_t layer, int32_t qblock,
                                                  int32_t kv_head, nb_kv_scale_part part) {
    size_t D = (size_t)l->head_dim, G = (size_t)l->group_size;
    size_t in_rec = part == NB_KV_K_SCALE ? 0 : part == NB_KV_K_ZERO ? D
                  : part == NB_KV_V_SCALE ? 2 * D : 2 * D + G;
    size_t i = ((size_t)layer * l->n_qblocks + qblock) * l->n_kv_heads + kv_head;
    return i * nb_kv_scales_record_elems(l) + in_rec;
}

// Bytes of the whole scales buffer.
static inline NB_KV_HD size_t nb_kv_scales_bytes(const nb_kv_layout *l) {
    return (size_t)l->n_layers * l->n_qblocks * l->n_kv_heads * nb_kv_scales_record_elems(l) *
           nb_kv_dtype_bytes(l->dtype);
}

// ---- FP blocks ----

// Element offset (in dtype elements) of token `token` (a row of D) of
// (layer, fpblock, kv_head, kv).
static inline NB_KV_HD size_t nb_kv_fp_offset(const nb_kv_layout *l, int32_t layer, int32_t fpblock,
                                              int32_t kv_head, int32_t kv, int32_t token) {
    size_t i = ((size_t)layer * l->n_fpblocks + fpblock) * l->n_kv_heads + kv_head;
    return ((i * 2 + kv) * l->group_size + token) * (size_t)l->head_dim;
}

// Bytes of the whole FP buffer.
static inline NB_KV_HD size_t nb_kv_fp_bytes(const nb_kv_layout *l) {
    return (size_t)l->n_layers * l->n_fpblocks * l->n_kv_heads * 2 * l->group_size *
           (size_t)l->head_dim * nb_kv_dtype_bytes(l->dtype);
}

// ---- per block and per token accounting (all layers, all kv heads) ----

// Bytes one quantized block occupies across the upper, lower and scales buffers.
static inline NB_KV_HD size_t nb_kv_qblock_bytes(const nb_kv_layout *l) {
    size_t per_head = 2 * (size_t)l->group_size * nb_kv_row_bytes(l) * 2 /* planes */ +
                      nb_kv_scales_record_elems(l) * nb_kv_dtype_bytes(l->dtype);
    return (size_t)l->n_layers * l->n_kv_heads * per_head;
}

// Bytes one FP block occupies.
static inline NB_KV_HD size_t nb_kv_fpblock_bytes(const nb_kv_layout *l) {
    return (size_t)l->n_layers * l->n_kv_heads * 2 * l->group_size * (size_t)l->head_dim *
           nb_kv_dtype_bytes(l->dtype);
}

// Bytes per cached token in an FP block (K and V, all layers and heads).
static inline NB_KV_HD size_t nb_kv_fp_bytes_per_token(const nb_kv_layout *l) {
    return nb_kv_fpblock_bytes(l) / (size_t)l->group_size;
}

// Bytes per cached token that a reader of a quantized block moves in `view`
// (scales amortized over the G tokens, hence fractional): DRAFT = upper plane
// + scales, TARGET = both planes + scales (= nb_kv_qblock_bytes / G).
static inline NB_KV_HD double nb_kv_view_bytes_per_token(const nb_kv_layout *l, nb_kv_view view) {
    double planes = view == NB_KV_VIEW_TARGET ? 2.0 : 1.0;
    double per_head = planes * 2.0 * (double)nb_kv_row_bytes(l) +
                      (double)(nb_kv_scales_record_elems(l) * nb_kv_dtype_bytes(l->dtype)) /
                          (double)l->group_size;
    return (double)l->n_layers * l->n_kv_heads * per_head;
}

// Bytes per cached token stored in a quantized block (= the target view).
static inline NB_KV_HD double nb_kv_qblock_bytes_per_token(const nb_kv_layout *l) {
    return nb_kv_view_bytes_per_token(l, NB_KV_VIEW_TARGET);
}

#endif // NB_KV_LAYOUT_H
