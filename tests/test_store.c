/* The slot store's own rules, through its API (tests/alloc_fail covers it under allocation
 * failures). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "check_store.h"
#include "kv/attention.h"
#include "kv/kv_store.h"

/* Appends one token at position p to every head (a key and value of p). */
static kvs_status add(kvs_store *s, int32_t p, kvs_error *err)
{
    float kv[2 * 4];
    for (int i = 0; i < 2 * 4; i++)
        kv[i] = (float)p;
    return kvs_store_append(s, 0, 1, kv, kv, &p, err);
}

/* An append must come after the head's last position also once slots were removed at the front
 * (the live slots then start past row 0 of the arrays). */
static void append_after_front_removal(void)
{
    kvs_store_config cfg = {1, 2, 4, 64, KVS_F32, 0};
    kvs_store *s = kvs_store_new(&cfg);
    kvs_error err = {0};
    for (int32_t p = 0; p < 5; p++)
        CHECK(add(s, p, &err) == KVS_OK);
    for (int h = 0; h < 2; h++)
        kvs_store_remove(s, 0, h, 0); /* front: the live rows now start at row 1 */
    CHECK(kvs_store_count(s, 0, 0) == 4 && kvs_store_pos(s, 0, 0)[0] == 1);
    kvs_status st = add(s, 4, &err); /* the last position again */
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "position 4 is not after 4"),
           "status %d, '%s'", st, err.msg);
    CHECK(kvs_store_count(s, 0, 0) == 4 && kvs_store_count(s, 0, 1) == 4);
    CHECK(add(s, 5, &err) == KVS_OK && kvs_store_pos(s, 0, 1)[4] == 5);
    kvs_store_free(s);
}

/* Growing a KIVI store token by token reallocates amortised (a handful of times per doubling,
 * never every token), what it allocates stays within twice what it holds (plus the arrays'
 * minimum size), and an F16 store's allocation likewise covers its live slots. */
static void kivi_growth_amortised(void)
{
    kvs_store_config cfg = {1, 2, 64, 8192, KVS_F16, 0};
    kvs_store *s = kvs_store_new(&cfg), *f = kvs_store_new(&cfg);
    kvs_kivi_cfg k = {4, 4, 32, 128};
    kvs_error err = {0};
    CHECK(s && f && kvs_store_set_kivi(s, &k, &err) == KVS_OK);
    int changes = 0, f16_changes = 0, over = 0;
    size_t last = 0, f16_last = 0;
    float kv[2 * 64];
    for (int32_t p = 0; p < 6000; p++) {
        for (int i = 0; i < 2 * 64; i++)
            kv[i] = (float)((p * 7 + i * 13) % 29) / 7.0f;
        CHECK(kvs_store_append(s, 0, 1, kv, kv, &p, &err) == KVS_OK);
        CHECK(kvs_store_append(f, 0, 1, kv, kv, &p, &err) == KVS_OK);
        kvs_store_kivi_flush(s, 0);
        const size_t a = kvs_store_alloc_bytes(s), b = kvs_store_bytes(s);
        changes += a != last;
        last = a;
        f16_changes += kvs_store_alloc_bytes(f) != f16_last;
        f16_last = kvs_store_alloc_bytes(f);
        /* slack of at most half, the residuals' room for R rows, the arrays' minimum */
        over += a < b || a > b + b / 2 + 2 * (2 * 129 * 64 * 2 * 3 / 2 + 6 * 4096 + 64 * 6);
    }
    /* (the positions grow as an F16 store's rows do, by a sixteenth; the KIVI arrays double) */
    CHECKF(changes <= f16_changes + 60, "%d changes of the allocation over 6000 appends "
           "(an F16 store's: %d)", changes, f16_changes);
    CHECKF(over == 0, "%d steps with the allocation outside [held, 1.5 held + room]", over);
    CHECKF(kvs_store_alloc_bytes(f) >= kvs_store_bytes(f) &&
               kvs_store_alloc_bytes(s) < kvs_store_bytes(f) / 2,
           "f16 %zu held %zu allocated; kivi4 %zu allocated", kvs_store_bytes(f),
           kvs_store_alloc_bytes(f), kvs_store_alloc_bytes(s));
    kvs_store_free(s);
    kvs_store_free(f);
    /* Key codes are whole bytes per token: head_dim * kbits a multiple of 8. */
    kvs_store_config c4 = {1, 1, 4, 64, KVS_F16, 0};
    kvs_store *t = kvs_store_new(&c4);
    kvs_kivi_cfg k1 = {1, 4, 32, 128};
    kvs_status st = kvs_store_set_kivi(t, &k1, &err);
    CHECKF(st != KVS_OK && strstr(err.msg, "kbits=1") && strstr(err.msg, "head_dim is 4"),
           "'%s'", err.msg);
    kvs_store_free(t);
}

