// test_tokenizer.c: the tokenizer against generated fixtures (error statuses,
// pre-tokenizer splits, BPE tie rules, byte fallback) and against the two
// real tokenizers in ../shared (golden ids and texts, round trips, speed).
// The real-model part skips (77) when ../shared is absent; the fixtures run
// regardless.
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "nb_test.h"
#include "tokenizer.h"

static char g_tmp[256];

static void write_file(const char *name, const void *data, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_tmp, name);
    FILE *f = fopen(path, "wb");
    NB_ASSERT(f);
    NB_ASSERT(fwrite(data, 1, n, f) == n);
    fclose(f);
}

static void remove_file(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_tmp, name);
    unlink(path);
}

static char *read_file(const char *path, size_t *n_out) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    NB_ASSERT(p);
    NB_ASSERT(fread(p, 1, (size_t)n, f) == (size_t)n);
    p[n] = 0;
    fclose(f);
    if (n_out) *n_out = (size_t)n;
    return p;
}

// Decodes ids[0..n) with prev starting at first_prev; caller frees.
static char *decode_all(const nb_tokenizer *t, const int32_t *ids, int32_t n, int32_t first_prev,
                        size_t *len_out) {
    size_t cap = 64 + (size_t)n * 64, len = 0;
    char *s = malloc(cap + 1);
    NB_ASSERT(s);
    int32_t prev = first_prev;
    for (int32_t i = 0; i < n; i++) {
        int w = nb_tokenizer_decode_token(t, prev, ids[i], s + len, cap - len);
        CHECKF(w >= 0, "decode of id %d failed", ids[i]);
        if (w < 0) break;
        len += (size_t)w;
        prev = ids[i];
    }
    s[len] = 0;
    *len_out = len;
    return s;
}

// Encodes text and returns the ids (caller frees) in *ids_out.
static int32_t encode_all(const nb_tokenizer *t, const char *text, size_t len, int32_t **ids_out) {
    int32_t n = 0;
    nb_status st = nb_tokenizer_encode(t, text, len, NULL, 0, &n);
    CHECK(st == (n > 0 ? NB_ERR_INVALID_ARG : NB_OK));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n + 1));
    NB_ASSERT(ids);
    int32_t n2 = -1;
    st = nb_tokenizer_encode(t, text, len, ids, n, &n2);
    CHECK(st == NB_OK && n2 == n);
    *ids_out = ids;
    return n;
}

static bool ids_eq(const int32_t *a, int32_t na, const int32_t *b, int32_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, sizeof(int32_t) * (size_t)na) == 0);
}

static bool round_trip(const nb_tokenizer *t, const char *text, size_t len);

// Random bytes (invalid UTF-8 and NULs included) must round-trip too.
static bool round_trip_random(const nb_tokenizer *t, size_t n, unsigned seed) {
    char *s = malloc(n);
    NB_ASSERT(s);
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        // Mostly ASCII letters/spaces so that merges happen, some raw bytes.
        unsigned r = x >> 24;
        s[i] = (char)(r < 160 ? (unsigned)"ab cd\nefg h'"[r % 13] : r);
    }
    bool ok = round_trip(t, s, n);
    free(s);
    return ok;
}

// Round trip: decode(encode(text)) == text. llama2.c decodes after BOS (the
// dummy prefix space is dropped there).
static bool round_trip(const nb_tokenizer *t, const char *text, size_t len) {
    int32_t *ids;
    int32_t n = encode_all(t, text, len, &ids);
    size_t dl;
    int32_t first_prev = nb_tokenizer_get_kind(t) == NB_TOKENIZER_LLAMA2C ? 1 : -1;
    char *d = decode_all(t, ids, n, first_prev, &dl);
    bool ok = dl == len && memcmp(d, text, len) == 0;
    if (!ok) {
        size_t k = 0;
        while (k < dl && k < len && d[k] == text[k]) k++;
        fprintf(stderr, "round trip differs at byte %zu of %zu (decoded %zu): \"%.40s\" vs \"%.40s\"\n",
                k, len, dl, text + k, d + k);
    }
    free(d);
    free(ids);
    return ok;
}

