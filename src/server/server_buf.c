/* The server's growable byte buffer (server_buf.h). */
#include "server/server_buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int reserve(kvs_srv_buf *b, size_t extra)
{
    if (extra > (size_t)-1 / 2 - b->len - 1) {
        b->failed = 1;
        return -1;
    }
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) {
        b->failed = 1;
        return -1;
    }
    b->data = p;
    b->cap = cap;
    return 0;
}

int kvs_srv_buf_append(kvs_srv_buf *b, const void *data, size_t len)
{
    if (reserve(b, len) != 0)
        return -1;
    if (len)
        memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = 0;
    return 0;
}

int kvs_srv_buf_puts(kvs_srv_buf *b, const char *s) { return kvs_srv_buf_append(b, s, strlen(s)); }

int kvs_srv_buf_printf(kvs_srv_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || reserve(b, (size_t)n) != 0) {
        b->failed = 1;
        return -1;
    }
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

void kvs_srv_buf_clear(kvs_srv_buf *b)
{
    b->len = b->off = 0;
    if (b->data)
        b->data[0] = 0;
}

void kvs_srv_buf_free(kvs_srv_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}
