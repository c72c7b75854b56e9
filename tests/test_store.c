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

int main(void)
{
    append_after_front_removal();
    return check_summary("test_store");
}
