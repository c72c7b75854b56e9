/* Error paths of the KV cache no other test reaches (issue 16): kvs_kv_new's configuration
 * checks, a budget above the context, kvs_kv_layer called out of order (before a prompt, a
 * decode batch, a batch past the prompt or past the policy's limit), shifting with the recall
 * shadow, pqcache's local window and second prompt, KIVI on the wrong store, an over-long
 * --kv-type item, the layer similarity of a cache whose layers differ, a second prompt into a
 * cache not reset (snapkv, nacl, hashevict), minicache's layers out of order, MPCache layers
 * fed other positions than the layer they share with, an empty NACL proxy span, and a restored
 * attention view of two rows. Each asserts
 * the status and that the message names the value. */
#include <string.h>

#include "check.h"
#include "core/threadpool.h"
#include "eval/layer_similarity.h"
#include "kv/attention.h"
#include "kv/kivi.h"
#include "kv/kv.h"
#include "kv/kv_store.h"
#include "policies/registry.h"

enum { L = 2, NH = 2, NKV = 1, HD = 8, CTX = 16, MAXT = 64 };

#define CHECK_ERR(st_, want_st, needle)                                                      \
    CHECKF((st_) == (want_st) && strstr(err.msg, (needle)), "status %d, message '%s' (want %d, " \
           "'%s')", (int)(st_), err.msg, (int)(want_st), (needle))

static kvs_status parse(const char *text, kvs_policy_spec *spec)
{
    kvs_error err = {0};
    kvs_status st = kvs_policy_parse(text, spec, &err);
    CHECKF(st == KVS_OK, "%s: %s", text, err.msg);
    return st;
}

/* The cache most cases use: L layers, NH query and NKV KV heads of HD, a context of CTX, F32. */
static const kvs_kv_config base = {L, NH, NKV, HD, CTX, KVS_F32, 0};

/* Frees what open_kv made (either may be NULL). */
static void close_kv(kvs_kv *kv, kvs_pool *pool)
{
    kvs_kv_free(kv);
    kvs_pool_destroy(pool);
}

/* Opens a cache of config c and --kv spec_text and a 1-thread pool, CHECKed: 1, or 0 (none). */
static int open_kv(const char *spec_text, kvs_kv_config c, kvs_kv **kv, kvs_pool **pool)
{
    kvs_policy_spec spec;
    kvs_error err = {0};
    *kv = NULL;
    *pool = kvs_pool_create(1);
    kvs_status st = parse(spec_text, &spec);
    if (st == KVS_OK)
        st = kvs_kv_new(&c, &spec, kv, &err);
    CHECKF(st == KVS_OK && *pool, "%s: %s", spec_text, *pool ? err.msg : "no thread pool");
    if (st == KVS_OK && *pool)
        return 1;
    close_kv(*kv, *pool);
    *kv = NULL;
    *pool = NULL;
    return 0;
}

static void config_checks(void)
{
    kvs_policy_spec full;
    parse("full", &full);
    kvs_kv *kv = (kvs_kv *)1;
    kvs_error err = {0};

    kvs_kv_config c = {L, 3, 2, HD, CTX, KVS_F32, 0};
    kvs_status st = kvs_kv_new(&c, &full, &kv, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "KV heads 2 do not divide query heads 3");
    CHECK(kv == NULL);

    c = (kvs_kv_config){L, NH, NKV, HD, CTX, KVS_BF16, 0};
    st = kvs_kv_new(&c, &full, &kv, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "is not supported (f32 or f16)");
    CHECK(strstr(err.msg, kvs_dtype_name(KVS_BF16)) != NULL);

    /* Both ends of the context range, with the range in the message. */
    c = (kvs_kv_config){L, NH, NKV, HD, 0, KVS_F32, 0};
    st = kvs_kv_new(&c, &full, &kv, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "context of 0 tokens is out of range [1, 1073741823]");
    c.max_slots = (1 << 30) + 1;
    st = kvs_kv_new(&c, &full, &kv, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "context of 1073741825 tokens is out of range");
    CHECK(kv == NULL);
}

