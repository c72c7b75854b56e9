/* The secure forward pass (src/mpc/forward.c) on stories260K against the plaintext engine:
 * the first tokens of the golden sample fed one at a time through the three roles on threads,
 * the logits opened at every step and set beside the plaintext engine's (full cache, F32 KV):
 * top-1 agreement, mean KL and the largest logit error. Also the secret KV cache's products
 * against plain arithmetic. */
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
    float logits[STEPS][VMAX]; /* party 0's opened logits */
} fwd_ctx;

static kvs_status program(kvs_mpc *m, void *ctx, kvs_error *err)
{
    fwd_ctx *c = ctx;
    kvs_mpc_llama L;
    kvs_status st = kvs_mpc_llama_setup(m, m->role == KVS_MPC_P1 ? c->model : NULL, &c->shape,
                                        &L, err);
    if (st != KVS_OK)
        return st;
    uint64_t sh[VMAX], open[VMAX];
    for (int t = 0; t < STEPS && st == KVS_OK; t++) {
        st = kvs_mpc_llama_step(m, &L, m->role == KVS_MPC_P0 ? c->tokens[t] : -1,
                                kvs_mpc_is_dealer(m) ? NULL : sh, err);
        if (st == KVS_OK)
            st = kvs_mpc_open(m, KVS_OP_OPEN, sh, (size_t)c->shape.vocab, open, err);
        for (int v = 0; st == KVS_OK && m->role == KVS_MPC_P0 && v < c->shape.vocab; v++)
            c->logits[t][v] = (float)kvs_fx_decode(open[v], m->frac);
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

    static fwd_ctx c;
    c.model = model;
    c.tokens = tokens;
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
    }
    kvs_model_free(model);
    return check_summary("mpc_forward");
}
