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

const char *cli_value(const char *cmd, int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        cli_error(cmd, "%s needs a value (see kvslim %s --help)", argv[*i], cmd);
        return NULL;
    }
    return argv[++*i];
}

int cli_int(const char *cmd, const char *flag, const char *s, long min, long max, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max) {
        cli_error(cmd, "%s expects a whole number in [%ld, %ld], got '%s'", flag, min, max, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int cli_u64(const char *cmd, const char *flag, const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') {
        cli_error(cmd, "%s expects a non-negative whole number, got '%s'", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_float(const char *cmd, const char *flag, const char *s, double min, double max,
              float *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < min || v > max) {
        cli_error(cmd, "%s expects a number in [%g, %g], got '%s'", flag, min, max, s);
        return -1;
    }
    *out = (float)v;
    return 0;
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

const char *const cli_kv_help =
    "  --kv SPEC           KV policy NAME[:key=value,...], e.g. h2o:budget=0.25 (default full);\n"
    "                      budget=F (0 < F <= 1, with a decimal point) is a fraction of the\n"
    "                      prompt, budget=N (whole number) a token count, per layer and KV head;\n"
    "                      --kv help lists the policies and their parameters\n"
    "  --kv-type TYPE      KV storage type: f32 (default) or f16\n";

int cli_kv_flags(const char *cmd, int argc, char **argv, int *i, kvs_session_params *p)
{
    const char *a = argv[*i], *v;
    if (strcmp(a, "--kv") && strcmp(a, "--kv-type"))
        return 0;
    if (!(v = cli_value(cmd, argc, argv, i)))
        return -1;
    if (!strcmp(a, "--kv-type")) {
        if (strcmp(v, "f32") && strcmp(v, "f16")) {
            cli_error(cmd, "--kv-type: unknown type '%s' (f32 or f16)", v);
            return -1;
        }
        p->kv_type = v;
        return 1;
    }
    if (!strcmp(v, "help")) {
        kvs_kv_policy_help(stdout);
        return 2;
    }
    kvs_error err = {0};
    if (kvs_kv_policy_check(v, &err) != KVS_OK) {
        cli_error(cmd, "%s", err.msg);
        return -1;
    }
    p->kv_policy = v;
    return 1;
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
