/* hashevict (HashEvict, methods/hashevict.md), and the slot-table machinery it shares with
 * l2evict (its "L2" baseline, l2evict.c; shared through hashevict_internal.h).
 *
 * HashEvict holds C = budget slots per (layer, KV head). Each layer has a seeded Gaussian
 * projection R_l (bits x head_dim, shared by the layer's heads, for keys and queries alike); a
 * slot's metadata is the SimHash code of its post-RoPE key, bit-packed in 64-bit words. At a
 * decode step (before_append, i.e. before attention), per KV head: hash the new key and the
 * group's queries; if the head holds fewer than C tokens the new one takes a free slot, else the
 * victim is the slot with the largest Hamming distance to the query codes summed over the group
 * (mode=query; mode=key: to the new key's code), among slots that are neither sinks
 * (position < sinks) nor in the recent window (position >= t - recent). Nothing from the
 * softmax is read; the new token then attends over the live slots, itself included.
 *
 * Physical slots. The spec overwrites the victim's slot in place and breaks ties by the lowest
 * slot index. The policy keeps the spec's table per (layer, head): pos[C] and code[C][nw]
 * indexed by physical slot; the new token takes the victim's physical slot. The store is only
 * K/V, in an order of its own: it removes the victim by moving its last row into the victim's
 * place (kvs_store_remove_unordered: one row moved, where keeping position order moved up to
 * half the head) and appends the new token at its end. The victim's store row is found by its
 * position, a scan of C ints (no index is kept: it would be state to count). ties=slot breaks
 * ties by the lowest physical slot (spec parity); ties=oldest (default) by the oldest
 * position.
 *
 * Prefill. prefill=paper (default): the first C prompt tokens are prefilled densely (in chunks
 * of at most the session's chunk size) and hashed; every later prompt token is fed on its own
 * through the decode-time eviction (prompt_batch returns 1: kv.c runs before_append for it).
 * Peak KV memory stays at C. prefill=recent (the authors' code path): dense prefill; after every
 * chunk the head keeps the sinks and the newest C - sinks tokens, stored in position order
 * (physical slot = rank) and hashed. With a prompt of one chunk this is the spec's dense
 * prefill over all N tokens; with several chunks later chunks see the truncated cache (as
 * streaming and h2o here), which bounds peak memory at C + chunk.
 *
 * l2evict (l2evict.c): the same machinery with the key's L2 norm as a slot's metadata and the
 * largest norm as the victim; its prompt rule (prefill=norm) is kvs_l2_keep_lowest_norms.
 *
 * Memory (state_bytes): codes as allocated (C x nw x 8 bytes per head), R (bits x head_dim x 4
 * per layer), the physical table's positions (C x 4 per head), l2evict's norms (C x 4 per head);
 * allocated for C slots per head when the prompt starts. Not counted (working memory, as the
 * attention scratch): per-step scratch and the record of the last token's q and k rows that
 * kvs_hashevict_view exposes to tests.
 *
 * Cost per decode step (kvs_hashevict_timing; bench/hashevict_bench.sh): hashing (Hq + Hkv) x
 * bits dot products of head_dim; the victim search XOR + popcount over C slots per KV head (AVX-512 VPOPCNTDQ when
 * available); the eviction (one row moved in the store, the table's slot written). */
#include "policies/hashevict_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__AVX512F__) && defined(__AVX512VPOPCNTDQ__)
#include <immintrin.h>
#endif

#include "core/kernels.h"
#include "core/random.h"
#include "policies/policies.h"

/* ---- the projection generator (documented in hashevict.h) ---- */

void kvs_he_gauss(uint64_t seed, uint64_t stream, float *out, size_t n)
{
    kvs_xoshiro g;
    kvs_xoshiro_seed(&g, seed ^ (0xd1b54a32d192ed03ULL * (stream + 1)));
    for (size_t i = 0; i < n; i += 2) {
        const double u1 = kvs_random_unit(kvs_xoshiro_next(&g));
        const double u2 = kvs_random_unit(kvs_xoshiro_next(&g));
        const double r = sqrt(-2.0 * log(1.0 - u1)), a = 2.0 * M_PI * u2;
        out[i] = (float)(r * cos(a));
        if (i + 1 < n)
            out[i + 1] = (float)(r * sin(a));
    }
}

void kvs_he_projection(uint64_t seed, int layer, int bits, int dim, float *R)
{
    kvs_he_gauss(seed, (uint64_t)layer, R, (size_t)bits * dim);
}

