/* Writing llama-architecture GGUF files from fp32 weights: metadata, vocabulary, and each
 * matrix in the type its file's weight types (one type, or a K-quant mix) give it. */
#include "model/llama_write.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

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

/* ---- Weight types: one type for all matrices, or llama.cpp's K-quant mixes ------------------
 *
 * The mixes follow llama.cpp's llama_tensor_get_type (llama-quant.cpp) for a llama model
 * without experts, restated:
 *   - q6_k: every matrix Q6_K, token_embd and output included.
 *   - q4_k_m / q5_k_m: the output matrix (or token_embd when the output is tied to it, as it
 *     then serves as the output) is Q6_K. In "more bits" layers, attn_v and ffn_down are Q6_K
 *     too: the first eighth of the layers, the last eighth, and every third layer in between
 *     (use_more_bits below). Every other matrix, token_embd included, is Q4_K / Q5_K.
 *   - q4_k / q5_k (no such llama.cpp file type: its "pure" option): every matrix that type.
 * For 2 layers this gives Q6_K to output, blk.1.attn_v and blk.1.ffn_down, the types of
 * shared/models/arch/llama3-q4_k_m.gguf. llama.cpp counts attn_v and ffn_down tensors rather
 * than layers; with one of each per layer the count is the layer index.
 *
 * Rows that are not whole 256-element super-blocks cannot be K-quants. llama.cpp then falls
 * back to Q5_0 (for Q4_K), Q5_1 (Q5_K) or Q8_0 (Q6_K, and the output of a mix); kvslim has no
 * Q5_0 / Q5_1 quantiser, so it writes Q8_0 for all three (at least as precise), or F16 if the
 * rows are not whole 32-element blocks either, as llama.cpp does, with a note in the log. */

static const struct {
    const char *name;
    kvs_wtype wt;
    uint32_t file_type; /* general.file_type: llama.cpp's enum llama_ftype */
} wtype_table[] = {
    {"f32", {KVS_F32, 0}, 0},     {"f16", {KVS_F16, 0}, 1},     {"bf16", {KVS_BF16, 0}, 32},
    {"q8_0", {KVS_Q8_0, 0}, 7},   {"q4_0", {KVS_Q4_0, 0}, 2},
    /* All-Q4_K / all-Q5_K files have no llama.cpp file type: the closest are Q4_K_S (14) and
     * Q5_K_S (16), the mixes that are mostly of that type. */
    {"q4_k", {KVS_Q4_K, 0}, 14},  {"q5_k", {KVS_Q5_K, 0}, 16},  {"q6_k", {KVS_Q6_K, 0}, 18},
    {"q4_k_m", {KVS_Q4_K, 1}, 15}, {"q5_k_m", {KVS_Q5_K, 1}, 17},
};
#define N_WTYPES (sizeof wtype_table / sizeof wtype_table[0])

static int wtype_index(kvs_wtype w)
{
    for (size_t i = 0; i < N_WTYPES; i++)
        if (wtype_table[i].wt.type == w.type && wtype_table[i].wt.mix_m == (w.mix_m != 0))
            return (int)i;
    return -1;
}

int kvs_wtype_parse(const char *name, kvs_wtype *out)
{
    for (size_t i = 0; i < N_WTYPES; i++)
        if (strcasecmp(name, wtype_table[i].name) == 0) {
            *out = wtype_table[i].wt;
            return 0;
        }
    return -1;
}

const char *kvs_wtype_name(kvs_wtype w)
{
    const int i = wtype_index(w);
    return i < 0 ? kvs_dtype_name(w.type) : wtype_table[i].name;
}

/* What a matrix is to the mix rules. */
typedef enum matrix_role { ROLE_OTHER, ROLE_OUTPUT, ROLE_ATTN_V, ROLE_FFN_DOWN } matrix_role;

/* llama.cpp's use_more_bits: the first and last eighth of the layers and every third layer
 * between them (integer division, as there). */
