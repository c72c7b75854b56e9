/* Eval planning: which runs `kvslim eval` makes, in which order, with which table labels.
 *
 * A documented internal tools API (the CLI's, reached by tests): the user's --kv and --budget
 * strings become a plan of jobs, spec x budget; after each budget group of results,
 * --equal-memory adds runs of each evicting policy at the slot count each one-shot run attended.
 * Errors are in the user's terms (the flag and the value typed) with KVS_ERR_ARG for bad input
 * (the CLI's exit code 2) and KVS_ERR_NOMEM when memory runs out. Nothing here runs a model. */
#ifndef KVS_EVAL_PLAN_H
#define KVS_EVAL_PLAN_H

#include <stddef.h>

#include "eval/eval.h"

/* One planned run. */
typedef struct kvs_eval_job {
    char *spec;            /* the spec to run, as eval will be given it (owned) */
    char canonical[256];   /* its canonical text (kvs_policy_spec.text): a result's params */
    char label[48];        /* the table's budget column: "0.1", "25%", "96", "-", "eq:103" */
    char *equal_memory_of; /* an equal-memory run: the canonical specs of the one-shot runs it
                              matches, space-separated (owned); NULL for the others */
} kvs_eval_job;

/* A growable list of jobs. */
typedef struct kvs_eval_jobs {
    kvs_eval_job *v;
    int n, cap;
} kvs_eval_jobs;

void kvs_eval_jobs_free(kvs_eval_jobs *jobs);

typedef struct kvs_eval_plan {
    /* Every non-full spec at every budget (or at its own budget without --budget), spec-major:
     * spec s at budget b is jobs.v[s * n_groups + b]. Full specs are the reference, which is
     * always run: they are only checked. */
    kvs_eval_jobs jobs;
    int n_groups;   /* budget groups: the --budget items, or 1 */
    /* Specs of policies that take no budget (the merging kind, MiniCache): each run once per
     * storage type, after its full row, whatever --budget says. */
    kvs_eval_jobs plain;
    int has_full;   /* a full spec was given: each non-F32 storage type gets a full row */
    /* The evicting policies --equal-memory runs: the evicting specs given, as typed, or, when
     * none is and equal_memory is set, every registered evicting policy by name. */
    char **evicting;
    int n_evicting;
} kvs_eval_plan;

/* Plans the runs of kv[0..n_kv-1] (each --kv value: one spec, or a comma-separated list of bare
 * names "full,h2o,snapkv") at the items of budgets (the --budget value, "0.1,25%,slots=96", or
 * NULL). Every spec is parsed here, so a misspelt one fails before any run. On failure *plan
 * is left empty (kvs_eval_plan_free is still safe). */
kvs_status kvs_eval_plan_make(kvs_eval_plan *plan, const char *const *kv, int n_kv,
                              const char *budgets, int equal_memory, kvs_error *err);
void kvs_eval_plan_free(kvs_eval_plan *plan);

/* Runs per budget group, and run i of group g: groups run in --budget order, each group the
 * specs in --kv order. */
int kvs_eval_plan_group_size(const kvs_eval_plan *plan);
const kvs_eval_job *kvs_eval_plan_job(const kvs_eval_plan *plan, int group, int i);

/* --equal-memory, called for each result of a budget group in order, appending to eq (the
 * group's equal-memory jobs, empty at the group's start): a one-shot, selection or offloading
 * run (equal attended slots: what a selection policy attends, not what it holds) adds each evicting
 * policy at slots = its mean slots attended rounded half up (label "eq:N"); where eq already
 * holds that run (an earlier one-shot run of the group at the same count), the run's params are
 * added to the job's equal_memory_of instead. Other kinds of run add nothing. The budget is a
 * slot count, not bytes: the caller runs the jobs on the storage type of the group's results,
 * where the same slots hold the same bytes (exactly for F32 and F16; for KIVI up to where its
 * groups and residual window fall, well under 1% on the README protocol). */
kvs_status kvs_eval_plan_equal_memory(const kvs_eval_plan *plan, const kvs_eval_result *run,
                                      kvs_eval_jobs *eq, kvs_error *err);

/* ---- storage types: eval's --kv-type ---- */
/* The storage types the planned runs are crossed with (the reference is always the full F32
 * cache, whatever they are), in the order given. */
typedef struct kvs_eval_types {
    char **v; /* each type as typed: "f32", "f16", "kivi4", "kivi:kbits=4,vbits=2" (owned) */
    int n;
} kvs_eval_types;

/* The types of vals[0..n_vals-1] (each --kv-type value: one type, or a comma-separated list of
 * bare names "f32,f16,kivi4", by --kv's rule: a value with a comma and no '=' or ':' is a list,
 * so a kivi:key=value,... type is one value of its own). Each is checked as the session reads
 * it (f32, f16, kivi4, kivi2, kivi:...); an unknown or malformed one fails naming it and the
 * value it came from, and a type listed twice fails (KVS_ERR_ARG). No values: {"f32"}. On
 * failure *t is left empty. */
kvs_status kvs_eval_types_make(kvs_eval_types *t, const char *const *vals, int n_vals,
                               kvs_error *err);
void kvs_eval_types_free(kvs_eval_types *t);
/* Is type the F32 store, the reference's storage ("f32", any case; NULL counts)? */
int kvs_eval_type_is_f32(const char *type);

/* ---- pieces of the plan ---- */
/* A --budget item as a spec item and a table label: "0.25" -> budget=0.25 (label 0.25), "25%" ->
 * budget=25% (25%), "slots=96" -> slots=96 (96). A bare whole number is refused (is "1" one
 * slot or the whole prompt?), with both spellings shown. Ranges are the spec parser's. */
kvs_status kvs_eval_budget_item(const char *item, char *spec_item, size_t spec_item_size,
                                char *label, size_t label_size, kvs_error *err);
/* spec with its budget replaced: "NAME:ITEM[,other items]", ITEM "budget=.." or "slots=..";
 * the spec's own budget=/slots= items are dropped, its other items kept in order. 0, or -1
 * when it does not fit in size. */
int kvs_eval_with_budget(const char *spec, const char *item, char *out, size_t size);
/* The table's policy column: the canonical spec (a result's params) without budget=/slots=. */
void kvs_eval_policy_label(const char *params, char *buf, size_t size);

#endif
