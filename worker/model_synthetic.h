// model_synthetic.h: what the built-in synthetic models look like, without
// building one (nb_model_synthetic() in model_loader.h builds one).
#ifndef NB_MODEL_SYNTHETIC_H
#define NB_MODEL_SYNTHETIC_H

#include <stddef.h>
#include <stdint.h>

#include "model_config.h"
#include "nb_status.h"

// The known names, comma separated ("tiny, llama-2-7b, llama-3-8b").
// Static storage.
const char *nb_model_synthetic_names(void);

// The config of synthetic model `name` (no "synthetic:" prefix; the prefix
// is also accepted) and, when weight_bytes is not NULL, the bytes its
// weights take. Allocates nothing. Returns NB_OK; NB_ERR_NOT_FOUND (unknown
// name; err lists the known ones); NB_ERR_INVALID_ARG (NULL name/cfg).
nb_status nb_model_synthetic_config(const char *name, nb_model_config *cfg,
                                    size_t *weight_bytes, char *err, size_t err_len);

#endif // NB_MODEL_SYNTHETIC_H
