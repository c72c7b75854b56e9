/* Import of llama2.c checkpoints: validate the header and size, then hand the fp32 tensors to
 * the GGUF writer. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/llama_write.h"

typedef struct checkpoint {
    void *map;
    size_t size;
    kvs_llama_src src;
    kvs_llama_src_layer *layers;
} checkpoint;

/* Walks the tensors in file order, checking each fits before it is used. */
typedef struct cursor {
    const float *base;
    uint64_t used, total; /* in floats */
    const char *path;
    kvs_error *err;
} cursor;

static kvs_status take(cursor *c, const char *what, uint64_t n, const float **out)
{
    if (n > c->total - c->used)
        return kvs_fail(c->err, KVS_ERR_FORMAT,
                        "%s: truncated checkpoint: %s needs %llu floats at offset %llu but only "
                        "%llu bytes remain", c->path, what, (unsigned long long)n,
                        (unsigned long long)(28 + 4 * c->used),
                        (unsigned long long)(4 * (c->total - c->used)));
    if (out)
        *out = c->base + c->used;
    c->used += n;
    return KVS_OK;
}

static kvs_status parse(checkpoint *ck, const char *path, kvs_error *err)
{
    if (ck->size < 28)
        return kvs_fail(err, KVS_ERR_FORMAT, "%s: truncated checkpoint header (%zu of 28 bytes)",
                        path, ck->size);
    int32_t h[7];
    memcpy(h, ck->map, sizeof h);
    static const char *const names[7] = {"dim", "hidden_dim", "n_layers", "n_heads",
                                         "n_kv_heads", "vocab_size", "seq_len"};
    for (int i = 0; i < 7; i++) {
        int64_t v = h[i];
        if (i == 5 && v < 0) /* a negative vocab_size means an unshared classifier follows */
            v = -v;
        if (v <= 0 || v > (1 << 24))
            return kvs_fail(err, KVS_ERR_FORMAT, "%s: header field %s = %d is out of range",
                            path, names[i], h[i]);
    }
    kvs_hparams *hp = &ck->src.hp;
    hp->dim = h[0];
    hp->hidden = h[1];
    hp->n_layers = h[2];
    hp->n_heads = h[3];
    hp->n_kv_heads = h[4];
    hp->vocab = h[5] < 0 ? -h[5] : h[5];
    hp->ctx = h[6];
    if (hp->dim % hp->n_heads != 0 || hp->n_heads % hp->n_kv_heads != 0 ||
        (hp->dim / hp->n_heads) % 2 != 0)
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "%s: header: n_heads %d must divide dim %d into an even head size, and "
                        "n_kv_heads %d must divide n_heads", path, hp->n_heads, hp->dim,
                        hp->n_kv_heads);
    hp->head_dim = hp->dim / hp->n_heads;
    hp->rot_dim = hp->head_dim;
    hp->eps = 1e-5f;
    hp->rope_base = 10000.0f;

    const uint64_t dim = (uint64_t)hp->dim, L = (uint64_t)hp->n_layers,
                   kv_dim = (uint64_t)hp->n_kv_heads * hp->head_dim, hidden = (uint64_t)hp->hidden,
                   vocab = (uint64_t)hp->vocab;
    cursor c = {(const float *)((const char *)ck->map + 28), 0, (ck->size - 28) / 4, path, err};
    if ((ck->size - 28) % 4 != 0)
        return kvs_fail(err, KVS_ERR_FORMAT, "%s: size %zu is not 28 + a whole number of floats",
                        path, ck->size);
    /* The per-layer table is sized by the header's n_layers: refuse a count the file cannot
     * hold before allocating it (up to 2^24 layers, 1.2 GB of table, for a 28-byte file). Each
     * term is below 2^50, so the sum cannot overflow. */
    const uint64_t per_layer = 2 * dim + 2 * dim * dim + 2 * dim * kv_dim + 3 * dim * hidden;
    if (L > c.total / per_layer)
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "%s: truncated checkpoint: header field n_layers = %d needs %llu floats "
                        "per layer, more than the %llu bytes after the header hold", path,
                        hp->n_layers, (unsigned long long)per_layer,
                        (unsigned long long)(ck->size - 28));
    ck->layers = calloc(L, sizeof *ck->layers);
    if (!ck->layers)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    ck->src.layers = ck->layers;
    const float *p;
    kvs_status st;
    if ((st = take(&c, "token_embedding_table", vocab * dim, &ck->src.tok_embd)))
        return st;
    /* Per-kind tensors are stored for all layers together. */
#define PER_LAYER(field, what, n)                                                            \
    for (uint64_t l = 0; l < L; l++) {                                                       \
        if ((st = take(&c, what, n, &p)))                                                    \
            return st;                                                                       \
        ck->layers[l].field = p;                                                             \
    }
    PER_LAYER(attn_norm, "rms_att_weight", dim)
    PER_LAYER(wq, "wq", dim * dim)
    PER_LAYER(wk, "wk", dim * kv_dim)
    PER_LAYER(wv, "wv", dim * kv_dim)
    PER_LAYER(wo, "wo", dim * dim)
    PER_LAYER(ffn_norm, "rms_ffn_weight", dim)
    PER_LAYER(w_gate, "w1", dim * hidden)
    PER_LAYER(w_down, "w2", hidden * dim)
    PER_LAYER(w_up, "w3", dim * hidden)
