/* Builds a kvs_model from a GGUF file's metadata and tensors: architectures llama, qwen2 and
 * qwen3 (llama.cpp's key and tensor names). */
#include "model/llama.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/kernels.h"
#include "core/limits.h"

/* The architectures the loader knows. Each is the Llama block plus what its row says; keys
 * are read under the architecture's name ("qwen2.embedding_length"). */
typedef struct arch_spec {
    const char *name;
    int qkv_bias;   /* blk.N.attn_{q,k,v}.bias, required */
    int qk_norm;    /* blk.N.attn_{q,k}_norm.weight, required */
    int rope_neox;  /* RoPE pairs (i, i + rot_dim/2) instead of (2i, 2i+1) */
    int rope_freqs; /* rope_freqs.weight (Llama-3 frequency factors) allowed */
} arch_spec;

static const arch_spec archs[] = {
    {"llama", 0, 0, 0, 1},
    {"qwen2", 1, 0, 1, 0},
    {"qwen3", 0, 1, 1, 0},
};
enum { N_ARCHS = sizeof archs / sizeof *archs };

/* "<arch>.<suffix>" in buf. */
static const char *akey(char *buf, size_t size, const arch_spec *a, const char *suffix)
{
    snprintf(buf, size, "%s.%s", a->name, suffix);
    return buf;
}

/* A size from the metadata, at most max (a limit of core/limits.h). */
static kvs_status get_int(const kvs_gguf *g, const char *key, int *out, int required, int max,
                          kvs_error *err)
{
    uint64_t v = (uint64_t)*out;
    if (required || kvs_gguf_find_key(g, key) >= 0) {
        kvs_status st = kvs_gguf_get_u64(g, key, &v, err);
        if (st != KVS_OK)
            return st;
    }
    if (v > (uint64_t)max)
        return kvs_fail(err, KVS_ERR_UNSUPPORTED, "metadata key '%s' is %llu; kvslim supports "
                        "at most %d", key, (unsigned long long)v, max);
    *out = (int)v;
    return KVS_OK;
}

static kvs_status find_arch(const kvs_gguf *g, const arch_spec **out, kvs_error *err)
{
    kvs_gguf_str arch;
    kvs_status st = kvs_gguf_get_str(g, "general.architecture", &arch, err);
    if (st != KVS_OK)
        return st;
    for (int i = 0; i < N_ARCHS; i++)
        if (arch.len == strlen(archs[i].name) && !memcmp(arch.data, archs[i].name, arch.len)) {
            *out = &archs[i];
            return KVS_OK;
        }
    char names[128];
    size_t len = 0;
    for (int i = 0; i < N_ARCHS; i++)
        len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", i ? ", " : "",
                                archs[i].name);
    return kvs_fail(err, KVS_ERR_UNSUPPORTED,
                    "general.architecture is '%.*s', which kvslim does not support (supported: "
                    "%s)", (int)(arch.len > 64 ? 64 : arch.len), arch.data, names);
}

/* RoPE scaling: llama.cpp divides every frequency by rope.scaling.factor (or the older
 * rope.scale_linear) when the type is absent, "none" or "linear"; kvslim folds the factor into
 * the per-pair divisors. The other types (yarn, longrope, ...) change more than the
 * frequencies and are refused. */
static kvs_status read_rope_scaling(const kvs_gguf *g, const arch_spec *a, float *factor,
                                    kvs_error *err)
{
    char key[96], fkey[96];
    *factor = 0.0f;
    akey(key, sizeof key, a, "rope.scaling.type");
    kvs_gguf_str type = {6, "linear"};
    kvs_status st;
    if (kvs_gguf_find_key(g, key) >= 0 && (st = kvs_gguf_get_str(g, key, &type, err)))
        return st;
    if (!(type.len == 6 && !memcmp(type.data, "linear", 6)) &&
        !(type.len == 4 && !memcmp(type.data, "none", 4)))
        return kvs_fail(err, KVS_ERR_UNSUPPORTED,
                        "%s is '%.*s': kvslim implements RoPE scaling 'none' and 'linear' only",
                        key, (int)(type.len > 64 ? 64 : type.len), type.data);
    akey(fkey, sizeof fkey, a, "rope.scaling.factor");
    if (kvs_gguf_find_key(g, fkey) < 0)
        akey(fkey, sizeof fkey, a, "rope.scale_linear");
    if ((st = kvs_gguf_get_f32_opt(g, fkey, factor, err)))
        return st;
    if (*factor == 0.0f) /* absent, or 0: no scaling, as in llama.cpp */
        *factor = 1.0f;
    if (!(*factor > 0.0f) || !isfinite(*factor))
        return kvs_fail(err, KVS_ERR_FORMAT, "%s is %g; it must be a positive number", fkey,
                        (double)*factor);
    return KVS_OK;
}

