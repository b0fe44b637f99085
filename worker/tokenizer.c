// tokenizer.c: HF byte-level BPE (tokenizer.json) and llama2.c
// (tokenizer.bin) tokenizers sharing one BPE core.
//
// The one idea: a load turns either vocabulary into a pair table
// (left id, right id) -> (merged id, priority), priority = -rank for HF
// merges and the merged token's score for llama2.c. Encoding seeds one
// symbol per byte (HF) or per UTF-8 character (llama2.c), then pops the best
// adjacent pair from a heap (leftmost first on ties), skipping stale entries.
// That reproduces the reference greedy loops exactly, in O(n log n).
//
// The HF pre-tokenizer is the GPT-2 regex written out by hand:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with \p{L} / \p{N} / \s from a table generated from Unicode data (k_ranges).
#include "tokenizer.h"

#include "nb_status.h"
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#define TOK_VALID 0x1u         // the id has a token
#define TOK_LEADING_SPACE 0x2u // llama2.c: raw piece starts with ' '
#define TOK_MAX_ID (1 << 24)   // ids and merge ranks stay exact in a float

typedef struct pair_slot {
    uint64_t key;   // (uint64)left << 32 | right
    int32_t merged; // -1: empty slot
    float prio;     // higher merges first
} pair_slot;

typedef struct added_token {
    int32_t id;
    uint32_t off, len; // content in added_blob
} added_token;

struct nb_tokenizer {
    nb_tokenizer_kind kind;
    int32_t n_vocab; // ids are [0, n_vocab); holes have flags == 0

    uint8_t *flags;      // [n_vocab] TOK_*
    uint32_t *piece_off; // [n_vocab] into pieces: the piece as stored in the file
    uint32_t *piece_len; // [n_vocab] bytes
    char *pieces;
    uint32_t *text_off; // [n_vocab] into texts: what the token decodes to
    uint32_t *text_len; // [n_vocab] bytes
    char *texts;

    int32_t *str_slots; // open addressing: piece -> id; -1 empty
    uint32_t str_mask;
    pair_slot *pair_slots;
    uint32_t pair_mask;

    int32_t byte_id[256]; // HF: id of each byte's byte-level character

    // HF
    added_token *added;
    int32_t n_added;
    char *added_blob;
    uint8_t added_first[256]; // 1 when some added token starts with this byte
    bool add_prefix_space;
    bool use_regex;
    bool ignore_merges;

    // llama2.c
    int32_t space_id; // id of " " (the dummy prefix), -1 if absent
};

// ---------------------------------------------------------------- helpers

typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf;

static bool sbuf_put(sbuf *b, const void *src, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return false;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
    return true;
}

static nb_status read_whole_file(const char *path, char **out, size_t *out_len, char *err,
                                 size_t err_len) {
    *out = NULL;
    *out_len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        nb_set_err(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        return errno == ENOENT ? NB_ERR_NOT_FOUND : NB_ERR_IO;
    }
    sbuf b = {0};
    char chunk[65536];
    size_t n;
    nb_status st = NB_OK;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (!sbuf_put(&b, chunk, n)) {
            nb_set_err(err, err_len, "%s: out of memory reading the file", path);
            st = NB_ERR_OUT_OF_MEMORY;
            goto out_close;
        }
    }
    if (ferror(f)) {
        nb_set_err(err, err_len, "%s: read error", path);
        st = NB_ERR_IO;
        goto out_close;
    }
    if (!sbuf_put(&b, "", 1)) { // NUL for the JSON parser; not counted
        nb_set_err(err, err_len, "%s: out of memory reading the file", path);
        st = NB_ERR_OUT_OF_MEMORY;
        goto out_close;
    }
    *out = b.p;
    *out_len = b.len - 1;
    b.p = NULL;
out_close:
    free(b.p);
    fclose(f);
    return st;
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; // FNV-1a
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static inline uint32_t hash_pair(uint64_t key) {
    key *= 0x9E3779B97F4A7C15ull;
    return (uint32_t)(key >> 32);
}

static uint32_t table_size_for(size_t n) {
    uint32_t cap = 64;
    while (cap < 2 * n) cap *= 2;
    return cap;
}

static inline const char *tok_piece(const nb_tokenizer *t, int32_t id) {
    return t->pieces + t->piece_off[id];
}

static int32_t str_lookup(const nb_tokenizer *t, const char *s, size_t n) {
    if (!t->str_slots) return -1;
    uint32_t i = (uint32_t)hash_bytes(s, n) & t->str_mask;
    for (;;) {
        int32_t id = t->str_slots[i];
        if (id < 0) return -1;
        if (t->piece_len[id] == n && memcmp(tok_piece(t, id), s, n) == 0) return id;
        i = (i + 1) & t->str_mask;
    }
}

// Indexes every valid token by its piece; on duplicate pieces the lowest id wins.
static bool build_str_table(nb_tokenizer *t) {
    uint32_t cap = table_size_for((size_t)t->n_vocab);
    t->str_slots = malloc(sizeof(int32_t) * cap);
    if (!t->str_slots) return false;
    memset(t->str_slots, 0xff, sizeof(int32_t) * cap);
    t->str_mask = cap - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (!(t->flags[id] & TOK_VALID)) continue;
        const char *s = tok_piece(t, id);
        uint32_t n = t->piece_len[id];
        uint32_t i = (uint32_t)hash_bytes(s, n) & t->str_mask;
        bool dup = false;
        while (t->str_slots[i] >= 0) {
            int32_t o = t->str_slots[i];
            if (t->piece_len[o] == n && memcmp(tok_piece(t, o), s, n) == 0) {
                dup = true;
                break;
            }
            i = (i + 1) & t->str_mask;
        }
        if (!dup) t->str_slots[i] = id;
    }
    return true;
}

static inline const pair_slot *pair_lookup(const nb_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint32_t i = hash_pair(key) & t->pair_mask;
    for (;;) {
        const pair_slot *s = &t->pair_slots[i];
        if (s->merged < 0) return NULL;
        if (s->key == key) return s;
        i = (i + 1) & t->pair_mask;
    }
}

static bool pair_alloc(nb_tokenizer *t, size_t n_max) {
    uint32_t cap = table_size_for(n_max);
    t->pair_slots = malloc(sizeof(pair_slot) * cap);
    if (!t->pair_slots) return false;
    for (uint32_t i = 0; i < cap; i++) t->pair_slots[i].merged = -1;
    t->pair_mask = cap - 1;
    return true;
}

// Inserts unless the pair is present: the first insertion (the lowest HF
// rank) wins. The table was sized for every insertion, so it never fills.
static void pair_insert(nb_tokenizer *t, int32_t a, int32_t b, int32_t merged, float prio) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint32_t i = hash_pair(key) & t->pair_mask;
    while (t->pair_slots[i].merged >= 0) {
        if (t->pair_slots[i].key == key) return;
        i = (i + 1) & t->pair_mask;
    }
    t->pair_slots[i].key = key;
    t->pair_slots[i].merged = merged;
    t->pair_slots[i].prio = prio;
}

static bool alloc_vocab(nb_tokenizer *t, int32_t n) {
    t->n_vocab = n;
    t->flags = calloc((size_t)n, 1);
    t->piece_off = calloc((size_t)n, sizeof(uint32_t));
    t->piece_len = calloc((size_t)n, sizeof(uint32_t));
    t->text_off = calloc((size_t)n, sizeof(uint32_t));
    t->text_len = calloc((size_t)n, sizeof(uint32_t));
    return t->flags && t->piece_off && t->piece_len && t->text_off && t->text_len;
}

void nb_tokenizer_free(nb_tokenizer **tp) {
    if (!tp || !*tp) return;
    nb_tokenizer *t = *tp;
    free(t->flags);
    free(t->piece_off);
    free(t->piece_len);
    free(t->pieces);
    free(t->text_off);
    free(t->text_len);
    free(t->texts);
    free(t->str_slots);
    free(t->pair_slots);
    free(t->added);
    free(t->added_blob);
    free(t);
    *tp = NULL;
}

// ---------------------------------------------------------------- UTF-8

static size_t utf8_put(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

// Decodes one code point at s[0..n); n > 0. An invalid or truncated sequence
// yields its first byte as a code point of length 1 (flagged via *bad).
static uint32_t utf8_get(const unsigned char *s, size_t n, size_t *used, bool *bad) {
    unsigned c = s[0];
    *bad = false;
    if (c < 0x80) {
        *used = 1;
        return c;
    }
    size_t k;
    uint32_t cp, min;
    if ((c & 0xE0) == 0xC0) {
        k = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        k = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        k = 4, cp = c & 0x07, min = 0x10000;
    } else {
        goto bad;
    }
    if (k > n) goto bad;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) goto bad;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) goto bad;
    *used = k;
    return cp;
bad:
    *bad = true;
    *used = 1;
    return c;
}

// GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the
// other 68 bytes to 256 + n in byte order.
static uint32_t byte_to_cp(unsigned b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
    uint32_t n = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
    return 256 + n;
}

// ---------------------------------------------------------------- classes

enum { CL_WS = 0, CL_L = 1, CL_N = 2, CL_O = 3 };

typedef struct cp_range {
    uint32_t lo, hi;
    uint8_t cls;
} cp_range;

