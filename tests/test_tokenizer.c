/* Tokenizer tests: llama2.c and GGUF loaders (incl. malformed files), encoding against the golden
 * token files and a brute-force reference merge, decoding round trips, timing. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

#define SP "\xe2\x96\x81" /* U+2581 */

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)size + 1);
    size_t got = fread(b, 1, (size_t)size, f);
    fclose(f);
    b[got] = '\0';
    if (n) *n = got;
    return b;
}

static int write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, n, f);
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

static int *read_ids(const char *path, int *n)
{
    size_t len;
    char *s = slurp(path, &len);
    if (!s) return NULL;
    int cap = 1024, k = 0;
    int *v = malloc(sizeof(int) * (size_t)cap);
    char *p = s, *end;
    for (;;) {
        long x = strtol(p, &end, 10);
        if (end == p) break;
        if (k == cap) v = realloc(v, sizeof(int) * (size_t)(cap *= 2));
        v[k++] = (int)x;
        p = end;
    }
    free(s);
    *n = k;
    return v;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Decodes ids[0..n) (ids[0] may be BOS) into a malloc'd buffer. */
static char *decode_all(const kvs_tokenizer *t, const int32_t *ids, int n, int prev, size_t *len)
{
    size_t cap = 64, k = 0;
    char *out = malloc(cap);
    for (int i = 0; i < n; i++) {
        int l;
        const char *p = kvs_tokenizer_decode(t, prev, ids[i], &l);
        while (k + (size_t)l + 1 > cap) out = realloc(out, cap *= 2);
        memcpy(out + k, p, (size_t)l);
        k += (size_t)l;
        prev = ids[i];
    }
    out[k] = '\0';
    if (len) *len = k;
    return out;
}

static int encode(const kvs_tokenizer *t, const char *text, int bos, int32_t **ids)
{
    int n = -1;
    kvs_error e = {0};
    kvs_status s = kvs_tokenizer_encode(t, text, bos, ids, &n, &e);
    if (s) {
        fprintf(stderr, "encode failed: %s\n", e.msg);
        return -1;
    }
    return n;
}

/* ---------- brute-force reference encoder (llama2.c-style rescan) ---------- */

static int ref_utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    int len = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3
              : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
    if (len == 0 || (size_t)len > n) return 0;
    for (int i = 1; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if (c == 0xE0 && s[1] < 0xA0) return 0;
    if (c == 0xED && s[1] > 0x9F) return 0;
    if (c == 0xF0 && s[1] < 0x90) return 0;
    if (c == 0xF4 && s[1] > 0x8F) return 0;
    return len;
}

static int ref_lookup(const kvs_tokenizer *t, const char *s, size_t len)
{
    char tmp[256];
    if (len >= sizeof tmp) return -1;
    memcpy(tmp, s, len);
    tmp[len] = '\0';
    int id = kvs_tokenizer_find(t, tmp);
    if (id < 0) return -1;
    int ty = kvs_tokenizer_type(t, id);
    return (ty == KVS_TOKEN_NORMAL || ty == KVS_TOKEN_USER_DEFINED) ? id : -1;
}

static int ref_encode(const kvs_tokenizer *t, const char *text, int32_t *out)
{
    size_t tl = strlen(text);
    if (tl == 0) return 0;
    char *buf = malloc(3 * tl + 4);
    size_t n = 0;
    memcpy(buf, SP, 3);
    n = 3;
    for (size_t i = 0; i < tl; i++) {
        if (text[i] == ' ') {
            memcpy(buf + n, SP, 3);
            n += 3;
        } else buf[n++] = text[i];
    }
    int *start = malloc(sizeof(int) * n), *len = malloc(sizeof(int) * n), *merge = malloc(sizeof(int) * n);
    int ns = 0;
    for (size_t i = 0; i < n;) {
        int cl = ref_utf8_len((const unsigned char *)buf + i, n - i);
        int id = cl ? ref_lookup(t, buf + i, (size_t)cl) : -1;
        if (id >= 0) {
            out[ns] = id, start[ns] = (int)i, len[ns] = cl, merge[ns] = 1, ns++;
            i += (size_t)cl;
        } else {
            int nb = cl ? cl : 1;
            for (int k = 0; k < nb; k++) {
                char piece[8];
                snprintf(piece, sizeof piece, "<0x%02X>", (unsigned char)buf[i + (size_t)k]);
                out[ns] = kvs_tokenizer_find(t, piece), start[ns] = (int)i + k, len[ns] = 1,
                merge[ns] = 0, ns++;
            }
            i += (size_t)nb;
        }
    }
    for (;;) {
        float best = -INFINITY;
        int bi = -1, bid = -1;
        for (int i = 0; i + 1 < ns; i++) {
            if (!merge[i] || !merge[i + 1]) continue;
            int id = ref_lookup(t, buf + start[i], (size_t)(len[i] + len[i + 1]));
            if (id >= 0 && (bi < 0 || kvs_tokenizer_score(t, id) > best)) {
                best = kvs_tokenizer_score(t, id);
                bi = i;
                bid = id;
            }
        }
        if (bi < 0) break;
        out[bi] = bid;
        len[bi] += len[bi + 1];
        for (int i = bi + 1; i + 1 < ns; i++)
            out[i] = out[i + 1], start[i] = start[i + 1], len[i] = len[i + 1], merge[i] = merge[i + 1];
        ns--;
    }
    free(buf);
    free(start);
    free(len);
    free(merge);
    return ns;
}

/* ---------- tests ---------- */

static void test_llama2c_vocab(const kvs_tokenizer *t)
{
    CHECK(kvs_tokenizer_n_vocab(t) == 512);
    CHECK(kvs_tokenizer_bos(t) == 1);
    CHECK(kvs_tokenizer_eos(t) == 2);
    CHECK(strcmp(kvs_tokenizer_piece(t, 0), "<unk>") == 0);
    CHECK(strcmp(kvs_tokenizer_piece(t, 1), "<s>") == 0);
    CHECK(strcmp(kvs_tokenizer_piece(t, 2), "</s>") == 0);
    CHECK(strcmp(kvs_tokenizer_piece(t, 3), "<0x00>") == 0);
    CHECK(strcmp(kvs_tokenizer_piece(t, 258), "<0xFF>") == 0);
    CHECK(strcmp(kvs_tokenizer_piece(t, 259), SP "t") == 0);
    CHECK(strcmp(kvs_tokenizer_piece(t, 265), SP "the") == 0);
    CHECK(kvs_tokenizer_type(t, 0) == KVS_TOKEN_UNKNOWN);
    CHECK(kvs_tokenizer_type(t, 1) == KVS_TOKEN_CONTROL);
    CHECK(kvs_tokenizer_type(t, 2) == KVS_TOKEN_CONTROL);
    int nbyte = 0, nnormal = 0;
    for (int i = 3; i < 512; i++) {
        if (kvs_tokenizer_type(t, i) == KVS_TOKEN_BYTE) nbyte++;
        if (kvs_tokenizer_type(t, i) == KVS_TOKEN_NORMAL) nnormal++;
    }
    CHECK(nbyte == 256 && nnormal == 253);
    CHECK(kvs_tokenizer_score(t, 260) == -1.0f);
    CHECK(kvs_tokenizer_score(t, 511) == -252.0f);
    CHECK(kvs_tokenizer_piece(t, 512) == NULL && kvs_tokenizer_piece(t, -1) == NULL);
    CHECK(kvs_tokenizer_type(t, 512) == 0);
    CHECK(kvs_tokenizer_find(t, SP "the") == 265);
    CHECK(kvs_tokenizer_find(t, "<s>") == 1);
    CHECK(kvs_tokenizer_find(t, "<0x0A>") == 13);
    CHECK(kvs_tokenizer_find(t, "no such piece") == -1);
    for (int i = 0; i < 512; i++) { /* no plain spaces left */
        CHECKF(strchr(kvs_tokenizer_piece(t, i), ' ') == NULL, "token %d", i);
    }
}

static void test_decode(const kvs_tokenizer *t)
{
    int l;
    CHECK(strcmp(kvs_tokenizer_decode(t, 1, 265, &l), "the") == 0 && l == 3); /* after BOS */
    CHECK(strcmp(kvs_tokenizer_decode(t, 265, 265, &l), " the") == 0 && l == 4);
    CHECK(strcmp(kvs_tokenizer_decode(t, 265, 1, &l), "") == 0 && l == 0); /* control */
    CHECK(strcmp(kvs_tokenizer_decode(t, 265, 2, &l), "") == 0 && l == 0);
    const char *p = kvs_tokenizer_decode(t, 265, 3, &l); /* <0x00> */
    CHECK(l == 1 && p[0] == '\0');
    p = kvs_tokenizer_decode(t, 1, 3 + 0x20, &l); /* <0x20> after BOS keeps its space */
    CHECK(l == 1 && p[0] == ' ');
    p = kvs_tokenizer_decode(t, 265, 13, &l);
    CHECK(l == 1 && p[0] == '\n');
    p = kvs_tokenizer_decode(t, 265, 258, &l);
    CHECK(l == 1 && (unsigned char)p[0] == 0xFF);
    CHECK(strcmp(kvs_tokenizer_decode(t, 265, 0, &l), "<unk>") == 0 && l == 5);
    CHECK(strcmp(kvs_tokenizer_decode(t, 265, 512, &l), "") == 0 && l == 0);
    CHECK(strcmp(kvs_tokenizer_decode(t, 265, -5, &l), "") == 0 && l == 0);
}

static void test_encode_basic(const kvs_tokenizer *t)
{
    int32_t *ids = NULL;
    int n = encode(t, "", 0, &ids);
    CHECK(n == 0);
    free(ids);
    n = encode(t, "", 1, &ids);
    CHECK(n == 1 && ids[0] == 1);
    free(ids);
    n = encode(t, "Once upon a time", 1, &ids);
    CHECK(n == 5 && ids[0] == 1 && ids[1] == 403 && ids[2] == 407 && ids[3] == 261 && ids[4] == 378);
    free(ids);
    n = encode(t, "\n", 0, &ids); /* "▁" then <0x0A> */
    CHECK(n == 2 && ids[1] == 13);
    CHECK(n == 2 && strcmp(kvs_tokenizer_piece(t, ids[0]), SP) == 0);
    free(ids);
    /* invalid UTF-8 and code points missing from the vocabulary fall back to bytes */
    n = encode(t, "\xff", 0, &ids);
    CHECK(n == 2 && ids[1] == 3 + 0xFF);
    free(ids);
    n = encode(t, "\xe6\x97\xa5", 0, &ids); /* U+65E5: not in this vocab */
    CHECK(kvs_tokenizer_find(t, "\xe6\x97\xa5") < 0);
    CHECK(n == 4 && ids[1] == 3 + 0xE6 && ids[2] == 3 + 0x97 && ids[3] == 3 + 0xA5);
    free(ids);
    n = encode(t, "\xe2\x82\xac", 0, &ids); /* euro sign: token 503 */
    CHECK(n == 2 && ids[1] == 503);
    free(ids);
    n = encode(t, "\xe2\x84\xa2", 0, &ids); /* trade mark sign: token 507 */
    CHECK(n == 2 && ids[1] == 507);
    free(ids);
    n = encode(t, "\xe2\x84", 0, &ids); /* truncated sequence: two byte tokens */
    CHECK(n == 3 && ids[1] == 3 + 0xE2 && ids[2] == 3 + 0x84);
    free(ids);
    n = encode(t, "\xed\xa0\x80", 0, &ids); /* UTF-16 surrogate: invalid, bytes */
    CHECK(n == 4 && ids[1] == 3 + 0xED);
    free(ids);
    /* control pieces written as text stay text */
    n = encode(t, "<s></s><unk><0x41>", 0, &ids);
    int ok = n > 0;
    for (int i = 0; i < n; i++)
        ok &= kvs_tokenizer_type(t, ids[i]) == KVS_TOKEN_NORMAL || ids[i] == 3 + '<' || ids[i] == 3 + '>';
    CHECK(ok);
    free(ids);

    /* errors */
    kvs_error e = {0};
    CHECK(kvs_tokenizer_encode(t, NULL, 1, &ids, &n, &e) == KVS_ERR_ARG);
    CHECK(kvs_tokenizer_encode(NULL, "x", 1, &ids, &n, &e) == KVS_ERR_ARG);

    /* round trips: decode(encode(x)) == x */
    const char *samples[] = {
        "Hello world", " leading space", "two  spaces", "trailing ", "tab\tand\nnewline\r\n",
        "caf\xc3\xa9 na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80", "bad \xff\xfe\xc3 utf8 \x80",
        "\x01\x02\x7f", "Lily's mom said, \"Let's go!\"", "   ",
    };
    for (size_t k = 0; k < sizeof samples / sizeof *samples; k++) {
        n = encode(t, samples[k], 1, &ids);
        size_t len;
        char *d = decode_all(t, ids, n, -1, &len);
        CHECKF(len == strlen(samples[k]) && memcmp(d, samples[k], len) == 0, "round trip of \"%s\" gave \"%s\"", samples[k], d);
        free(d);
        free(ids);
    }
}

static void test_golden_greedy(const kvs_tokenizer *t)
{
    char p1[512], p2[512];
    size_t len;
    char *text = slurp(check_shared_path(p1, sizeof p1, "models/golden/stories260K-greedy-512.txt"), &len);
    int ng;
    int *gold = read_ids(check_shared_path(p2, sizeof p2, "models/golden/stories260K-greedy-512.tokens"), &ng);
    CHECK(text && gold && ng == 346);
    if (!text || !gold) return;
    /* the file is the decoded continuation plus a final newline */
    CHECK(len > 0 && text[len - 1] == '\n');
    text[--len] = '\0';
    int32_t *ids;
    int n = encode(t, text, 1, &ids);
    CHECKF(n == ng, "n=%d want %d", n, ng);
    int same = n == ng;
    for (int i = 0; same && i < n; i++) same = ids[i] == gold[i];
    CHECK(same);
    /* decoding the golden ids gives the text back */
    int32_t *g32 = malloc(sizeof(int32_t) * (size_t)ng);
    for (int i = 0; i < ng; i++) g32[i] = gold[i];
    size_t dl;
    char *d = decode_all(t, g32, ng, -1, &dl);
    CHECK(dl == len && memcmp(d, text, len) == 0);
    free(d);
    free(g32);
    free(ids);
    free(text);
    free(gold);
}

/* The sample text is what llama2.c prints: BOS inside the sequence shows as its llama2.c piece
 * "\n<s>\n", and the text goes on with the token sampled at the last position (the .tokens file
 * holds the 512 model inputs), then a newline. So: split at "\n<s>\n", encode each story with
 * BOS, and expect the 512 golden ids followed by exactly one more token. */
static void test_golden_sample(const kvs_tokenizer *t)
{
    char p1[512], p2[512];
    size_t len;
    char *text = slurp(check_shared_path(p1, sizeof p1, "models/golden/stories260K-sample-512.txt"), &len);
    int ng;
    int *gold = read_ids(check_shared_path(p2, sizeof p2, "models/golden/stories260K-sample-512.tokens"), &ng);
    CHECK(text && gold && ng == 512);
    if (!text || !gold) return;
    CHECK(len > 0 && text[len - 1] == '\n');
    text[--len] = '\0';
    int32_t *all = malloc(sizeof(int32_t) * 2048);
    int nall = 0, nstories = 0;
    char *seg = text;
    for (;;) {
        char *sep = strstr(seg, "\n<s>\n");
        if (sep) *sep = '\0';
        int32_t *ids;
        int n = encode(t, seg, 1, &ids);
        if (n > 0 && nall + n <= 2048) memcpy(all + nall, ids, sizeof(int32_t) * (size_t)n), nall += n;
        free(ids);
        nstories++;
        if (!sep) break;
        seg = sep + 5;
    }
    int nbos = 0;
    for (int i = 0; i < ng; i++) nbos += gold[i] == 1;
    CHECKF(nstories == nbos, "%d stories, %d BOS", nstories, nbos);
    CHECKF(nall == ng + 1, "nall=%d", nall);
    int same = nall >= ng;
    for (int i = 0; same && i < ng; i++) same = all[i] == gold[i];
    CHECK(same);
    if (nall == ng + 1) {
        int l;
        const char *last = kvs_tokenizer_decode(t, all[ng - 1], all[ng], &l);
        CHECK(l == 1 && last[0] == 'l'); /* "... The cl": the model's 513th token */
    }
    free(all);
    free(text);
    free(gold);
}

static uint64_t rng_state = 0x1234567887654321ull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static void test_reference_merge(const kvs_tokenizer *t)
{
    static const char *alphabet[] = {
        "a", "e", "t", "h", "s", "o", "n", "d", "i", "r", "l", " ", " ", " ", ".", ",", "\n", "T",
        "L", "'", "\"", "\xc3\xa9", "\xe2\x84\xa2", "\xe2\x82\xac", "\xff", "\xc3", "the", " the",
        " was", "ing", "ed",
    };
    const int na = (int)(sizeof alphabet / sizeof *alphabet);
    char text[600];
    int32_t ref[2000];
    int bad = 0;
    for (int iter = 0; iter < 400; iter++) {
        size_t k = 0;
        int parts = 1 + (int)(rnd() % 60);
        for (int j = 0; j < parts; j++) {
            const char *s = alphabet[rnd() % (uint32_t)na];
            memcpy(text + k, s, strlen(s));
            k += strlen(s);
        }
        text[k] = '\0';
        int32_t *ids;
        int n = encode(t, text, 0, &ids);
        int nr = ref_encode(t, text, ref);
        int same = n == nr;
        for (int i = 0; same && i < n; i++) same = ids[i] == ref[i];
        if (!same && bad++ < 3) fprintf(stderr, "reference mismatch on \"%s\" (%d vs %d)\n", text, n, nr);
        free(ids);
    }
    CHECK(bad == 0);
}

/* Writes a tiny llama2.c vocabulary; pieces use ' ' for spaces. */
static void write_llama2c(const char *path, int n, const char *const *pieces, const float *scores)
{
    unsigned char buf[4096];
    size_t k = 0;
    int32_t maxlen = 0;
    for (int i = 0; i < n; i++)
        if ((int32_t)strlen(pieces[i]) > maxlen) maxlen = (int32_t)strlen(pieces[i]);
    memcpy(buf, &maxlen, 4);
    k = 4;
    for (int i = 0; i < n; i++) {
        int32_t l = (int32_t)strlen(pieces[i]);
        memcpy(buf + k, &scores[i], 4);
        memcpy(buf + k + 4, &l, 4);
        memcpy(buf + k + 8, pieces[i], (size_t)l);
        k += 8 + (size_t)l;
    }
    write_file(path, buf, k);
}

static void test_merge_order(void)
{
    char path[512];
    check_tmp_path(path, sizeof path, "kvs_tok_tiny.bin");
    const char *pieces[] = {"<unk>", "\n<s>\n", "\n</s>\n", " ", "a", "b", "ab", "ba", "<0x61>"};
    float scores[] = {0, 0, 0, -1, -1, -1, 5, 5, 0};
    kvs_error e = {0};
    kvs_tokenizer *t = NULL;
    int32_t *ids;
    write_llama2c(path, 9, pieces, scores);
    CHECK(kvs_tokenizer_load_llama2c(path, &t, &e) == KVS_OK);
    if (!t) return;
    CHECK(kvs_tokenizer_type(t, 8) == KVS_TOKEN_BYTE);
    /* equal scores: the leftmost pair wins */
    int n = encode(t, "aba", 0, &ids);
    CHECK(n == 3 && ids[0] == 3 && ids[1] == 6 && ids[2] == 4);
    free(ids);
    /* a missing byte token falls back to <unk> */
    n = encode(t, "c", 0, &ids);
    CHECK(n == 2 && ids[0] == 3 && ids[1] == 0);
    free(ids);
    kvs_tokenizer_free(t);
    scores[7] = 6; /* now "ba" scores higher */
    write_llama2c(path, 9, pieces, scores);
    t = NULL;
    CHECK(kvs_tokenizer_load_llama2c(path, &t, &e) == KVS_OK);
    if (!t) return;
    n = encode(t, "aba", 0, &ids);
    CHECK(n == 3 && ids[0] == 3 && ids[1] == 4 && ids[2] == 7);
    free(ids);
    kvs_tokenizer_free(t);
    remove(path);
}

static void test_timing(const kvs_tokenizer *t)
{
    char p[512];
    size_t len;
    char *eval = slurp(check_shared_path(p, sizeof p, "models/stories-eval.txt"), &len);
    CHECK(eval != NULL);
    if (!eval) return;
    char *big = malloc(3 * len + 1);
    for (int i = 0; i < 3; i++) memcpy(big + (size_t)i * len, eval, len);
    big[3 * len] = '\0';
    int32_t *ids;
    double t0 = now_ms();
    int n = encode(t, eval, 1, &ids);
    double t1 = now_ms();
    CHECKF(n == 1409, "stories-eval.txt: %d tokens with BOS, README says 1409", n);
    free(ids);
    double t2 = now_ms();
    n = encode(t, big, 1, &ids);
    double t3 = now_ms();
    free(ids);
    CHECK(n > 4096);
    /* one 20000-byte word with many merges: the story text without spaces */
    char *word = malloc(20001);
    size_t wn = 0;
    while (wn < 20000)
        for (size_t i = 0; i < len && wn < 20000; i++)
            if (eval[i] != ' ' && eval[i] != '\n') word[wn++] = eval[i];
    word[wn] = '\0';
    double t4 = now_ms();
    int nw = encode(t, word, 1, &ids);
    double t5 = now_ms();
    free(ids);
    printf("encode: stories-eval %zu bytes -> %d tokens in %.2f ms; x3 %zu bytes -> %d tokens in "
           "%.2f ms; 20000-byte word -> %d tokens in %.2f ms\n",
           len, 1409, t1 - t0, 3 * len, n, t3 - t2, nw, t5 - t4);
    CHECK(t3 - t2 < 100.0);
    CHECK(t5 - t4 < 100.0);
    free(word);
    free(big);
    free(eval);
}

static void test_llama2c_errors(const char *tokpath)
{
    char path[512], dir[512];
    check_tmp_path(path, sizeof path, "kvs_tok_trunc.bin");
    size_t size;
    unsigned char *orig = (unsigned char *)slurp(tokpath, &size);
    CHECK(orig != NULL && size == 6227);
    if (!orig) return;
    kvs_error e;
    kvs_tokenizer *t = NULL;

    /* token boundaries, to know which cuts load as a smaller vocabulary */
    int *ntok_at = malloc(sizeof(int) * (size + 1)); /* tokens before a boundary, else -1 */
    for (size_t i = 0; i <= size; i++) ntok_at[i] = -1;
    size_t off = 4;
    for (int i = 0; i < 512; i++) {
        ntok_at[off] = i;
        int32_t l;
        memcpy(&l, orig + off + 4, 4);
        off += 8 + (size_t)l;
    }
    CHECK(off == size);
    ntok_at[size] = 512;

    /* every truncation offset: with the expected count every cut fails; read-to-end fails unless
     * the cut falls between tokens and leaves at least 3 */
    int bad_n = 0, bad_plain = 0, named = 0, checked = 0;
    for (size_t cut = 0; cut < size; cut++) {
        /* all of the first 300 offsets, every token boundary and its neighbours, every 11th */
        int near_boundary = ntok_at[cut] >= 0 || (cut > 0 && ntok_at[cut - 1] >= 0) ||
                            ntok_at[cut + 1] >= 0;
        if (cut >= 300 && !near_boundary && cut % 11 != 0) continue;
        write_file(path, orig, cut);
        e.msg[0] = '\0';
        kvs_status s = kvs_tokenizer_load_llama2c_n(path, 512, &t, &e);
        if (s != KVS_ERR_FORMAT || t != NULL) bad_n++;
        if (strstr(e.msg, path) && (cut < 4 || strstr(e.msg, "token") || strstr(e.msg, "truncated")))
            named++;
        checked++;
        kvs_tokenizer_free(t);
        t = NULL;
        s = kvs_tokenizer_load_llama2c(path, &t, &e);
        int expect_ok = ntok_at[cut] >= 3;
        if (expect_ok ? (s != KVS_OK || !t) : (s != KVS_ERR_FORMAT || t != NULL)) {
            if (bad_plain++ < 3) fprintf(stderr, "cut %zu: status %d: %s\n", cut, s, e.msg);
        }
        kvs_tokenizer_free(t);
        t = NULL;
    }
    CHECKF(bad_n == 0, "%d cuts loaded with n_vocab=512", bad_n);
    CHECKF(bad_plain == 0, "%d cuts misjudged by the read-to-end loader", bad_plain);
    CHECKF(named == checked, "%d of %d messages name the path and what is wrong", named, checked);

    /* a few messages in detail */
    write_file(path, orig, 2);
    kvs_tokenizer_load_llama2c(path, &t, &e);
    CHECKF(strstr(e.msg, "truncated header") != NULL, "%s", e.msg);
    write_file(path, orig, 4);
    CHECK(kvs_tokenizer_load_llama2c(path, &t, &e) == KVS_ERR_FORMAT);
    CHECKF(strstr(e.msg, "0 tokens") != NULL, "%s", e.msg);
    write_file(path, orig, 6);
    kvs_tokenizer_load_llama2c(path, &t, &e);
    CHECKF(strstr(e.msg, "token 0") && strstr(e.msg, "truncated"), "%s", e.msg);
    write_file(path, orig, 4 + 8 + 3); /* inside token 0's bytes */
    kvs_tokenizer_load_llama2c(path, &t, &e);
    CHECKF(strstr(e.msg, "token 0") && strstr(e.msg, "byte length 5"), "%s", e.msg);
    write_file(path, orig, 3000);
    kvs_tokenizer_load_llama2c_n(path, 512, &t, &e);
    CHECKF(strstr(e.msg, "truncated") != NULL, "%s", e.msg);

    /* file cut between tokens: read-to-end gives the smaller vocab, the checked loader fails */
    off = 4;
    for (int i = 0; i < 300; i++) {
        int32_t l;
        memcpy(&l, orig + off + 4, 4);
        off += 8 + (size_t)l;
    }
    write_file(path, orig, off);
    CHECK(kvs_tokenizer_load_llama2c(path, &t, &e) == KVS_OK && kvs_tokenizer_n_vocab(t) == 300);
    kvs_tokenizer_free(t);
    t = NULL;
    CHECK(kvs_tokenizer_load_llama2c_n(path, 512, &t, &e) == KVS_ERR_FORMAT && t == NULL);
    CHECKF(strstr(e.msg, "300 of 512") != NULL, "%s", e.msg);

    /* trailing bytes / wrong expected count */
    CHECK(kvs_tokenizer_load_llama2c_n(tokpath, 511, &t, &e) == KVS_ERR_FORMAT && t == NULL);
    CHECKF(strstr(e.msg, "trailing") != NULL, "%s", e.msg);
    CHECK(kvs_tokenizer_load_llama2c_n(tokpath, 512, &t, &e) == KVS_OK && t != NULL);
    kvs_tokenizer_free(t);
    t = NULL;
    CHECK(kvs_tokenizer_load_llama2c_n(tokpath, -1, &t, &e) == KVS_ERR_ARG);

    /* corrupt lengths */
    unsigned char *bad = malloc(size);
    int32_t v;
    size_t tok5 = 4;
    for (int i = 0; i < 5; i++) {
        int32_t l;
        memcpy(&l, orig + tok5 + 4, 4);
        tok5 += 8 + (size_t)l;
    }
    struct {
        size_t at;
        int32_t val;
        const char *want;
    } cases[] = {
        {tok5 + 4, -1, "negative byte length"},
        {tok5 + 4, 0x7fffffff, "exceeds max_token_length"},
        {tok5 + 4, 7, "token 5"}, /* a longer (allowed) length shifts the stream: garbage follows */
        {0, -3, "negative max_token_length"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        memcpy(bad, orig, size);
        v = cases[c].val;
        memcpy(bad + cases[c].at, &v, 4);
        write_file(path, bad, size);
        e.msg[0] = '\0';
        kvs_status s = kvs_tokenizer_load_llama2c_n(path, 512, &t, &e);
        CHECKF(s == KVS_ERR_FORMAT && t == NULL, "case %zu: status %d", c, s);
        CHECKF(strstr(e.msg, path) != NULL, "case %zu: %s", c, e.msg);
        if (c != 2) CHECKF(strstr(e.msg, cases[c].want) != NULL, "case %zu: %s", c, e.msg);
        kvs_tokenizer_free(t);
        t = NULL;
    }
    /* max_token_length is only an upper bound: a huge one is harmless (nothing is sized by it) */
    memcpy(bad, orig, size);
    v = 0x7fffffff;
    memcpy(bad, &v, 4);
    write_file(path, bad, size);
    CHECK(kvs_tokenizer_load_llama2c_n(path, 512, &t, &e) == KVS_OK);
    kvs_tokenizer_free(t);
    t = NULL;
    /* NaN score */
    memcpy(bad, orig, size);
    float nanf_ = NAN;
    memcpy(bad + tok5, &nanf_, 4);
    write_file(path, bad, size);
    CHECK(kvs_tokenizer_load_llama2c(path, &t, &e) == KVS_ERR_FORMAT);
    CHECKF(strstr(e.msg, "token 5") && strstr(e.msg, "NaN"), "%s", e.msg);
    /* too few tokens */
    write_file(path, orig, tok5 - 0); /* 5 tokens: fine */
    CHECK(kvs_tokenizer_load_llama2c(path, &t, &e) == KVS_OK);
    kvs_tokenizer_free(t);
    t = NULL;
    free(bad);

    /* missing file, directory */
    check_tmp_path(path, sizeof path, "kvs_no_such_tokenizer.bin");
    remove(path);
    CHECK(kvs_tokenizer_load_llama2c(path, &t, &e) == KVS_ERR_IO && t == NULL);
    CHECKF(strstr(e.msg, path) != NULL, "%s", e.msg);
    check_tmp_path(dir, sizeof dir, "");
    CHECK(kvs_tokenizer_load_llama2c(dir, &t, &e) == KVS_ERR_IO && t == NULL);
    CHECK(kvs_tokenizer_load_llama2c(NULL, &t, &e) == KVS_ERR_ARG);

    check_tmp_path(path, sizeof path, "kvs_tok_trunc.bin");
    remove(path);
    free(ntok_at);
    free((char *)orig);
}

/* ---------- GGUF ---------- */

static int same_vocab(const kvs_tokenizer *a, const kvs_tokenizer *b, int compare_scores_bits)
{
    if (kvs_tokenizer_n_vocab(a) != kvs_tokenizer_n_vocab(b)) return 0;
    if (kvs_tokenizer_bos(a) != kvs_tokenizer_bos(b) || kvs_tokenizer_eos(a) != kvs_tokenizer_eos(b)) return 0;
    int bad = 0;
    for (int i = 0; i < kvs_tokenizer_n_vocab(a); i++) {
        float sa = kvs_tokenizer_score(a, i), sb = kvs_tokenizer_score(b, i);
        int score_ok = compare_scores_bits ? memcmp(&sa, &sb, 4) == 0 : sa == sb;
        if (strcmp(kvs_tokenizer_piece(a, i), kvs_tokenizer_piece(b, i)) != 0 ||
            kvs_tokenizer_type(a, i) != kvs_tokenizer_type(b, i) || !score_ok) {
            if (bad++ < 3)
                fprintf(stderr, "token %d: \"%s\"/%d/%g vs \"%s\"/%d/%g\n", i, kvs_tokenizer_piece(a, i),
                        kvs_tokenizer_type(a, i), sa, kvs_tokenizer_piece(b, i), kvs_tokenizer_type(b, i), sb);
        }
    }
    return bad == 0;
}

static void test_gguf_vocab(const kvs_tokenizer *ref)
{
    char path[512];
    kvs_error e = {0};
    kvs_gguf *g = NULL;
    kvs_tokenizer *t = NULL;
    CHECKF(kvs_gguf_open(check_shared_path(path, sizeof path, "models/gguf/stories260K-f32.gguf"), &g, &e) == KVS_OK, "%s", e.msg);
    if (!g) return;
    CHECKF(kvs_tokenizer_from_gguf(g, &t, &e) == KVS_OK, "%s", e.msg);
    kvs_gguf_close(g);
    if (!t) return;
    /* llama.cpp's converter and our llama2.c loader agree on pieces, types and score bits */
    CHECK(same_vocab(ref, t, 1));
    int32_t *a, *b;
    const char *s = "Once upon a time, Lily met a big \xe2\x84\xa2 caf\xc3\xa9.\n";
    int na = encode(ref, s, 1, &a), nb = encode(t, s, 1, &b);
    CHECK(na == nb && na > 0 && memcmp(a, b, sizeof(int32_t) * (size_t)na) == 0);
    free(a);
    free(b);
    kvs_tokenizer_free(t);
}

static void test_gguf_roundtrip(const kvs_tokenizer *ref)
{
    char path[512];
    check_tmp_path(path, sizeof path, "kvs_tok_roundtrip.gguf");
    kvs_error e = {0};
    kvs_gguf_writer *w = kvs_gguf_writer_new();
    CHECK(w != NULL);
    if (!w) return;
    CHECK(kvs_tokenizer_to_gguf(ref, w) == KVS_OK);
    CHECKF(kvs_gguf_write(w, path, &e) == KVS_OK, "%s", e.msg);
    kvs_gguf_writer_free(w);
    kvs_gguf *g = NULL;
    kvs_tokenizer *t = NULL;
    CHECKF(kvs_gguf_open(path, &g, &e) == KVS_OK, "%s", e.msg);
    if (g) {
        CHECKF(kvs_tokenizer_from_gguf(g, &t, &e) == KVS_OK, "%s", e.msg);
        kvs_gguf_close(g);
    }
    if (t) CHECK(same_vocab(ref, t, 1));
    kvs_tokenizer_free(t);
    remove(path);
}

enum {
    SKIP_MODEL = 1, SKIP_TOKENS = 2, SKIP_SCORES = 4, SKIP_TYPES = 8,
};

typedef struct {
    const char *name;
    int skip;
    void (*tweak)(kvs_gguf_writer *w, const kvs_tokenizer *ref);
    kvs_status want;
    const char *msg1, *msg2; /* substrings the message must contain */
} gguf_case;

static void tw_model_gpt2(kvs_gguf_writer *w, const kvs_tokenizer *r) { (void)r; kvs_gguf_set_str(w, "tokenizer.ggml.model", "gpt2"); }
static void tw_model_bert(kvs_gguf_writer *w, const kvs_tokenizer *r) { (void)r; kvs_gguf_set_str(w, "tokenizer.ggml.model", "bert"); }
static void tw_model_u32(kvs_gguf_writer *w, const kvs_tokenizer *r) { (void)r; kvs_gguf_set_u32(w, "tokenizer.ggml.model", 7); }
static void tw_scores_i32(kvs_gguf_writer *w, const kvs_tokenizer *r)
{
    int32_t v[512] = {0};
    (void)r;
    kvs_gguf_set_arr_i32(w, "tokenizer.ggml.scores", v, 512);
}
static void tw_scores_short(kvs_gguf_writer *w, const kvs_tokenizer *r)
{
    float v[511];
    for (int i = 0; i < 511; i++) v[i] = kvs_tokenizer_score(r, i);
    kvs_gguf_set_arr_f32(w, "tokenizer.ggml.scores", v, 511);
}
static void tw_types_long(kvs_gguf_writer *w, const kvs_tokenizer *r)
{
    int32_t v[513];
    for (int i = 0; i < 513; i++) v[i] = i < 512 ? kvs_tokenizer_type(r, i) : 1;
    kvs_gguf_set_arr_i32(w, "tokenizer.ggml.token_type", v, 513);
}
static void tw_types_f32(kvs_gguf_writer *w, const kvs_tokenizer *r)
{
    float v[512] = {0};
    (void)r;
    kvs_gguf_set_arr_f32(w, "tokenizer.ggml.token_type", v, 512);
}
static void tw_tokens_scalar(kvs_gguf_writer *w, const kvs_tokenizer *r) { (void)r; kvs_gguf_set_str(w, "tokenizer.ggml.tokens", "x"); }
static void tw_type_bad(kvs_gguf_writer *w, const kvs_tokenizer *r)
{
    int32_t v[512];
    for (int i = 0; i < 512; i++) v[i] = kvs_tokenizer_type(r, i);
    v[300] = 9;
    kvs_gguf_set_arr_i32(w, "tokenizer.ggml.token_type", v, 512);
}
static void tw_type_byte_bad(kvs_gguf_writer *w, const kvs_tokenizer *r)
{
    int32_t v[512];
    for (int i = 0; i < 512; i++) v[i] = kvs_tokenizer_type(r, i);
    v[300] = KVS_TOKEN_BYTE;
    kvs_gguf_set_arr_i32(w, "tokenizer.ggml.token_type", v, 512);
}
static void tw_score_nan(kvs_gguf_writer *w, const kvs_tokenizer *r)
{
    float v[512];
    for (int i = 0; i < 512; i++) v[i] = kvs_tokenizer_score(r, i);
    v[42] = NAN;
    kvs_gguf_set_arr_f32(w, "tokenizer.ggml.scores", v, 512);
}
static void tw_bos_range(kvs_gguf_writer *w, const kvs_tokenizer *r) { (void)r; kvs_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", 512); }
static void tw_eos_range(kvs_gguf_writer *w, const kvs_tokenizer *r) { (void)r; kvs_gguf_set_i32(w, "tokenizer.ggml.eos_token_id", -1); }
static void tw_bos_str(kvs_gguf_writer *w, const kvs_tokenizer *r) { (void)r; kvs_gguf_set_str(w, "tokenizer.ggml.bos_token_id", "1"); }
static void tw_unk_range(kvs_gguf_writer *w, const kvs_tokenizer *r) { (void)r; kvs_gguf_set_u32(w, "tokenizer.ggml.unknown_token_id", 100000); }
static void tw_empty(kvs_gguf_writer *w, const kvs_tokenizer *r)
{
    (void)r;
    kvs_gguf_set_arr_str(w, "tokenizer.ggml.tokens", NULL, 0);
    kvs_gguf_set_arr_f32(w, "tokenizer.ggml.scores", NULL, 0);
    kvs_gguf_set_arr_i32(w, "tokenizer.ggml.token_type", NULL, 0);
}
static void tw_no_ids(kvs_gguf_writer *w, const kvs_tokenizer *r)
{
    (void)w;
    (void)r;
}

static void write_case(const char *path, const kvs_tokenizer *ref, const gguf_case *c, kvs_gguf_writer *w)
{
    int n = kvs_tokenizer_n_vocab(ref);
    const char **pieces = malloc(sizeof(char *) * (size_t)n);
    float *scores = malloc(sizeof(float) * (size_t)n);
    int32_t *types = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) {
        pieces[i] = kvs_tokenizer_piece(ref, i);
        scores[i] = kvs_tokenizer_score(ref, i);
        types[i] = kvs_tokenizer_type(ref, i);
    }
    kvs_gguf_set_str(w, "general.architecture", "llama");
    if (!(c->skip & SKIP_MODEL)) kvs_gguf_set_str(w, "tokenizer.ggml.model", "llama");
    if (!(c->skip & SKIP_TOKENS)) kvs_gguf_set_arr_str(w, "tokenizer.ggml.tokens", pieces, (uint64_t)n);
    if (!(c->skip & SKIP_SCORES)) kvs_gguf_set_arr_f32(w, "tokenizer.ggml.scores", scores, (uint64_t)n);
    if (!(c->skip & SKIP_TYPES)) kvs_gguf_set_arr_i32(w, "tokenizer.ggml.token_type", types, (uint64_t)n);
    if (c->tweak != tw_no_ids) {
        kvs_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
        kvs_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
        kvs_gguf_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    }
    if (c->tweak) c->tweak(w, ref);
    kvs_error e;
    if (kvs_gguf_write(w, path, &e)) fprintf(stderr, "write %s: %s\n", c->name, e.msg);
    free(pieces);
    free(scores);
    free(types);
}

static void test_gguf_errors(const kvs_tokenizer *ref)
{
    const gguf_case cases[] = {
        {"ok", 0, NULL, KVS_OK, "", ""},
        {"ids absent (defaults 1/2/0)", 0, tw_no_ids, KVS_OK, "", ""},
        {"no model", SKIP_MODEL, NULL, KVS_ERR_FORMAT, "tokenizer.ggml.model", "missing"},
        {"model bert", 0, tw_model_bert, KVS_ERR_UNSUPPORTED, "tokenizer.ggml.model", "bert"},
        /* gpt2 (byte-level BPE) is supported, but needs merges (tests/test_vocab.c tests it) */
        {"model gpt2 without merges", 0, tw_model_gpt2, KVS_ERR_FORMAT, "tokenizer.ggml.merges", "missing"},
        {"model u32", 0, tw_model_u32, KVS_ERR_FORMAT, "tokenizer.ggml.model", ""},
        {"no tokens", SKIP_TOKENS, NULL, KVS_ERR_FORMAT, "tokenizer.ggml.tokens", "missing"},
        {"no scores", SKIP_SCORES, NULL, KVS_ERR_FORMAT, "tokenizer.ggml.scores", "missing"},
        {"no types", SKIP_TYPES, NULL, KVS_ERR_FORMAT, "tokenizer.ggml.token_type", "missing"},
        {"tokens not an array", 0, tw_tokens_scalar, KVS_ERR_FORMAT, "tokenizer.ggml.tokens", ""},
        {"scores i32", 0, tw_scores_i32, KVS_ERR_FORMAT, "tokenizer.ggml.scores", "array of i32, expected an array of f32"},
        {"types f32", 0, tw_types_f32, KVS_ERR_FORMAT, "tokenizer.ggml.token_type", "array of f32, expected an array of i32"},
        {"scores short", 0, tw_scores_short, KVS_ERR_FORMAT, "tokenizer.ggml.scores", "511"},
        {"types long", 0, tw_types_long, KVS_ERR_FORMAT, "tokenizer.ggml.token_type", "513"},
        {"type 9", 0, tw_type_bad, KVS_ERR_FORMAT, "token 300", "type 9"},
        {"byte type on a normal piece", 0, tw_type_byte_bad, KVS_ERR_FORMAT, "token 300", "<0xNN>"},
        {"NaN score", 0, tw_score_nan, KVS_ERR_FORMAT, "tokenizer.ggml.scores", "token 42"},
        {"bos out of range", 0, tw_bos_range, KVS_ERR_FORMAT, "tokenizer.ggml.bos_token_id", "512"},
        {"eos negative", 0, tw_eos_range, KVS_ERR_FORMAT, "tokenizer.ggml.eos_token_id", ""},
        {"bos string", 0, tw_bos_str, KVS_ERR_FORMAT, "tokenizer.ggml.bos_token_id", ""},
        {"unk out of range", 0, tw_unk_range, KVS_ERR_FORMAT, "tokenizer.ggml.unknown_token_id", "100000"},
        {"empty vocab", 0, tw_empty, KVS_ERR_FORMAT, "tokenizer.ggml.tokens", "empty"},
    };
    char path[512];
    check_tmp_path(path, sizeof path, "kvs_tok_case.gguf");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const gguf_case *c = &cases[i];
        kvs_gguf_writer *w = kvs_gguf_writer_new();
        if (!w) continue;
        write_case(path, ref, c, w);
        kvs_gguf_writer_free(w);
        kvs_error e = {0};
        kvs_gguf *g = NULL;
        kvs_tokenizer *t = NULL;
        if (kvs_gguf_open(path, &g, &e) != KVS_OK) {
            CHECKF(0, "%s: cannot open: %s", c->name, e.msg);
            continue;
        }
        kvs_status s = kvs_tokenizer_from_gguf(g, &t, &e);
        kvs_gguf_close(g);
        CHECKF(s == c->want, "%s: status %d, want %d (%s)", c->name, s, c->want, s ? e.msg : "");
        if (c->want) {
            CHECKF(t == NULL, "%s", c->name);
            CHECKF(strstr(e.msg, c->msg1) && strstr(e.msg, c->msg2), "%s: message \"%s\"", c->name, e.msg);
        } else {
            CHECKF(t && same_vocab(ref, t, 1), "%s", c->name);
        }
        kvs_tokenizer_free(t);
    }
    remove(path);
}

int main(void)
{
    char tokpath[512];
    check_shared_path(tokpath, sizeof tokpath, "models/tok512.bin");
    kvs_error e = {0};
    kvs_tokenizer *t = NULL;
    CHECKF(kvs_tokenizer_load_llama2c(tokpath, &t, &e) == KVS_OK, "%s", e.msg);
    if (!t) return check_summary("tokenizer");

    test_llama2c_vocab(t);
    test_decode(t);
    test_encode_basic(t);
    test_golden_greedy(t);
    test_golden_sample(t);
    test_reference_merge(t);
    test_merge_order();
    test_timing(t);
    test_llama2c_errors(tokpath);
    test_gguf_vocab(t);
    test_gguf_roundtrip(t);
    test_gguf_errors(t);

    kvs_tokenizer_free(t);
    return check_summary("tokenizer");
}
