/* Retrieval evaluation on the recall model (../shared/models/recall/README.md): associative
 * recall prompts, scored by the argmax of the logits at given positions.
 *
 * A prompt is a token sequence (NNN.tokens) and its answers (NNN.answer: one "POS ID" line per
 * scored position). Its context is every token before the first question token `Q`. A run of
 * one policy on one prompt: a fresh session prefills the context in one kvs_session_eval call
 * (so the policy compresses at prefill end), then feeds the rest one token at a time
 * (teacher-forced); after feeding token POS of an answer line, the logits' argmax must be ID.
 * The margin of an answer is its logit minus the largest other logit (negative when wrong).
 * Per decode step the run samples slots attended (mean per layer and query head), the share
 * of the tokens seen so far that they are, and KV bytes.
 *
 * The parsers work on text already read (the CLI reads files); errors name the file and line.
 * Nothing here reads files or prints. */
#ifndef KVS_EVAL_RECALL_H
#define KVS_EVAL_RECALL_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "kvslim.h"

/* One scored position: the logits after feeding token pos must have their argmax at id. */
typedef struct kvs_recall_answer {
    int pos;
    int32_t id;
} kvs_recall_answer;

/* One prompt. */
typedef struct kvs_recall_prompt {
    char name[128];           /* "000", "d0.50-003": the file name without .tokens */
    int32_t *tokens;          /* owned */
    int n_tokens;
    int context;              /* tokens before the first Q (set by kvs_recall_prompt_check) */
    kvs_recall_answer *answers; /* owned, in file order */
    int n_answers;
    double depth;             /* from the set's manifest.tsv, -1 if unknown */
    int distance;             /* the same */
} kvs_recall_prompt;

void kvs_recall_prompt_free(kvs_recall_prompt *p);

/* Parses the text of an .answer file (path names it in errors): "POS ID" per line, two
 * non-negative decimal integers separated by blanks; blank lines are skipped. At least one
 * line. *out is malloc'd (free()). KVS_ERR_FORMAT naming path:line on a malformed line. */
kvs_status kvs_recall_parse_answers(const char *text, const char *path, kvs_recall_answer **out,
                                    int *n, kvs_error *err);

/* Checks a prompt against the model's vocabulary (n_vocab), its context (n_ctx) and the question
 * token q_id, and sets p->context: every token id below n_vocab, a Q with at least one token
 * before it, every answer position after the context (it is decoded, not prefilled) and inside
 * the prompt, every answer id below n_vocab. tokens_path and answer_path name the files in
 * errors (KVS_ERR_FORMAT). */
kvs_status kvs_recall_prompt_check(kvs_recall_prompt *p, int n_vocab, int n_ctx, int32_t q_id,
                                   const char *tokens_path, const char *answer_path,
                                   kvs_error *err);

/* Looks up prompt name in the text of a prompt set's manifest.tsv (tab-separated; the first line
 * names the columns, among them name, depth and distance): *depth and *distance get the first
 * row of that name, or -1 when there is none. KVS_ERR_FORMAT (naming path and line) when the
 * header lacks one of the three columns, a row has fewer fields than the header, or a depth
 * or distance is not a number. */
kvs_status kvs_recall_manifest_find(const char *text, const char *path, const char *name,
                                    double *depth, int *distance, kvs_error *err);

/* How runs are made. */
typedef struct kvs_recall_setup {
    int n_threads;       /* >= 1 */
    int chunk;           /* prompt tokens per forward batch; 0 = the session default */
    const char *kv_type; /* session KV storage type; NULL = f32 */
    /* Session notices (a raised budget, ...), if set: see kvs_session_params.log. */
    void (*log)(void *ctx, const char *msg);
    void *log_ctx;
} kvs_recall_setup;

/* Predictions kept per prompt (for printing). */
#define KVS_RECALL_SHOWN 8
/* Layers whose attended share is reported one by one (the first ones of a deeper model). */
#define KVS_RECALL_MAX_LAYERS 16

/* One policy on one prompt. */
typedef struct kvs_recall_result {
    int n_answers, n_correct;
    int32_t predicted[KVS_RECALL_SHOWN]; /* the argmax at the first answers, in file order */
    double margin_sum;        /* sum of the answers' margins */
    double margin_min;        /* smallest margin */
    int n_steps;              /* decode steps: n_tokens - context */
    double slots_attended;    /* mean over decode steps (per layer and query head) */
    double attended_share;    /* mean over decode steps of slots attended / tokens seen */
    int n_layer_shares;       /* min(n_layers, KVS_RECALL_MAX_LAYERS) */
    double layer_share[KVS_RECALL_MAX_LAYERS]; /* the same, layer by layer */
    double kv_bytes_mean;     /* mean over decode steps */
    size_t kv_bytes_max;
    int slots_kept;           /* live slots per (layer, KV head) right after the context */
    /* Per layer (n_layer_shares of them): the share of its KV heads that still hold the
     * needle (the answer's value token, at answers[0].pos - distance) right after the context;
     * -1 when the prompt has no manifest distance. A policy of the offloading kind holds every
     * token (its slow tier), as does a merged layer (its pair store). */
    double needle_kept[KVS_RECALL_MAX_LAYERS];
    double seconds;
} kvs_recall_result;

/* Runs spec ("NAME[:key=value,...]") on prompt p (checked with kvs_recall_prompt_check). */
kvs_status kvs_recall_run(const kvs_model *m, const kvs_recall_setup *s, const char *spec,
                          const kvs_recall_prompt *p, kvs_recall_result *r, kvs_error *err);

/* The margin of answer id in n logits: logits[id] minus the largest other logit. */
double kvs_recall_margin(const float *logits, int n, int32_t id);

/* ---- plot (plot_recall.c) ---- */

/* One prompt's run, as the plot reads it. The strings are borrowed. */
typedef struct kvs_recall_plot_row {
    const char *params;       /* the configuration's canonical spec: "full", "h2o:budget=0.1" */
    const char *budget_label; /* its budget as the table shows it ("0.1", "96"); NULL or "-":
                                 none */
    const char *kv_type;      /* its KV storage type; NULL = f32 */
    const char *set;          /* the prompt set's name ("recall-256") */
    int context;              /* the prompt's context, tokens */
    double depth;             /* the needle's depth in [0, 1]; < 0 when unknown */
    int n_answers, n_correct;
    double attended_share;    /* kvs_recall_result's */
    double slots_attended;    /* the same */
} kvs_recall_plot_row;

/* Depth bins of the heat maps: 0.0, 0.1, ..., 1.0 (a depth goes to the nearest). */
#define KVS_RECALL_PLOT_BINS 11

/* Draws one PNG: per configuration (params x kv_type, in order of first appearance) a heat map
 * of accuracy over needle depth (rows, the nearest tenth) x prompt set (columns, by mean
 * context), red (0) to green (1), each cell labelled correct/answers, cells without prompts
 * blank, titled with the configuration's accuracy, attended share and slots attended; below
 * them accuracy against attended share, one line per policy (its spec without the budget) and
 * KV type across its budgets. title heads the image (NULL: a default). Runs gnuplot (see
 * kvs_eval_plot_check); *png (malloc'd) receives the image. */
kvs_status kvs_recall_plot(const kvs_recall_plot_row *rows, int n, const char *title,
                           void **png, size_t *png_len, kvs_error *err);

#endif
