/* Shared helpers for the kvslim subcommands: flag parsing, files, timing, messages. */
#ifndef KVS_CLI_H
#define KVS_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "core/outfile.h"
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

/* Flag-value access: returns argv[*i + 1] and advances *i, or prints an error and returns NULL. */
const char *cli_value(const char *cmd, int argc, char **argv, int *i);
/* Parse a whole-string number within [min, max]; on error print one naming the flag, return -1. */
int cli_int(const char *cmd, const char *flag, const char *s, long min, long max, int *out);
int cli_u64(const char *cmd, const char *flag, const char *s, uint64_t *out);
int cli_float(const char *cmd, const char *flag, const char *s, double min, double max,
              float *out);
/* Unknown flag or stray argument: prints the error and a hint to --help. Returns CLI_USAGE. */
int cli_bad_arg(const char *cmd, const char *arg);

/* ---- Files read and written for the user (cli_io.c) ----
 * Inputs: a regular file or a pipe/FIFO ("-" is standard input), at most CLI_TEXT_MAX bytes
 * (checked before reading a regular file, and while reading a pipe), with no NUL byte;
 * devices and directories are refused. Outputs follow core/outfile.h: checked with
 * cli_check_output right after the flags are parsed, before any work; written through
 * FIFOs/devices/"-", atomically into regular files and symlink targets, never onto an input;
 * temporary files are removed if SIGINT, SIGTERM or SIGHUP arrives during the write. Every
 * function prints its error ("kvslim CMD: ...") and returns NULL / -1. */
#define CLI_TEXT_MAX ((size_t)64 << 20)
/* Reads a whole text file (NUL-terminated); errors name the path (and line, for a NUL). */
char *cli_read_file(const char *cmd, const char *path, size_t *len);
/* Reads one token id per line (blank lines ignored); errors name the path and line. */
int cli_read_tokens(const char *cmd, const char *path, int32_t **ids, int *n);
/* An output named by flag (for messages), never to overwrite the files in inputs (which must
 * outlive the spec), with "-" as standard output and temporary files tracked for signals. */
kvs_outfile_spec cli_output(const char *flag, const char *path, const kvs_outfile_input *inputs,
                            int n_inputs);
/* Whether out can be written (kind, if non-NULL, says how); -1 after printing why. */
int cli_check_output(const char *cmd, const kvs_outfile_spec *out, kvs_outfile_kind *kind);
/* Writes data to out. */
int cli_write_output(const char *cmd, const kvs_outfile_spec *out, const void *data, size_t len);
/* Writes data to path (no flag, no inputs): cli_write_output(cli_output(NULL, path, NULL, 0)). */
int cli_write_file(const char *cmd, const char *path, const void *data, size_t len);
/* Copies the file src_path to out (e.g. a model file to a FIFO). */
int cli_copy_to_output(const char *cmd, const kvs_outfile_spec *out, const char *src_path);
/* kvs_outfile_spec.on_temp for the CLI: records tmp_path for removal on a signal (installing
 * the handlers on first use) or forgets it. Also for temporary files the CLI makes itself. */
void cli_temp_track(void *ctx, const char *tmp_path, int exists);
/* ---- end of file I/O ---- */

/* Handles --kv SPEC, --kv-type TYPE and --kv help (prints the policies). Returns 1 if argv[*i]
 * was one of them (advancing *i), 0 if not, -1 on error (message printed), 2 after help. */
int cli_kv_flags(const char *cmd, int argc, char **argv, int *i, kvs_session_params *p);
extern const char *const cli_kv_help;

/* s as the body of a JSON string (quotes, backslashes and control bytes escaped). */
const char *cli_json_escape(char *buf, size_t size, const char *s);

double cli_now(void);
int cli_default_threads(void);
/* Peak resident set size of this process in bytes. */
size_t cli_peak_rss(void);
/* Progress on stderr, only when it is a terminal: "label: done/total". */
void cli_progress(const char *label, long done, long total);
void cli_progress_end(void);
/* Human-readable byte count into buf ("1.50 MiB"). */
const char *cli_bytes(char *buf, size_t size, double bytes);

#endif
