/* The slot store's own rules, through its API (tests/alloc_fail covers it under allocation
 * failures). */
#include <string.h>

#include "check.h"
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

int main(void)
{
    append_after_front_removal();
    kivi_growth_amortised();
    return check_summary("test_store");
}