void kvs_he_hash(const float *R, int bits, int dim, const float *x, uint64_t *code)
{
    const int nw = kvs_he_words(bits);
    for (int w = 0; w < nw; w++)
        code[w] = 0;
    for (int i = 0; i < bits; i++)
        if (kvs_dot_f32(R + (size_t)i * dim, x, dim) >= 0.0f)
            code[i >> 6] |= 1ULL << (i & 63);
}

int kvs_he_hamming(const uint64_t *a, const uint64_t *b, int nw)
{
    int d = 0;
    for (int w = 0; w < nw; w++)
        d += __builtin_popcountll(a[w] ^ b[w]);
    return d;
}

/* One-word codes (bits <= 64), the common case: every slot gets the key
 * (distance + 1) << 32 | tie, where tie is UINT32_MAX - position (ties=oldest) or
 * UINT32_MAX - slot (ties=slot), and 0 when the slot is protected; the victim has the largest
 * key. Branch-free, so the compiler vectorises it (VPOPCNTQ, VPMAXUQ with AVX-512). NQ query
 * codes (a compile-time count; 0 = nq at run time). */
#define VICTIM_1W(NAME, NQ)                                                                 \
    static uint64_t NAME(const uint64_t *codes, const int32_t *pos, int n,                  \
                         const uint64_t *q, int nq, int32_t t, int sinks, int recent,        \
                         int ties)                                                           \
    {                                                                                        \
        const int64_t lim = (int64_t)t - recent;                                             \
        const int g_n = NQ ? NQ : nq;                                                        \
        uint64_t best = 0;                                                                   \
        for (int s = 0; s < n; s++) {                                                        \
            uint64_t d = 1;                                                                  \
            for (int g = 0; g < g_n; g++)                                                    \
                d += (uint64_t)__builtin_popcountll(codes[s] ^ q[g]);                        \
            const uint32_t tie = ties == KVS_HE_TIES_OLDEST ? (uint32_t)pos[s] : (uint32_t)s; \
            const uint64_t key = d << 32 | (uint64_t)(UINT32_MAX - tie);                     \
            const int ok = pos[s] >= sinks && (int64_t)pos[s] < lim;                         \
            const uint64_t k = ok ? key : 0;                                                 \
            best = k > best ? k : best;                                                      \
        }                                                                                    \
        return best;                                                                         \
    }
VICTIM_1W(victim_1w_q1, 1)
VICTIM_1W(victim_1w_q2, 2)
VICTIM_1W(victim_1w_qn, 0)

#if defined(__AVX512F__) && defined(__AVX512VPOPCNTDQ__)
/* The same keys, eight slots at a time. */
static uint64_t victim_1w_avx512(const uint64_t *codes, const int32_t *pos, int n,
                                 const uint64_t *q, int nq, int32_t t, int sinks, int recent,
                                 int ties)
{
    const __m512i lim = _mm512_set1_epi64((int64_t)t - recent), lo = _mm512_set1_epi64(sinks);
    const __m512i allones32 = _mm512_set1_epi64(UINT32_MAX), one = _mm512_set1_epi64(1);
    const __m512i iota = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
    __m512i best = _mm512_setzero_si512();
    for (int s = 0; s < n; s += 8) {
        const __mmask8 m = n - s >= 8 ? 0xff : (__mmask8)((1u << (n - s)) - 1u);
        const __m512i c = _mm512_maskz_loadu_epi64(m, codes + s);
        const __m512i p = _mm512_cvtepi32_epi64(_mm256_maskz_loadu_epi32(m, pos + s));
        __m512i d = one;
        for (int g = 0; g < nq; g++) {
            const __m512i x = _mm512_xor_si512(c, _mm512_set1_epi64((long long)q[g]));
            d = _mm512_add_epi64(d, _mm512_popcnt_epi64(x));
        }
        const __m512i tie = ties == KVS_HE_TIES_OLDEST
                                ? p : _mm512_add_epi64(_mm512_set1_epi64(s), iota);
        const __m512i key = _mm512_or_si512(_mm512_slli_epi64(d, 32),
                                            _mm512_sub_epi64(allones32, tie));
        const __mmask8 ok = m & _mm512_cmpge_epi64_mask(p, lo) & _mm512_cmplt_epi64_mask(p, lim);
        best = _mm512_mask_max_epu64(best, ok, best, key);
    }
    return _mm512_reduce_max_epu64(best);
}
#endif