/* Fills heads (layer 0) with n tokens of content seeded by seed, from position 0, removing
 * every 7th slot of head 1 as it goes (unordered) so that emptying meets a disordered head. */
static void fill(kvs_store *s, int n, int seed, kvs_error *err)
{
    const int hd = kvs_store_cfg(s)->head_dim;
    float kv[2 * 2 * 64];
    for (int32_t p = 0; p < n; p++) {
        for (int i = 0; i < 2 * 2 * hd; i++)
            kv[i] = (float)((p * 7 + i * 13 + seed) % 29) / 7.0f - 2.0f;
        CHECK(kvs_store_append(s, 0, 1, kv, kv + 2 * hd, &p, err) == KVS_OK);
        if (p % 7 == 6 && !kvs_store_kivi(s))
            kvs_store_remove_unordered(s, 0, 1, 2);
    }
}

/* Whether two stores hold the same slots in layer 0's two heads: positions, order, and every
 * key and value as read back. */
static int same_slots(const kvs_store *s, const kvs_store *f)
{
    int same = 1;
    for (int h = 0; h < 2; h++) {
        const int n = kvs_store_count(f, 0, h);
        same &= kvs_store_count(s, 0, h) == n &&
                memcmp(kvs_store_pos(s, 0, h), kvs_store_pos(f, 0, h), sizeof(int32_t) * (size_t)n) == 0 &&
                kvs_store_ordered(s, 0, h) == kvs_store_ordered(f, 0, h);
        for (int i = 0; i < n; i++) {
            float a[64], b[64], c[64], d[64];
            kvs_store_key_f32(s, 0, h, i, a);
            kvs_store_key_f32(f, 0, h, i, b);
            kvs_store_value_f32(s, 0, h, i, c);
            kvs_store_value_f32(f, 0, h, i, d);
            same &= memcmp(a, b, sizeof a) == 0 && memcmp(c, d, sizeof c) == 0;
        }
    }
    return same;
}

/* kvs_store_prefetch_append is a hint: whatever state the heads are in (empty, full to their
 * capacity, live slots past row 0 after removals at the front, KIVI), a store given it before
 * every append holds what one without it does, in an allocation of the same size. */
static void prefetch_changes_nothing(void)
{
    for (int kind = 0; kind < 3; kind++) { /* F32, F16, KIVI */
        kvs_store_config cfg = {1, 2, 64, 4096, kind == 0 ? KVS_F32 : KVS_F16, 1};
        kvs_store *s = kvs_store_new(&cfg), *f = kvs_store_new(&cfg);
        kvs_kivi_cfg k = {4, 2, 32, 64};
        kvs_error err = {0};
        CHECK(s && f);
        if (kind == 2)
            CHECK(kvs_store_set_kivi(s, &k, &err) == KVS_OK && kvs_store_set_kivi(f, &k, &err) == KVS_OK);
        float kv[2 * 2 * 64];
        for (int32_t p = 0; p < 300; p++) {
            for (int i = 0; i < 2 * 2 * 64; i++)
                kv[i] = (float)((p * 5 + i * 11) % 31) / 7.0f - 2.0f;
            kvs_store_prefetch_append(s, 0);
            CHECK(kvs_store_append(s, 0, 1, kv, kv + 2 * 64, &p, &err) == KVS_OK);
            CHECK(kvs_store_append(f, 0, 1, kv, kv + 2 * 64, &p, &err) == KVS_OK);
            if (p % 5 == 4 && kind != 2) {
                kvs_store_remove(s, 0, 0, 0);
                kvs_store_remove(f, 0, 0, 0);
            }
        }
        kvs_store_prefetch_append(s, 0);
        CHECKF(same_slots(s, f) && kvs_store_bytes(s) == kvs_store_bytes(f) &&
                   kvs_store_alloc_bytes(s) == kvs_store_alloc_bytes(f),
               "kind %d: the store given the hint differs (%zu / %zu bytes held, %zu / %zu "
               "allocated)", kind, kvs_store_bytes(s), kvs_store_bytes(f),
               kvs_store_alloc_bytes(s), kvs_store_alloc_bytes(f));
        kvs_store_free(s);
        kvs_store_free(f);
    }
}