#undef PER_LAYER
    if ((st = take(&c, "rms_final_weight", dim, &ck->src.output_norm)) ||
        (st = take(&c, "freq_cis_real", (uint64_t)hp->ctx * hp->head_dim / 2, NULL)) ||
        (st = take(&c, "freq_cis_imag", (uint64_t)hp->ctx * hp->head_dim / 2, NULL)))
        return st;
    if (h[5] < 0 && (st = take(&c, "wcls", vocab * dim, &ck->src.output)))
        return st;
    if (c.used != c.total)
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "%s: %llu unexpected trailing bytes after the last tensor", path,
                        (unsigned long long)(4 * (c.total - c.used)));
    return KVS_OK;
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* out, with the checkpoint and tokenizer added to the inputs it must not overwrite. */
static kvs_status with_inputs(const kvs_outfile_spec *out, const char *model_path,
                              const char *tok_path, kvs_outfile_spec *full,
                              kvs_outfile_input **owned, kvs_error *err)
{
    int n = out->n_inputs > 0 ? out->n_inputs : 0;
    kvs_outfile_input *in = malloc(sizeof *in * (size_t)(n + 2));
    if (!in)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++)
        in[i] = out->inputs[i];
    in[n] = (kvs_outfile_input){"the checkpoint", model_path};
    in[n + 1] = (kvs_outfile_input){"the tokenizer", tok_path};
    *full = *out;
    full->inputs = in;
    full->n_inputs = n + 2;
    *owned = in;
    return KVS_OK;
}

kvs_status kvs_llama2c_convert_to(const char *model_path, const char *tok_path, kvs_wtype wt,
                                  const kvs_outfile_spec *out_in, FILE *log, kvs_error *err)
{
    return kvs_llama2c_convert_dup_to(model_path, tok_path, wt, NULL, 0, out_in, log, err);
}

kvs_status kvs_llama2c_convert_dup_to(const char *model_path, const char *tok_path,
                                      kvs_wtype wt, const int *dup, int n_dup,
                                      const kvs_outfile_spec *out_in, FILE *log, kvs_error *err)
{
    if (!model_path || !tok_path || !out_in || !out_in->path)
        return kvs_fail(err, KVS_ERR_ARG, "convert: NULL argument");
    checkpoint ck = {0};
    kvs_tokenizer *tok = NULL;
    kvs_outfile_spec out;
    kvs_outfile_input *inputs = NULL;
    kvs_status st = with_inputs(out_in, model_path, tok_path, &out, &inputs, err);
    if (st == KVS_OK)
        st = kvs_outfile_check(&out, NULL, err);
    if (st != KVS_OK) {
        free(inputs);
        return st;
    }
    int fd = open(model_path, O_RDONLY);
    if (fd < 0) {
        free(inputs);
        return kvs_fail(err, KVS_ERR_IO, "%s: %s", model_path, strerror(errno));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))
        st = kvs_fail(err, KVS_ERR_IO, "%s: not a regular file", model_path);
    else if (sb.st_size == 0)
        st = kvs_fail(err, KVS_ERR_FORMAT, "%s: empty file", model_path);
    if (st == KVS_OK) {
        ck.size = (size_t)sb.st_size;
        ck.map = mmap(NULL, ck.size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (ck.map == MAP_FAILED) {
            ck.map = NULL;
            st = kvs_fail(err, KVS_ERR_IO, "%s: mmap failed: %s", model_path, strerror(errno));
        }
    }
    close(fd);
    if (st == KVS_OK)
        st = parse(&ck, model_path, err);
    if (st == KVS_OK)
        st = kvs_tokenizer_load_llama2c_n(tok_path, ck.src.hp.vocab, &tok, err);
    if (st == KVS_OK) {
        ck.src.name = base_name(model_path);
        kvs_llama_src up = ck.src;
        kvs_llama_src_layer *up_layers = NULL;
        if (n_dup > 0)
            st = kvs_llama_duplicate_layers(&ck.src, dup, n_dup, &up, &up_layers, err);
        if (st == KVS_OK)
            st = kvs_llama_write_gguf(&up, tok, wt, &out, log, err);
        free(up_layers);
    }
    kvs_tokenizer_free(tok);
    free(ck.layers);
    free(inputs);
    if (ck.map)
        munmap(ck.map, ck.size);
    return st;
}

kvs_status kvs_llama2c_convert(const char *model_path, const char *tok_path, kvs_wtype wt,
                               const char *out_path, FILE *log, kvs_error *err)
{
    kvs_outfile_spec out = {.path = out_path};
    return kvs_llama2c_convert_to(model_path, tok_path, wt, &out, log, err);
}