static void budget_over_context(void)
{
    kvs_error err = {0};
    kvs_kv *kv;
    kvs_pool *pool;
    /* A fraction of a prompt longer than the context: the message suggests slots=N. */
    if (open_kv("h2o:budget=0.5", base, &kv, &pool)) {
        kvs_status st = kvs_kv_begin_prompt(kv, 40, &err);
        CHECK_ERR(st, KVS_ERR_ARG, "--kv h2o:budget=0.5: budget of 20 slots (of a prompt of 40 "
                                   "tokens) exceeds the context of 16 tokens");
        CHECK(strstr(err.msg, "give a count of slots"));
        close_kv(kv, pool);
    }
    /* A count above the context. */
    if (open_kv("h2o:slots=17", base, &kv, &pool)) {
        kvs_status st = kvs_kv_begin_prompt(kv, 8, &err);
        CHECK_ERR(st, KVS_ERR_ARG, "--kv h2o:slots=17: budget of 17 slots exceeds the context "
                                   "of 16 tokens");
        close_kv(kv, pool);
    }
}

static float q[MAXT * NH * HD], k[MAXT * NKV * HD], v[MAXT * NKV * HD], out[MAXT * NH * HD];
static int32_t pos[MAXT];

static void fill(void)
{
    for (size_t i = 0; i < sizeof q / sizeof *q; i++)
        q[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        k[i] = (float)((i * 5) % 13) / 13.0f - 0.5f;
        v[i] = (float)((i * 3) % 17) / 17.0f - 0.5f;
    }
    for (int i = 0; i < MAXT; i++)
        pos[i] = i;
}

static void layer_order(void)
{
    kvs_error err = {0};
    kvs_kv *kv;
    kvs_pool *pool;
    if (!open_kv("full", base, &kv, &pool))
        return;
    /* Before any prompt. */
    kvs_status st = kvs_kv_layer(kv, pool, 0, 1, q, k, v, pos, out, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "no prompt has begun (kvs_kv_begin_prompt)");

    /* A batch longer than the prompt's remainder. */
    CHECK(kvs_kv_begin_prompt(kv, 4, &err) == KVS_OK);
    st = kvs_kv_layer(kv, pool, 0, 5, q, k, v, pos, out, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "batch of 5 tokens runs past the prompt's end (4 left)");

    /* The prompt fed to layer 0 only: the layers now differ, which the layer similarity
     * refuses, naming the first layer that differs. */
    CHECKF(kvs_kv_layer(kv, pool, 0, 4, q, k, v, pos, out, &err) == KVS_OK, "%s", err.msg);
    kvs_layer_sim sim[L];
    st = kvs_layer_similarity(kv, sim, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "layer similarity needs a full cache: layer 1 head 0 holds");
    CHECKF(kvs_kv_layer(kv, pool, 1, 4, q, k, v, pos, out, &err) == KVS_OK, "%s", err.msg);
    CHECKF(kvs_layer_similarity(kv, sim, &err) == KVS_OK, "%s", err.msg);
    kvs_kv_end_batch(kv, 4);

    /* Decoding takes one token at a time. */
    st = kvs_kv_layer(kv, pool, 0, 2, q, k, v, pos + 4, out, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "decode steps take one token, got 2");
    close_kv(kv, pool);

    /* hashevict (paper prefill) takes the prompt beyond its slots token by token: a larger
     * batch is refused with the limit kvs_kv_prompt_batch gives. */
    if (open_kv("hashevict:slots=4,sinks=0,recent=0", base, &kv, &pool)) {
        CHECKF(kvs_kv_begin_prompt(kv, 8, &err) == KVS_OK, "%s", err.msg);
        CHECKF(kvs_kv_prompt_batch(kv) == 4, "prompt batch %d", kvs_kv_prompt_batch(kv));
        st = kvs_kv_layer(kv, pool, 0, 8, q, k, v, pos, out, &err);
        CHECK_ERR(st, KVS_ERR_ARG, "batch of 8 prompt tokens exceeds the 4 the KV policy "
                                   "hashevict:slots=4,sinks=0,recent=0 takes next");
        close_kv(kv, pool);
    }
}

static void shift_with_shadow(void)
{
    kvs_error err = {0};
    kvs_kv_config c = base;
    c.shadow = 1;
    kvs_kv *kv;
    kvs_pool *pool;
    if (!open_kv("streaming:slots=8,shift=on", c, &kv, &pool))
        return;
    const kvs_rope_cfg rope = {HD, 10000.0f, 0};
    int32_t delta = -1;
    kvs_status st = kvs_kv_shift(kv, 20, &rope, &delta, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "position shifting cannot run with the attention recall");
    CHECK(delta == 0);
    close_kv(kv, pool);
}

/* Layers holding as many tokens but at other positions are as different as layers holding
 * other counts: the layer similarity compares the positions, not just their number. */