/* Emptying drops every slot and keeps the memory; what is stored next reads back exactly as
 * in a fresh store (F16 rows, and a KIVI store's codes, groups and residual). */
static void empty_keeps_memory(void)
{
    for (int kivi = 0; kivi < 2; kivi++) {
        kvs_store_config cfg = {1, 2, 64, 4096, KVS_F16, 1};
        kvs_store *s = kvs_store_new(&cfg), *f = kvs_store_new(&cfg);
        kvs_kivi_cfg k = {4, 2, 32, 64};
        kvs_error err = {0};
        CHECK(s && f);
        if (kivi)
            CHECK(kvs_store_set_kivi(s, &k, &err) == KVS_OK && kvs_store_set_kivi(f, &k, &err) == KVS_OK);
        fill(s, 500, 1, &err);
        const size_t alloc = kvs_store_alloc_bytes(s);
        kvs_store_empty(s);
        CHECKF(kvs_store_count(s, 0, 0) == 0 && kvs_store_count(s, 0, 1) == 0 &&
                   kvs_store_bytes(s) == 0 && kvs_store_alloc_bytes(s) == alloc,
               "kivi %d: %d and %d slots, %zu bytes held, %zu allocated (was %zu)", kivi,
               kvs_store_count(s, 0, 0), kvs_store_count(s, 0, 1), kvs_store_bytes(s),
               kvs_store_alloc_bytes(s), alloc);
        fill(s, 300, 2, &err);
        fill(f, 300, 2, &err);
        CHECK(kvs_store_alloc_bytes(s) == alloc); /* 300 < 500 slots: no growth */
        CHECK(kvs_store_bytes(s) == kvs_store_bytes(f));
        const int same = same_slots(s, f);
        CHECKF(same, "kivi %d: the store emptied and refilled differs from a fresh one", kivi);
        kvs_store_free(s);
        kvs_store_free(f);
    }
}

/* Positions of head 0 equal want[0..n). */
static int positions_are(const kvs_store *s, const int32_t *want, int n)
{
    return kvs_store_count(s, 0, 0) == n &&
           (n == 0 || !memcmp(kvs_store_pos(s, 0, 0), want, sizeof(int32_t) * (size_t)n));
}

/* kvs_store_remove_unordered: the last slot's row (key, value, position, metadata) moves into
 * the victim's slot; the head is then out of order, appends still follow the newest position
 * held (also after the newest itself was removed), a keep that leaves them in order says so, a
 * shift must keep their order, and a KIVI store removes in order. */
