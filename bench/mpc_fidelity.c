/* Fidelity of the secure forward pass (src/mpc/forward.c) against the plaintext engine on a
 * token file: the first PROMPT_LEN tokens prefilled in blocks, then every token one at a time,
 * through the three roles (threads, loopback socket pairs, plain channels), the logits opened
 * after the prefill and after each later token; top-1 agreement, mean KL(plain || secure)
 * and the largest logit error over the scored rows (rows from --prompt-len on: the README
 * protocol scores t = 384..510 of stories260K-sample-512), with per-token costs, and the last
 * scored row's argmax and margin (a recall prompt's answer). A benchmark,
 * not a test (a 512-token run takes minutes).
 *   mpc_fidelity MODEL.gguf TOKENS [PROMPT_LEN (384)] [N_TOKENS (all)] [FRAC (16)] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvslim.h"
#include "kvslim_tools.h"
#include "model/llama.h"
#include "mpc/forward.h"
#include "mpc/local.h"

typedef struct fid_ctx {
    const struct kvs_model *model;
    kvs_mpc_shape shape;
    const int32_t *tokens;
    int n, plen;
    float *logits; /* n x vocab, party 0's (rows plen - 1 .. n - 1) */
} fid_ctx;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static kvs_status program(kvs_mpc *m, void *ctx, kvs_error *err)
{
    fid_ctx *c = ctx;
    kvs_mpc_llama L;
    kvs_status st = kvs_mpc_llama_setup(m, m->role == KVS_MPC_P1 ? c->model : NULL, &c->shape,
                                        &L, err);
    if (st != KVS_OK)
        return st;
    const int V = c->shape.vocab;
    uint64_t *sh = malloc(sizeof *sh * (size_t)V), *open = malloc(sizeof *open * (size_t)V);
    if (!sh || !open)
        st = kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    const double t0 = now();
    for (int t = 0; t < c->n && st == KVS_OK;) {
        const int k = t < c->plen ? kvs_mpc_llama_block(&c->shape, t, c->plen - t) : 1;
        st = kvs_mpc_llama_forward(m, &L, c->tokens + t, k, kvs_mpc_is_dealer(m) ? NULL : sh,
                                   err);
        t += k;
        if (st == KVS_OK && t >= c->plen)
            st = kvs_mpc_reveal(m, KVS_OP_OPEN, 0, sh, (size_t)V, open, err);
        if (st == KVS_OK && m->role == KVS_MPC_P0) {
            for (int v = 0; t >= c->plen && v < V; v++)
                c->logits[(size_t)(t - 1) * V + v] = (float)kvs_fx_decode(open[v], m->frac);
            if (t % 32 < k || t == c->n)
                fprintf(stderr, "mpc_fidelity: %d of %d tokens, %.1f s\n", t, c->n,
                        now() - t0);
        }
    }
    free(sh);
    free(open);
    kvs_mpc_llama_free(&L);
    return st;
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: mpc_fidelity MODEL.gguf TOKENS [PROMPT_LEN] [N_TOKENS] [FRAC]\n");
        return 2;
    }
    kvs_error err = {0};
    kvs_model *model = NULL;
    if (kvs_model_load(argv[1], &model, &err) != KVS_OK) {
        fprintf(stderr, "mpc_fidelity: %s\n", err.msg);
        return 1;
    }
    FILE *f = fopen(argv[2], "r");
    int32_t *tok = malloc(sizeof *tok * 1 << 16);
    int n = 0, v;
    while (f && tok && n < (1 << 16) && fscanf(f, "%d", &v) == 1)
        tok[n++] = v;
    if (f)
        fclose(f);
    const int plen = argc > 3 ? atoi(argv[3]) : 384;
    if (argc > 4 && atoi(argv[4]) > 0 && atoi(argv[4]) < n)
        n = atoi(argv[4]);
    const int frac = argc > 5 ? atoi(argv[5]) : 16;
    if (n < 2 || plen < 1 || plen >= n) {
        fprintf(stderr, "mpc_fidelity: %d tokens, prompt length %d\n", n, plen);
        return 2;
    }
    fid_ctx c = {.model = model, .tokens = tok, .n = n, .plen = plen};
    kvs_mpc_shape_of(model, &c.shape);
    const int V = c.shape.vocab;
    float *plain = malloc(sizeof *plain * (size_t)n * V);
    c.logits = malloc(sizeof *c.logits * (size_t)n * V);
    kvs_session_params sp = kvs_session_default_params();
    sp.n_threads = 1;
    kvs_session *s = NULL;
    kvs_status st = kvs_session_new(model, &sp, &s, &err);
    for (int t = 0; st == KVS_OK && t < n; t++)
        st = kvs_session_eval(s, tok + t, 1, plain + (size_t)t * V, 0, &err);
    kvs_session_free(s);
    kvs_mpc_local_cfg cfg = {.frac = frac, .insecure_plain = 1, .corr_seed = {{7}, {8}},
                             .own_seed = {{9}, {10}, {11}}, .timeout_ms = 600000};
    kvs_mpc_local_result res[3];
    const double t0 = now();
    if (st == KVS_OK)
        st = kvs_mpc_run_local(program, &c, &cfg, res, &err);
    const double secs = now() - t0;
    if (st != KVS_OK) {
        fprintf(stderr, "mpc_fidelity: %s\n", err.msg);
        return 1;
    }
    int agree = 0, rows = 0;
    double kl = 0, maxerr = 0;
    for (int t = plen - 1; t < n - 1; t++, rows++) {
        const float *p = plain + (size_t)t * V, *q = c.logits + (size_t)t * V;
        agree += argmax(p, V) == argmax(q, V);
        double mp = -INFINITY, mq = -INFINITY, zp = 0, zq = 0, k = 0;
        for (int i = 0; i < V; i++) {
            mp = fmax(mp, p[i]);
            mq = fmax(mq, q[i]);
            maxerr = fmax(maxerr, fabs((double)p[i] - q[i]));
        }
        for (int i = 0; i < V; i++) {
            zp += exp(p[i] - mp);
            zq += exp(q[i] - mq);
        }
        for (int i = 0; i < V; i++) {
            const double lp = p[i] - mp - log(zp), lq = q[i] - mq - log(zq);
            k += exp(lp) * (lp - lq);
        }
        kl += k;
    }
    /* the last row: its argmax and margin (best minus second best), secure and plaintext (a
     * recall prompt's answer row when the file ends with the answer token) */
    const float *lp = plain + (size_t)(n - 2) * V, *lq = c.logits + (size_t)(n - 2) * V;
    const int ap = argmax(lp, V), aq = argmax(lq, V);
    double mpl = -INFINITY, mql = -INFINITY;
    for (int i = 0; i < V; i++) {
        if (i != ap)
            mpl = fmax(mpl, lp[i]);
        if (i != aq)
            mql = fmax(mql, lq[i]);
    }
    uint64_t online = 0, rounds = 0;
    for (int op = 0; op < KVS_OP_N; op++) {
        online += res[0].peer.sent_payload[op] + res[1].peer.sent_payload[op];
        rounds += res[0].peer.rounds[op];
    }
    printf("{\"model\": \"%s\", \"tokens\": %d, \"prompt_len\": %d, \"frac\": %d, \"rows\": %d, "
           "\"top1\": %.6f, \"agree\": %d, \"kl_mean\": %.6g, \"max_logit_error\": %.6g, "
           "\"seconds\": %.2f, \"online_bytes_per_token\": %.0f, \"rounds_per_token\": %.1f, "
           "\"dealer_bytes_per_token\": %.0f, \"last_argmax\": %d, \"last_margin\": %.4f, "
           "\"last_argmax_plain\": %d, \"last_margin_plain\": %.4f}\n",
           argv[1], n, plen, frac, rows, (double)agree / rows, agree, kl / rows, maxerr, secs,
           (double)online / n, (double)rounds / n,
           (double)(res[0].dealer_bytes + res[1].dealer_bytes) / n, aq, lq[aq] - mql, ap,
           lp[ap] - mpl);
    free(plain);
    free(c.logits);
    free(tok);
    kvs_model_free(model);
    return 0;
}
