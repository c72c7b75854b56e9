/* Builds a kvs_model from a GGUF file's llama metadata and tensors. */
#include "model/llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/kernels.h"

static kvs_status get_int(const kvs_gguf *g, const char *key, int *out, int required,
                          kvs_error *err)
{
    uint32_t v = (uint32_t)*out;
    kvs_status st = required ? kvs_gguf_get_u32(g, key, &v, err)
                             : kvs_gguf_get_u32_opt(g, key, &v, err);
    if (st != KVS_OK)
        return st;
    if (v > (1u << 30))
        return kvs_fail(err, KVS_ERR_FORMAT, "metadata key '%s': value %u out of range", key, v);
    *out = (int)v;
    return KVS_OK;
}

static kvs_status read_hparams(const kvs_gguf *g, kvs_hparams *hp, kvs_error *err)
{
    kvs_gguf_str arch;
    kvs_status st = kvs_gguf_get_str(g, "general.architecture", &arch, err);
    if (st != KVS_OK)
        return st;
    if (arch.len != 5 || memcmp(arch.data, "llama", 5) != 0)
        return kvs_fail(err, KVS_ERR_UNSUPPORTED,
                        "general.architecture is '%.*s'; only 'llama' is supported",
                        (int)(arch.len > 64 ? 64 : arch.len), arch.data);

    memset(hp, 0, sizeof *hp);
    if ((st = get_int(g, "llama.embedding_length", &hp->dim, 1, err)) ||
        (st = get_int(g, "llama.feed_forward_length", &hp->hidden, 1, err)) ||
        (st = get_int(g, "llama.block_count", &hp->n_layers, 1, err)) ||
        (st = get_int(g, "llama.attention.head_count", &hp->n_heads, 1, err)) ||
        (st = get_int(g, "llama.context_length", &hp->ctx, 1, err)))
        return st;
    hp->n_kv_heads = hp->n_heads;
    if ((st = get_int(g, "llama.attention.head_count_kv", &hp->n_kv_heads, 0, err)))
        return st;
    if (hp->dim <= 0 || hp->hidden <= 0 || hp->n_layers <= 0 || hp->n_heads <= 0 ||
        hp->ctx <= 0)
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "llama metadata: embedding_length, feed_forward_length, block_count, "
                        "head_count and context_length must all be positive");
    if (hp->dim % hp->n_heads != 0)
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "llama.embedding_length %d is not a multiple of head_count %d", hp->dim,
                        hp->n_heads);
    if (hp->n_kv_heads <= 0 || hp->n_heads % hp->n_kv_heads != 0)
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "llama.attention.head_count_kv %d does not divide head_count %d",
                        hp->n_kv_heads, hp->n_heads);
    hp->head_dim = hp->dim / hp->n_heads;
    hp->rot_dim = hp->head_dim;
    if ((st = get_int(g, "llama.rope.dimension_count", &hp->rot_dim, 0, err)))
        return st;
    if (hp->rot_dim <= 0 || hp->rot_dim > hp->head_dim || hp->rot_dim % 2 != 0)
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "llama.rope.dimension_count %d must be even and at most head dim %d",
                        hp->rot_dim, hp->head_dim);
    hp->eps = 1e-5f;
    hp->rope_base = 10000.0f;
    if ((st = kvs_gguf_get_f32_opt(g, "llama.attention.layer_norm_rms_epsilon", &hp->eps, err)) ||
        (st = kvs_gguf_get_f32_opt(g, "llama.rope.freq_base", &hp->rope_base, err)))
        return st;
    if (!(hp->eps > 0.0f) || !(hp->rope_base > 1.0f))
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "llama.attention.layer_norm_rms_epsilon must be > 0 and "
                        "llama.rope.freq_base > 1");
    hp->rope_neox = 0;
    return KVS_OK;
}