static void remove_unordered(void)
{
    kvs_store_config cfg = {1, 1, 4, 64, KVS_F32, 1};
    kvs_store *s = kvs_store_new(&cfg);
    kvs_error err = {0};
    for (int32_t p = 0; p < 10; p++) {
        CHECK(add(s, p, &err) == KVS_OK);
        kvs_store_meta(s, 0, 0, 0)[p] = 10.0f * (float)p;
    }
    CHECK(kvs_store_ordered(s, 0, 0));
    kvs_store_remove_unordered(s, 0, 0, 3);
    const int32_t a[] = {0, 1, 2, 9, 4, 5, 6, 7, 8};
    CHECK(positions_are(s, a, 9) && !kvs_store_ordered(s, 0, 0));
    float row[4];
    kvs_store_key_f32(s, 0, 0, 3, row);
    CHECK(row[0] == 9.0f && row[3] == 9.0f);
    kvs_store_value_f32(s, 0, 0, 3, row);
    CHECK(row[1] == 9.0f && kvs_store_meta(s, 0, 0, 0)[3] == 90.0f);
    kvs_store_key_f32(s, 0, 0, 4, row);
    CHECK(row[0] == 4.0f && kvs_store_meta(s, 0, 0, 0)[4] == 40.0f);
    kvs_status st = add(s, 9, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "position 9 is not after 9"), "'%s'", err.msg);
    CHECK(add(s, 10, &err) == KVS_OK && kvs_store_pos(s, 0, 0)[9] == 10);
    kvs_store_remove_unordered(s, 0, 0, 3); /* position 9: 10 moves in */
    kvs_store_remove_unordered(s, 0, 0, 3); /* position 10, the newest: 8 moves in */
    const int32_t b[] = {0, 1, 2, 8, 4, 5, 6, 7};
    CHECK(positions_are(s, b, 8) && !kvs_store_ordered(s, 0, 0));
    st = add(s, 8, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "position 8 is not after 8"), "'%s'", err.msg);
    CHECK(add(s, 9, &err) == KVS_OK); /* 0 1 2 8 4 5 6 7 9 */
    /* Order-keeping changes find out when the head is back in order. */
    const int keep[] = {0, 1, 2, 4, 5, 6, 7, 8};
    kvs_store_keep(s, 0, 0, keep, 8);
    const int32_t c[] = {0, 1, 2, 4, 5, 6, 7, 9};
    CHECK(positions_are(s, c, 8) && kvs_store_ordered(s, 0, 0));
    kvs_store_remove_unordered(s, 0, 0, 6); /* the newest moves to the end: still in order */
    const int32_t d[] = {0, 1, 2, 4, 5, 6, 9};
    CHECK(positions_are(s, d, 7) && kvs_store_ordered(s, 0, 0));
    kvs_store_remove_unordered(s, 0, 0, 0); /* 0 1 2 4 5 6 9 -> 9 1 2 4 5 6 */
    CHECK(!kvs_store_ordered(s, 0, 0) && check_store_positions(s, 0, 0) < 0);
    kvs_store_remove(s, 0, 0, 0);           /* in order again: 1 2 4 5 6 */
    const int32_t e[] = {1, 2, 4, 5, 6};
    CHECK(positions_are(s, e, 5) && kvs_store_ordered(s, 0, 0));
    /* A shift of a head out of order must keep the order of its positions, not of its slots. */
    kvs_store_remove_unordered(s, 0, 0, 1); /* 1 6 4 5 */
    const kvs_rope_cfg rope = {4, 10000.0f, 0};
    const int32_t keeps[] = {0, 3, 1, 2}, breaks[] = {0, 1, 2, 3};
    st = kvs_store_shift(s, 0, 0, breaks, &rope, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "is not after"), "'%s'", err.msg);
    const int32_t f[] = {1, 6, 4, 5};
    CHECK(positions_are(s, f, 4));
    CHECK(kvs_store_shift(s, 0, 0, keeps, &rope, &err) == KVS_OK && positions_are(s, keeps, 4));
    st = add(s, 3, &err); /* the newest position held is now 3 */
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "not after 3"), "'%s'", err.msg);
    kvs_store_free(s);

    /* KIVI: codes are grouped in position order, so the removal keeps it. */
    kvs_store_config k16 = {1, 1, 8, 64, KVS_F16, 0};
    kvs_store *q = kvs_store_new(&k16);
    kvs_kivi_cfg kc = {4, 4, 4, 4};
    CHECK(q && kvs_store_set_kivi(q, &kc, &err) == KVS_OK);
    float kv[8];
    for (int32_t p = 0; p < 12; p++) {
        for (int i = 0; i < 8; i++)
            kv[i] = (float)(p + i) / 8.0f;
        CHECK(kvs_store_append(q, 0, 1, kv, kv, &p, &err) == KVS_OK);
        kvs_store_kivi_flush(q, 0);
    }
    kvs_store_remove_unordered(q, 0, 0, 2);
    const int32_t g[] = {0, 1, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    CHECK(positions_are(q, g, 11) && kvs_store_ordered(q, 0, 0));
    kvs_store_free(q);
}

