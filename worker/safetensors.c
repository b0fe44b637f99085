// safetensors.c: mmap + header validation for .safetensors files, and the
// sharded-set lookup (index.json weight_map -> shard file).
//
// All validation happens in nb_st_open(): after it succeeds, every tensor's
// [data, data + nbytes) lies inside the mapping. Numbers in the JSON header
// arrive as doubles (cJSON), so integers are accepted only up to 2^53.
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

struct nb_st_file {
    char *path;
    void *map;       // the whole file, PROT_READ
    size_t map_len;  // file size, bytes
    cJSON *header;   // parsed header; owns tensor names and metadata strings
    const cJSON *meta; // __metadata__ object or NULL
    nb_st_tensor *tensors; // [n_tensors], sorted by name
    int n_tensors;
};

// One weight_map entry: tensor name -> index into nb_st_set.files.
typedef struct st_map_entry {
    const char *name; // owned by nb_st_set.index
    int file;
} st_map_entry;

struct nb_st_set {
    char *source;        // the index path when sharded, else the single file's path
    nb_st_file **files;  // [n_files]
    int n_files;
    cJSON *index;        // NULL when not sharded
    st_map_entry *map;   // [n_map], sorted by name; NULL when not sharded
    int n_map;
};

static nb_status set_err(char *err, size_t err_len, nb_status st, const char *fmt, ...) {
    if (err && err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return st;
}

static char *str_dup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

// dir + "/" + name, malloc'd.
static char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static void line_col(const char *s, size_t off, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off; i++) {
        if (s[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

typedef struct st_dtype_info {
    const char *name;
    size_t size;
    bool supported;
    nb_dtype dtype;
} st_dtype_info;

// Every dtype of the safetensors spec with a whole-byte element size.
static const st_dtype_info st_dtypes[] = {
    {"F32", 4, true, NB_DTYPE_F32},  {"F16", 2, true, NB_DTYPE_F16},
    {"BF16", 2, true, NB_DTYPE_BF16}, {"F64", 8, false, NB_DTYPE_F32},
    {"I64", 8, false, NB_DTYPE_F32}, {"U64", 8, false, NB_DTYPE_F32},
    {"I32", 4, false, NB_DTYPE_F32}, {"U32", 4, false, NB_DTYPE_F32},
    {"I16", 2, false, NB_DTYPE_F32}, {"U16", 2, false, NB_DTYPE_F32},
    {"I8", 1, false, NB_DTYPE_F32},  {"U8", 1, false, NB_DTYPE_F32},
    {"BOOL", 1, false, NB_DTYPE_F32}, {"F8_E4M3", 1, false, NB_DTYPE_F32},
    {"F8_E5M2", 1, false, NB_DTYPE_F32}, {"F8_E8M0", 1, false, NB_DTYPE_F32},
};

static const st_dtype_info *dtype_lookup(const char *s) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (!strcmp(st_dtypes[i].name, s)) return &st_dtypes[i];
    return NULL;
}

// A JSON number that is an integer in [0, 2^53]; *neg set when it is a
// negative integer (so callers can say "before the data section").
static bool json_u64(const cJSON *it, uint64_t *out, bool *neg) {
    if (neg) *neg = false;
    if (!cJSON_IsNumber(it)) return false;
    double v = it->valuedouble;
    if (!(v == floor(v))) return false;
    if (v < 0) {
        if (neg) *neg = true;
        return false;
    }
    if (v > 9007199254740992.0) return false;
    *out = (uint64_t)v;
    return true;
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const nb_st_tensor *)a)->name, ((const nb_st_tensor *)b)->name);
}

static int cmp_tensor_ptr_offset(const void *a, const void *b) {
    const nb_st_tensor *x = *(const nb_st_tensor *const *)a;
    const nb_st_tensor *y = *(const nb_st_tensor *const *)b;
    return x->file_offset < y->file_offset ? -1 : x->file_offset > y->file_offset;
}

