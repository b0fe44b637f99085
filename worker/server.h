// server.h: the nibbler worker process: one model, one engine, one ZeroMQ
// ROUTER socket, and the command dispatch between them.
//
// The one idea: a single-threaded loop takes one request at a time, in the
// order ZeroMQ delivers them, validates it completely (nb_proto.h), runs it
// on the engine as one batched command, and answers before taking the next.
// Requests from one client are therefore answered in order, and a request
// never observes another half-done. The hot path allocates nothing except
// where a reply is larger than any before it (buffers grow and are kept).
//
// Client sequence ids (uint64) map to engine slots through an open-addressing
// hash table; each live sequence carries its stop conditions, generated count
// and finish reason (docs/protocol.md has the rules).
#ifndef NB_SERVER_H
#define NB_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "nb_status.h"

typedef enum nb_log_level {
    NB_LOG_DEBUG = 0,
    NB_LOG_INFO = 1,
    NB_LOG_WARN = 2,
    NB_LOG_ERROR = 3,
} nb_log_level;

// One line to stderr: "2026-11-22T04:00:00Z INFO message". Lines below the
// process's level (nb_log_set_level) are dropped.
void nb_log(nb_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void nb_log_set_level(nb_log_level level);

// Parses "debug", "info", "warn", "error". Returns false otherwise.
bool nb_log_level_parse(const char *s, nb_log_level *out);

typedef struct nb_server_params {
    const char *model;                  // checkpoint directory or synthetic:NAME
    const char *endpoint;               // ipc:///path or tcp://host:port
    const char *backend;                // "cpu" or "cuda"
    int32_t group_size;                 // G, tokens per block
    size_t kv_memory;                   // bytes for the KV pools; 0: engine default (256 MiB)
    double gpu_memory_utilization;      // 0: unset; (0, 1]: cuda only
    int device;                         // cuda device ordinal (default 0)
    int32_t max_seqs;                   // live sequences at once (also the most per command)
    int32_t max_model_len;              // tokens per sequence; 0: the model's context
    nb_target_weights target_weights;   // model or int8
    bool kv_quant;                      // true: hierarchical INT8/INT4 cache; false: FP only
    int kv_dtype;                       // nb_dtype of FP blocks; -1: the model's
    int32_t max_gamma;                  // most drafts per round
    int32_t prefill_chunk;              // prompt tokens per sequence per pass
    int32_t max_batch_rows;             // most rows in one forward pass
    bool prefix_cache;                  // share equal prompt prefixes
    bool draft_batch_invariant;         // cuda: row-invariant draft attention (nb_engine_params)
    uint64_t seed;                      // synthetic models' weight seed
    size_t max_message_bytes;           // requests above this get MESSAGE_TOO_LARGE
    const char *curve_secret_key_file;  // Z85 secret key; NULL: no CURVE
    const char *curve_allowed_clients_file; // Z85 public keys, one per line
} nb_server_params;

// Defaults: backend cpu, G 128, engine-default KV memory, 16 sequences, the
// model's context, target weights model, quantized cache, model kv dtype,
// gamma 8, prefill chunk 1024, 1024 rows, prefix cache on, seed 0, 64 MiB
// messages, no CURVE.
nb_server_params nb_server_default_params(void);

typedef struct nb_server nb_server;

// Exit codes of the worker process.
#define NB_SERVER_EXIT_OK 0      // Shutdown, Drain completed, SIGTERM/SIGINT
#define NB_SERVER_EXIT_FAIL 1    // a runtime failure (model load, engine, socket)
#define NB_SERVER_EXIT_CONFIG 2  // refused configuration (flags, security, missing backend)

// Loads the model, builds the engine, checks the endpoint's security and
// binds the socket. Returns NULL with a message in err and *exit_code set
// (NB_SERVER_EXIT_CONFIG or NB_SERVER_EXIT_FAIL) on failure. bind == false
// skips ZeroMQ entirely (for in-process tests and benchmarks through
// nb_server_handle()). Caller owns: nb_server_destroy().
nb_server *nb_server_new(const nb_server_params *p, bool bind, int *exit_code, char *err,
                         size_t err_len);

void nb_server_destroy(nb_server **s_p); // accepts NULL; sets *s_p = NULL

// Serves until Shutdown, a completed Drain, or nb_server_request_stop().
// Returns the process exit code.
int nb_server_run(nb_server *s);

// Async-signal-safe: the loop finishes and answers the request in flight,
// then returns NB_SERVER_EXIT_OK.
void nb_server_request_stop(void);

// Handles one encoded Request (len bytes) without ZeroMQ. *resp points at
// the encoded Response (owned by the server, valid until the next call).
// Returns true when the server should exit after sending this reply.
bool nb_server_handle(nb_server *s, const uint8_t *req, size_t len, const uint8_t **resp,
                      size_t *resp_len);

#endif // NB_SERVER_H
