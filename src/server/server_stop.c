/* Stop strings and UTF-8 hygiene of generated text (server_stop.h). */
#include "server/server_stop.h"

#include <string.h>

void kvs_srv_stop_init(kvs_srv_stopper *s, const char *const *stops, int n_stops)
{
    memset(s, 0, sizeof *s);
    s->stops = stops;
    s->n_stops = n_stops;
}

void kvs_srv_stop_free(kvs_srv_stopper *s) { kvs_srv_buf_free(&s->held); }

/* Bytes a sequence starting with lead byte c has, 0 for a byte that cannot start one. */
static int seq_len(unsigned char c)
{
    return c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
           : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
}

/* Length of the valid sequence at p (n bytes available), 0 if it is not one. */
static int valid_seq(const unsigned char *p, size_t n)
{
    int k = seq_len(p[0]);
    if (k == 0 || (size_t)k > n || p[0] == 0)
        return 0;
    for (int i = 1; i < k; i++)
        if ((p[i] & 0xC0) != 0x80)
            return 0;
    /* overlong 3- and 4-byte forms, UTF-16 surrogates, code points past U+10FFFF */
    if ((p[0] == 0xE0 && p[1] < 0xA0) || (p[0] == 0xED && p[1] > 0x9F) ||
        (p[0] == 0xF0 && p[1] < 0x90) || (p[0] == 0xF4 && p[1] > 0x8F))
        return 0;
    return k;
}

int kvs_srv_utf8_append(kvs_srv_buf *out, const char *data, size_t len)
{
    const unsigned char *p = (const unsigned char *)data;
    size_t i = 0, run = 0; /* run: valid bytes from i - run not yet copied */
    while (i < len) {
        int k = valid_seq(p + i, len - i);
        if (k > 0) {
            i += (size_t)k;
            run += (size_t)k;
            continue;
        }
        if (kvs_srv_buf_append(out, p + i - run, run) != 0 ||
            kvs_srv_buf_append(out, "\xEF\xBF\xBD", 3) != 0)
            return -1;
        i++;
        run = 0;
    }
    return kvs_srv_buf_append(out, p + i - run, run);
}

size_t kvs_srv_utf8_whole(const char *data, size_t len)
{
    const unsigned char *p = (const unsigned char *)data;
    for (size_t back = 1; back <= 3 && back <= len; back++) {
        unsigned char c = p[len - back];
        if ((c & 0xC0) == 0x80)
            continue; /* a continuation byte: its lead is further back */
        int k = seq_len(c);
        return k > (int)back ? len - back : len;
    }
    return len;
}

/* Where the earliest stop string starts in text, or -1. */
static long find_stop(const kvs_srv_stopper *s, const char *text, size_t len)
{
    long best = -1;
    for (int j = 0; j < s->n_stops; j++) {
        size_t n = strlen(s->stops[j]);
        for (size_t i = 0; n <= len && i <= len - n && (best < 0 || (long)i < best); i++)
            if (!memcmp(text + i, s->stops[j], n)) {
                best = (long)i;
                break;
            }
    }
    return best;
}

/* The longest tail of text that is a proper prefix of some stop string. */
static size_t partial_stop(const kvs_srv_stopper *s, const char *text, size_t len)
{
    size_t keep = 0;
    for (int j = 0; j < s->n_stops; j++) {
        size_t n = strlen(s->stops[j]);
        for (size_t k = n - 1 < len ? n - 1 : len; k > keep; k--)
            if (!memcmp(text + len - k, s->stops[j], k)) {
                keep = k;
                break;
            }
    }
    return keep;
}

int kvs_srv_stop_feed(kvs_srv_stopper *s, const char *piece, size_t len, kvs_srv_buf *out)
{
    if (s->matched)
        return 1;
    if (kvs_srv_buf_append(&s->held, piece, len) != 0)
        return -1;
    const char *text = s->held.data;
    long at = find_stop(s, text, s->held.len);
    if (at >= 0) {
        s->matched = 1;
        int rc = kvs_srv_utf8_append(out, text, (size_t)at);
        kvs_srv_buf_clear(&s->held);
        return rc < 0 ? -1 : 1;
    }
    size_t release = s->held.len - partial_stop(s, text, s->held.len);
    release = kvs_srv_utf8_whole(text, release);
    if (kvs_srv_utf8_append(out, text, release) != 0)
        return -1;
    memmove(s->held.data, text + release, s->held.len - release + 1);
    s->held.len -= release;
    return 0;
}

int kvs_srv_stop_flush(kvs_srv_stopper *s, kvs_srv_buf *out)
{
    if (s->matched || s->held.len == 0)
        return 0;
    int rc = kvs_srv_utf8_append(out, s->held.data, s->held.len);
    kvs_srv_buf_clear(&s->held);
    return rc;
}
