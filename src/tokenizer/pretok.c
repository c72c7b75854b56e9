/* Pre-tokenizer of byte-level BPE vocabularies: the regex lists tokenizer.ggml.pre names (PCRE2).
 *
 * The lists are those llama.cpp uses for each name (documented in shared/models/vocab/README.md);
 * the expressions themselves are the vocabularies' Hugging Face pre-tokenizer patterns. They are
 * compiled with PCRE2 in UTF mode with Unicode properties (\p{L}, \p{N}, \p{P} are Unicode general
 * categories, \s is Unicode white space), once per tokenizer, and JIT-compiled where PCRE2 has a
 * JIT. PCRE2_MATCH_INVALID_UTF lets invalid UTF-8 through: such bytes match no item, so they stay
 * in the stretches between matches (the tokenizer replaces them by U+FFFD before it gets here,
 * but the splitter does not depend on it). PCRE2_DOLLAR_ENDONLY
 * gives `$` the meaning it has in the ECMAScript and Python engines the patterns come from (the
 * end of the piece only, not before a final newline). */
#include "tokenizer/pretok.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#define MAX_RE 8

/* GPT-2's pattern (without the final `|\s+` of the original: llama.cpp leaves it out, and a
 * whitespace stretch it would match is kept as a piece anyway). */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
/* Llama 3's pattern with the case-insensitive contractions written out; Qwen2's differs only in
 * taking digits one at a time. */
#define RE_LLAMA3_HEAD "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
#define RE_LLAMA3_TAIL "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_CJK "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"

static const char *const re_gpt2[] = {RE_GPT2, NULL};
static const char *const re_llama3[] = {RE_LLAMA3_HEAD "\\p{N}{1,3}" RE_LLAMA3_TAIL, NULL};
static const char *const re_qwen2[] = {RE_LLAMA3_HEAD "\\p{N}" RE_LLAMA3_TAIL, NULL};
static const char *const re_starcoder[] = {"\\p{N}", RE_GPT2, NULL};
static const char *const re_falcon[] = {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]",
                                        NULL};
static const char *const re_default[] = {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+",
                                         "[0-9][0-9][0-9]", NULL};
/* DeepSeek LLM's letter class lists cased-letter ranges by code point. Written with \x{...}
 * escapes: copies of it in UTF-8 text are often NFC-normalised, which turns U+1F7D, U+1FD3,
 * U+1FDB, U+1FBE, U+2126 and U+212A into other code points and reverses three ranges. */
static const char *const re_deepseek_llm[] = {
    "[\\r\\n]",
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"
    "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}"
    "\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}"
    "\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}"
    "\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}"
    "\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}"
    "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}"
    "\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}"
    "\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}"
    "\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}"
    "\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}"
    "\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}"
    "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}"
    "\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}"
    "\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}"
    "\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+",
    "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
    "\\s+$",
    RE_CJK,
    "\\p{N}+",
    NULL,
};
static const char *const re_deepseek_coder[] = {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK,
                                                "\\p{N}", NULL};

typedef struct {
    const char *name;
    const char *const *re;
    int ignore_merges;
} pretok_def;

/* "gpt-neox" is not a name llama.cpp knows (its GPT-NeoX vocab has no pre key, and then gets
 * "default"), but GPT-NeoX-20B's Hugging Face tokenizer is the GPT-2 byte-level one, as "mpt". */
static const pretok_def defs[] = {
    {"default", re_default, 0},
    {"gpt-2", re_gpt2, 0},
    {"mpt", re_gpt2, 0},
    {"gpt-neox", re_gpt2, 0},
    {"llama-bpe", re_llama3, 1},
    {"llama3", re_llama3, 1},
    {"llama-v3", re_llama3, 1},
    {"qwen2", re_qwen2, 0},
    {"deepseek-llm", re_deepseek_llm, 0},
    {"deepseek-coder", re_deepseek_coder, 0},
    {"falcon", re_falcon, 0},
    {"starcoder", re_starcoder, 0},
    {"refact", re_starcoder, 0},
};

#define SUPPORTED                                                                               \
    "default, gpt-2, mpt, gpt-neox, llama-bpe, llama3, llama-v3, qwen2, deepseek-llm, "         \
    "deepseek-coder, falcon, starcoder, refact"

struct kvs_pretok {
    char name[64];
    int n_re;
    int ignore_merges;
    pcre2_code *re[MAX_RE];
};

const char *kvs_pretok_supported(void) { return SUPPORTED; }
const char *kvs_pretok_name(const kvs_pretok *p) { return p ? p->name : ""; }
int kvs_pretok_ignore_merges(const kvs_pretok *p) { return p ? p->ignore_merges : 0; }

void kvs_pretok_free(kvs_pretok *p)
{
    if (!p) return;
    for (int i = 0; i < p->n_re; i++) pcre2_code_free(p->re[i]);
    free(p);
}