/* Looks up a 2-D weight of rows x cols (GGUF dims [cols, rows]). */
static kvs_status find_matrix(const kvs_gguf *g, const char *name, int rows, int cols,
                              kvs_weight *w, int64_t *n_params, kvs_error *err)
{
    const kvs_gguf_tensor *t = kvs_gguf_find_tensor(g, name);
    if (!t)
        return kvs_fail(err, KVS_ERR_FORMAT, "tensor '%s' is missing", name);
    if (t->n_dims != 2 || t->dims[0] != (uint64_t)cols || t->dims[1] != (uint64_t)rows)
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "tensor '%s' has shape [%llu, %llu] (%u dims); expected [%d, %d]", name,
                        (unsigned long long)t->dims[0], (unsigned long long)t->dims[1],
                        t->n_dims, cols, rows);
    w->data = t->data;
    w->type = t->type;
    w->rows = rows;
    w->cols = cols;
    *n_params += (int64_t)rows * cols;
    return KVS_OK;
}

/* Norm vectors are used as fp32: point into the file when stored so, else convert. */
static kvs_status find_norm(const kvs_gguf *g, const char *name, int n, float **storage,
                            const float **out, int64_t *n_params, kvs_error *err)
{
    const kvs_gguf_tensor *t = kvs_gguf_find_tensor(g, name);
    if (!t)
        return kvs_fail(err, KVS_ERR_FORMAT, "tensor '%s' is missing", name);
    if (t->n_elems != (uint64_t)n || t->dims[0] != (uint64_t)n)
        return kvs_fail(err, KVS_ERR_FORMAT, "tensor '%s' has %llu elements; expected %d", name,
                        (unsigned long long)t->n_elems, n);
    *n_params += n;
    if (t->type == KVS_F32) {
        *out = t->data;
        return KVS_OK;
    }
    kvs_dequantize_row(t->type, t->data, *storage, n);
    *out = *storage;
    *storage += n;
    return KVS_OK;
}

static kvs_status load_weights(struct kvs_model *m, kvs_error *err)
{
    const kvs_gguf *g = m->gguf;
    const kvs_hparams *hp = &m->hp;
    int q_dim = hp->n_heads * hp->head_dim, kv_dim = hp->n_kv_heads * hp->head_dim;
    kvs_status st;

    m->layers = calloc((size_t)hp->n_layers, sizeof *m->layers);
    m->norm_storage = malloc(sizeof(float) * (size_t)hp->dim * (2 * (size_t)hp->n_layers + 1));
    if (!m->layers || !m->norm_storage)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for %d layers", hp->n_layers);
    float *storage = m->norm_storage;

    const kvs_gguf_tensor *emb = kvs_gguf_find_tensor(g, "token_embd.weight");
    if (!emb)
        return kvs_fail(err, KVS_ERR_FORMAT, "tensor 'token_embd.weight' is missing");
    if (emb->n_dims != 2 || emb->dims[0] != (uint64_t)hp->dim || emb->dims[1] < 1 ||
        emb->dims[1] > (1u << 24))
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "tensor 'token_embd.weight' must have shape [%d, n_vocab]", hp->dim);
    m->hp.vocab = (int)emb->dims[1];
    if ((st = find_matrix(g, "token_embd.weight", hp->vocab, hp->dim, &m->tok_embd, &m->n_params,
                          err)))
        return st;
    if ((st = find_norm(g, "output_norm.weight", hp->dim, &storage, &m->output_norm,
                        &m->n_params, err)))
        return st;
    if (kvs_gguf_find_tensor(g, "output.weight")) {
        if ((st = find_matrix(g, "output.weight", hp->vocab, hp->dim, &m->output, &m->n_params,
                              err)))
            return st;
    } else {
        m->output = m->tok_embd;
    }

    for (int l = 0; l < hp->n_layers; l++) {
        kvs_layer *L = &m->layers[l];
        char name[96];
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%d.%s", l, suffix), name)
        if ((st = find_norm(g, NAME("attn_norm.weight"), hp->dim, &storage, &L->attn_norm,
                            &m->n_params, err)) ||
            (st = find_matrix(g, NAME("attn_q.weight"), q_dim, hp->dim, &L->wq, &m->n_params,
                              err)) ||
            (st = find_matrix(g, NAME("attn_k.weight"), kv_dim, hp->dim, &L->wk, &m->n_params,
                              err)) ||
            (st = find_matrix(g, NAME("attn_v.weight"), kv_dim, hp->dim, &L->wv, &m->n_params,
                              err)) ||
            (st = find_matrix(g, NAME("attn_output.weight"), hp->dim, q_dim, &L->wo,
                              &m->n_params, err)) ||
            (st = find_norm(g, NAME("ffn_norm.weight"), hp->dim, &storage, &L->ffn_norm,
                            &m->n_params, err)) ||
            (st = find_matrix(g, NAME("ffn_gate.weight"), hp->hidden, hp->dim, &L->w_gate,
                              &m->n_params, err)) ||
            (st = find_matrix(g, NAME("ffn_up.weight"), hp->hidden, hp->dim, &L->w_up,
                              &m->n_params, err)) ||
            (st = find_matrix(g, NAME("ffn_down.weight"), hp->dim, hp->hidden, &L->w_down,
                              &m->n_params, err)))
            return st;
#undef NAME
    }
    return KVS_OK;
}