/* The slot of the largest one-word key (0: none). */
static int victim_of_key(uint64_t best, const int32_t *pos, int n, int ties)
{
    if (best == 0)
        return -1;
    const uint32_t tie = UINT32_MAX - (uint32_t)best;
    if (ties != KVS_HE_TIES_OLDEST)
        return (int)tie;
    for (int s = 0; s < n; s++) /* positions are unique within a table */
        if ((uint32_t)pos[s] == tie)
            return s;
    return -1;
}

int kvs_he_victim_portable(const uint64_t *codes, const int32_t *pos, int n,
                           const uint64_t *qcodes, int nq, int32_t t, int sinks, int recent,
                           int ties)
{
    const uint64_t best =
        nq == 1   ? victim_1w_q1(codes, pos, n, qcodes, nq, t, sinks, recent, ties)
        : nq == 2 ? victim_1w_q2(codes, pos, n, qcodes, nq, t, sinks, recent, ties)
                  : victim_1w_qn(codes, pos, n, qcodes, nq, t, sinks, recent, ties);
    return victim_of_key(best, pos, n, ties);
}

int kvs_he_victim(const uint64_t *codes, const int32_t *pos, int n, int nw,
                  const uint64_t *qcodes, int nq, int32_t t, int sinks, int recent, int ties)
{
    if (nw == 1) {
#if defined(__AVX512F__) && defined(__AVX512VPOPCNTDQ__)
        return victim_of_key(victim_1w_avx512(codes, pos, n, qcodes, nq, t, sinks, recent, ties),
                             pos, n, ties);
#else
        return kvs_he_victim_portable(codes, pos, n, qcodes, nq, t, sinks, recent, ties);
#endif
    }
    int best = -1, best_d = -1;
    for (int s = 0; s < n; s++) {
        if (!kvs_he_evictable(pos[s], t, sinks, recent))
            continue;
        int d = 0;
        for (int g = 0; g < nq; g++)
            d += kvs_he_hamming(codes + (size_t)s * nw, qcodes + (size_t)g * nw, nw);
        /* Ascending slots with a strict '>' keep the lowest slot among equals (ties=slot). */
        if (d > best_d || (d == best_d && ties == KVS_HE_TIES_OLDEST && pos[s] < pos[best])) {
            best = s;
            best_d = d;
        }
    }
    return best;
}

/* ---- the policy ---- */

typedef struct he_state {
    int l2; /* l2evict */
    int bits, nw, sinks, recent, mode, ties, prefill, gqa;
    int cap, group, hd, nkv, nq_heads;
    float *R;         /* L x bits x hd */
    int32_t *pos;     /* L x Hkv x cap: position held by each physical slot */
    uint64_t *code;   /* L x Hkv x cap x nw */
    float *norm;      /* l2evict: L x Hkv x cap */
    int *n_filled;    /* L x Hkv */
    int32_t *placed;  /* L: the newest position in the layer's tables, -1 */
    /* per-step scratch */
    uint64_t *kcodes; /* Hkv x nw */
    uint64_t *qcodes; /* Hq x nw */
    float *kbuf;      /* Hkv x hd: new keys as the store holds them */
    float *knorm;     /* Hkv */
    float *qmean;     /* hd */
    uint16_t *f16;    /* hd */
    float *scores;    /* cap + chunk scratch for prefill (grown) */
    size_t scores_cap;
    int *victim;      /* Hkv */
    /* the last token given to before_append, per layer */
    float *last_q, *last_k;
    int32_t *last_pos, *last_victim;
    kvs_he_timing timing;
} he_state;

static const kvs_param_def he_params[] = {
    {"bits", 16, 1, KVS_HE_MAX_BITS, 1, "hash bits per code"},
    {"sinks", 4, 0, 1 << 20, 1, "first positions never evicted"},
    {"recent", 10, 0, 1 << 20, 1, "most recent positions never evicted"},
    {"mode", 0, 0, 1, 1, "score with the query codes (paper) or the new key's code (code)"},
    {"seed", 0, 0, 4294967295.0, 1, "seed of the projections"},
    {"ties", 0, 0, 1, 1, "equal distances: evict the oldest, or the lowest physical slot (spec)"},
    {"prefill", 0, 0, 1, 1, "prompt beyond the budget: fed token by token (paper) or sinks + "
                            "most recent (authors' code)"},
    {"gqa", 0, 0, 1, 1, "query heads of a group: sum their distances, or hash their mean"},
};
static const char *const mode_words[] = {"query", "key", NULL};
const char *const kvs_he_ties_words[] = {"oldest", "slot", NULL};
static const char *const he_prefill_words[] = {"paper", "recent", NULL};
static const char *const gqa_words[] = {"sum", "meanq", NULL};
static const kvs_param_words he_words[] = {
    {"mode", mode_words},
    {"ties", kvs_he_ties_words},
    {"prefill", he_prefill_words},
    {"gqa", gqa_words}};

