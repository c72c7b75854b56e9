/* MPCache (methods/mpcache.md): a look-once static eviction at prefill end, then at every decode
 * step a query-aware choice among the survivors by clusters of adjacent slots, scored coarse
 * first and fine within the chosen coarse clusters, with pairs of adjacent layers sharing one
 * choice.
 *
 * Static step (§2.2): the attention of the prompt's last ceil(window P) queries (the model's own
 * causal, scaled probabilities, from the kv layer's column sums, as the GQA group mean) is
 * summed per slot; each KV head keeps its ceil(keep P) best slots, ties to the lower position,
 * in position order. A layer that shares (§2.4) keeps its partner's positions instead.
 *
 * Layout (§2.3.1, §2.3.4, §2.3.6): the kept prompt slots are clustered in order, fine clusters
 * of s2 and coarse clusters of s1 slots, the prompt padded with dummy slots up to a multiple of
 * s1 (so coarse and fine clusters nest, and a sealed tail is exactly one coarse cluster). Decode
 * tokens gather in a tail, always attended; once it holds s1 tokens before a new one arrives,
 * they are sealed into a new coarse cluster. Each fine and coarse cluster keeps the min/max box
 * of its real keys.
 *
 * Dynamic step (§2.3.3-2.3.7): with eta = budget / keep, a selecting layer scores the C1 coarse
 * clusters (linear: qs . (alpha max + (1 - alpha) min), qs = the group's queries summed), keeps
 * n1 = ceil(rho1 C1), scores only their fine children and attends the n2 = ceil(eta C2) best
 * (§2.3.4 counts; with pad=on dummy children compete at -inf, so the counts never depend on the
 * data), plus the tail. The sharing layer attends the same clusters of its own cache. Attention
 * is the kv layer's exact softmax over the chosen slots, in slot order.
 *
 * Every count of §3.5 is recorded per decode step (kvs_mp_last_of, report). */
#include "policies/mpcache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "policies/policies.h"

static const kvs_param_def params[] = {
    {"keep", 0.25, 0, 1, 0, "static step: share of the prompt each KV head keeps, (0, 1]; "
                            "raised to the budget when below it (budget = keep x eta)"},
    {"window", 0.2, 0, 1, 0, "static step: the last share of the prompt whose queries score "
                             "the slots, (0, 1]"},
    {"s1", 32, 1, 1 << 16, 1, "coarse cluster size (slots)"},
    {"s2", 16, 1, 1 << 16, 1, "fine cluster size (slots); divides s1"},
    {"rho1", 0.5, 0, 1, 0, "share of coarse clusters kept while eta < 0.5 (all from 0.5 on)"},
    {"alpha", 0.6, 0, 1, 0, "linear score: weight of the box maximum against the minimum"},
    {"sim", 0, 0, 3, 1, "cluster score: linear (Eq. 2), mean key, maxdot (exact), ub (Eq. 1)"},
    {"levels", 2, 1, 2, 1, "2: coarse then fine clusters (the hierarchy); 1: fine only"},
    {"share", 1, 0, 1, 1, "adjacent layers share their choice in pairs"},
    {"skip", 2, 0, 1 << 16, 1, "with share=on: the first layers, which choose for themselves"},
    {"pad", 1, 0, 1, 1, "dummy slots make every count data-independent (the MPC engine's need)"},
    {"ends", 0, 0, 1, 1, "also attend the first and the last cluster (the authors' code)"},
    {"quant", 0, 0, 30, 1, "static step: rank the window sums on a 2^-quant grid, ties to the "
                           "lower position, as the two-party engine's fixed point does (0: off)"},
};
enum { P_KEEP, P_WINDOW, P_S1, P_S2, P_RHO1, P_ALPHA, P_SIM, P_LEVELS, P_SHARE, P_SKIP, P_PAD,
       P_ENDS, P_QUANT, N_PARAMS };

static const char *const sim_words[] = {"linear", "mean", "maxdot", "ub", NULL};
static const char *const onoff_words[] = {"off", "on", NULL};
static const kvs_param_words words[] = {
    {"sim", sim_words}, {"share", onoff_words}, {"pad", onoff_words}, {"ends", onoff_words},
};

