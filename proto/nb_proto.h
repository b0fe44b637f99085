// nb_proto.h: helpers around the generated protobuf-c code (nibbler.pb-c.h)
// shared by the worker, the clients and the fuzzer: status codes, bounded
// decoding, request validation against the worker's limits, and packing.
//
// The one idea: a request is checked completely, field by field, against
// plain limits BEFORE anything touches the engine. Validation rejects what
// is wrong whatever the worker's state (a token id outside the vocabulary,
// gamma 0, a batch naming one sequence twice) and rejects the whole request;
// state-dependent outcomes (unknown sequence, no free blocks, context full)
// are per-sequence statuses the worker decides later. Pure C: no ZeroMQ, no
// engine, so the fuzzer links it alone.
#ifndef NB_PROTO_H
#define NB_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nb_status.h"
#include "nibbler.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

// The protocol version this code speaks (nibbler.proto's PROTOCOL_VERSION).
#define NB_PROTO_VERSION 1u

// Most eos ids one sequence may list.
#define NB_PROTO_MAX_EOS_IDS 16

typedef Nibbler__V1__Code nb_proto_code;

// What a request may ask for. Every field is a hard upper bound; 0 is never
// "unlimited" (a zero limit rejects every non-empty value).
typedef struct nb_proto_limits {
    uint32_t vocab_size;        // token ids must be < vocab_size
    uint32_t max_context;       // tokens per sequence (prompt, rollback target, decode n)
    uint32_t max_gamma;         // Draft/Speculate gamma in 1..max_gamma
    uint32_t max_batch;         // sequences (or items) per command, >= 1
    uint32_t max_decode_steps;  // Decode n in 1..max_decode_steps
    uint32_t max_eos_ids;       // per sequence, <= NB_PROTO_MAX_EOS_IDS
    uint32_t max_message_bytes; // encoded request size
} nb_proto_limits;

// Limits for a model of vocab_size tokens and max_context context: gamma 8,
// batch 16, decode steps = max_context, 16 eos ids, 64 MiB messages.
nb_proto_limits nb_proto_default_limits(uint32_t vocab_size, uint32_t max_context);

// The wire code for an engine status (NB_ERR_NO_FREE_BLOCKS -> NO_FREE_BLOCKS,
// NB_ERR_STATE -> BAD_STATE, NB_ERR_EXISTS -> ALREADY_EXISTS, ...).
nb_proto_code nb_proto_code_from_status(nb_status s);

// "OK", "INVALID_ARGUMENT", ... as in nibbler.proto; "UNKNOWN_CODE" otherwise.
const char *nb_proto_code_name(nb_proto_code c);

// The command's field name ("hello", "add_sequence", ...), "none" when unset.
const char *nb_proto_command_name(Nibbler__V1__Request__CommandCase c);

// Reads the Request id (field 1) from the start of possibly malformed bytes,
// so an error reply can still carry it. Returns false when the bytes do not
// begin with field 1 as a varint (*id is then 0).
bool nb_proto_peek_request_id(const void *data, size_t len, uint64_t *id);

// Decodes a Request of len bytes. On NIBBLER__V1__CODE__OK *out is a new
// request the caller owns (free with nb_proto_request_free()). Otherwise *out
// is NULL, err holds a message and the result is MESSAGE_TOO_LARGE (len >
// max_len) or MALFORMED (bytes that do not decode). Unknown fields are
// skipped (protobuf rules); an unknown command therefore decodes as a
// request with no command, which validation reports as UNKNOWN_COMMAND.
nb_proto_code nb_proto_request_decode(const void *data, size_t len, size_t max_len,
                                      Nibbler__V1__Request **out, char *err, size_t err_len);

// Accepts NULL and *req == NULL; sets *req = NULL.
void nb_proto_request_free(Nibbler__V1__Request **req);

// Checks every field of req against lim. Returns OK, or the code of the first
// problem with a message in err naming the field and the value:
//   UNKNOWN_COMMAND      no command set (or one this version does not know)
//   UNSUPPORTED_VERSION  Request.protocol_version or Hello.protocol_version not 0 or 1
//   INVALID_ARGUMENT     empty batch or more than max_batch entries; a sequence
//                        named twice in one command; token id >= vocab_size;
//                        empty prompt; gamma or Decode n out of range; bad
//                        sampling parameters (temperature < 0 or not finite,
//                        top_k > vocab_size, top_p outside [0, 1]); too many or
//                        out-of-vocabulary eos ids; Fork parent == child;
//                        Rollback n_tokens > max_context
//   CONTEXT_TOO_LONG     a prompt longer than max_context by itself
nb_proto_code nb_proto_validate_request(const Nibbler__V1__Request *req,
                                        const nb_proto_limits *lim, char *err, size_t err_len);

// Packs any message into *buf, growing it (jemalloc realloc) when *cap is too
// small; the caller owns *buf and frees it with free(). *len receives the
// packed length (0 is valid: an all-default message). Returns false when the
// buffer could not grow (nothing is written then).
bool nb_proto_pack(const ProtobufCMessage *m, uint8_t **buf, size_t *cap, size_t *len);

// Fills st (already initialised) with code and message (a caller-owned
// string that must outlive the packing; NULL: the empty string).
void nb_proto_status_set(Nibbler__V1__Status *st, nb_proto_code code, char *message);

#ifdef __cplusplus
}
#endif

#endif // NB_PROTO_H
