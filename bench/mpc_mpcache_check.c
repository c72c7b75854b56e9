/* MPCache under the two-party protocol against the plaintext MPCache policy, on the same tokens
 * (issue 13's correctness runs; a benchmark, not a test: a 1024-token prefill under the protocol
 * takes minutes). Each prompt is prefilled once through the three roles (threads, loopback,
 * plain channels); the static step runs on shares at its end; then for each budget the decode
 * tokens go through one at a time (teacher-forced) and the state is rewound to the static step's
 * end for the next budget. Every selecting layer's choice is opened (the test-only hook) and set
 * beside the plaintext policy's (F32 KV) for the same step, layer and KV head; the logits are
 * opened after every token from the prompt's last and their argmax compared.
 *   mpc_mpcache_check MODEL DIR N BUDGETS [SPEC]        recall prompts DIR/NNN.tokens (+ .answer):
 *                                                       the context (up to the first Q) is the
 *                                                       prompt, the answer row is scored
 *   mpc_mpcache_check MODEL TOKENS PLEN BUDGETS [SPEC]  a token file: PLEN prompt tokens, every
 *                                                       row from PLEN - 1 scored (top-1)
 * BUDGETS: comma-separated shares (e.g. 0.05,0.1); SPEC: extra mpcache parameters
 * (e.g. share=off). One JSON line a prompt, reference and budget on stdout, progress and the
 * summary on stderr. The references: the plaintext policy as configured, with quant=16, and the
 * plaintext emulator in the protocol's fixed point (mpc/fx_llama.h; its logits are compared bit
 * for bit too). Env: MPCACHE_CHECK_DUMP=FILE writes the protocol's results (kept positions,
 * choices, opened logits) as text; MPCACHE_CHECK_REPLAY=FILE reads them instead of running the
 * protocol (same arguments); MPCACHE_CHECK_VERBOSE=1 lists every difference. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "engine/session_internal.h"
#include "kv/kv_store.h"
#include "kvslim.h"
#include "model/llama.h"
#include "mpc/fx_llama.h"
#include "mpc/fxp.h"
#include "mpc/local.h"
#include "mpc/mpcache.h"
#include "policies/mpcache.h"
#include "policies/registry.h"

enum { MAX_TOK = 4096, MAX_B = 4, MAX_STEP = 130, MAX_L = 8, MAX_H = 8, MAX_F = 128 };

typedef struct choice {
    int n; /* -1: none recorded */
    int fine[MAX_F];
} choice;

typedef struct run_ctx {
    const kvs_model *model;
    kvs_mpc_shape shape;
    const int32_t *tok;
    int n, P, nb;
    double budgets[MAX_B];
    kvs_mpc_kv_cfg cfg;
    int step, b;                              /* party 0's current budget and decode step */
    int *arg;                                 /* [b][row]: the argmax after token row */
    uint64_t *logits;                         /* [b][row - (P - 1)][vocab]: opened logits */
    choice (*got)[MAX_STEP][MAX_L][MAX_H];    /* [b][step][layer][head] */
    int *keep;                                /* [layer][head][MAX_TOK]: kept positions */
    int n_keep[MAX_L][MAX_H];
} run_ctx;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void on_choice(void *ctx, int layer, int head, const int *fine, int n)
{
    run_ctx *c = ctx;
    if (c->step < 0 || c->step >= MAX_STEP || layer >= MAX_L || head >= MAX_H || n > MAX_F)
        return;
    choice *ch = &c->got[c->b][c->step][layer][head];
    ch->n = n;
    memcpy(ch->fine, fine, sizeof *fine * (size_t)n);
}

static void on_keep(void *ctx, int layer, int head, const int *pos, int n)
{
    run_ctx *c = ctx;
    if (layer >= MAX_L || head >= MAX_H || n > MAX_TOK)
        return;
    c->n_keep[layer][head] = n;
    memcpy(c->keep + ((size_t)layer * MAX_H + head) * MAX_TOK, pos, sizeof *pos * (size_t)n);
}

static int argmax_u(const uint64_t *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if ((int64_t)v[i] > (int64_t)v[b])
            b = i;
    return b;
}

/* The protocol's results of one prompt as text (MPCACHE_CHECK_DUMP), so that a later run can
 * set other plaintext references beside them without the hour of the protocol again
 * (MPCACHE_CHECK_REPLAY): the kept positions, the choices and the opened logits. */
