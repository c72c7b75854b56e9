/* Shared helpers for the kvslim subcommands: files, timing, messages (flags: cli_flags.h). */
#ifndef KVS_CLI_H
#define KVS_CLI_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "kvslim_tools.h"
#include "kvslim.h"

/* Exit codes: 0 success, 1 runtime failure (bad file, I/O), 2 bad usage. */
enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

int cmd_run(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_layersim(int argc, char **argv);
int cmd_eval_opcount(int argc, char **argv); /* eval --task opcount */
int cmd_mpc(int argc, char **argv);          /* mpc run | dealer | party */
int cmd_serve(int argc, char **argv);

/* run's stats line on stderr: prompt and generated tokens, prefill and decode tok/s, KV bytes
 * held vs a full F16 cache (cmd_run.c). */
void cli_print_run_stats(const kvs_session *s, const char *kv_type, int n_prompt, int n_gen,
                         double t_prefill, double t_decode);
/* run --chat (cmd_run_chat.c): the conversation, first (may be NULL) as the first user turn.
 * Returns the exit code. */
struct cli_args;
int cli_run_chat(const struct cli_args *a, const kvs_session_params *params, const char *first);

/* Prints "kvslim CMD: message" to stderr. */
void cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A library notice (kvs_session_params.log) on stderr: ctx is the command's name. */
void cli_notice(void *ctx, const char *msg);

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
/* Writes a buffer a builder returned (malloc'd; NULL means it ran out of memory) to out, and
 * frees it; -1 after printing why. */
int cli_write_built(const char *cmd, const kvs_outfile_spec *out, char *buf, size_t len);
/* Writes data to path (no flag, no inputs): cli_write_output(cli_output(NULL, path, NULL, 0)). */
int cli_write_file(const char *cmd, const char *path, const void *data, size_t len);
/* Copies the file src_path to out (e.g. a model file to a FIFO). */
int cli_copy_to_output(const char *cmd, const kvs_outfile_spec *out, const char *src_path);
/* kvs_outfile_spec.on_temp for the CLI: records tmp_path for removal on a signal (installing
 * the handlers on first use) or forgets it. Also for temporary files the CLI makes itself. */
void cli_temp_track(void *ctx, const char *tmp_path, int exists);
/* -m: a GGUF file, or a llama2.c checkpoint converted (with its --tokenizer tok) to a temporary
 * GGUF that is removed as soon as it is mapped. CLI_OK, or the exit code after the message. */
int cli_load_model(const char *cmd, const char *path, const char *tok, kvs_model **out);
/* ---- end of file I/O ---- */

/* The exit code for a library status: bad usage (KVS_ERR_ARG: a budget, a policy parameter,
 * a prompt over the context) is 2, anything else 1. */
int cli_status_exit(kvs_status st);

/* s as the body of a JSON string (quotes, backslashes and control bytes escaped). */
const char *cli_json_escape(char *buf, size_t size, const char *s);
/* Writes v as a JSON number (%.10g), or null when it is not finite. */
void cli_json_num(FILE *f, double v);
/* Writes s as a quoted JSON string (escaped; at most 4095 bytes of it). */
void cli_json_str(FILE *f, const char *s);
/* Writes s as a quoted CSV field (inner quotes doubled). */
void cli_csv_str(FILE *f, const char *s);

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
