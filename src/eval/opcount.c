/* The MPC op-count model (methods/mpcache.md §3.5) and the Table 2 gather comparison (§3.3):
 * pure integer arithmetic on public sizes, no data. MPCache's clustered counts come from
 * policies/mpcache_math.h (kvs_mp_shape_of, kvs_mp_op_counts) so the model and the policy agree
 * on C1, C2, n1, n2 and the attended slots. */
#include "opcount.h"

#include <math.h>
#include <string.h>

#include "policies/mpcache.h"
#include "policies/registry.h"

/* Limits that keep every count below 2^63: the largest, the token-level gather bits, is at most
 * T^2 x 20 x layers x kv_heads = 2^40 x 2^4.4 x 2^18. */
#define MAX_CTX (1 << 20)
#define MAX_LAYERS 512
#define MAX_HEADS 512
#define MAX_HEAD_DIM 1024
#define QUEST_PAGE 16

static const char *const method_names[KVS_OC_N_METHODS] = {
    "full",        "token",      "quest",         "mp:static+token",
    "mp:+cluster", "mp:+linear", "mp:+hierarchy", "mp:+sharing"};

const char *kvs_opcount_method_name(kvs_opcount_method m)
{
    return m >= 0 && m < KVS_OC_N_METHODS ? method_names[m] : "?";
}

int kvs_opcount_index_bits(int64_t n)
{
    int b = 0;
    while (n > 1 && ((int64_t)1 << b) < n)
        b++;
    return b;
}

kvs_status kvs_opcount_shape_check(const kvs_opcount_shape *s, kvs_error *err)
{
    if (s->n_layers < 1 || s->n_layers > MAX_LAYERS)
        return kvs_fail(err, KVS_ERR_ARG, "layers=%d: expected 1 to %d", s->n_layers, MAX_LAYERS);
    if (s->n_heads < 1 || s->n_heads > MAX_HEADS)
        return kvs_fail(err, KVS_ERR_ARG, "heads=%d: expected 1 to %d", s->n_heads, MAX_HEADS);
    if (s->n_kv_heads < 1 || s->n_kv_heads > s->n_heads || s->n_heads % s->n_kv_heads)
        return kvs_fail(err, KVS_ERR_ARG,
                        "kv_heads=%d: expected a divisor of heads=%d (each KV head serves a "
                        "whole group of query heads)", s->n_kv_heads, s->n_heads);
    if (s->head_dim < 1 || s->head_dim > MAX_HEAD_DIM)
        return kvs_fail(err, KVS_ERR_ARG, "head_dim=%d: expected 1 to %d", s->head_dim,
                        MAX_HEAD_DIM);
    return KVS_OK;
}

static kvs_status input_check(const kvs_opcount_input *in, kvs_error *err)
{
    kvs_status st = kvs_opcount_shape_check(&in->shape, err);
    if (st != KVS_OK)
        return st;
    if (in->ctx < 1 || in->ctx > MAX_CTX)
        return kvs_fail(err, KVS_ERR_ARG, "context %d: expected 1 to %d", in->ctx, MAX_CTX);
    if (!(in->budget > 0 && in->budget <= 1))
        return kvs_fail(err, KVS_ERR_ARG, "budget %g: expected a fraction in (0, 1]",
                        in->budget);
    if (in->tail < 0 || in->tail > MAX_CTX)
        return kvs_fail(err, KVS_ERR_ARG, "tail %d: expected 0 to %d", in->tail, MAX_CTX);
    const kvs_mp_cfg *c = &in->cfg;
    if (c->s2 < 1 || c->s1 < c->s2 || c->s1 % c->s2 || !(c->keep > 0 && c->keep <= 1) ||
        (c->levels != 1 && c->levels != 2) || c->skip < 0)
        return kvs_fail(err, KVS_ERR_ARG,
                        "mpcache configuration: need s2 >= 1 dividing s1, keep in (0, 1], "
                        "levels 1 or 2, skip >= 0 (got s1 %d, s2 %d, keep %g, levels %d, "
                        "skip %d)", c->s1, c->s2, c->keep, c->levels, c->skip);
    return KVS_OK;
}

/* Selection ops of one selector layer and one KV head, and the tokens attended (tail aside). */
typedef struct head_ops {
    int64_t sim_mults, sim_max, sim_div, topk_len, topk_calls, gather_eq, gather_bits;
    int64_t k;
} head_ops;

/* n_idx chosen indices into a list of len entries: one one-hot of len equality tests each. */
static void add_gather(head_ops *h, int64_t n_idx, int64_t len)
{
    h->gather_eq += n_idx * len;
    h->gather_bits += n_idx * len * kvs_opcount_index_bits(len);
}

static void add_topk(head_ops *h, int64_t len)
{
    h->topk_len += len;
    h->topk_calls++;
}

/* Token-level cosine top-k of k among n keys (LongCache-like): one dot and one division per key
 * (the keys' norms are amortised like any per-key constant). */
static void token_ops(int n, int k, int d, head_ops *h)
{
    h->sim_mults = (int64_t)n * d;
    h->sim_div = n;
    add_topk(h, n);
    add_gather(h, k, n);
    h->k = k;
}

