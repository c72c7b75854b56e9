/* Tokenizer vocabularies: reference tokenizations of shared/models/vocab, byte-level BPE unit and
 * bad-input tests.
 *
 * test_vocab NAME [OUT]: loads $KVS_SHARED_DIR/models/vocab/NAME.gguf (vocabulary only), splits
 * NAME.gguf.inp on "\n__ggml_vocab_test__\n", tokenizes every test string without BOS and without
 * special-token parsing, and compares with the ids of NAME.gguf.out (or of OUT, a file of the
 * same folder), one line per test. Also checks that decoding the ids gives the text back.
 * Prints "NAME: N of M cases equal" and every mismatch (input, expected, got).
 * test_vocab (no arguments): byte-level BPE on a small vocabulary written with the GGUF writer
 * (merges, added tokens, BOS, decoding, writing back), bad vocabularies (unknown pre-tokenizer,
 * merges naming unknown tokens, a merge without a space, ...), and the prompt ids of the arch
 * models' greedy files (llama3-f32 and qwen2-f32: GPT-2's vocabulary cut to 2048 tokens), and
 * special-token parsing (kvs_tokenizer_encode_ex) on SentencePiece and byte-level BPE
 * vocabularies with control tokens. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "gguf/gguf.h"
#include "tokenizer/bpe.h"
#include "tokenizer/tokenizer.h"

#define SEP "\n__ggml_vocab_test__\n"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Whole file, NUL-terminated; NULL (with a message) if unreadable. */
static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        if (n + 1 >= cap) {
            char *p = realloc(buf, cap * 2);
            if (!p) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = p;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    fclose(f);
    if (buf) buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

/* Prints s[0..n) with C escapes for control bytes, quotes and backslashes. */
static void print_escaped(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20 || c == 0x7F) fprintf(f, "\\x%02X", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void print_ids(FILE *f, const int32_t *ids, int n)
{
    fputc('[', f);
    for (int i = 0; i < n; i++) fprintf(f, "%s%d", i ? " " : "", (int)ids[i]);
    fputc(']', f);
}

/* Concatenated decoded text of ids (prev starts at BOS, so a SentencePiece dummy-prefix space is
 * dropped as after a BOS). Returns a malloc'd buffer, length in *len. */
static char *decode_all(const kvs_tokenizer *t, const int32_t *ids, int n, size_t *len)
{
    size_t cap = 64, m = 0;
    char *out = malloc(cap);
    int prev = kvs_tokenizer_is_bpe(t) ? -1 : kvs_tokenizer_bos(t);
    for (int i = 0; out && i < n; i++) {
        int l = 0;
        const char *p = kvs_tokenizer_decode(t, prev, ids[i], &l);
        while (out && m + (size_t)l + 1 > cap) {
            char *q = realloc(out, cap * 2);
            if (!q) free(out);
            out = q;
            cap *= 2;
        }
        if (!out) break;
        memcpy(out + m, p, (size_t)l);
        m += (size_t)l;
        prev = ids[i];
    }
    if (out) out[m] = '\0';
    *len = m;
    return out;
}

static int run_vocab(const char *name, const char *out_name)
{
    char gpath[1024], rel[600], ipath[1100], opath[1100];
    snprintf(rel, sizeof rel, "models/vocab/%s.gguf", name);
    check_shared_path(gpath, sizeof gpath, rel);
    snprintf(ipath, sizeof ipath, "%s.inp", gpath);
    if (out_name) {
        snprintf(rel, sizeof rel, "models/vocab/%s", out_name);
        check_shared_path(opath, sizeof opath, rel);
    } else {
        snprintf(opath, sizeof opath, "%s.out", gpath);
    }
    if (access(ipath, R_OK) != 0) { /* all .inp files are identical: gpt-neox has none */
        snprintf(rel, sizeof rel, "models/vocab/ggml-vocab-gpt-2.gguf.inp");
        check_shared_path(ipath, sizeof ipath, rel);
    }

    kvs_error e = {0};
    kvs_tokenizer *t = NULL;
    double t0 = now_ms();
    kvs_status st = kvs_tokenizer_load_gguf(gpath, &t, &e);
    double t_load = now_ms() - t0;
    if (st != KVS_OK) {
        fprintf(stderr, "%s: cannot load: %s\n", name, e.msg);
        return 1;
    }
    size_t inp_len = 0, out_len = 0;
    char *inp = read_all(ipath, &inp_len);
    char *outs = read_all(opath, &out_len);
    if (!inp || !outs) {
        free(inp);
        free(outs);
        kvs_tokenizer_free(t);
        return 1;
    }

    /* test strings: the pieces before each separator (plus a non-empty tail, if any) */
    size_t n_cases = 0, cap = 64;
    char **cases = malloc(cap * sizeof *cases);
    size_t *case_len = malloc(cap * sizeof *case_len);
    for (char *p = inp;;) {
        char *q = strstr(p, SEP);
        size_t l = q ? (size_t)(q - p) : strlen(p);
        if (!q && l == 0) break;
        if (n_cases == cap) {
            cap *= 2;
            cases = realloc(cases, cap * sizeof *cases);
            case_len = realloc(case_len, cap * sizeof *case_len);
        }
        p[l] = '\0'; /* the separator starts with '\n': cut there */
        cases[n_cases] = p;
        case_len[n_cases++] = l;
        if (!q) break;
        p = q + strlen(SEP);
    }
    /* expected lines */
    size_t n_lines = 0;
    char **lines = malloc((out_len + 1) * sizeof *lines);
    for (char *p = outs; *p;) {
        char *nl = strchr(p, '\n');
        if (nl) *nl = '\0';
        lines[n_lines++] = p;
        if (!nl) break;
        p = nl + 1;
    }
    CHECKF(n_lines == n_cases, "%s: %zu test strings in %s but %zu lines in %s", name, n_cases,
           ipath, n_lines, opath);

    int equal = 0, roundtrip = 0;
    double t_tok = 0;
    size_t n = n_cases < n_lines ? n_cases : n_lines;
    int32_t *want = malloc((out_len + 1) * sizeof *want);
    for (size_t i = 0; i < n; i++) {
        int nw = 0;
        for (char *p = lines[i];;) {
            while (*p == ' ') p++;
            if (!*p) break;
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p) {
                fprintf(stderr, "%s: bad id in line %zu of %s\n", name, i + 1, opath);
                break;
            }
            want[nw++] = (int32_t)v;
            p = end;
        }
        int32_t *got = NULL;
        int ng = 0;
        t0 = now_ms();
        st = kvs_tokenizer_encode_ex(t, cases[i], 0, 0, &got, &ng, &e);
        t_tok += now_ms() - t0;
        if (st != KVS_OK) {
            CHECKF(0, "%s: case %zu: %s", name, i, e.msg);
            continue;
        }
        int same = ng == nw && (nw == 0 || memcmp(got, want, (size_t)nw * sizeof *got) == 0);
        equal += same;
        if (!same) {
            fprintf(stderr, "%s: case %zu differs\n  input:    ", name, i);
            print_escaped(stderr, cases[i], case_len[i]);
            fprintf(stderr, "\n  expected: ");
            print_ids(stderr, want, nw);
            fprintf(stderr, "\n  got:      ");
            print_ids(stderr, got, ng);
            fputc('\n', stderr);
        }
        size_t dl = 0;
        char *dec = decode_all(t, got, ng, &dl);
        int rt = dec && dl == case_len[i] && memcmp(dec, cases[i], dl) == 0;
        roundtrip += rt;
        if (!rt) {
            fprintf(stderr, "%s: case %zu does not decode back\n  input:   ", name, i);
            print_escaped(stderr, cases[i], case_len[i]);
            fprintf(stderr, "\n  decoded: ");
            print_escaped(stderr, dec ? dec : "", dec ? dl : 0);
            fputc('\n', stderr);
        }
        free(dec);
        free(got);
    }
    CHECKF(equal == (int)n, "%s: %d of %zu cases equal", name, equal, n);
    CHECKF(roundtrip == (int)n, "%s: %d of %zu cases decode back to the input", name, roundtrip, n);
    printf("%s: %d of %zu cases equal (expected ids: %s); %d of %zu decode back; load %.1f ms, "
           "tokenize %.2f ms\n",
           name, equal, n, strrchr(opath, '/') ? strrchr(opath, '/') + 1 : opath, roundtrip, n,
           t_load, t_tok);
    free(want);
    free(lines);
    free(cases);
    free(case_len);
    free(inp);
    free(outs);
    kvs_tokenizer_free(t);
    return check_summary(name);
}

/* ---------- a small byte-level BPE vocabulary written with the GGUF writer ---------- */

/* ids 0..255: the byte symbols in byte order; then the merges' results; then added tokens. */
enum { ID_GT = 256, ID_HE, ID_GTHE, ID_LL, ID_HELL, ID_USER, ID_CTRL, N_SMALL };

typedef struct {
    const char *pre;          /* NULL: no pre key */
    const char *const *merges;
    int n_merges;             /* -1: no merges key */
    int add_bos;              /* -1: no key */
    int merges_as_u32;
} small_opts;

static const char *const good_merges[] = {"\xc4\xa0 t", "h e", "\xc4\xa0t he", "l l", "he ll"};

static void write_small(const char *path, const small_opts *o)
{
    static char sym[256][4];
    const char *tokens[N_SMALL];
    int32_t types[N_SMALL];
    for (int b = 0; b < 256; b++) {
        int l = kvs_bpe_byte_utf8((unsigned)b, sym[b]);
        sym[b][l] = '\0';
        tokens[b] = sym[b];
        types[b] = KVS_TOKEN_NORMAL;
    }
    tokens[ID_GT] = "\xc4\xa0t";
    tokens[ID_HE] = "he";
    tokens[ID_GTHE] = "\xc4\xa0the";
    tokens[ID_LL] = "ll";
    tokens[ID_HELL] = "hell";
    tokens[ID_USER] = "<user tok>";
    tokens[ID_CTRL] = "<|end|>";
    for (int i = ID_GT; i < ID_USER; i++) types[i] = KVS_TOKEN_NORMAL;
    types[ID_USER] = KVS_TOKEN_USER_DEFINED;
    types[ID_CTRL] = KVS_TOKEN_CONTROL;

    kvs_gguf_writer *w = kvs_gguf_writer_new();
    kvs_gguf_set_str(w, "general.architecture", "llama");
    kvs_gguf_set_str(w, "tokenizer.ggml.model", "gpt2");
    if (o->pre) kvs_gguf_set_str(w, "tokenizer.ggml.pre", o->pre);
    kvs_gguf_set_arr_str(w, "tokenizer.ggml.tokens", tokens, N_SMALL);
    kvs_gguf_set_arr_i32(w, "tokenizer.ggml.token_type", types, N_SMALL);
    if (o->merges_as_u32) {
        uint32_t v[2] = {1, 2};
        kvs_gguf_set_arr(w, "tokenizer.ggml.merges", KVS_GGUF_UINT32, v, 2);
    } else if (o->n_merges >= 0) {
        kvs_gguf_set_arr_str(w, "tokenizer.ggml.merges", o->merges, (uint64_t)o->n_merges);
    }
    kvs_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", ID_CTRL);
    kvs_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", ID_CTRL);
    if (o->add_bos >= 0) kvs_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", o->add_bos);
    kvs_error e;
    if (kvs_gguf_write(w, path, &e)) fprintf(stderr, "write %s: %s\n", path, e.msg);
    kvs_gguf_writer_free(w);
}

static int encode_is(const kvs_tokenizer *t, const char *text, int bos, int special,
                     const int32_t *want, int nw)
{
    int32_t *ids = NULL;
    int n = 0;
    kvs_error e = {0};
    if (kvs_tokenizer_encode_ex(t, text, bos, special, &ids, &n, &e) != KVS_OK) {
        fprintf(stderr, "encode \"%s\": %s\n", text, e.msg);
        return 0;
    }
    int ok = n == nw && (n == 0 || memcmp(ids, want, (size_t)n * sizeof *ids) == 0);
    if (!ok) {
        fprintf(stderr, "encode ");
        print_escaped(stderr, text, strlen(text));
        fprintf(stderr, ": got ");
        print_ids(stderr, ids, n);
        fprintf(stderr, ", want ");
        print_ids(stderr, want, nw);
        fputc('\n', stderr);
    }
    free(ids);
    return ok;
}

static void test_small(const char *path)
{
    small_opts o = {"gpt-2", good_merges, 5, 0, 0};
    write_small(path, &o);
    kvs_tokenizer *t = NULL;
    kvs_error e = {0};
    CHECKF(kvs_tokenizer_load_gguf(path, &t, &e) == KVS_OK, "%s", e.msg);
    if (!t) return;
    CHECK(kvs_tokenizer_is_bpe(t) && kvs_tokenizer_n_vocab(t) == N_SMALL);
    CHECK(kvs_tokenizer_bos(t) == ID_CTRL && kvs_tokenizer_unk(t) == -1);
    CHECK(kvs_tokenizer_add_bos(t) == 0);
    {
        const int32_t w[] = {ID_GTHE};
        CHECK(encode_is(t, " the", 0, 0, w, 1));
        CHECK(encode_is(t, " the", 1, 0, w, 1)); /* add_bos_token false: no BOS */
    }
    {
        const int32_t w[] = {'t', ID_HE};
        CHECK(encode_is(t, "the", 0, 0, w, 2));
    }
    {   /* "hello" -> h e l l o -> he ll (ranks 1, 3) -> hell (4) + o */
        const int32_t w[] = {ID_HELL, 'o'};
        CHECK(encode_is(t, "hello", 0, 0, w, 2));
    }
    {   /* pre-tokenizer: " the the" is two pieces; ' ' before a non-space joins the word */
        const int32_t w[] = {'t', ID_HE, ID_GTHE, ID_GTHE};
        CHECK(encode_is(t, "the the the", 0, 0, w, 4));
    }
    {   /* bytes 0x00-0x20 map to U+0100.. : "\n" is 'Ċ' = id 10 (its byte); invalid UTF-8
         * bytes become U+FFFD (EF BF BD), one per byte */
        const int32_t w[] = {10, 0xEF, 0xBF, 0xBD, 'a', 0xEF, 0xBF, 0xBD, 0xEF, 0xBF, 0xBD};
        CHECK(encode_is(t, "\n\xff" "a\xe2\x96", 0, 0, w, 11));
        const int32_t w2[] = {0xC3, 0xBF}; /* U+00FF, valid: its two bytes */
        CHECK(encode_is(t, "\xc3\xbf", 0, 0, w2, 2));
    }
    {   /* user-defined tokens are always matched, control tokens only with parse_special */
        const int32_t w1[] = {ID_GTHE, ID_USER, ID_HE};
        CHECK(encode_is(t, " the<user tok>he", 0, 0, w1, 3));
        const int32_t w2[] = {'<', '|', 'e', 'n', 'd', '|', '>'};
        CHECK(encode_is(t, "<|end|>", 0, 0, w2, 7));
        const int32_t w3[] = {ID_CTRL, ID_HE};
        CHECK(encode_is(t, "<|end|>he", 0, 1, w3, 2));
    }
    {
        const int32_t w[] = {0};
        CHECK(encode_is(t, "", 0, 0, w, 0));
    }
    /* decoding: byte symbols back to bytes, control tokens to "", no space dropped after BOS */
    int l = -1;
    CHECK(strcmp(kvs_tokenizer_decode(t, ID_CTRL, ID_GTHE, &l), " the") == 0 && l == 4);
    CHECK(strcmp(kvs_tokenizer_decode(t, -1, 10, &l), "\n") == 0 && l == 1);
    const char *p = kvs_tokenizer_decode(t, -1, 0, &l);
    CHECK(l == 1 && p[0] == '\0');
    CHECK(strcmp(kvs_tokenizer_decode(t, -1, ID_CTRL, &l), "") == 0 && l == 0);
    CHECK(strcmp(kvs_tokenizer_decode(t, -1, ID_USER, &l), "<user tok>") == 0 && l == 10);
    CHECK(kvs_tokenizer_find(t, "\xc4\xa0the") == ID_GTHE);
    CHECK(kvs_tokenizer_find(t, "<|end|>") == ID_CTRL);

    /* written back and read again: the same vocabulary and tokenization */
    kvs_gguf_writer *w = kvs_gguf_writer_new();
    CHECK(kvs_tokenizer_to_gguf(t, w) == KVS_OK);
    char path2[600];
    snprintf(path2, sizeof path2, "%s.2.gguf", path);
    CHECKF(kvs_gguf_write(w, path2, &e) == KVS_OK, "%s", e.msg);
    kvs_gguf_writer_free(w);
    kvs_tokenizer *t2 = NULL;
    CHECKF(kvs_tokenizer_load_gguf(path2, &t2, &e) == KVS_OK, "%s", e.msg);
    if (t2) {
        const int32_t w4[] = {ID_HELL, 'o', ID_GTHE, ID_USER};
        CHECK(encode_is(t2, "hello the<user tok>", 0, 0, w4, 4));
        CHECK(kvs_tokenizer_n_vocab(t2) == N_SMALL && kvs_tokenizer_bos(t2) == ID_CTRL);
        for (int i = 0; i < N_SMALL; i++)
            CHECKF(strcmp(kvs_tokenizer_piece(t, i), kvs_tokenizer_piece(t2, i)) == 0 &&
                       kvs_tokenizer_type(t, i) == kvs_tokenizer_type(t2, i),
                   "token %d", i);
    }
    kvs_tokenizer_free(t2);
    remove(path2);
    kvs_tokenizer_free(t);

    /* add_bos_token true: BOS when asked */
    o.add_bos = 1;
    write_small(path, &o);
    CHECKF(kvs_tokenizer_load_gguf(path, &t, &e) == KVS_OK, "%s", e.msg);
    if (t) {
        const int32_t w5[] = {ID_CTRL, ID_GTHE};
        CHECK(encode_is(t, " the", 1, 0, w5, 2));
        CHECK(encode_is(t, " the", 0, 0, w5 + 1, 1));
    }
    kvs_tokenizer_free(t);
}

static void bad_case(const char *path, const char *what, const small_opts *o, kvs_status want,
                     const char *msg1, const char *msg2)
{
    write_small(path, o);
    kvs_tokenizer *t = NULL;
    kvs_error e = {0};
    kvs_status s = kvs_tokenizer_load_gguf(path, &t, &e);
    CHECKF(s == want, "%s: status %d, want %d (%s)", what, s, want, e.msg);
    if (want != KVS_OK) {
        CHECKF(t == NULL, "%s", what);
        CHECKF(strstr(e.msg, msg1) && strstr(e.msg, msg2), "%s: message \"%s\"", what, e.msg);
        printf("%s: %s\n", what, e.msg);
    }
    kvs_tokenizer_free(t);
}

static void test_bad(const char *path)
{
    small_opts o = {"no-such-pre", good_merges, 5, -1, 0};
    bad_case(path, "unknown pre-tokenizer", &o, KVS_ERR_UNSUPPORTED, "\"no-such-pre\"",
             "gpt-2, mpt");
    o.pre = NULL; /* no pre key: "default", accepted */
    bad_case(path, "no pre key", &o, KVS_OK, "", "");
    o.pre = "llama-bpe";
    bad_case(path, "llama-bpe", &o, KVS_OK, "", "");
    static const char *const unknown_left[] = {"\xc4\xa0 t", "zz e"};
    small_opts u = {"gpt-2", unknown_left, 2, -1, 0};
    bad_case(path, "merge with an unknown left token", &u, KVS_ERR_FORMAT,
             "merge 1 \"zz e\"", "\"zz\", which is not a token");
    static const char *const unknown_right[] = {"h e", "he llo"};
    u.merges = unknown_right;
    bad_case(path, "merge with an unknown right token", &u, KVS_ERR_FORMAT,
             "merge 1 \"he llo\"", "\"llo\", which is not a token");
    static const char *const no_space[] = {"h e", "\xc4\xa0t", "l l"};
    u.merges = no_space;
    u.n_merges = 3;
    bad_case(path, "merge without a space", &u, KVS_ERR_FORMAT, "merge 1 \"\xc4\xa0t\"",
             "no space");
    static const char *const leading_space[] = {" e"}; /* the space must follow a first byte */
    u.merges = leading_space;
    u.n_merges = 1;
    bad_case(path, "merge starting with its space", &u, KVS_ERR_FORMAT, "merge 0", "no space");
    static const char *const empty[] = {""};
    u.merges = empty;
    bad_case(path, "empty merge", &u, KVS_ERR_FORMAT, "merge 0", "no space");
    u.n_merges = -1;
    bad_case(path, "no merges", &u, KVS_ERR_FORMAT, "tokenizer.ggml.merges", "missing");
    u.merges_as_u32 = 1;
    bad_case(path, "merges of u32", &u, KVS_ERR_FORMAT, "tokenizer.ggml.merges", "array of u32");
    u.merges_as_u32 = 0;
    u.n_merges = 0; /* no merges at all: every byte its own token */
    bad_case(path, "zero merges", &u, KVS_OK, "", "");
}

/* The arch models' vocabulary (GPT-2's, cut to 2048 tokens): their greedy files give the prompt's
 * ids as llama.cpp tokenized it, BOS only if add_bos_token. */
static void test_arch_prompt(const char *model)
{
    char rel[256], gpath[1024], tpath[1024];
    snprintf(rel, sizeof rel, "models/arch/%s.gguf", model);
    check_shared_path(gpath, sizeof gpath, rel);
    snprintf(rel, sizeof rel, "models/arch/%s.greedy.txt", model);
    check_shared_path(tpath, sizeof tpath, rel);
    if (access(gpath, R_OK) != 0 || access(tpath, R_OK) != 0) {
        printf("%s: not found, skipped\n", gpath);
        return;
    }
    kvs_tokenizer *t = NULL;
    kvs_error e = {0};
    CHECKF(kvs_tokenizer_load_gguf(gpath, &t, &e) == KVS_OK, "%s", e.msg);
    char *txt = read_all(tpath, NULL);
    if (!t || !txt) {
        kvs_tokenizer_free(t);
        free(txt);
        return;
    }
    CHECK(kvs_tokenizer_n_vocab(t) == 2048 && kvs_tokenizer_bos(t) == 2047);
    char *prompt = strstr(txt, "prompt: "), *pids = strstr(txt, "prompt_ids: ");
    CHECK(prompt && pids);
    if (prompt && pids) {
        prompt += strlen("prompt: ");
        *strchr(prompt, '\n') = '\0';
        int32_t want[256];
        int nw = 0;
        char *p = pids + strlen("prompt_ids: ");
        for (char *end; nw < 256; p = end) {
            long v = strtol(p, &end, 10);
            if (end == p) break;
            want[nw++] = (int32_t)v;
        }
        CHECKF(encode_is(t, prompt, 1, 0, want, nw), "%s: prompt \"%s\"", model, prompt);
        printf("%s: prompt \"%s\" -> %d ids as in its greedy file (add_bos_token %d)\n", model,
               prompt, nw, kvs_tokenizer_add_bos(t));
    }
    free(txt);
    kvs_tokenizer_free(t);
}

/* ids of text (no BOS) into want[*nw...], for building expected sequences */
static void append_ids(const kvs_tokenizer *t, const char *text, int32_t *want, int *nw)
{
    int32_t *ids = NULL;
    int n = 0;
    kvs_error e = {0};
    CHECKF(kvs_tokenizer_encode(t, text, 0, &ids, &n, &e) == KVS_OK, "%s", e.msg);
    for (int i = 0; i < n && *nw < 64; i++) want[(*nw)++] = ids[i];
    free(ids);
}

/* Special-token parsing (kvs_tokenizer_encode_ex with parse_special) on SentencePiece and
 * byte-level BPE vocabularies: a control token's text becomes its id, each stretch between is
 * tokenized on its own (SentencePiece: with the dummy-prefix space after a marker, as llama.cpp),
 * and parse_special 0 gives exactly kvs_tokenizer_encode's ids with no control token. */
static void test_parse_special(void)
{
    static const struct {
        const char *vocab, *text;
        int32_t m1, m2;       /* the markers' ids in text order */
        const char *between;  /* the text between them, tokenized alone */
        int bos;
    } cases[] = {
        {"models/vocab/ggml-vocab-llama-spm.gguf", "<s>Hello world</s>", 1, 2, "Hello world", 0},
        {"models/vocab/ggml-vocab-phi-3.gguf", "<|user|>\nhi there<|end|>", 32010, 32007,
         "\nhi there", 1},
        {"models/vocab/ggml-vocab-gpt-2.gguf", "<|endoftext|>Hello world<|endoftext|>", 50256,
         50256, "Hello world", 0},
        {"models/arch/qwen2-f32.gguf", "<|endoftext|>user\nhi<|endoftext|>", 2047, 2047,
         "user\nhi", 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char path[1024];
        check_shared_path(path, sizeof path, cases[c].vocab);
        if (access(path, R_OK) != 0) {
            printf("%s: not found, skipped\n", path);
            continue;
        }
        kvs_tokenizer *t = NULL;
        kvs_error e = {0};
        CHECKF(kvs_tokenizer_load_gguf(path, &t, &e) == KVS_OK, "%s", e.msg);
        if (!t) continue;
        int32_t want[64];
        int nw = 0;
        if (cases[c].bos && kvs_tokenizer_add_bos(t)) want[nw++] = kvs_tokenizer_bos(t);
        want[nw++] = cases[c].m1;
        append_ids(t, cases[c].between, want, &nw);
        want[nw++] = cases[c].m2;
        CHECKF(encode_is(t, cases[c].text, cases[c].bos, 1, want, nw), "%s", cases[c].vocab);
        /* without parsing: the old result, the markers spelled out as text */
        int32_t *old = NULL, *ex = NULL;
        int n_old = 0, n_ex = 0;
        kvs_tokenizer_encode(t, cases[c].text, cases[c].bos, &old, &n_old, &e);
        kvs_tokenizer_encode_ex(t, cases[c].text, cases[c].bos, 0, &ex, &n_ex, &e);
        int ctrl = 0;
        for (int i = cases[c].bos; i < n_ex; i++)
            ctrl |= kvs_tokenizer_type(t, ex[i]) == KVS_TOKEN_CONTROL;
        CHECKF(old && ex && n_old == n_ex && !memcmp(old, ex, sizeof *ex * (size_t)n_ex) &&
               !ctrl && n_ex > nw, "%s: parse_special 0", cases[c].vocab);
        printf("%s: \"%s\" -> %d ids with special-token parsing, %d without\n", cases[c].vocab,
               cases[c].text, nw, n_ex);
        free(old);
        free(ex);
        kvs_tokenizer_free(t);
    }
}

int main(int argc, char **argv)
{
    if (argc >= 2) return run_vocab(argv[1], argc >= 3 ? argv[2] : NULL);
    char path[512], name[64];
    snprintf(name, sizeof name, "kvs_vocab_%d.gguf", (int)getpid());
    check_tmp_path(path, sizeof path, name);
    test_small(path);
    test_bad(path);
    remove(path);
    test_arch_prompt("llama3-f32");
    test_arch_prompt("qwen2-f32");
    test_parse_special();
    return check_summary("test_vocab");
}