static int is_ours(const kvs_policy *p)
{
    return p->type == &kvs_policy_hashevict || p->type == &kvs_policy_l2evict;
}

static void free_state(he_state *st)
{
    if (!st)
        return;
    free(st->R);
    free(st->pos);
    free(st->code);
    free(st->norm);
    free(st->n_filled);
    free(st->placed);
    free(st->kcodes);
    free(st->qcodes);
    free(st->kbuf);
    free(st->knorm);
    free(st->qmean);
    free(st->f16);
    free(st->scores);
    free(st->victim);
    free(st->last_q);
    free(st->last_k);
    free(st->last_pos);
    free(st->last_victim);
    free(st);
}

static double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void kvs_he_stop(kvs_policy *p)
{
    free_state(p->state);
    p->state = NULL;
}

/* sinks + recent + one evictable slot. */
int kvs_he_min_budget(const kvs_policy_spec *spec)
{
    double m = kvs_policy_spec_param(spec, "sinks") + kvs_policy_spec_param(spec, "recent") + 1;
    return m > INT32_MAX ? INT32_MAX : (int)m;
}

kvs_status kvs_he_start(kvs_policy *p, int l2, kvs_error *err)
{
    kvs_status s = kvs_policy_check_context(p, err);
    if (s != KVS_OK)
        return s;
    const int sinks = (int)kvs_policy_param(p, "sinks"),
              recent = (int)kvs_policy_param(p, "recent");
    if ((int64_t)p->budget < (int64_t)sinks + recent + 1)
        return kvs_fail(err, KVS_ERR_ARG,
                        "--kv %s: budget of %d slots must exceed sinks + recent = %d + %d: no "
                        "slot would be evictable", p->spec.user, p->budget, sinks, recent);
    he_state *st = calloc(1, sizeof *st);
    if (!st)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    const int L = p->n_layers, nkv = p->n_kv_heads, hd = p->head_dim;
    st->l2 = l2;
    st->bits = l2 ? 0 : (int)kvs_policy_param(p, "bits");
    st->nw = l2 ? 0 : kvs_he_words(st->bits);
    st->sinks = sinks;
    st->recent = recent;
    st->mode = l2 ? 0 : (int)kvs_policy_param(p, "mode");
    st->ties = (int)kvs_policy_param(p, "ties");
    st->prefill = (int)kvs_policy_param(p, "prefill");
    st->gqa = l2 ? 0 : (int)kvs_policy_param(p, "gqa");
    st->cap = p->budget;
    st->group = p->n_heads / nkv;
    st->hd = hd;
    st->nkv = nkv;
    st->nq_heads = p->n_heads;
    const size_t heads = (size_t)L * nkv, slots = heads * (size_t)st->cap;
    int ok = (st->pos = malloc(sizeof(int32_t) * slots)) &&
             (st->n_filled = calloc(heads, sizeof(int))) &&
             (st->placed = malloc(sizeof(int32_t) * (size_t)L)) &&
             (st->kbuf = malloc(sizeof(float) * (size_t)nkv * hd)) &&
             (st->knorm = malloc(sizeof(float) * (size_t)nkv)) &&
             (st->qmean = malloc(sizeof(float) * (size_t)hd)) &&
             (st->f16 = malloc(sizeof(uint16_t) * (size_t)hd)) &&
             (st->victim = malloc(sizeof(int) * (size_t)nkv)) &&
             (st->last_q = calloc((size_t)L * p->n_heads * hd, sizeof(float))) &&
             (st->last_k = calloc((size_t)L * nkv * hd, sizeof(float))) &&
             (st->last_pos = malloc(sizeof(int32_t) * (size_t)L)) &&
             (st->last_victim = malloc(sizeof(int32_t) * heads));
    if (ok && l2)
        ok = (st->norm = malloc(sizeof(float) * slots)) != NULL;
    if (ok && !l2)
        ok = (st->R = malloc(sizeof(float) * (size_t)L * st->bits * hd)) &&
             (st->code = malloc(sizeof(uint64_t) * slots * st->nw)) &&
             (st->kcodes = malloc(sizeof(uint64_t) * (size_t)nkv * st->nw)) &&
             (st->qcodes = malloc(sizeof(uint64_t) * (size_t)p->n_heads * st->nw));
    if (!ok) {
        free_state(st);
        return kvs_fail(err, KVS_ERR_NOMEM, "--kv %s: out of memory for %d slots per head",
                        p->spec.user, p->budget);
    }
    const uint64_t seed = l2 ? 0 : (uint64_t)kvs_policy_param(p, "seed");
    for (int l = 0; l < L; l++) {
        st->placed[l] = -1;
        st->last_pos[l] = -1;
        if (!l2)
            kvs_he_projection(seed, l, st->bits, hd, st->R + (size_t)l * st->bits * hd);
    }
    for (size_t i = 0; i < heads; i++)
        st->last_victim[i] = -1;
    p->state = st;
    return KVS_OK;
}