// Validate one header entry and fill *t. data_start: file offset of the data
// section; data_len: its length in bytes.
static nb_status parse_entry(const char *path, const cJSON *e, const uint8_t *base,
                             uint64_t data_start, uint64_t data_len, nb_st_tensor *t, char *err,
                             size_t err_len) {
    const char *name = e->string;
    if (!cJSON_IsObject(e))
        return set_err(err, err_len, NB_ERR_FORMAT, "%s: header entry \"%s\" is not an object",
                       path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt))
        return set_err(err, err_len, NB_ERR_FORMAT, "%s: tensor \"%s\" has no string \"dtype\"",
                       path, name);
    const st_dtype_info *di = dtype_lookup(dt->valuestring);
    if (!di)
        return set_err(err, err_len, NB_ERR_UNSUPPORTED,
                       "%s: tensor \"%s\" has unknown dtype \"%s\" (supported: F32, F16, BF16)",
                       path, name, dt->valuestring);
    if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > NB_ST_MAX_DIMS)
        return set_err(err, err_len, NB_ERR_FORMAT,
                       "%s: tensor \"%s\": \"shape\" must be a list of at most %d integers",
                       path, name, NB_ST_MAX_DIMS);
    memset(t, 0, sizeof *t);
    t->name = name;
    t->dtype_name = dt->valuestring;
    t->dtype_supported = di->supported;
    t->dtype = di->dtype;
    t->elem_size = di->size;
    t->ndim = cJSON_GetArraySize(shape);
    int64_t numel = 1;
    for (int d = 0; d < NB_ST_MAX_DIMS; d++) t->shape[d] = 1;
    for (int d = 0; d < t->ndim; d++) {
        uint64_t v;
        if (!json_u64(cJSON_GetArrayItem(shape, d), &v, NULL) || v > (uint64_t)INT64_MAX)
            return set_err(err, err_len, NB_ERR_FORMAT,
                           "%s: tensor \"%s\": shape[%d] is not a non-negative integer", path,
                           name, d);
        t->shape[d] = (int64_t)v;
        if (__builtin_mul_overflow(numel, (int64_t)v, &numel))
            return set_err(err, err_len, NB_ERR_FORMAT,
                           "%s: tensor \"%s\": element count overflows 64 bits", path, name);
    }
    t->numel = numel;
    uint64_t nbytes;
    if (__builtin_mul_overflow((uint64_t)numel, (uint64_t)di->size, &nbytes) ||
        nbytes > SIZE_MAX)
        return set_err(err, err_len, NB_ERR_FORMAT,
                       "%s: tensor \"%s\": byte size overflows 64 bits", path, name);
    t->nbytes = (size_t)nbytes;

    uint64_t begin, end;
    bool neg0 = false, neg1 = false;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
        return set_err(err, err_len, NB_ERR_FORMAT,
                       "%s: tensor \"%s\": \"data_offsets\" must be [begin, end]", path, name);
    bool ok0 = json_u64(cJSON_GetArrayItem(offs, 0), &begin, &neg0);
    bool ok1 = json_u64(cJSON_GetArrayItem(offs, 1), &end, &neg1);
    if (neg0 || neg1)
        return set_err(err, err_len, NB_ERR_FORMAT,
                       "%s: tensor \"%s\": data_offsets are negative: they would point "
                       "before the data section, into the header",
                       path, name);
    if (!ok0 || !ok1)
        return set_err(err, err_len, NB_ERR_FORMAT,
                       "%s: tensor \"%s\": data_offsets are not non-negative integers", path,
                       name);
    if (begin > end)
        return set_err(err, err_len, NB_ERR_FORMAT,
                       "%s: tensor \"%s\": data_offsets [%llu, %llu) end before they begin",
                       path, name, (unsigned long long)begin, (unsigned long long)end);
    if (end > data_len)
        return set_err(err, err_len, NB_ERR_FORMAT,
                       "%s: tensor \"%s\": data_offsets [%llu, %llu) extend beyond the data "
                       "section (%llu bytes): file truncated?",
                       path, name, (unsigned long long)begin, (unsigned long long)end,
                       (unsigned long long)data_len);
    if (end - begin != nbytes)
        return set_err(err, err_len, NB_ERR_FORMAT,
                       "%s: tensor \"%s\": data_offsets [%llu, %llu) hold %llu bytes, expected "
                       "%llu (%lld elements of %s)",
                       path, name, (unsigned long long)begin, (unsigned long long)end,
                       (unsigned long long)(end - begin), (unsigned long long)nbytes,
                       (long long)numel, dt->valuestring);
    t->file_offset = data_start + begin;
    t->data = base + data_start + begin;
    return NB_OK;
}