static void dump_run(FILE *f, const run_ctx *c, int i)
{
    const int V = c->shape.vocab;
    fprintf(f, "prompt %d %d %d %d %d\n", i, c->P, c->n, c->nb, V);
    for (int l = 0; l < MAX_L; l++)
        for (int h = 0; h < MAX_H; h++) {
            if (!c->n_keep[l][h])
                continue;
            fprintf(f, "keep %d %d %d", l, h, c->n_keep[l][h]);
            for (int j = 0; j < c->n_keep[l][h]; j++)
                fprintf(f, " %d", c->keep[((size_t)l * MAX_H + h) * MAX_TOK + j]);
            fputc('\n', f);
        }
    for (int b = 0; b < c->nb; b++)
        for (int e = 0; e < MAX_STEP; e++)
            for (int l = 0; l < MAX_L; l++)
                for (int h = 0; h < MAX_H; h++) {
                    const choice *ch = &c->got[b][e][l][h];
                    if (ch->n < 0)
                        continue;
                    fprintf(f, "choice %d %d %d %d %d", b, e, l, h, ch->n);
                    for (int j = 0; j < ch->n; j++)
                        fprintf(f, " %d", ch->fine[j]);
                    fputc('\n', f);
                }
    for (int b = 0; b < c->nb; b++)
        for (int r = 0; r <= c->n - c->P; r++) {
            const uint64_t *lg = c->logits + ((size_t)b * (MAX_STEP + 1) + (size_t)r) * V;
            fprintf(f, "logits %d %d", b, r);
            for (int v = 0; v < V; v++)
                fprintf(f, " %lld", (long long)(int64_t)lg[v]);
            fputc('\n', f);
        }
    fprintf(f, "end\n");
    fflush(f);
}

/* Reads prompt i's record back (dump_run's format); 0 on success. */
static int replay_run(FILE *f, run_ctx *c, int i)
{
    const int V = c->shape.vocab;
    int pi, P, n, nb, vv;
    char word[16];
    if (fscanf(f, "%15s %d %d %d %d %d", word, &pi, &P, &n, &nb, &vv) != 6 ||
        strcmp(word, "prompt") || pi != i || P != c->P || n != c->n || nb != c->nb || vv != V)
        return -1;
    memset(c->n_keep, 0, sizeof c->n_keep);
    while (fscanf(f, "%15s", word) == 1) {
        if (!strcmp(word, "end"))
            return 0;
        int a[5], k = 0;
        if (!strcmp(word, "keep")) {
            if (fscanf(f, "%d %d %d", &a[0], &a[1], &a[2]) != 3 || a[0] < 0 || a[0] >= MAX_L ||
                a[1] < 0 || a[1] >= MAX_H || a[2] < 0 || a[2] > MAX_TOK)
                return -1;
            c->n_keep[a[0]][a[1]] = a[2];
            for (int j = 0; j < a[2]; j++)
                k += fscanf(f, "%d", &c->keep[((size_t)a[0] * MAX_H + a[1]) * MAX_TOK + j]);
            if (k != a[2])
                return -1;
        } else if (!strcmp(word, "choice")) {
            if (fscanf(f, "%d %d %d %d %d", &a[0], &a[1], &a[2], &a[3], &a[4]) != 5 ||
                a[0] < 0 || a[0] >= MAX_B || a[1] < 0 || a[1] >= MAX_STEP || a[2] < 0 ||
                a[2] >= MAX_L || a[3] < 0 || a[3] >= MAX_H || a[4] < 0 || a[4] > MAX_F)
                return -1;
            choice *ch = &c->got[a[0]][a[1]][a[2]][a[3]];
            ch->n = a[4];
            for (int j = 0; j < a[4]; j++)
                k += fscanf(f, "%d", &ch->fine[j]);
            if (k != a[4])
                return -1;
        } else if (!strcmp(word, "logits")) {
            if (fscanf(f, "%d %d", &a[0], &a[1]) != 2 || a[0] < 0 || a[0] >= nb || a[1] < 0 ||
                a[1] > n - P)
                return -1;
            uint64_t *lg = c->logits + ((size_t)a[0] * (MAX_STEP + 1) + (size_t)a[1]) * V;
            for (int v = 0; v < V; v++) {
                long long x;
                if (fscanf(f, "%lld", &x) != 1)
                    return -1;
                lg[v] = (uint64_t)(int64_t)x;
            }
            c->arg[a[0] * MAX_TOK + P - 1 + a[1]] = argmax_u(lg, V);
        } else {
            return -1;
        }
    }
    return -1;
}