static kvs_status he_start(kvs_policy *p, kvs_error *err) { return kvs_he_start(p, 0, err); }

static size_t head_index(const he_state *st, int layer, int h)
{
    return (size_t)layer * st->nkv + h;
}

static int32_t *table_pos(he_state *st, int layer, int h)
{
    return st->pos + head_index(st, layer, h) * st->cap;
}

static uint64_t *table_code(he_state *st, int layer, int h)
{
    return st->code + head_index(st, layer, h) * st->cap * st->nw;
}

static float *table_norm(he_state *st, int layer, int h)
{
    return st->norm + head_index(st, layer, h) * st->cap;
}

static const float *layer_R(const he_state *st, int layer)
{
    return st->R + (size_t)layer * st->bits * st->hd;
}

/* Physical slot `slot` of (layer, h) now holds position pos with key `key` (as stored). */
static void put(he_state *st, int layer, int h, int slot, int32_t pos, const float *key)
{
    table_pos(st, layer, h)[slot] = pos;
    if (st->l2)
        table_norm(st, layer, h)[slot] = kvs_he_l2_norm(key, st->hd);
    else
        kvs_he_hash(layer_R(st, layer), st->bits, st->hd, key,
                    table_code(st, layer, h) + (size_t)slot * st->nw);
}

static float *scores_buf(he_state *st, size_t n)
{
    if (n > st->scores_cap) {
        float *b = realloc(st->scores, sizeof(float) * n);
        if (!b)
            return NULL;
        st->scores = b;
        st->scores_cap = n;
    }
    return st->scores;
}

kvs_status kvs_he_prefill_chunk(kvs_policy *p, int layer, const kvs_chunk *c, kvs_error *err)
{
    he_state *st = p->state;
    const int C = st->cap;
    float *key = st->kbuf; /* one row of scratch */
    for (int h = 0; h < st->nkv; h++) {
        int n = kvs_store_count(p->store, layer, h);
        int *filled = &st->n_filled[head_index(st, layer, h)];
        if (st->prefill != KVS_HE_PREFILL_PAPER && n > C) {
            /* The code's rule, per chunk: hashevict keeps the sinks and the newest C - sinks;
             * l2evict the sinks, the recent window and the lowest norms up to C. */
            float *score = scores_buf(st, (size_t)n);
            if (!score)
                return kvs_fail(err, KVS_ERR_NOMEM, "--kv %s: out of memory", p->spec.user);
            kvs_status kst;
            if (!st->l2) { /* the sinks and the newest C - sinks: nothing is ranked by score */
                memset(score, 0, sizeof(float) * (size_t)n);
                kst = kvs_evict_keep_top(p->store, layer, h, score, C, st->sinks, C - st->sinks,
                                         KVS_TIE_KEEP_NEWER, err);
            } else {
                kst = kvs_l2_keep_lowest_norms(p, layer, h, score, key, st->sinks, st->recent,
                                               err);
            }
            if (kst != KVS_OK)
                return kst;
            /* The table in store order: physical slot = rank for a prompt in one go. */
            n = kvs_store_count(p->store, layer, h);
            const int32_t *spos = kvs_store_pos(p->store, layer, h);
            for (int i = 0; i < n; i++) {
                kvs_store_key_f32(p->store, layer, h, i, key);
                put(st, layer, h, i, spos[i], key);
            }
            *filled = n;
            continue;
        }
        /* Place the chunk's tokens that are not in the table yet (a fed token is already). */
        const int32_t *spos = kvs_store_pos(p->store, layer, h);
        int first = n;
        while (first > 0 && spos[first - 1] > st->placed[layer])
            first--;
        if (*filled + (n - first) > C)
            return kvs_fail(err, KVS_ERR_ARG, "--kv %s: a prompt batch of %d tokens overflows "
                            "the %d slots (the cache holds tokens from before this prompt, or "
                            "the batch is larger than kvs_kv_prompt_batch)",
                            p->spec.user, c->n, C);
        for (int i = first; i < n; i++) {
            kvs_store_key_f32(p->store, layer, h, i, key);
            put(st, layer, h, (*filled)++, spos[i], key);
        }
    }
    st->placed[layer] = c->pos[c->n - 1];
    return KVS_OK;
}