// Every non-ASCII code point that is not \p{L} (the default), as sorted
// ranges: White_Space (CL_WS), \p{N} (CL_N), anything else (CL_O: marks,
// punctuation, symbols, controls, unassigned). Generated from the Unicode
// Character Database (14.0.0, via Python's unicodedata) with:
//   ws = White_Space code points; cls(cp) = WS if cp in ws else by the first
//   letter of unicodedata.category(chr(cp)): L -> skip, N -> CL_N, else CL_O;
//   adjacent code points of one class merged into [lo, hi].
// NOTE: HF's regex crate may use a newer Unicode version: characters
// assigned since then count as CL_O here.
static const cp_range k_ranges[] = {
    {0x80, 0x84, CL_O}, {0x85, 0x85, CL_WS}, {0x86, 0x9F, CL_O}, {0xA0, 0xA0, CL_WS},
    {0xA1, 0xA9, CL_O}, {0xAB, 0xB1, CL_O}, {0xB2, 0xB3, CL_N}, {0xB4, 0xB4, CL_O},
    {0xB6, 0xB8, CL_O}, {0xB9, 0xB9, CL_N}, {0xBB, 0xBB, CL_O}, {0xBC, 0xBE, CL_N},
    {0xBF, 0xBF, CL_O}, {0xD7, 0xD7, CL_O}, {0xF7, 0xF7, CL_O}, {0x2C2, 0x2C5, CL_O},
    {0x2D2, 0x2DF, CL_O}, {0x2E5, 0x2EB, CL_O}, {0x2ED, 0x2ED, CL_O}, {0x2EF, 0x36F, CL_O},
    {0x375, 0x375, CL_O}, {0x378, 0x379, CL_O}, {0x37E, 0x37E, CL_O}, {0x380, 0x385, CL_O},
    {0x387, 0x387, CL_O}, {0x38B, 0x38B, CL_O}, {0x38D, 0x38D, CL_O}, {0x3A2, 0x3A2, CL_O},
    {0x3F6, 0x3F6, CL_O}, {0x482, 0x489, CL_O}, {0x530, 0x530, CL_O}, {0x557, 0x558, CL_O},
    {0x55A, 0x55F, CL_O}, {0x589, 0x5CF, CL_O}, {0x5EB, 0x5EE, CL_O}, {0x5F3, 0x61F, CL_O},
    {0x64B, 0x65F, CL_O}, {0x660, 0x669, CL_N}, {0x66A, 0x66D, CL_O}, {0x670, 0x670, CL_O},
    {0x6D4, 0x6D4, CL_O}, {0x6D6, 0x6E4, CL_O}, {0x6E7, 0x6ED, CL_O}, {0x6F0, 0x6F9, CL_N},
    {0x6FD, 0x6FE, CL_O}, {0x700, 0x70F, CL_O}, {0x711, 0x711, CL_O}, {0x730, 0x74C, CL_O},
    {0x7A6, 0x7B0, CL_O}, {0x7B2, 0x7BF, CL_O}, {0x7C0, 0x7C9, CL_N}, {0x7EB, 0x7F3, CL_O},
    {0x7F6, 0x7F9, CL_O}, {0x7FB, 0x7FF, CL_O}, {0x816, 0x819, CL_O}, {0x81B, 0x823, CL_O},
    {0x825, 0x827, CL_O}, {0x829, 0x83F, CL_O}, {0x859, 0x85F, CL_O}, {0x86B, 0x86F, CL_O},
    {0x888, 0x888, CL_O}, {0x88F, 0x89F, CL_O}, {0x8CA, 0x903, CL_O}, {0x93A, 0x93C, CL_O},
    {0x93E, 0x94F, CL_O}, {0x951, 0x957, CL_O}, {0x962, 0x965, CL_O}, {0x966, 0x96F, CL_N},
    {0x970, 0x970, CL_O}, {0x981, 0x984, CL_O}, {0x98D, 0x98E, CL_O}, {0x991, 0x992, CL_O},
    {0x9A9, 0x9A9, CL_O}, {0x9B1, 0x9B1, CL_O}, {0x9B3, 0x9B5, CL_O}, {0x9BA, 0x9BC, CL_O},
    {0x9BE, 0x9CD, CL_O}, {0x9CF, 0x9DB, CL_O}, {0x9DE, 0x9DE, CL_O}, {0x9E2, 0x9E5, CL_O},
    {0x9E6, 0x9EF, CL_N}, {0x9F2, 0x9F3, CL_O}, {0x9F4, 0x9F9, CL_N}, {0x9FA, 0x9FB, CL_O},
    {0x9FD, 0xA04, CL_O}, {0xA0B, 0xA0E, CL_O}, {0xA11, 0xA12, CL_O}, {0xA29, 0xA29, CL_O},
    {0xA31, 0xA31, CL_O}, {0xA34, 0xA34, CL_O}, {0xA37, 0xA37, CL_O}, {0xA3A, 0xA58, CL_O},
    {0xA5D, 0xA5D, CL_O}, {0xA5F, 0xA65, CL_O}, {0xA66, 0xA6F, CL_N}, {0xA70, 0xA71, CL_O},
    {0xA75, 0xA84, CL_O}, {0xA8E, 0xA8E, CL_O}, {0xA92, 0xA92, CL_O}, {0xAA9, 0xAA9, CL_O},
    {0xAB1, 0xAB1, CL_O}, {0xAB4, 0xAB4, CL_O}, {0xABA, 0xABC, CL_O}, {0xABE, 0xACF, CL_O},
    {0xAD1, 0xADF, CL_O}, {0xAE2, 0xAE5, CL_O}, {0xAE6, 0xAEF, CL_N}, {0xAF0, 0xAF8, CL_O},
    {0xAFA, 0xB04, CL_O}, {0xB0D, 0xB0E, CL_O}, {0xB11, 0xB12, CL_O}, {0xB29, 0xB29, CL_O},
    {0xB31, 0xB31, CL_O}, {0xB34, 0xB34, CL_O}, {0xB3A, 0xB3C, CL_O}, {0xB3E, 0xB5B, CL_O},
    {0xB5E, 0xB5E, CL_O}, {0xB62, 0xB65, CL_O}, {0xB66, 0xB6F, CL_N}, {0xB70, 0xB70, CL_O},
    {0xB72, 0xB77, CL_N}, {0xB78, 0xB82, CL_O}, {0xB84, 0xB84, CL_O}, {0xB8B, 0xB8D, CL_O},
    {0xB91, 0xB91, CL_O}, {0xB96, 0xB98, CL_O}, {0xB9B, 0xB9B, CL_O}, {0xB9D, 0xB9D, CL_O},
    {0xBA0, 0xBA2, CL_O}, {0xBA5, 0xBA7, CL_O}, {0xBAB, 0xBAD, CL_O}, {0xBBA, 0xBCF, CL_O},
    {0xBD1, 0xBE5, CL_O}, {0xBE6, 0xBF2, CL_N}, {0xBF3, 0xC04, CL_O}, {0xC0D, 0xC0D, CL_O},
    {0xC11, 0xC11, CL_O}, {0xC29, 0xC29, CL_O}, {0xC3A, 0xC3C, CL_O}, {0xC3E, 0xC57, CL_O},
    {0xC5B, 0xC5C, CL_O}, {0xC5E, 0xC5F, CL_O}, {0xC62, 0xC65, CL_O}, {0xC66, 0xC6F, CL_N},
    {0xC70, 0xC77, CL_O}, {0xC78, 0xC7E, CL_N}, {0xC7F, 0xC7F, CL_O}, {0xC81, 0xC84, CL_O},
    {0xC8D, 0xC8D, CL_O}, {0xC91, 0xC91, CL_O}, {0xCA9, 0xCA9, CL_O}, {0xCB4, 0xCB4, CL_O},
    {0xCBA, 0xCBC, CL_O}, {0xCBE, 0xCDC, CL_O}, {0xCDF, 0xCDF, CL_O}, {0xCE2, 0xCE5, CL_O},
    {0xCE6, 0xCEF, CL_N}, {0xCF0, 0xCF0, CL_O}, {0xCF3, 0xD03, CL_O}, {0xD0D, 0xD0D, CL_O},
    {0xD11, 0xD11, CL_O}, {0xD3B, 0xD3C, CL_O}, {0xD3E, 0xD4D, CL_O}, {0xD4F, 0xD53, CL_O},
    {0xD57, 0xD57, CL_O}, {0xD58, 0xD5E, CL_N}, {0xD62, 0xD65, CL_O}, {0xD66, 0xD78, CL_N},
    {0xD79, 0xD79, CL_O}, {0xD80, 0xD84, CL_O}, {0xD97, 0xD99, CL_O}, {0xDB2, 0xDB2, CL_O},
    {0xDBC, 0xDBC, CL_O}, {0xDBE, 0xDBF, CL_O}, {0xDC7, 0xDE5, CL_O}, {0xDE6, 0xDEF, CL_N},
    {0xDF0, 0xE00, CL_O}, {0xE31, 0xE31, CL_O}, {0xE34, 0xE3F, CL_O}, {0xE47, 0xE4F, CL_O},
    {0xE50, 0xE59, CL_N}, {0xE5A, 0xE80, CL_O}, {0xE83, 0xE83, CL_O}, {0xE85, 0xE85, CL_O},
    {0xE8B, 0xE8B, CL_O}, {0xEA4, 0xEA4, CL_O}, {0xEA6, 0xEA6, CL_O}, {0xEB1, 0xEB1, CL_O},
    {0xEB4, 0xEBC, CL_O}, {0xEBE, 0xEBF, CL_O}, {0xEC5, 0xEC5, CL_O}, {0xEC7, 0xECF, CL_O},
    {0xED0, 0xED9, CL_N}, {0xEDA, 0xEDB, CL_O}, {0xEE0, 0xEFF, CL_O}, {0xF01, 0xF1F, CL_O},
    {0xF20, 0xF33, CL_N}, {0xF34, 0xF3F, CL_O}, {0xF48, 0xF48, CL_O}, {0xF6D, 0xF87, CL_O},
    {0xF8D, 0xFFF, CL_O}, {0x102B, 0x103E, CL_O}, {0x1040, 0x1049, CL_N}, {0x104A, 0x104F, CL_O},
    {0x1056, 0x1059, CL_O}, {0x105E, 0x1060, CL_O}, {0x1062, 0x1064, CL_O}, {0x1067, 0x106D, CL_O},
    {0x1071, 0x1074, CL_O}, {0x1082, 0x108D, CL_O}, {0x108F, 0x108F, CL_O}, {0x1090, 0x1099, CL_N},
    {0x109A, 0x109F, CL_O}, {0x10C6, 0x10C6, CL_O}, {0x10C8, 0x10CC, CL_O}, {0x10CE, 0x10CF, CL_O},
    {0x10FB, 0x10FB, CL_O}, {0x1249, 0x1249, CL_O}, {0x124E, 0x124F, CL_O}, {0x1257, 0x1257, CL_O},
    {0x1259, 0x1259, CL_O}, {0x125E, 0x125F, CL_O}, {0x1289, 0x1289, CL_O}, {0x128E, 0x128F, CL_O},
    {0x12B1, 0x12B1, CL_O}, {0x12B6, 0x12B7, CL_O}, {0x12BF, 0x12BF, CL_O}, {0x12C1, 0x12C1, CL_O},
    {0x12C6, 0x12C7, CL_O}, {0x12D7, 0x12D7, CL_O}, {0x1311, 0x1311, CL_O}, {0x1316, 0x1317, CL_O},
    {0x135B, 0x1368, CL_O}, {0x1369, 0x137C, CL_N}, {0x137D, 0x137F, CL_O}, {0x1390, 0x139F, CL_O},
    {0x13F6, 0x13F7, CL_O}, {0x13FE, 0x1400, CL_O}, {0x166D, 0x166E, CL_O}, {0x1680, 0x1680, CL_WS},
    {0x169B, 0x169F, CL_O}, {0x16EB, 0x16ED, CL_O}, {0x16EE, 0x16F0, CL_N}, {0x16F9, 0x16FF, CL_O},
    {0x1712, 0x171E, CL_O}, {0x1732, 0x173F, CL_O}, {0x1752, 0x175F, CL_O}, {0x176D, 0x176D, CL_O},
    {0x1771, 0x177F, CL_O}, {0x17B4, 0x17D6, CL_O}, {0x17D8, 0x17DB, CL_O}, {0x17DD, 0x17DF, CL_O},
    {0x17E0, 0x17E9, CL_N}, {0x17EA, 0x17EF, CL_O}, {0x17F0, 0x17F9, CL_N}, {0x17FA, 0x180F, CL_O},
    {0x1810, 0x1819, CL_N}, {0x181A, 0x181F, CL_O}, {0x1879, 0x187F, CL_O}, {0x1885, 0x1886, CL_O},
    {0x18A9, 0x18A9, CL_O}, {0x18AB, 0x18AF, CL_O}, {0x18F6, 0x18FF, CL_O}, {0x191F, 0x1945, CL_O},
    {0x1946, 0x194F, CL_N}, {0x196E, 0x196F, CL_O}, {0x1975, 0x197F, CL_O}, {0x19AC, 0x19AF, CL_O},
    {0x19CA, 0x19CF, CL_O}, {0x19D0, 0x19DA, CL_N}, {0x19DB, 0x19FF, CL_O}, {0x1A17, 0x1A1F, CL_O},
    {0x1A55, 0x1A7F, CL_O}, {0x1A80, 0x1A89, CL_N}, {0x1A8A, 0x1A8F, CL_O}, {0x1A90, 0x1A99, CL_N},
    {0x1A9A, 0x1AA6, CL_O}, {0x1AA8, 0x1B04, CL_O}, {0x1B34, 0x1B44, CL_O}, {0x1B4D, 0x1B4F, CL_O},
    {0x1B50, 0x1B59, CL_N}, {0x1B5A, 0x1B82, CL_O}, {0x1BA1, 0x1BAD, CL_O}, {0x1BB0, 0x1BB9, CL_N},
    {0x1BE6, 0x1BFF, CL_O}, {0x1C24, 0x1C3F, CL_O}, {0x1C40, 0x1C49, CL_N}, {0x1C4A, 0x1C4C, CL_O},
    {0x1C50, 0x1C59, CL_N}, {0x1C7E, 0x1C7F, CL_O}, {0x1C89, 0x1C8F, CL_O}, {0x1CBB, 0x1CBC, CL_O},
    {0x1CC0, 0x1CE8, CL_O}, {0x1CED, 0x1CED, CL_O}, {0x1CF4, 0x1CF4, CL_O}, {0x1CF7, 0x1CF9, CL_O},
    {0x1CFB, 0x1CFF, CL_O}, {0x1DC0, 0x1DFF, CL_O}, {0x1F16, 0x1F17, CL_O}, {0x1F1E, 0x1F1F, CL_O},
    {0x1F46, 0x1F47, CL_O}, {0x1F4E, 0x1F4F, CL_O}, {0x1F58, 0x1F58, CL_O}, {0x1F5A, 0x1F5A, CL_O},
    {0x1F5C, 0x1F5C, CL_O}, {0x1F5E, 0x1F5E, CL_O}, {0x1F7E, 0x1F7F, CL_O}, {0x1FB5, 0x1FB5, CL_O},
    {0x1FBD, 0x1FBD, CL_O}, {0x1FBF, 0x1FC1, CL_O}, {0x1FC5, 0x1FC5, CL_O}, {0x1FCD, 0x1FCF, CL_O},
    {0x1FD4, 0x1FD5, CL_O}, {0x1FDC, 0x1FDF, CL_O}, {0x1FED, 0x1FF1, CL_O}, {0x1FF5, 0x1FF5, CL_O},
    {0x1FFD, 0x1FFF, CL_O}, {0x2000, 0x200A, CL_WS}, {0x200B, 0x2027, CL_O},
    {0x2028, 0x2029, CL_WS}, {0x202A, 0x202E, CL_O}, {0x202F, 0x202F, CL_WS},
    {0x2030, 0x205E, CL_O}, {0x205F, 0x205F, CL_WS}, {0x2060, 0x206F, CL_O}, {0x2070, 0x2070, CL_N},
    {0x2072, 0x2073, CL_O}, {0x2074, 0x2079, CL_N}, {0x207A, 0x207E, CL_O}, {0x2080, 0x2089, CL_N},
    {0x208A, 0x208F, CL_O}, {0x209D, 0x2101, CL_O}, {0x2103, 0x2106, CL_O}, {0x2108, 0x2109, CL_O},
    {0x2114, 0x2114, CL_O}, {0x2116, 0x2118, CL_O}, {0x211E, 0x2123, CL_O}, {0x2125, 0x2125, CL_O},
    {0x2127, 0x2127, CL_O}, {0x2129, 0x2129, CL_O}, {0x212E, 0x212E, CL_O}, {0x213A, 0x213B, CL_O},
    {0x2140, 0x2144, CL_O}, {0x214A, 0x214D, CL_O}, {0x214F, 0x214F, CL_O}, {0x2150, 0x2182, CL_N},
    {0x2185, 0x2189, CL_N}, {0x218A, 0x245F, CL_O}, {0x2460, 0x249B, CL_N}, {0x249C, 0x24E9, CL_O},
    {0x24EA, 0x24FF, CL_N}, {0x2500, 0x2775, CL_O}, {0x2776, 0x2793, CL_N}, {0x2794, 0x2BFF, CL_O},
    {0x2CE5, 0x2CEA, CL_O}, {0x2CEF, 0x2CF1, CL_O}, {0x2CF4, 0x2CFC, CL_O}, {0x2CFD, 0x2CFD, CL_N},
    {0x2CFE, 0x2CFF, CL_O}, {0x2D26, 0x2D26, CL_O}, {0x2D28, 0x2D2C, CL_O}, {0x2D2E, 0x2D2F, CL_O},
    {0x2D68, 0x2D6E, CL_O}, {0x2D70, 0x2D7F, CL_O}, {0x2D97, 0x2D9F, CL_O}, {0x2DA7, 0x2DA7, CL_O},
    {0x2DAF, 0x2DAF, CL_O}, {0x2DB7, 0x2DB7, CL_O}, {0x2DBF, 0x2DBF, CL_O}, {0x2DC7, 0x2DC7, CL_O},
    {0x2DCF, 0x2DCF, CL_O}, {0x2DD7, 0x2DD7, CL_O}, {0x2DDF, 0x2E2E, CL_O}, {0x2E30, 0x2FFF, CL_O},
    {0x3000, 0x3000, CL_WS}, {0x3001, 0x3004, CL_O}, {0x3007, 0x3007, CL_N}, {0x3008, 0x3020, CL_O},
    {0x3021, 0x3029, CL_N}, {0x302A, 0x3030, CL_O}, {0x3036, 0x3037, CL_O}, {0x3038, 0x303A, CL_N},
    {0x303D, 0x3040, CL_O}, {0x3097, 0x309C, CL_O}, {0x30A0, 0x30A0, CL_O}, {0x30FB, 0x30FB, CL_O},
    {0x3100, 0x3104, CL_O}, {0x3130, 0x3130, CL_O}, {0x318F, 0x3191, CL_O}, {0x3192, 0x3195, CL_N},
    {0x3196, 0x319F, CL_O}, {0x31C0, 0x31EF, CL_O}, {0x3200, 0x321F, CL_O}, {0x3220, 0x3229, CL_N},
    {0x322A, 0x3247, CL_O}, {0x3248, 0x324F, CL_N}, {0x3250, 0x3250, CL_O}, {0x3251, 0x325F, CL_N},
    {0x3260, 0x327F, CL_O}, {0x3280, 0x3289, CL_N}, {0x328A, 0x32B0, CL_O}, {0x32B1, 0x32BF, CL_N},
    {0x32C0, 0x33FF, CL_O}, {0x4DC0, 0x4DFF, CL_O}, {0xA48D, 0xA4CF, CL_O}, {0xA4FE, 0xA4FF, CL_O},
    {0xA60D, 0xA60F, CL_O}, {0xA620, 0xA629, CL_N}, {0xA62C, 0xA63F, CL_O}, {0xA66F, 0xA67E, CL_O},
    {0xA69E, 0xA69F, CL_O}, {0xA6E6, 0xA6EF, CL_N}, {0xA6F0, 0xA716, CL_O}, {0xA720, 0xA721, CL_O},
    {0xA789, 0xA78A, CL_O}, {0xA7CB, 0xA7CF, CL_O}, {0xA7D2, 0xA7D2, CL_O}, {0xA7D4, 0xA7D4, CL_O},
    {0xA7DA, 0xA7F1, CL_O}, {0xA802, 0xA802, CL_O}, {0xA806, 0xA806, CL_O}, {0xA80B, 0xA80B, CL_O},
    {0xA823, 0xA82F, CL_O}, {0xA830, 0xA835, CL_N}, {0xA836, 0xA83F, CL_O}, {0xA874, 0xA881, CL_O},
    {0xA8B4, 0xA8CF, CL_O}, {0xA8D0, 0xA8D9, CL_N}, {0xA8DA, 0xA8F1, CL_O}, {0xA8F8, 0xA8FA, CL_O},
    {0xA8FC, 0xA8FC, CL_O}, {0xA8FF, 0xA8FF, CL_O}, {0xA900, 0xA909, CL_N}, {0xA926, 0xA92F, CL_O},
    {0xA947, 0xA95F, CL_O}, {0xA97D, 0xA983, CL_O}, {0xA9B3, 0xA9CE, CL_O}, {0xA9D0, 0xA9D9, CL_N},
    {0xA9DA, 0xA9DF, CL_O}, {0xA9E5, 0xA9E5, CL_O}, {0xA9F0, 0xA9F9, CL_N}, {0xA9FF, 0xA9FF, CL_O},
    {0xAA29, 0xAA3F, CL_O}, {0xAA43, 0xAA43, CL_O}, {0xAA4C, 0xAA4F, CL_O}, {0xAA50, 0xAA59, CL_N},
    {0xAA5A, 0xAA5F, CL_O}, {0xAA77, 0xAA79, CL_O}, {0xAA7B, 0xAA7D, CL_O}, {0xAAB0, 0xAAB0, CL_O},
    {0xAAB2, 0xAAB4, CL_O}, {0xAAB7, 0xAAB8, CL_O}, {0xAABE, 0xAABF, CL_O}, {0xAAC1, 0xAAC1, CL_O},
    {0xAAC3, 0xAADA, CL_O}, {0xAADE, 0xAADF, CL_O}, {0xAAEB, 0xAAF1, CL_O}, {0xAAF5, 0xAB00, CL_O},
    {0xAB07, 0xAB08, CL_O}, {0xAB0F, 0xAB10, CL_O}, {0xAB17, 0xAB1F, CL_O}, {0xAB27, 0xAB27, CL_O},
    {0xAB2F, 0xAB2F, CL_O}, {0xAB5B, 0xAB5B, CL_O}, {0xAB6A, 0xAB6F, CL_O}, {0xABE3, 0xABEF, CL_O},
    {0xABF0, 0xABF9, CL_N}, {0xABFA, 0xABFF, CL_O}, {0xD7A4, 0xD7AF, CL_O}, {0xD7C7, 0xD7CA, CL_O},
    {0xD7FC, 0xF8FF, CL_O}, {0xFA6E, 0xFA6F, CL_O}, {0xFADA, 0xFAFF, CL_O}, {0xFB07, 0xFB12, CL_O},
    {0xFB18, 0xFB1C, CL_O}, {0xFB1E, 0xFB1E, CL_O}, {0xFB29, 0xFB29, CL_O}, {0xFB37, 0xFB37, CL_O},
    {0xFB3D, 0xFB3D, CL_O}, {0xFB3F, 0xFB3F, CL_O}, {0xFB42, 0xFB42, CL_O}, {0xFB45, 0xFB45, CL_O},
    {0xFBB2, 0xFBD2, CL_O}, {0xFD3E, 0xFD4F, CL_O}, {0xFD90, 0xFD91, CL_O}, {0xFDC8, 0xFDEF, CL_O},
    {0xFDFC, 0xFE6F, CL_O}, {0xFE75, 0xFE75, CL_O}, {0xFEFD, 0xFF0F, CL_O}, {0xFF10, 0xFF19, CL_N},
    {0xFF1A, 0xFF20, CL_O}, {0xFF3B, 0xFF40, CL_O}, {0xFF5B, 0xFF65, CL_O}, {0xFFBF, 0xFFC1, CL_O},
    {0xFFC8, 0xFFC9, CL_O}, {0xFFD0, 0xFFD1, CL_O}, {0xFFD8, 0xFFD9, CL_O}, {0xFFDD, 0xFFFF, CL_O},
    {0x1000C, 0x1000C, CL_O}, {0x10027, 0x10027, CL_O}, {0x1003B, 0x1003B, CL_O},
    {0x1003E, 0x1003E, CL_O}, {0x1004E, 0x1004F, CL_O}, {0x1005E, 0x1007F, CL_O},
    {0x100FB, 0x10106, CL_O}, {0x10107, 0x10133, CL_N}, {0x10134, 0x1013F, CL_O},
    {0x10140, 0x10178, CL_N}, {0x10179, 0x10189, CL_O}, {0x1018A, 0x1018B, CL_N},
    {0x1018C, 0x1027F, CL_O}, {0x1029D, 0x1029F, CL_O}, {0x102D1, 0x102E0, CL_O},
    {0x102E1, 0x102FB, CL_N}, {0x102FC, 0x102FF, CL_O}, {0x10320, 0x10323, CL_N},
    {0x10324, 0x1032C, CL_O}, {0x10341, 0x10341, CL_N}, {0x1034A, 0x1034A, CL_N},
    {0x1034B, 0x1034F, CL_O}, {0x10376, 0x1037F, CL_O}, {0x1039E, 0x1039F, CL_O},
    {0x103C4, 0x103C7, CL_O}, {0x103D0, 0x103D0, CL_O}, {0x103D1, 0x103D5, CL_N},
    {0x103D6, 0x103FF, CL_O}, {0x1049E, 0x1049F, CL_O}, {0x104A0, 0x104A9, CL_N},
    {0x104AA, 0x104AF, CL_O}, {0x104D4, 0x104D7, CL_O}, {0x104FC, 0x104FF, CL_O},
    {0x10528, 0x1052F, CL_O}, {0x10564, 0x1056F, CL_O}, {0x1057B, 0x1057B, CL_O},
    {0x1058B, 0x1058B, CL_O}, {0x10593, 0x10593, CL_O}, {0x10596, 0x10596, CL_O},
    {0x105A2, 0x105A2, CL_O}, {0x105B2, 0x105B2, CL_O}, {0x105BA, 0x105BA, CL_O},
    {0x105BD, 0x105FF, CL_O}, {0x10737, 0x1073F, CL_O}, {0x10756, 0x1075F, CL_O},
    {0x10768, 0x1077F, CL_O}, {0x10786, 0x10786, CL_O}, {0x107B1, 0x107B1, CL_O},
    {0x107BB, 0x107FF, CL_O}, {0x10806, 0x10807, CL_O}, {0x10809, 0x10809, CL_O},
    {0x10836, 0x10836, CL_O}, {0x10839, 0x1083B, CL_O}, {0x1083D, 0x1083E, CL_O},
    {0x10856, 0x10857, CL_O}, {0x10858, 0x1085F, CL_N}, {0x10877, 0x10878, CL_O},
    {0x10879, 0x1087F, CL_N}, {0x1089F, 0x108A6, CL_O}, {0x108A7, 0x108AF, CL_N},
    {0x108B0, 0x108DF, CL_O}, {0x108F3, 0x108F3, CL_O}, {0x108F6, 0x108FA, CL_O},
    {0x108FB, 0x108FF, CL_N}, {0x10916, 0x1091B, CL_N}, {0x1091C, 0x1091F, CL_O},
    {0x1093A, 0x1097F, CL_O}, {0x109B8, 0x109BB, CL_O}, {0x109BC, 0x109BD, CL_N},
    {0x109C0, 0x109CF, CL_N}, {0x109D0, 0x109D1, CL_O}, {0x109D2, 0x109FF, CL_N},
    {0x10A01, 0x10A0F, CL_O}, {0x10A14, 0x10A14, CL_O}, {0x10A18, 0x10A18, CL_O},
    {0x10A36, 0x10A3F, CL_O}, {0x10A40, 0x10A48, CL_N}, {0x10A49, 0x10A5F, CL_O},
    {0x10A7D, 0x10A7E, CL_N}, {0x10A7F, 0x10A7F, CL_O}, {0x10A9D, 0x10A9F, CL_N},
    {0x10AA0, 0x10ABF, CL_O}, {0x10AC8, 0x10AC8, CL_O}, {0x10AE5, 0x10AEA, CL_O},
    {0x10AEB, 0x10AEF, CL_N}, {0x10AF0, 0x10AFF, CL_O}, {0x10B36, 0x10B3F, CL_O},
    {0x10B56, 0x10B57, CL_O}, {0x10B58, 0x10B5F, CL_N}, {0x10B73, 0x10B77, CL_O},
    {0x10B78, 0x10B7F, CL_N}, {0x10B92, 0x10BA8, CL_O}, {0x10BA9, 0x10BAF, CL_N},
    {0x10BB0, 0x10BFF, CL_O}, {0x10C49, 0x10C7F, CL_O}, {0x10CB3, 0x10CBF, CL_O},
    {0x10CF3, 0x10CF9, CL_O}, {0x10CFA, 0x10CFF, CL_N}, {0x10D24, 0x10D2F, CL_O},
    {0x10D30, 0x10D39, CL_N}, {0x10D3A, 0x10E5F, CL_O}, {0x10E60, 0x10E7E, CL_N},
    {0x10E7F, 0x10E7F, CL_O}, {0x10EAA, 0x10EAF, CL_O}, {0x10EB2, 0x10EFF, CL_O},
    {0x10F1D, 0x10F26, CL_N}, {0x10F28, 0x10F2F, CL_O}, {0x10F46, 0x10F50, CL_O},
    {0x10F51, 0x10F54, CL_N}, {0x10F55, 0x10F6F, CL_O}, {0x10F82, 0x10FAF, CL_O},
    {0x10FC5, 0x10FCB, CL_N}, {0x10FCC, 0x10FDF, CL_O}, {0x10FF7, 0x11002, CL_O},
    {0x11038, 0x11051, CL_O}, {0x11052, 0x1106F, CL_N}, {0x11070, 0x11070, CL_O},
    {0x11073, 0x11074, CL_O}, {0x11076, 0x11082, CL_O}, {0x110B0, 0x110CF, CL_O},
    {0x110E9, 0x110EF, CL_O}, {0x110F0, 0x110F9, CL_N}, {0x110FA, 0x11102, CL_O},
    {0x11127, 0x11135, CL_O}, {0x11136, 0x1113F, CL_N}, {0x11140, 0x11143, CL_O},
    {0x11145, 0x11146, CL_O}, {0x11148, 0x1114F, CL_O}, {0x11173, 0x11175, CL_O},
    {0x11177, 0x11182, CL_O}, {0x111B3, 0x111C0, CL_O}, {0x111C5, 0x111CF, CL_O},
    {0x111D0, 0x111D9, CL_N}, {0x111DB, 0x111DB, CL_O}, {0x111DD, 0x111E0, CL_O},
    {0x111E1, 0x111F4, CL_N}, {0x111F5, 0x111FF, CL_O}, {0x11212, 0x11212, CL_O},
    {0x1122C, 0x1127F, CL_O}, {0x11287, 0x11287, CL_O}, {0x11289, 0x11289, CL_O},
    {0x1128E, 0x1128E, CL_O}, {0x1129E, 0x1129E, CL_O}, {0x112A9, 0x112AF, CL_O},
    {0x112DF, 0x112EF, CL_O}, {0x112F0, 0x112F9, CL_N}, {0x112FA, 0x11304, CL_O},
    {0x1130D, 0x1130E, CL_O}, {0x11311, 0x11312, CL_O}, {0x11329, 0x11329, CL_O},
    {0x11331, 0x11331, CL_O}, {0x11334, 0x11334, CL_O}, {0x1133A, 0x1133C, CL_O},
    {0x1133E, 0x1134F, CL_O}, {0x11351, 0x1135C, CL_O}, {0x11362, 0x113FF, CL_O},
    {0x11435, 0x11446, CL_O}, {0x1144B, 0x1144F, CL_O}, {0x11450, 0x11459, CL_N},
    {0x1145A, 0x1145E, CL_O}, {0x11462, 0x1147F, CL_O}, {0x114B0, 0x114C3, CL_O},
    {0x114C6, 0x114C6, CL_O}, {0x114C8, 0x114CF, CL_O}, {0x114D0, 0x114D9, CL_N},
    {0x114DA, 0x1157F, CL_O}, {0x115AF, 0x115D7, CL_O}, {0x115DC, 0x115FF, CL_O},
    {0x11630, 0x11643, CL_O}, {0x11645, 0x1164F, CL_O}, {0x11650, 0x11659, CL_N},
    {0x1165A, 0x1167F, CL_O}, {0x116AB, 0x116B7, CL_O}, {0x116B9, 0x116BF, CL_O},
    {0x116C0, 0x116C9, CL_N}, {0x116CA, 0x116FF, CL_O}, {0x1171B, 0x1172F, CL_O},
    {0x11730, 0x1173B, CL_N}, {0x1173C, 0x1173F, CL_O}, {0x11747, 0x117FF, CL_O},
    {0x1182C, 0x1189F, CL_O}, {0x118E0, 0x118F2, CL_N}, {0x118F3, 0x118FE, CL_O},
    {0x11907, 0x11908, CL_O}, {0x1190A, 0x1190B, CL_O}, {0x11914, 0x11914, CL_O},
    {0x11917, 0x11917, CL_O}, {0x11930, 0x1193E, CL_O}, {0x11940, 0x11940, CL_O},
    {0x11942, 0x1194F, CL_O}, {0x11950, 0x11959, CL_N}, {0x1195A, 0x1199F, CL_O},
    {0x119A8, 0x119A9, CL_O}, {0x119D1, 0x119E0, CL_O}, {0x119E2, 0x119E2, CL_O},
    {0x119E4, 0x119FF, CL_O}, {0x11A01, 0x11A0A, CL_O}, {0x11A33, 0x11A39, CL_O},
    {0x11A3B, 0x11A4F, CL_O}, {0x11A51, 0x11A5B, CL_O}, {0x11A8A, 0x11A9C, CL_O},
    {0x11A9E, 0x11AAF, CL_O}, {0x11AF9, 0x11BFF, CL_O}, {0x11C09, 0x11C09, CL_O},
    {0x11C2F, 0x11C3F, CL_O}, {0x11C41, 0x11C4F, CL_O}, {0x11C50, 0x11C6C, CL_N},
    {0x11C6D, 0x11C71, CL_O}, {0x11C90, 0x11CFF, CL_O}, {0x11D07, 0x11D07, CL_O},
    {0x11D0A, 0x11D0A, CL_O}, {0x11D31, 0x11D45, CL_O}, {0x11D47, 0x11D4F, CL_O},
    {0x11D50, 0x11D59, CL_N}, {0x11D5A, 0x11D5F, CL_O}, {0x11D66, 0x11D66, CL_O},
    {0x11D69, 0x11D69, CL_O}, {0x11D8A, 0x11D97, CL_O}, {0x11D99, 0x11D9F, CL_O},
    {0x11DA0, 0x11DA9, CL_N}, {0x11DAA, 0x11EDF, CL_O}, {0x11EF3, 0x11FAF, CL_O},
    {0x11FB1, 0x11FBF, CL_O}, {0x11FC0, 0x11FD4, CL_N}, {0x11FD5, 0x11FFF, CL_O},
    {0x1239A, 0x123FF, CL_O}, {0x12400, 0x1246E, CL_N}, {0x1246F, 0x1247F, CL_O},
    {0x12544, 0x12F8F, CL_O}, {0x12FF1, 0x12FFF, CL_O}, {0x1342F, 0x143FF, CL_O},
    {0x14647, 0x167FF, CL_O}, {0x16A39, 0x16A3F, CL_O}, {0x16A5F, 0x16A5F, CL_O},
    {0x16A60, 0x16A69, CL_N}, {0x16A6A, 0x16A6F, CL_O}, {0x16ABF, 0x16ABF, CL_O},
    {0x16AC0, 0x16AC9, CL_N}, {0x16ACA, 0x16ACF, CL_O}, {0x16AEE, 0x16AFF, CL_O},
    {0x16B30, 0x16B3F, CL_O}, {0x16B44, 0x16B4F, CL_O}, {0x16B50, 0x16B59, CL_N},
    {0x16B5A, 0x16B5A, CL_O}, {0x16B5B, 0x16B61, CL_N}, {0x16B62, 0x16B62, CL_O},
    {0x16B78, 0x16B7C, CL_O}, {0x16B90, 0x16E3F, CL_O}, {0x16E80, 0x16E96, CL_N},
    {0x16E97, 0x16EFF, CL_O}, {0x16F4B, 0x16F4F, CL_O}, {0x16F51, 0x16F92, CL_O},
    {0x16FA0, 0x16FDF, CL_O}, {0x16FE2, 0x16FE2, CL_O}, {0x16FE4, 0x16FFF, CL_O},
    {0x187F8, 0x187FF, CL_O}, {0x18CD6, 0x18CFF, CL_O}, {0x18D09, 0x1AFEF, CL_O},
    {0x1AFF4, 0x1AFF4, CL_O}, {0x1AFFC, 0x1AFFC, CL_O}, {0x1AFFF, 0x1AFFF, CL_O},
    {0x1B123, 0x1B14F, CL_O}, {0x1B153, 0x1B163, CL_O}, {0x1B168, 0x1B16F, CL_O},
    {0x1B2FC, 0x1BBFF, CL_O}, {0x1BC6B, 0x1BC6F, CL_O}, {0x1BC7D, 0x1BC7F, CL_O},
    {0x1BC89, 0x1BC8F, CL_O}, {0x1BC9A, 0x1D2DF, CL_O}, {0x1D2E0, 0x1D2F3, CL_N},
    {0x1D2F4, 0x1D35F, CL_O}, {0x1D360, 0x1D378, CL_N}, {0x1D379, 0x1D3FF, CL_O},
    {0x1D455, 0x1D455, CL_O}, {0x1D49D, 0x1D49D, CL_O}, {0x1D4A0, 0x1D4A1, CL_O},
    {0x1D4A3, 0x1D4A4, CL_O}, {0x1D4A7, 0x1D4A8, CL_O}, {0x1D4AD, 0x1D4AD, CL_O},
    {0x1D4BA, 0x1D4BA, CL_O}, {0x1D4BC, 0x1D4BC, CL_O}, {0x1D4C4, 0x1D4C4, CL_O},
    {0x1D506, 0x1D506, CL_O}, {0x1D50B, 0x1D50C, CL_O}, {0x1D515, 0x1D515, CL_O},
    {0x1D51D, 0x1D51D, CL_O}, {0x1D53A, 0x1D53A, CL_O}, {0x1D53F, 0x1D53F, CL_O},
    {0x1D545, 0x1D545, CL_O}, {0x1D547, 0x1D549, CL_O}, {0x1D551, 0x1D551, CL_O},
    {0x1D6A6, 0x1D6A7, CL_O}, {0x1D6C1, 0x1D6C1, CL_O}, {0x1D6DB, 0x1D6DB, CL_O},
    {0x1D6FB, 0x1D6FB, CL_O}, {0x1D715, 0x1D715, CL_O}, {0x1D735, 0x1D735, CL_O},
    {0x1D74F, 0x1D74F, CL_O}, {0x1D76F, 0x1D76F, CL_O}, {0x1D789, 0x1D789, CL_O},
    {0x1D7A9, 0x1D7A9, CL_O}, {0x1D7C3, 0x1D7C3, CL_O}, {0x1D7CC, 0x1D7CD, CL_O},
    {0x1D7CE, 0x1D7FF, CL_N}, {0x1D800, 0x1DEFF, CL_O}, {0x1DF1F, 0x1E0FF, CL_O},
    {0x1E12D, 0x1E136, CL_O}, {0x1E13E, 0x1E13F, CL_O}, {0x1E140, 0x1E149, CL_N},
    {0x1E14A, 0x1E14D, CL_O}, {0x1E14F, 0x1E28F, CL_O}, {0x1E2AE, 0x1E2BF, CL_O},
    {0x1E2EC, 0x1E2EF, CL_O}, {0x1E2F0, 0x1E2F9, CL_N}, {0x1E2FA, 0x1E7DF, CL_O},
    {0x1E7E7, 0x1E7E7, CL_O}, {0x1E7EC, 0x1E7EC, CL_O}, {0x1E7EF, 0x1E7EF, CL_O},
    {0x1E7FF, 0x1E7FF, CL_O}, {0x1E8C5, 0x1E8C6, CL_O}, {0x1E8C7, 0x1E8CF, CL_N},
    {0x1E8D0, 0x1E8FF, CL_O}, {0x1E944, 0x1E94A, CL_O}, {0x1E94C, 0x1E94F, CL_O},
    {0x1E950, 0x1E959, CL_N}, {0x1E95A, 0x1EC70, CL_O}, {0x1EC71, 0x1ECAB, CL_N},
    {0x1ECAC, 0x1ECAC, CL_O}, {0x1ECAD, 0x1ECAF, CL_N}, {0x1ECB0, 0x1ECB0, CL_O},
    {0x1ECB1, 0x1ECB4, CL_N}, {0x1ECB5, 0x1ED00, CL_O}, {0x1ED01, 0x1ED2D, CL_N},
    {0x1ED2E, 0x1ED2E, CL_O}, {0x1ED2F, 0x1ED3D, CL_N}, {0x1ED3E, 0x1EDFF, CL_O},
    {0x1EE04, 0x1EE04, CL_O}, {0x1EE20, 0x1EE20, CL_O}, {0x1EE23, 0x1EE23, CL_O},
    {0x1EE25, 0x1EE26, CL_O}, {0x1EE28, 0x1EE28, CL_O}, {0x1EE33, 0x1EE33, CL_O},
    {0x1EE38, 0x1EE38, CL_O}, {0x1EE3A, 0x1EE3A, CL_O}, {0x1EE3C, 0x1EE41, CL_O},
    {0x1EE43, 0x1EE46, CL_O}, {0x1EE48, 0x1EE48, CL_O}, {0x1EE4A, 0x1EE4A, CL_O},
    {0x1EE4C, 0x1EE4C, CL_O}, {0x1EE50, 0x1EE50, CL_O}, {0x1EE53, 0x1EE53, CL_O},
    {0x1EE55, 0x1EE56, CL_O}, {0x1EE58, 0x1EE58, CL_O}, {0x1EE5A, 0x1EE5A, CL_O},
    {0x1EE5C, 0x1EE5C, CL_O}, {0x1EE5E, 0x1EE5E, CL_O}, {0x1EE60, 0x1EE60, CL_O},
    {0x1EE63, 0x1EE63, CL_O}, {0x1EE65, 0x1EE66, CL_O}, {0x1EE6B, 0x1EE6B, CL_O},
    {0x1EE73, 0x1EE73, CL_O}, {0x1EE78, 0x1EE78, CL_O}, {0x1EE7D, 0x1EE7D, CL_O},
    {0x1EE7F, 0x1EE7F, CL_O}, {0x1EE8A, 0x1EE8A, CL_O}, {0x1EE9C, 0x1EEA0, CL_O},
    {0x1EEA4, 0x1EEA4, CL_O}, {0x1EEAA, 0x1EEAA, CL_O}, {0x1EEBC, 0x1F0FF, CL_O},
    {0x1F100, 0x1F10C, CL_N}, {0x1F10D, 0x1FBEF, CL_O}, {0x1FBF0, 0x1FBF9, CL_N},
    {0x1FBFA, 0x1FFFF, CL_O}, {0x2A6E0, 0x2A6FF, CL_O}, {0x2B739, 0x2B73F, CL_O},
    {0x2B81E, 0x2B81F, CL_O}, {0x2CEA2, 0x2CEAF, CL_O}, {0x2EBE1, 0x2F7FF, CL_O},
    {0x2FA1E, 0x2FFFF, CL_O}, {0x3134B, 0x10FFFF, CL_O},
};