typedef struct mp_head {
    int n_kept, sealed;   /* prompt slots kept; decode tokens sealed after them */
    int ready;            /* the static step has run */
    float *fmn, *fmx;     /* per fine cluster of the padded layout: d minima, d maxima */
    float *cmn, *cmx;     /* per coarse cluster */
    int cap_f;            /* fine clusters the arrays hold (coarse: cap_f / r) */
    int *fine;            /* the last choice (fine clusters, ascending), cap_f + 2 */
    kvs_mp_last last;
} mp_head;

typedef struct mp_state {
    kvs_mp_cfg cfg;
    double eta, keep;     /* in use for this prompt */
    int window;           /* observed prompt queries */
    mp_head *heads;       /* n_layers x n_kv_heads */
    float **obs;          /* per layer: n_kv_heads x n_prompt window attention sums */
    /* scratch of the dynamic step, sized for cap clusters */
    double *qs, *sc, *cs;
    int *sel1, *cand, *pick;
    void *rank;
    float *keys;          /* s1 rows of keys, or a whole head's at prefill end */
    int cap, keys_rows;
    /* totals since the prompt began */
    double steps, select_seconds, slots;
    kvs_mp_ops ops;
    /* share=off: sums of the commonality of the layers' choices (§2.4) over decode steps and
     * KV heads: CS(1), CS(2), and the pair of layers 0 and 1; cs_n terms */
    double cs1, cs2, cs01, cs_n;
} mp_state;

kvs_status kvs_mp_cfg_from_spec(const kvs_policy_spec *spec, int n_layers, kvs_mp_cfg *out,
                                kvs_error *err)
{
    const double *v = spec->values;
    kvs_mp_cfg c = {.keep = v[P_KEEP], .window = v[P_WINDOW], .s1 = (int)v[P_S1],
                    .s2 = (int)v[P_S2], .rho1 = v[P_RHO1], .alpha = v[P_ALPHA],
                    .sim = (kvs_mp_sim)(int)v[P_SIM], .levels = (int)v[P_LEVELS],
                    .share = (int)v[P_SHARE], .skip = (int)v[P_SKIP], .pad = (int)v[P_PAD],
                    .ends = (int)v[P_ENDS], .quant = (int)v[P_QUANT]};
    const char *u = spec->user;
    if (!(c.keep > 0))
        return kvs_fail(err, KVS_ERR_ARG, "--kv %s: keep=%g must be in (0, 1] (the share of the "
                        "prompt the static step keeps)", u, c.keep);
    if (!(c.window > 0))
        return kvs_fail(err, KVS_ERR_ARG, "--kv %s: window=%g gives an observation window of "
                        "zero tokens; it must be in (0, 1]", u, c.window);
    if (!(c.rho1 > 0))
        return kvs_fail(err, KVS_ERR_ARG, "--kv %s: rho1=%g must be in (0, 1] (the share of "
                        "coarse clusters kept)", u, c.rho1);
    if (c.s1 % c.s2 != 0)
        return kvs_fail(err, KVS_ERR_ARG, "--kv %s: s2=%d does not divide s1=%d (fine clusters "
                        "nest in coarse ones)", u, c.s2, c.s1);
    if (c.share && n_layers < 2)
        return kvs_fail(err, KVS_ERR_ARG, "--kv %s: share=on needs two layers or more; this "
                        "model has %d (pass share=off)", u, n_layers);
    if (c.share && c.skip + 1 >= n_layers)
        return kvs_fail(err, KVS_ERR_ARG, "--kv %s: share=on with skip=%d: no layer of this "
                        "%d-layer model would share (pass a smaller skip, e.g. skip=0, or "
                        "share=off)", u, c.skip, n_layers);
    *out = c;
    return KVS_OK;
}

static mp_head *head_of(const kvs_policy *p, int layer, int h)
{
    return &((mp_state *)p->state)->heads[(size_t)layer * p->n_kv_heads + h];
}

static void stop(kvs_policy *p)
{
    mp_state *s = p->state;
    if (!s)
        return;
    for (int i = 0; s->heads && i < p->n_layers * p->n_kv_heads; i++) {
        mp_head *h = &s->heads[i];
        free(h->fmn);
        free(h->fmx);
        free(h->cmn);
        free(h->cmx);
        free(h->fine);
    }
    for (int l = 0; s->obs && l < p->n_layers; l++)
        free(s->obs[l]);
    free(s->obs);
    free(s->heads);
    free(s->qs);
    free(s->sc);
    free(s->cs);
    free(s->sel1);
    free(s->cand);
    free(s->pick);
    free(s->rank);
    free(s->keys);
    free(s);
    p->state = NULL;
}