static nb_status load_tmp(nb_tokenizer **t, char *err, size_t err_len) {
    err[0] = 0;
    return nb_tokenizer_load(g_tmp, t, err, err_len);
}

// ------------------------------------------------------------ llama2.c fixture

typedef struct l2tok {
    const char *s;
    float score;
} l2tok;

static size_t build_l2(char *buf, size_t cap, const l2tok *extra, int n_extra) {
    size_t o = 0;
    int32_t max_len = 16;
#define PUT(p, n)                                                                                  \
    do {                                                                                           \
        NB_ASSERT(o + (n) <= cap);                                                                 \
        memcpy(buf + o, (p), (n));                                                                 \
        o += (n);                                                                                  \
    } while (0)
    PUT(&max_len, 4);
    for (int i = 0; i < 259 + n_extra; i++) {
        char piece[16];
        float score = 0;
        if (i == 0) strcpy(piece, "<unk>");
        else if (i == 1) strcpy(piece, "<s>");
        else if (i == 2) strcpy(piece, "</s>");
        else if (i < 259) snprintf(piece, sizeof piece, "<0x%02X>", i - 3);
        else {
            strcpy(piece, extra[i - 259].s);
            score = extra[i - 259].score;
        }
        int32_t len = (int32_t)strlen(piece);
        PUT(&score, 4);
        PUT(&len, 4);
        PUT(piece, (size_t)len);
    }
#undef PUT
    return o;
}

static void test_llama2c_fixture(void) {
    static const l2tok extra[] = {
        {" ", -10}, {"a", -1}, {"b", -1}, {"ab", 1}, {" a", 2}, {"aa", 0.5f}, {"\xc3\xa9", -1},
    };
    enum { SP = 259, A = 260, B = 261, AB = 262, SPA = 263, AA = 264, EACUTE = 265 };
    static char buf[8192];
    size_t n = build_l2(buf, sizeof buf, extra, (int)(sizeof extra / sizeof extra[0]));
    write_file("tokenizer.bin", buf, n);
    char err[512];
    nb_tokenizer *t = NULL;
    nb_status st = load_tmp(&t, err, sizeof err);
    CHECKF(st == NB_OK, "%s", err);
    if (!t) return;
    CHECK(nb_tokenizer_get_kind(t) == NB_TOKENIZER_LLAMA2C);
    CHECK(nb_tokenizer_vocab_size(t) == 266);
    CHECK(nb_tokenizer_piece_id(t, "<s>", 3) == 1);

    int32_t ids[32], k = -1;
    // Highest score first: " a" (2) beats "ab" (1).
    CHECK(nb_tokenizer_encode(t, "ab", 2, ids, 32, &k) == NB_OK);
    CHECK(ids_eq(ids, k, (int32_t[]){SPA, B}, 2));
    // " a" (2) first, then the remaining "aa" (0.5).
    CHECK(nb_tokenizer_encode(t, "aaa", 3, ids, 32, &k) == NB_OK);
    CHECK(ids_eq(ids, k, (int32_t[]){SPA, AA}, 2));
    // A known multi-byte character is one token; an unknown one falls back to bytes.
    CHECK(nb_tokenizer_encode(t, "\xc3\xa9\xe2\x9c\x93", 5, ids, 32, &k) == NB_OK);
    CHECK(ids_eq(ids, k, (int32_t[]){SP, EACUTE, 0xE2 + 3, 0x9C + 3, 0x93 + 3}, 5));
    // Empty text: no dummy prefix.
    CHECK(nb_tokenizer_encode(t, "", 0, ids, 32, &k) == NB_OK && k == 0);
    // Capacity too small reports the need.
    CHECK(nb_tokenizer_encode(t, "ab", 2, ids, 1, &k) == NB_ERR_INVALID_ARG && k == 2);

    // Decoding: leading space dropped after BOS only; byte tokens are bytes.
    char out[16];
    CHECK(nb_tokenizer_decode_token(t, 1, SPA, out, sizeof out) == 1 && out[0] == 'a');
    CHECK(nb_tokenizer_decode_token(t, A, SPA, out, sizeof out) == 2 && memcmp(out, " a", 2) == 0);
    CHECK(nb_tokenizer_decode_token(t, 1, SP, out, sizeof out) == 0);
    CHECK(nb_tokenizer_decode_token(t, 1, 0x0A + 3, out, sizeof out) == 1 && out[0] == '\n');
    CHECK(nb_tokenizer_decode_token(t, 1, 0x20 + 3, out, sizeof out) == 1 && out[0] == ' ');
    CHECK(nb_tokenizer_decode_token(t, -1, 266, out, sizeof out) == -1);
    CHECK(nb_tokenizer_decode_token(t, -1, -1, out, sizeof out) == -1);
    CHECK(nb_tokenizer_decode_token(t, -1, SPA, out, 1) == -1);
    {
        const char *s = "aab ba\n\xc3\xa9\xe2\x9c\x93 x";
        CHECK(round_trip(t, s, strlen(s)));
    }
    nb_tokenizer_free(&t);
    CHECK(t == NULL);
    nb_tokenizer_free(&t); // NULL-safe
    nb_tokenizer_free(NULL);

    // Truncated inside a record.
    write_file("tokenizer.bin", buf, n - 3);
    st = load_tmp(&t, err, sizeof err);
    CHECKF(st == NB_ERR_FORMAT && t == NULL && strstr(err, "tokenizer.bin"), "%d %s", st, err);
    write_file("tokenizer.bin", buf, 2);
    st = load_tmp(&t, err, sizeof err);
    CHECKF(st == NB_ERR_FORMAT && strstr(err, "tokenizer.bin"), "%d %s", st, err);
    // Cut at a record boundary (the first 100 tokens only): too few for byte fallback.
    size_t cut = 4;
    for (int i = 0; i < 100; i++) {
        int32_t len;
        memcpy(&len, buf + cut + 4, 4);
        cut += 8 + (size_t)len;
    }
    write_file("tokenizer.bin", buf, cut);
    st = load_tmp(&t, err, sizeof err);
    CHECKF(st == NB_ERR_FORMAT && strstr(err, "tokenizer.bin"), "%d %s", st, err);
    remove_file("tokenizer.bin");
}

