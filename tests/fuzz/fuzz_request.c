// fuzz_request.c: libFuzzer target for the worker's request path before the
// engine: bounded decode (nb_proto_request_decode), full validation
// (nb_proto_validate_request) against small limits, then free. Any crash,
// leak or sanitizer report is a bug. No ZeroMQ, no engine.
// Built with clang -fsanitize=fuzzer (tests/fuzz/run_fuzz.sh); gcc builds
// replay the corpus through fuzz_replay.c instead.
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "nb_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nb_proto_limits lim = nb_proto_default_limits(512, 512);
    lim.max_message_bytes = 1 << 20;
    uint64_t id = 0;
    nb_proto_peek_request_id(data, size, &id);
    Nibbler__V1__Request *r = NULL;
    char err[256];
    nb_proto_code c = nb_proto_request_decode(data, size, lim.max_message_bytes, &r, err, sizeof(err));
    if (c == NIBBLER__V1__CODE__OK) {
        c = nb_proto_validate_request(r, &lim, err, sizeof(err));
        // The reply path: a status naming the code, packed.
        Nibbler__V1__Response resp = NIBBLER__V1__RESPONSE__INIT;
        Nibbler__V1__Status st = NIBBLER__V1__STATUS__INIT;
        nb_proto_status_set(&st, c, err);
        resp.id = r->id;
        resp.status = &st;
        uint8_t *buf = NULL;
        size_t cap = 0, len = 0;
        if (nb_proto_pack(&resp.base, &buf, &cap, &len) && strlen(nb_proto_code_name(c)) == 0)
            __builtin_trap();
        free(buf);
    }
    nb_proto_request_free(&r);
    return 0;
}