static inline int ascii_class(unsigned c) {
    if ((c | 0x20) - 'a' < 26u) return CL_L;
    if (c - '0' < 10u) return CL_N;
    if (c == ' ' || c - '\t' < 5u) return CL_WS; // \t \n \v \f \r
    return CL_O;
}

static int cp_class(uint32_t cp, bool bad) {
    if (bad) return CL_O;
    if (cp < 128) return ascii_class(cp);
    size_t lo = 0, hi = sizeof k_ranges / sizeof k_ranges[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < k_ranges[mid].lo) hi = mid;
        else if (cp > k_ranges[mid].hi) lo = mid + 1;
        else return k_ranges[mid].cls;
    }
    return CL_L;
}

// Class and length of the code point at s[i] (i < n).
static inline int class_at(const unsigned char *s, size_t i, size_t n, size_t *used) {
    if (s[i] < 0x80) {
        *used = 1;
        return ascii_class(s[i]);
    }
    bool bad;
    uint32_t cp = utf8_get(s + i, n - i, used, &bad);
    return cp_class(cp, bad);
}

// ---------------------------------------------------------------- BPE core

typedef struct sym {
    int32_t id;
    int32_t prev, next; // -1 at the ends
} sym;

typedef struct heap_ent {
    float prio;
    int32_t pos; // left symbol (original index: order of the text)
    int32_t lid, rid, merged;
} heap_ent;

