// tokenizer.h: text <-> token ids for the tools around the worker (the
// generate CLI, tests, benchmarks). The worker itself speaks token ids only.
//
// Two on-disk formats behind one API:
//   - HF tokenizer.json with a BPE model and the ByteLevel pre-tokenizer
//     (GPT-2 style byte-level BPE: merges applied by rank);
//   - llama2.c tokenizer.bin (sentencepiece-like: per-token scores, byte
//     fallback tokens "<0xNN>" at id byte+3, merges by highest score).
// The one idea: both formats reduce to the same BPE core. Each vocabulary is
// turned at load time into a pair table (left id, right id) -> (merged id,
// priority) and the encoder repeatedly merges the best adjacent pair with a
// heap, leftmost first on ties, which is exactly the greedy loop of both
// reference implementations in O(n log n).
//
// Thread safety: a loaded nb_tokenizer is immutable; encode/decode may be
// called from many threads at once.
#ifndef NB_TOKENIZER_H
#define NB_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "nb_status.h"

typedef struct nb_tokenizer nb_tokenizer;

// Which format a tokenizer was loaded from.
typedef enum nb_tokenizer_kind {
    NB_TOKENIZER_HF_BPE = 0,   // tokenizer.json, byte-level BPE
    NB_TOKENIZER_LLAMA2C = 1,  // tokenizer.bin, llama2.c format
} nb_tokenizer_kind;

// Loads <dir>/tokenizer.json if present, else <dir>/tokenizer.bin.
// On success *out owns a new tokenizer (free with nb_tokenizer_free()).
// Returns:
//   NB_OK
//   NB_ERR_INVALID_ARG    dir or out is NULL
//   NB_ERR_NOT_FOUND      neither file exists
//   NB_ERR_IO             a file exists but cannot be read
//   NB_ERR_FORMAT         malformed file (not JSON, truncated, a merge naming
//                         an unknown token, missing byte tokens, ...)
//   NB_ERR_UNSUPPORTED    valid but not handled: tokenizer.json whose model is
//                         not BPE, pre_tokenizer not ByteLevel, a normalizer,
//                         byte_fallback / subword prefixes / suffixes
//   NB_ERR_OUT_OF_MEMORY
// On failure *out is NULL and, when err is non-NULL, err holds a message that
// names the offending file.
nb_status nb_tokenizer_load(const char *dir, nb_tokenizer **out, char *err, size_t err_len);

// Frees a tokenizer; NULL-safe (t or *t NULL); sets *t = NULL.
void nb_tokenizer_free(nb_tokenizer **t);

// Number of token ids: one more than the largest id (added tokens included).
int32_t nb_tokenizer_vocab_size(const nb_tokenizer *t);

// Which format t was loaded from; t must not be NULL.
nb_tokenizer_kind nb_tokenizer_get_kind(const nb_tokenizer *t);

// Id of a token given its exact piece as stored in the file (byte-level
// characters for HF, e.g. "<|endoftext|>"; raw bytes for llama2.c, e.g.
// "<s>"), or -1 when absent. For looking up special tokens.
int32_t nb_tokenizer_piece_id(const nb_tokenizer *t, const char *piece, size_t len);

// Encodes len bytes of UTF-8 text into ids (any bytes round-trip; at most
// 512 MiB). No BOS is added: the caller decides. llama2.c format: a dummy
// prefix " " is added when len > 0 (as llama2.c does). HF format: added tokens
// (e.g. "<|endoftext|>") that occur literally in the text become their ids.
// Writes at most cap ids; *n_ids = the number of ids the text needs.
// Returns NB_OK, NB_ERR_INVALID_ARG (t/n_ids NULL, ids NULL with cap > 0, or
// cap too small: *n_ids then says how many are needed), NB_ERR_OUT_OF_MEMORY.
// Scratch is allocated per call: ~72 bytes per byte of the longest
// pre-tokenized piece (HF) or of the whole text (llama2.c).
nb_status nb_tokenizer_encode(const nb_tokenizer *t, const char *text, size_t len, int32_t *ids,
                              int32_t cap, int32_t *n_ids);

// Appends the text of token id to buf (no NUL is written). prev_id is the
// token before it (-1 if none): with llama2.c, a piece that starts with a
// space loses it right after BOS (id 1), and "<0xNN>" pieces become the byte
// 0xNN. With HF, byte-level characters map back to bytes (a token may hold a
// partial UTF-8 sequence: concatenate the outputs). Returns the number of
// bytes written (0 is possible), or -1 if id is out of range / unused or the
// text does not fit in cap.
int nb_tokenizer_decode_token(const nb_tokenizer *t, int32_t prev_id, int32_t id, char *buf,
                              size_t cap);

#endif // NB_TOKENIZER_H
