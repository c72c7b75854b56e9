/* nacl (NaCl, Chen et al., ACL 2024): one-shot eviction at the end of prefill by proxy-token
 * attention scores plus score-weighted random sampling, per layer and KV head.
 * Spec: ../shared/methods/nacl.md (section numbers below refer to it).
 *
 * Per prompt of p tokens and budget B slots per (layer, KV head) (the engine's budget: a
 * fraction F gives round(F p) half up):
 *   - no eviction when B >= p or p <= min_prompt (the cache, and every logit, equal the full
 *     cache's);
 *   - proxies: the last n_P = max(1, floor(proxy p)) prompt positions, or the explicit span
 *     [proxy_begin, proxy_end) (absolute positions; the prompt starts at position 0);
 *   - protected: sinks [0, n_sink) and the recent window [p - n_recent, p) (n_recent defaults
 *     to n_P), clamped to B (n_sink = min(sinks, B), n_recent = min(recent, B - n_sink)); a span
 *     that ends before p is protected too (its positions are charged to B; n_recent is clamped
 *     first, then the span's oldest positions if the span alone does not fit);
 *   - C_rest = B - |protected|, C_r = floor(random_share C_rest), C_p = C_rest - C_r;
 *   - scores F[j] = (1/g) sum over the KV head's g query heads and the proxy rows i of the
 *     model's own causal softmax row of query i (the engine's column sums, requested through
 *     wants_row and summed over chunks: nothing is evicted before prefill_end, so slot j is
 *     position j throughout the prompt);
 *   - TOP = the C_p highest F among the unprotected positions (ties: lower position); RND = C_r
 *     of the rest drawn without replacement from softmax(F / temperature) by Gumbel-top-k with
 *     a counter-based stream keyed by (seed, layer, KV head, event, position); event 0 is the
 *     prefill eviction, event k the k-th decode re-eviction; temperature=0 samples uniformly;
 *   - keep protected + TOP + RND (exactly B), compacted in position order. The RoPE position
 *     counter is the engine's and continues at p.
 * Decode: appends (one-shot). With interval=m > 0 (off by default), every m decode steps each
 * layer is re-evicted back to B: proxies = the m tokens decoded since the last eviction (their
 * attention rows, summed per slot as they are computed: between evictions slots are only
 * appended, so the sum equals re-scoring the buffered queries against the current cache),
 * protected = the sinks and the newest n_recent slots, the same random share of the rest.
 * mask=1 is the reference path of invariant 12: nothing is compacted; every decode step attends
 * (select) only the kept prompt slots and the decoded ones, as a -inf mask on evicted slots.
 *
 * Memory: the score buffer of a layer (n_kv_heads x p floats) lives from its first proxy row to
 * its prefill_end; with interval > 0, n_kv_heads x (B + m) floats per layer during decoding;
 * both are counted by state_bytes. */
#include "policies/nacl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/random.h"
#include "policies/policies.h"

static const kvs_param_def params[] = {
    {"proxy", 0.1, 0, 1, 0, "proxy rows: the last max(1, floor(proxy x prompt)) prompt tokens "
                            "(0 = the last token only, 1 = every token)"},
    {"proxy_begin", -1, -1, 1 << 30, 1, "explicit proxy span: first position (-1 = use proxy)"},
    {"proxy_end", -1, -1, 1 << 30, 1, "explicit proxy span: one past the last position (-1 = "
                                      "the prompt's end); a span ending before it is kept"},
    {"random_share", 0.7, 0, 1, 0, "share of the unprotected budget drawn at random from "
                                   "softmax(scores) (0 = deterministic top-k)"},
    {"sinks", 4, 0, 1 << 20, 1, "first prompt tokens always kept"},
    {"recent", -1, -1, 1 << 20, 1, "last prompt tokens always kept (-1 = the proxy count)"},
    {"temperature", 1, 0, 1e9, 0, "sampling temperature of softmax(scores / t) (0 = uniform)"},
    {"seed", 0, 0, 4294967295.0, 1, "random seed"},
    {"min_prompt", 0, 0, 1 << 30, 1, "prompts of at most this many tokens are kept whole"},
    {"interval", 0, 0, 1 << 20, 1, "decode: re-evict to the budget every N steps, the N "
                                   "decoded tokens as proxies (0 = never)"},
    {"mask", 0, 0, 1, 1, "reference path: keep every slot, attend only the kept ones (tests)"},
};
#define N_PARAMS ((int)(sizeof params / sizeof params[0]))