/* Quest (page 16, Eq. 1 bound on each page's box): the chosen pages are attended whole. */
static void quest_ops(int T, double F, int d, head_ops *h)
{
    const int P = kvs_mp_n_clusters(T, QUEST_PAGE);
    /* ceil(F T / 16) pages, clamped to [1, P]; the 1e-9 as in kvs_mp_ceil_count */
    const double want = ceil(F * T / QUEST_PAGE - 1e-9);
    const int p = want < 1 ? 1 : want > P ? P : (int)want;
    h->sim_mults = 2 * (int64_t)P * d;
    h->sim_max = (int64_t)P * d;
    add_topk(h, P);
    add_gather(h, p, P);
    h->k = (int64_t)p * QUEST_PAGE;
}

/* MPCache's clustered selection over the n_kept statically kept slots with c's levels and
 * similarity (first decode step: nothing sealed). A coarse level that keeps every coarse
 * cluster (rho1 = 1 once eta >= 0.5) selects nothing, so it is not run: no coarse scores,
 * top-k or gather. The coarse choice, when it is run, is gathered too: the n1 chosen coarse
 * clusters' one-hots over C1 fetch their children's representatives. */
static void cluster_ops(const kvs_mp_cfg *c, double eta, int n_kept, int d, head_ops *h)
{
    kvs_mp_shape s;
    kvs_mp_shape_of(c, eta, n_kept, 0, &s);
    const int coarse = c->levels >= 2 && s.n1 < s.C1;
    kvs_mp_ops o;
    kvs_mp_op_counts(c->sim, 1, coarse ? s.C1 : 0, s.n_cand, s.n2, s.n_slots, 0, d, c->s1, c->s2,
                     &o);
    h->sim_mults = o.sim_mults;
    h->sim_max = o.sim_max_ops;
    if (coarse) {
        add_topk(h, o.topk_len1);
        add_gather(h, s.n1, s.C1);
    }
    add_topk(h, o.topk_len2);
    add_gather(h, s.n2, s.n_cand);
    h->k = o.softmax_len;
}

/* Totals over layers and heads: selection on selector layers per KV head, attention on every
 * layer per query head. */
static void finish_row(const kvs_opcount_input *in, kvs_opcount_method m, int selectors,
                       const head_ops *h, kvs_opcount_row *r)
{
    const kvs_opcount_shape *s = &in->shape;
    const int64_t sel = (int64_t)selectors * s->n_kv_heads;
    const int64_t qh = (int64_t)s->n_layers * s->n_heads;
    memset(r, 0, sizeof *r);
    r->method = m;
    r->selector_layers = selectors;
    r->attended = h->k + in->tail;
    r->sim_mults = sel * h->sim_mults;
    r->sim_max = sel * h->sim_max;
    r->sim_div = sel * h->sim_div;
    r->topk_len = sel * h->topk_len;
    r->topk_calls = sel * h->topk_calls;
    r->gather_eq = sel * h->gather_eq;
    r->gather_bits = sel * h->gather_bits;
    r->softmax_len = qh * r->attended;
    r->attn_mults = qh * 2 * r->attended * s->head_dim;
}

static int count_selectors(const kvs_mp_cfg *c, int n_layers)
{
    int n = 0;
    for (int l = 0; l < n_layers; l++)
        n += kvs_mp_is_selector(c, l);
    return n;
}

static double ratio(int64_t num, int64_t den)
{
    return den > 0 ? (double)num / (double)den : NAN;
}

static void reductions(kvs_opcount_row *rows)
{
    const kvs_opcount_row *full = &rows[KVS_OC_FULL], *tok = &rows[KVS_OC_TOKEN];
    for (int m = 0; m < KVS_OC_N_METHODS; m++) {
        kvs_opcount_row *r = &rows[m];
        r->red_softmax = ratio(full->softmax_len, r->softmax_len);
        r->red_mults = ratio(full->sim_mults + full->attn_mults, r->sim_mults + r->attn_mults);
        r->red_bits = r->gather_bits > 0 ? ratio(tok->gather_bits, r->gather_bits) : NAN;
    }
}

double kvs_opcount_keep(const kvs_mp_cfg *c, double budget)
{
    return c->keep > budget ? c->keep : budget;
}

