/* Error paths of the KV policies no other test reaches (issue 16): the --kv spec parser's
 * malformed items, a repeated or over-long path parameter and an over-long canonical text; the
 * product quantiser's argument checks; MPCache's math on bad arguments (an empty prompt, clause
 * by clause); and the slow tier's bad sizes, over-long path and unreservable size. Each
 * asserts the status and that the message names the spec, key or value at fault. */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "kv/policy.h"
#include "policies/mpcache_math.h"
#include "policies/pq.h"
#include "policies/pq_tier.h"
#include "policies/registry.h"

/* 1 if kvs_policy_parse refuses text with KVS_ERR_ARG and a message containing needle
 * (and needle2, unless NULL). */
static int refused(const char *text, const char *needle, const char *needle2)
{
    kvs_policy_spec s;
    kvs_error err = {0};
    kvs_status st = kvs_policy_parse(text, &s, &err);
    if (st != KVS_ERR_ARG || !strstr(err.msg, needle) || (needle2 && !strstr(err.msg, needle2))) {
        fprintf(stderr, "spec '%.80s...': status %d, message '%s' (want '%s'%s%s)\n", text, st,
                err.msg, needle, needle2 ? " and " : "", needle2 ? needle2 : "");
        return 0;
    }
    return 1;
}

static void spec_parser(void)
{
    /* An item without '=' is quoted as typed, not taken as a flag. */
    CHECK(refused("h2o:budget=0.5,sinks", "'sinks' is not key=value", "h2o:budget=0.5,sinks"));
    CHECK(refused("h2o:budget=0.5,,slots", "'slots' is not key=value", NULL));

    /* A percentage too long for the parser's buffer is refused as malformed, not cut. */
    {
        char pct[120];
        memset(pct, '1', sizeof pct);
        memcpy(pct, "h2o:budget=0.", 13);
        pct[sizeof pct - 2] = '%';
        pct[sizeof pct - 1] = 0;
        CHECK(refused(pct, "a percentage of the prompt must be a decimal number in (0, 100]",
                      "h2o:budget=0.111"));
    }

    /* pqcache's path parameter: given twice is refused like any other key. */
    CHECK(refused("pqcache:budget=0.5,tier=/tmp/a,tier=/tmp/b", "tier is given twice", NULL));

    /* A tier path that does not fit the spec's buffer is refused, not truncated (a truncated
     * path would create a different file). */
    char path[200], text[400];
    memset(path, 'p', sizeof path - 1);
    path[0] = '/';
    path[sizeof path - 1] = 0;
    snprintf(text, sizeof text, "pqcache:budget=0.5,tier=%s", path);
    {
        kvs_policy_spec s;
        char want[64];
        snprintf(want, sizeof want, "the tier path is longer than %zu bytes", sizeof s.path - 1);
        CHECK(refused(text, want, "pqcache:budget=0.5,tier=/ppp"));
    }
    /* The longest path that fits is accepted and kept whole. */
    {
        kvs_policy_spec s;
        kvs_error err = {0};
        path[sizeof s.path - 1] = 0;
        snprintf(text, sizeof text, "pqcache:budget=0.5,tier=%s", path);
        CHECKF(kvs_policy_parse(text, &s, &err) == KVS_OK && !strcmp(s.path, path), "%s",
               err.msg);
    }

    /* Every parameter at its longest plus a long tier path: the canonical text would not fit,
     * so the spec is refused rather than cut (the cut text would not parse back). */
    {
        kvs_policy_spec s;
        memset(path, 'q', sizeof path);
        path[0] = '/';
        path[150] = 0;
        snprintf(text, sizeof text,
                 "pqcache:budget=0.5,init=65535,local=1048575,k=1048575,m=255,bits=7,"
                 "iters=299,cache=16777215,kcache=65535,seed=9007199254740991,tier=%s", path);
        char want[80];
        snprintf(want, sizeof want, "the specification is longer than %zu bytes",
                 sizeof s.text - 2);
        CHECK(refused(text, want, "pqcache:budget=0.5,init=65535"));
    }
}