// ------------------------------------------------------------ HF fixture

// GPT-2's byte -> char map, written independently of the library for the test.
static void gpt2_char(unsigned b, char *out) {
    unsigned cp = b;
    bool self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    if (!self) {
        unsigned n = 0;
        for (unsigned x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp, out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = 0;
    }
}

// A vocab of the 256 byte chars (ids 0..255 = bytes) plus extra tokens
// (ids 256...), merges given as JSON text, added tokens after.
static char *hf_json(const char *model_type, const char *pre_type, const char *extra_vocab,
                     const char *merges) {
    size_t cap = 1 << 16, o = 0;
    char *s = malloc(cap);
    NB_ASSERT(s);
    o += (size_t)snprintf(s + o, cap - o,
                          "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":%d,\"content\":\"<|eot|>\","
                          "\"special\":true}],\"normalizer\":null,"
                          "\"pre_tokenizer\":{\"type\":\"%s\",\"add_prefix_space\":false,"
                          "\"trim_offsets\":true,\"use_regex\":true},"
                          "\"decoder\":{\"type\":\"ByteLevel\"},"
                          "\"model\":{\"type\":\"%s\",\"dropout\":null,\"unk_token\":null,"
                          "\"vocab\":{",
                          300, pre_type, model_type);
    for (unsigned b = 0; b < 256; b++) {
        char c[4];
        gpt2_char(b, c);
        const char *esc = (c[0] == '"' || c[0] == '\\') ? "\\" : "";
        o += (size_t)snprintf(s + o, cap - o, "%s\"%s%s\":%u", b ? "," : "", esc, c, b);
    }
    o += (size_t)snprintf(s + o, cap - o, "%s},\"merges\":%s}}", extra_vocab, merges);
    NB_ASSERT(o < cap);
    return s;
}

static void test_hf_fixture(void) {
    // "\u0120" is GPT-2's char for ' ' (Ġ).
    const char *extra = ",\"\\u0120\\u0120\":256,\"\\u0120b\":257,\"'s\":258,\"aa\":259,\"ab\":260,"
                        "\"aab\":261";
    // Mixed merge forms: "a b" strings and [a, b] pairs.
    const char *merges = "[\"\\u0120 \\u0120\",[\"\\u0120\",\"b\"],[\"'\",\"s\"],\"a a\","
                         "[\"a\",\"b\"],[\"aa\",\"b\"]]";
    char *js = hf_json("BPE", "ByteLevel", extra, merges);
    write_file("tokenizer.json", js, strlen(js));
    free(js);
    char err[512];
    nb_tokenizer *t = NULL;
    nb_status st = load_tmp(&t, err, sizeof err);
    CHECKF(st == NB_OK, "%s", err);
    if (!t) return;
    CHECK(nb_tokenizer_get_kind(t) == NB_TOKENIZER_HF_BPE);
    CHECK(nb_tokenizer_vocab_size(t) == 301);
    CHECK(nb_tokenizer_piece_id(t, "<|eot|>", 7) == 300);
    enum { SPSP = 256, SPB = 257, APS = 258, AA = 259, AB = 260, AAB = 261, EOT = 300 };
    int32_t ids[64], k = -1;
#define ENC(str, ...)                                                                              \
    do {                                                                                           \
        static const int32_t want[] = {__VA_ARGS__};                                               \
        int32_t nw = (int32_t)(sizeof want / sizeof want[0]);                                      \
        CHECK(nb_tokenizer_encode(t, str, sizeof(str) - 1, ids, 64, &k) == NB_OK);                  \
        CHECKF(ids_eq(ids, k, want, nw), "encode \"%s\": got %d ids, first %d", str, k,            \
               k > 0 ? ids[0] : -1);                                                               \
    } while (0)
    // "\s+(?!\S)": a whitespace run before a word leaves its last space to the word.
    ENC("a  b", 'a', ' ', SPB);
    ENC("a   b", 'a', SPSP, SPB);
    ENC("a  ", 'a', SPSP);            // at the end the run stays whole
    ENC("a\n b", 'a', '\n', SPB);     // "\n" alone, " b" together
    ENC("a \nb", 'a', ' ', '\n', 'b'); // ' ' before '\n' is "\s+(?!\S)"
    // Contractions split off; " '" is a punctuation piece.
    ENC("x's", 'x', APS);
    ENC("x 's", 'x', ' ', '\'', 's');
    // Lowest rank first, leftmost first on a tie: "aaab" -> aa | ab.
    ENC("aaab", AA, AB);
    ENC("aab", AAB);
    // Letters, digits, punctuation are separate pieces: "ab1" splits before '1'.
    ENC("ab1!?", AB, '1', '!', '?');
    // Non-ASCII letters join the word; the em dash (punctuation) does not.
    ENC("a\xc3\xa9\xe2\x80\x94", 'a', 0xC3, 0xA9, 0xE2, 0x80, 0x94);
    // Added tokens match literally anywhere, before the pre-tokenizer.
    ENC("ab<|eot|> b<|eot|>", AB, EOT, SPB, EOT);
    ENC("<|eot|", '<', '|', 'e', 'o', 't', '|');
    char out[16];
    CHECK(nb_tokenizer_decode_token(t, -1, SPSP, out, sizeof out) == 2 && memcmp(out, "  ", 2) == 0);
    CHECK(nb_tokenizer_decode_token(t, 1, SPB, out, sizeof out) == 2 && memcmp(out, " b", 2) == 0);
    CHECK(nb_tokenizer_decode_token(t, -1, 0xE2, out, sizeof out) == 1 && (unsigned char)out[0] == 0xE2);
    CHECK(nb_tokenizer_decode_token(t, -1, EOT, out, sizeof out) == 7 && memcmp(out, "<|eot|>", 7) == 0);
    CHECK(nb_tokenizer_decode_token(t, -1, 280, out, sizeof out) == -1); // a hole in the ids
    {
        const char *s = "x's  a\t\tb \n\n 12 caf\xc3\xa9 <|eot|>!!\xf0\x9f\x98\x80";
        CHECK(round_trip(t, s, strlen(s)));
    }
    nb_tokenizer_free(&t);

    // Not JSON.
    write_file("tokenizer.json", "{\"model\": [", 11);
    st = load_tmp(&t, err, sizeof err);
    CHECKF(st == NB_ERR_FORMAT && t == NULL && strstr(err, "tokenizer.json"), "%d %s", st, err);
    // Model type not BPE.
    js = hf_json("WordPiece", "ByteLevel", "", "[]");
    write_file("tokenizer.json", js, strlen(js));
    free(js);
    st = load_tmp(&t, err, sizeof err);
    CHECKF(st == NB_ERR_UNSUPPORTED && strstr(err, "tokenizer.json") && strstr(err, "WordPiece"),
           "%d %s", st, err);
    // Pre-tokenizer not ByteLevel.
    js = hf_json("BPE", "Metaspace", "", "[]");
    write_file("tokenizer.json", js, strlen(js));
    free(js);
    st = load_tmp(&t, err, sizeof err);
    CHECKF(st == NB_ERR_UNSUPPORTED && strstr(err, "tokenizer.json"), "%d %s", st, err);
    // A merge naming an unknown token.
    js = hf_json("BPE", "ByteLevel", "", "[[\"a\",\"zz\"]]");
    write_file("tokenizer.json", js, strlen(js));
    free(js);
    st = load_tmp(&t, err, sizeof err);
    CHECKF(st == NB_ERR_FORMAT && strstr(err, "tokenizer.json"), "%d %s", st, err);
    // tokenizer.json wins over tokenizer.bin: a bad .json is not skipped.
    static char bin[8192];
    size_t nbin = build_l2(bin, sizeof bin, NULL, 0);
    write_file("tokenizer.bin", bin, nbin);
    st = load_tmp(&t, err, sizeof err);
    CHECKF(st == NB_ERR_FORMAT && strstr(err, "tokenizer.json"), "%d %s", st, err);
    remove_file("tokenizer.json");
    st = load_tmp(&t, err, sizeof err);
    CHECKF(st == NB_OK, "%s", err);
    nb_tokenizer_free(&t);
    remove_file("tokenizer.bin");
}

static void test_missing(void) {
    char err[512], dir[300];
    nb_tokenizer *t = (nb_tokenizer *)&err; // must be reset to NULL
    snprintf(dir, sizeof dir, "%s/no_such_dir", g_tmp);
    CHECK(nb_tokenizer_load(dir, &t, err, sizeof err) == NB_ERR_NOT_FOUND);
    CHECK(t == NULL && strstr(err, "no_such_dir") && strstr(err, "tokenizer.json") &&
          strstr(err, "tokenizer.bin"));
    CHECK(nb_tokenizer_load(g_tmp, &t, err, sizeof err) == NB_ERR_NOT_FOUND); // empty dir
    CHECK(nb_tokenizer_load(NULL, &t, err, sizeof err) == NB_ERR_INVALID_ARG);
}

// ------------------------------------------------------------ real tokenizers

static cJSON *parse_json_file(const char *path) {
    char *s = read_file(path, NULL);
    if (!s) return NULL;
    cJSON *j = cJSON_Parse(s);
    free(s);
    return j;
}

static int32_t json_ids(const cJSON *arr, int32_t *ids, int32_t cap) {
    int32_t n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        NB_ASSERT(n < cap);
        ids[n++] = (int32_t)it->valueint;
    }
    return n;
}

