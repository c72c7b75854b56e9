/* Next-token sampling: greedy, temperature, top-k, top-p.
 *
 * Order of operations (the llama.cpp convention): softmax(logits / T) over the candidates, keep
 * the k most likely (ties: lower id), renormalise, keep the smallest most-likely-first prefix whose
 * cumulative probability reaches top_p (at least one token), renormalise, draw. Candidates are
 * ranked by logit (exact, no exp() rounding ties), NaN logits count as -inf. Arithmetic is in
 * double; the uniform draw takes 53 bits of a xoshiro256** generator seeded via splitmix64
 * (core/random.h). */
#include "tokenizer/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/number.h"
#include "core/random.h"

struct kvs_sampler {
    int n;
    kvs_sampler_params p;
    kvs_xoshiro rng;
    int *cand;
    double *w;
    float *key; /* logits with NaN replaced by -inf */
};

/* uniform in [0, 1) */
static double next_unit(kvs_sampler *s) { return kvs_random_unit(kvs_xoshiro_next(&s->rng)); }

kvs_sampler_params kvs_sampler_default_params(void)
{
    kvs_sampler_params p = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 42};
    return p;
}

kvs_status kvs_sampler_new(int n_vocab, const kvs_sampler_params *params, kvs_sampler **out,
                           kvs_error *err)
{
    if (err) {
        err->code = KVS_OK;
        err->msg[0] = 0;
    }
    if (!out)
        return kvs_fail(err, KVS_ERR_ARG, "kvs_sampler_new: out is NULL");
    *out = NULL;
    if (!params)
        return kvs_fail(err, KVS_ERR_ARG, "kvs_sampler_new: params is NULL");
    if (n_vocab <= 0)
        return kvs_fail(err, KVS_ERR_ARG, "sampler: the vocabulary size must be >= 1, got %d",
                        n_vocab);
    char buf[32];
    if (!(params->temperature >= 0.0f) || isinf(params->temperature))
        return kvs_fail(err, KVS_ERR_ARG, "sampler: temperature %s must be a finite number >= 0",
                        kvs_format_number(buf, sizeof buf, params->temperature));
    if (params->top_k < 0)
        return kvs_fail(err, KVS_ERR_ARG, "sampler: top_k %d must be >= 0 (0 = off)",
                        params->top_k);
    if (!(params->top_p >= 0.0f && params->top_p <= 1.0f))
        return kvs_fail(err, KVS_ERR_ARG, "sampler: top_p %s must be in [0, 1] (1 = off)",
                        kvs_format_number(buf, sizeof buf, params->top_p));
    kvs_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for a sampler");
    s->n = n_vocab;
    s->p = *params;
    kvs_xoshiro_seed(&s->rng, params->seed);
    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    s->w = malloc((size_t)n_vocab * sizeof *s->w);
    s->key = malloc((size_t)n_vocab * sizeof *s->key);
    if (!s->cand || !s->w || !s->key) {
        kvs_sampler_free(s);
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for a sampler over %d tokens",
                        n_vocab);
    }
    *out = s;
    return KVS_OK;
}

void kvs_sampler_free(kvs_sampler *s)
{
    if (!s) return;
    free(s->cand);
    free(s->w);
    free(s->key);
    free(s);
}

/* token a ranks above token b: larger logit, then lower id */
static inline int above(const float *key, int a, int b)
{
    if (key[a] != key[b]) return key[a] > key[b];
    return a < b;
}

/* Heap over ids. With best_root = 0 the root is the lowest-ranked id (min-heap, for keeping the
 * k best); with best_root = 1 it is the highest-ranked (max-heap, for extracting best first). */
static void sift_down(int *h, int n, int i, const float *key, int best_root)
{
    int v = h[i];
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && above(key, h[c + 1], h[c]) == best_root) c++;
        if (above(key, h[c], v) != best_root) break; /* ids are distinct: no equality */
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
}

static void heapify(int *h, int n, const float *key, int best_root)
{
    for (int i = n / 2 - 1; i >= 0; i--) sift_down(h, n, i, key, best_root);
}

/* Pops the best of the max-heap h[0..n): returns it; the heap shrinks to n - 1. */
static int pop_best(int *h, int n, const float *key)
{
    int top = h[0];
    h[0] = h[n - 1];
    h[n - 1] = top;
    sift_down(h, n - 1, 0, key, 1);
    return top;
}

int kvs_sampler_sample(kvs_sampler *s, const float *logits)
{
    if (!s || !logits) return -1;
    const int n = s->n;
    float *key = s->key;
    int best = 0;
    for (int i = 0; i < n; i++) {
        key[i] = isnan(logits[i]) ? -INFINITY : logits[i];
        if (key[i] > key[best]) best = i;
    }
    const float temp = s->p.temperature;
    if (!(temp > 0.0f)) return best; /* 0, negative or NaN: greedy, ties to the lowest id */
    const float maxv = key[best];
    if (maxv == -INFINITY || maxv == INFINITY) return best; /* degenerate distributions */

    int *cand = s->cand;
    double *w = s->w;
    const double inv_t = 1.0 / (double)temp;
    int nc = 0;
    int k = s->p.top_k;
    if (k > 0 && k < n) {
        /* keep the k best in a heap whose root is the weakest kept candidate */
        for (int i = 0; i < k; i++) cand[i] = i;
        heapify(cand, k, key, 0);
        for (int i = k; i < n; i++) {
            if (above(key, i, cand[0])) {
                cand[0] = i;
                sift_down(cand, k, 0, key, 0);
            }
        }
        nc = k;
    } else {
        for (int i = 0; i < n; i++)
            if (key[i] > -INFINITY) cand[nc++] = i;
    }

    double total = 0.0; /* w is indexed by token id */
    for (int j = 0; j < nc; j++) {
        int id = cand[j];
        w[id] = exp(((double)key[id] - (double)maxv) * inv_t);
        total += w[id];
    }

    const float top_p = s->p.top_p;
    if (top_p < 1.0f) { /* NaN compares false: off */
        /* Extract candidates best first until their mass reaches top_p of the total: heapify
         * is O(nc), each extraction O(log nc), so only the nucleus gets sorted. Extracted ids
         * collect at the end of cand (best at nc - 1); copy them to the front in order. */
        double p = top_p > 0.0f ? (double)top_p : 0.0;
        double target = p * total, cum = 0.0;
        heapify(cand, nc, key, 1);
        int m = 0;
        while (m < nc) {
            int id = pop_best(cand, nc - m, key);
            m++;
            cum += w[id];
            if (cum >= target) break;
        }
        for (int j = 0; j < m; j++) { /* cand[nc - m .. nc) holds them worst first */
            int hi = nc - 1 - j, lo = nc - m + j;
            if (lo >= hi) break;
            int tmp = cand[lo];
            cand[lo] = cand[hi];
            cand[hi] = tmp;
        }
        memmove(cand, cand + (nc - m), (size_t)m * sizeof *cand);
        nc = m;
        total = cum;
    }

    double r = next_unit(s) * total, acc = 0.0;
    int last = cand[0];
    for (int j = 0; j < nc; j++) {
        double wj = w[cand[j]];
        if (wj <= 0.0) continue;
        acc += wj;
        last = cand[j];
        if (r < acc) return cand[j];
    }
    return last; /* rounding: r landed on the total */
}