kvs_status kvs_opcount_rows(const kvs_opcount_input *in, kvs_opcount_row *rows, kvs_error *err)
{
    kvs_status st = input_check(in, err);
    if (st != KVS_OK)
        return st;
    const int T = in->ctx, d = in->shape.head_dim, L = in->shape.n_layers;
    const double F = in->budget;
    const double keep = kvs_opcount_keep(&in->cfg, F);
    const int N = kvs_mp_ceil_count(keep, T);
    const double eta = kvs_mp_eta(F, keep);
    head_ops h;

    h = (head_ops){.k = T};
    finish_row(in, KVS_OC_FULL, 0, &h, &rows[KVS_OC_FULL]);
    h = (head_ops){0};
    token_ops(T, kvs_mp_ceil_count(F, T), d, &h);
    finish_row(in, KVS_OC_TOKEN, L, &h, &rows[KVS_OC_TOKEN]);
    h = (head_ops){0};
    quest_ops(T, F, d, &h);
    finish_row(in, KVS_OC_QUEST, L, &h, &rows[KVS_OC_QUEST]);
    h = (head_ops){0};
    token_ops(N, kvs_mp_ceil_count(eta, N), d, &h);
    finish_row(in, KVS_OC_MP_TOKEN, L, &h, &rows[KVS_OC_MP_TOKEN]);

    /* The ablation steps override the configuration's levels, similarity and sharing; keep,
     * s1, s2, rho1 and padding stay as configured. The last step is the configuration. */
    static const struct {
        kvs_opcount_method m;
        int levels;
        kvs_mp_sim sim;
    } steps[] = {{KVS_OC_MP_CLUSTER, 1, KVS_MP_SIM_UB},
                 {KVS_OC_MP_LINEAR, 1, KVS_MP_SIM_LINEAR},
                 {KVS_OC_MP_HIERARCHY, 2, KVS_MP_SIM_LINEAR}};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        kvs_mp_cfg c = in->cfg;
        c.levels = steps[i].levels;
        c.sim = steps[i].sim;
        c.share = 0;
        h = (head_ops){0};
        cluster_ops(&c, eta, N, d, &h);
        finish_row(in, steps[i].m, L, &h, &rows[steps[i].m]);
    }
    h = (head_ops){0};
    cluster_ops(&in->cfg, eta, N, d, &h);
    finish_row(in, KVS_OC_MP_SHARING, count_selectors(&in->cfg, L), &h,
               &rows[KVS_OC_MP_SHARING]);
    reductions(rows);
    return KVS_OK;
}

kvs_status kvs_opcount_gather_table(int T, int C, double frac, kvs_opcount_gather *out,
                                    kvs_error *err)
{
    if (T < 2 || T > MAX_CTX || C < 2 || C > MAX_CTX || !(frac > 0 && frac <= 1))
        return kvs_fail(err, KVS_ERR_ARG,
                        "gather table: need 2 <= T, C <= %d and a fraction in (0, 1] (got T %d, "
                        "C %d, %g)", MAX_CTX, T, C, frac);
    kvs_opcount_gather g = {.T = T, .C = C, .frac = frac};
    g.k1 = kvs_mp_ceil_count(frac, T);
    g.k2 = kvs_mp_ceil_count(frac, C);
    g.cmp1 = T;
    g.cmp2 = C;
    g.bits1 = kvs_opcount_index_bits(T);
    g.bits2 = kvs_opcount_index_bits(C);
    g.tests1 = g.k1 * T;
    g.tests2 = g.k2 * C;
    g.testbits1 = g.tests1 * g.bits1;
    g.testbits2 = g.tests2 * g.bits2;
    g.cmp_ratio = (double)T / C;
    g.bits_ratio = (double)g.bits1 / g.bits2;
    g.per_index_ratio = (double)T * g.bits1 / ((double)C * g.bits2);
    g.tests_ratio = (double)g.tests1 / (double)g.tests2;
    g.testbits_ratio = (double)g.testbits1 / (double)g.testbits2;
    g.paper_latency_ratio = 73.5;
    g.paper_comm_ratio = 369.8;
    *out = g;
    return KVS_OK;
}

/* Parses text; a spec with no budget= or slots= gets budget=1.0 for the parser, which wants one,
 * since the op-count model takes its budgets apart (*has_budget says which happened). */
static kvs_status parse_spec(const char *text, kvs_policy_spec *spec, int *has_budget,
                             kvs_error *err)
{
    *has_budget = strstr(text, "budget=") || strstr(text, "slots=");
    if (*has_budget)
        return kvs_policy_parse(text, spec, err);
    char with[512];
    if ((size_t)snprintf(with, sizeof with, "%s%sbudget=1.0", text, strchr(text, ':') ? "," : ":") >=
        sizeof with)
        return kvs_fail(err, KVS_ERR_ARG, "--kv %.200s...: too long", text);
    kvs_status st = kvs_policy_parse(with, spec, err);
    if (st == KVS_OK) /* messages quote the spec as the user typed it */
        snprintf(spec->user, sizeof spec->user, "%s", text);
    return st;
}

kvs_status kvs_opcount_cfg_from_spec(const char *text, int n_layers, kvs_mp_cfg *out,
                                     double *budget, kvs_error *err)
{
    kvs_policy_spec spec;
    int has_budget;
    kvs_status st = parse_spec(text, &spec, &has_budget, err);
    if (st != KVS_OK)
        return st;
    if (strcmp(spec.type->name, "mpcache"))
        return kvs_fail(err, KVS_ERR_ARG,
                        "--kv %s: a %s spec; the op-count model takes an mpcache configuration "
                        "(mpcache:keep=...,s1=...,s2=...)", text, spec.type->name);
    *budget = has_budget && spec.budget_is_fraction ? spec.budget : 0;
    return kvs_mp_cfg_from_spec(&spec, n_layers, out, err);
}
