#include "model/llama_write.h"

#include <stdlib.h>
#include <string.h>

#include "core/kernels.h"

/* Buffers of quantised matrices, freed after the write. */
typedef struct owned_list {
    void **items;
    size_t n, cap;
} owned_list;

static void *owned_alloc(owned_list *o, size_t bytes)
{
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 64;
        void **items = realloc(o->items, cap * sizeof *items);
        if (!items)
            return NULL;
        o->items = items;
        o->cap = cap;
    }
    void *p = malloc(bytes ? bytes : 1);
    if (p)
        o->items[o->n++] = p;
    return p;
}

static void owned_free(owned_list *o)
{
    for (size_t i = 0; i < o->n; i++)
        free(o->items[i]);
    free(o->items);
}

typedef struct writer_ctx {
    kvs_gguf_writer *w;
    owned_list owned;
    kvs_dtype type;
    FILE *log;
    kvs_error *err;
} writer_ctx;

static kvs_status add_vector(writer_ctx *c, const char *name, const float *data, int n)
{
    uint64_t dims[1] = {(uint64_t)n};
    return kvs_gguf_add_tensor(c->w, name, KVS_F32, 1, dims, data, c->err);
}

static kvs_status add_matrix(writer_ctx *c, const char *name, const float *data, int rows,
                             int cols)
{
    kvs_dtype t = c->type;
    if ((size_t)cols % kvs_dtype_block_elems(t) != 0) {
        if (c->log)
            fprintf(c->log, "note: %s has rows of %d, not a multiple of the %s block size %zu; "
                            "stored as f16\n", name, cols, kvs_dtype_name(t),
                    kvs_dtype_block_elems(t));
        t = KVS_F16;
    }
    uint64_t dims[2] = {(uint64_t)cols, (uint64_t)rows}, row_bytes = 0;
    const void *out = data;
    if (t != KVS_F32) {
        kvs_dtype_bytes(t, (uint64_t)cols, &row_bytes);
        char *q = owned_alloc(&c->owned, (size_t)row_bytes * rows);
        if (!q)
            return kvs_fail(c->err, KVS_ERR_NOMEM, "out of memory quantising %s", name);
        for (int r = 0; r < rows; r++)
            kvs_quantize_row(t, data + (size_t)r * cols, q + (size_t)r * row_bytes, cols);
        out = q;
    }
    return kvs_gguf_add_tensor(c->w, name, t, 2, dims, out, c->err);
}

static int file_type_id(kvs_dtype t)
{
    switch (t) {
    case KVS_F32: return 0;
    case KVS_F16: return 1;
    case KVS_Q4_0: return 2;
    case KVS_Q8_0: return 7;
    case KVS_BF16: return 32;
    default: break; /* types kvslim reads but does not write */
    }
    return 0;
}

static kvs_status write_synthetic_vocab(kvs_gguf_writer *w, int vocab)
{
    char **pieces = calloc((size_t)vocab, sizeof *pieces);
    float *scores = calloc((size_t)vocab, sizeof *scores);
    int32_t *types = calloc((size_t)vocab, sizeof *types);
    kvs_status st = (pieces && scores && types) ? KVS_OK : KVS_ERR_NOMEM;
    for (int i = 0; st == KVS_OK && i < vocab; i++) {
        char buf[32];
        if (i == 0)
            snprintf(buf, sizeof buf, "<unk>"), types[i] = KVS_TOKEN_UNKNOWN;
        else if (i == 1)
            snprintf(buf, sizeof buf, "<s>"), types[i] = KVS_TOKEN_CONTROL;
        else if (i == 2)
            snprintf(buf, sizeof buf, "</s>"), types[i] = KVS_TOKEN_CONTROL;
        else if (i < 3 + 256)
            snprintf(buf, sizeof buf, "<0x%02X>", i - 3), types[i] = KVS_TOKEN_BYTE;
        else
            snprintf(buf, sizeof buf, "tok%d", i), types[i] = KVS_TOKEN_NORMAL;
        pieces[i] = strdup(buf);
        if (!pieces[i])
            st = KVS_ERR_NOMEM;
    }
    if (st == KVS_OK)
        st = kvs_gguf_set_str(w, "tokenizer.ggml.model", "llama");
    if (st == KVS_OK)
        st = kvs_gguf_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)pieces,
                                  (uint64_t)vocab);
    if (st == KVS_OK)
        st = kvs_gguf_set_arr_f32(w, "tokenizer.ggml.scores", scores, (uint64_t)vocab);
    if (st == KVS_OK)
        st = kvs_gguf_set_arr_i32(w, "tokenizer.ggml.token_type", types, (uint64_t)vocab);
    if (st == KVS_OK)
        st = kvs_gguf_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    if (st == KVS_OK)
        st = kvs_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", vocab > 1 ? 1 : 0);
    if (st == KVS_OK)
        st = kvs_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", vocab > 2 ? 2 : 0);
    for (int i = 0; pieces && i < vocab; i++)
        free(pieces[i]);
    free(pieces);
    free(scores);
    free(types);
    return st;
}