static kvs_status read_hparams(const kvs_gguf *g, const arch_spec *a, kvs_hparams *hp,
                               float *rope_factor, kvs_error *err)
{
    char key[96];
#define KEY(suffix) akey(key, sizeof key, a, suffix)
    kvs_status st;
    memset(hp, 0, sizeof *hp);
    if ((st = get_int(g, KEY("embedding_length"), &hp->dim, 1, KVS_MAX_WIDTH, err)) ||
        (st = get_int(g, KEY("feed_forward_length"), &hp->hidden, 1, KVS_MAX_WIDTH, err)) ||
        (st = get_int(g, KEY("block_count"), &hp->n_layers, 1, KVS_MAX_LAYERS, err)) ||
        (st = get_int(g, KEY("attention.head_count"), &hp->n_heads, 1, KVS_MAX_WIDTH, err)) ||
        (st = get_int(g, KEY("context_length"), &hp->ctx, 1, KVS_MAX_CTX, err)))
        return st;
    hp->n_kv_heads = hp->n_heads;
    if ((st = get_int(g, KEY("attention.head_count_kv"), &hp->n_kv_heads, 0, KVS_MAX_WIDTH,
                      err)))
        return st;
    if (hp->dim <= 0 || hp->hidden <= 0 || hp->n_layers <= 0 || hp->n_heads <= 0 ||
        hp->ctx <= 0)
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "%s metadata: embedding_length, feed_forward_length, block_count, "
                        "head_count and context_length must all be positive", a->name);
    if (hp->n_kv_heads <= 0 || hp->n_heads % hp->n_kv_heads != 0)
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "%s.attention.head_count_kv %d does not divide head_count %d", a->name,
                        hp->n_kv_heads, hp->n_heads);
    /* The head width: attention.key_length when given (Q is then n_heads * key_length wide,
     * which may differ from the embedding), else embedding_length / head_count. */
    if (kvs_gguf_find_key(g, KEY("attention.key_length")) >= 0) {
        if ((st = get_int(g, key, &hp->head_dim, 1, KVS_MAX_WIDTH, err)))
            return st;
        if (hp->head_dim <= 0)
            return kvs_fail(err, KVS_ERR_FORMAT, "%s must be positive", key);
    } else {
        if (hp->dim % hp->n_heads != 0)
            return kvs_fail(err, KVS_ERR_FORMAT,
                            "%s.embedding_length %d is not a multiple of head_count %d (and "
                            "there is no %s.attention.key_length)", a->name, hp->dim,
                            hp->n_heads, a->name);
        hp->head_dim = hp->dim / hp->n_heads;
    }
    int v_dim = hp->head_dim;
    if ((st = get_int(g, KEY("attention.value_length"), &v_dim, 0, KVS_MAX_WIDTH, err)))
        return st;
    if (v_dim != hp->head_dim)
        return kvs_fail(err, KVS_ERR_UNSUPPORTED,
                        "%s.attention.value_length %d differs from the key length %d; kvslim's "
                        "KV cache needs keys and values of one width", a->name, v_dim,
                        hp->head_dim);
    hp->rot_dim = hp->head_dim;
    if ((st = get_int(g, KEY("rope.dimension_count"), &hp->rot_dim, 0, KVS_MAX_WIDTH, err)))
        return st;
    if (hp->rot_dim <= 0 || hp->rot_dim > hp->head_dim || hp->rot_dim % 2 != 0)
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "%s.rope.dimension_count %d must be even and at most head dim %d",
                        a->name, hp->rot_dim, hp->head_dim);
    hp->eps = 1e-5f;
    hp->rope_base = 10000.0f;
    if ((st = kvs_gguf_get_f32_opt(g, KEY("attention.layer_norm_rms_epsilon"), &hp->eps, err)) ||
        (st = kvs_gguf_get_f32_opt(g, KEY("rope.freq_base"), &hp->rope_base, err)))
        return st;
    if (!(hp->eps > 0.0f) || !(hp->rope_base > 1.0f))
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "%s.attention.layer_norm_rms_epsilon must be > 0 and "
                        "%s.rope.freq_base > 1", a->name, a->name);
    hp->rope_neox = a->rope_neox;
