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
