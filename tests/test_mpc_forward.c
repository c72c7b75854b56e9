/* The secure forward pass (src/mpc/forward.c) on stories260K against the plaintext engine:
 * the first tokens of the golden sample fed one at a time through the three roles on threads,
 * the logits opened at every step and set beside the plaintext engine's (full cache, F32 KV):
 * top-1 agreement, mean KL and the largest logit error. Then the same tokens with the first 20
 * in blocks (1, 7 and 12 tokens: a batched, causally masked prefill): the logits after each
 * block and each later step equal the one-at-a-time run's bit for bit, in fewer rounds. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/random.h"
#include "fixture.h"
#include "model/llama.h"
#include "mpc/forward.h"
#include "mpc/fxp.h"
#include "mpc/local.h"

enum { STEPS = 24, FRAC = 16, VMAX = 512 };

typedef struct fwd_ctx {
    const struct kvs_model *model;
    kvs_mpc_shape shape;
    const int32_t *tokens;
    const int *blocks;         /* token counts per forward call (summing to STEPS) */
    int has[STEPS];            /* logits after token t were computed */
    uint64_t raw[STEPS][VMAX]; /* party 0's opened logits, fixed point */
    float logits[STEPS][VMAX]; /* the same, decoded */
} fwd_ctx;

static const int one_by_one[STEPS] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                      1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
static const int in_blocks[] = {1, 7, 12, 1, 1, 1, 1};

static kvs_status program(kvs_mpc *m, void *ctx, kvs_error *err)
{
    fwd_ctx *c = ctx;
    kvs_mpc_llama L;
    kvs_status st = kvs_mpc_llama_setup(m, m->role == KVS_MPC_P1 ? c->model : NULL, &c->shape,
                                        &L, err);
    if (st != KVS_OK)
        return st;
    uint64_t sh[VMAX], open[VMAX];
    for (int t = 0, k = 0; t < STEPS && st == KVS_OK; k++) {
        const int n = c->blocks[k];
        st = kvs_mpc_llama_forward(m, &L, c->tokens + t, n, kvs_mpc_is_dealer(m) ? NULL : sh,
                                   err);
        t += n;
        if (st == KVS_OK) /* into this role's own array: the three roles share c */
            st = kvs_mpc_open(m, KVS_OP_OPEN, sh, (size_t)c->shape.vocab, open, err);
        if (st != KVS_OK || m->role != KVS_MPC_P0)
            continue;
        c->has[t - 1] = 1;
        for (int v = 0; v < c->shape.vocab; v++) {
            c->raw[t - 1][v] = open[v];
            c->logits[t - 1][v] = (float)kvs_fx_decode(open[v], m->frac);
        }
    }
    kvs_mpc_llama_free(&L);
    return st;
}

int main(void)
{
    static int32_t tokens[FX_N_TOK];
    kvs_model *model = NULL;
    kvs_model_info info;
    char msg[512];
    CHECKF(fx_load(tokens, FX_N_TOK, &model, &info, msg, sizeof msg) == 0, "%s", msg);
    if (!model)
        return check_summary("mpc_forward");
    /* plaintext logits, one token at a time */
    static float plain[STEPS][VMAX];
    kvs_session_params sp = kvs_session_default_params();
    sp.n_threads = 1;
    kvs_session *s = NULL;
    kvs_error err = {0};
    CHECKF(kvs_session_new(model, &sp, &s, &err) == KVS_OK, "%s", err.msg);
    for (int t = 0; s && t < STEPS; t++)
        CHECKF(kvs_session_eval(s, tokens + t, 1, plain[t], 0, &err) == KVS_OK, "%s", err.msg);
    kvs_session_free(s);

    static fwd_ctx c, cb;
    c.model = model;
    c.tokens = tokens;
    c.blocks = one_by_one;
    kvs_mpc_shape_of(model, &c.shape);
    kvs_mpc_local_cfg cfg = {.frac = FRAC, .insecure_plain = 1, .corr_seed = {{7}, {8}},
                             .own_seed = {{9}, {10}, {11}}, .timeout_ms = 60000};
    kvs_mpc_local_result res[3];
    const kvs_status st = kvs_mpc_run_local(program, &c, &cfg, res, &err);
    CHECKF(st == KVS_OK, "%s", err.msg);
    if (st == KVS_OK) {
        int agree = 0;
        double kl = 0, maxerr = 0;
        const int V = c.shape.vocab;
        for (int t = 0; t < STEPS; t++) {
            agree += fx_argmax(plain[t], V) == fx_argmax(c.logits[t], V);
            double mp = -INFINITY, mq = -INFINITY, zp = 0, zq = 0;
            for (int v = 0; v < V; v++) {
                mp = fmax(mp, plain[t][v]);
                mq = fmax(mq, c.logits[t][v]);
                maxerr = fmax(maxerr, fabs((double)plain[t][v] - c.logits[t][v]));
            }
            for (int v = 0; v < V; v++) {
                zp += exp(plain[t][v] - mp);
                zq += exp(c.logits[t][v] - mq);
            }
            for (int v = 0; v < V; v++) {
                const double lp = plain[t][v] - mp - log(zp), lq = c.logits[t][v] - mq - log(zq);
                kl += exp(lp) * (lp - lq) / STEPS;
            }
        }
        printf("secure forward, %d tokens, %d fraction bits: top-1 %d/%d, mean KL %.5f, max "
               "logit error %.4f; party 0 sent %.1f KiB per token, dealer %.1f KiB per token\n",
               STEPS, FRAC, agree, STEPS, kl, maxerr,
               res[0].peer.sent_payload[KVS_OP_MATMUL] / 1024.0 / STEPS,
               res[1].dealer_bytes / 1024.0 / STEPS);
        CHECKF(agree >= STEPS - 1, "top-1 agreement %d of %d", agree, STEPS);
        CHECKF(kl < 0.01, "mean KL %g", kl);

        /* the batched prefill */
        cb = c;
        cb.blocks = in_blocks;
        memset(cb.has, 0, sizeof cb.has);
        memset(cb.raw, 0, sizeof cb.raw);
        kvs_mpc_local_result rb[3];
        CHECKF(kvs_mpc_run_local(program, &cb, &cfg, rb, &err) == KVS_OK, "%s", err.msg);
        int same = 0, compared = 0;
        for (int t = 0; t < STEPS; t++)
            if (cb.has[t]) {
                compared++;
                same += !memcmp(cb.raw[t], c.raw[t], sizeof *c.raw[t] * (size_t)V);
            }
        uint64_t r1 = 0, rb1 = 0;
        for (int op = 0; op < KVS_OP_N; op++) {
            r1 += res[0].peer.rounds[op];
            rb1 += rb[0].peer.rounds[op];
        }
        printf("in blocks of 1, 7 and 12 tokens, then steps: %d of %d logit vectors bit-equal "
               "to the one-at-a-time run; party 0's rounds %llu against %llu\n", same, compared,
               (unsigned long long)rb1, (unsigned long long)r1);
        CHECKF(compared == 7 && same == compared, "%d of %d logit vectors equal", same,
               compared);
        CHECKF(rb1 * 2 < r1, "rounds in blocks %llu, one at a time %llu",
               (unsigned long long)rb1, (unsigned long long)r1);
        for (int i = 0; i < 3; i++)
            kvs_mpc_local_result_free(&rb[i]);
    }
    kvs_model_free(model);
    return check_summary("mpc_forward");
}