#undef KEY
    return read_rope_scaling(g, a, rope_factor, err);
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

/* Vectors (norm weights, biases, frequency factors) are used as fp32: point into the file when
 * stored so, else convert into *storage. `why`, if non-NULL, says why a missing one is
 * needed. */
static kvs_status find_vector(const kvs_gguf *g, const char *name, int n, const char *why,
                              float **storage, const float **out, int64_t *n_params,
                              kvs_error *err)
{
    const kvs_gguf_tensor *t = kvs_gguf_find_tensor(g, name);
    if (!t)
        return kvs_fail(err, KVS_ERR_FORMAT, "tensor '%s' is missing%s%s%s", name,
                        why ? " (" : "", why ? why : "", why ? ")" : "");
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

static kvs_status find_norm(const kvs_gguf *g, const char *name, int n, float **storage,
                            const float **out, int64_t *n_params, kvs_error *err)
{
    return find_vector(g, name, n, NULL, storage, out, n_params, err);
}

/* Llama-3's rope_freqs.weight (one factor per rotated pair) and a linear scaling factor, as
 * per-pair divisors of the RoPE frequencies (m->rope_div), or none. */
static kvs_status load_rope_div(struct kvs_model *m, const arch_spec *a, float factor,
                                float **storage, kvs_error *err)
{
    const int pairs = m->hp.rot_dim / 2;
    const float *ff = NULL;
    if (a->rope_freqs && kvs_gguf_find_tensor(m->gguf, "rope_freqs.weight")) {
        int64_t none = 0;
        kvs_status st = find_vector(m->gguf, "rope_freqs.weight", pairs, NULL, storage, &ff,
                                    &none, err);
        if (st != KVS_OK)
            return st;
    }
    if (!ff && factor == 1.0f)
        return KVS_OK;
    if (!(m->rope_div = malloc(sizeof(float) * (size_t)pairs)))
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    for (int i = 0; i < pairs; i++) {
        if (ff && !(ff[i] > 0.0f && isfinite(ff[i])))
            return kvs_fail(err, KVS_ERR_FORMAT,
                            "tensor 'rope_freqs.weight': factor %d is %g; factors must be "
                            "positive and finite", i, (double)ff[i]);
        m->rope_div[i] = (ff ? ff[i] : 1.0f) * factor;
    }
    return KVS_OK;
}

static kvs_status load_weights(struct kvs_model *m, const arch_spec *a, float rope_factor,
                               kvs_error *err)
{
    const kvs_gguf *g = m->gguf;
    const kvs_hparams *hp = &m->hp;
    kvs_status st;

    /* fp32 copies of every vector stored in another type: the norms, the biases, the Q/K
     * norms and the RoPE factors. They are sized from the metadata alone, before any tensor is
     * checked, so a small file claiming huge sizes would ask for gigabytes (fuzz/fuzz_gguf.c
     * found one: 22 KB asking for 2.7 GB). Every such vector is a tensor of the file, and the
     * tensors of a valid file hold more elements than all of them together (each layer's
     * matrices alone do), so a file whose tensors hold fewer is refused here. */
    const uint64_t q_dim64 = (uint64_t)hp->n_heads * (uint64_t)hp->head_dim;
    const uint64_t kv_dim64 = (uint64_t)hp->n_kv_heads * (uint64_t)hp->head_dim;
    const uint64_t per_layer64 = 2 * (uint64_t)hp->dim + q_dim64 + 2 * kv_dim64 +
                                 2 * (uint64_t)hp->head_dim;
    uint64_t file_elems = 0;
    for (uint64_t i = 0; i < kvs_gguf_n_tensors(g); i++)
        file_elems += kvs_gguf_tensor_at(g, i)->n_elems;
    if (q_dim64 > INT_MAX || kv_dim64 > INT_MAX ||
        (uint64_t)hp->n_layers * per_layer64 + (uint64_t)hp->dim > 2 * file_elems)
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "%s.block_count %d and embedding_length %d (%llu query dims) need "
                        "more weights than the file's %llu tensor elements", a->name,
                        hp->n_layers, hp->dim, (unsigned long long)q_dim64,
                        (unsigned long long)file_elems);
    const int q_dim = (int)q_dim64, kv_dim = (int)kv_dim64;
    const size_t per_layer = (size_t)per_layer64;
    m->layers = calloc((size_t)hp->n_layers, sizeof *m->layers);
    m->norm_storage = malloc(sizeof(float) * ((size_t)hp->n_layers * per_layer +
                                              (size_t)hp->dim + (size_t)hp->rot_dim / 2));
    if (!m->layers || !m->norm_storage)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for %d layers", hp->n_layers);
    float *storage = m->norm_storage;

    const kvs_gguf_tensor *emb = kvs_gguf_find_tensor(g, "token_embd.weight");
    if (!emb)
        return kvs_fail(err, KVS_ERR_FORMAT, "tensor 'token_embd.weight' is missing");
    if (emb->n_dims != 2 || emb->dims[0] != (uint64_t)hp->dim || emb->dims[1] < 1)
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "tensor 'token_embd.weight' must have shape [%d, n_vocab]", hp->dim);
    if (emb->dims[1] > KVS_MAX_VOCAB)
        return kvs_fail(err, KVS_ERR_UNSUPPORTED, "tensor 'token_embd.weight' has %llu rows "
                        "(n_vocab); kvslim supports at most %d", (unsigned long long)emb->dims[1],
                        KVS_MAX_VOCAB);
    m->hp.vocab = (int)emb->dims[1];
    if ((st = find_matrix(g, "token_embd.weight", hp->vocab, hp->dim, &m->tok_embd, &m->n_params,
                          err)))
        return st;
    if ((st = find_norm(g, "output_norm.weight", hp->dim, &storage, &m->output_norm,
                        &m->n_params, err)))
        return st;
    /* No output.weight: the output is tied to the embedding. */
    if (kvs_gguf_find_tensor(g, "output.weight")) {
        if ((st = find_matrix(g, "output.weight", hp->vocab, hp->dim, &m->output, &m->n_params,
                              err)))
            return st;
    } else {
        m->output = m->tok_embd;
    }
    if ((st = load_rope_div(m, a, rope_factor, &storage, err)))
        return st;

    char why_bias[64], why_norm[64];
    snprintf(why_bias, sizeof why_bias, "architecture %s has Q/K/V biases", a->name);
    snprintf(why_norm, sizeof why_norm, "architecture %s has per-head Q/K norms", a->name);
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
        if (a->qkv_bias &&
            ((st = find_vector(g, NAME("attn_q.bias"), q_dim, why_bias, &storage, &L->bq,
                               &m->n_params, err)) ||
             (st = find_vector(g, NAME("attn_k.bias"), kv_dim, why_bias, &storage, &L->bk,
                               &m->n_params, err)) ||
             (st = find_vector(g, NAME("attn_v.bias"), kv_dim, why_bias, &storage, &L->bv,
                               &m->n_params, err))))
            return st;
        if (a->qk_norm &&
            ((st = find_vector(g, NAME("attn_q_norm.weight"), hp->head_dim, why_norm, &storage,
                               &L->q_norm, &m->n_params, err)) ||
             (st = find_vector(g, NAME("attn_k_norm.weight"), hp->head_dim, why_norm, &storage,
                               &L->k_norm, &m->n_params, err))))
            return st;