static kvs_status start(kvs_policy *p, kvs_error *err)
{
    kvs_status st = kvs_policy_check_context(p, err);
    kvs_mp_cfg cfg;
    if (st != KVS_OK || (st = kvs_mp_cfg_from_spec(&p->spec, p->n_layers, &cfg, err)) != KVS_OK)
        return st;
    const int P = p->n_prompt > 0 ? p->n_prompt : 1;
    double F = p->spec.budget_is_fraction ? p->spec.budget : p->spec.budget / P;
    F = F > 1 ? 1 : F;
    mp_state *s = calloc(1, sizeof *s);
    if (!s || !(s->heads = calloc((size_t)p->n_layers * p->n_kv_heads, sizeof *s->heads)) ||
        !(s->obs = calloc((size_t)p->n_layers, sizeof *s->obs)) ||
        !(s->qs = calloc((size_t)p->head_dim, sizeof *s->qs))) {
        p->state = s;
        stop(p);
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    }
    s->cfg = cfg;
    s->keep = cfg.keep > F ? cfg.keep : F;
    s->eta = kvs_mp_eta(F, s->keep);
    s->window = kvs_mp_ceil_count(cfg.window, P);
    p->state = s;
    /* The one-shot kind's budget is what each KV head holds after the prompt (the kv layer and
     * the invariants read it so); what it attends is the spec's budget, through eta. */
    p->budget = kvs_mp_ceil_count(s->keep, P);
    return KVS_OK;
}

static size_t state_bytes(const kvs_policy *p)
{
    const mp_state *s = p->state;
    if (!s)
        return 0;
    const int r = s->cfg.s1 / s->cfg.s2;
    size_t b = 0;
    for (int i = 0; i < p->n_layers * p->n_kv_heads; i++)
        b += (size_t)(s->heads[i].cap_f + s->heads[i].cap_f / r) * 2 * p->head_dim *
             sizeof(float);
    for (int l = 0; l < p->n_layers; l++)
        if (s->obs[l])
            b += sizeof(float) * (size_t)p->n_kv_heads * p->n_prompt;
    return b;
}

static int wants_row(const kvs_policy *p, int layer, int32_t pos)
{
    const mp_state *s = p->state;
    return kvs_mp_is_selector(&s->cfg, layer) && pos >= p->n_prompt - s->window;
}

static kvs_status prefill_chunk(kvs_policy *p, int layer, const kvs_chunk *c, kvs_error *err)
{
    mp_state *s = p->state;
    if (!c->colsum)
        return KVS_OK;
    if (!s->obs[layer] &&
        !(s->obs[layer] = calloc((size_t)p->n_kv_heads * p->n_prompt, sizeof(float))))
        return kvs_fail(err, KVS_ERR_NOMEM, "--kv %s: out of memory for window scores",
                        p->spec.user);
    return kvs_policy_add_group_mean(p, layer, c, s->obs[layer], p->n_prompt, err);
}

/* ---- scratch and boxes ---- */

/* *pp = realloc(*pp, bytes), left as it was on failure: 0, or -1 without memory. */
static int grow(void *pp, size_t bytes)
{
    void **p = pp, *n = realloc(*p, bytes);
    if (!n)
        return -1;
    *p = n;
    return 0;
}

/* Scratch for up to n clusters (the dynamic step's scores, candidates and ranking; n covers
 * every fine cluster of the padded layout, so also the coarse ones) and key rows for up to
 * rows slots. */
static kvs_status reserve(kvs_policy *p, int n, int rows, kvs_error *err)
{
    mp_state *s = p->state;
    if (n > s->cap) {
        const size_t cap = (size_t)(n + n / 2 + 8);
        if (grow(&s->sc, sizeof *s->sc * cap) || grow(&s->cs, sizeof *s->cs * cap) ||
            grow(&s->sel1, sizeof *s->sel1 * cap) || grow(&s->cand, sizeof *s->cand * cap) ||
            grow(&s->pick, sizeof *s->pick * cap) || grow(&s->rank, kvs_mp_topk_scratch((int)cap)))
            return kvs_fail(err, KVS_ERR_NOMEM, "--kv %s: out of memory for %d clusters",
                            p->spec.user, n);
        s->cap = (int)cap;
    }
    if (rows > s->keys_rows) {
        if (grow(&s->keys, sizeof *s->keys * (size_t)rows * p->head_dim))
            return kvs_fail(err, KVS_ERR_NOMEM, "--kv %s: out of memory for %d keys",
                            p->spec.user, rows);
        s->keys_rows = rows;
    }
    return KVS_OK;
}