typedef struct scratch {
    sym *syms;
    size_t syms_cap;
    heap_ent *heap;
    size_t heap_cap, heap_n;
    char *buf; // HF: a piece mapped to byte-level characters (ignore_merges)
    size_t buf_cap;
    char *seg; // HF: a segment with its prefix space
    size_t seg_cap;
    bool oom;
} scratch;

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static inline bool heap_before(const heap_ent *a, const heap_ent *b) {
    return a->prio > b->prio || (a->prio == b->prio && a->pos < b->pos);
}

static void heap_push(scratch *s, heap_ent e) {
    // Capacity is reserved by the caller (3 entries per symbol).
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_before(&e, &s->heap[p])) break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = e;
}

static heap_ent heap_pop(scratch *s) {
    heap_ent top = s->heap[0];
    heap_ent last = s->heap[--s->heap_n];
    size_t n = s->heap_n, i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_before(&s->heap[c + 1], &s->heap[c])) c++;
        if (!heap_before(&s->heap[c], &last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n) s->heap[i] = last;
    return top;
}

static inline void try_pair(const nb_tokenizer *t, scratch *s, int32_t left) {
    int32_t right = s->syms[left].next;
    if (right < 0) return;
    const pair_slot *ps = pair_lookup(t, s->syms[left].id, s->syms[right].id);
    if (!ps) return;
    heap_ent e = {ps->prio, left, s->syms[left].id, s->syms[right].id, ps->merged};
    heap_push(s, e);
}

