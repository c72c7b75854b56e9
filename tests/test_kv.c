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

enum { LAYERS = 2, KV_HEADS = 2, HEADS = 4, HD = 16, T = 340 };

static float keys[LAYERS][T][KV_HEADS][HD], vals[LAYERS][T][KV_HEADS][HD];

/* Causal attention of query q (head h, position qpos) over the first T tokens, in double; the
 * probabilities added into colsum[t] when colsum is not NULL. */
static void reference(int layer, int h, const float *q, int qpos, double *out, double *colsum)
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
    for (int t = 0; t <= qpos; t++) {
        for (int i = 0; i < HD; i++)
            out[i] += s[t] / z * vals[layer][t][kvh][i];
        if (colsum)
            colsum[t] += s[t] / z;
    }
}

/* Random appends, keeps and removals against a plain array model of one head. */
static void store_ops(kvs_dtype type)
{
    enum { CAP = 400, D = 4 };
    kvs_store_config cfg = {1, 1, D, CAP, type, 2};
    kvs_store *s = kvs_store_new(&cfg);
    int model_pos[CAP], n = 0, next = 0, ok = 1;
    kvs_error err;
    for (int step = 0; step < 3000 && ok; step++) {
        unsigned r = (rng = rng * 1664525u + 1013904223u) >> 8;
        if (r % 3 == 0 || n < 8) { /* append 1..6 tokens */
            int k = 1 + (int)(r % 6);
            if (n + k > CAP)
                continue;
            float kv[6 * D];
            int32_t pos[6];
            for (int i = 0; i < k; i++) {
                pos[i] = next + i;
                for (int d = 0; d < D; d++)
                    kv[i * D + d] = (float)((next + i) % 1024) + 0.25f * d;
                model_pos[n + i] = next + i;
            }
            CHECK(kvs_store_append(s, 0, k, kv, kv, pos, &err) == KVS_OK);
            for (int i = 0; i < k; i++)
                for (int c = 0; c < 2; c++)
                    kvs_store_meta(s, 0, 0, c)[n + i] = (float)(next + i) * (c + 1);
            n += k;
            next += k + (int)(r % 2);
        } else if (r % 3 == 1) { /* remove one slot */
            int victim = (int)((r >> 4) % (unsigned)n);
            kvs_store_remove(s, 0, 0, victim);
            memmove(model_pos + victim, model_pos + victim + 1, sizeof(int) * (n - victim - 1));
            n--;
        } else { /* keep: a window (one gap) or every other slot */
            int keep[CAP], k = 0;
            if (r & 16) {
                int a = 1 + (int)((r >> 5) % 4), b = a + 1 + (int)((r >> 7) % (unsigned)(n / 2));
                for (int i = 0; i < n; i++)
                    if (i < a || i >= b)
                        keep[k++] = i;
            } else {
                for (int i = 0; i < n; i++)
                    if (i % 2 == 0 || i == n - 1)
                        keep[k++] = i;
            }
            kvs_store_keep(s, 0, 0, keep, k);
            for (int i = 0; i < k; i++)
                model_pos[i] = model_pos[keep[i]];
            n = k;
        }
        ok &= kvs_store_count(s, 0, 0) == n;
        const int32_t *pos = kvs_store_pos(s, 0, 0);
        for (int i = 0; i < n && ok; i++) {
            float key[D], val[D];
            kvs_store_key_f32(s, 0, 0, i, key);
            kvs_store_value_f32(s, 0, 0, i, val);
            ok &= pos[i] == model_pos[i] && key[0] == (float)(pos[i] % 1024) &&
                  val[D - 1] == key[D - 1] &&
                  kvs_store_meta(s, 0, 0, 1)[i] == 2.0f * (float)pos[i] &&
                  (i == 0 || pos[i] > pos[i - 1]);
        }
        CHECKF(ok, "store state diverged from the model at step %d", step);
        CHECK(kvs_store_bytes(s) == (size_t)n * kvs_store_slot_bytes(s));
    }
    kvs_store_free(s);
}

int main(void)
{
    store_ops(KVS_F32);
    store_ops(KVS_F16);
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
        /* Append in uneven chunks and attend each chunk causally, as prefill does; the last
         * is more than two of attention's chunks of 128 queries (whose products stop at the
         * slots the chunk sees), with column sums of every other query's probabilities. */
        int chunks[] = {1, 7, 16, 3, 13, 300};
        int pos = 0;
        double worst = 0, worst_sum = 0;
        for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
            int n = chunks[c];
            int32_t qpos[T];
            static float q[T][HEADS][HD], out[T][HEADS][HD], colsum[HEADS][T];
            static double colsum_ref[HEADS][T];
            uint8_t mask[T];
            for (int i = 0; i < n; i++)
                mask[i] = i % 2 == 0;
            for (int i = 0; i < n; i++) {
                qpos[i] = pos + i;
                for (int h = 0; h < HEADS; h++)
                    for (int d = 0; d < HD; d++)
                        q[i][h][d] = 2 * frand();
            }
            for (int l = 0; l < LAYERS; l++) {
                CHECK(kvs_store_append(kv, l, n, &keys[l][pos][0][0], &vals[l][pos][0][0], qpos,
                                    &err) == KVS_OK);
                const int sums = n > 128;
                memset(colsum, 0, sizeof colsum);
                memset(colsum_ref, 0, sizeof colsum_ref);
                kvs_attn_args a = {.store = kv, .layer = l, .n_heads = HEADS, .n = n,
                                   .q = &q[0][0][0], .qpos = qpos, .out = &out[0][0][0],
                                   .row_mask = sums ? mask : NULL, .colsum = sums ? &colsum[0][0] : NULL,
                                   .colsum_stride = T};
                CHECK(kvs_attention(pool, sc, &a, &err) == KVS_OK);
                for (int i = 0; i < n; i++)
                    for (int h = 0; h < HEADS; h++) {
                        double ref[HD];
                        reference(l, h, q[i][h], qpos[i], ref, sums && mask[i] ? colsum_ref[h] : NULL);
                        for (int d = 0; d < HD; d++) {
                            double e = fabs(ref[d] - out[i][h][d]);
                            if (e > worst)
                                worst = e;
                        }
                    }
                for (int h = 0; sums && h < HEADS; h++)
                    for (int t = 0; t < T; t++) {
                        double e = fabs(colsum_ref[h][t] - colsum[h][t]);
                        if (e > worst_sum)
                            worst_sum = e;
                    }
            }
            pos += n;
        }
        CHECKF(worst < 1e-5, "threads %d: max error %g", threads, worst);
        CHECKF(worst_sum < 1e-4, "threads %d: max column-sum error %g", threads, worst_sum);
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