/* Room in a head's arrays for n_fine fine clusters of the padded layout. */
static kvs_status reserve_head(kvs_policy *p, mp_head *h, int n_fine, kvs_error *err)
{
    const mp_state *s = p->state;
    if (n_fine <= h->cap_f)
        return KVS_OK;
    const int r = s->cfg.s1 / s->cfg.s2, cap = (n_fine + n_fine / 2 + r) / r * r;
    const size_t fb = sizeof(float) * (size_t)cap * p->head_dim, cb = fb / (size_t)r;
    if (grow(&h->fmn, fb) || grow(&h->fmx, fb) || grow(&h->cmn, cb) || grow(&h->cmx, cb) ||
        grow(&h->fine, sizeof *h->fine * (size_t)(cap + 2)))
        return kvs_fail(err, KVS_ERR_NOMEM, "--kv %s: out of memory for %d cluster boxes",
                        p->spec.user, cap);
    h->cap_f = cap;
    return KVS_OK;
}

/* Padded prompt length: the kept prompt slots rounded up to whole coarse clusters. */
static int padded_prompt(const mp_state *s, const mp_head *h)
{
    return kvs_mp_n_clusters(h->n_kept, s->cfg.s1) * s->cfg.s1;
}

/* The store slot of slot v of the padded layout, or -1 for a dummy. */
static int slot_of(const mp_state *s, const mp_head *h, int v)
{
    const int vp = padded_prompt(s, h);
    return v < vp ? (v < h->n_kept ? v : -1) : h->n_kept + (v - vp);
}

/* Boxes of n real key rows starting at fine cluster f0 and coarse cluster c0 (both on a coarse
 * boundary): fine boxes of s2 rows (the last possibly short), coarse boxes from them. */
static void boxes(const mp_state *s, mp_head *h, int d, const float *keys, int n, int f0, int c0)
{
    const int r = s->cfg.s1 / s->cfg.s2, nf = kvs_mp_n_clusters(n, s->cfg.s2);
    float *fmn = h->fmn + (size_t)f0 * d, *fmx = h->fmx + (size_t)f0 * d;
    kvs_mp_cluster_bounds(keys, n, d, s->cfg.s2, fmn, fmx);
    kvs_mp_coarse_bounds(fmn, fmx, nf, d, r, h->cmn + (size_t)c0 * d, h->cmx + (size_t)c0 * d);
}

/* ---- the static step ---- */

static kvs_status keep_own(kvs_policy *p, int layer, int hh, int n, int n_keep, kvs_error *err)
{
    mp_state *s = p->state;
    kvs_status st = reserve(p, n, 0, err);
    if (st != KVS_OK)
        return st;
    const float *obs = s->obs[layer] ? s->obs[layer] + (size_t)hh * p->n_prompt : NULL;
    /* obs holds the group's mean; quant ranks the group's sum on the fixed-point grid */
    const double G = (double)(p->n_heads / p->n_kv_heads), q = ldexp(1.0, s->cfg.quant);
    for (int j = 0; j < n; j++) {
        const double v = obs && j < p->n_prompt ? obs[j] : 0.0;
        s->sc[j] = s->cfg.quant > 0 ? floor(v * G * q) : v;
    }
    kvs_mp_topk_with(s->sc, n, n_keep, s->pick, s->rank);
    kvs_store_keep(p->store, layer, hh, s->pick, n_keep);
    return KVS_OK;
}