typedef struct out_ids {
    int32_t *ids;
    int32_t cap;
    int64_t n;
} out_ids;

static inline void emit(out_ids *o, int32_t id) {
    if (o->n < o->cap) o->ids[o->n] = id;
    o->n++;
}

// Merges s->syms[0..n) (ids set, list links unset) and emits the result.
static void bpe_run(const nb_tokenizer *t, scratch *s, int32_t n, out_ids *o) {
    if (n == 1) {
        emit(o, s->syms[0].id);
        return;
    }
    for (int32_t i = 0; i < n; i++) {
        s->syms[i].prev = i - 1;
        s->syms[i].next = i + 1 < n ? i + 1 : -1;
    }
    s->heap_n = 0;
    for (int32_t i = 0; i + 1 < n; i++) try_pair(t, s, i);
    while (s->heap_n > 0) {
        heap_ent e = heap_pop(s);
        sym *l = &s->syms[e.pos];
        if (l->id != e.lid || l->next < 0) continue; // stale: left merged or dead
        sym *r = &s->syms[l->next];
        if (r->id != e.rid) continue; // stale: right merged with its right
        // NOTE: ids only ever grow into longer strings, so matching ids mean
        // the pair is exactly the one pushed.
        l->id = e.merged;
        r->id = -1;
        l->next = r->next;
        if (r->next >= 0) s->syms[r->next].prev = e.pos;
        if (l->prev >= 0) try_pair(t, s, l->prev);
        try_pair(t, s, e.pos);
    }
    for (int32_t i = 0; i >= 0; i = s->syms[i].next) emit(o, s->syms[i].id);
}