static int use_more_bits(int i, int n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* The type the mix gives a matrix of this role in layer `layer` of n_layers. */
static kvs_dtype mix_type(kvs_wtype wt, matrix_role role, int layer, int n_layers)
{
    if (!wt.mix_m)
        return wt.type;
    if (role == ROLE_OUTPUT)
        return KVS_Q6_K;
    if ((role == ROLE_ATTN_V || role == ROLE_FFN_DOWN) && use_more_bits(layer, n_layers))
        return KVS_Q6_K;
    return wt.type;
}

/* The type actually written for rows of `cols` elements: t, or its fallback when the rows are
 * not whole blocks of t (a note naming the tensor goes to log). */
static kvs_dtype fit_rows(kvs_dtype t, const char *name, int cols, FILE *log)
{
    if ((size_t)cols % kvs_dtype_block_elems(t) == 0)
        return t;
    kvs_dtype alt = kvs_dtype_is_kquant(t) && cols % KVS_QK == 0 ? KVS_Q8_0 : KVS_F16;
    if (log)
        fprintf(log, "note: %s has rows of %d, not a multiple of the %s block size %zu; "
                     "stored as %s\n", name, cols, kvs_dtype_name(t), kvs_dtype_block_elems(t),
                kvs_dtype_name(alt));
    return alt;
}

typedef struct writer_ctx {
    kvs_gguf_writer *w;
    owned_list owned;
    kvs_wtype wt;
    int n_layers;
    FILE *log;
    kvs_error *err;
} writer_ctx;

static kvs_status add_vector(writer_ctx *c, const char *name, const float *data, int n)
{
    uint64_t dims[1] = {(uint64_t)n};
    return kvs_gguf_add_tensor(c->w, name, KVS_F32, 1, dims, data, c->err);
}

/* A rows x cols matrix of role `role` in layer `layer` (-1 outside the layers). */
static kvs_status add_matrix(writer_ctx *c, const char *name, const float *data, int rows,
                             int cols, matrix_role role, int layer)
{
    const kvs_dtype t = fit_rows(mix_type(c->wt, role, layer, c->n_layers), name, cols, c->log);
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

static uint32_t file_type_id(kvs_wtype wt)
{
    const int i = wtype_index(wt);
    return i < 0 ? 0 : wtype_table[i].file_type;
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

static kvs_status set_metadata(kvs_gguf_writer *w, const kvs_llama_src *src, kvs_wtype wt)
{
    const kvs_hparams *hp = &src->hp;
    kvs_status st;
    if ((st = kvs_gguf_set_str(w, "general.architecture", "llama")) ||
        (st = kvs_gguf_set_str(w, "general.name", src->name ? src->name : "llama")) ||
        (st = kvs_gguf_set_u32(w, "general.file_type", file_type_id(wt))) ||
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
    if (wt.type != KVS_F32 && wt.type != KVS_F16 && wt.type != KVS_BF16)
        st = kvs_gguf_set_u32(w, "general.quantization_version", 2);
    return st;
}

kvs_status kvs_llama_write_gguf(const kvs_llama_src *src, const kvs_tokenizer *tok,
                                kvs_wtype wt, const kvs_outfile_spec *out, FILE *log,
                                kvs_error *err)
{
    const char *path = out->path;
    const kvs_hparams *hp = &src->hp;
    const int q_dim = hp->n_heads * hp->head_dim, kv_dim = hp->n_kv_heads * hp->head_dim;
    if (wtype_index(wt) < 0)
        return kvs_fail(err, KVS_ERR_ARG, "%s: kvslim cannot write weights of type %s", path,
                        kvs_dtype_name(wt.type));
    writer_ctx c = {kvs_gguf_writer_new(), {0}, wt, hp->n_layers, log, err};
    if (!c.w)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    kvs_status st = set_metadata(c.w, src, wt);
    if (st == KVS_OK)
        st = tok ? kvs_tokenizer_to_gguf(tok, c.w) : write_synthetic_vocab(c.w, hp->vocab);
    if (st != KVS_OK)
        kvs_fail(err, st, "%s: could not build metadata (%s)", path, kvs_status_name(st));
    /* A tied token_embd is also the output matrix, and gets the output's type (llama.cpp). */
    if (st == KVS_OK)
        st = add_matrix(&c, "token_embd.weight", src->tok_embd, hp->vocab, hp->dim,
                        src->output ? ROLE_OTHER : ROLE_OUTPUT, -1);
    if (st == KVS_OK)
        st = add_vector(&c, "output_norm.weight", src->output_norm, hp->dim);
    if (st == KVS_OK && src->output)
        st = add_matrix(&c, "output.weight", src->output, hp->vocab, hp->dim, ROLE_OUTPUT, -1);
    for (int l = 0; st == KVS_OK && l < hp->n_layers; l++) {
        const kvs_llama_src_layer *L = &src->layers[l];
        char name[96];
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%d.%s", l, suffix), name)
        if ((st = add_vector(&c, NAME("attn_norm.weight"), L->attn_norm, hp->dim)) ||
            (st = add_matrix(&c, NAME("attn_q.weight"), L->wq, q_dim, hp->dim, ROLE_OTHER, l)) ||
            (st = add_matrix(&c, NAME("attn_k.weight"), L->wk, kv_dim, hp->dim, ROLE_OTHER, l)) ||
            (st = add_matrix(&c, NAME("attn_v.weight"), L->wv, kv_dim, hp->dim, ROLE_ATTN_V,
                             l)) ||
            (st = add_matrix(&c, NAME("attn_output.weight"), L->wo, hp->dim, q_dim, ROLE_OTHER,
                             l)) ||
            (st = add_vector(&c, NAME("ffn_norm.weight"), L->ffn_norm, hp->dim)) ||
            (st = add_matrix(&c, NAME("ffn_gate.weight"), L->w_gate, hp->hidden, hp->dim,
                             ROLE_OTHER, l)) ||
            (st = add_matrix(&c, NAME("ffn_down.weight"), L->w_down, hp->dim, hp->hidden,
                             ROLE_FFN_DOWN, l)) ||
            (st = add_matrix(&c, NAME("ffn_up.weight"), L->w_up, hp->hidden, hp->dim, ROLE_OTHER,
                             l)))
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