/* A sharing layer keeps the positions its partner kept (§2.4, §6 item 8). */
static kvs_status keep_partner(kvs_policy *p, int layer, int partner, int hh, int n, int n_keep,
                               kvs_error *err)
{
    mp_state *s = p->state;
    kvs_status st = reserve(p, n, 0, err);
    if (st != KVS_OK)
        return st;
    const int32_t *want = kvs_store_pos(p->store, partner, hh);
    const int32_t *pos = kvs_store_pos(p->store, layer, hh);
    const int m = kvs_store_count(p->store, partner, hh);
    int k = 0;
    for (int j = 0, i = 0; j < n && i < m; j++) {
        while (i < m && want[i] < pos[j])
            i++;
        if (i < m && want[i] == pos[j])
            s->pick[k++] = j;
    }
    if (k != n_keep || m != n_keep)
        return kvs_fail(err, KVS_ERR_ARG, "--kv %s: layer %d cannot share layer %d's %d kept "
                        "positions (%d found)", p->spec.user, layer, partner, m, k);
    kvs_store_keep(p->store, layer, hh, s->pick, n_keep);
    return KVS_OK;
}

static kvs_status prefill_end(kvs_policy *p, int layer, kvs_error *err)
{
    mp_state *s = p->state;
    const int selector = kvs_mp_is_selector(&s->cfg, layer), d = p->head_dim;
    kvs_status st = KVS_OK;
    for (int hh = 0; hh < p->n_kv_heads && st == KVS_OK; hh++) {
        mp_head *h = head_of(p, layer, hh);
        const int n = kvs_store_count(p->store, layer, hh);
        const int n_keep = kvs_mp_ceil_count(s->keep, n);
        if (n_keep < n)
            st = selector ? keep_own(p, layer, hh, n, n_keep, err)
                          : keep_partner(p, layer, kvs_mp_partner(&s->cfg, layer), hh, n, n_keep,
                                         err);
        if (st != KVS_OK)
            break;
        h->n_kept = n_keep;
        h->sealed = 0;
        h->ready = 1;
        const int n_fine = padded_prompt(s, h) / s->cfg.s2;
        if ((st = reserve_head(p, h, n_fine, err)) != KVS_OK ||
            (st = reserve(p, n_fine, 0, err)) != KVS_OK)
            break;
        if (!selector || n_keep == 0)
            continue;
        if ((st = reserve(p, 0, n_keep, err)) != KVS_OK)
            break;
        kvs_store_keys_f32(p->store, layer, hh, s->keys);
        boxes(s, h, d, s->keys, n_keep, 0, 0);
    }
    free(s->obs[layer]);
    s->obs[layer] = NULL;
    return st;
}

/* ---- the dynamic step ---- */

static double elapsed(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0->tv_nsec);
}

/* Before a decode token is stored: a tail of s1 tokens becomes one coarse cluster (§2.3.6). */
static kvs_status before_append(kvs_policy *p, int layer, const float *q, const float *k,
                                const float *v, int32_t pos, kvs_error *err)
{
    (void)q, (void)k, (void)v, (void)pos;
    mp_state *s = p->state;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const int s1 = s->cfg.s1, s2 = s->cfg.s2, r = s1 / s2, d = p->head_dim;
    kvs_status st = KVS_OK;
    for (int hh = 0; hh < p->n_kv_heads && st == KVS_OK; hh++) {
        mp_head *h = head_of(p, layer, hh);
        if (!h->ready)
            continue;
        const int n = kvs_store_count(p->store, layer, hh);
        while (st == KVS_OK && n - (h->n_kept + h->sealed) >= s1) {
            const int f0 = (padded_prompt(s, h) + h->sealed) / s2;
            if ((st = reserve_head(p, h, f0 + r, err)) != KVS_OK ||
                (st = reserve(p, f0 + r, s1, err)) != KVS_OK)
                break;
            if (kvs_mp_is_selector(&s->cfg, layer)) {
                for (int j = 0; j < s1; j++)
                    kvs_store_key_f32(p->store, layer, hh, h->n_kept + h->sealed + j,
                                      s->keys + (size_t)j * d);
                boxes(s, h, d, s->keys, s1, f0, f0 / r);
            }
            h->sealed += s1;
        }
    }
    s->select_seconds += elapsed(&t0);
    return st;
}

/* Real slots of fine cluster f of the padded layout. */
static int fine_len(const mp_state *s, const mp_head *h, int f)
{
    const int s2 = s->cfg.s2, b = f * s2, vp = padded_prompt(s, h);
    if (b >= vp)
        return s2;
    const int n = h->n_kept - b;
    return n <= 0 ? 0 : n < s2 ? n : s2;
}

