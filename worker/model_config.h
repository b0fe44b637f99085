// model_config.h: a HuggingFace `config.json` for the Llama family (Llama,
// Mistral, Qwen2) parsed into one plain struct.
//
// The one idea: every field the forward pass depends on is resolved here,
// HF defaults included (num_key_value_heads = heads, head_dim = hidden/heads,
// rope_theta = 10000, ...), so the engine never looks at JSON. Anything the
// engine would silently compute wrong (an unknown rope_scaling type, MLP
// biases, a non-SiLU activation) is refused here with NB_ERR_UNSUPPORTED.
#ifndef NB_MODEL_CONFIG_H
#define NB_MODEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nb_dtype.h"
#include "nb_status.h"
#include "ops_ref.h"

typedef enum nb_arch {
    NB_ARCH_LLAMA = 0,   // LlamaForCausalLM / "llama"
    NB_ARCH_MISTRAL = 1, // MistralForCausalLM / "mistral"
    NB_ARCH_QWEN2 = 2,   // Qwen2ForCausalLM / "qwen2" (q/k/v projections carry a bias)
} nb_arch;

const char *nb_arch_name(nb_arch a);

// RoPE scaling (type NONE / LINEAR / LLAMA3 and its parameters) is the
// kernels' nb_rope_scaling from ops_ref.h, filled here from rope_scaling.

// Upper bound on the eos ids kept (Llama 3 instruct lists 3).
#define NB_MAX_EOS_IDS 8


typedef struct nb_model_config {
    nb_arch arch;
    int hidden_size;       // H: model width, elements
    int intermediate_size; // I: MLP width, elements
    int n_layers;          // num_hidden_layers
    int n_heads;           // num_attention_heads (query heads)
    int n_kv_heads;        // num_key_value_heads (GQA); divides n_heads; default n_heads
    int head_dim;          // D: elements per head; default hidden_size / n_heads
    int vocab_size;        // V: rows of the embedding and of lm_head
    float rms_norm_eps;    // added to mean(x^2) in every RMSNorm; default 1e-6
    double rope_theta;     // RoPE base; inv_freq[i] = theta^(-2i/D); default 10000
    nb_rope_scaling rope_scaling;
    int max_position_embeddings; // tokens; the trained context (arch default if absent)
    bool tie_word_embeddings;    // lm_head shares embed_tokens; HF default false
    bool has_torch_dtype;        // torch_dtype (or "dtype") named f32/f16/bf16
    nb_dtype torch_dtype;        // informational: each tensor carries its own dtype
    int bos_token_id;            // -1 when absent/null
    int n_eos_token_ids;         // 0..NB_MAX_EOS_IDS (eos_token_id may be an int or a list)
    int eos_token_ids[NB_MAX_EOS_IDS];
    bool qkv_bias; // q/k/v_proj carry a bias: always for qwen2, attention_bias for llama
    bool o_bias;   // o_proj carries a bias: llama with attention_bias only
    // Tokens; 0 = none. Recorded for Mistral (sliding_window) and for Qwen2
    // when use_sliding_window is true. NOTE: the engine does NOT apply a
    // sliding window: attention is full-context. That is exact for every
    // sequence no longer than sliding_window; callers that allow longer
    // contexts must check this field themselves.
    int sliding_window;
} nb_model_config;

// Parse config.json text `json` (`len` bytes, need not be NUL-terminated).
// `src_name` names the file in error messages. On error, writes a message
// naming src_name (and the field) into err (if err_len > 0) and leaves *cfg
// unspecified.
// Returns NB_OK; NB_ERR_FORMAT (bad JSON with line/column, missing or
// out-of-range field); NB_ERR_UNSUPPORTED (architecture, rope_scaling type,
// mlp_bias, hidden_act other than silu); NB_ERR_INVALID_ARG (NULL pointers).
nb_status nb_model_config_parse(const char *json, size_t len, const char *src_name,
                                nb_model_config *cfg, char *err, size_t err_len);

// Read and parse the file at `path` (a config.json).
// Returns what nb_model_config_parse returns, plus NB_ERR_NOT_FOUND (no such
// file) and NB_ERR_IO (unreadable).
nb_status nb_model_config_load(const char *path, nb_model_config *cfg, char *err,
                               size_t err_len);

#endif // NB_MODEL_CONFIG_H