/* ---- pure parts ---- */

int kvs_nacl_floor(double x) { return (int)floor(x + 1e-7); }

static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }

int kvs_nacl_protected(const kvs_nacl_plan *pl, int pos)
{
    return pos < pl->n_sink || pos >= pl->p - pl->n_recent ||
           (pos >= pl->prot_begin && pos < pl->prot_end);
}

kvs_status kvs_nacl_make_plan(const kvs_nacl_cfg *cfg, int p, int B, const char *name,
                              kvs_nacl_plan *out, kvs_error *err)
{
    memset(out, 0, sizeof *out);
    out->p = p;
    out->B = B;
    int begin, end;
    if (cfg->proxy_begin >= 0) {
        end = cfg->proxy_end >= 0 ? cfg->proxy_end : p;
        if (cfg->proxy_begin >= end || end > p)
            return kvs_fail(err, KVS_ERR_ARG,
                            "--kv %s: proxy span [%d, %d) is not a non-empty span inside the "
                            "prompt of %d tokens", name, cfg->proxy_begin, end, p);
        begin = cfg->proxy_begin;
    } else {
        if (cfg->proxy_end >= 0)
            return kvs_fail(err, KVS_ERR_ARG, "--kv %s: proxy_end needs proxy_begin", name);
        int n = imin(imax(1, kvs_nacl_floor(cfg->proxy * p)), p);
        begin = p - n;
        end = p;
    }
    out->proxy_begin = begin;
    out->proxy_end = end;
    out->n_proxy = end - begin;
    out->evict = p > cfg->min_prompt && B < p;
    if (!out->evict)
        return KVS_OK;

    const int nS = imin(cfg->sinks, B);
    const int recent = cfg->recent >= 0 ? cfg->recent : out->n_proxy;
    int nR;
    out->n_sink = nS;
    if (end == p) {
        /* Suffix proxies: kept through the recent window (its default is n_P). */
        nR = imin(recent, B - nS);
    } else {
        /* A span ending before p is kept: the recent window yields first, then the span's
         * oldest positions if the span alone does not fit next to the sinks. */
        const int sb = imax(begin, nS), a = imax(0, end - sb);
        if (nS + a > B) {
            out->prot_begin = end - (B - nS);
            out->prot_end = end;
            nR = 0;
        } else {
            out->prot_begin = sb;
            out->prot_end = end;
            nR = imin(recent, p - nS);
            for (; nR > 0; nR--) {
                int lo = p - nR;
                int ov = imax(0, end - imax(lo, sb));
                if (nS + a + nR - ov <= B)
                    break;
            }
        }
    }
    out->n_recent = nR;
    int n_prot = 0;
    for (int j = 0; j < p; j++)
        n_prot += kvs_nacl_protected(out, j);
    out->n_prot = n_prot;
    const int rest = B - n_prot;
    out->C_r = kvs_nacl_floor(cfg->random_share * rest);
    out->C_p = rest - out->C_r;
    const int dec_rest = B - nS - nR;
    out->dec_C_r = kvs_nacl_floor(cfg->random_share * dec_rest);
    out->dec_C_p = dec_rest - out->dec_C_r;
    return KVS_OK;
}

static uint64_t stream_key(uint64_t seed, int layer, int head, uint64_t event)
{
    const uint64_t words[3] = {(uint32_t)layer, (uint32_t)head, event};
    return kvs_random_key(seed, words, 3);
}

static double draw_uniform(uint64_t key, int64_t pos)
{
    return kvs_random_unit_open(kvs_random_at(key, (uint64_t)pos));
}

