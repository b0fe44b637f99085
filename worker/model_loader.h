// model_loader.h: a HuggingFace Llama / Mistral / Qwen2 checkpoint directory
// (config.json + model.safetensors, or shards + model.safetensors.index.json)
// opened as one nb_model: the parsed config plus a view of every weight.
//
// The one idea: weights are never copied. Each nb_tensor_view points into
// the read-only mmap of its safetensors file and stays valid until
// nb_model_free(); each keeps the dtype it has on disk (mixed dtypes are
// allowed). Every name, shape and dtype the forward pass relies on is
// checked at load time, so the engine can index the views without checks.
#ifndef NB_MODEL_LOADER_H
#define NB_MODEL_LOADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model_config.h"
#include "nb_dtype.h"
#include "nb_status.h"

// A row-major 1-D or 2-D tensor inside a mapped file. For ndim == 1 the
// shape is [n, 1]. data == NULL marks an absent optional tensor (a bias the
// architecture does not have). Element (r, c) is at index r * shape[1] + c;
// data is aligned to nb_dtype_size(dtype).
typedef struct nb_tensor_view {
    const void *data;   // read-only; owned by the nb_model
    nb_dtype dtype;     // the tensor's own dtype on disk
    int64_t shape[2];   // elements: [rows, cols] (HF Linear weight = [out_features, in_features])
    int ndim;           // 1 or 2; 0 when absent
    const char *name;   // the safetensors name; owned by the nb_model; NULL when absent
} nb_tensor_view;

// Shapes: H hidden_size, I intermediate_size, V vocab_size, D head_dim,
// Hq = n_heads * D, Hkv = n_kv_heads * D.
typedef struct nb_layer_weights {
    nb_tensor_view attn_norm; // [H]        input_layernorm.weight
    nb_tensor_view wq;        // [Hq, H]    self_attn.q_proj.weight
    nb_tensor_view wk;        // [Hkv, H]   self_attn.k_proj.weight
    nb_tensor_view wv;        // [Hkv, H]   self_attn.v_proj.weight
    nb_tensor_view wo;        // [H, Hq]    self_attn.o_proj.weight
    nb_tensor_view bq;        // [Hq]       q_proj.bias when cfg.qkv_bias, else absent
    nb_tensor_view bk;        // [Hkv]      k_proj.bias when cfg.qkv_bias, else absent
    nb_tensor_view bv;        // [Hkv]      v_proj.bias when cfg.qkv_bias, else absent
    nb_tensor_view bo;        // [H]        o_proj.bias when cfg.o_bias, else absent
    nb_tensor_view ffn_norm;  // [H]        post_attention_layernorm.weight
    nb_tensor_view w_gate;    // [I, H]     mlp.gate_proj.weight
    nb_tensor_view w_up;      // [I, H]     mlp.up_proj.weight
    nb_tensor_view w_down;    // [H, I]     mlp.down_proj.weight
} nb_layer_weights;

typedef struct nb_model_weights {
    nb_tensor_view tok_embd;  // [V, H]     model.embed_tokens.weight
    nb_layer_weights *layers; // [n_layers]; owned by the nb_model
    int n_layers;
    nb_tensor_view out_norm;  // [H]        model.norm.weight
    nb_tensor_view lm_head;   // [V, H]     lm_head.weight, or tok_embd when tied
    bool lm_head_tied;        // lm_head aliases tok_embd (same data pointer)
} nb_model_weights;

typedef struct nb_model nb_model;

// Load the checkpoint in directory `dir`. On success *out is a new model the
// caller owns (free with nb_model_free()). On failure *out = NULL and err
// (if err_len > 0) holds a message naming the file and, where relevant, the
// tensor with the expected and the found shape or dtype.
// Biases are read exactly when the config says the architecture has them
// (qwen2: q/k/v; llama attention_bias: q/k/v/o); as in transformers, bias
// tensors present otherwise are ignored. With tie_word_embeddings, lm_head
// is embed_tokens even if the file also holds an lm_head.weight.
// Returns NB_OK;
//   NB_ERR_NOT_FOUND   dir, config.json, weights, a shard, or a required tensor missing
//   NB_ERR_FORMAT      bad JSON (line/column), bad safetensors header, wrong tensor shape,
//                      misaligned tensor data
//   NB_ERR_UNSUPPORTED architecture, rope_scaling type, tensor dtype other than F32/F16/BF16
//   NB_ERR_IO          a file could not be read or mapped
//   NB_ERR_OUT_OF_MEMORY, NB_ERR_INVALID_ARG (NULL dir/out)
nb_status nb_model_load(const char *dir, nb_model **out, char *err, size_t err_len);

// Synthetic models: seeded random weights in memory, no file needed, for
// benchmarks of real shapes and machines without a checkpoint. Their output
// is noise. `name` is one of "tiny" (2 layers, hidden 128, 4/2 heads x 32,
// vocab 512), "llama-2-7b" (32 layers, hidden 4096, 32 heads x 128, MLP
// 11008, vocab 32000), "llama-3-8b" (32 layers, hidden 4096, 32/8 heads x
// 128, MLP 14336, vocab 128256, rope_theta 500000 with llama3 scaling),
// without the "synthetic:" prefix. Weights are bf16 (tiny: f32), drawn from a
// counter-based generator keyed by `seed` with a scale that keeps
// activations finite. nb_model_get_dir() returns "synthetic:NAME".
// Returns NB_OK; NB_ERR_NOT_FOUND (unknown name; err lists the known ones);
// NB_ERR_OUT_OF_MEMORY.
nb_status nb_model_synthetic(const char *name, uint64_t seed, nb_model **out, char *err,
                             size_t err_len);

// True for a model made by nb_model_synthetic().
bool nb_model_is_synthetic(const nb_model *m);

// Unmap and free everything; accepts NULL or *m == NULL; sets *m = NULL.
// Every view taken from the model becomes invalid.
void nb_model_free(nb_model **m);

// Owned by the model; valid until nb_model_free().
const nb_model_config *nb_model_get_config(const nb_model *m);
const nb_model_weights *nb_model_get_weights(const nb_model *m);

// The directory the model was loaded from; owned by the model.
const char *nb_model_get_dir(const nb_model *m);

// Any F32/F16/BF16 tensor of the checkpoint by its safetensors name, with
// rank <= 2 (a rank-0 tensor reads as [1, 1], ndim 1).
// Returns NB_OK; NB_ERR_NOT_FOUND; NB_ERR_UNSUPPORTED (dtype or rank > 2);
// NB_ERR_FORMAT (index names a shard that lacks it, or misaligned data).
nb_status nb_model_find_tensor(const nb_model *m, const char *name, nb_tensor_view *out,
                               char *err, size_t err_len);

#endif // NB_MODEL_LOADER_H