#undef NAME
    }
    return KVS_OK;
}

/* Tensor names the loader reads in each block: the Llama block's, then the optional parts. */
static const char *const block_tensors[] = {
    "attn_norm.weight", "attn_q.weight",   "attn_k.weight", "attn_v.weight",  "attn_output.weight",
    "ffn_norm.weight",  "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
};
static const char *const bias_tensors[] = {"attn_q.bias", "attn_k.bias", "attn_v.bias"};
static const char *const qk_norm_tensors[] = {"attn_q_norm.weight", "attn_k_norm.weight"};
#define COUNT(a) (sizeof a / sizeof *a)

static int in_list(const char *name, const char *const *list, size_t n)
{
    for (size_t k = 0; k < n; k++)
        if (!strcmp(name, list[k]))
            return 1;
    return 0;
}

/* Every tensor of the llama naming scheme must be one the loader uses: a block beyond
 * block_count or a tensor the architecture does not have (a bias in a llama file, say) would
 * otherwise be ignored silently and the model would compute something other than what the
 * file holds. */
static kvs_status check_unused(const kvs_gguf *g, const arch_spec *a, const kvs_hparams *hp,
                               kvs_error *err)
{
    for (uint64_t i = 0; i < kvs_gguf_n_tensors(g); i++) {
        const char *name = kvs_gguf_tensor_at(g, i)->name;
        if (!strcmp(name, "token_embd.weight") || !strcmp(name, "output_norm.weight") ||
            !strcmp(name, "output.weight") ||
            (a->rope_freqs && !strcmp(name, "rope_freqs.weight")))
            continue;
        if (!strncmp(name, "blk.", 4)) {
            const char *p = name + 4;
            long long blk = 0;
            int digits = 0;
            while (*p >= '0' && *p <= '9' && digits < 10)
                blk = blk * 10 + (*p++ - '0'), digits++;
            if (digits && *p == '.' && blk >= hp->n_layers)
                return kvs_fail(err, KVS_ERR_FORMAT,
                                "tensor '%s' belongs to block %lld, but %s.block_count is %d "
                                "(blocks 0..%d): the file stores more than its metadata says",
                                name, blk, a->name, hp->n_layers, hp->n_layers - 1);
            if (digits && *p == '.' &&
                (in_list(p + 1, block_tensors, COUNT(block_tensors)) ||
                 (a->qkv_bias && in_list(p + 1, bias_tensors, COUNT(bias_tensors))) ||
                 (a->qk_norm && in_list(p + 1, qk_norm_tensors, COUNT(qk_norm_tensors)))))
                continue;
        } else if (strncmp(name, "token_embd.", 11) && strncmp(name, "output", 6) &&
                   strncmp(name, "rope_freqs.", 11)) {
            continue; /* not a llama tensor name: not ours to judge */
        }
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "tensor '%s' is not one kvslim's %s loader uses (it reads "
                        "token_embd.weight, output_norm.weight, output.weight%s and blk.N.{%s, "
                        "...%s%s}); refusing to ignore it", name, a->name,
                        a->rope_freqs ? ", rope_freqs.weight" : "", block_tensors[0],
                        a->qkv_bias ? ", attn_q.bias, attn_k.bias, attn_v.bias" : "",
                        a->qk_norm ? ", attn_q_norm.weight, attn_k_norm.weight" : "");
    }
    return KVS_OK;
}