/* Score of rows [b, b + len) of the padded layout (len real slots) by keys (mean, maxdot). */
static double keys_score(kvs_policy *p, const mp_head *h, int layer, int hh, int b, int len)
{
    mp_state *s = p->state;
    const int d = p->head_dim;
    for (int j = 0; j < len; j++)
        kvs_store_key_f32(p->store, layer, hh, slot_of(s, h, b + j), s->keys + (size_t)j * d);
    return kvs_mp_score_keys(s->cfg.sim, s->qs, d, s->keys, len);
}

static double coarse_score(kvs_policy *p, const mp_head *h, int layer, int hh, int c)
{
    const mp_state *s = p->state;
    const int d = p->head_dim, s1 = s->cfg.s1, s2 = s->cfg.s2, r = s1 / s2;
    if (s->cfg.sim == KVS_MP_SIM_LINEAR || s->cfg.sim == KVS_MP_SIM_UB)
        return kvs_mp_score_box(s->cfg.sim, s->qs, d, h->cmn + (size_t)c * d,
                                h->cmx + (size_t)c * d, s->cfg.alpha);
    int len = 0;
    for (int f = c * r; f < (c + 1) * r; f++)
        len += fine_len(s, h, f);
    return keys_score(p, h, layer, hh, c * s1, len);
}

static double fine_score(kvs_policy *p, const mp_head *h, int layer, int hh, int f)
{
    const mp_state *s = p->state;
    const int d = p->head_dim;
    const int len = fine_len(s, h, f);
    if (len == 0)
        return -INFINITY; /* a dummy cluster: below every real one (§2.3.4 padding) */
    if (s->cfg.sim == KVS_MP_SIM_LINEAR || s->cfg.sim == KVS_MP_SIM_UB)
        return kvs_mp_score_box(s->cfg.sim, s->qs, d, h->fmn + (size_t)f * d,
                                h->fmx + (size_t)f * d, s->cfg.alpha);
    return keys_score(p, h, layer, hh, f * s->cfg.s2, len);
}

/* Whether fine cluster f is one of the forced ends (ends=on): the first, and the last holding
 * a real slot. */
static int is_end(const mp_state *s, int f, int last)
{
    return s->cfg.ends && (f == 0 || f == last);
}

/* A selecting layer's choice for one KV head: fine clusters ascending into h->fine. Returns
 * their count, or -1 when it covers every clustered slot; *n_cand = the fine candidates. */
static int choose(kvs_policy *p, mp_head *h, int layer, int hh, const float *q, int *n_cand)
{
    mp_state *s = p->state;
    const kvs_mp_cfg *c = &s->cfg;
    const int r = c->s1 / c->s2, group = p->n_heads / p->n_kv_heads;
    kvs_mp_shape sh;
    kvs_mp_shape_of(c, s->eta, h->n_kept, h->sealed, &sh);
    h->last.shape = sh;
    *n_cand = sh.n_cand;
    if (sh.n2 >= sh.C2 && !c->ends)
        return -1;
    kvs_mp_qsum(q, group, p->head_dim, s->qs);
    const int last_real = h->sealed > 0 ? sh.C2x - 1 : kvs_mp_n_clusters(h->n_kept, c->s2) - 1;
    int nc = 0;
    if (c->levels >= 2) {
        for (int a = 0; a < sh.C1; a++)
            s->sc[a] = coarse_score(p, h, layer, hh, a);
        kvs_mp_topk_with(s->sc, sh.C1, sh.n1, s->sel1, s->rank);
        for (int a = 0; a < sh.n1; a++)
            for (int f = s->sel1[a] * r; f < (s->sel1[a] + 1) * r && f < sh.C2x; f++)
                if ((c->pad || fine_len(s, h, f) > 0) && !is_end(s, f, last_real))
                    s->cand[nc++] = f;
    } else {
        for (int f = 0; f < sh.C2x; f++)
            if ((c->pad || fine_len(s, h, f) > 0) && !is_end(s, f, last_real))
                s->cand[nc++] = f;
    }
    for (int i = 0; i < nc; i++)
        s->cs[i] = fine_score(p, h, layer, hh, s->cand[i]);
    const int n2 = sh.n2 < nc ? sh.n2 : nc;
    kvs_mp_topk_with(s->cs, nc, n2, s->pick, s->rank);
    /* merge the chosen (ascending) with the forced ends, ascending */
    const int ends[2] = {0, last_real}, n_ends = !c->ends ? 0 : last_real > 0 ? 2 : 1;
    int k = 0, i = 0;
    for (int e = 0; e < n_ends; e++) {
        while (i < n2 && s->cand[s->pick[i]] < ends[e])
            h->fine[k++] = s->cand[s->pick[i++]];
        h->fine[k++] = ends[e];
    }
    while (i < n2)
        h->fine[k++] = s->cand[s->pick[i++]];
    *n_cand = nc;
    return k;
}