static double draw_gumbel(uint64_t key, int64_t pos) { return -log(-log(draw_uniform(key, pos))); }

double kvs_nacl_uniform(uint64_t seed, int layer, int head, uint64_t event, int64_t pos)
{
    return draw_uniform(stream_key(seed, layer, head, event), pos);
}

double kvs_nacl_gumbel(uint64_t seed, int layer, int head, uint64_t event, int64_t pos)
{
    return draw_gumbel(stream_key(seed, layer, head, event), pos);
}

typedef struct cand {
    double key;
    int32_t pos;
    int idx;
} cand;

/* Higher key first, then the lower position. */
static int by_key(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->key != y->key)
        return x->key > y->key ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

int kvs_nacl_select(const float *score, const int32_t *pos, const uint8_t *prot, int n, int C_p,
                    int C_r, double inv_tau, uint64_t seed, int layer, int head, uint64_t event,
                    int *keep, int *top, int *rnd)
{
    cand *c = malloc(sizeof(cand) * (size_t)(n > 0 ? n : 1));
    uint8_t *picked = calloc((size_t)(n > 0 ? n : 1), 1);
    if (!c || !picked) {
        free(c);
        free(picked);
        return -1;
    }
    /* TOP: partial order of the unprotected entries by score. */
    int m = 0;
    for (int i = 0; i < n; i++)
        if (!prot || !prot[i])
            c[m++] = (cand){(double)score[i], pos[i], i};
    if (C_p > m)
        C_p = m;
    if (C_r > m - C_p)
        C_r = m - C_p;
    qsort(c, (size_t)m, sizeof *c, by_key);
    for (int k = 0; k < C_p; k++) {
        picked[c[k].idx] = 1;
        if (top)
            top[k] = c[k].idx;
    }
    /* RND: Gumbel-top-k over REM = unprotected \ TOP. */
    if (C_r > 0) {
        const uint64_t key = stream_key(seed, layer, head, event);
        int r = 0;
        for (int i = 0; i < n; i++)
            if ((!prot || !prot[i]) && !picked[i])
                c[r++] = (cand){(double)score[i] * inv_tau + draw_gumbel(key, pos[i]), pos[i], i};
        qsort(c, (size_t)r, sizeof *c, by_key);
        for (int k = 0; k < C_r; k++) {
            picked[c[k].idx] = 1;
            if (rnd)
                rnd[k] = c[k].idx;
        }
    }
    int count = 0;
    for (int i = 0; i < n; i++)
        if ((prot && prot[i]) || picked[i])
            keep[count++] = i;
    free(c);
    free(picked);
    return count;
}

/* ---- the policy ---- */

typedef struct nacl_state {
    kvs_nacl_cfg cfg;
    kvs_nacl_plan plan;
    int n_layers, n_kv, dcap; /* dcap: decode score entries per head, B + interval */
    float **F;       /* per layer: n_kv x p proxy scores, while held */
    int *evicted;    /* per layer: the prefill eviction ran */
    float **dscore;  /* per layer: n_kv x dcap decode proxy scores (interval > 0) */
    int *steps;      /* per layer: decode steps since prefill end */
    int **live;      /* mask mode, per (layer, head): attended slots, increasing */
    int *n_live, *seen, live_cap;
} nacl_state;

static kvs_nacl_cfg cfg_of(const kvs_policy *p)
{
    kvs_nacl_cfg c;
    c.proxy = kvs_policy_param(p, "proxy");
    c.proxy_begin = (int)kvs_policy_param(p, "proxy_begin");
    c.proxy_end = (int)kvs_policy_param(p, "proxy_end");
    c.random_share = kvs_policy_param(p, "random_share");
    c.sinks = (int)kvs_policy_param(p, "sinks");
    c.recent = (int)kvs_policy_param(p, "recent");
    c.temperature = kvs_policy_param(p, "temperature");
    c.seed = (uint64_t)kvs_policy_param(p, "seed");
    c.min_prompt = (int)kvs_policy_param(p, "min_prompt");
    c.interval = (int)kvs_policy_param(p, "interval");
    c.mask = (int)kvs_policy_param(p, "mask");
    return c;
}

