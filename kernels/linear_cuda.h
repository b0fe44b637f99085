// linear_cuda.h: the CUDA linear layers. out = x . W^T + bias, with W either
// hierarchically quantized (wquant.h: the draft's 4-bit view or the target's
// 8-bit view of the same bytes) or dense fp16/bf16 through cuBLAS.
//
// The one idea: a quantized matmul is memory bound at decode batch sizes, so
// the weights are streamed once (bulk copies into shared memory on the
// decode path, 16-byte loads in the tile kernel) and dequantized in
// registers straight into tensor-core (mma.sync m16n8k16) operands; the
// integer codes (0..15, or -8..247 in two parts) are exact in f16/bf16, the
// products with f16/bf16 activations are exact, and the scale and zero are
// applied once per group of 128 in f32:
//   sum_G x . (C*sc + z) = sc * dot(x_G, C_G) + z * sum(x_G).
//
// Activations x are f16 or bf16 (the model's activation dtype); the output
// is f32, f16 or bf16. All pointers are device pointers; nothing here
// allocates or synchronizes. Kernels are enqueued on the given stream.
#ifndef NB_LINEAR_CUDA_H
#define NB_LINEAR_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

// NOTE: the C headers below declare C functions; the system headers they
// include are included above, outside the extern "C" block.
#ifdef __cplusplus
extern "C" {
#endif

#include "kv_layout.h"
#include "nb_dtype.h"
#include "nb_status.h"
#include "wquant.h"

// The CUDA layout of a weight plane. wquant.h's plane is [m][k/2] bytes,
// element e of a row in byte e/2, low nibble first. The CUDA plane differs
// in two ways:
//  - tiles: rows go in 32-row tiles (the pack writes the rows past m as
//    zeros; no stored output depends on them), and within a tile
//    group-major: for tile T = j/32, group G (g = nb_wq_group_size(k)
//    weights, g/2 bytes a row) and byte b of row j's group,
//        offset = ((T * (k/g) + G) * 32 + j % 32) * (g/2) + b,
//    so one decode-kernel item (32 rows x one group: 2 KB at g = 128, or
//    its 16-row half) is one contiguous piece, copied as one bulk copy
//    of whole 128-byte lines instead of 32 pieces of 64 bytes;
//  - nibbles: within each 4-byte little-endian word, nibble n holds
//    element rev3(n) of the word's 8 (rev3 reverses 3 bits: 0,4,2,6,1,5,3,7),
//    which lets the kernels turn codes into tensor-core operands in the
//    order x lies in memory (linear_cuda.cu).
// Every plane passed to the functions below (upper and lower) is in this
// layout, nb_cuda_wq_plane_bytes(m, k) bytes; scales and zeros are in the
// sz layout below.
// The one definition of that offset, shared by the host pack and every
// kernel that reads a plane: byte b of row j's group G (ng = k/g groups
// a row, gb = g/2 bytes a group).
static inline NB_KV_HD size_t nb_cuda_wq_plane_off(int j, int G, int b, int ng, int gb) {
    return (((size_t)(j >> 5) * ng + G) * 32 + (j & 31)) * gb + b;
}
// Bytes of an [m][k] matrix's CUDA plane: ceil(m/32) * 32 * k/2; 0 for
// m < 0 or an unsupported k.
size_t nb_cuda_wq_plane_bytes(int m, int k);
// Writes the CUDA plane dst (host, nb_cuda_wq_plane_bytes(m, k) bytes) of
// the wquant.h plane src (host, [m][k/2]). Returns NB_OK or
// NB_ERR_INVALID_ARG (m < 0, unsupported k, NULL pointers with m > 0,
// dst overlapping src).
nb_status nb_cuda_wq_pack_plane(uint8_t *dst /*[nb_cuda_wq_plane_bytes] host*/,
                                const uint8_t *src /*[m][k/2] host*/, int m, int k);

// The CUDA layout of a matrix's scales and zeros (sz): for each 16-row tile
// T and group G, 64 contiguous bytes, 8 bytes per row pair g = 0..7:
// scale(16T+g), scale(16T+g+8), zero(16T+g), zero(16T+g+8), f16 as in
// wquant.h; rows past m are zeros. Like the planes, tile-major in 32-row
// tiles: the 64 bytes of 16-row tile T, group G at byte
// ((T/2 * (k/g) + G) * 2 + T%2) * 64. One decode-kernel item (16 or 32
// rows, one group) then copies its scales and zeros as one 64- or 128-byte
// piece instead of 16 or 32 scattered 2-byte values. Element count (f16)
// of an [m][k] matrix's sz, ceil(m/32) * 32 * (k/g) * 2; 0 for an
// unsupported k.
size_t nb_cuda_wq_sz_elems(int m, int k);
// The sz layout's two offsets, shared by the host pack and the kernels:
// the first f16 element of 16-row tile t16's 32 for group G (ng = k/g),
static inline NB_KV_HD size_t nb_cuda_wq_sz_off(int t16, int G, int ng) {
    return (((size_t)(t16 >> 1) * ng + G) * 2 + (t16 & 1)) * 32;
}
// and within those 32, the scale (z = 0) or zero (z = 1) of the tile's
// row r (0..15).
static inline NB_KV_HD int nb_cuda_wq_sz_slot(int r, int z) { return (r & 7) * 4 + z * 2 + (r >> 3); }
// Fills sz (host, nb_cuda_wq_sz_elems(m, k) elements) from wquant.h's
// scale and zero arrays. Returns NB_OK or NB_ERR_INVALID_ARG.
nb_status nb_cuda_wq_pack_sz(uint16_t *sz, const uint16_t *scale /*[m][k/g]*/,
                             const uint16_t *zero /*[m][k/g]*/, int m, int k);

// A quantized [m][k] matrix on the device in the CUDA layouts above (the
// caller owns the buffers). lower may be NULL for a draft-only matrix.
typedef struct nb_cuda_wq {
    const uint8_t *upper;  // [nb_cuda_wq_plane_bytes(m, k)] CUDA-layout plane
    const uint8_t *lower;  // the same, or NULL
    const uint16_t *sz;    // [nb_cuda_wq_sz_elems(m, k)] f16
} nb_cuda_wq;

// Workspace bytes nb_cuda_matmul_wq needs for these sizes (currently 0 for
// every shape; callers pass what this returns so a later split-k version
// can use it without an API change).
size_t nb_cuda_matmul_wq_workspace_bytes(int n, int m, int k);

// out[i][j] = sum over groups G of sc*dot(x[i]_G, C[j]_G) + z*sum(x[i]_G),
// + bias[j] (f32 add), in the 4-bit view (use_lower == 0: C = U, sc = s;
// reads only the upper plane, scales and zeros) or the 8-bit view
// (use_lower == 1: C = 16U + L, sc = s/16; reads both planes). The same
// function as nb_ref_matmul_wq with x rounded to x_dt; the f32 summation
// order differs (tensor-core accumulation), see tests/gpu/test_linear_cuda.cu
// for the tolerance.
//
// Any n >= 0 works: rows of x are processed in chunks of 16 (one weight pass
// per chunk), which is the fast path for decode and speculative verification
// (n <= 16). For long prefills (n in the hundreds) dequantize once with
// nb_cuda_wq_dequantize and call nb_cuda_matmul_dense instead.
//
// k % 128 == 0 with 16-byte aligned x and planes and 8-byte aligned sz
// takes the tensor-core path; other supported k (32, 64, 96) or alignments
// take a simple scalar kernel. On that path n <= 16 with 16-byte aligned sz
// runs the streaming decode kernel (persistent blocks, a ring per warp
// fed by bulk copies, see set_pdl below; from n = 9 each item's weights meet two
// tiles of 8 rows of x; at n <= 8 the 8-bit view only for matrices of more
// than 16M weights; k <= 64k from n = 9); it computes each output with the same operations
// in the same order as the tile kernel that takes the other calls, so a
// row's result does not depend on n. The w struct itself is a host struct
// holding device pointers (read on the host at launch). workspace may be NULL when
// workspace_bytes (see above) is 0.
// Returns NB_OK; NB_ERR_INVALID_ARG (n, m < 0, unsupported k, dtypes outside
// the above, use_lower without w->lower, NULL pointers); NB_ERR_BACKEND (the
// launch failed: cudaGetLastError is left set for the caller to report).
nb_status nb_cuda_matmul_wq(void *out /*[n][m] out_dt*/, nb_dtype out_dt,
                            const void *x /*[n][k] x_dt (f16/bf16)*/, nb_dtype x_dt,
                            const nb_cuda_wq *w /*[m][k] device*/,
                            int use_lower, const void *bias /*[m] bias_dt, or NULL*/,
                            nb_dtype bias_dt, int n, int m, int k, void *workspace,
                            size_t workspace_bytes, cudaStream_t stream);

// The stacked gate|up matrix of a SwiGLU MLP in the layout that
// nb_cuda_matmul_wq_swiglu reads: its 16-row tile t holds gate rows 8t ..
// 8t + 7, then up rows 8t .. 8t + 7. Stacked row of gate row j (up = 0) or
// up row j (up = 1), for an intermediate size I % 8 == 0 (m = 2I rows).
// Rows are quantized each on its own, so a matrix quantized in this row
// order holds the codes of the two parts, moved.
static inline int nb_cuda_wq_swiglu_row(int j, int up) { return (j >> 3) * 16 + (up ? 8 : 0) + (j & 7); }

// Whether nb_cuda_matmul_wq_swiglu takes an [m][k] matrix (m % 16 == 0,
// k % 128 == 0); alignment is checked per call.
int nb_cuda_matmul_wq_swiglu_supported(int m, int k);

// The MLP's gate|up projection and SwiGLU in one pass: for w in the layout
// above (m = 2I rows, no bias), out[i][j] = silu(g) * u, where g and u are
// the nb_cuda_matmul_wq outputs (f32) of gate row j and up row j for row i
// of x, computed by the same kernels in the same order, and silu(g) * u is
// nb_cuda_silu_mul_cvt's element stored as out_dt (f32, f16 or bf16;
// f16 saturating when sat, as nb_cuda_convert_f16_sat). So out holds the
// bits that nb_cuda_matmul_wq on the unmoved stacked matrix followed by
// nb_cuda_silu_mul_cvt would store, without the f32 gate|up rows in
// memory or the SwiGLU launch. Any n >= 0 (decode kernel up to 16 rows,
// the tile kernel above). out must not overlap x (blocks store while others
// still read x). Returns NB_OK; NB_ERR_INVALID_ARG (as nb_cuda_matmul_wq,
// sat with out_dt other than f16, out overlapping x);
// NB_ERR_UNSUPPORTED (outside what the epilogue is built for: the 4-bit
// view (use_lower 0) with f16 x, the shapes of
// nb_cuda_matmul_wq_swiglu_supported, 16-byte aligned x and planes, 8-byte
// aligned sz); NB_ERR_BACKEND (launch failed).
nb_status nb_cuda_matmul_wq_swiglu(void *out /*[n][m/2] out_dt*/, nb_dtype out_dt, int sat,
                                   const void *x /*[n][k] x_dt*/, nb_dtype x_dt,
                                   const nb_cuda_wq *w /*[m][k] device, swiglu rows*/, int use_lower, int n,
                                   int m, int k, cudaStream_t stream);

// The stacked q|k|v matrix in the layout that nb_cuda_matmul_wq_rope reads:
// within each head of D rows (q heads, then k heads, then v heads, as
// stacked), 16-row tile t holds dims 8t .. 8t + 7, then dims D/2 + 8t ..
// D/2 + 8t + 7 (the pairs RoPE rotates together). Row of stacked model row
// r, for D % 16 == 0. Rows are quantized each on its own (as above).
static inline int nb_cuda_wq_rope_row(int r, int D) {
    const int d = r % D, h = D / 2;
    return r - d + ((d % h) >> 3) * 16 + (d >= h ? 8 : 0) + (d & 7);
}

// What the RoPE epilogue writes, as nb_cuda_rope_write_kv does (ops_cuda.h):
// for x row i, q heads rotated at row i's position into
// q_out[i][n_heads][D] (f32), k heads rotated and v heads as they are into
// the FP cache fp of layout lay at (layer, fpblock[i], kv head, slot[i]) (a
// row outside the pool or block is skipped). The rotation's (cos, sin) come
// from cs, nb_cuda_rope_table's table of the rows' positions (the same
// values nb_cuda_rope_write_kv computes). Device pointers.
typedef struct nb_cuda_wq_rope {
    float *q_out;           // [n][n_heads][D] f32
    const float *cs;        // [n][D/2][2] (cos, sin), nb_cuda_rope_table
    void *fp;               // FP pool (lay)
    const int32_t *fpblock; // [n]
    const int32_t *slot;    // [n]
    nb_kv_layout lay;       // head_dim D, n_kv_heads, dtype, pool size
    int layer, n_heads;
} nb_cuda_wq_rope;

// Whether nb_cuda_matmul_wq_rope takes an [m][k] q|k|v matrix of n_heads q
// heads and n_kv_heads k and v heads of D (m = (n_heads + 2 n_kv_heads) D,
// D % 16 == 0, k % 128 == 0).
int nb_cuda_matmul_wq_rope_supported(int m, int k, int n_heads, int n_kv_heads, int D);

// The q|k|v projection and RoPE + KV write in one pass: for w in the layout
// above (no bias), the q|k|v rows of nb_cuda_matmul_wq (4-bit view, f16 x,
// the same kernels and order) go through nb_cuda_rope_write_kv's rotation
// and stores, so q_out and the FP cache get the bits that
// nb_cuda_matmul_wq on the unmoved matrix (f32 out) followed by
// nb_cuda_rope_write_kv would store, without the f32 rows in memory or the
// RoPE launch. Any n >= 0. q_out must not overlap x. Returns NB_OK;
// NB_ERR_INVALID_ARG (as nb_cuda_matmul_wq; NULL pointers of r, cs not
// 8-byte aligned, a layout
// whose head_dim or n_kv_heads does not match m, layer outside it,
// q_out overlapping x); NB_ERR_UNSUPPORTED (as nb_cuda_matmul_wq_swiglu);
// NB_ERR_BACKEND (launch failed).
nb_status nb_cuda_matmul_wq_rope(const void *x /*[n][k] x_dt*/, nb_dtype x_dt,
                                 const nb_cuda_wq *w /*[m][k] device, rope rows*/, int use_lower, int n, int m,
                                 int k, const nb_cuda_wq_rope *r, cudaStream_t stream);

// The RMSNorm between two of the draft's 4-bit matmuls, scaled after the
// second instead of before it. RMSNorm(h) . W^T = r * ((h * w) . W^T) for
// each row, r = 1 / sqrt(sum(h^2) / k + eps) a per-row scalar, so the
// matmul BEFORE the norm (the o or down projection) can store h and the
// f16 h * w, which need no reduction, and the partial sums of h^2 of its
// thread blocks; the fused matmul AFTER it (gate|up + SwiGLU, or q|k|v +
// RoPE) reads h * w as its x and multiplies its f32 sums by r, from those
// partials, before its epilogue. No norm launch, and nothing waits for the
// sum. Not the unscaled path's bits: x is rounded to f16 as h * w instead
// of (h * r) * w (the same relative precision; h * w saturates at f16's
// 65504 where (h * r) * w would not).
#define NB_CUDA_WQ_PART 1024
typedef struct nb_cuda_wq_res {
    float *x;      // [n][m] f32, the residual stream: x += the matmul's output, in place
    const void *w; // [m] w_dt (f32, f16 or bf16): the next RMSNorm's weights
    nb_dtype w_dt;
    uint16_t *xs;  // [n][m] f16: the saturating f16 of (new x) * w
    float *part;   // [n][NB_CUDA_WQ_PART] f32: partial sums of (new x)^2, zeros past the last one
} nb_cuda_wq_res;
// out = nb_cuda_matmul_wq's f32 output (4-bit view, f16 x; the same
// bits), then res->x[i][j] += out[i][j] (nb_cuda_add's rounding), res->xs
// and res->part as above; sum_b part[i][b] is sum_j x[i][j]^2 summed in an
// order fixed for the device and shape. Returns NB_OK; NB_ERR_INVALID_ARG
// (as nb_cuda_matmul_wq, a NULL res pointer, an unknown w_dt, or res's
// buffers overlapping x or each other); NB_ERR_UNSUPPORTED, before
// anything is launched, outside the decode kernel's fast path (n > 16,
// bf16 x, unaligned pointers, the decode kernel off) or for a grid of
// more than NB_CUDA_WQ_PART blocks; NB_ERR_BACKEND.
nb_status nb_cuda_matmul_wq_res(const void *x /*[n][k] f16*/, nb_dtype x_dt, const nb_cuda_wq *w /*[m][k]*/,
                                const void *bias, nb_dtype bias_dt, int n, int m, int k, const nb_cuda_wq_res *res,
                                cudaStream_t stream);
// nb_cuda_matmul_wq_swiglu / _rope with each x row's f32 sums multiplied by
// r_i = 1 / sqrt(sum_b part[i][b] / k + eps) first (part: a
// nb_cuda_matmul_wq_res launch's, over these rows; x: its xs). The same
// returns, and NB_ERR_INVALID_ARG for a NULL part, NB_ERR_UNSUPPORTED for
// n > 16 or the decode kernel off.
nb_status nb_cuda_matmul_wq_swiglu_rs(void *out, nb_dtype out_dt, int sat, const void *x, nb_dtype x_dt,
                                      const nb_cuda_wq *w, int n, int m, int k, const float *part, float eps,
                                      cudaStream_t stream);
nb_status nb_cuda_matmul_wq_rope_rs(const void *x, nb_dtype x_dt, const nb_cuda_wq *w, int n, int m, int k,
                                    const nb_cuda_wq_rope *r, const float *part, float eps, cudaStream_t stream);
// Tuning hook for benchmarks: force the weight rows per thread block of the
// tensor-core path (16 or 32); any other value restores the built-in
// choice. Not thread safe; affects later launches of this process.
void nb_cuda_matmul_wq_set_tile_rows(int rows);

// Programmatic dependent launch for the decode kernel (n <= 16): on (1, the
// default, or NB_WQ_PDL unset / not "0" in the environment) launches it with
// cudaLaunchAttributeProgrammaticStreamSerialization, so it may start
// streaming its weights while the kernel before it in the stream finishes;
// it reads x and writes out only after that kernel has completed
// (griddepcontrol.wait), so the results are the same bits either way. 0 turns
// it off; -1 goes back to the environment. For benchmarks; not thread safe.
void nb_cuda_matmul_wq_set_pdl(int on);

// The streaming decode kernel for n <= 16: on (1, the default, or NB_WQ_GEMV
// unset / not "0") or off (0: the tile kernel takes every n; same bits);
// -1 goes back to the environment. For benchmarks and tests; not thread safe.
void nb_cuda_matmul_wq_set_decode_kernel(int on);

// Blocks per SM the decode kernel's grid is sized for (at most what fits;
// <= 0: the built-in choice, all that fit). Same bits either way. For
// benchmarks and tests; not thread safe.
void nb_cuda_matmul_wq_set_blocks_per_sm(int bps);

// The decode kernel's variant for n <= 8 (ring depth, register budget,
// items per step, tiles per item; see kGvVars in linear_cuda.cu): force 0
// to count - 1 (both views, f16 and bf16 activations; a forced variant
// also takes the decode kernel for the 8-bit view of small matrices); any
// other v restores the built-in choice (which depends on the view, the
// activation type and the shape). Returns the count. Same bits for every
// variant. For benchmarks and tests; not thread safe.
int nb_cuda_matmul_wq_set_gemv_variant(int v);

// The decode kernel's two-x-tile form (9 <= n <= 16, both views, f16 and
// bf16 activations): force variant v (0 to count - 1: 16-row tiles per
// item, ring depth, register budget; kGv2Vars in linear_cuda.cu); any other
// v restores the built-in choice, which depends on the view and the shape.
// Returns the count; same bits for every variant. For benchmarks and tests;
// not thread safe.
int nb_cuda_matmul_wq_set_gemv16_variant(int v);

// out[j][t] = the chosen view of W (as nb_wq_dequantize: U*s + z, or
// C8*(s/16) + z, in f32) rounded to dt (f16 or bf16), for the prefill path.
// Returns NB_OK, NB_ERR_INVALID_ARG, NB_ERR_BACKEND.
nb_status nb_cuda_wq_dequantize(void *out /*[m][k] dt*/, nb_dtype dt,
                                const nb_cuda_wq *w /*[m][k] device*/, int use_lower, int m,
                                int k, cudaStream_t stream);

// out[i][j] = dot(x[i], w[j]) + bias[j] through cublasGemmEx with f32
// compute (tensor cores), x and w both of dtype dt (f16 or bf16; or f32,
// which runs in plain f32: cuBLAS's default math mode never uses TF32), out f32
// or dt (the bias, when given, is added in f32 by a second kernel
// after the product has been rounded to out_dt). The caller owns handle;
// this sets its stream to `stream` (and leaves it so).
// Returns NB_OK; NB_ERR_INVALID_ARG; NB_ERR_BACKEND (a cuBLAS or launch
// error).
nb_status nb_cuda_matmul_dense(cublasHandle_t handle, void *out /*[n][m] out_dt*/,
                               nb_dtype out_dt, const void *x /*[n][k] dt*/,
                               const void *w /*[m][k] dt*/, nb_dtype dt,
                               const void *bias /*[m] bias_dt, or NULL*/, nb_dtype bias_dt,
                               int n, int m, int k, cudaStream_t stream);

// ---- Row-invariant dense matmul (the engine's decode, draft and verify passes) ----
//
// out[i][j] = dot(x[i], w[j]) (+ bias[j]) like nb_cuda_matmul_dense, but
// each output's f32 summation order is fixed by (m, k) and the device alone:
// a row of x gets the same bits whatever n is and wherever it sits among the
// n rows, so a verify pass of 40 rows reads the weights once and still
// matches the decode pass of each row bit for bit. (cuBLAS picks its
// algorithm, and with it the summation order, by shape.) Rows of x ride in
// the tensor-core mma's n dimension, 8 at a time; one launch reads the
// weights once per 64 rows of x. The k range is cut into S fixed splits
// (nb_cuda_matmul_dense_ri_split); with S > 1 the partial sums go through
// the workspace and a second kernel adds them in split order. bias is
// added in f32 before the output's one rounding. Fast at n = 1..64 (one
// weight stream for up to 64 rows); prefills keep nb_cuda_matmul_dense.
//
// Needs dt f16 or bf16 (x and w), k % 64 == 0, x and w 16-byte aligned.
// workspace: nb_cuda_matmul_dense_ri_workspace_bytes(n, m, k) bytes (0: may
// be NULL), 16-byte aligned; launches sharing a workspace must be ordered
// (one stream). Launched with programmatic dependent launch unless
// nb_cuda_matmul_wq_set_pdl(0) / NB_WQ_PDL=0 (same bits): the weight stream
// may start under the previous kernel; x, the workspace, the bias and out
// are touched only after it completes.
// Returns NB_OK; NB_ERR_INVALID_ARG (unsupported dtype or k, misaligned or
// NULL pointers, too small a workspace); NB_ERR_BACKEND (launch failed).
nb_status nb_cuda_matmul_dense_ri(void *out /*[n][m] out_dt*/, nb_dtype out_dt,
                                  const void *x /*[n][k] dt*/, const void *w /*[m][k] dt*/,
                                  nb_dtype dt, const void *bias /*[m] bias_dt, or NULL*/,
                                  nb_dtype bias_dt, int n, int m, int k, void *workspace,
                                  size_t workspace_bytes, cudaStream_t stream);
// The MLP's gate|up projection and SwiGLU in one row-invariant pass, as
// nb_cuda_matmul_wq_swiglu is for the 4-bit copy: w is the stacked gate|up
// matrix (m = 2I rows, m % 16 == 0, no bias) in the SwiGLU row layout
// (nb_cuda_wq_swiglu_row), and out[i][j] = silu(g) * u with g and u the f32
// outputs nb_cuda_matmul_dense_ri gives gate row j and up row j (the same
// summation order: it depends on (m, k) only, not on where a row sits), and
// silu(g) * u nb_cuda_silu_mul_cvt's element stored as out_dt (f32, f16 or
// bf16; f16 saturating when sat). So out holds the bits of
// nb_cuda_matmul_dense_ri on the model-order matrix followed by
// nb_cuda_silu_mul_cvt, without the f32 gate|up rows in memory or the
// SwiGLU launch. The workspace is nb_cuda_matmul_dense_ri_workspace_bytes(n,
// m, k). out must not overlap x (blocks store while others still read x).
// Returns NB_OK; NB_ERR_INVALID_ARG (as nb_cuda_matmul_dense_ri, m % 16 !=
// 0, sat with out_dt other than f16, out overlapping x); NB_ERR_BACKEND.
nb_status nb_cuda_matmul_dense_ri_swiglu(void *out /*[n][m/2] out_dt*/, nb_dtype out_dt, int sat,
                                         const void *x /*[n][k] dt*/, const void *w /*[m][k] dt, swiglu rows*/,
                                         nb_dtype dt, int n, int m, int k, void *workspace,
                                         size_t workspace_bytes, cudaStream_t stream);
// The q|k|v projection, RoPE and the KV write in one row-invariant pass, as
// nb_cuda_matmul_wq_rope is for the 4-bit copy, but on the stacked q|k|v
// matrix in the model's row order (m = (n_heads + 2 n_kv_heads) D, D % 16
// == 0; bias [m] or NULL): the matmul stores its k-split partial sums (S >=
// 1) and its reduction kernel sums each pair of dims (d, d + D/2) in split
// order, adds the bias, and stores them as nb_cuda_rope_write_kv does with
// the f32 outputs of nb_cuda_matmul_dense_ri (r: nb_cuda_matmul_wq_rope's
// stores, the rotation's (cos, sin) from r->cs, nb_cuda_rope_table's
// table). So the same bits, without the f32 q|k|v rows in memory or the
// RoPE launch. workspace: nb_cuda_matmul_dense_ri_rope_workspace_bytes(n,
// m, k) bytes (also when S == 1), not overlapping r->q_out. Returns NB_OK;
// NB_ERR_INVALID_ARG (as nb_cuda_matmul_dense_ri, a shape or layout that
// does not match r, a missing or too small workspace, NULL pointers);
// NB_ERR_BACKEND.
nb_status nb_cuda_matmul_dense_ri_rope(const void *x /*[n][k] dt*/, const void *w /*[m][k] dt*/, nb_dtype dt,
                                       const void *bias /*[m] bias_dt, or NULL*/, nb_dtype bias_dt, int n, int m,
                                       int k, void *workspace, size_t workspace_bytes, const nb_cuda_wq_rope *r,
                                       cudaStream_t stream);
// Workspace bytes of nb_cuda_matmul_dense_ri_rope for n rows (0 if the shape
// is unsupported).
size_t nb_cuda_matmul_dense_ri_rope_workspace_bytes(int n, int m, int k);
// The RMSNorm between two of the target's row-invariant matmuls scaled
// after the second (the dense twins of nb_cuda_matmul_wq_res / _rs above;
// the same identity RMSNorm(h) . W^T = r * ((h * w) . W^T)). The residual
// form: the plain form's f32 outputs (the same bits, S >= 1 through its
// reduction) added into res->x in place (nb_cuda_add's rounding), res->xs
// = h * w in dt (f16 saturating, bf16 rounded to nearest even), and per row
// one partial sum of h^2 for each NB_CUDA_DR_PART_COLS columns (part[i][b]:
// columns 1024 b .. 1024 b + 1023, a fixed order within). The _rs forms
// multiply each x row's f32 sums by r_i = 1 / sqrt(sum_b part[i][b] / k +
// eps), the partials added in order b = 0, 1, ..., before their epilogue
// (and before the bias). A row's bits depend on that row alone, as the
// plain form's. Not the launched norm's bits (x is rounded as h * w instead
// of (h * r) * w).
#define NB_CUDA_DR_PART_COLS 1024
// Partial sums per row of a norm over m channels.
static inline int nb_cuda_dr_parts(int m) { return (m + NB_CUDA_DR_PART_COLS - 1) / NB_CUDA_DR_PART_COLS; }
typedef struct nb_cuda_dr_res {
    float *x;      // [n][m] f32, the residual stream: x += the matmul's output, in place (16-byte aligned)
    const void *w; // [m] w_dt (f32, f16 or bf16): the next RMSNorm's weights
    nb_dtype w_dt;
    void *xs;      // [n][m] dt: h * w (8-byte aligned)
    float *part;   // [n][nb_cuda_dr_parts(m)] f32
} nb_cuda_dr_res;
// workspace: nb_cuda_matmul_dense_ri_rope_workspace_bytes(n, m, k) (the
// partial sums go through it whatever S). Returns NB_OK;
// NB_ERR_INVALID_ARG (as nb_cuda_matmul_dense_ri, a NULL or misaligned res
// pointer, an unknown w_dt, res's buffers overlapping x, the workspace or
// each other); NB_ERR_UNSUPPORTED (m % 4 != 0; nothing launched);
// NB_ERR_BACKEND.
nb_status nb_cuda_matmul_dense_ri_res(const void *x /*[n][k] dt*/, const void *w /*[m][k] dt*/, nb_dtype dt,
                                      const void *bias, nb_dtype bias_dt, int n, int m, int k, void *workspace,
                                      size_t workspace_bytes, const nb_cuda_dr_res *res, cudaStream_t stream);
// nb_cuda_matmul_dense_ri_swiglu / _rope with the norm scale; part: [n]
// [nb_cuda_dr_parts(k)], a residual form's over these rows (x: its xs). The
// same returns, and NB_ERR_INVALID_ARG for a NULL part.
nb_status nb_cuda_matmul_dense_ri_swiglu_rs(void *out, nb_dtype out_dt, int sat, const void *x, const void *w,
                                            nb_dtype dt, int n, int m, int k, void *workspace, size_t workspace_bytes,
                                            const float *part, float eps, cudaStream_t stream);
nb_status nb_cuda_matmul_dense_ri_rope_rs(const void *x, const void *w, nb_dtype dt, const void *bias,
                                          nb_dtype bias_dt, int n, int m, int k, void *workspace,
                                          size_t workspace_bytes, const nb_cuda_wq_rope *r, const float *part,
                                          float eps, cudaStream_t stream);
// 1 when nb_cuda_matmul_dense_ri takes this dtype and k, else 0.
int nb_cuda_matmul_dense_ri_supported(nb_dtype dt, int k);
// Workspace bytes for n rows of an [m][k] matrix (0 when S == 1 or the
// shape is unsupported); grows with n, so size it for the largest n.
size_t nb_cuda_matmul_dense_ri_workspace_bytes(int n, int m, int k);
// The k splits S of an [m][k] matrix on the current device (0 if
// unsupported).
int nb_cuda_matmul_dense_ri_split(int m, int k);
// Tests and benchmarks: force S (clamped to k/64 and 8) for later calls, or 0 for
// the built-in plan. Changes the summation order. Not thread safe.
void nb_cuda_matmul_dense_ri_set_split(int s);

#ifdef __cplusplus
}
#endif

#endif // NB_LINEAR_CUDA_H
