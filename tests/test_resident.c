/* The matrices decode streams live in the model's own aligned buffer (model/resident.c), with
 * wq|wk|wv and w_gate|w_up stacked; the stacked products equal the separate ones exactly, and
 * the mapping the copies came from is released without changing what it reads. */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "check_model.h"
#include "gguf/gguf.h"
#include "model/llama.h"

static int aligned64(const void *p) { return ((uintptr_t)p & 63) == 0; }

/* Logits of a 6-token prompt, all rows. */
static float *logits_of(kvs_model *m)
{
    kvs_session_params p = kvs_session_default_params();
    kvs_session *s = NULL;
    kvs_error err = {0};
    CHECK(kvs_session_new(m, &p, &s, &err) == KVS_OK);
    const int32_t toks[6] = {1, 403, 9, 77, 250, 3};
    float *logits = calloc((size_t)6 * m->hp.vocab, sizeof(float));
    CHECKF(kvs_session_eval(s, toks, 6, logits, 1, &err) == KVS_OK, "%s", err.msg);
    kvs_session_free(s);
    return logits;
}

int main(void)
{
    char path[1024];
    kvs_model *m = check_load_model("models/gguf/stories260K-f32.gguf", path, sizeof path);
    kvs_error err = {0};
    const kvs_hparams *hp = &m->hp;
    CHECK(m->resident != NULL);
    for (int l = 0; l < hp->n_layers; l++) {
        const kvs_layer *L = &m->layers[l];
        CHECK(aligned64(L->wq.data) && aligned64(L->wo.data) && aligned64(L->w_gate.data) &&
              aligned64(L->w_down.data));
        /* stacked: one matrix over the three (two), back to back */
        CHECK(L->wqkv.data == L->wq.data && L->wqkv.type == L->wq.type &&
              L->wqkv.cols == hp->dim && L->wqkv.rows == L->wq.rows + L->wk.rows + L->wv.rows);
        const char *wq = L->wq.data;
        CHECK((const char *)L->wk.data == wq + (size_t)L->wq.rows * hp->dim * 4);
        CHECK(L->w_gate_up.data == L->w_gate.data && L->w_gate_up.rows == 2 * hp->hidden);
        CHECK((const char *)L->w_up.data ==
              (const char *)L->w_gate.data + (size_t)hp->hidden * hp->dim * 4);
    }
    /* the copies hold the file's bytes, and the released mapping still reads them */
    const kvs_gguf_tensor *t = kvs_gguf_find_tensor(m->gguf, "blk.0.ffn_down.weight");
    CHECK(t && t->data != m->layers[0].w_down.data &&
          memcmp(t->data, m->layers[0].w_down.data, (size_t)t->n_bytes) == 0);

    /* stacked products == separate products, bit for bit */
    float *fused = logits_of(m);
    kvs_weight *saved = calloc((size_t)hp->n_layers * 2, sizeof *saved);
    for (int l = 0; l < hp->n_layers; l++) {
        saved[2 * l] = m->layers[l].wqkv;
        saved[2 * l + 1] = m->layers[l].w_gate_up;
        m->layers[l].wqkv.data = m->layers[l].w_gate_up.data = NULL;
    }
    float *separate = logits_of(m);
    CHECK(memcmp(fused, separate, sizeof(float) * 6 * (size_t)hp->vocab) == 0);
    for (int l = 0; l < hp->n_layers; l++) {
        m->layers[l].wqkv = saved[2 * l];
        m->layers[l].w_gate_up = saved[2 * l + 1];
    }

    /* kvs_gguf_release leaves foreign ranges alone ... */
    static char buf[1 << 16];
    memset(buf, 7, sizeof buf);
    kvs_gguf_release(m->gguf, buf, sizeof buf); /* not inside the mapping */
    CHECK(buf[0] == 7 && buf[sizeof buf - 1] == 7);
    kvs_gguf_release(NULL, buf, sizeof buf);

    /* ... and a borrowed buffer: a model built from the file's bytes in memory leaves them
     * as they were */
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    fseek(f, 0, SEEK_END);
    const long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *bytes = malloc((size_t)size), *copy = malloc((size_t)size);
    CHECK(fread(bytes, 1, (size_t)size, f) == (size_t)size);
    fclose(f);
    memcpy(copy, bytes, (size_t)size);
    kvs_gguf *g = NULL;
    struct kvs_model *mm = NULL;
    CHECK(kvs_gguf_open_mem("in-memory", bytes, (uint64_t)size, &g, &err) == KVS_OK);
    CHECKF(kvs_llama_from_gguf(g, "in-memory", &mm, &err) == KVS_OK, "%s", err.msg);
    CHECK(memcmp(bytes, copy, (size_t)size) == 0);
    kvs_llama_free(mm);
    free(bytes);
    free(copy);

    free(fused);
    free(separate);
    free(saved);
    kvs_model_free(m);
    return check_summary("test_resident");
}
