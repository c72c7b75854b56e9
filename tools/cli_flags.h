/* The command-line options of every subcommand, declared once in one table (cli_flags.c): name,
 * short name, value kind, range, which subcommands take it, whether it may repeat, help text.
 * One parser reads them all (--flag value, --flag=value, -n 5, -n5) and each command's --help
 * is generated from the same table. */
#ifndef KVS_CLI_FLAGS_H
#define KVS_CLI_FLAGS_H

#include <stdint.h>
#include <stdio.h>

#include "kvslim.h"

/* Subcommands, as bits of a flag's set of commands. */
enum {
    CMD_RUN = 1 << 0,
    CMD_LOGITS = 1 << 1,
    CMD_TOKENIZE = 1 << 2,
    CMD_CONVERT = 1 << 3,
    CMD_BENCH = 1 << 4,
    CMD_EVAL = 1 << 5,
    CMD_LAYERSIM = 1 << 6,
    CMD_EVAL_RECALL = 1 << 7, /* eval --task recall (tools/cmd_eval_recall.c) */
    CMD_EVAL_OPCOUNT = 1 << 8, /* eval --task opcount (tools/cmd_eval_opcount.c) */
    CMD_MPC = 1 << 9,          /* mpc run: the three roles on loopback (tools/cmd_mpc.c) */
    CMD_MPC_DEALER = 1 << 10,  /* mpc dealer: the dealer alone */
    CMD_MPC_PARTY = 1 << 11,   /* mpc party: party 0 or 1 alone */
    CMD_SERVE = 1 << 12,       /* serve: the HTTP server (tools/cmd_serve.c) */
};

/* What a flag means; a command reads its values by these. Two table rows may share an id when
 * the same setting is spelled or explained differently in different commands. */
typedef enum cli_flag_id {
    FL_HELP,
    FL_VERSION,
    FL_MODEL,
    FL_PROMPT,
    FL_FILE,
    FL_TOKENS,
    FL_OUT,
    FL_N_PREDICT,
    FL_TEMP,
    FL_TOP_K,
    FL_TOP_P,
    FL_SEED,
    FL_THREADS,
    FL_CTX,
    FL_CONTEXT_SHIFT,
    FL_IGNORE_EOS,
    FL_PROGRESS,
    FL_CHUNK,
    FL_KV,
    FL_KV_TYPE,
    FL_NO_BOS,
    FL_TOKENIZER,
    FL_TYPE,
    FL_SYNTHETIC,
    FL_SAVE,
    FL_N_PROMPT,
    FL_N_GEN,
    FL_REPS,
    FL_JSON,
    FL_CSV,
    FL_PLOT,
    FL_PROMPT_LEN,
    FL_BUDGET,
    FL_EQUAL_MEMORY,
    FL_DUPLICATE_LAYERS,
    FL_TASK,
    FL_PROMPTS,
    FL_LIMIT,
    FL_SHAPE,
    FL_FRAC,
    FL_INSECURE_PLAIN,
    FL_TIMEOUT,
    FL_LISTEN,
    FL_PEER,
    FL_DEALER,
    FL_KEY0,
    FL_KEY1,
    FL_PEER_KEY,
    FL_DEALER_KEY,
    FL_ROLE,
    FL_MODEL_HASH,
    FL_HOST,
    FL_PORT,
    FL_PARALLEL,
    FL_QUEUE,
    FL_API_KEY,
    FL_MAX_BODY,
    FL_EXACT_MATMUL,
    FL_CHAT,
    FL_SYSTEM,
    FL_CHAT_TEMPLATE,
    FL_SPECIAL,
    FL_COUNT
} cli_flag_id;

/* A subcommand as the parser sees it. */
typedef struct cli_command {
    const char *name;       /* "run" */
    unsigned bit;           /* CMD_RUN */
    const char *help;       /* usage line and prose, printed above the generated option list */
    const char *positional; /* what a bare argument is ("MODEL.bin"); NULL: none accepted */
} cli_command;

/* The parsed command line. Values point into argv. */
typedef struct cli_args {
    const cli_command *cmd;
    int given[FL_COUNT];       /* how many times */
    const char *as[FL_COUNT];  /* the spelling used last ("-n" or "--n-predict") */
    const char *str[FL_COUNT]; /* the value as typed (the last one of a repeatable flag) */
    int64_t i[FL_COUNT];       /* whole-number values */
    double f[FL_COUNT];        /* decimal values */
    const char *positional;    /* the bare argument, if the command takes one */
    /* Every occurrence in order, for repeatable flags (cli_each). */
    int n_occ;
    cli_flag_id *occ_id;
    const char **occ_val;
} cli_args;

/* Parses argv[1..argc-1] for cmd. Returns -1 when the command should go on, else the exit code
 * to return at once: 0 after --help, --version or --kv help (printed to stdout), 2 after a
 * usage error (printed to stderr as "kvslim CMD: message"). Free with cli_args_free in
 * either case. */
int cli_parse(const cli_command *cmd, int argc, char **argv, cli_args *a);
/* A subcommand's whole life: parse argv for cmd, run body on the parsed arguments (unless
 * parsing answered already), free them; returns the exit code. */
int cli_main(const cli_command *cmd, int (*body)(const cli_args *a), int argc, char **argv);
void cli_args_free(cli_args *a);
/* The k-th value of a repeatable flag (k from 0), NULL past the last. */
const char *cli_each(const cli_args *a, cli_flag_id id, int k);

/* A flag's value, or def when it was not given. */
int cli_get_int(const cli_args *a, cli_flag_id id, int def);
double cli_get_f64(const cli_args *a, cli_flag_id id, double def);
const char *cli_get_str(const cli_args *a, cli_flag_id id, const char *def);

/* -t/--threads, or the default; more threads than online CPUs are clamped with a notice. */
int cli_threads(const cli_args *a);
/* Session params from the flags every session command shares: the defaults, notices on stderr,
 * -t (clamped), --chunk, --kv-type (or the command's default) and --kv (checked with the
 * library's spec parser). Returns 0, or prints an error and returns -1 (a usage error). */
int cli_session_params(const cli_args *a, kvs_session_params *p);
/* The KV storage type a command uses when --kv-type is not given. */
const char *cli_default_kv_type(const char *cmd);

/* Prints cmd's help: its prose, then its options from the table. */
void cli_help(const cli_command *cmd, FILE *f);

#endif