/* share=off, after the last layer chose for KV head hh: the commonality (§2.4) of the positions
 * the layers' chosen clusters attend (each layer keeps its own static set, so cluster numbers
 * do not compare across layers; positions do), on steps where every layer attends the same
 * number of real slots (a layer that chose a cluster with dummies leaves the step out). A
 * measurement only: without
 * memory for it, the step is left out. */
static void add_commonality(kvs_policy *p, int hh)
{
    mp_state *s = p->state;
    const int L = p->n_layers, s2 = s->cfg.s2;
    const int cap = head_of(p, 0, hh)->last.n_fine * s2;
    if (cap <= 0)
        return;
    int *buf = malloc(sizeof *buf * (size_t)L * cap);
    const int *sets[L];
    int ok = buf != NULL, k = -1;
    for (int l = 0; l < L && ok; l++) {
        const mp_head *h = head_of(p, l, hh);
        const int32_t *pos = kvs_store_pos(p->store, l, hh);
        int *set = buf + (size_t)l * cap, n = 0;
        ok = h->last.n_fine * s2 == cap;
        for (int i = 0; i < h->last.n_fine && ok; i++)
            for (int v = h->fine[i] * s2; v < (h->fine[i] + 1) * s2; v++) {
                const int slot = slot_of(s, h, v);
                if (slot >= 0) /* not a dummy */
                    set[n++] = pos[slot];
            }
        ok = ok && n > 0 && (k < 0 || n == k);
        k = n;
        sets[l] = set;
    }
    if (ok) {
        s->cs1 += kvs_mp_commonality(sets, L, k, 1);
        s->cs2 += L > 2 ? kvs_mp_commonality(sets, L, k, 2) : 0;
        s->cs01 += kvs_mp_commonality(sets, 2, k, 1);
        s->cs_n++;
    }
    free(buf);
}

static int select_slots(kvs_policy *p, int layer, int hh, const float *q, int *slots)
{
    mp_state *s = p->state;
    mp_head *h = head_of(p, layer, hh);
    if (!h->ready)
        return -1;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const kvs_mp_cfg *c = &s->cfg;
    const int selector = kvs_mp_is_selector(c, layer);
    const int n = kvs_store_count(p->store, layer, hh), tail_at = h->n_kept + h->sealed;
    int n_fine, n_cand = 0;
    if (selector) {
        n_fine = choose(p, h, layer, hh, q, &n_cand);
    } else {
        const mp_head *ph = head_of(p, kvs_mp_partner(c, layer), hh);
        n_fine = ph->last.n_fine;
        if (n_fine > 0)
            memcpy(h->fine, ph->fine, sizeof *h->fine * (size_t)n_fine);
        h->last.shape = ph->last.shape;
    }
    int k = -1, dummies = 0;
    if (n_fine >= 0) {
        k = 0;
        for (int i = 0; i < n_fine; i++)
            for (int v = h->fine[i] * c->s2; v < (h->fine[i] + 1) * c->s2; v++) {
                const int slot = slot_of(s, h, v);
                if (slot >= 0)
                    slots[k++] = slot;
                else
                    dummies++;
            }
        for (int j = tail_at; j < n; j++)
            slots[k++] = j;
    }
    const kvs_mp_shape *sh = &h->last.shape;
    h->last.fine = h->fine;
    h->last.n_fine = n_fine;
    h->last.n_kept = h->n_kept;
    h->last.sealed = h->sealed;
    h->last.tail = n - tail_at;
    h->last.selector = selector;
    const int attended = k < 0 ? n : k + (c->pad ? dummies : 0);
    kvs_mp_op_counts(c->sim, selector && n_fine >= 0, c->levels >= 2 ? sh->C1 : 0, n_cand,
                     n_fine < 0 ? 0 : n_fine, attended - (n - tail_at), n - tail_at,
                     p->head_dim, c->s1, c->s2, &h->last.ops);
    kvs_mp_ops *t = &s->ops;
    t->sim_mults += h->last.ops.sim_mults;
    t->sim_max_ops += h->last.ops.sim_max_ops;
    t->topk_len1 += h->last.ops.topk_len1;
    t->topk_len2 += h->last.ops.topk_len2;
    t->gather_eq += h->last.ops.gather_eq;
    t->softmax_len += h->last.ops.softmax_len;
    t->attn_mults += h->last.ops.attn_mults;
    s->slots += k < 0 ? n : k;
    if (layer == 0 && hh == 0)
        s->steps++;
    if (!c->share && layer == p->n_layers - 1 && p->n_layers > 1)
        add_commonality(p, hh);
    s->select_seconds += elapsed(&t0);
    return k;
}

