// nb_client.h: a small C client for a nibbler worker (proto/nibbler.proto
// over a ZeroMQ DEALER socket), used by nibbler-generate, the tests and any
// C scheduler.
//
// The one idea: every call is one Request with a fresh id and one Response
// with the same id. A reply that arrives after its call timed out is stale:
// the next call recognises it by its id and drops it, so a timeout never
// shifts later replies onto the wrong request.
//
// Results are the protobuf-c structs of nibbler.pb-c.h (the protocol's own
// types, documented in nibbler.proto): a call hands back the whole Response,
// which the caller frees with nb_client_response_free().
//
// Return codes (an int everywhere): 0 success; > 0 a worker status, the
// nibbler.v1.Code value (NIBBLER__V1__CODE__NO_FREE_BLOCKS, ...); < 0 a
// client-side failure (NB_CLIENT_ERR_*). nb_client_error() then holds a
// message (the worker's own message for worker codes).
//
// Thread safety: one nb_client per thread (a ZeroMQ socket must not be
// shared); any number of clients may talk to one worker at once.
#ifndef NB_CLIENT_H
#define NB_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nibbler.pb-c.h"

// Client-side failures; worker statuses are the positive nibbler.v1.Code values.
enum {
    NB_CLIENT_OK = 0,
    NB_CLIENT_ERR_TIMEOUT = -1,       // no reply within timeout_ms (the worker may still run it)
    NB_CLIENT_ERR_TRANSPORT = -2,     // a ZeroMQ call failed (bad endpoint, context terminated)
    NB_CLIENT_ERR_PROTOCOL = -3,      // a reply that does not decode or lacks its result
    NB_CLIENT_ERR_INVALID_ARG = -4,   // a NULL or out-of-range argument
    NB_CLIENT_ERR_OUT_OF_MEMORY = -5,
};

// "OK", a worker code's proto name ("NO_FREE_BLOCKS") or a client error
// name ("TIMEOUT"). Static storage.
const char *nb_client_code_str(int code);

typedef struct nb_client_params {
    const char *endpoint;         // ipc:///path or tcp://host:port (required); copied
    int timeout_ms;               // per call; -1 waits forever
    const char *client_name;      // sent in Hello; copied
    // CURVE (all three or none), each a 40-character Z85 key; copied.
    const char *curve_server_key; // the worker's public key
    const char *curve_public_key; // this client's key pair
    const char *curve_secret_key;
} nb_client_params;

// Defaults: no endpoint, timeout 120000 ms, client_name "nb_client", no CURVE.
nb_client_params nb_client_default_params(void);

typedef struct nb_client nb_client;

// Connects a DEALER socket to p->endpoint (ZeroMQ connects lazily: a worker
// that is not there yet shows as a timeout on the first call). Returns NULL
// with a message in err on failure. Caller owns: nb_client_destroy().
nb_client *nb_client_new(const nb_client_params *p, char *err, size_t err_len);

// Closes the socket without lingering; accepts NULL; sets *c_p = NULL.
void nb_client_destroy(nb_client **c_p);

// The message of the last failed call (empty after a success). Owned by
// the client; valid until its next call.
const char *nb_client_error(const nb_client *c);

typedef Nibbler__V1__Response nb_client_response;

// Frees a Response from any call below; accepts NULL; sets *r_p = NULL.
void nb_client_response_free(nb_client_response **r_p);

// Sends *req (its id is overwritten with the next id) and waits for the
// Response with that id. Returns the Response's status code (0, > 0) or a
// client error (< 0). *out (may be NULL: the Response is then freed)
// receives the Response whenever one arrived, even with an error status;
// caller owns it. The request is borrowed and not modified otherwise.
int nb_client_call(nb_client *c, Nibbler__V1__Request *req, nb_client_response **out);

// ---------------------------------------------------------------- typed calls
// Each returns 0 when the request and every sequence in it succeeded;
// otherwise the request's code or, when the request succeeded, the first
// failing sequence's code (its message in nb_client_error() names the
// sequence). *out as for nb_client_call: per-sequence results are in
// (*out)->batch->seqs[i], in request order.

// Hello: protocol version and the worker's model, cache and limits in
// (*out)->hello.
int nb_client_hello(nb_client *c, nb_client_response **out);

// A sequence to add (AddSequence, Fork): id, sampling and stop conditions.
typedef struct nb_client_seq_spec {
    uint64_t seq_id;
    float temperature;       // 0: greedy
    uint32_t top_k;          // 0: none
    float top_p;             // 0 or 1: none
    uint64_t seed;
    const uint32_t *eos_ids; // [n_eos_ids], borrowed for the call
    size_t n_eos_ids;
    uint32_t max_tokens;     // generated tokens; 0: no limit
} nb_client_seq_spec;