static kvs_status set_metadata(kvs_gguf_writer *w, const kvs_llama_src *src, kvs_dtype type)
{
    const kvs_hparams *hp = &src->hp;
    kvs_status st;
    if ((st = kvs_gguf_set_str(w, "general.architecture", "llama")) ||
        (st = kvs_gguf_set_str(w, "general.name", src->name ? src->name : "llama")) ||
        (st = kvs_gguf_set_u32(w, "general.file_type", (uint32_t)file_type_id(type))) ||
        (st = kvs_gguf_set_u32(w, "llama.context_length", (uint32_t)hp->ctx)) ||
        (st = kvs_gguf_set_u32(w, "llama.embedding_length", (uint32_t)hp->dim)) ||
        (st = kvs_gguf_set_u32(w, "llama.feed_forward_length", (uint32_t)hp->hidden)) ||
        (st = kvs_gguf_set_u32(w, "llama.block_count", (uint32_t)hp->n_layers)) ||
        (st = kvs_gguf_set_u32(w, "llama.attention.head_count", (uint32_t)hp->n_heads)) ||
        (st = kvs_gguf_set_u32(w, "llama.attention.head_count_kv", (uint32_t)hp->n_kv_heads)) ||
        (st = kvs_gguf_set_u32(w, "llama.rope.dimension_count", (uint32_t)hp->rot_dim)) ||
        (st = kvs_gguf_set_f32(w, "llama.rope.freq_base", hp->rope_base)) ||
        (st = kvs_gguf_set_f32(w, "llama.attention.layer_norm_rms_epsilon", hp->eps)))
        return st;
    if (type == KVS_Q8_0 || type == KVS_Q4_0)
        st = kvs_gguf_set_u32(w, "general.quantization_version", 2);
    return st;
}

kvs_status kvs_llama_write_gguf(const kvs_llama_src *src, const kvs_tokenizer *tok,
                                kvs_dtype type, const kvs_outfile_spec *out, FILE *log,
                                kvs_error *err)
{
    const char *path = out->path;
    const kvs_hparams *hp = &src->hp;
    const int q_dim = hp->n_heads * hp->head_dim, kv_dim = hp->n_kv_heads * hp->head_dim;
    writer_ctx c = {kvs_gguf_writer_new(), {0}, type, log, err};
    if (!c.w)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    kvs_status st = set_metadata(c.w, src, type);
    if (st == KVS_OK)
        st = tok ? kvs_tokenizer_to_gguf(tok, c.w) : write_synthetic_vocab(c.w, hp->vocab);
    if (st != KVS_OK)
        kvs_fail(err, st, "%s: could not build metadata (%s)", path, kvs_status_name(st));
    if (st == KVS_OK)
        st = add_matrix(&c, "token_embd.weight", src->tok_embd, hp->vocab, hp->dim);
    if (st == KVS_OK)
        st = add_vector(&c, "output_norm.weight", src->output_norm, hp->dim);
    if (st == KVS_OK && src->output)
        st = add_matrix(&c, "output.weight", src->output, hp->vocab, hp->dim);
    for (int l = 0; st == KVS_OK && l < hp->n_layers; l++) {
        const kvs_llama_src_layer *L = &src->layers[l];
        char name[96];
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%d.%s", l, suffix), name)
        if ((st = add_vector(&c, NAME("attn_norm.weight"), L->attn_norm, hp->dim)) ||
            (st = add_matrix(&c, NAME("attn_q.weight"), L->wq, q_dim, hp->dim)) ||
            (st = add_matrix(&c, NAME("attn_k.weight"), L->wk, kv_dim, hp->dim)) ||
            (st = add_matrix(&c, NAME("attn_v.weight"), L->wv, kv_dim, hp->dim)) ||
            (st = add_matrix(&c, NAME("attn_output.weight"), L->wo, hp->dim, q_dim)) ||
            (st = add_vector(&c, NAME("ffn_norm.weight"), L->ffn_norm, hp->dim)) ||
            (st = add_matrix(&c, NAME("ffn_gate.weight"), L->w_gate, hp->hidden, hp->dim)) ||
            (st = add_matrix(&c, NAME("ffn_down.weight"), L->w_down, hp->dim, hp->hidden)) ||
            (st = add_matrix(&c, NAME("ffn_up.weight"), L->w_up, hp->hidden, hp->dim)))
            break;
#undef NAME
    }
    if (st == KVS_OK)
        st = kvs_gguf_write_to(c.w, out, err);
    kvs_gguf_writer_free(c.w);
    owned_free(&c.owned);
    return st;
}

kvs_status kvs_llama_duplicate_layers(const kvs_llama_src *src, const int *dup, int n_dup,
                                      kvs_llama_src *out, kvs_llama_src_layer **layers,
                                      kvs_error *err)
{
    int n = src->hp.n_layers;
    *layers = NULL;
    for (int i = 0; i < n_dup; i++) {
        if (dup[i] < 0 || dup[i] >= n)
            return kvs_fail(err, KVS_ERR_ARG,
                            "layer %d (entry %d of the list) is outside the model's layers "
                            "0..%d", dup[i], i + 1, n - 1);
        if (i > 0 && dup[i] <= dup[i - 1])
            return kvs_fail(err, KVS_ERR_ARG,
                            "layer %d (entry %d of the list) %s: list each layer once, in "
                            "increasing order", dup[i], i + 1,
                            dup[i] == dup[i - 1] ? "is listed twice" : "comes after a later one");
    }
    kvs_llama_src_layer *L = malloc(sizeof *L * (size_t)(n + n_dup));
    if (!L)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for %d layers", n + n_dup);
    int k = 0, j = 0;
    for (int l = 0; l < n; l++) {
        L[k++] = src->layers[l];
        if (j < n_dup && dup[j] == l) {
            L[k++] = src->layers[l]; /* the same weights: a byte-identical copy */
            j++;
        }
    }
    *out = *src;
    out->hp.n_layers = k;
    out->layers = L;
    *layers = L;
    return KVS_OK;
}