static void similarity_positions(void)
{
    kvs_error err = {0};
    kvs_kv *kv;
    kvs_pool *pool;
    if (open_kv("full", base, &kv, &pool)) {
        CHECK(kvs_kv_begin_prompt(kv, 4, &err) == KVS_OK);
        CHECKF(kvs_kv_layer(kv, pool, 0, 4, q, k, v, pos, out, &err) == KVS_OK, "%s", err.msg);
        CHECKF(kvs_kv_layer(kv, pool, 1, 4, q, k, v, pos + 4, out, &err) == KVS_OK, "%s",
               err.msg);
        kvs_layer_sim sim[L];
        kvs_status st = kvs_layer_similarity(kv, sim, &err);
        CHECK_ERR(st, KVS_ERR_ARG, "layer similarity needs a full cache: layer 1 head 0 holds");
        close_kv(kv, pool);
    }
}

/* MPCache's sharing layers keep the positions their partner kept; layers fed other positions
 * than their partner (all layers must see the same tokens) are refused, not mismatched. */
static void mpcache_share(void)
{
    enum { ML = 4, N = 16 };
    kvs_error err = {0};
    kvs_kv_config c = base;
    c.n_layers = ML;
    c.max_slots = MAXT;
    kvs_kv *kv;
    kvs_pool *pool;
    if (open_kv("mpcache:budget=0.5,skip=0,share=on", c, &kv, &pool)) {
        CHECKF(kvs_kv_begin_prompt(kv, N, &err) == KVS_OK, "%s", err.msg);
        kvs_status st = KVS_OK;
        for (int l = 0; l < ML && st == KVS_OK; l++) /* layer l at positions 16 l .. 16 l + 15 */
            st = kvs_kv_layer(kv, pool, l, N, q, k, v, pos + N * l, out, &err);
        CHECK_ERR(st, KVS_ERR_ARG, "--kv mpcache:budget=0.5,skip=0,share=on: layer ");
        CHECKF(strstr(err.msg, "cannot share layer") && strstr(err.msg, "(0 found)"), "%s",
               err.msg);
        close_kv(kv, pool);
    }
}

/* NACL's explicit proxy span must be a non-empty span inside the prompt: begin at or after
 * its end is refused when the prompt begins, with the span and the prompt length. */
static void nacl_proxy_span(void)
{
    kvs_error err = {0};
    kvs_kv *kv;
    kvs_pool *pool;
    if (open_kv("nacl:slots=4,proxy_begin=6,proxy_end=6", base, &kv, &pool)) {
        kvs_status st = kvs_kv_begin_prompt(kv, 8, &err);
        for (int l = 0; l < L && st == KVS_OK; l++)
            st = kvs_kv_layer(kv, pool, l, 8, q, k, v, pos, out, &err);
        CHECK_ERR(st, KVS_ERR_ARG, "proxy span [6, 6) is not a non-empty span inside the "
                                   "prompt of 8 tokens");
        close_kv(kv, pool);
    }
}

/* pqcache: a local window longer than the context is refused when the prompt begins, and a
 * second prompt into the same cache (whose middle tokens would be lost with the tier). */
static void pqcache(void)
{
    kvs_error err = {0};
    kvs_kv *kv;
    kvs_pool *pool;
    if (open_kv("pqcache:budget=0.5,local=17", base, &kv, &pool)) {
        kvs_status st = kvs_kv_begin_prompt(kv, 8, &err);
        CHECK_ERR(st, KVS_ERR_ARG, "--kv pqcache:budget=0.5,local=17: local=17 exceeds the "
                                   "context of 16 tokens");
        close_kv(kv, pool);
    }
    if (open_kv("pqcache:budget=0.5,init=1,local=2,bits=1", base, &kv, &pool)) {
        CHECKF(kvs_kv_begin_prompt(kv, 8, &err) == KVS_OK, "%s", err.msg);
        for (int l = 0; l < L; l++)
            CHECKF(kvs_kv_layer(kv, pool, l, 8, q, k, v, pos, out, &err) == KVS_OK, "%s",
                   err.msg);
        kvs_kv_end_batch(kv, 8);
        kvs_status st = kvs_kv_begin_prompt(kv, 8, &err);
        CHECK_ERR(st, KVS_ERR_UNSUPPORTED, "pqcache takes one prompt per cache; the cache "
                                           "already holds tokens");
        CHECK(strstr(err.msg, "--kv pqcache:budget=0.5,init=1,local=2,bits=1") != NULL);
        close_kv(kv, pool);
    }
}

/* Feeds a prompt of n tokens to every layer in the batches kvs_kv_prompt_batch gives, then
 * decodes `decode` tokens; positions from *next on. The first failure's status. */
