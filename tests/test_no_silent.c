/* Failures that once passed silently, seen through a session: a weight type without a matrix
 * kernel (the loader admits none, so the model is altered in memory here) must fail the forward
 * pass naming the tensor instead of leaving activations unwritten; and a call that fails part
 * way leaves the session empty and usable. */
#include <string.h>

#include "check.h"
#include "check_model.h"
#include "model/llama.h"

static void unsupported_weight_type(kvs_model *m)
{
    kvs_session_params p = kvs_session_default_params();
    kvs_session *s = NULL;
    kvs_error err = {0};
    CHECK(kvs_session_new(m, &p, &s, &err) == KVS_OK);
    const int32_t toks[4] = {1, 5, 9, 7};
    float *logits = calloc((size_t)m->hp.vocab, sizeof(float));
    const kvs_dtype saved = m->layers[1].w_up.type;
    /* the separate products: without the stacked gate|up matrix the loader may have made */
    const kvs_weight stacked = m->layers[1].w_gate_up;
    m->layers[1].w_gate_up.data = NULL;
    m->layers[1].w_up.type = (kvs_dtype)9; /* Q8_1: a GGUF type id kvslim has no kernel for */
    kvs_status st = kvs_session_eval(s, toks, 4, logits, 0, &err);
    CHECKF(st == KVS_ERR_UNSUPPORTED && strstr(err.msg, "blk.1.ffn_up.weight") &&
               strstr(err.msg, "no matrix product kernel"),
           "status %d, '%s'", st, err.msg);
    /* The prompt failed in layer 1, after layer 0 stored its keys: the session starts over. */
    CHECK(kvs_session_n_past(s) == 0 && kvs_session_kv_bytes(s) == 0);
    m->layers[1].w_up.type = saved;
    m->layers[1].w_gate_up = stacked;
    CHECKF(kvs_session_eval(s, toks, 4, logits, 0, &err) == KVS_OK, "%s", err.msg);
    CHECK(kvs_session_n_past(s) == 4);

    /* the stacked product fails the same way, named by its first matrix */
    CHECK(stacked.data != NULL); /* stories260K: gate and up share a type */
    kvs_session_reset(s);
    m->layers[1].w_gate_up.type = (kvs_dtype)9;
    st = kvs_session_eval(s, toks, 4, logits, 0, &err);
    CHECKF(st == KVS_ERR_UNSUPPORTED && strstr(err.msg, "blk.1.ffn_gate.weight") &&
               strstr(err.msg, "no matrix product kernel"),
           "status %d, '%s'", st, err.msg);
    CHECK(kvs_session_n_past(s) == 0);
    m->layers[1].w_gate_up.type = stacked.type;
    kvs_session_free(s);
    free(logits);
}

int main(void)
{
    char path[1024];
    kvs_model *m = check_load_model("models/gguf/stories260K-f32.gguf", path, sizeof path);
    unsupported_weight_type(m);
    kvs_model_free(m);
    return check_summary("test_no_silent");
}
