// safetensors.h: read-only access to HuggingFace .safetensors files, one
// file or a sharded set described by model.safetensors.index.json.
//
// The one idea: a file is memory-mapped once and every tensor is a pointer
// into that mapping, never a copy; everything a pointer depends on (header
// length, dtype, shape, data_offsets) is validated when the file is opened,
// so a tensor handed out by this module can be read in full without a
// bounds check. Format: 8-byte little-endian header length N, N bytes of
// JSON {name: {dtype, shape, data_offsets: [begin, end)}, "__metadata__":
// {str: str}}, then the data section; offsets are relative to its start.
#ifndef NB_SAFETENSORS_H
#define NB_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nb_dtype.h"
#include "nb_status.h"

#define NB_ST_MAX_DIMS 8          // higher-rank tensors are rejected as malformed
#define NB_ST_MAX_HEADER (100u << 20) // bytes; the reference implementation's cap

typedef struct nb_st_tensor {
    const char *name;       // owned by the file
    const char *dtype_name; // as written: "F32", "BF16", "I64", ...; owned by the file
    bool dtype_supported;   // F32, F16 or BF16; other dtypes are listed, not usable
    nb_dtype dtype;         // valid only when dtype_supported
    size_t elem_size;       // bytes per element (also for unsupported dtypes)
    int ndim;               // 0..NB_ST_MAX_DIMS (0 = scalar, 1 element)
    int64_t shape[NB_ST_MAX_DIMS]; // elements per dim, outermost first; unused dims 1
    int64_t numel;          // product of shape
    uint64_t file_offset;   // bytes from the start of the file to the first element
    size_t nbytes;          // numel * elem_size
    const void *data;       // into the read-only mapping; valid until the file is closed
} nb_st_tensor;

// ---- one file ----------------------------------------------------------

typedef struct nb_st_file nb_st_file;

// Open and map `path`, validate the whole header. On success *out owns the
// mapping; close with nb_st_close(). On error writes a message naming the
// file (and tensor) into err.
// Returns NB_OK; NB_ERR_NOT_FOUND (no such file); NB_ERR_IO (open/stat/mmap
// failed, not a regular file); NB_ERR_FORMAT (truncated, header length
// beyond the file or over NB_ST_MAX_HEADER, bad JSON with position, missing
// or mistyped field, numel overflow, data_offsets out of the data section,
// size != numel * dtype size, overlapping or duplicate tensors);
// NB_ERR_UNSUPPORTED (a dtype string this module does not know at all);
// NB_ERR_OUT_OF_MEMORY; NB_ERR_INVALID_ARG (NULL arguments).
nb_status nb_st_open(const char *path, nb_st_file **out, char *err, size_t err_len);

// Unmap and free; accepts NULL or *f == NULL; sets *f = NULL. Every
// pointer handed out for this file becomes invalid.
void nb_st_close(nb_st_file **f);

const char *nb_st_file_path(const nb_st_file *f);
int nb_st_file_n_tensors(const nb_st_file *f);
// i in [0, n_tensors), in name order.
const nb_st_tensor *nb_st_file_tensor_at(const nb_st_file *f, int i);
// NULL when the file holds no tensor of that name.
const nb_st_tensor *nb_st_file_find(const nb_st_file *f, const char *name);
// A string value of __metadata__, or NULL; owned by the file.
const char *nb_st_file_metadata(const nb_st_file *f, const char *key);

// ---- a model's weights: one file or a sharded set ----------------------

typedef struct nb_st_set nb_st_set;

// Open the weights of the checkpoint directory `dir`: when
// dir/model.safetensors.index.json exists, every shard its weight_map names
// (each opened once); otherwise dir/model.safetensors. Shard names must be
// plain file names inside dir. Close with nb_st_set_close().
// Returns NB_OK; NB_ERR_NOT_FOUND (neither file, or a shard the index names
// is missing: the message names the index, shard and a tensor mapped to it);
// NB_ERR_FORMAT (bad index JSON, no weight_map, non-string or path-like shard
// name); anything nb_st_open() returns for a shard.
nb_status nb_st_set_open(const char *dir, nb_st_set **out, char *err, size_t err_len);

// Accepts NULL or *s == NULL; sets *s = NULL.
void nb_st_set_close(nb_st_set **s);

// The file errors about the set should name: the index when sharded,
// otherwise the single .safetensors file. Owned by the set.
const char *nb_st_set_source(const nb_st_set *s);

// Find tensor `name`. On success *t points into the set and *file (if not
// NULL) is the path of the file holding it (owned by the set).
// Returns NB_OK; NB_ERR_NOT_FOUND (no such tensor; no message written:
// the caller knows what it expected); NB_ERR_FORMAT (the index maps it to a
// shard that does not contain it; message written).
nb_status nb_st_set_find(const nb_st_set *s, const char *name, const nb_st_tensor **t,
                         const char **file, char *err, size_t err_len);

#endif // NB_SAFETENSORS_H