static kvs_status program(kvs_mpc *m, void *ctx, kvs_error *err)
{
    run_ctx *c = ctx;
    kvs_mpc_llama L;
    kvs_status st = kvs_mpc_llama_setup(m, m->role == KVS_MPC_P1 ? c->model : NULL, &c->shape,
                                        &L, err);
    if (st != KVS_OK)
        return st;
    const int V = c->shape.vocab, p0 = m->role == KVS_MPC_P0, dealer = kvs_mpc_is_dealer(m);
    kvs_mpc_kv_cfg cfg = c->cfg;
    cfg.budget = c->budgets[0];
    st = kvs_mpc_sel_attach(&L, &cfg, c->P, err);
    if (st == KVS_OK) {
        L.sel->open_choices = 1;
        if (p0) {
            L.sel->on_choice = on_choice;
            L.sel->on_keep = on_keep;
            L.sel->choice_ctx = c;
        }
    }
    uint64_t *sh = malloc(sizeof *sh * (size_t)V), *open = malloc(sizeof *open * (size_t)V);
    if (st == KVS_OK && (!sh || !open))
        st = kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    const double t0 = now();
    if (p0)
        c->step = -1;
    for (int t = 0; t < c->P && st == KVS_OK;) {
        const int k = kvs_mpc_llama_block(&c->shape, t, c->P - t);
        st = kvs_mpc_llama_forward(m, &L, c->tok + t, k, dealer ? NULL : sh, err);
        t += k;
        if (p0 && (t % 256 < k || t == c->P))
            fprintf(stderr, "mpc_mpcache_check: prefill %d of %d tokens, %.1f s\n", t, c->P,
                    now() - t0);
    }
    if (st == KVS_OK)
        st = kvs_mpc_open(m, KVS_OP_OPEN, sh, (size_t)V, open, err);
    for (int b = 0; p0 && st == KVS_OK && b < c->nb; b++) {
        c->arg[b * MAX_TOK + c->P - 1] = argmax_u(open, V);
        memcpy(c->logits + (size_t)b * (MAX_STEP + 1) * V, open, sizeof *open * (size_t)V);
    }
    if (st == KVS_OK)
        kvs_mpc_sel_mark(&L);
    for (int b = 0; b < c->nb && st == KVS_OK; b++) {
        if (b > 0 && (st = kvs_mpc_sel_rewind(&L, err)) == KVS_OK)
            st = kvs_mpc_sel_set_budget(&L, c->budgets[b], err);
        if (p0)
            c->b = b;
        for (int t = c->P; t < c->n && st == KVS_OK; t++) {
            if (p0)
                c->step = t - c->P;
            st = kvs_mpc_llama_forward(m, &L, c->tok + t, 1, dealer ? NULL : sh, err);
            if (st == KVS_OK)
                st = kvs_mpc_open(m, KVS_OP_OPEN, sh, (size_t)V, open, err);
            if (p0 && st == KVS_OK) {
                c->arg[b * MAX_TOK + t] = argmax_u(open, V);
                memcpy(c->logits + ((size_t)b * (MAX_STEP + 1) + (size_t)(t - c->P + 1)) * V, open,
                       sizeof *open * (size_t)V);
            }
        }
    }
    free(sh);
    free(open);
    kvs_mpc_llama_free(&L);
    return st;
}

static int argmax_f(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return b;
}

/* Whether a reference kept the protocol's positions in layer l, head h (counted). */
static void same_keep(const run_ctx *c, int l, int h, const int32_t *pos, int k, long *keep_eq,
                      long *keep_n)
{
    const int *got = c->keep + ((size_t)l * MAX_H + h) * MAX_TOK;
    int eq = k == c->n_keep[l][h];
    for (int j = 0; eq && j < k; j++)
        eq = pos[j] == got[j];
    int common = 0;
    for (int j = 0, q = 0; j < k; j++) {
        while (q < c->n_keep[l][h] && got[q] < pos[j])
            q++;
        common += q < c->n_keep[l][h] && got[q] == pos[j];
    }
    *keep_eq += eq;
    (*keep_n)++;
    if (!eq && getenv("MPCACHE_CHECK_VERBOSE"))
        fprintf(stderr, "keep set layer %d head %d: %d of %d positions in common\n", l, h, common,
                k);
}

