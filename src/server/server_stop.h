/* Generated text on its way out: held back while it may be the start of a stop string or of a
 * UTF-8 character split across tokens, cut at a stop string, and made valid UTF-8 for JSON. */
#ifndef KVS_SERVER_STOP_H
#define KVS_SERVER_STOP_H

#include <stddef.h>

#include "server/server_buf.h"

typedef struct kvs_srv_stopper {
    const char *const *stops; /* not owned; non-empty strings */
    int n_stops;
    kvs_srv_buf held;   /* generated, not yet released */
    int matched;        /* a stop string appeared: nothing more is released */
} kvs_srv_stopper;

/* stops must outlive s. */
void kvs_srv_stop_init(kvs_srv_stopper *s, const char *const *stops, int n_stops);
void kvs_srv_stop_free(kvs_srv_stopper *s);
/* Adds a generated piece and appends to out the text that can no longer become part of a stop
 * string (nor ends inside a UTF-8 character). Returns 1 when a stop string appeared (the text
 * before it is appended, the stop string and what follows are dropped), 0 otherwise, -1 when
 * out of memory. */
int kvs_srv_stop_feed(kvs_srv_stopper *s, const char *piece, size_t len, kvs_srv_buf *out);
/* Generation ended without a stop string: appends the held text. 0, or -1 out of memory. */
int kvs_srv_stop_flush(kvs_srv_stopper *s, kvs_srv_buf *out);

/* Appends data to out as valid UTF-8 without NUL bytes: invalid or truncated sequences and NUL
 * become U+FFFD. 0, or -1 out of memory. */
int kvs_srv_utf8_append(kvs_srv_buf *out, const char *data, size_t len);
/* How many of data's first len bytes are whole: len, less a trailing UTF-8 sequence whose lead
 * byte promises more bytes than follow. */
size_t kvs_srv_utf8_whole(const char *data, size_t len);

#endif