kvs_status kvs_pretok_new(const char *name, size_t name_len, kvs_pretok **out, kvs_error *err)
{
    if (out) *out = NULL;
    if (!name || !out) return kvs_fail(err, KVS_ERR_ARG, "pre-tokenizer: NULL name or output");
    const pretok_def *d = NULL;
    for (size_t i = 0; i < sizeof defs / sizeof *defs; i++)
        if (strlen(defs[i].name) == name_len && memcmp(defs[i].name, name, name_len) == 0)
            d = &defs[i];
    if (!d)
        return kvs_fail(err, KVS_ERR_UNSUPPORTED,
                        "tokenizer: key tokenizer.ggml.pre is \"%.*s\": this pre-tokenizer is not "
                        "supported (supported: " SUPPORTED ")",
                        (int)(name_len > 64 ? 64 : name_len), name);

    kvs_pretok *p = calloc(1, sizeof *p);
    if (!p) return kvs_fail(err, KVS_ERR_NOMEM, "pre-tokenizer: out of memory");
    memcpy(p->name, name, name_len); /* name_len < sizeof p->name: it matched a table entry */
    p->ignore_merges = d->ignore_merges;
    for (int i = 0; d->re[i]; i++) {
        if (i >= MAX_RE) {
            kvs_pretok_free(p);
            return kvs_fail(err, KVS_ERR_UNSUPPORTED, "pre-tokenizer %s: too many expressions",
                            d->name);
        }
        int ec = 0;
        PCRE2_SIZE eo = 0;
        pcre2_code *c = pcre2_compile((PCRE2_SPTR)d->re[i], PCRE2_ZERO_TERMINATED,
                                      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF |
                                          PCRE2_DOLLAR_ENDONLY,
                                      &ec, &eo, NULL);
        if (!c) {
            PCRE2_UCHAR msg[160];
            if (pcre2_get_error_message(ec, msg, sizeof msg) < 0) strcpy((char *)msg, "?");
            kvs_pretok_free(p);
            if (ec == PCRE2_ERROR_NOMEMORY)
                return kvs_fail(err, KVS_ERR_NOMEM, "pre-tokenizer %s: out of memory", d->name);
            return kvs_fail(err, KVS_ERR_UNSUPPORTED,
                            "pre-tokenizer %s: expression %d does not compile with this PCRE2 "
                            "(at offset %zu: %s)",
                            d->name, i + 1, (size_t)eo, (const char *)msg);
        }
        p->re[p->n_re++] = c;
        /* Without a JIT (or if it fails), pcre2_match interprets the pattern: same results. */
        (void)pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);
    }
    *out = p;
    return KVS_OK;
}

static int spans_push(kvs_spans *s, size_t off, size_t len)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        if (cap > SIZE_MAX / sizeof *s->v) return -1;
        kvs_span *v = realloc(s->v, cap * sizeof *v);
        if (!v) return -1;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (kvs_span){off, len};
    return 0;
}

/* Splits piece sp by re, appending the matches and the stretches between them to dst. */
static kvs_status split_one(const kvs_pretok *p, int ri, const char *text, kvs_span sp,
                            pcre2_match_data *md, kvs_spans *dst, kvs_error *err)
{
    const pcre2_code *re = p->re[ri];
    PCRE2_SPTR subj = (PCRE2_SPTR)(text + sp.off);
    size_t pos = 0, last = 0;
    while (pos < sp.len) {
        int rc = pcre2_match(re, subj, sp.len, pos, 0, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* the interpreter keeps its frames on the heap */
            rc = pcre2_match(re, subj, sp.len, pos, PCRE2_NO_JIT, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            if (pcre2_get_error_message(rc, msg, sizeof msg) < 0) strcpy((char *)msg, "?");
            return kvs_fail(err, rc == PCRE2_ERROR_NOMEMORY ? KVS_ERR_NOMEM : KVS_ERR_ARG,
                            "pre-tokenizer %s: expression %d failed on a piece of %zu bytes at "
                            "byte %zu: %s",
                            p->name, ri + 1, sp.len, sp.off, (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) { /* an empty match (none of the lists has one): step over a character */
            pos = ms + 1;
            while (pos < sp.len && (subj[pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        if (ms > last && spans_push(dst, sp.off + last, ms - last)) goto nomem;
        if (spans_push(dst, sp.off + ms, me - ms)) goto nomem;
        last = pos = me;
    }
    if (last < sp.len && spans_push(dst, sp.off + last, sp.len - last)) goto nomem;
    return KVS_OK;
nomem:
    return kvs_fail(err, KVS_ERR_NOMEM, "pre-tokenizer: out of memory");
}

kvs_status kvs_pretok_split(const kvs_pretok *p, const char *text, size_t len, kvs_spans *out,
                            kvs_error *err)
{
    if (!p || (!text && len) || !out)
        return kvs_fail(err, KVS_ERR_ARG, "pre-tokenizer: NULL argument");
    if (len == 0) return KVS_OK;
    kvs_status s = KVS_OK;
    kvs_spans a = {0}, b = {0};
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md || spans_push(&a, 0, len)) goto nomem;
    for (int ri = 0; ri < p->n_re; ri++) {
        b.n = 0;
        for (size_t i = 0; i < a.n; i++)
            if ((s = split_one(p, ri, text, a.v[i], md, &b, err))) goto done;
        kvs_spans t = a;
        a = b;
        b = t;
    }
    for (size_t i = 0; i < a.n; i++)
        if (spans_push(out, a.v[i].off, a.v[i].len)) goto nomem;
    goto done;
nomem:
    s = kvs_fail(err, KVS_ERR_NOMEM, "pre-tokenizer: out of memory splitting %zu bytes", len);
done:
    pcre2_match_data_free(md);
    free(a.v);
    free(b.v);
    return s;
}