/* The plaintext MPCache in the protocol's fixed point (mpc/fx_llama.h) at budget b: its choices
 * as the hooks report them. */
typedef struct fx_ctx {
    choice (*want)[MAX_L][MAX_H];
    int *selector;
    int step;
    int n_keep[MAX_L][MAX_H];
    int32_t keep[MAX_L][MAX_H][MAX_TOK];
} fx_ctx;

static void fx_on_keep(void *ctx, int layer, int head, const int *pos, int n)
{
    fx_ctx *x = ctx;
    if (layer >= MAX_L || head >= MAX_H || n > MAX_TOK)
        return;
    x->n_keep[layer][head] = n;
    for (int j = 0; j < n; j++)
        x->keep[layer][head][j] = pos[j];
}

static void fx_on_choice(void *ctx, int layer, int head, const int *fine, int n)
{
    fx_ctx *x = ctx;
    if (x->step < 0 || x->step >= MAX_STEP || layer >= MAX_L || head >= MAX_H || n > MAX_F)
        return;
    choice *w = &x->want[x->step][layer][head];
    w->n = n;
    memcpy(w->fine, fine, sizeof *fine * (size_t)n);
    x->selector[layer] = 1;
}

/* As plaintext(), for the emulator; also counts the rows whose logits equal the protocol's bit
 * for bit. */
static int emulated(const kvs_model *model, const int32_t *tok, int n, int P, int b,
                    int *arg, choice (*want)[MAX_L][MAX_H], int *selector, const run_ctx *c,
                    long *keep_eq, long *keep_n, long *logits_eq)
{
    const int V = model->hp.vocab;
    static fx_ctx x;
    memset(&x, 0, sizeof x);
    x.want = want;
    x.selector = selector;
    x.step = -1;
    for (int e = 0; e < MAX_STEP; e++)
        for (int l = 0; l < MAX_L; l++)
            for (int h = 0; h < MAX_H; h++)
                want[e][l][h].n = -1;
    kvs_mpc_kv_cfg cfg = c->cfg;
    cfg.budget = c->budgets[b];
    kvs_fx_llama *E = NULL;
    kvs_error err = {0};
    uint64_t *lg = malloc(sizeof *lg * (size_t)V);
    kvs_status st = lg ? kvs_fx_llama_new(model, 16, &cfg, P, &E, &err) : KVS_ERR_NOMEM;
    if (st == KVS_OK)
        kvs_fx_llama_report(E, fx_on_keep, fx_on_choice, &x);
    for (int t = 0; t < n && st == KVS_OK; t++) {
        x.step = t - P;
        st = kvs_fx_llama_step(E, tok[t], lg, &err);
        if (st != KVS_OK || t < P - 1)
            continue;
        arg[t] = argmax_u(lg, V);
        const uint64_t *got = c->logits + ((size_t)b * (MAX_STEP + 1) + (size_t)(t - P + 1)) * V;
        *logits_eq += !memcmp(lg, got, sizeof *lg * (size_t)V);
        if (t == P - 1)
            for (int l = 0; l < model->hp.n_layers && l < MAX_L; l++)
                for (int h = 0; h < model->hp.n_kv_heads && h < MAX_H; h++)
                    if (c->n_keep[l][h])
                        same_keep(c, l, h, x.keep[l][h], x.n_keep[l][h], keep_eq, keep_n);
    }
    kvs_fx_llama_free(E);
    free(lg);
    if (st != KVS_OK)
        fprintf(stderr, "mpc_mpcache_check: emulator: %s\n", err.msg);
    return st == KVS_OK ? 0 : -1;
}

