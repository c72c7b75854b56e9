/* A growable byte buffer: the server builds responses, SSE events and metrics text in it. */
#ifndef KVS_SERVER_BUF_H
#define KVS_SERVER_BUF_H

#include <stddef.h>

#include "core/error.h"

/* data is NUL-terminated after every successful append (len excludes the NUL); off is how much
 * of it a consumer has already taken (the streaming callback sends events in pieces). An append
 * that cannot allocate leaves the buffer as it was, sets failed and returns -1, so a builder
 * may append blindly and check failed once at the end. */
typedef struct kvs_srv_buf {
    char *data;
    size_t len, cap, off;
    int failed;
} kvs_srv_buf;

int kvs_srv_buf_append(kvs_srv_buf *b, const void *data, size_t len);
int kvs_srv_buf_puts(kvs_srv_buf *b, const char *s);
int kvs_srv_buf_printf(kvs_srv_buf *b, const char *fmt, ...) KVS_PRINTF(2, 3);
/* Empties the buffer, keeping its memory. */
void kvs_srv_buf_clear(kvs_srv_buf *b);
void kvs_srv_buf_free(kvs_srv_buf *b);

#endif