static bool scratch_reserve(scratch *s, size_t n_syms) {
    if (!grow((void **)&s->syms, &s->syms_cap, n_syms, sizeof(sym)) ||
        !grow((void **)&s->heap, &s->heap_cap, 3 * n_syms + 1, sizeof(heap_ent))) {
        s->oom = true;
        return false;
    }
    return true;
}

// ---------------------------------------------------------------- HF encode

static void hf_emit_piece(const nb_tokenizer *t, scratch *s, const unsigned char *p, size_t n,
                          out_ids *o) {
    if (n == 0) return;
    if (n == 1) {
        emit(o, t->byte_id[p[0]]);
        return;
    }
    if (t->ignore_merges) {
        if (!grow((void **)&s->buf, &s->buf_cap, 2 * n, 1)) {
            s->oom = true;
            return;
        }
        size_t m = 0;
        for (size_t i = 0; i < n; i++) m += utf8_put(byte_to_cp(p[i]), s->buf + m);
        int32_t id = str_lookup(t, s->buf, m);
        if (id >= 0) {
            emit(o, id);
            return;
        }
    }
    if (!scratch_reserve(s, n)) return;
    for (size_t i = 0; i < n; i++) s->syms[i].id = t->byte_id[p[i]];
    bpe_run(t, s, (int32_t)n, o);
}

static inline bool is_letter_after_apos(const unsigned char *s, size_t i, size_t n, size_t *k) {
    // 's 't 're 've 'm 'll 'd (case-sensitive, as GPT-2's pattern)
    if (i + 1 >= n) return false;
    unsigned char a = s[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        *k = 2;
        return true;
    }
    if (i + 2 < n) {
        unsigned char b = s[i + 2];
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
            *k = 3;
            return true;
        }
    }
    return false;
}

// Splits one segment (no added tokens inside) with the GPT-2 pattern.
static void hf_pretokenize(const nb_tokenizer *t, scratch *s, const unsigned char *p, size_t n,
                           out_ids *o) {
    if (!t->use_regex) {
        hf_emit_piece(t, s, p, n, o);
        return;
    }
    size_t i = 0;
    while (i < n && !s->oom) {
        size_t k, u;
        if (p[i] == '\'' && is_letter_after_apos(p, i, n, &k)) {
            hf_emit_piece(t, s, p + i, k, o);
            i += k;
            continue;
        }
        size_t j = i;
        int cl = class_at(p, i, n, &u);
        if (p[i] == ' ' && i + 1 < n) {
            size_t u2;
            int cl2 = class_at(p, i + 1, n, &u2);
            if (cl2 != CL_WS) {
                j = i + 1;
                cl = cl2;
                u = u2;
            }
        }
        if (cl != CL_WS) { // ' ?\p{L}+' | ' ?\p{N}+' | ' ?[^\s\p{L}\p{N}]+'
            j += u;
            while (j < n && class_at(p, j, n, &u) == cl) j += u;
            hf_emit_piece(t, s, p + i, j - i, o);
            i = j;
            continue;
        }
        // '\s+(?!\S)' then '\s+': a whitespace run not at the end leaves its
        // last character to the next token (' ' then joins the word).
        size_t last = i;
        j = i + u;
        while (j < n) {
            if (class_at(p, j, n, &u) != CL_WS) break;
            last = j;
            j += u;
        }
        if (j < n && last > i) j = last;
        hf_emit_piece(t, s, p + i, j - i, o);
        i = j;
    }
}

static void hf_segment(const nb_tokenizer *t, scratch *s, const char *p, size_t n, out_ids *o) {
    if (n == 0) return;
    if (t->add_prefix_space && p[0] != ' ') {
        if (!grow((void **)&s->seg, &s->seg_cap, n + 1, 1)) {
            s->oom = true;
            return;
        }
        s->seg[0] = ' ';
        memcpy(s->seg + 1, p, n);
        hf_pretokenize(t, s, (const unsigned char *)s->seg, n + 1, o);
        return;
    }
    hf_pretokenize(t, s, (const unsigned char *)p, n, o);
}

static void hf_encode(const nb_tokenizer *t, scratch *s, const char *text, size_t len, out_ids *o) {
    size_t seg = 0, i = 0;
    while (i < len && !s->oom) {
        if (t->added_first[(unsigned char)text[i]]) {
            int32_t best = -1;
            uint32_t best_len = 0;
            for (int32_t a = 0; a < t->n_added; a++) {
                const added_token *at = &t->added[a];
                if (at->len > best_len && at->len <= len - i &&
                    memcmp(text + i, t->added_blob + at->off, at->len) == 0) {
                    best = a;
                    best_len = at->len;
                }
            }
            if (best >= 0) {
                hf_segment(t, s, text + seg, i - seg, o);
                emit(o, t->added[best].id);
                i += best_len;
                seg = i;
                continue;
            }
        }
        i++;
    }
    hf_segment(t, s, text + seg, len - seg, o);
}

// ---------------------------------------------------------------- llama2.c encode