/* The plaintext policy at one budget: the argmax after every token from P - 1, and its choices. */
static int plaintext(const kvs_model *model, const int32_t *tok, int n, int P, const char *spec,
                     int *arg, choice (*want)[MAX_L][MAX_H], int *selector, const run_ctx *c,
                     long *keep_eq, long *keep_n)
{
    const int V = model->hp.vocab;
    kvs_session_params sp = kvs_session_default_params();
    sp.n_threads = 1;
    sp.kv_policy = spec;
    kvs_session *s = NULL;
    kvs_error err = {0};
    float *lg = malloc(sizeof *lg * (size_t)V);
    if (!lg || kvs_session_new(model, &sp, &s, &err) != KVS_OK ||
        kvs_session_eval(s, tok, P, lg, 0, &err) != KVS_OK) {
        fprintf(stderr, "mpc_mpcache_check: plaintext %s: %s\n", spec, err.msg);
        kvs_session_free(s);
        free(lg);
        return -1;
    }
    arg[P - 1] = argmax_f(lg, V);
    const kvs_policy *p = kvs_kv_policy(kvs_session_kv(s));
    const kvs_mp_cfg *mc = kvs_mp_cfg_of(p);
    for (int l = 0; l < model->hp.n_layers && l < MAX_L; l++)
        for (int h = 0; h < model->hp.n_kv_heads && h < MAX_H; h++)
            if (c->n_keep[l][h])
                same_keep(c, l, h, kvs_store_pos(p->store, l, h), kvs_store_count(p->store, l, h),
                          keep_eq, keep_n);
    for (int t = P; t < n; t++) {
        if (kvs_session_eval(s, tok + t, 1, lg, 0, &err) != KVS_OK) {
            fprintf(stderr, "mpc_mpcache_check: plaintext: %s\n", err.msg);
            break;
        }
        arg[t] = argmax_f(lg, V);
        for (int l = 0; l < model->hp.n_layers && l < MAX_L; l++)
            for (int h = 0; h < model->hp.n_kv_heads && h < MAX_H; h++) {
                const kvs_mp_last *last = kvs_mp_last_of(p, l, h);
                choice *w = &want[t - P][l][h];
                w->n = -1;
                if (!last || t - P >= MAX_STEP)
                    continue;
                selector[l] = last->selector;
                if (last->n_fine >= 0) {
                    w->n = last->n_fine < MAX_F ? last->n_fine : MAX_F;
                    memcpy(w->fine, last->fine, sizeof *w->fine * (size_t)w->n);
                    continue;
                }
                /* every slot: the fine clusters holding a real one */
                const int vp = (last->n_kept + mc->s1 - 1) / mc->s1 * mc->s1;
                w->n = 0;
                for (int f = 0; f < last->shape.C2x && w->n < MAX_F; f++)
                    if (f * mc->s2 < last->n_kept || f * mc->s2 >= vp)
                        w->fine[w->n++] = f;
            }
    }
    kvs_session_free(s);
    free(lg);
    return 0;
}

