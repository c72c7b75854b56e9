/* Fuzzes the llama2.c importers: the checkpoint reader (kvs_llama2c_sniff, and the header and
 * tensor checks of kvs_llama2c_convert_dup_to, which then writes a GGUF) and the tokenizer.bin
 * reader (kvs_tokenizer_load_llama2c, and its _n variant the conversion uses). A conversion that
 * succeeds must give a file kvs_model_load accepts: a GGUF the loader refuses means the two
 * disagree on what a valid model is, and the harness aborts. Other errors are expected; a crash,
 * a leak, a hang or an out-of-memory is a bug.
 *
 * Input layout: byte 0 picks the weight type to write (kvs_wtype_parse's names, modulo their
 * count), bytes 1-4 are the checkpoint's length n (little-endian, cut to what the input holds),
 * then n bytes of checkpoint, then the tokenizer file (the rest). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvslim.h"
#include "model/llama.h"
#include "model/llama_write.h"
#include "tokenizer/tokenizer.h"

/* The readers take paths: each part goes to its own temporary file, made once per process,
 * unlinked at once and opened through /proc/self/fd (as fuzz_gguf.c does), so that nothing is
 * left behind even when libFuzzer stops on a crash. */
typedef struct tmpin {
    int fd;
    char path[64];
} tmpin;

static tmpin g_ckpt = {-1, ""}, g_tok = {-1, ""};
/* The GGUF the conversion writes goes through a rename (core/outfile.h), so it needs a real
 * directory: one per process, removed at exit (a crash leaves it in /tmp). */
static char g_dir[64], g_out[96];

static void remove_dir(void)
{
    unlink(g_out);
    rmdir(g_dir);
}

static void setup(void)
{
    tmpin *t[2] = {&g_ckpt, &g_tok};
    for (int i = 0; i < 2; i++) {
        char tmpl[] = "/tmp/kvs_fuzz_llama2c_XXXXXX";
        t[i]->fd = mkstemp(tmpl);
        if (t[i]->fd < 0) {
            perror("fuzz_llama2c: mkstemp");
            abort();
        }
        unlink(tmpl);
        snprintf(t[i]->path, sizeof t[i]->path, "/proc/self/fd/%d", t[i]->fd);
    }
    snprintf(g_dir, sizeof g_dir, "/tmp/kvs_fuzz_llama2c_out_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("fuzz_llama2c: mkdtemp");
        abort();
    }
    snprintf(g_out, sizeof g_out, "%s/out.gguf", g_dir);
    atexit(remove_dir);
}

static int put(tmpin *t, const uint8_t *data, size_t size)
{
    if (ftruncate(t->fd, 0) != 0)
        return -1;
    size_t done = 0;
    while (done < size) {
        ssize_t w = pwrite(t->fd, data + done, size - done, (off_t)done);
        if (w <= 0)
            return -1;
        done += (size_t)w;
    }
    return 0;
}

/* Uses a tokenizer the reader accepted once: tokenize a fixed text, decode every id, and look
 * at every piece (ASan checks the lengths the reader recorded). */
static void use_tokenizer(const kvs_tokenizer *t)
{
    kvs_error err = {0};
    int32_t *ids = NULL;
    int n = 0;
    volatile uint32_t sink = 0;
    if (kvs_tokenizer_encode_ex(t, "Once upon a time, <s> \xe2\x96\x81 \xff!", 1, 1, &ids, &n,
                                &err) == KVS_OK)
        for (int i = 0; i < n; i++) {
            int len = 0;
            const char *s = kvs_tokenizer_decode(t, i ? ids[i - 1] : -1, ids[i], &len);
            if (s && len > 0)
                sink += (uint8_t)s[len - 1];
        }
    free(ids);
    int nv = kvs_tokenizer_n_vocab(t);
    for (int i = 0; i < nv; i++) {
        const char *p = kvs_tokenizer_piece(t, i);
        if (p)
            sink += (uint8_t)p[strlen(p)];
    }
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const wtypes[] = {"f32", "f16", "bf16", "q8_0", "q4_0",
                                         "q4_k", "q5_k", "q6_k", "q4_k_m", "q5_k_m"};
    if (g_ckpt.fd < 0)
        setup();
    if (size < 5)
        return 0;
    kvs_wtype wt;
    if (kvs_wtype_parse(wtypes[data[0] % (sizeof wtypes / sizeof *wtypes)], &wt) != 0)
        abort();
    size_t n_ckpt = (size_t)data[1] | (size_t)data[2] << 8 | (size_t)data[3] << 16 |
                    (size_t)data[4] << 24;
    data += 5;
    size -= 5;
    if (n_ckpt > size)
        n_ckpt = size;
    if (put(&g_ckpt, data, n_ckpt) != 0 || put(&g_tok, data + n_ckpt, size - n_ckpt) != 0)
        return 0;

    kvs_error err = {0};
    kvs_tokenizer *tok = NULL;
    if (kvs_tokenizer_load_llama2c(g_tok.path, &tok, &err) == KVS_OK) {
        use_tokenizer(tok);
        kvs_tokenizer_free(tok);
    }
    (void)kvs_llama2c_sniff(g_ckpt.path);

    kvs_outfile_spec out = {.path = g_out};
    if (kvs_llama2c_convert_to(g_ckpt.path, g_tok.path, wt, &out, NULL, &err) == KVS_OK) {
        kvs_model *m = NULL;
        if (kvs_model_load(g_out, &m, &err) != KVS_OK) {
            fprintf(stderr, "fuzz_llama2c: a converted checkpoint does not load: %s\n", err.msg);
            abort();
        }
        kvs_model_free(m);
        unlink(g_out);
    }
    return 0;
}