static void l2_encode(const nb_tokenizer *t, scratch *s, const char *text, size_t len, out_ids *o) {
    if (len == 0) return;
    if (!scratch_reserve(s, len + 1)) return;
    int32_t n = 0;
    if (t->space_id >= 0) s->syms[n++].id = t->space_id;
    const unsigned char *p = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        // A lead byte plus up to 3 continuation bytes, as llama2.c groups them.
        size_t j = i + 1;
        while (j < len && (p[j] & 0xC0) == 0x80 && j - i < 4) j++;
        int32_t id = str_lookup(t, text + i, j - i);
        if (id >= 0) {
            s->syms[n++].id = id;
        } else {
            for (size_t b = i; b < j; b++) s->syms[n++].id = (int32_t)p[b] + 3;
        }
        i = j;
    }
    bpe_run(t, s, n, o);
}

nb_status nb_tokenizer_encode(const nb_tokenizer *t, const char *text, size_t len, int32_t *ids,
                              int32_t cap, int32_t *n_ids) {
    if (!t || !n_ids || (cap > 0 && !ids) || cap < 0 || (!text && len > 0))
        return NB_ERR_INVALID_ARG;
    *n_ids = 0;
    if (len > (size_t)INT32_MAX / 4) return NB_ERR_INVALID_ARG;
    scratch s = {0};
    out_ids o = {ids, cap, 0};
    if (t->kind == NB_TOKENIZER_HF_BPE) hf_encode(t, &s, text, len, &o);
    else l2_encode(t, &s, text, len, &o);
    bool oom = s.oom;
    free(s.syms);
    free(s.heap);
    free(s.buf);
    free(s.seg);
    if (oom) return NB_ERR_OUT_OF_MEMORY;
    *n_ids = (int32_t)o.n;
    return o.n > cap ? NB_ERR_INVALID_ARG : NB_OK;
}

// ---------------------------------------------------------------- decode

int nb_tokenizer_decode_token(const nb_tokenizer *t, int32_t prev_id, int32_t id, char *buf,
                              size_t cap) {
    if (!t || id < 0 || id >= t->n_vocab || !(t->flags[id] & TOK_VALID)) return -1;
    const char *s = t->texts + t->text_off[id];
    size_t n = t->text_len[id];
    if (t->kind == NB_TOKENIZER_LLAMA2C && prev_id == 1 && (t->flags[id] & TOK_LEADING_SPACE)) {
        s++;
        n--;
    }
    if (n > cap || (n > 0 && !buf) || n > (size_t)INT32_MAX) return -1;
    if (n) memcpy(buf, s, n);
    return (int)n;
}

int32_t nb_tokenizer_vocab_size(const nb_tokenizer *t) { return t ? t->n_vocab : 0; }

nb_tokenizer_kind nb_tokenizer_get_kind(const nb_tokenizer *t) {
    NB_ASSERT(t);
    return t->kind;
}

int32_t nb_tokenizer_piece_id(const nb_tokenizer *t, const char *piece, size_t len) {
    if (!t || (!piece && len)) return -1;
    return str_lookup(t, piece, len);
}

// ---------------------------------------------------------------- llama2.c load

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

// "<0xNN>" -> NN, else -1.
static int byte_piece_value(const char *p, size_t n) {
    if (n != 6 || p[0] != '<' || p[1] != '0' || p[2] != 'x' || p[5] != '>') return -1;
    int h = hexval(p[3]), l = hexval(p[4]);
    return (h < 0 || l < 0) ? -1 : h * 16 + l;
}

static nb_status load_llama2c(nb_tokenizer *t, const char *path, char *err, size_t err_len) {
    char *data;
    size_t size;
    nb_status st = read_whole_file(path, &data, &size, err, err_len);
    if (st != NB_OK) return st;
    sbuf pieces = {0}, texts = {0};
    float *scores = NULL;
    size_t scores_cap = 0;
    int32_t n = 0;
    uint32_t *offs = NULL, *lens = NULL;
    size_t offs_cap = 0, lens_cap = 0;

    t->kind = NB_TOKENIZER_LLAMA2C;
    int32_t max_len;
    if (size < 4) {
        nb_set_err(err, err_len, "%s: truncated: %zu bytes, no header", path, size);
        st = NB_ERR_FORMAT;
        goto out_free;
    }
    memcpy(&max_len, data, 4);
    if (max_len <= 0 || max_len > (1 << 20)) {
        nb_set_err(err, err_len, "%s: bad max_token_length %d", path, max_len);
        st = NB_ERR_FORMAT;
        goto out_free;
    }
    for (size_t o = 4; o < size;) {
        if (size - o < 8) {
            nb_set_err(err, err_len, "%s: truncated in the record of token %d", path, n);
            st = NB_ERR_FORMAT;
            goto out_free;
        }
        float score;
        int32_t len;
        memcpy(&score, data + o, 4);
        memcpy(&len, data + o + 4, 4);
        o += 8;
        if (len < 0 || len > max_len) {
            nb_set_err(err, err_len, "%s: token %d has length %d (max_token_length %d)", path, n,
                    len, max_len);
            st = NB_ERR_FORMAT;
            goto out_free;
        }
        if (size - o < (size_t)len) {
            nb_set_err(err, err_len, "%s: truncated in the bytes of token %d", path, n);
            st = NB_ERR_FORMAT;
            goto out_free;
        }
        if (n >= TOK_MAX_ID) {
            nb_set_err(err, err_len, "%s: more than %d tokens", path, TOK_MAX_ID);
            st = NB_ERR_FORMAT;
            goto out_free;
        }
        if (!grow((void **)&scores, &scores_cap, (size_t)n + 1, sizeof(float)) ||
            !grow((void **)&offs, &offs_cap, (size_t)n + 1, sizeof(uint32_t)) ||
            !grow((void **)&lens, &lens_cap, (size_t)n + 1, sizeof(uint32_t)) ||
            !sbuf_put(&pieces, data + o, (size_t)len)) {
            st = NB_ERR_OUT_OF_MEMORY;
            goto out_oom;
        }
        scores[n] = score;
        offs[n] = (uint32_t)(pieces.len - (size_t)len);
        lens[n] = (uint32_t)len;
        n++;
        o += (size_t)len;
    }
    // NOTE: the file does not store its token count; a file cut at a record
    // boundary is caught by the byte-token check below when it lost any of
    // ids 0..258.
    if (n < 3 + 256) {
        nb_set_err(err, err_len, "%s: %d tokens, fewer than the 259 that byte fallback needs "
                "(truncated?)", path, n);
        st = NB_ERR_FORMAT;
        goto out_free;
    }
    for (int b = 0; b < 256; b++) {
        if (byte_piece_value(pieces.p + offs[b + 3], lens[b + 3]) != b) {
            nb_set_err(err, err_len, "%s: token %d is not the byte token <0x%02X>", path, b + 3, b);
            st = NB_ERR_FORMAT;
            goto out_free;
        }
    }
    if (!alloc_vocab(t, n)) goto out_oom;
    for (int32_t id = 0; id < n; id++) {
        const char *p = pieces.p + offs[id];
        size_t len = lens[id];
        t->flags[id] = TOK_VALID | (len > 0 && p[0] == ' ' ? TOK_LEADING_SPACE : 0);
        t->piece_off[id] = offs[id];
        t->piece_len[id] = lens[id];
        t->text_off[id] = (uint32_t)texts.len;
        int bv = byte_piece_value(p, len);
        char byte = (char)bv;
        bool ok = bv >= 0 ? sbuf_put(&texts, &byte, 1) : sbuf_put(&texts, p, len);
        if (!ok) goto out_oom;
        t->text_len[id] = (uint32_t)(texts.len - t->text_off[id]);
    }
    t->pieces = pieces.p;
    pieces.p = NULL;
    t->texts = texts.p ? texts.p : calloc(1, 1);
    texts.p = NULL;
    if (!t->texts || !build_str_table(t)) goto out_oom;
    t->space_id = str_lookup(t, " ", 1);

    // Every way to split a token into two tokens is a merge scored by the
    // token: that is llama2.c's "concatenation is in the vocab" test.
    size_t n_pairs = 0;
    for (int32_t id = 0; id < n; id++)
        if (t->piece_len[id] > 1) n_pairs += t->piece_len[id] - 1;
    if (!pair_alloc(t, n_pairs)) goto out_oom;
    for (int32_t id = 0; id < n; id++) {
        const char *p = tok_piece(t, id);
        uint32_t len = t->piece_len[id];
        if (str_lookup(t, p, len) != id) continue; // a duplicate piece
        for (uint32_t k = 1; k < len; k++) {
            int32_t a = str_lookup(t, p, k), b = str_lookup(t, p + k, len - k);
            if (a >= 0 && b >= 0) pair_insert(t, a, b, id, scores[id]);
        }
    }
    st = NB_OK;
    goto out_free;
out_oom:
    nb_set_err(err, err_len, "%s: out of memory", path);
    st = NB_ERR_OUT_OF_MEMORY;
out_free:
    free(pieces.p);
    free(texts.p);
    free(scores);
    free(offs);
    free(lens);
    free(data);
    return st;
}

// ---------------------------------------------------------------- HF load

static bool json_is_null_or_absent(const cJSON *j) { return !j || cJSON_IsNull(j); }

// Decodes a byte-level piece (chars of the GPT-2 map) back to bytes;
// characters outside the map are kept as UTF-8.
static bool bytelevel_decode(const int16_t *inv, const char *p, size_t n, sbuf *out) {
    size_t i = 0;
    while (i < n) {
        size_t u;
        bool bad;
        uint32_t cp = utf8_get((const unsigned char *)p + i, n - i, &u, &bad);
        if (!bad && cp < 512 && inv[cp] >= 0) {
            char b = (char)inv[cp];
            if (!sbuf_put(out, &b, 1)) return false;
        } else if (!sbuf_put(out, p + i, u)) {
            return false;
        }
        i += u;
    }
    return true;
}