static void test_stories260k(const char *shared) {
    char dir[600], path[700], err[512];
    snprintf(dir, sizeof dir, "%s/models/stories260k", shared);
    nb_tokenizer *t = NULL;
    nb_status st = nb_tokenizer_load(dir, &t, err, sizeof err);
    CHECKF(st == NB_OK, "%s", err);
    if (!t) return;
    CHECK(nb_tokenizer_vocab_size(t) == 512);
    CHECK(nb_tokenizer_get_kind(t) == NB_TOKENIZER_LLAMA2C);
    snprintf(path, sizeof path, "%s/golden.json", dir);
    cJSON *g = parse_json_file(path);
    CHECK(g != NULL);
    if (!g) goto out;
    int32_t greedy[1024];
    int32_t ng = json_ids(cJSON_GetObjectItem(g, "greedy_ids"), greedy, 1024);
    const char *gtext = cJSON_GetObjectItem(g, "text")->valuestring;

    // golden.json's "text" is the raw pieces joined: no BOS space rule, byte
    // tokens left as "<0x0A>". Rebuild that from the llama2.c rule: decoded
    // text after BOS == golden text without its leading space and with
    // "<0x0A>" as '\n'.
    char want[4096];
    size_t wl = 0;
    const char *p = gtext[0] == ' ' ? gtext + 1 : gtext;
    while (*p) {
        if (strncmp(p, "<0x0A>", 6) == 0) {
            want[wl++] = '\n';
            p += 6;
        } else {
            want[wl++] = *p++;
        }
    }
    want[wl] = 0;
    size_t dl;
    char *d = decode_all(t, greedy, ng, 1, &dl);
    CHECKF(dl == wl && memcmp(d, want, wl) == 0, "decoded \"%s\"", d);
    printf("stories260k: %d golden ids decode (after BOS) to the golden text with its leading "
           "space dropped and <0x0A> as a newline\n", ng);

    // Encoding the decoded text (dummy prefix restores " Once") gives the ids back.
    int32_t *ids;
    int32_t n = encode_all(t, d, dl, &ids);
    CHECKF(ids_eq(ids, n, greedy, ng), "encode of the golden text: %d ids vs %d", n, ng);
    free(ids);
    free(d);
    CHECK(round_trip(t, want, wl));
    const char *extra = "Tom and Sue went to the zoo. \"Wow!\" said Tom, \xc3\xa9t\xc3\xa9 \xe2\x9c\x93\n\n  x";
    CHECK(round_trip(t, extra, strlen(extra)));
    CHECK(round_trip_random(t, 20000, 1));
    cJSON_Delete(g);
out:
    nb_tokenizer_free(&t);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_proxy_llama(const char *shared) {
    char dir[600], path[700], err[512];
    snprintf(dir, sizeof dir, "%s/models/proxy-llama-31m", shared);
    nb_tokenizer *t = NULL;
    nb_status st = nb_tokenizer_load(dir, &t, err, sizeof err);
    CHECKF(st == NB_OK, "%s", err);
    if (!t) return;
    CHECK(nb_tokenizer_vocab_size(t) == 16000);
    CHECK(nb_tokenizer_piece_id(t, "<|endoftext|>", 13) == 0);
    CHECK(nb_tokenizer_piece_id(t, "<|pad|>", 7) == 1);

    snprintf(path, sizeof path, "%s/training_report.json", dir);
    cJSON *rep = parse_json_file(path);
    CHECK(rep != NULL);
    const cJSON *gold;
    int n_gold = 0;
    cJSON_ArrayForEach(gold, cJSON_GetObjectItem(rep, "golden")) {
        const char *prompt = cJSON_GetObjectItem(gold, "prompt")->valuestring;
        const char *text = cJSON_GetObjectItem(gold, "text")->valuestring;
        int32_t want[256], gen[256];
        int32_t nw = json_ids(cJSON_GetObjectItem(gold, "prompt_ids"), want, 256);
        int32_t ngen = json_ids(cJSON_GetObjectItem(gold, "greedy_fp32_ids"), gen, 256);
        int32_t *ids;
        int32_t n = encode_all(t, prompt, strlen(prompt), &ids);
        CHECKF(ids_eq(ids, n, want, nw), "prompt \"%s\": %d ids vs %d", prompt, n, nw);
        free(ids);
        size_t dl;
        char *d = decode_all(t, want, nw, -1, &dl);
        CHECKF(strcmp(d, prompt) == 0, "prompt ids decode to \"%s\"", d);
        free(d);
        d = decode_all(t, gen, ngen, -1, &dl);
        CHECKF(strcmp(d, text) == 0, "greedy ids decode to \"%s\"", d);
        free(d);
        n_gold++;
    }
    CHECK(n_gold == 3);
    cJSON_Delete(rep);

    // Essays: round trip and speed on 1 MB.
    snprintf(path, sizeof path, "%s/data/paul_graham_essays.json", shared);
    cJSON *ess = parse_json_file(path);
    CHECK(ess != NULL);
    const char *etext = ess ? cJSON_GetObjectItem(ess, "text")->valuestring : NULL;
    if (etext) {
        size_t elen = strlen(etext), mb = 1 << 20;
        if (elen > mb) elen = mb;
        CHECK(round_trip(t, etext, 4096));
        CHECK(round_trip_random(t, 65536, 2));
        int32_t *ids = malloc(sizeof(int32_t) * elen);
        NB_ASSERT(ids);
        int32_t n = 0;
        double best = 1e9;
        for (int rep_i = 0; rep_i < 3; rep_i++) {
            double t0 = now_s();
            st = nb_tokenizer_encode(t, etext, elen, ids, (int32_t)elen, &n);
            double dt = now_s() - t0;
            if (dt < best) best = dt;
        }
        CHECK(st == NB_OK);
        size_t dl;
        char *d = decode_all(t, ids, n, -1, &dl);
        CHECK(dl == elen && memcmp(d, etext, elen) == 0);
        free(d);
        printf("proxy-llama-31m: encode %zu bytes -> %d tokens (%.2f bytes/token) in %.1f ms: "
               "%.1f MB/s; a 128k-token prompt takes ~%.0f ms\n",
               elen, n, (double)elen / n, best * 1e3, (double)elen / best / 1e6,
               best * 1e3 * 131072.0 / n);
        free(ids);
    }
    cJSON_Delete(ess);

    // Spec-Bench questions: every turn round-trips.
    snprintf(path, sizeof path, "%s/data/spec_bench_questions.jsonl", shared);
    char *lines = read_file(path, NULL);
    CHECK(lines != NULL);
    int n_turns = 0, n_ok = 0;
    for (char *line = lines; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        cJSON *q = cJSON_Parse(line);
        const cJSON *turn;
        cJSON_ArrayForEach(turn, cJSON_GetObjectItem(q, "turns")) {
            n_turns++;
            if (round_trip(t, turn->valuestring, strlen(turn->valuestring))) n_ok++;
        }
        cJSON_Delete(q);
        line = nl ? nl + 1 : NULL;
    }
    CHECKF(n_turns > 0 && n_ok == n_turns, "%d of %d turns round-trip", n_ok, n_turns);
    printf("proxy-llama-31m: %d spec-bench turns round-trip\n", n_ok);
    free(lines);
    nb_tokenizer_free(&t);
}

int main(void) {
    const char *tmpdir = getenv("TMPDIR");
    snprintf(g_tmp, sizeof g_tmp, "%s/nb_tok_XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
    NB_ASSERT(mkdtemp(g_tmp));
    test_missing();
    test_llama2c_fixture();
    test_hf_fixture();
    rmdir(g_tmp);

    const char *shared = nb_test_shared_dir();
    char probe[600];
    snprintf(probe, sizeof probe, "%s/models/proxy-llama-31m/tokenizer.json", shared);
    FILE *f = fopen(probe, "rb");
    if (!f) {
        int rc = nb_test_finish("test_tokenizer");
        if (rc) return rc;
        printf("test_tokenizer: real-tokenizer tests skipped: %s not found\n", probe);
        return NB_TEST_SKIP;
    }
    fclose(f);
    test_stories260k(shared);
    test_proxy_llama(shared);
    return nb_test_finish("test_tokenizer");
}
