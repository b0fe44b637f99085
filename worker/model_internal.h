// model_internal.h: hooks between model_loader.c (which owns the opaque
// nb_model) and model_synthetic.c. Not a public API.
#ifndef NB_MODEL_INTERNAL_H
#define NB_MODEL_INTERNAL_H

#include "model_loader.h"

// A model whose views point into memory it owns instead of mmapped files.
// Takes ownership of w->layers (malloc'd) and of `owned`, which
// nb_model_free() releases with owned_free(owned); dir is copied.
// nb_model_is_synthetic() is true for it. Returns NULL when out of memory
// (then nothing was taken: the caller still owns w->layers and `owned`).
nb_model *nb_model_new_synthetic_internal(const char *dir, const nb_model_config *cfg,
                                          const nb_model_weights *w, void *owned,
                                          void (*owned_free)(void *owned));

#endif // NB_MODEL_INTERNAL_H