/* Tensor names the loader reads in each block. */
static const char *const block_tensors[] = {
    "attn_norm.weight", "attn_q.weight",   "attn_k.weight", "attn_v.weight",  "attn_output.weight",
    "ffn_norm.weight",  "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
};

/* Every tensor of the llama naming scheme must be one the loader uses: a block beyond
 * block_count or a tensor the loader does not know (a bias, say) would otherwise be ignored
 * silently and the model would compute something other than what the file holds. */
static kvs_status check_unused(const kvs_gguf *g, const kvs_hparams *hp, kvs_error *err)
{
    for (uint64_t i = 0; i < kvs_gguf_n_tensors(g); i++) {
        const char *name = kvs_gguf_tensor_at(g, i)->name;
        if (!strcmp(name, "token_embd.weight") || !strcmp(name, "output_norm.weight") ||
            !strcmp(name, "output.weight"))
            continue;
        if (!strncmp(name, "blk.", 4)) {
            const char *p = name + 4;
            long long blk = 0;
            int digits = 0;
            while (*p >= '0' && *p <= '9' && digits < 10)
                blk = blk * 10 + (*p++ - '0'), digits++;
            if (digits && *p == '.' && blk >= hp->n_layers)
                return kvs_fail(err, KVS_ERR_FORMAT,
                                "tensor '%s' belongs to block %lld, but llama.block_count is %d "
                                "(blocks 0..%d): the file stores more than its metadata says",
                                name, blk, hp->n_layers, hp->n_layers - 1);
            if (digits && *p == '.') {
                size_t k = 0;
                while (k < sizeof block_tensors / sizeof *block_tensors &&
                       strcmp(p + 1, block_tensors[k]))
                    k++;
                if (k < sizeof block_tensors / sizeof *block_tensors)
                    continue;
            }
        } else if (strncmp(name, "token_embd.", 11) && strncmp(name, "output", 6) &&
                   strncmp(name, "rope_freqs.", 11)) {
            continue; /* not a llama tensor name: not ours to judge */
        }
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "tensor '%s' is not one kvslim's llama loader uses (it reads "
                        "token_embd.weight, output_norm.weight, output.weight and blk.N.{%s, "
                        "...}); refusing to ignore it", name, block_tensors[0]);
    }
    return KVS_OK;
}

