/* The KV store and its attention against a direct double-precision computation. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "core/threadpool.h"
#include "kv/attention.h"
#include "kv/kv_store.h"

static unsigned rng = 12345;
static float frand(void)
{
    rng = rng * 1664525u + 1013904223u;
    return ((rng >> 8) / 16777216.0f) * 2.0f - 1.0f;
}

enum { LAYERS = 2, KV_HEADS = 2, HEADS = 4, HD = 16, T = 40 };

static float keys[LAYERS][T][KV_HEADS][HD], vals[LAYERS][T][KV_HEADS][HD];

/* Causal attention of query q (head h, position qpos) over the first T tokens, in double. */
static void reference(int layer, int h, const float *q, int qpos, double *out)
{
    int kvh = h / (HEADS / KV_HEADS);
    double s[T], m = -INFINITY, z = 0;
    for (int t = 0; t <= qpos; t++) {
        double d = 0;
        for (int i = 0; i < HD; i++)
            d += (double)q[i] * keys[layer][t][kvh][i];
        s[t] = d / sqrt((double)HD);
        if (s[t] > m)
            m = s[t];
    }
    for (int t = 0; t <= qpos; t++)
        z += s[t] = exp(s[t] - m);
    memset(out, 0, sizeof(double) * HD);
    for (int t = 0; t <= qpos; t++)
        for (int i = 0; i < HD; i++)
            out[i] += s[t] / z * vals[layer][t][kvh][i];
}

int main(void)
{
    for (int l = 0; l < LAYERS; l++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < KV_HEADS; h++)
                for (int i = 0; i < HD; i++) {
                    keys[l][t][h][i] = frand();
                    vals[l][t][h][i] = frand();
                }
    for (int threads = 1; threads <= 3; threads++) {
        kvs_store_config cfg = {LAYERS, KV_HEADS, HD, T, KVS_F32, 1};
        kvs_store *kv = kvs_store_new(&cfg);
        kvs_attn_scratch *sc = kvs_attn_scratch_new();
        kvs_pool *pool = kvs_pool_create(threads);
        kvs_error err = {0};
        /* Append in uneven chunks and attend each chunk causally, as prefill does. */
        int chunks[] = {1, 7, 16, 3, 13};
        int pos = 0;
        double worst = 0;
        for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
            int n = chunks[c];
            int32_t qpos[T];
            float q[T][HEADS][HD], out[T][HEADS][HD];
            for (int i = 0; i < n; i++) {
                qpos[i] = pos + i;
                for (int h = 0; h < HEADS; h++)
                    for (int d = 0; d < HD; d++)
                        q[i][h][d] = 2 * frand();
            }
            for (int l = 0; l < LAYERS; l++) {
                CHECK(kvs_store_append(kv, l, n, &keys[l][pos][0][0], &vals[l][pos][0][0], qpos,
                                    &err) == KVS_OK);
                kvs_attn_args a = {.store = kv, .layer = l, .n_heads = HEADS, .n = n,
                                   .q = &q[0][0][0], .qpos = qpos, .out = &out[0][0][0]};
                CHECK(kvs_attention(pool, sc, &a, &err) == KVS_OK);
                for (int i = 0; i < n; i++)
                    for (int h = 0; h < HEADS; h++) {
                        double ref[HD];
                        reference(l, h, q[i][h], qpos[i], ref);
                        for (int d = 0; d < HD; d++) {
                            double e = fabs(ref[d] - out[i][h][d]);
                            if (e > worst)
                                worst = e;
                        }
                    }
            }
            pos += n;
        }
        CHECKF(worst < 1e-5, "threads %d: max error %g", threads, worst);
        CHECK(kvs_store_count(kv, 1, 1) == T);
        CHECK(kvs_store_bytes(kv) == (size_t)LAYERS * KV_HEADS * T * (2 * HD * 4 + 4 + 4));
        /* The context is a hard limit. */
        int32_t p = T;
        CHECK(kvs_store_append(kv, 0, 1, &keys[0][0][0][0], &vals[0][0][0][0], &p, &err) ==
              KVS_ERR_ARG);
        CHECK(strstr(err.msg, "KV cache full") != NULL);
        kvs_store_clear(kv);
        CHECK(kvs_store_count(kv, 0, 0) == 0 && kvs_store_bytes(kv) == 0);
        kvs_attn_scratch_free(sc);
        kvs_pool_destroy(pool);
        kvs_store_free(kv);
    }
    return check_summary("kv");
}