int nb_client_add_sequence(nb_client *c, size_t n, const nb_client_seq_spec *specs,
                           nb_client_response **out);

// tokens[i] holds lens[i] prompt tokens for seq_ids[i]. Each sequence's
// result carries its first generated token.
int nb_client_prefill(nb_client *c, size_t n, const uint64_t *seq_ids,
                      const uint32_t *const *tokens, const size_t *lens, bool logprobs,
                      nb_client_response **out);

int nb_client_draft(nb_client *c, size_t n, const uint64_t *seq_ids, uint32_t gamma,
                    nb_client_response **out);
int nb_client_verify(nb_client *c, size_t n, const uint64_t *seq_ids, bool logprobs,
                     nb_client_response **out);
int nb_client_speculate(nb_client *c, size_t n, const uint64_t *seq_ids, uint32_t gamma,
                        bool logprobs, nb_client_response **out);
int nb_client_decode(nb_client *c, size_t n, const uint64_t *seq_ids, uint32_t steps,
                     bool logprobs, nb_client_response **out);

// Keep the first n_tokens[i] committed tokens of seq_ids[i].
int nb_client_rollback(nb_client *c, size_t n, const uint64_t *seq_ids,
                       const uint32_t *n_tokens, nb_client_response **out);

int nb_client_free(nb_client *c, size_t n, const uint64_t *seq_ids, nb_client_response **out);

// A child sharing parent's context. spec->seq_id is ignored (child_id is
// used); spec NULL keeps the parent's sampling and stop conditions.
int nb_client_fork(nb_client *c, uint64_t parent_id, uint64_t child_id,
                   const nb_client_seq_spec *spec, nb_client_response **out);

int nb_client_stats(nb_client *c, nb_client_response **out);   // (*out)->stats
int nb_client_health(nb_client *c, nb_client_response **out);  // (*out)->health
int nb_client_drain(nb_client *c, nb_client_response **out);
int nb_client_shutdown(nb_client *c, nb_client_response **out);

// ---------------------------------------------------------------- generation

typedef enum nb_client_mode {
    NB_CLIENT_MODE_SPEC = 0, // Speculate(gamma) rounds
    NB_CLIENT_MODE_AR = 1,   // Decode (target only)
} nb_client_mode;

typedef struct nb_client_gen_params {
    uint64_t seq_id;          // 0: a fresh id chosen by the client
    nb_client_mode mode;
    uint32_t gamma;           // SPEC: drafts per round
    uint32_t decode_steps;    // AR: tokens per Decode command
    uint32_t max_tokens;      // generated tokens (the prefill's one included); > 0
    float temperature;        // sampling as in nb_client_seq_spec
    uint32_t top_k;
    float top_p;
    uint64_t seed;
    const uint32_t *eos_ids;  // [n_eos_ids] stop ids, borrowed; none: run to max_tokens
    size_t n_eos_ids;
    bool keep_sequence;       // false: Free the sequence at the end
} nb_client_gen_params;

// Defaults: SPEC, gamma 4, decode_steps 1, max_tokens 64, greedy, seed 0,
// no eos ids, the sequence freed.
nb_client_gen_params nb_client_gen_default_params(void);

typedef struct nb_client_gen_result {
    uint32_t *tokens;      // [n_tokens] generated ids (not the prompt); caller frees with
                           // nb_client_gen_result_clear()
    size_t n_tokens;
    uint64_t seq_id;       // the sequence used
    uint64_t n_drafted;    // SPEC: drafts proposed
    uint64_t n_accepted;   // SPEC: drafts accepted
    uint32_t n_rounds;     // Speculate/Decode commands sent after the prefill
    int finish_reason;     // Nibbler__V1__FinishReason (NOT_FINISHED when cut at max_tokens
                           // by the client)
    double prefill_s;      // wall-clock seconds of the Prefill call
    double elapsed_s;      // wall-clock seconds from Prefill sent to the last token
} nb_client_gen_result;

// AddSequence, Prefill(prompt), then Speculate or Decode rounds until
// max_tokens tokens, an eos id, or a stop reported by the worker; Free
// unless keep_sequence. Tokens past max_tokens or after an eos id are
// dropped. On error *out keeps what was generated so far (and the
// sequence is still freed). Returns 0 or a code as the typed calls.
int nb_client_generate(nb_client *c, const nb_client_gen_params *p, const uint32_t *prompt,
                       size_t n_prompt, nb_client_gen_result *out);

// Frees r->tokens and zeroes *r; accepts NULL.
void nb_client_gen_result_clear(nb_client_gen_result *r);

#endif // NB_CLIENT_H