/* Attention over a head out of position order, with a batch appended after it (causal) and a
 * single query after that, equals a plain softmax over the visible slots in double precision:
 * the slots a query may not see stay a suffix. */
static void attention_out_of_order(void)
{
    enum { HD = 8, HEADS = 2, N0 = 12, B = 3 };
    kvs_store_config cfg = {1, 1, HD, 64, KVS_F32, 0};
    kvs_store *s = kvs_store_new(&cfg);
    kvs_pool *pool = kvs_pool_create(2);
    kvs_attn_scratch *sc = kvs_attn_scratch_new();
    kvs_error err = {0};
    CHECK(s && pool && sc);
    unsigned r = 12345;
    float k[N0 + B + 1][HD], v[N0 + B + 1][HD];
    for (int t = 0; t < N0 + B + 1; t++)
        for (int d = 0; d < HD; d++) {
            r = r * 1103515245u + 12345u;
            k[t][d] = (float)((r >> 16) % 2001) / 1000.0f - 1.0f;
            r = r * 1103515245u + 12345u;
            v[t][d] = (float)((r >> 16) % 2001) / 1000.0f - 1.0f;
        }
    for (int32_t p = 0; p < N0; p++)
        CHECK(kvs_store_append(s, 0, 1, k[p], v[p], &p, &err) == KVS_OK);
    kvs_store_remove_unordered(s, 0, 0, 2);
    kvs_store_remove_unordered(s, 0, 0, 5);
    CHECK(!kvs_store_ordered(s, 0, 0));
    for (int round = 0; round < 2; round++) {
        const int n = round == 0 ? B : 1, first = round == 0 ? N0 : N0 + B;
        int32_t qpos[B];
        float q[B][HEADS][HD], out[B][HEADS][HD];
        for (int i = 0; i < n; i++) {
            qpos[i] = first + i;
            for (int h = 0; h < HEADS; h++)
                for (int d = 0; d < HD; d++)
                    q[i][h][d] = (float)((i + 1) * (h + 2) * (d + 3) % 7) / 3.0f - 1.0f;
        }
        CHECK(kvs_store_append(s, 0, n, k[first], v[first], qpos, &err) == KVS_OK);
        kvs_attn_args a = {.store = s, .layer = 0, .n_heads = HEADS, .n = n, .q = &q[0][0][0],
                           .qpos = qpos, .out = &out[0][0][0]};
        CHECK(kvs_attention(pool, sc, &a, &err) == KVS_OK);
        const int count = kvs_store_count(s, 0, 0);
        const int32_t *pos = kvs_store_pos(s, 0, 0);
        double worst = 0;
        for (int i = 0; i < n; i++)
            for (int h = 0; h < HEADS; h++) {
                double w[N0 + B + 1], z = 0, m = -INFINITY;
                for (int j = 0; j < count; j++) {
                    w[j] = -INFINITY;
                    if (pos[j] > qpos[i])
                        continue;
                    double dot = 0;
                    for (int d = 0; d < HD; d++)
                        dot += (double)q[i][h][d] * k[pos[j]][d];
                    w[j] = dot / sqrt((double)HD);
                    m = w[j] > m ? w[j] : m;
                }
                for (int j = 0; j < count; j++)
                    z += w[j] == -INFINITY ? 0 : exp(w[j] - m);
                for (int d = 0; d < HD; d++) {
                    double o = 0;
                    for (int j = 0; j < count; j++)
                        if (w[j] != -INFINITY)
                            o += exp(w[j] - m) / z * v[pos[j]][d];
                    worst = fmax(worst, fabs(o - out[i][h][d]));
                }
            }
        CHECKF(worst < 1e-5, "round %d: attention differs from the reference by %g", round, worst);
    }
    kvs_attn_scratch_free(sc);
    kvs_pool_destroy(pool);
    kvs_store_free(s);
}

int main(void)
{
    append_after_front_removal();
    remove_unordered();
    attention_out_of_order();
    kivi_growth_amortised();
    empty_keeps_memory();
    prefetch_changes_nothing();
    return check_summary("test_store");
}