static void stop(kvs_policy *p)
{
    nacl_state *s = p->state;
    if (!s)
        return;
    for (int l = 0; l < s->n_layers; l++) {
        if (s->F)
            free(s->F[l]);
        if (s->dscore)
            free(s->dscore[l]);
    }
    for (int i = 0; s->live && i < s->n_layers * s->n_kv; i++)
        free(s->live[i]);
    free(s->F);
    free(s->dscore);
    free(s->evicted);
    free(s->steps);
    free(s->live);
    free(s->n_live);
    free(s->seen);
    free(s);
    p->state = NULL;
}

static kvs_status start(kvs_policy *p, kvs_error *err)
{
    kvs_status st = kvs_policy_check_context(p, err);
    if (st != KVS_OK)
        return st;
    nacl_state *s = calloc(1, sizeof *s);
    if (!s)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    p->state = s;
    s->cfg = cfg_of(p);
    s->n_layers = p->n_layers;
    s->n_kv = p->n_kv_heads;
    if ((st = kvs_nacl_make_plan(&s->cfg, p->n_prompt, p->budget, p->spec.user, &s->plan, err)) !=
        KVS_OK) {
        stop(p);
        return st;
    }
    s->dcap = s->plan.B + s->cfg.interval;
    const size_t L = (size_t)p->n_layers, LH = L * (size_t)p->n_kv_heads;
    s->F = calloc(L, sizeof *s->F);
    s->dscore = calloc(L, sizeof *s->dscore);
    s->evicted = calloc(L, sizeof *s->evicted);
    s->steps = calloc(L, sizeof *s->steps);
    int ok = s->F && s->dscore && s->evicted && s->steps;
    if (ok && s->cfg.mask) {
        s->live = calloc(LH, sizeof *s->live);
        s->n_live = calloc(LH, sizeof *s->n_live);
        s->seen = calloc(LH, sizeof *s->seen);
        s->live_cap = kvs_store_cfg(p->store)->max_slots;
        ok = s->live && s->n_live && s->seen;
    }
    if (!ok) {
        stop(p);
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    }
    return KVS_OK;
}

static size_t state_bytes(const kvs_policy *p)
{
    const nacl_state *s = p->state;
    size_t b = 0;
    for (int l = 0; s && l < s->n_layers; l++) {
        if (s->F[l])
            b += sizeof(float) * (size_t)s->n_kv * s->plan.p;
        if (s->dscore[l])
            b += sizeof(float) * (size_t)s->n_kv * s->dcap;
        for (int h = 0; s->live && h < s->n_kv; h++)
            if (s->live[l * s->n_kv + h])
                b += sizeof(int) * (size_t)s->live_cap;
    }
    return b;
}

static int wants_row(const kvs_policy *p, int layer, int32_t pos)
{
    (void)layer;
    const nacl_state *s = p->state;
    return s->plan.evict && pos >= s->plan.proxy_begin && pos < s->plan.proxy_end;
}

static kvs_status prefill_chunk(kvs_policy *p, int layer, const kvs_chunk *c, kvs_error *err)
{
    nacl_state *s = p->state;
    if (!c->colsum)
        return KVS_OK;
    const int np = s->plan.p;
    if (!s->F[layer] && !(s->F[layer] = calloc((size_t)s->n_kv * np, sizeof(float))))
        return kvs_fail(err, KVS_ERR_NOMEM, "--kv %s: out of memory for proxy scores",
                        p->spec.user);
    return kvs_policy_add_group_mean(p, layer, c, s->F[layer], np, err);
}

/* Keeps entries keep[0..k) of head h: compacts the store, or (mask mode) narrows the attended
 * list, whose entries index slots. */
static void apply_keep(kvs_policy *p, int layer, int h, const int *keep, int k)
{
    nacl_state *s = p->state;
    if (!s->cfg.mask) {
        kvs_store_keep(p->store, layer, h, keep, k);
        return;
    }
    int *live = s->live[layer * s->n_kv + h];
    for (int i = 0; i < k; i++)
        live[i] = live[keep[i]]; /* keep is increasing and keep[i] >= i */
    s->n_live[layer * s->n_kv + h] = k;
}

