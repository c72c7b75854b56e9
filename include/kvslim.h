/* kvslim: a C11 LLM inference engine built around the KV cache.
 *
 * Public API: opaque handles, status codes, no global state. Every function that can fail
 * returns a kvs_status; kvs_last_error() on the handle (or the error buffer passed in) tells why. */
#ifndef KVSLIM_H
#define KVSLIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvs_status {
    KVS_OK = 0,
    KVS_ERR_IO = 1,          /* a file could not be opened, read, mapped or written */
    KVS_ERR_FORMAT = 2,      /* a file is malformed: truncated, bad header, inconsistent sizes */
    KVS_ERR_UNSUPPORTED = 3, /* well-formed but not supported (architecture, tensor type) */
    KVS_ERR_ARG = 4,         /* a bad argument: out-of-range token, unknown option */
    KVS_ERR_NOMEM = 5,       /* an allocation failed */
} kvs_status;

const char *kvs_status_name(kvs_status s);

#ifdef __cplusplus
}
#endif
#endif
