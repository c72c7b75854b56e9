/* Error reporting: every fallible function returns a kvs_status and fills a kvs_error. */
#ifndef KVS_ERROR_H
#define KVS_ERROR_H

#include "kvslim.h"

#if defined(__GNUC__)
#define KVS_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define KVS_PRINTF(a, b)
#endif

/* Formats the message into err (if non-NULL) and returns code, so callers can write
 * `return kvs_fail(err, KVS_ERR_FORMAT, "...", ...);`. */
kvs_status kvs_fail(kvs_error *err, kvs_status code, const char *fmt, ...) KVS_PRINTF(3, 4);

#endif