int kvs_he_prompt_batch(const kvs_policy *p, int done)
{
    const he_state *st = p->state;
    if (!st || st->prefill != KVS_HE_PREFILL_PAPER)
        return 0;
    return done < st->cap ? st->cap - done : 1;
}

/* The key row as the store will hold it (F16 stores round it). */
static const float *as_stored(const kvs_policy *p, he_state *st, const float *k, float *out)
{
    if (kvs_store_cfg(p->store)->type == KVS_F32)
        return k;
    kvs_quantize_row(KVS_F16, k, st->f16, st->hd);
    kvs_dequantize_row(KVS_F16, st->f16, out, st->hd);
    return out;
}

/* Index of pos in the positions held[0..n) (a store head's, in any order), or -1. */
static int find_pos(const int32_t *held, int n, int32_t pos)
{
    for (int i = 0; i < n; i++)
        if (held[i] == pos)
            return i;
    return -1;
}

kvs_status kvs_he_before_append(kvs_policy *p, int layer, const float *q, const float *k,
                                const float *v, int32_t pos, kvs_error *err)
{
    (void)v;
    he_state *st = p->state;
    const int nkv = st->nkv, group = st->group, hd = st->hd, nw = st->nw, C = st->cap;
    const int phase = p->in_prompt ? 1 : 0;
    if (layer == 0)
        st->timing.steps[phase]++;
    memcpy(st->last_q + (size_t)layer * st->nq_heads * hd, q, sizeof(float) * st->nq_heads * hd);
    memcpy(st->last_k + (size_t)layer * nkv * hd, k, sizeof(float) * (size_t)nkv * hd);
    st->last_pos[layer] = pos;

    /* 1. Codes (or norms) of the new keys, and the query codes. */
    const double t0 = seconds_now();
    int nq = 1;
    for (int h = 0; h < nkv; h++) {
        float *kb = st->kbuf + (size_t)h * hd;
        const float *key = as_stored(p, st, k + (size_t)h * hd, kb);
        if (key != kb)
            memcpy(kb, key, sizeof(float) * hd);
        if (st->l2) {
            st->knorm[h] = kvs_he_l2_norm(kb, hd);
            continue;
        }
        const float *R = layer_R(st, layer);
        kvs_he_hash(R, st->bits, hd, kb, st->kcodes + (size_t)h * nw);
        uint64_t *qc = st->qcodes + (size_t)h * group * nw;
        const float *qg = q + (size_t)h * group * hd;
        if (st->mode == KVS_HE_MODE_KEY) {
            memcpy(qc, st->kcodes + (size_t)h * nw, sizeof(uint64_t) * nw);
        } else if (st->gqa == KVS_HE_GQA_MEANQ) {
            for (int i = 0; i < hd; i++) {
                float s = 0.0f;
                for (int g = 0; g < group; g++)
                    s += qg[(size_t)g * hd + i];
                st->qmean[i] = s / (float)group;
            }
            kvs_he_hash(R, st->bits, hd, st->qmean, qc);
        } else {
            for (int g = 0; g < group; g++)
                kvs_he_hash(R, st->bits, hd, qg + (size_t)g * hd, qc + (size_t)g * nw);
            nq = group;
        }
    }

    /* 2. Victims: a free slot while the head holds fewer than C tokens. */
    const double t1 = seconds_now();
    for (int h = 0; h < nkv; h++) {
        const size_t hi = head_index(st, layer, h);
        const int n = st->n_filled[hi];
        const int32_t *tp = table_pos(st, layer, h);
        int j = -1;
        if (n >= C) {
            j = st->l2 ? kvs_he_victim_norm(table_norm(st, layer, h), tp, n, pos, st->sinks,
                                             st->recent, st->ties)
                       : kvs_he_victim(table_code(st, layer, h), tp, n, nw,
                                       st->qcodes + (size_t)h * group * nw, nq, pos, st->sinks,
                                       st->recent, st->ties);
            if (j < 0) /* defensive only (C > sinks + recent): the oldest non-sink slot */
                for (int s = 0; s < n; s++)
                    if (tp[s] >= st->sinks && (j < 0 || tp[s] < tp[j]))
                        j = s;
            if (j < 0)
                return kvs_fail(err, KVS_ERR_ARG, "--kv %s: no evictable slot", p->spec.user);
        }
        st->victim[h] = j;
    }

    /* 3. Remove the victims from the store; the new token takes the victim's physical slot and
     * the store's next row (the append that follows this hook). */
    const double t2 = seconds_now();
    for (int h = 0; h < nkv; h++) {
        const size_t hi = head_index(st, layer, h);
        int32_t *tp = table_pos(st, layer, h);
        int j = st->victim[h];
        st->last_victim[hi] = -1;
        if (j >= 0) {
            const int at = find_pos(kvs_store_pos(p->store, layer, h),
                                    kvs_store_count(p->store, layer, h), tp[j]);
            if (at < 0)
                return kvs_fail(err, KVS_ERR_ARG, "--kv %s: layer %d head %d: position %d of "
                                "slot %d is not in the store", p->spec.user, layer, h, tp[j], j);
            st->last_victim[hi] = tp[j];
            kvs_store_remove_unordered(p->store, layer, h, at);
        } else {
            j = st->n_filled[hi]++;
        }
        tp[j] = pos;
        if (st->l2)
            table_norm(st, layer, h)[j] = st->knorm[h];
        else
            memcpy(table_code(st, layer, h) + (size_t)j * nw, st->kcodes + (size_t)h * nw,
                   sizeof(uint64_t) * nw);
    }
    const double t3 = seconds_now();
    st->timing.hash_s[phase] += t1 - t0;
    st->timing.victim_s[phase] += t2 - t1;
    st->timing.evict_s[phase] += t3 - t2;
    st->placed[layer] = pos;
    return KVS_OK;
}

