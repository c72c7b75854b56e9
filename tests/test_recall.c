/* eval --task recall's input parsing (src/eval/recall.h) without a model: .answer lines, the
 * prompt checks (question token, vocabulary, answer positions) and the answer margin. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "eval/recall.h"

#define HAS(msg, part) CHECKF(strstr((msg), (part)) != NULL, "'%s' lacks '%s'", (msg), (part))

static void test_answers_ok(void)
{
    kvs_recall_answer *a = NULL;
    int n = 0;
    kvs_error err = {0};
    CHECKF(kvs_recall_parse_answers("255 500\n", "x.answer", &a, &n, &err) == KVS_OK, "%s",
           err.msg);
    CHECK(n == 1 && a && a[0].pos == 255 && a[0].id == 500);
    free(a);
    /* several lines, blank lines, CRLF, tabs, no final newline */
    CHECKF(kvs_recall_parse_answers("1013 437\r\n\n  1016\t465 \n1019 502", "m.answer", &a, &n,
                                    &err) == KVS_OK, "%s", err.msg);
    CHECK(n == 3 && a[0].pos == 1013 && a[1].id == 465 && a[2].pos == 1019 && a[2].id == 502);
    free(a);
}

static void answers_bad(const char *text, const char *want)
{
    kvs_recall_answer *a = (kvs_recall_answer *)&a; /* must be reset to NULL */
    int n = -1;
    kvs_error err = {0};
    CHECKF(kvs_recall_parse_answers(text, "d/007.answer", &a, &n, &err) == KVS_ERR_FORMAT,
           "'%s' accepted", text);
    CHECK(a == NULL && n == 0);
    HAS(err.msg, want);
}

static void test_answers_bad(void)
{
    answers_bad("255\n", "d/007.answer:1: expected 'POS ID'");
    answers_bad("1 2\n255 500 7\n", "d/007.answer:2: expected 'POS ID'");
    answers_bad("1 2\n\n-3 4\n", "d/007.answer:3:");
    answers_bad("1 V042\n", "got '1 V042'");
    answers_bad("0x10 5\n", "d/007.answer:1:");
    answers_bad("1.5 5\n", "d/007.answer:1:");
    answers_bad("99999999999 5\n", "d/007.answer:1:");
    answers_bad("", "d/007.answer: no answer line");
    answers_bad("\n \n", "d/007.answer: no answer line");
}

/* A prompt of the recall format: <bos> K V F Q K, answer V after position 5. */
static kvs_recall_prompt prompt(const int32_t *ids, int n, int pos, int32_t id)
{
    kvs_recall_prompt p = {.n_tokens = n, .n_answers = 1};
    p.tokens = malloc(sizeof *p.tokens * (size_t)n);
    memcpy(p.tokens, ids, sizeof *ids * (size_t)n);
    p.answers = malloc(sizeof *p.answers);
    p.answers[0] = (kvs_recall_answer){pos, id};
    return p;
}

static void check_bad(const int32_t *ids, int n, int pos, int32_t id, int n_ctx,
                      const char *want)
{
    kvs_recall_prompt p = prompt(ids, n, pos, id);
    kvs_error err = {0};
    CHECKF(kvs_recall_prompt_check(&p, 512, n_ctx, 3, "s/001.tokens", "s/001.answer", &err) ==
           KVS_ERR_FORMAT, "accepted (want %s)", want);
    HAS(err.msg, want);
    kvs_recall_prompt_free(&p);
}

static void test_prompt_check(void)
{
    const int32_t ok[] = {1, 140, 400, 7, 3, 140};
    kvs_recall_prompt p = prompt(ok, 6, 5, 400);
    kvs_error err = {0};
    CHECKF(kvs_recall_prompt_check(&p, 512, 4096, 3, "s/001.tokens", "s/001.answer", &err) ==
           KVS_OK, "%s", err.msg);
    CHECK(p.context == 4);
    kvs_recall_prompt_free(&p);
    CHECK(p.tokens == NULL && p.answers == NULL);

    const int32_t no_q[] = {1, 140, 400, 7, 9, 140};
    check_bad(no_q, 6, 5, 400, 4096, "s/001.tokens: no question token Q (id 3)");
    const int32_t q_first[] = {3, 140, 400};
    check_bad(q_first, 3, 2, 400, 4096, "s/001.tokens: the first token is Q");
    const int32_t big[] = {1, 140, 512, 7, 3, 140};
    check_bad(big, 6, 5, 400, 4096, "s/001.tokens: token id 512 (token 3 of the file) is "
                                    "outside the model's vocabulary [0, 512)");
    check_bad(ok, 6, 3, 400, 4096, "s/001.answer: answer 1: position 3 is outside the decoded "
                                   "part [4, 5]");
    check_bad(ok, 6, 6, 400, 4096, "position 6 is outside");
    check_bad(ok, 6, 5, 600, 4096, "s/001.answer: answer 1: token id 600 is outside");
    check_bad(ok, 6, 5, 400, 5, "s/001.tokens: 6 tokens exceed the model's context of 5");
}

static void test_margin(void)
{
    float l[5] = {0, 24, -24, 0.5f, 0};
    CHECK(fabs(kvs_recall_margin(l, 5, 1) - 23.5) < 1e-9);
    CHECK(fabs(kvs_recall_margin(l, 5, 3) + 23.5) < 1e-9); /* wrong: negative */
    float tie[3] = {2, 2, 1};
    CHECK(kvs_recall_margin(tie, 3, 1) == 0);
}

static void test_manifest(void)
{
    const char *tsv = "name\ttokens\tdistance\tdepth\r\n"
                      "000\t256\t118\t0.5378\r\n"
                      "\n"
                      "d0.10-003\t4096\t3700\t0.1\n";
    double depth;
    int dist;
    kvs_error err = {0};
    CHECKF(kvs_recall_manifest_find(tsv, "m.tsv", "000", &depth, &dist, &err) == KVS_OK, "%s",
           err.msg);
    CHECK(fabs(depth - 0.5378) < 1e-12 && dist == 118);
    CHECK(kvs_recall_manifest_find(tsv, "m.tsv", "d0.10-003", &depth, &dist, &err) == KVS_OK);
    CHECK(fabs(depth - 0.1) < 1e-12 && dist == 3700);
    CHECK(kvs_recall_manifest_find(tsv, "m.tsv", "001", &depth, &dist, &err) == KVS_OK);
    CHECK(depth == -1 && dist == -1);

    CHECK(kvs_recall_manifest_find("name\tdepth\n000\t0.5\n", "m.tsv", "000", &depth, &dist,
                                   &err) == KVS_ERR_FORMAT);
    HAS(err.msg, "m.tsv:1: no 'distance' column");
    CHECK(kvs_recall_manifest_find("name\tdepth\tdistance\n000\t0.5\n", "m.tsv", "000", &depth,
                                   &dist, &err) == KVS_ERR_FORMAT);
    HAS(err.msg, "m.tsv:2: fewer fields");
    CHECK(kvs_recall_manifest_find("name\tdepth\tdistance\n1\t0.5\t3\n000\t1.5\t3\n", "m.tsv",
                                   "000", &depth, &dist, &err) == KVS_ERR_FORMAT);
    HAS(err.msg, "m.tsv:3: depth '1.5'");
}

int main(void)
{
    test_manifest();
    test_answers_ok();
    test_answers_bad();
    test_prompt_check();
    test_margin();
    return check_summary("test_recall");
}