kvs_status kvs_llama_from_gguf(kvs_gguf *g, const char *path, struct kvs_model **out,
                               kvs_error *err)
{
    *out = NULL;
    struct kvs_model *m = calloc(1, sizeof *m);
    if (!m) {
        kvs_gguf_close(g);
        return kvs_fail(err, KVS_ERR_NOMEM, "%s: out of memory", path);
    }
    m->gguf = g;
    m->path = strdup(path);
    kvs_status st = m->path ? KVS_OK : kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    if (st == KVS_OK)
        st = read_hparams(g, &m->hp, err);
    if (st == KVS_OK)
        st = load_weights(m, err);
    if (st == KVS_OK)
        st = check_unused(g, &m->hp, err);
    if (st == KVS_OK)
        st = kvs_tokenizer_from_gguf(g, &m->tokenizer, err);
    if (st == KVS_OK && kvs_tokenizer_n_vocab(m->tokenizer) != m->hp.vocab)
        st = kvs_fail(err, KVS_ERR_FORMAT,
                      "tokenizer.ggml.tokens has %d entries but token_embd.weight has %d rows",
                      kvs_tokenizer_n_vocab(m->tokenizer), m->hp.vocab);
    if (st != KVS_OK) {
        /* Prefix the message with the path so the user knows which file is at fault (the
         * GGUF getters' messages already start with it). */
        size_t plen = strlen(path);
        if (err && !(strncmp(err->msg, path, plen) == 0 && err->msg[plen] == ':')) {
            char tmp[sizeof err->msg];
            memcpy(tmp, err->msg, sizeof tmp);
            kvs_fail(err, st, "%s: %.400s", path, tmp);
        }
        kvs_llama_free(m);
        return st;
    }
    *out = m;
    return KVS_OK;
}

void kvs_llama_free(struct kvs_model *m)
{
    if (!m)
        return;
    kvs_tokenizer_free(m->tokenizer);
    free(m->layers);
    free(m->norm_storage);
    free(m->path);
    kvs_gguf_close(m->gguf);
    free(m);
}

void kvs_weight_row(const kvs_weight *w, int row, float *out)
{
    uint64_t row_bytes = 0;
    kvs_dtype_bytes(w->type, (uint64_t)w->cols, &row_bytes);
    kvs_dequantize_row(w->type, (const char *)w->data + (size_t)row * row_bytes, out, w->cols);
}

int kvs_llama2c_sniff(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    int32_t h[7];
    struct stat sb;
    int ok = fread(h, sizeof h, 1, f) == 1 && fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode);
    fclose(f);
    if (!ok)
        return 0;
    int64_t v[7];
    for (int i = 0; i < 7; i++) {
        v[i] = i == 5 && h[i] < 0 ? -(int64_t)h[i] : h[i];
        if (v[i] <= 0 || v[i] > (1 << 24))
            return 0;
    }
    const uint64_t dim = (uint64_t)v[0], hidden = (uint64_t)v[1], L = (uint64_t)v[2],
                   heads = (uint64_t)v[3], kv_heads = (uint64_t)v[4], vocab = (uint64_t)v[5],
                   seq = (uint64_t)v[6];
    if (dim % heads || heads % kv_heads)
        return 0;
    const uint64_t head = dim / heads, kv_dim = kv_heads * head;
    /* Floats in llama2.c's order: embeddings, per-layer tensors, final norm, the RoPE tables,
     * then the classifier when unshared. Estimated in double first so that the exact sum below
     * cannot overflow. */
    const double per_layer = 2.0 * dim + 2.0 * dim * dim + 2.0 * dim * kv_dim + 3.0 * dim * hidden;
    if ((double)vocab * dim * 2 + (double)L * per_layer + (double)seq * head > 0x1p60)
        return 0;
    uint64_t n = vocab * dim + L * (2 * dim + 2 * dim * dim + 2 * dim * kv_dim + 3 * dim * hidden) +
                 dim + seq * head;
    if (h[5] < 0)
        n += vocab * dim;
    return (uint64_t)sb.st_size == 28 + 4 * n;
}