static kvs_status feed(kvs_kv *kv, kvs_pool *pool, int layers, int n, int decode, int *next,
                       kvs_error *err)
{
    kvs_status st = kvs_kv_begin_prompt(kv, n, err);
    for (int done = 0; done < n && st == KVS_OK;) {
        const int b = kvs_kv_prompt_batch(kv);
        for (int l = 0; l < layers && st == KVS_OK; l++)
            st = kvs_kv_layer(kv, pool, l, b, q, k, v, pos + *next + done, out, err);
        kvs_kv_end_batch(kv, b);
        done += b;
    }
    *next += n;
    for (int d = 0; d < decode && st == KVS_OK; d++) {
        for (int l = 0; l < layers && st == KVS_OK; l++)
            st = kvs_kv_layer(kv, pool, l, 1, q, k, v, pos + *next, out, err);
        kvs_kv_end_batch(kv, 1);
        ++*next;
    }
    return st;
}

/* A second prompt into a cache that still holds the first (no kvs_kv_reset; the session
 * always resets): the policies that score or place the prompt refuse the slots from before it
 * instead of reading past their per-prompt arrays. hashevict's message named only a batch
 * larger than kvs_kv_prompt_batch, which kvs_kv_layer already refuses (and this one is not):
 * it now names the tokens from before the prompt first. */
static void second_prompt(void)
{
    static const struct {
        const char *spec, *want;
    } cases[] = {
        /* policy.c: the window scores of snapkv (and the other scorer policies) */
        {"snapkv:slots=8", "--kv snapkv:slots=8: 27 slots for a prompt of 16 tokens"},
        {"nacl:slots=8", "--kv nacl:slots=8: 27 slots at the end of a prompt of 16 tokens"},
        {"hashevict:slots=8,sinks=0,recent=0",
         "a prompt batch of 8 tokens overflows the 8 slots (the cache holds tokens from "
         "before this prompt"},
    };
    kvs_pool *pool = kvs_pool_create(1);
    CHECK(pool != NULL);
    for (size_t i = 0; pool && i < sizeof cases / sizeof *cases; i++) {
        kvs_policy_spec spec;
        kvs_error err = {0};
        kvs_kv_config c = {L, NH, NKV, HD, MAXT, KVS_F32, 0};
        kvs_kv *kv = NULL;
        parse(cases[i].spec, &spec);
        if (kvs_kv_new(&c, &spec, &kv, &err) != KVS_OK) {
            CHECKF(0, "%s: %s", cases[i].spec, err.msg);
            continue;
        }
        int next = 0;
        /* The first prompt and 3 decoded tokens run; the second prompt is refused. */
        kvs_status st = feed(kv, pool, L, 16, 3, &next, &err);
        CHECKF(st == KVS_OK, "%s: %s", cases[i].spec, err.msg);
        st = feed(kv, pool, L, 16, 0, &next, &err);
        CHECK_ERR(st, KVS_ERR_ARG, cases[i].want);
        kvs_kv_free(kv);
    }
    kvs_pool_destroy(pool);
}

/* minicache merges layer pairs (here (2, 3) of 4 layers): prompt batches fed to a layer twice,
 * a pair whose layers saw different prompt lengths, and a decode step that runs the pair's
 * second layer first are refused, naming the layers. */
static void minicache_order(void)
{
    enum { ML = 4 };
    kvs_error err = {0};
    kvs_kv_config c = base;
    c.n_layers = ML;
    kvs_kv *kv;
    kvs_pool *pool;
    if (!open_kv("minicache", c, &kv, &pool))
        return;
    /* Layer 2 fed the whole prompt twice within one batch. */
    CHECK(kvs_kv_begin_prompt(kv, 8, &err) == KVS_OK);
    kvs_status st = kvs_kv_layer(kv, pool, 2, 8, q, k, v, pos, out, &err);
    CHECKF(st == KVS_OK, "%s", err.msg);
    st = kvs_kv_layer(kv, pool, 2, 8, q, k, v, pos + 8, out, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "minicache: layer 2 got 8 prompt tokens after 8, more than the "
                               "prompt's 8");

    /* Layer 2 half the prompt, layer 3 all of it: the pair's lengths differ at the merge. */
    kvs_kv_reset(kv, 0);
    CHECK(kvs_kv_begin_prompt(kv, 8, &err) == KVS_OK);
    CHECKF(kvs_kv_layer(kv, pool, 2, 4, q, k, v, pos, out, &err) == KVS_OK, "%s", err.msg);
    st = kvs_kv_layer(kv, pool, 3, 8, q, k, v, pos, out, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "minicache: pair (2, 3) saw 4 and 8 prompt tokens");

    /* A decode step that runs layer 3 before layer 2. */
    kvs_kv_reset(kv, 1);
    int next = 0;
    CHECKF(feed(kv, pool, ML, 8, 1, &next, &err) == KVS_OK, "%s", err.msg);
    st = kvs_kv_layer(kv, pool, 0, 1, q, k, v, pos + next, out, &err);
    if (st == KVS_OK)
        st = kvs_kv_layer(kv, pool, 1, 1, q, k, v, pos + next, out, &err);
    CHECKF(st == KVS_OK, "%s", err.msg);
    st = kvs_kv_layer(kv, pool, 3, 1, q, k, v, pos + next, out, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "minicache: layer 3 ran before layer 2 in a decode step");
    close_kv(kv, pool);
}

