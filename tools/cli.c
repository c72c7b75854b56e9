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

void cli_notice(void *ctx, const char *msg)
{
    fprintf(stderr, "kvslim %s: %s\n", (const char *)ctx, msg);
}

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

void cli_json_num(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, "%.10g", v);
    else
        fputs("null", f);
}

void cli_json_str(FILE *f, const char *s)
{
    char buf[4096];
    fprintf(f, "\"%s\"", cli_json_escape(buf, sizeof buf, s));
}

void cli_csv_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"')
            fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}