nb_status nb_st_open(const char *path, nb_st_file **out, char *err, size_t err_len) {
    if (err && err_len) err[0] = '\0';
    if (!path || !out)
        return set_err(err, err_len, NB_ERR_INVALID_ARG, "nb_st_open: NULL argument");
    *out = NULL;
    nb_status st = NB_OK;
    nb_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = str_dup(path))) {
        st = set_err(err, err_len, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        goto out_free_f;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        st = set_err(err, err_len, errno == ENOENT ? NB_ERR_NOT_FOUND : NB_ERR_IO,
                     "%s: cannot open: %s", path, strerror(errno));
        goto out_free_f;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = set_err(err, err_len, NB_ERR_IO, "%s: not a readable regular file", path);
        goto out_close_fd;
    }
    uint64_t fsize = (uint64_t)sb.st_size;
    if (fsize < 8) {
        st = set_err(err, err_len, NB_ERR_FORMAT,
                     "%s: truncated: %llu bytes, too short for the 8-byte header length", path,
                     (unsigned long long)fsize);
        goto out_close_fd;
    }
    f->map = mmap(NULL, (size_t)fsize, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        st = set_err(err, err_len, NB_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
        goto out_close_fd;
    }
    f->map_len = (size_t)fsize;
    close(fd);
    fd = -1;

    const uint8_t *base = f->map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | base[i];
    if (hlen > fsize - 8) {
        st = set_err(err, err_len, NB_ERR_FORMAT,
                     "%s: header length %llu extends beyond the end of the file (%llu bytes): "
                     "truncated or not a safetensors file",
                     path, (unsigned long long)hlen, (unsigned long long)fsize);
        goto out_free_f;
    }
    if (hlen < 2 || hlen > NB_ST_MAX_HEADER) {
        st = set_err(err, err_len, NB_ERR_FORMAT,
                     "%s: header length %llu is outside [2, %u]: not a safetensors file", path,
                     (unsigned long long)hlen, NB_ST_MAX_HEADER);
        goto out_free_f;
    }
    const char *hdr = (const char *)base + 8;
    const char *pend = NULL;
    f->header = cJSON_ParseWithLengthOpts(hdr, (size_t)hlen, &pend, false);
    if (!f->header) {
        size_t off = (pend && pend >= hdr && pend <= hdr + hlen) ? (size_t)(pend - hdr) : hlen;
        int line, col;
        line_col(hdr, off, &line, &col);
        st = set_err(err, err_len, NB_ERR_FORMAT,
                     "%s: header is not valid JSON: error at header byte %zu (line %d, column %d)",
                     path, off, line, col);
        goto out_free_f;
    }
    if (!cJSON_IsObject(f->header)) {
        st = set_err(err, err_len, NB_ERR_FORMAT, "%s: header is not a JSON object", path);
        goto out_free_f;
    }

    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, f->header) if (strcmp(e->string, "__metadata__")) n++;
    f->tensors = calloc(n ? (size_t)n : 1, sizeof *f->tensors);
    if (!f->tensors) {
        st = set_err(err, err_len, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        goto out_free_f;
    }
    uint64_t data_start = 8 + hlen, data_len = fsize - data_start;
    cJSON_ArrayForEach(e, f->header) {
        if (!strcmp(e->string, "__metadata__")) {
            if (!cJSON_IsObject(e)) {
                st = set_err(err, err_len, NB_ERR_FORMAT, "%s: __metadata__ is not an object",
                             path);
                goto out_free_f;
            }
            f->meta = e;
            continue;
        }
        st = parse_entry(path, e, base, data_start, data_len, &f->tensors[f->n_tensors], err,
                         err_len);
        if (st) goto out_free_f;
        f->n_tensors++;
    }
    qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, cmp_tensor_name);
    for (int i = 1; i < f->n_tensors; i++) {
        if (!strcmp(f->tensors[i - 1].name, f->tensors[i].name)) {
            st = set_err(err, err_len, NB_ERR_FORMAT, "%s: tensor \"%s\" appears twice", path,
                         f->tensors[i].name);
            goto out_free_f;
        }
    }

    // Overlap check over non-empty tensors, in file order.
    const nb_st_tensor **byoff = malloc((n ? (size_t)n : 1) * sizeof *byoff);
    if (!byoff) {
        st = set_err(err, err_len, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        goto out_free_f;
    }
    int m = 0;
    for (int i = 0; i < f->n_tensors; i++)
        if (f->tensors[i].nbytes) byoff[m++] = &f->tensors[i];
    qsort(byoff, (size_t)m, sizeof *byoff, cmp_tensor_ptr_offset);
    for (int i = 1; i < m; i++) {
        const nb_st_tensor *a = byoff[i - 1], *b = byoff[i];
        if (b->file_offset < a->file_offset + a->nbytes) {
            st = set_err(err, err_len, NB_ERR_FORMAT,
                         "%s: tensors \"%s\" and \"%s\" overlap in the data section", path,
                         a->name, b->name);
            free(byoff);
            goto out_free_f;
        }
    }
    free(byoff);
    *out = f;
    return NB_OK;

out_close_fd:
    close(fd);
out_free_f:
    nb_st_close(&f);
    return st;
}

void nb_st_close(nb_st_file **fp) {
    if (!fp || !*fp) return;
    nb_st_file *f = *fp;
    if (f->map) munmap(f->map, f->map_len);
    cJSON_Delete(f->header);
    free(f->tensors);
    free(f->path);
    free(f);
    *fp = NULL;
}

const char *nb_st_file_path(const nb_st_file *f) { return f->path; }
int nb_st_file_n_tensors(const nb_st_file *f) { return f->n_tensors; }

const nb_st_tensor *nb_st_file_tensor_at(const nb_st_file *f, int i) {
    NB_ASSERT(i >= 0 && i < f->n_tensors);
    return &f->tensors[i];
}

const nb_st_tensor *nb_st_file_find(const nb_st_file *f, const char *name) {
    nb_st_tensor key = {.name = name};
    return bsearch(&key, f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, cmp_tensor_name);
}

const char *nb_st_file_metadata(const nb_st_file *f, const char *key) {
    if (!f->meta) return NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(f->meta, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

// ---- sets ----------------------------------------------------------------

static int cmp_map_name(const void *a, const void *b) {
    return strcmp(((const st_map_entry *)a)->name, ((const st_map_entry *)b)->name);
}

static nb_status read_small_file(const char *path, char **out, size_t *len, char *err,
                                 size_t err_len) {
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return set_err(err, err_len, errno == ENOENT ? NB_ERR_NOT_FOUND : NB_ERR_IO,
                       "%s: cannot open: %s", path, strerror(errno));
    nb_status st = NB_OK;
    long n = -1;
    if (fseek(fp, 0, SEEK_END) == 0) n = ftell(fp);
    if (n < 0 || fseek(fp, 0, SEEK_SET) != 0) {
        st = set_err(err, err_len, NB_ERR_IO, "%s: cannot determine size", path);
        goto out_close;
    }
    if (n > (256L << 20)) {
        st = set_err(err, err_len, NB_ERR_FORMAT, "%s: %ld bytes is too large for an index",
                     path, n);
        goto out_close;
    }
    char *buf = malloc((size_t)n + 1);
    if (!buf) {
        st = set_err(err, err_len, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        goto out_close;
    }
    if (fread(buf, 1, (size_t)n, fp) != (size_t)n) {
        free(buf);
        st = set_err(err, err_len, NB_ERR_IO, "%s: read failed", path);
        goto out_close;
    }
    buf[n] = '\0';
    *out = buf;
    *len = (size_t)n;
out_close:
    fclose(fp);
    return st;
}

static nb_status open_index(nb_st_set *s, const char *dir, char *err, size_t err_len) {
    const char *ip = s->source;
    char *text = NULL;
    size_t len = 0;
    nb_status st = read_small_file(ip, &text, &len, err, err_len);
    if (st) return st;
    const char *pend = NULL;
    s->index = cJSON_ParseWithLengthOpts(text, len, &pend, false);
    if (!s->index) {
        size_t off = (pend && pend >= text && pend <= text + len) ? (size_t)(pend - text) : len;
        int line, col;
        line_col(text, off, &line, &col);
        free(text);
        return set_err(err, err_len, NB_ERR_FORMAT,
                       "%s: invalid JSON at line %d, column %d (byte %zu)", ip, line, col, off);
    }
    free(text);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(s->index, "weight_map");
    if (!cJSON_IsObject(wm))
        return set_err(err, err_len, NB_ERR_FORMAT, "%s: no \"weight_map\" object", ip);
    int n = cJSON_GetArraySize(wm);
    s->map = calloc(n ? (size_t)n : 1, sizeof *s->map);
    // Shards are few; names[i] is the shard name of files[i].
    const char **names = calloc(n ? (size_t)n : 1, sizeof *names);
    s->files = calloc(n ? (size_t)n : 1, sizeof *s->files);
    if (!s->map || !names || !s->files) {
        free(names);
        return set_err(err, err_len, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", ip);
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        if (!cJSON_IsString(e) || !e->valuestring[0] || strchr(e->valuestring, '/') ||
            !strcmp(e->valuestring, ".") || !strcmp(e->valuestring, "..")) {
            st = set_err(err, err_len, NB_ERR_FORMAT,
                         "%s: weight_map entry for \"%s\" is not a plain shard file name", ip,
                         e->string);
            goto out_free_names;
        }
        int fi = 0;
        while (fi < s->n_files && strcmp(names[fi], e->valuestring)) fi++;
        if (fi == s->n_files) {
            char *sp = path_join(dir, e->valuestring);
            if (!sp) {
                st = set_err(err, err_len, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", ip);
                goto out_free_names;
            }
            char sub[768];
            st = nb_st_open(sp, &s->files[fi], sub, sizeof sub);
            free(sp);
            if (st == NB_ERR_NOT_FOUND) {
                st = set_err(err, err_len, st,
                             "%s: weight_map names shard \"%s\" (for tensor \"%s\"), which "
                             "does not exist: %s",
                             ip, e->valuestring, e->string, sub);
                goto out_free_names;
            }
            if (st) {
                set_err(err, err_len, st, "%s", sub);
                goto out_free_names;
            }
            names[fi] = e->valuestring;
            s->n_files++;
        }
        s->map[s->n_map].name = e->string;
        s->map[s->n_map].file = fi;
        s->n_map++;
    }
    qsort(s->map, (size_t)s->n_map, sizeof *s->map, cmp_map_name);
    for (int i = 1; i < s->n_map; i++) {
        if (!strcmp(s->map[i - 1].name, s->map[i].name)) {
            st = set_err(err, err_len, NB_ERR_FORMAT, "%s: weight_map lists \"%s\" twice", ip,
                         s->map[i].name);
            goto out_free_names;
        }
    }
out_free_names:
    free(names);
    return st;
}

nb_status nb_st_set_open(const char *dir, nb_st_set **out, char *err, size_t err_len) {
    if (err && err_len) err[0] = '\0';
    if (!dir || !out)
        return set_err(err, err_len, NB_ERR_INVALID_ARG, "nb_st_set_open: NULL argument");
    *out = NULL;
    nb_status st = NB_OK;
    nb_st_set *s = calloc(1, sizeof *s);
    if (!s) return set_err(err, err_len, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", dir);
    s->source = path_join(dir, "model.safetensors.index.json");
    if (!s->source) {
        st = set_err(err, err_len, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", dir);
        goto out_free_s;
    }
    if (access(s->source, F_OK) == 0) {
        st = open_index(s, dir, err, err_len);
        if (st) goto out_free_s;
    } else {
        free(s->source);
        s->source = path_join(dir, "model.safetensors");
        s->files = calloc(1, sizeof *s->files);
        if (!s->source || !s->files) {
            st = set_err(err, err_len, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", dir);
            goto out_free_s;
        }
        if (access(s->source, F_OK) != 0) {
            st = set_err(err, err_len, NB_ERR_NOT_FOUND,
                         "%s: no model.safetensors or model.safetensors.index.json", dir);
            goto out_free_s;
        }
        st = nb_st_open(s->source, &s->files[0], err, err_len);
        if (st) goto out_free_s;
        s->n_files = 1;
    }
    *out = s;
    return NB_OK;
out_free_s:
    nb_st_set_close(&s);
    return st;
}

void nb_st_set_close(nb_st_set **sp) {
    if (!sp || !*sp) return;
    nb_st_set *s = *sp;
    if (s->files)
        for (int i = 0; i < s->n_files; i++) nb_st_close(&s->files[i]);
    free(s->files);
    free(s->map);
    cJSON_Delete(s->index);
    free(s->source);
    free(s);
    *sp = NULL;
}

const char *nb_st_set_source(const nb_st_set *s) { return s->source; }

nb_status nb_st_set_find(const nb_st_set *s, const char *name, const nb_st_tensor **t,
                         const char **file, char *err, size_t err_len) {
    NB_ASSERT(s && name && t);
    *t = NULL;
    const nb_st_file *f;
    if (!s->index) {
        f = s->files[0];
    } else {
        st_map_entry key = {.name = name};
        const st_map_entry *me =
            bsearch(&key, s->map, (size_t)s->n_map, sizeof *s->map, cmp_map_name);
        if (!me) return NB_ERR_NOT_FOUND;
        f = s->files[me->file];
    }
    const nb_st_tensor *x = nb_st_file_find(f, name);
    if (!x) {
        if (!s->index) return NB_ERR_NOT_FOUND;
        return set_err(err, err_len, NB_ERR_FORMAT,
                       "%s: weight_map puts tensor \"%s\" in %s, which does not contain it",
                       s->source, name, f->path);
    }
    *t = x;
    if (file) *file = f->path;
    return NB_OK;
}