/* The restored view (MiniCache's, a tail slot or scales) takes one query row and none of the
 * row outputs: asking for more is an argument error, not a silent wrong answer. */
static void restored_view(void)
{
    kvs_error err = {0};
    kvs_store_config sc = {1, NKV, HD, 8, KVS_F32, 0};
    kvs_store *s = kvs_store_new(&sc);
    kvs_pool *pool = kvs_pool_create(1);
    kvs_attn_scratch *scr = kvs_attn_scratch_new();
    CHECK(s && pool && scr);
    if (s && pool && scr) {
        CHECKF(kvs_store_append(s, 0, 4, k, v, pos, &err) == KVS_OK, "%s", err.msg);
        const int32_t qpos[2] = {4, 5};
        kvs_attn_args a = {.store = s, .layer = 0, .n_heads = NH, .n = 2, .q = q, .qpos = qpos,
                           .out = out, .tail_k = k, .tail_v = v};
        kvs_status st = kvs_attention(pool, scr, &a, &err);
        CHECK_ERR(st, KVS_ERR_ARG, "attention: a restored view takes one query row");
        a.n = 1;
        CHECKF(kvs_attention(pool, scr, &a, &err) == KVS_OK, "%s", err.msg);
        float probs[NH * 8];
        a.probs = probs;
        a.probs_stride = 8;
        st = kvs_attention(pool, scr, &a, &err);
        CHECK_ERR(st, KVS_ERR_ARG, "without a selection, probabilities or column sums");
    }
    kvs_attn_scratch_free(scr);
    kvs_pool_destroy(pool);
    kvs_store_free(s);
}

static void kivi(void)
{
    kvs_kivi_cfg kc;
    kvs_error err = {0};
    /* An item longer than the parser's buffer is refused whole, not cut into another value. */
    char name[160];
    memset(name, '1', sizeof name - 1);
    name[sizeof name - 1] = 0;
    memcpy(name, "kivi:kbits=", 11);
    CHECK(kvs_kivi_parse(name, &kc, &err) == -1);
    CHECKF(strstr(err.msg, "--kv-type kivi:kbits=111") && strstr(err.msg, "parameter too long"),
           "%s", err.msg);

    /* KIVI needs an empty F16 store: an F32 one, or an F16 one holding a token, is refused. */
    CHECK(kvs_kivi_parse("kivi4", &kc, &err) == 1);
    kvs_store_config sc = {1, 1, 32, 64, KVS_F32, 0};
    kvs_store *s = kvs_store_new(&sc);
    CHECK(s != NULL);
    if (s) {
        kvs_status st = kvs_store_set_kivi(s, &kc, &err);
        CHECK_ERR(st, KVS_ERR_ARG, "KIVI storage needs an empty F16 store");
        kvs_store_free(s);
    }
    sc.type = KVS_F16;
    s = kvs_store_new(&sc);
    CHECK(s != NULL);
    if (s) {
        float row[32] = {0};
        int32_t p = 0;
        CHECKF(kvs_store_append(s, 0, 1, row, row, &p, &err) == KVS_OK, "%s", err.msg);
        kvs_status st = kvs_store_set_kivi(s, &kc, &err);
        CHECK_ERR(st, KVS_ERR_ARG, "KIVI storage needs an empty F16 store");
        kvs_store_free(s);
    }
}

int main(void)
{
    fill();
    config_checks();
    budget_over_context();
    layer_order();
    shift_with_shadow();
    similarity_positions();
    mpcache_share();
    nacl_proxy_span();
    pqcache();
    second_prompt();
    minicache_order();
    restored_view();
    kivi();
    return check_summary("test_errors_kv");
}
