/* The plaintext emulator of the two-party forward pass (forward.c) and its KV selection
 * (mpcache*.c): a token at a time, in the clear, every value what the three roles reconstruct,
 * bit for bit (the same fixed-point encodings, products mod 2^64, floor truncations, and the
 * gates' emulators of fxp.h, fxp_nl.h and gates_select.h). It is MPCache in plaintext at the
 * protocol's precision: tests and the correctness check open the protocol's logits and choices
 * and set them beside it (the float policy differs from both by the fixed point's rounding). */
#ifndef KVS_MPC_FX_LLAMA_H
#define KVS_MPC_FX_LLAMA_H

#include "mpc/mpcache.h"

typedef struct kvs_fx_llama kvs_fx_llama;

/* A model in fixed point with frac fraction bits (as kvs_mpc_llama_setup encodes it), and with
 * cfg (NULL: the full cache) the selection for a prompt of P tokens, checked as
 * kvs_mpc_sel_attach checks it (the cluster score's ub ablation is not emulated: KVS_ERR_ARG). */
kvs_status kvs_fx_llama_new(const struct kvs_model *model, int frac, const kvs_mpc_kv_cfg *cfg,
                            int P, kvs_fx_llama **out, kvs_error *err);
void kvs_fx_llama_free(kvs_fx_llama *E);

/* The choices as the protocol's test hooks report them (mpcache.h): on_keep, a selecting layer's
 * kept positions at the static step; on_choice, its chosen fine clusters at a decode step. */
void kvs_fx_llama_report(kvs_fx_llama *E, kvs_mpc_choice_fn on_keep, kvs_mpc_choice_fn on_choice,
                         void *ctx);

/* The next token: its logits (vocab words at frac, as the protocol's opened ones). */
kvs_status kvs_fx_llama_step(kvs_fx_llama *E, int32_t token, uint64_t *logits, kvs_error *err);

#endif
