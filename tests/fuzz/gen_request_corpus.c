// gen_request_corpus.c: writes the seed corpus of tests/fuzz/corpus: small
// valid requests of every command and invalid ones (bad versions, ids
// twice, out-of-vocabulary tokens, gamma 0, truncated and junk bytes).
// Usage: gen_request_corpus DIR
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nb_proto.h"

static const char *g_dir;

static void put(const char *name, const void *data, size_t len) {
    char p[1024];
    snprintf(p, sizeof(p), "%s/%s", g_dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) { perror(p); exit(1); }
    fwrite(data, 1, len, f);
    fclose(f);
}

static void put_req(const char *name, const Nibbler__V1__Request *q) {
    uint8_t *buf = NULL;
    size_t cap = 0, len = 0;
    if (!nb_proto_pack(&q->base, &buf, &cap, &len)) exit(1);
    put(name, buf, len);
    // and a truncated copy
    if (len > 2) {
        char t[256];
        snprintf(t, sizeof(t), "%s-truncated", name);
        put(t, buf, len - 1);
    }
    free(buf);
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: gen_request_corpus DIR\n"); return 2; }
    g_dir = argv[1];
    Nibbler__V1__Request q;
    uint64_t ids[3] = {1, 2, 3}, dup[2] = {7, 7};
    uint32_t toks[4] = {1, 2, 3, 4}, badtok[2] = {1, 600};

    Nibbler__V1__Hello h = NIBBLER__V1__HELLO__INIT;
    nibbler__v1__request__init(&q);
    q.id = 1; h.protocol_version = 1; h.client_name = "corpus";
    q.command_case = NIBBLER__V1__REQUEST__COMMAND_HELLO; q.hello = &h;
    put_req("hello", &q);
    h.protocol_version = 9;
    put_req("hello-bad-version", &q);
    h.protocol_version = 1; q.protocol_version = 3;
    put_req("request-bad-version", &q);
    q.protocol_version = 0;

    Nibbler__V1__SamplingParams sp = NIBBLER__V1__SAMPLING_PARAMS__INIT;
    Nibbler__V1__StopConditions sc = NIBBLER__V1__STOP_CONDITIONS__INIT;
    Nibbler__V1__SequenceSpec spec = NIBBLER__V1__SEQUENCE_SPEC__INIT, *specs[2] = {&spec, &spec};
    Nibbler__V1__AddSequence add = NIBBLER__V1__ADD_SEQUENCE__INIT;
    uint32_t eos[2] = {2, 5};
    sp.temperature = 0.8f; sp.top_k = 40; sp.top_p = 0.9f; sp.seed = 42;
    sc.eos_ids = eos; sc.n_eos_ids = 2; sc.max_tokens = 64;
    spec.seq_id = 1; spec.sampling = &sp; spec.stop = &sc;
    add.seqs = specs; add.n_seqs = 1;
    q.command_case = NIBBLER__V1__REQUEST__COMMAND_ADD_SEQUENCE; q.add_sequence = &add;
    put_req("add", &q);
    add.n_seqs = 2;
    put_req("add-dup", &q);
    add.n_seqs = 1; sp.top_p = 1.5f;
    put_req("add-bad-top-p", &q);
    sp.top_p = 0.9f; sp.temperature = -1.0f;
    put_req("add-bad-temperature", &q);
    sp.temperature = 0.0f;

    Nibbler__V1__PrefillItem it = NIBBLER__V1__PREFILL_ITEM__INIT, *its[1] = {&it};
    Nibbler__V1__Prefill pf = NIBBLER__V1__PREFILL__INIT;
    it.seq_id = 1; it.tokens = toks; it.n_tokens = 4;
    pf.items = its; pf.n_items = 1; pf.return_logprobs = 1;
    q.command_case = NIBBLER__V1__REQUEST__COMMAND_PREFILL; q.prefill = &pf;
    put_req("prefill", &q);
    it.tokens = badtok; it.n_tokens = 2;
    put_req("prefill-bad-token", &q);
    it.n_tokens = 0;
    put_req("prefill-empty", &q);

    Nibbler__V1__Speculate spc = NIBBLER__V1__SPECULATE__INIT;
    spc.seq_ids = ids; spc.n_seq_ids = 3; spc.gamma = 4;
    q.command_case = NIBBLER__V1__REQUEST__COMMAND_SPECULATE; q.speculate = &spc;
    put_req("speculate", &q);
    spc.gamma = 0;
    put_req("speculate-gamma0", &q);
    spc.gamma = 4; spc.seq_ids = dup; spc.n_seq_ids = 2;
    put_req("speculate-dup", &q);

    Nibbler__V1__Draft dr = NIBBLER__V1__DRAFT__INIT;
    dr.seq_ids = ids; dr.n_seq_ids = 2; dr.gamma = 99;
    q.command_case = NIBBLER__V1__REQUEST__COMMAND_DRAFT; q.draft = &dr;
    put_req("draft-gamma99", &q);
    Nibbler__V1__Verify vf = NIBBLER__V1__VERIFY__INIT;
    vf.seq_ids = ids; vf.n_seq_ids = 1;
    q.command_case = NIBBLER__V1__REQUEST__COMMAND_VERIFY; q.verify = &vf;
    put_req("verify", &q);
    Nibbler__V1__Decode de = NIBBLER__V1__DECODE__INIT;
    de.seq_ids = ids; de.n_seq_ids = 3; de.n = 16;
    q.command_case = NIBBLER__V1__REQUEST__COMMAND_DECODE; q.decode = &de;
    put_req("decode", &q);
    Nibbler__V1__RollbackItem ri = NIBBLER__V1__ROLLBACK_ITEM__INIT, *ris[1] = {&ri};
    Nibbler__V1__Rollback rb = NIBBLER__V1__ROLLBACK__INIT;
    ri.seq_id = 1; ri.n_tokens = 3; rb.items = ris; rb.n_items = 1;
    q.command_case = NIBBLER__V1__REQUEST__COMMAND_ROLLBACK; q.rollback = &rb;
    put_req("rollback", &q);
    Nibbler__V1__Free fr = NIBBLER__V1__FREE__INIT;
    fr.seq_ids = ids; fr.n_seq_ids = 3;
    q.command_case = NIBBLER__V1__REQUEST__COMMAND_FREE; q.free = &fr;
    put_req("free", &q);
    Nibbler__V1__Fork fk = NIBBLER__V1__FORK__INIT;
    fk.parent_id = 1; fk.child_id = 2; fk.stop = &sc;
    q.command_case = NIBBLER__V1__REQUEST__COMMAND_FORK; q.fork = &fk;
    put_req("fork", &q);
    fk.child_id = 1;
    put_req("fork-self", &q);
    Nibbler__V1__Stats stt = NIBBLER__V1__STATS__INIT;
    q.command_case = NIBBLER__V1__REQUEST__COMMAND_STATS; q.stats = &stt;
    put_req("stats", &q);
    q.command_case = NIBBLER__V1__REQUEST__COMMAND_HEALTH; q.health = (Nibbler__V1__Health *)&stt;
    put_req("health", &q);
    q.command_case = NIBBLER__V1__REQUEST__COMMAND_DRAIN; q.drain = (Nibbler__V1__Drain *)&stt;
    put_req("drain", &q);
    q.command_case = NIBBLER__V1__REQUEST__COMMAND_SHUTDOWN; q.shutdown = (Nibbler__V1__Shutdown *)&stt;
    put_req("shutdown", &q);
    q.command_case = NIBBLER__V1__REQUEST__COMMAND__NOT_SET;
    q.id = 77;
    put_req("no-command", &q);

    static const uint8_t future[] = {0x08, 0x4e, 0x9a, 0x06, 0x00};
    put("unknown-field", future, sizeof(future));
    static const uint8_t junk[] = {0x08, 0x2a, 0xff, 0xff, 0xff, 0xff, 0x0f};
    put("junk-wiretype", junk, sizeof(junk));
    static const uint8_t deep[] = {0x6a, 0x80, 0x80, 0x80, 0x80, 0x10}; // prefill with a 4 GiB length
    put("huge-length", deep, sizeof(deep));
    put("empty", "", 0);
    return 0;
}
