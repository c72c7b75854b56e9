/* Shared helpers for the kvslim subcommands: files, timing, messages (flags: cli_flags.h). */
#ifndef KVS_CLI_H
#define KVS_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "kvslim.h"

/* Exit codes: 0 success, 1 runtime failure (bad file, I/O), 2 bad usage. */
enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

int cmd_run(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_eval(int argc, char **argv);

/* Prints "kvslim CMD: message" to stderr. */
void cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Unknown flag or stray argument: prints the error and a hint to --help. Returns CLI_USAGE. */
int cli_bad_arg(const char *cmd, const char *arg);

/* Reads a whole file (NUL-terminated); prints an error naming the path on failure. */
char *cli_read_file(const char *cmd, const char *path, size_t *len);
/* Reads one token id per line (blank lines ignored); errors name the path and line. */
int cli_read_tokens(const char *cmd, const char *path, int32_t **ids, int *n);
/* Writes data to path via a temporary file and rename(). */
int cli_write_file(const char *cmd, const char *path, const void *data, size_t len);

/* The exit code for a library status: bad usage (KVS_ERR_ARG: a budget, a policy parameter,
 * a prompt over the context) is 2, anything else 1. */
int cli_status_exit(kvs_status st);

/* s as the body of a JSON string (quotes, backslashes and control bytes escaped). */
const char *cli_json_escape(char *buf, size_t size, const char *s);

double cli_now(void);
int cli_default_threads(void);
/* Peak resident set size of this process in bytes. */
size_t cli_peak_rss(void);
/* Progress on stderr, only when it is a terminal: "label: done/total". */
void cli_progress(const char *label, long done, long total);
void cli_progress_end(void);
/* One finished piece of work ("eval [3/12] h2o:budget=0.1 done in 1.2 s"), one line on stderr
 * whether or not it is a terminal, so a log of a long run shows how far it got. */
void cli_progress_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Human-readable byte count into buf ("1.50 MiB"). */
const char *cli_bytes(char *buf, size_t size, double bytes);

#endif