static void pq_args(void)
{
    float x[8] = {0}, cent[8];
    uint8_t codes[8];
    kvs_error err = {0};
    /* K-Means: n, d, k out of range each refused with all three in the message. */
    kvs_status st = kvs_pq_kmeans(x, 0, 2, 2, 2, 1, 0, 1, cent, codes, NULL, NULL, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "K-Means of 0 points of 2 floats into 2"),
           "%d %s", st, err.msg);
    st = kvs_pq_kmeans(x, 4, 2, 2, 257, 1, 0, 1, cent, codes, NULL, NULL, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "into 257 clusters"), "%d %s", st, err.msg);
    st = kvs_pq_kmeans(x, 4, 2, 2, 0, 1, 0, 1, cent, codes, NULL, NULL, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "into 0 clusters"), "%d %s", st, err.msg);
    st = kvs_pq_kmeans(x, 4, 2, 0, 2, 1, 0, 1, cent, codes, NULL, NULL, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "of 0 floats"), "%d %s", st, err.msg);

    /* Training: m must divide the dimension, bits in [1, 8]. */
    kvs_pq_cfg c = {.dim = 8, .m = 3, .bits = 2, .max_iters = 1};
    st = kvs_pq_train(&c, x, 1, 8, cent, codes, NULL, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "m=3, bits=2 for vectors of 8 floats"), "%d %s",
           st, err.msg);
    c.m = 2;
    c.bits = 9;
    st = kvs_pq_train(&c, x, 1, 8, cent, codes, NULL, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "bits=9"), "%d %s", st, err.msg);
    c.bits = 0;
    st = kvs_pq_train(&c, x, 1, 8, cent, codes, NULL, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "bits=0"), "%d %s", st, err.msg);
    c.bits = 2;
    c.m = 0;
    st = kvs_pq_train(&c, x, 1, 8, cent, codes, NULL, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "m=0"), "%d %s", st, err.msg);
}

