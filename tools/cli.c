#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

void cli_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kvslim %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int cli_bad_arg(const char *cmd, const char *arg)
{
    if (arg[0] == '-')
        cli_error(cmd, "unknown option '%s' (see kvslim %s --help)", arg, cmd);
    else
        cli_error(cmd, "unexpected argument '%s' (see kvslim %s --help)", arg, cmd);
    return CLI_USAGE;
}

char *cli_read_file(const char *cmd, const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        cli_error(cmd, "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap)
            break;
        cap *= 2;
        char *nb = realloc(buf, cap + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
        } else {
            buf = nb;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        cli_error(cmd, "%s: %s", path, buf ? "read error" : "out of memory");
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    if (len)
        *len = n;
    return buf;
}

int cli_read_tokens(const char *cmd, const char *path, int32_t **ids, int *n)
{
    size_t len;
    char *text = cli_read_file(cmd, path, &len);
    if (!text)
        return -1;
    int cap = 256, count = 0, line = 0;
    int32_t *out = malloc(sizeof *out * cap);
    char *p = text;
    while (out && *p) {
        line++;
        char *eol = strchr(p, '\n');
        if (eol)
            *eol = 0;
        char *s = p;
        while (*s == ' ' || *s == '\t' || *s == '\r')
            s++;
        if (*s) {
            char *end;
            errno = 0;
            long v = strtol(s, &end, 10);
            while (*end == ' ' || *end == '\t' || *end == '\r')
                end++;
            if (errno || end == s || *end || v < 0 || v > INT32_MAX) {
                cli_error(cmd, "%s:%d: expected a token id (a non-negative integer), got '%.40s'",
                          path, line, s);
                free(out);
                free(text);
                return -1;
            }
            if (count == cap) {
                int32_t *no = realloc(out, sizeof *out * (cap *= 2));
                if (!no) {
                    free(out);
                    out = NULL;
                    break;
                }
                out = no;
            }
            out[count++] = (int32_t)v;
        }
        if (!eol)
            break;
        p = eol + 1;
    }
    free(text);
    if (!out) {
        cli_error(cmd, "%s: out of memory", path);
        return -1;
    }
    if (count == 0) {
        cli_error(cmd, "%s: no token ids in file", path);
        free(out);
        return -1;
    }
    *ids = out;
    *n = count;
    return 0;
}

int cli_write_file(const char *cmd, const char *path, const void *data, size_t len)
{
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) {
        cli_error(cmd, "%s: out of memory", path);
        return -1;
    }
    snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        cli_error(cmd, "%s: cannot create: %s", path, strerror(errno));
        free(tmp);
        return -1;
    }
    FILE *f = fdopen(fd, "wb");
    int ok = f && fwrite(data, 1, len, f) == len;
    if (f)
        ok = (fclose(f) == 0) && ok;
    else
        close(fd);
    if (!ok || rename(tmp, path) != 0) {
        cli_error(cmd, "%s: write failed: %s", path, strerror(errno));
        unlink(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    return 0;
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int cli_default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 8 ? 8 : (int)n;
}

size_t cli_peak_rss(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (size_t)ru.ru_maxrss * 1024;
}

void cli_progress(const char *label, long done, long total)
{
    if (!isatty(STDERR_FILENO))
        return;
    fprintf(stderr, "\r%s: %ld/%ld", label, done, total);
    fflush(stderr);
}

void cli_progress_end(void)
{
    if (isatty(STDERR_FILENO))
        fprintf(stderr, "\r\033[K");
}

void cli_progress_line(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cli_progress_end();
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    fflush(stderr);
    va_end(ap);
}

const char *cli_bytes(char *buf, size_t size, double bytes)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024.0 && u < 4) {
        bytes /= 1024.0;
        u++;
    }
    snprintf(buf, size, u ? "%.2f %s" : "%.0f %s", bytes, units[u]);
    return buf;
}

int cli_status_exit(kvs_status st)
{
    return st == KVS_ERR_ARG ? CLI_USAGE : CLI_FAIL;
}

const char *cli_json_escape(char *buf, size_t size, const char *s)
{
    size_t n = 0;
    for (; *s && n + 7 < size; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            buf[n++] = '\\';
            buf[n++] = (char)c;
        } else if (c < 0x20) {
            n += (size_t)snprintf(buf + n, size - n, "\\u%04x", c);
        } else {
            buf[n++] = (char)c;
        }
    }
    buf[n] = 0;
    return buf;
}