static kvs_status prefill_end(kvs_policy *p, int layer, kvs_error *err)
{
    nacl_state *s = p->state;
    const kvs_nacl_plan *pl = &s->plan;
    kvs_status st = KVS_OK;
    if (!pl->evict)
        goto done;
    const int np = pl->p;
    const double inv_tau = s->cfg.temperature > 0 ? 1.0 / s->cfg.temperature : 0.0;
    int *keep = malloc(sizeof(int) * (size_t)np);
    uint8_t *prot = malloc((size_t)np);
    float *zero = s->F[layer] ? NULL : calloc((size_t)np, sizeof(float));
    if (!keep || !prot || (!s->F[layer] && !zero)) {
        st = kvs_fail(err, KVS_ERR_NOMEM, "--kv %s: out of memory", p->spec.user);
        goto out;
    }
    for (int h = 0; h < s->n_kv && st == KVS_OK; h++) {
        const int n = kvs_store_count(p->store, layer, h);
        const int32_t *pos = kvs_store_pos(p->store, layer, h);
        if (n != np) {
            st = kvs_fail(err, KVS_ERR_ARG, "--kv %s: %d slots at the end of a prompt of %d "
                          "tokens", p->spec.user, n, np);
            break;
        }
        for (int j = 0; j < n; j++)
            prot[j] = (uint8_t)kvs_nacl_protected(pl, pos[j]);
        const float *F = s->F[layer] ? s->F[layer] + (size_t)h * np : zero;
        int k = kvs_nacl_select(F, pos, prot, n, pl->C_p, pl->C_r, inv_tau, s->cfg.seed, layer,
                                h, 0, keep, NULL, NULL);
        if (k < 0) {
            st = kvs_fail(err, KVS_ERR_NOMEM, "--kv %s: out of memory", p->spec.user);
            break;
        }
        if (s->cfg.mask) {
            int **live = &s->live[layer * s->n_kv + h];
            if (!(*live = malloc(sizeof(int) * (size_t)s->live_cap))) {
                st = kvs_fail(err, KVS_ERR_NOMEM, "--kv %s: out of memory", p->spec.user);
                break;
            }
            for (int i = 0; i < n; i++)
                (*live)[i] = i;
            s->n_live[layer * s->n_kv + h] = n;
            s->seen[layer * s->n_kv + h] = n;
        }
        apply_keep(p, layer, h, keep, k);
    }
    if (st == KVS_OK) {
        s->evicted[layer] = 1;
        if (s->cfg.interval > 0 &&
            !(s->dscore[layer] = calloc((size_t)s->n_kv * s->dcap, sizeof(float))))
            st = kvs_fail(err, KVS_ERR_NOMEM, "--kv %s: out of memory", p->spec.user);
    }
out:
    free(keep);
    free(prot);
    free(zero);
done:
    free(s->F[layer]);
    s->F[layer] = NULL;
    return st;
}

/* Mask mode: the kept prompt slots and every slot appended since. */
static int select_slots(kvs_policy *p, int layer, int kv_head, const float *q, int *slots)
{
    (void)q;
    nacl_state *s = p->state;
    if (!s->cfg.mask || !s->evicted[layer])
        return -1;
    const int i = layer * s->n_kv + kv_head;
    const int n = kvs_store_count(p->store, layer, kv_head);
    for (int j = s->seen[i]; j < n && s->n_live[i] < s->live_cap; j++)
        s->live[i][s->n_live[i]++] = j;
    s->seen[i] = n;
    memcpy(slots, s->live[i], sizeof(int) * (size_t)s->n_live[i]);
    return s->n_live[i];
}

/* Periodic mode: the decoded tokens' attention rows accumulate per attended entry; every
 * `interval` steps the layer goes back to B (event = the re-eviction's number, from 1). */
