/* A model from ../shared for a test that cannot go on without it. */
#ifndef KVS_CHECK_MODEL_H
#define KVS_CHECK_MODEL_H

#include "check.h"
#include "kvslim.h"

/* Loads rel under ../shared (its path left in path); on failure says why and exits 1. */
static inline kvs_model *check_load_model(const char *rel, char *path, size_t size)
{
    kvs_model *m = NULL;
    kvs_error err = {0};
    if (kvs_model_load(check_shared_path(path, size, rel), &m, &err) != KVS_OK) {
        fprintf(stderr, "cannot load the model: %s\n", err.msg);
        exit(1);
    }
    return m;
}

#endif