static nb_status load_hf(nb_tokenizer *t, const char *path, char *err, size_t err_len) {
    char *data;
    size_t size;
    nb_status st = read_whole_file(path, &data, &size, err, err_len);
    if (st != NB_OK) return st;
    sbuf pieces = {0}, texts = {0}, added = {0};
    cJSON *root = cJSON_ParseWithLength(data, size);
    t->kind = NB_TOKENIZER_HF_BPE;
    if (!root || !cJSON_IsObject(root)) {
        nb_set_err(err, err_len, "%s: not a JSON object (parse error)", path);
        st = NB_ERR_FORMAT;
        goto out_free;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) {
        nb_set_err(err, err_len, "%s: no \"model\" object", path);
        st = NB_ERR_FORMAT;
        goto out_free;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (type && !(cJSON_IsString(type) && strcmp(type->valuestring, "BPE") == 0)) {
        nb_set_err(err, err_len, "%s: model type %s is not supported (only BPE)", path,
                cJSON_IsString(type) ? type->valuestring : "(not a string)");
        st = NB_ERR_UNSUPPORTED;
        goto out_free;
    }
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges)) {
        nb_set_err(err, err_len, "%s: model lacks a \"vocab\" object or a \"merges\" array", path);
        st = NB_ERR_FORMAT;
        goto out_free;
    }
    static const char *const k_unsupported_opts[] = {"continuing_subword_prefix",
                                                     "end_of_word_suffix"};
    for (size_t i = 0; i < 2; i++) {
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(model, k_unsupported_opts[i]);
        if (!json_is_null_or_absent(o) && !(cJSON_IsString(o) && o->valuestring[0] == 0)) {
            nb_set_err(err, err_len, "%s: BPE %s is not supported", path, k_unsupported_opts[i]);
            st = NB_ERR_UNSUPPORTED;
            goto out_free;
        }
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"))) {
        nb_set_err(err, err_len, "%s: BPE byte_fallback is not supported", path);
        st = NB_ERR_UNSUPPORTED;
        goto out_free;
    }
    t->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    if (!json_is_null_or_absent(cJSON_GetObjectItemCaseSensitive(root, "normalizer"))) {
        nb_set_err(err, err_len, "%s: normalizers are not supported", path);
        st = NB_ERR_UNSUPPORTED;
        goto out_free;
    }
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *pre_type = cJSON_GetObjectItemCaseSensitive(pre, "type");
    if (!cJSON_IsString(pre_type) || strcmp(pre_type->valuestring, "ByteLevel") != 0) {
        nb_set_err(err, err_len, "%s: pre_tokenizer %s is not supported (only ByteLevel)", path,
                cJSON_IsString(pre_type) ? pre_type->valuestring : "(none)");
        st = NB_ERR_UNSUPPORTED;
        goto out_free;
    }
    const cJSON *aps = cJSON_GetObjectItemCaseSensitive(pre, "add_prefix_space");
    const cJSON *ure = cJSON_GetObjectItemCaseSensitive(pre, "use_regex");
    t->add_prefix_space = aps ? cJSON_IsTrue(aps) : true; // HF defaults
    t->use_regex = ure ? cJSON_IsTrue(ure) : true;

    // Ids: the vocab, then added tokens (which may extend it).
    int32_t max_id = -1;
    const cJSON *added_tokens = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (added_tokens && !cJSON_IsArray(added_tokens)) {
        nb_set_err(err, err_len, "%s: \"added_tokens\" is not an array", path);
        st = NB_ERR_FORMAT;
        goto out_free;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= TOK_MAX_ID ||
            it->valuedouble != (double)it->valueint) {
            nb_set_err(err, err_len, "%s: vocab entry \"%s\" has a bad id", path, it->string);
            st = NB_ERR_FORMAT;
            goto out_free;
        }
        if (it->valueint > max_id) max_id = it->valueint;
    }
    cJSON_ArrayForEach(it, added_tokens) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= TOK_MAX_ID ||
            !cJSON_IsString(content) || content->valuestring[0] == 0) {
            nb_set_err(err, err_len, "%s: an added token lacks an id or content", path);
            st = NB_ERR_FORMAT;
            goto out_free;
        }
        if (id->valueint > max_id) max_id = id->valueint;
    }
    if (max_id < 0) {
        nb_set_err(err, err_len, "%s: empty vocab", path);
        st = NB_ERR_FORMAT;
        goto out_free;
    }
    if (!alloc_vocab(t, max_id + 1)) goto out_oom;
    cJSON_ArrayForEach(it, vocab) {
        int32_t id = it->valueint;
        if (t->flags[id] & TOK_VALID) {
            nb_set_err(err, err_len, "%s: vocab id %d appears twice", path, id);
            st = NB_ERR_FORMAT;
            goto out_free;
        }
        size_t n = strlen(it->string);
        t->flags[id] = TOK_VALID;
        t->piece_off[id] = (uint32_t)pieces.len;
        t->piece_len[id] = (uint32_t)n;
        if (!sbuf_put(&pieces, it->string, n)) goto out_oom;
    }
    int32_t n_added = cJSON_GetArraySize(added_tokens);
    if (n_added > 0) {
        t->added = calloc((size_t)n_added, sizeof(added_token));
        if (!t->added) goto out_oom;
    }
    bool *is_added = calloc((size_t)t->n_vocab, sizeof(bool));
    if (!is_added) goto out_oom;
    cJSON_ArrayForEach(it, added_tokens) {
        int32_t id = cJSON_GetObjectItemCaseSensitive(it, "id")->valueint;
        const char *c = cJSON_GetObjectItemCaseSensitive(it, "content")->valuestring;
        size_t n = strlen(c);
        added_token *at = &t->added[t->n_added++];
        at->id = id;
        at->off = (uint32_t)added.len;
        at->len = (uint32_t)n;
        t->added_first[(unsigned char)c[0]] = 1;
        is_added[id] = true;
        t->flags[id] = TOK_VALID;
        t->piece_off[id] = (uint32_t)pieces.len;
        t->piece_len[id] = (uint32_t)n;
        if (!sbuf_put(&added, c, n) || !sbuf_put(&pieces, c, n)) {
            free(is_added);
            goto out_oom;
        }
    }
    t->added_blob = added.p;
    added.p = NULL;
    t->pieces = pieces.p ? pieces.p : calloc(1, 1);
    pieces.p = NULL;
    if (!t->pieces || !build_str_table(t)) {
        free(is_added);
        goto out_oom;
    }

    // Decoded texts: added tokens verbatim, the rest through the inverse map.
    int16_t inv[512];
    for (int i = 0; i < 512; i++) inv[i] = -1;
    for (unsigned b = 0; b < 256; b++) inv[byte_to_cp(b)] = (int16_t)b;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        t->text_off[id] = (uint32_t)texts.len;
        if (!(t->flags[id] & TOK_VALID)) continue;
        const char *p = tok_piece(t, id);
        bool ok = is_added[id] ? sbuf_put(&texts, p, t->piece_len[id])
                               : bytelevel_decode(inv, p, t->piece_len[id], &texts);
        if (!ok) {
            free(is_added);
            goto out_oom;
        }
        t->text_len[id] = (uint32_t)(texts.len - t->text_off[id]);
    }
    free(is_added);
    t->texts = texts.p ? texts.p : calloc(1, 1);
    texts.p = NULL;
    if (!t->texts) goto out_oom;

    for (unsigned b = 0; b < 256; b++) {
        char u[4];
        size_t n = utf8_put(byte_to_cp(b), u);
        t->byte_id[b] = str_lookup(t, u, n);
        if (t->byte_id[b] < 0) {
            nb_set_err(err, err_len, "%s: vocab lacks the byte-level token of byte 0x%02X", path, b);
            st = NB_ERR_FORMAT;
            goto out_free;
        }
    }

    int32_t n_merges = cJSON_GetArraySize(merges);
    if (n_merges >= TOK_MAX_ID) {
        nb_set_err(err, err_len, "%s: too many merges (%d)", path, n_merges);
        st = NB_ERR_FORMAT;
        goto out_free;
    }
    if (!pair_alloc(t, (size_t)n_merges)) goto out_oom;
    sbuf cat = {0};
    int32_t rank = 0;
    cJSON_ArrayForEach(it, merges) {
        const char *a, *b;
        size_t na, nb;
        if (cJSON_IsString(it)) { // older files: "a b"
            const char *sp = strchr(it->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' ')) goto bad_merge;
            a = it->valuestring, na = (size_t)(sp - a);
            b = sp + 1, nb = strlen(b);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            a = cJSON_GetArrayItem(it, 0)->valuestring, na = strlen(a);
            b = cJSON_GetArrayItem(it, 1)->valuestring, nb = strlen(b);
        } else {
            goto bad_merge;
        }
        int32_t ia = str_lookup(t, a, na), ib = str_lookup(t, b, nb);
        cat.len = 0;
        if (!sbuf_put(&cat, a, na) || !sbuf_put(&cat, b, nb)) {
            free(cat.p);
            goto out_oom;
        }
        int32_t im = str_lookup(t, cat.p, cat.len);
        if (ia < 0 || ib < 0 || im < 0) {
            nb_set_err(err, err_len, "%s: merge %d (\"%.*s\" \"%.*s\") names a token not in the vocab",
                    path, rank, (int)na, a, (int)nb, b);
            free(cat.p);
            st = NB_ERR_FORMAT;
            goto out_free;
        }
        pair_insert(t, ia, ib, im, -(float)rank);
        rank++;
        continue;
    bad_merge:
        nb_set_err(err, err_len, "%s: merge %d is neither \"a b\" nor [\"a\", \"b\"]", path, rank);
        free(cat.p);
        st = NB_ERR_FORMAT;
        goto out_free;
    }
    free(cat.p);
    t->space_id = -1;
    st = NB_OK;
    goto out_free;
out_oom:
    nb_set_err(err, err_len, "%s: out of memory", path);
    st = NB_ERR_OUT_OF_MEMORY;
out_free:
    cJSON_Delete(root);
    free(pieces.p);
    free(texts.p);
    free(added.p);
    free(data);
    return st;
}

// ---------------------------------------------------------------- load

static bool file_exists(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f) {
        fclose(f);
        return true;
    }
    return errno != ENOENT; // unreadable: report it from the loader
}

nb_status nb_tokenizer_load(const char *dir, nb_tokenizer **out, char *err, size_t err_len) {
    if (out) *out = NULL;
    if (!dir || !out) {
        nb_set_err(err, err_len, "nb_tokenizer_load: NULL argument");
        return NB_ERR_INVALID_ARG;
    }
    size_t dl = strlen(dir);
    char *path = malloc(dl + 32);
    if (!path) {
        nb_set_err(err, err_len, "%s: out of memory", dir);
        return NB_ERR_OUT_OF_MEMORY;
    }
    nb_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        nb_set_err(err, err_len, "%s: out of memory", dir);
        free(path);
        return NB_ERR_OUT_OF_MEMORY;
    }
    nb_status st;
    snprintf(path, dl + 32, "%s/tokenizer.json", dir);
    if (file_exists(path)) {
        st = load_hf(t, path, err, err_len);
    } else {
        snprintf(path, dl + 32, "%s/tokenizer.bin", dir);
        if (file_exists(path)) {
            st = load_llama2c(t, path, err, err_len);
        } else {
            nb_set_err(err, err_len, "%s: neither tokenizer.json nor tokenizer.bin exists", dir);
            st = NB_ERR_NOT_FOUND;
        }
    }
    free(path);
    if (st != NB_OK) {
        nb_tokenizer_free(&t);
        return st;
    }
    *out = t;
    return NB_OK;
}