int kvs_llama_extras(const struct kvs_model *m, char *buf, size_t size)
{
    const kvs_hparams *hp = &m->hp;
    const kvs_layer *L = &m->layers[0];
    int n = 0;
    size_t len = 0;
    buf[0] = 0;
#define ADD(...)                                                                              \
    do {                                                                                      \
        if (len < size)                                                                       \
            len += (size_t)snprintf(buf + len, size - len, "%s", n ? ", " : "");              \
        if (len < size)                                                                       \
            len += (size_t)snprintf(buf + len, size - len, __VA_ARGS__);                      \
        n++;                                                                                  \
    } while (0)
    if (hp->n_heads * hp->head_dim != hp->dim)
        ADD("queries %d wide (head_count %d x key_length %d) while embedding_length is %d",
            hp->n_heads * hp->head_dim, hp->n_heads, hp->head_dim, hp->dim);
    if (L->bq)
        ADD("Q/K/V biases (blk.N.attn_q.bias, ...)");
    if (L->q_norm)
        ADD("per-head Q/K RMSNorm (blk.N.attn_q_norm.weight, ...)");
    if (m->rope_div)
        ADD("scaled RoPE frequencies (rope_freqs.weight or linear rope.scaling)");
#undef ADD
    return n;
}

kvs_status kvs_llama_check_plain(const struct kvs_model *m, const char *engine, kvs_error *err)
{
    char extras[400];
    if (kvs_llama_extras(m, extras, sizeof extras) == 0)
        return KVS_OK;
    return kvs_fail(err, KVS_ERR_UNSUPPORTED,
                    "%s (architecture %s): %s implements the plain Llama block only, and this "
                    "model has %s", m->path, m->arch, engine, extras);
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
    const arch_spec *a = NULL;
    float rope_factor = 1.0f;
    if (st == KVS_OK && (st = find_arch(g, &a, err)) == KVS_OK)
        m->arch = a->name;
    if (st == KVS_OK)
        st = read_hparams(g, a, &m->hp, &rope_factor, err);
    if (st == KVS_OK)
        st = load_weights(m, a, rope_factor, err);
    if (st == KVS_OK)
        st = check_unused(g, a, &m->hp, err);
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
    kvs_llama_make_resident(m);
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
    free(m->rope_div);
    free(m->resident);
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