static kvs_status after_attention(kvs_policy *p, int layer, const float *probs, int stride,
                                  kvs_error *err)
{
    nacl_state *s = p->state;
    if (s->cfg.interval == 0 || !s->evicted[layer] || !s->dscore[layer])
        return KVS_OK;
    const kvs_nacl_plan *pl = &s->plan;
    const int group = p->n_heads / p->n_kv_heads;
    for (int h = 0; h < s->n_kv; h++) {
        const int n = s->cfg.mask ? s->n_live[layer * s->n_kv + h]
                                  : kvs_store_count(p->store, layer, h);
        if (n > s->dcap)
            return kvs_fail(err, KVS_ERR_ARG, "--kv %s: %d slots, more than budget + interval",
                            p->spec.user, n);
        kvs_group_mean_add(s->dscore[layer] + (size_t)h * s->dcap,
                           probs + (size_t)h * group * stride, (size_t)stride, group, n);
    }
    if (++s->steps[layer] % s->cfg.interval != 0)
        return KVS_OK;
    const uint64_t event = (uint64_t)(s->steps[layer] / s->cfg.interval);
    const double inv_tau = s->cfg.temperature > 0 ? 1.0 / s->cfg.temperature : 0.0;
    int *keep = malloc(sizeof(int) * (size_t)s->dcap);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)s->dcap);
    uint8_t *prot = malloc((size_t)s->dcap);
    kvs_status st = KVS_OK;
    if (!keep || !pos || !prot)
        st = kvs_fail(err, KVS_ERR_NOMEM, "--kv %s: out of memory", p->spec.user);
    for (int h = 0; h < s->n_kv && st == KVS_OK; h++) {
        const int *live = s->cfg.mask ? s->live[layer * s->n_kv + h] : NULL;
        const int n = live ? s->n_live[layer * s->n_kv + h] : kvs_store_count(p->store, layer, h);
        const int32_t *spos = kvs_store_pos(p->store, layer, h);
        float *ds = s->dscore[layer] + (size_t)h * s->dcap;
        if (n > pl->B) {
            for (int e = 0; e < n; e++) {
                pos[e] = spos[live ? live[e] : e];
                prot[e] = (uint8_t)(pos[e] < pl->n_sink || e >= n - pl->n_recent);
            }
            int k = kvs_nacl_select(ds, pos, prot, n, pl->dec_C_p, pl->dec_C_r, inv_tau,
                                    s->cfg.seed, layer, h, event, keep, NULL, NULL);
            if (k < 0) {
                st = kvs_fail(err, KVS_ERR_NOMEM, "--kv %s: out of memory", p->spec.user);
                break;
            }
            apply_keep(p, layer, h, keep, k);
        }
        memset(ds, 0, sizeof(float) * (size_t)s->dcap);
    }
    free(keep);
    free(pos);
    free(prot);
    return st;
}

const kvs_nacl_cfg *kvs_nacl_config(const kvs_policy *p)
{
    return p->type == &kvs_policy_nacl && p->state ? &((const nacl_state *)p->state)->cfg : NULL;
}

const kvs_nacl_plan *kvs_nacl_plan_of(const kvs_policy *p)
{
    return p->type == &kvs_policy_nacl && p->state ? &((const nacl_state *)p->state)->plan : NULL;
}

const float *kvs_nacl_scores(const kvs_policy *p, int layer)
{
    if (p->type != &kvs_policy_nacl || !p->state || layer < 0 || layer >= p->n_layers)
        return NULL;
    return ((const nacl_state *)p->state)->F[layer];
}

const kvs_policy_type kvs_policy_nacl = {
    .name = "nacl",
    .summary = "NaCl: proxy-token attention top-k + softmax-weighted random picks, one-shot",
    .kind = KVS_KIND_ONE_SHOT,
    .params = params,
    .n_params = N_PARAMS,
    .start = start,
    .stop = stop,
    .state_bytes = state_bytes,
    .wants_row = wants_row,
    .prefill_chunk = prefill_chunk,
    .prefill_end = prefill_end,
    .select = select_slots,
    .after_attention = after_attention,
};