/* Position shifting moved the store's slots and re-rotated their keys: the table follows (each
 * physical slot keeps its token, with the token's new position) and codes are taken again from
 * the keys as now stored, since queries at the new positions are compared with them (l2evict's
 * norms too, for F16 rounding: a rotation keeps the norm). */
kvs_status kvs_he_shift(kvs_policy *p, int layer, const kvs_shift_info *sh, kvs_error *err)
{
    he_state *st = p->state;
    float *key = st->kbuf; /* one row of scratch */
    int most = 1;
    for (int h = 0; h < st->nkv; h++) {
        const int n = kvs_store_count(p->store, layer, h);
        most = n > most ? n : most;
    }
    /* The store's rows by old position (the store is in an order of its own), to find each
     * table slot's row in O(log n). */
    kvs_pos_slot *by = malloc(sizeof *by * (size_t)most);
    if (!by)
        return kvs_fail(err, KVS_ERR_NOMEM, "--kv %s: out of memory for position shifting",
                        p->spec.text);
    for (int h = 0; h < st->nkv; h++) {
        const int n = kvs_store_count(p->store, layer, h);
        const int32_t *now = kvs_store_pos(p->store, layer, h);
        int32_t *tp = table_pos(st, layer, h);
        const int filled = st->n_filled[head_index(st, layer, h)];
        for (int i = 0; i < n; i++)
            by[i] = (kvs_pos_slot){sh->old_pos[h][i], i};
        kvs_pos_slot_sort(by, n);
        for (int j = 0; j < filled; j++) {
            const kvs_pos_slot *at = kvs_pos_slot_find(by, n, tp[j]);
            if (!at) {
                free(by);
                return kvs_fail(err, KVS_ERR_ARG, "--kv %s: layer %d head %d: position %d of "
                                "slot %d is not in the store", p->spec.text, layer, h, tp[j], j);
            }
            kvs_store_key_f32(p->store, layer, h, at->slot, key);
            put(st, layer, h, j, now[at->slot], key);
        }
    }
    free(by);
    /* The newest placed position (the newest token, in every head) and the last token's. */
    const int n0 = kvs_store_count(p->store, layer, 0);
    const int32_t *now0 = kvs_store_pos(p->store, layer, 0);
    int32_t *marks[2] = {&st->placed[layer], &st->last_pos[layer]};
    for (int m = 0; m < 2; m++) {
        const int i = *marks[m] >= 0 ? find_pos(sh->old_pos[0], n0, *marks[m]) : -1;
        if (i >= 0)
            *marks[m] = now0[i];
        else if (*marks[m] >= sh->keep)
            *marks[m] = *marks[m] - sh->delta > sh->keep ? *marks[m] - sh->delta : sh->keep;
    }
    return KVS_OK;
}