static void mpcache_static(void)
{
    float q[4] = {0}, k[4] = {0};
    int keep[1], n_keep = -1;
    kvs_error err = {0};
    /* No prompt positions: nothing to keep is an argument error, not an empty success. */
    kvs_status st = kvs_mp_static_keep(q, 1, k, 0, 4, 0.5, 0.5, keep, &n_keep, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "bad arguments (P 0)"), "%d %s", st, err.msg);
    st = kvs_mp_static_keep(q, 1, k, 1, 4, 0.5, 0.5, NULL, &n_keep, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "bad arguments (P 1)"), "%d %s", st, err.msg);
    st = kvs_mp_static_keep(q, 1, k, 1, 4, 0.5, 0.5, keep, NULL, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "static keep"), "%d %s", st, err.msg);

    /* The other entry points' argument checks, one clause at a time: each refusal quotes the
     * counts it was given. */
    double score[4] = {0};
    int idx[4];
    static const struct {
        int n, k, null_score, null_idx;
    } topk[] = {{-1, 0, 0, 0}, {4, -1, 0, 0}, {4, 5, 0, 0}, {4, 1, 1, 0}, {4, 1, 0, 1}};
    for (size_t i = 0; i < sizeof topk / sizeof *topk; i++) {
        char want[64];
        snprintf(want, sizeof want, "mpcache top-k: bad arguments (n %d, k %d)", topk[i].n,
                 topk[i].k);
        st = kvs_mp_topk_asc(topk[i].null_score ? NULL : score, topk[i].n, topk[i].k,
                             topk[i].null_idx ? NULL : idx, &err);
        CHECKF(st == KVS_ERR_ARG && strstr(err.msg, want), "case %zu: %d %s", i, st, err.msg);
    }
    static const struct {
        int G, w, P, d, null_q;
    } ss[] = {{1, 1, 1, 4, 1}, {0, 1, 1, 4, 0}, {1, 1, 1, 0, 0}, {1, 1, 0, 4, 0},
              {1, 0, 1, 4, 0}, {1, 2, 1, 4, 0}};
    for (size_t i = 0; i < sizeof ss / sizeof *ss; i++) {
        char want[80];
        snprintf(want, sizeof want, "mpcache static scores: bad arguments (G %d, w %d, P %d, "
                 "d %d)", ss[i].G, ss[i].w, ss[i].P, ss[i].d);
        st = kvs_mp_static_scores(ss[i].null_q ? NULL : q, ss[i].G, ss[i].w, k, ss[i].P, ss[i].d,
                                  score, &err);
        CHECKF(st == KVS_ERR_ARG && strstr(err.msg, want), "case %zu: %d %s", i, st, err.msg);
    }
    static const struct {
        int n, s1, s2;
        double rho1, eta;
        const char *want;
    } sel[] = {{0, 4, 2, 0.5, 0.5, "(n 0, s1 4, s2 2, rho1 0.5, eta 0.5)"},
               {8, 4, 0, 0.5, 0.5, "(n 8, s1 4, s2 0,"},
               {8, 2, 4, 0.5, 0.5, "(n 8, s1 2, s2 4,"},
               {8, 6, 4, 0.5, 0.5, "(n 8, s1 6, s2 4,"},
               {8, 4, 2, 0, 0.5, "rho1 0, eta 0.5)"},
               {8, 4, 2, 1.5, 0.5, "rho1 1.5, eta 0.5)"},
               {8, 4, 2, 0.5, 0, "rho1 0.5, eta 0)"},
               {8, 4, 2, 0.5, 2, "rho1 0.5, eta 2)"}};
    double sc1[8] = {0}, sc2[8] = {0};
    int fine[8], n_fine, slots[8], n_slots;
    for (size_t i = 0; i < sizeof sel / sizeof *sel; i++) {
        st = kvs_mp_select(sc1, sc2, sel[i].n, sel[i].s1, sel[i].s2, sel[i].rho1, sel[i].eta, 0,
                           fine, &n_fine, slots, &n_slots, &err);
        CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "mpcache select: bad arguments ") &&
               strstr(err.msg, sel[i].want), "case %zu: %d %s", i, st, err.msg);
    }
    st = kvs_mp_select(NULL, sc2, 8, 4, 2, 0.5, 0.5, 0, fine, &n_fine, slots, &n_slots, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "mpcache select: bad arguments"), "%d %s", st,
           err.msg);
}

static void tier(void)
{
    kvs_tier *t = (kvs_tier *)1;
    kvs_error err = {0};
    /* A path longer than PATH_MAX-ish buffer: refused before touching the file system. */
    static char path[5000];
    memset(path, 'a', sizeof path - 1);
    path[0] = '/';
    kvs_status st = kvs_tier_open(NULL, 0, 4096, &t, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "slow tier of 0 regions of 4096 bytes"), "%d %s",
           st, err.msg);
    st = kvs_tier_open(NULL, 2, 0, &t, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "slow tier of 2 regions of 0 bytes"), "%d %s", st,
           err.msg);
    st = kvs_tier_open(path, 1, 4096, &t, &err);
    CHECKF(st == KVS_ERR_ARG && t == NULL && strstr(err.msg, "the path is too long"), "%d %s", st,
           err.msg);

    /* A memory tier larger than the address space: mmap fails even with MAP_NORESERVE, and
     * the message gives the size and the way out (tier=PATH). */
    t = (kvs_tier *)1;
    st = kvs_tier_open(NULL, 1 << 20, (size_t)1 << 42, &t, &err);
    CHECKF(st == KVS_ERR_NOMEM && t == NULL && strstr(err.msg, "cannot reserve") &&
           strstr(err.msg, "MiB") && strstr(err.msg, "tier=PATH"), "%d %s", st, err.msg);
    kvs_tier_close(t);
}

int main(void)
{
    spec_parser();
    pq_args();
    mpcache_static();
    tier();
    return check_summary("test_errors_policies");
}