static int read_tokens(const char *path, int32_t *tok, int max)
{
    FILE *f = fopen(path, "r");
    int n = 0, v;
    while (f && n < max && fscanf(f, "%d", &v) == 1)
        tok[n++] = v;
    if (f)
        fclose(f);
    return f ? n : -1;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: mpc_mpcache_check MODEL (DIR N | TOKENS PLEN) BUDGETS [SPEC]\n");
        return 2;
    }
    kvs_error err = {0};
    kvs_model *model = NULL;
    if (kvs_model_load(argv[1], &model, &err) != KVS_OK) {
        fprintf(stderr, "mpc_mpcache_check: %s\n", err.msg);
        return 1;
    }
    struct stat sb;
    const int recall = stat(argv[2], &sb) == 0 && S_ISDIR(sb.st_mode);
    const int count = recall ? atoi(argv[3]) : 1;
    static run_ctx c;
    c.model = model;
    kvs_mpc_shape_of(model, &c.shape);
    for (char *p = argv[4]; *p && c.nb < MAX_B;) {
        c.budgets[c.nb++] = strtod(p, &p);
        if (*p == ',')
            p++;
    }
    const char *extra = argc > 5 ? argv[5] : "";
    char spec[256], first[300];
    snprintf(spec, sizeof spec, "mpcache%s%s", *extra ? ":" : "", extra);
    snprintf(first, sizeof first, "%s%cbudget=%g", spec, *extra ? ',' : ':', c.budgets[0]);
    kvs_policy_spec ps;
    c.cfg = kvs_mpc_kv_default(KVS_MPC_KV_CLUSTER);
    if (kvs_policy_parse(first, &ps, &err) != KVS_OK ||
        kvs_mp_cfg_from_spec(&ps, model->hp.n_layers, &c.cfg.mp, &err) != KVS_OK) {
        fprintf(stderr, "mpc_mpcache_check: %s\n", err.msg);
        return 2;
    }
    c.cfg.mp.pad = 1;
    static int32_t tok[MAX_TOK];
    c.tok = tok;
    c.arg = malloc(sizeof *c.arg * MAX_B * MAX_TOK);
    c.logits = malloc(sizeof *c.logits * MAX_B * (MAX_STEP + 1) * (size_t)c.shape.vocab);
    const char *dump_path = getenv("MPCACHE_CHECK_DUMP"), *replay_path =
        getenv("MPCACHE_CHECK_REPLAY");
    FILE *dump = dump_path ? fopen(dump_path, "w") : NULL;
    FILE *replay = replay_path ? fopen(replay_path, "r") : NULL;
    if ((dump_path && !dump) || (replay_path && !replay)) {
        fprintf(stderr, "mpc_mpcache_check: cannot open %s\n", dump_path ? dump_path : replay_path);
        return 1;
    }
    c.got = malloc(sizeof *c.got * MAX_B);
    c.keep = malloc(sizeof *c.keep * MAX_L * MAX_H * MAX_TOK);
    choice(*want)[MAX_L][MAX_H] = malloc(sizeof *want * MAX_STEP);
    int *parg = malloc(sizeof *parg * MAX_TOK);
    if (!c.arg || !c.logits || !c.got || !c.keep || !want || !parg)
        return 1;
    /* per plaintext variant (0: the policy as configured, 1: quant=16, the fixed-point ranking
     * of the static step, 2: MPCache in the protocol's fixed point, mpc/fx_llama.h) and budget */
    enum { NV = 3 };
    static const char *const variant[NV] = {"", " quant=16", " in fixed point"};
    long lg_eq[MAX_B] = {0}, lg_n[MAX_B] = {0};
    int answers_same[NV][MAX_B] = {{0}}, right_mpc[MAX_B] = {0}, right_plain[NV][MAX_B] = {{0}};
    long ch_eq[NV][MAX_B] = {{0}}, ch_n[NV][MAX_B] = {{0}}, top1[NV][MAX_B] = {{0}};
    long rows[NV][MAX_B] = {{0}}, k_eq[NV][MAX_B] = {{0}}, k_n[NV][MAX_B] = {{0}};
    int done = 0;
    for (int i = 0; i < count; i++) {
        char path[600];
        int ans_pos = -1, ans_id = -1;
        if (recall) {
            snprintf(path, sizeof path, "%s/%03d.tokens", argv[2], i);
            c.n = read_tokens(path, tok, MAX_TOK);
            snprintf(path, sizeof path, "%s/%03d.answer", argv[2], i);
            FILE *f = fopen(path, "r");
            if (!f || fscanf(f, "%d %d", &ans_pos, &ans_id) != 2) {
                fprintf(stderr, "mpc_mpcache_check: %s: no answer line\n", path);
                return 1;
            }
            fclose(f);
            c.P = 0;
            while (c.P < c.n && tok[c.P] != 3) /* up to the first Q */
                c.P++;
            c.n = ans_pos + 1;
        } else {
            c.n = read_tokens(argv[2], tok, MAX_TOK);
            c.P = atoi(argv[3]);
        }
        if (c.n < 2 || c.P < 1 || c.P >= c.n || c.n - c.P > MAX_STEP) {
            fprintf(stderr, "mpc_mpcache_check: prompt %d: %d tokens, prompt %d\n", i, c.n, c.P);
            return 1;
        }
        for (int b = 0; b < c.nb; b++)
            for (int e = 0; e < MAX_STEP; e++)
                for (int l = 0; l < MAX_L; l++)
                    for (int h = 0; h < MAX_H; h++)
                        c.got[b][e][l][h].n = -1;
        kvs_mpc_local_cfg cfg = {.frac = 16, .insecure_plain = 1, .corr_seed = {{7}, {8}},
                                 .own_seed = {{9}, {10}, {11}}, .timeout_ms = 1200000};
        kvs_mpc_local_result res[3];
        const double t0 = now();
        if (replay) {
            if (replay_run(replay, &c, i) != 0) {
                fprintf(stderr, "mpc_mpcache_check: %s: no record of prompt %d as this run "
                        "has it\n", replay_path, i);
                return 1;
            }
        } else if (kvs_mpc_run_local(program, &c, &cfg, res, &err) != KVS_OK) {
            fprintf(stderr, "mpc_mpcache_check: %s\n", err.msg);
            return 1;
        } else {
            for (int r = 0; r < 3; r++)
                kvs_mpc_local_result_free(&res[r]);
        }
        if (dump)
            dump_run(dump, &c, i);
        const double secs = now() - t0;
        for (int v = 0; v < NV; v++)
            for (int b = 0; b < c.nb; b++) {
                char bspec[300];
                snprintf(bspec, sizeof bspec, "%s%cbudget=%g%s", spec, *extra ? ',' : ':',
                         c.budgets[b], v == 1 ? ",quant=16" : v == 2 ? ",fixed" : "");
                int selector[MAX_L] = {0};
                long keq = 0, kn = 0, leq = 0;
                if (v < 2 ? plaintext(model, tok, c.n, c.P, bspec, parg, want, selector, &c,
                                      &keq, &kn)
                          : emulated(model, tok, c.n, c.P, b, parg, want, selector, &c, &keq, &kn,
                                     &leq))
                    return 1;
                lg_eq[b] += leq;
                lg_n[b] += v == 2 ? c.n - c.P + 1 : 0;
                long eq = 0, nn = 0, t1 = 0, nr = 0;
                for (int e = 0; e < c.n - c.P; e++)
                    for (int l = 0; l < c.shape.n_layers; l++)
                        for (int h = 0; selector[l] && h < c.shape.n_kv_heads; h++) {
                            const choice *g = &c.got[b][e][l][h], *w = &want[e][l][h];
                            const int same = g->n >= 0 && g->n == w->n &&
                                             !memcmp(g->fine, w->fine,
                                                     sizeof *g->fine * (size_t)g->n);
                            nn++;
                            eq += same;
                            if (same || !getenv("MPCACHE_CHECK_VERBOSE"))
                                continue;
                            fprintf(stderr, "prompt %d %s step %d layer %d head %d:\n  2PC  ", i,
                                    bspec, e, l, h);
                            for (int q = 0; q < g->n; q++)
                                fprintf(stderr, " %d", g->fine[q]);
                            fprintf(stderr, "\n  plain");
                            for (int q = 0; q < w->n; q++)
                                fprintf(stderr, " %d", w->fine[q]);
                            fprintf(stderr, "\n");
                        }
                for (int t = c.P - 1; t < c.n - 1 + recall; t++, nr++)
                    t1 += c.arg[b * MAX_TOK + t] == parg[t];
                ch_eq[v][b] += eq;
                ch_n[v][b] += nn;
                top1[v][b] += t1;
                rows[v][b] += nr;
                k_eq[v][b] += keq;
                k_n[v][b] += kn;
                const int am = c.arg[b * MAX_TOK + c.n - 1], ap = parg[c.n - 1];
                if (recall) {
                    answers_same[v][b] += am == ap;
                    right_mpc[b] += v == 0 && am == ans_id;
                    right_plain[v][b] += ap == ans_id;
                }
                printf("{\"prompt\": %d, \"plaintext\": \"%s\", \"prompt_len\": %d, "
                       "\"decode\": %d, \"keep_sets_equal\": %ld, \"keep_sets\": %ld, "
                       "\"choices_equal\": %ld, \"choices\": %ld, \"top1_rows\": %ld, "
                       "\"rows\": %ld, \"answer\": %d, \"answer_mpc\": %d, "
                       "\"answer_plain\": %d, \"logits_equal\": %ld, \"seconds\": %.1f}\n",
                       i, bspec, c.P, c.n - c.P, keq, kn, eq, nn, t1, nr, ans_id, am, ap,
                       v == 2 ? leq : -1L, secs);
                fflush(stdout);
            }
        done++;
    }
    for (int v = 0; v < NV; v++)
        for (int b = 0; b < c.nb; b++) {
            fprintf(stderr, "mpc_mpcache_check: budget %g against plaintext%s: %d prompts, keep "
                    "sets equal %ld of %ld, choices equal %ld of %ld, top-1 agreement %ld of %ld "
                    "rows", c.budgets[b], variant[v], done, k_eq[v][b], k_n[v][b],
                    ch_eq[v][b], ch_n[v][b], top1[v][b], rows[v][b]);
            if (v == 2)
                fprintf(stderr, ", logits bit-equal %ld of %ld rows", lg_eq[b], lg_n[b]);
            if (recall)
                fprintf(stderr, "; answers equal %d of %d, right: 2PC %d, plaintext %d",
                        answers_same[v][b], done, right_mpc[b], right_plain[v][b]);
            fprintf(stderr, "\n");
        }
    if (dump)
        fclose(dump);
    if (replay)
        fclose(replay);
    free(c.arg);
    free(c.logits);
    free(c.got);
    free(c.keep);
    free(want);
    free(parg);
    kvs_model_free(model);
    return 0;
}