size_t kvs_he_state_bytes(const kvs_policy *p)
{
    kvs_he_bytes b;
    return kvs_hashevict_bytes(p, &b) == 0 ? b.total : 0;
}

int kvs_hashevict_bytes(const kvs_policy *p, kvs_he_bytes *b)
{
    memset(b, 0, sizeof *b);
    const he_state *st = p->state;
    if (!is_ours(p) || !st)
        return -1;
    const size_t slots = (size_t)p->n_layers * st->nkv * st->cap;
    if (!st->l2) {
        b->codes_packed = slots * (size_t)((st->bits + 7) / 8);
        b->codes_allocated = slots * (size_t)st->nw * sizeof(uint64_t);
        b->projection = (size_t)p->n_layers * st->bits * st->hd * sizeof(float);
    } else {
        b->norms = slots * sizeof(float);
    }
    b->slot_table = slots * sizeof(int32_t);
    b->total = b->codes_allocated + b->projection + b->slot_table + b->norms;
    return 0;
}

int kvs_hashevict_view(const kvs_policy *p, int layer, int head, kvs_he_view *v)
{
    memset(v, 0, sizeof *v);
    he_state *st = p->state;
    if (!is_ours(p) || !st || layer < 0 || layer >= p->n_layers || head < 0 || head >= st->nkv)
        return -1;
    v->cap = st->cap;
    v->n_filled = st->n_filled[head_index(st, layer, head)];
    v->bits = st->bits;
    v->nw = st->nw;
    v->pos = table_pos(st, layer, head);
    v->codes = st->l2 ? NULL : table_code(st, layer, head);
    v->norm = st->l2 ? table_norm(st, layer, head) : NULL;
    v->R = st->l2 ? NULL : layer_R(st, layer);
    v->last_pos = st->last_pos[layer];
    v->last_victim = st->last_victim[head_index(st, layer, head)];
    v->last_q = st->last_q + (size_t)layer * st->nq_heads * st->hd;
    v->last_k = st->last_k + (size_t)layer * st->nkv * st->hd;
    return 0;
}

int kvs_hashevict_timing(const kvs_policy *p, kvs_he_timing *t)
{
    const he_state *st = p->state;
    if (!is_ours(p) || !st) {
        memset(t, 0, sizeof *t);
        return -1;
    }
    *t = st->timing;
    return 0;
}

int kvs_hashevict_timing_line(const kvs_policy *p, int phase, char *buf, size_t size)
{
    static const char *const name[2] = {"decode", "fed prompt tokens"};
    kvs_he_timing t;
    if (size > 0)
        buf[0] = 0;
    if (phase < 0 || phase > 1 || kvs_hashevict_timing(p, &t) != 0 || t.steps[phase] <= 0)
        return -1;
    const double n = (double)t.steps[phase];
    snprintf(buf, size, "%s timing, %s: %ld steps; per step: hash %.2f us, victim search %.2f "
             "us, evict (store removal + table) %.2f us", p->spec.user, name[phase],
             t.steps[phase], 1e6 * t.hash_s[phase] / n, 1e6 * t.victim_s[phase] / n,
             1e6 * t.evict_s[phase] / n);
    return 0;
}

const kvs_policy_type kvs_policy_hashevict = {
    .name = "hashevict",
    .summary = "HashEvict: SimHash codes, evict the largest Hamming distance to the query "
               "(pre-attention; sinks + recent window kept)",
    .params = he_params,
    .n_params = (int)(sizeof he_params / sizeof he_params[0]),
    .words = he_words,
    .n_words = (int)(sizeof he_words / sizeof he_words[0]),
    .start = he_start,
    KVS_HE_HOOKS,
};
