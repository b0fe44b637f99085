// nb_status.h: the one status enum every nibbler module returns, plus the
// assert that stays on in release builds.
//
// Two classes of error: programming errors (a broken invariant) trip
// NB_ASSERT, which prints file:line and aborts even in release builds;
// runtime failures (bad input, no free blocks, CUDA OOM) return a negative
// nb_status that the caller can act on.
#ifndef NB_STATUS_H
#define NB_STATUS_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

typedef enum nb_status {
    NB_OK = 0,
    NB_ERR_INVALID_ARG = -1,      // an argument is out of its documented range
    NB_ERR_NO_FREE_BLOCKS = -2,   // a block pool is exhausted; preempt or wait
    NB_ERR_OUT_OF_MEMORY = -3,    // a host or device allocation failed
    NB_ERR_NOT_FOUND = -4,        // unknown sequence id, tensor, file
    NB_ERR_EXISTS = -5,           // duplicate sequence id
    NB_ERR_NON_FINITE = -6,       // NaN or Inf where finite values are required
    NB_ERR_CONTEXT_TOO_LONG = -7, // a sequence would exceed the context limit
    NB_ERR_IO = -8,               // a file could not be opened, read or mapped
    NB_ERR_FORMAT = -9,           // a file or message is malformed
    NB_ERR_UNSUPPORTED = -10,     // valid but not supported (architecture, dtype)
    NB_ERR_STATE = -11,           // not valid in the current state (e.g. no drafts)
    NB_ERR_BACKEND = -12,         // the compute backend failed (CUDA error)
    NB_ERR_TOO_MANY_SEQS = -13,   // the sequence table is full
    NB_ERR_INTERNAL = -14,        // a bug: please report
} nb_status;

static inline const char *nb_status_str(nb_status s) {
    switch (s) {
    case NB_OK: return "ok";
    case NB_ERR_INVALID_ARG: return "invalid argument";
    case NB_ERR_NO_FREE_BLOCKS: return "no free blocks";
    case NB_ERR_OUT_OF_MEMORY: return "out of memory";
    case NB_ERR_NOT_FOUND: return "not found";
    case NB_ERR_EXISTS: return "already exists";
    case NB_ERR_NON_FINITE: return "non-finite value";
    case NB_ERR_CONTEXT_TOO_LONG: return "context too long";
    case NB_ERR_IO: return "i/o error";
    case NB_ERR_FORMAT: return "malformed input";
    case NB_ERR_UNSUPPORTED: return "unsupported";
    case NB_ERR_STATE: return "invalid state for this operation";
    case NB_ERR_BACKEND: return "backend error";
    case NB_ERR_TOO_MANY_SEQS: return "too many sequences";
    case NB_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

// Formats a message into err[0..len); a no-op when err is NULL or len is 0.
// The one helper every module uses to fill the caller's error buffer.
static inline void nb_set_err(char *err, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline void nb_set_err(char *err, size_t len, const char *fmt, ...) {
    if (!err || !len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
}

// Stays on in release builds: an invariant that fails here is a bug, and
// continuing would corrupt another sequence's state.
#define NB_ASSERT(x)                                                          \
    do {                                                                      \
        if (!(x)) {                                                           \
            fprintf(stderr, "%s:%d: NB_ASSERT(%s) failed\n", __FILE__,        \
                    __LINE__, #x);                                            \
            abort();                                                          \
        }                                                                     \
    } while (0)

#endif // NB_STATUS_H