static int report(const kvs_policy *p, int i, char *buf, size_t size)
{
    const mp_state *s = p->state;
    if (!s || s->steps == 0)
        return -1;
    const double heads = (double)p->n_layers * p->n_kv_heads, st = s->steps;
    int selectors = 0;
    for (int l = 0; l < p->n_layers; l++)
        selectors += kvs_mp_is_selector(&s->cfg, l);
    if (i == 0) {
        snprintf(buf, size, "mpcache: keep %.4g of the prompt, eta %.4g; %d of %d layers select; "
                 "%.1f slots attended per KV head and step; selection %.4f s in all (%.3f ms per "
                 "step)", s->keep, s->eta, selectors, p->n_layers, s->slots / heads / st,
                 s->select_seconds, 1e3 * s->select_seconds / st);
        return 0;
    }
    if (i == 1) {
        const kvs_mp_ops *o = &s->ops;
        snprintf(buf, size, "mpcache ops per decode step (all layers and KV heads): similarity "
                 "mults %.0f, max ops %.0f, top-k inputs %.0f + %.0f, gather tests %.0f, softmax "
                 "length %.0f, qK+PV mults %.0f (per KV head)", (double)o->sim_mults / st,
                 (double)o->sim_max_ops / st, (double)o->topk_len1 / st,
                 (double)o->topk_len2 / st, (double)o->gather_eq / st,
                 (double)o->softmax_len / st, (double)o->attn_mults / st);
        return 0;
    }
    if (i == 2 && s->cs_n > 0) {
        char two[16] = "-";
        if (p->n_layers > 2)
            snprintf(two, sizeof two, "%.3f", s->cs2 / s->cs_n);
        snprintf(buf, size, "mpcache commonality of the positions the layers choose (share=off; "
                 "§2.4, m + 1 layers): CS(1) %.3f, CS(2) %s, layers 0 and 1: %.3f", s->cs1 / s->cs_n, two,
                 s->cs01 / s->cs_n);
        return 0;
    }
    return -1;
}

const kvs_mp_last *kvs_mp_last_of(const kvs_policy *p, int layer, int kv_head)
{
    if (!p || p->type != &kvs_policy_mpcache || !p->state || layer < 0 ||
        layer >= p->n_layers || kv_head < 0 || kv_head >= p->n_kv_heads)
        return NULL;
    const mp_head *h = head_of(p, layer, kv_head);
    return h->last.fine ? &h->last : NULL;
}

double kvs_mp_eta_of(const kvs_policy *p)
{
    return p && p->type == &kvs_policy_mpcache && p->state ? ((mp_state *)p->state)->eta : 0;
}

const kvs_mp_cfg *kvs_mp_cfg_of(const kvs_policy *p)
{
    return p && p->type == &kvs_policy_mpcache && p->state ? &((mp_state *)p->state)->cfg
                                                           : NULL;
}

const kvs_policy_type kvs_policy_mpcache = {
    .name = "mpcache",
    .summary = "MPCache: look-once static eviction, then clusters of slots chosen per step "
               "(coarse then fine, linear score), shared by pairs of layers",
    .kind = KVS_KIND_ONE_SHOT,
    .params = params,
    .n_params = N_PARAMS,
    .words = words,
    .n_words = (int)(sizeof words / sizeof words[0]),
    .start = start,
    .stop = stop,
    .state_bytes = state_bytes,
    .wants_row = wants_row,
    .prefill_chunk = prefill_chunk,
    .prefill_end = prefill_end,
    .before_append = before_append,
    .select = select_slots,
    .report = report,
};
