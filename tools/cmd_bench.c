/* kvslim bench: prefill and decode speed on a model file or a synthetic model. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_flags.h"
#include "kvslim_tools.h"

static const cli_command bench_cmd = {
    "bench", CMD_BENCH,
    "usage: kvslim bench (-m MODEL | --synthetic SHAPE) [options]\n"
    "\n"
    "Times a prompt of random tokens (prefill) and then decoding one token at a time, after one\n"
    "untimed warm-up run of both on the same session (as llama-bench does).\n",
    NULL};

typedef struct shape {
    kvs_hparams hp;
    kvs_wtype wt;
} shape;

static const struct {
    const char *key;
    size_t off;
    int max;
} shape_ints[] = {
    {"dim", offsetof(kvs_hparams, dim), 1 << 16},
    {"hidden", offsetof(kvs_hparams, hidden), 1 << 18},
    {"layers", offsetof(kvs_hparams, n_layers), 1024},
    {"heads", offsetof(kvs_hparams, n_heads), 1024},
    {"kv_heads", offsetof(kvs_hparams, n_kv_heads), 1024},
    {"vocab", offsetof(kvs_hparams, vocab), 1 << 20},
    {"ctx", offsetof(kvs_hparams, ctx), 1 << 22},
};
#define N_SHAPE_INTS (sizeof shape_ints / sizeof shape_ints[0])

/* One key=value of a shape; seen[] marks the keys already given (index N_SHAPE_INTS: type). */
static int shape_item(const char *cmd, const char *key, const char *val, shape *s, int *seen)
{
    size_t k = 0;
    while (k < N_SHAPE_INTS && strcmp(key, shape_ints[k].key))
        k++;
    if (k == N_SHAPE_INTS && strcmp(key, "type")) {
        cli_error(cmd, "--synthetic: unknown key '%s' (accepted: dim, hidden, layers, heads, "
                       "kv_heads, vocab, ctx, type)", key);
        return -1;
    }
    if (seen[k]++) {
        cli_error(cmd, "--synthetic: %s given twice", key);
        return -1;
    }
    if (k == N_SHAPE_INTS) {
        if (kvs_wtype_parse(val, &s->wt) != 0) {
            cli_error(cmd, "--synthetic type: unknown type '%s' (" KVS_WTYPE_NAMES ")", val);
            return -1;
        }
        return 0;
    }
    int64_t v;
    if (kvs_parse_i64(val, 1, shape_ints[k].max, &v) != 0) {
        char hi[32];
        cli_error(cmd, "--synthetic %s expects a whole number in [1, %s], got '%s'", key,
                  kvs_format_number(hi, sizeof hi, shape_ints[k].max), val);
        return -1;
    }
    *(int *)((char *)&s->hp + shape_ints[k].off) = (int)v;
    return 0;
}

static int parse_shape(const char *cmd, const char *spec, shape *s)
{
    memset(s, 0, sizeof *s);
    s->hp.dim = 768, s->hp.hidden = 2048, s->hp.n_layers = 12, s->hp.n_heads = 12;
    s->hp.n_kv_heads = -1, s->hp.vocab = 512, s->hp.ctx = 0;
    s->wt = KVS_WTYPE(KVS_F32);
    int seen[N_SHAPE_INTS + 1] = {0};
    for (const char *p = spec;;) {
        size_t len = strcspn(p, ","), klen = strcspn(p, "=");
        char key[32], val[64];
        if (klen >= len) {
            cli_error(cmd, "--synthetic: '%.*s' is not key=value", (int)len, p);
            return -1;
        }
        snprintf(key, sizeof key, "%.*s", (int)klen, p);
        snprintf(val, sizeof val, "%.*s", (int)(len - klen - 1), p + klen + 1);
        if (shape_item(cmd, key, val, s, seen) != 0)
            return -1;
        p += len;
        if (!*p++)
            break;
    }
    if (s->hp.n_kv_heads < 0)
        s->hp.n_kv_heads = s->hp.n_heads;
    return 0;
}

static unsigned rand_next(unsigned *state)
{
    *state = *state * 1664525u + 1013904223u;
    return *state >> 8;
}

static int bench(const cli_args *a)
{
    const char *cmd = "bench", *model_path = a->str[FL_MODEL], *synthetic = a->str[FL_SYNTHETIC],
               *save = a->str[FL_SAVE], *json = a->str[FL_JSON];
    kvs_session_params params;
    int n_prompt = cli_get_int(a, FL_N_PROMPT, 512), n_gen = cli_get_int(a, FL_N_GEN, 128),
        reps = cli_get_int(a, FL_REPS, 1);
    if (cli_session_params(a, &params) != 0)
        return CLI_USAGE;
    if (!model_path == !synthetic) {
        cli_error(cmd, "needs exactly one of -m MODEL or --synthetic SHAPE (see --help)");
        return CLI_USAGE;
    }
    if (save && !synthetic) {
        cli_error(cmd, "--save only applies to --synthetic");
        return CLI_USAGE;
    }
    const kvs_outfile_input inputs[] = {{"-m", model_path}};
    kvs_outfile_spec json_out = cli_output("--json", json, inputs, 1),
                     save_out = cli_output("--save", save, NULL, 0);
    kvs_outfile_kind save_kind = KVS_OUTFILE_NEW;
    if ((json && cli_check_output(cmd, &json_out, NULL) != 0) ||
        (save && cli_check_output(cmd, &save_out, &save_kind) != 0))
        return CLI_FAIL;
    /* A FIFO or device cannot be loaded back: the model goes to a private file, then to it. */
    const int save_through = save && save_kind == KVS_OUTFILE_THROUGH;

    const int threads = params.n_threads;
    kvs_error err = {0};
    kvs_status st = KVS_OK;
    char tmp_path[4096] = "";
    const char *label = model_path;
    if (synthetic) {
        shape sh;
        if (parse_shape(cmd, synthetic, &sh) != 0)
            return CLI_USAGE;
        if (sh.hp.ctx == 0)
            sh.hp.ctx = n_prompt + n_gen > 2048 ? n_prompt + n_gen : 2048;
        if (!save || save_through) {
            const char *dir = getenv("TMPDIR");
            snprintf(tmp_path, sizeof tmp_path, "%s/kvslim-synthetic-%d.gguf",
                     dir && *dir ? dir : "/tmp", (int)getpid());
        }
        model_path = save && !save_through ? save : tmp_path;
        kvs_outfile_spec model_out = save && !save_through ? save_out
                                                           : cli_output(NULL, tmp_path, NULL, 0);
        label = synthetic;
        if (isatty(STDERR_FILENO))
            fprintf(stderr, "writing synthetic model %s ...\n", model_path);
        if (kvs_synthetic_write_to(&sh.hp, sh.wt, 1234, &model_out, stderr, &err) != KVS_OK) {
            cli_error(cmd, "%s", err.msg);
            return CLI_FAIL;
        }
        if (tmp_path[0])
            cli_temp_track(NULL, tmp_path, 1);
        if (save_through && cli_copy_to_output(cmd, &save_out, tmp_path) != 0) {
            unlink(tmp_path);
            cli_temp_track(NULL, tmp_path, 0);
            return CLI_FAIL;
        }
    }
    kvs_model *m = NULL;
    kvs_session *s = NULL;
    int32_t *tokens = NULL;
    int rc = CLI_FAIL;
    st = kvs_model_load(model_path, &m, &err);
    if (tmp_path[0]) {
        unlink(tmp_path); /* the mapping stays valid */
        cli_temp_track(NULL, tmp_path, 0);
    }
    if (st != KVS_OK)
        goto fail;
    kvs_model_info info;
    kvs_model_get_info(m, &info);
    if (n_prompt + n_gen > info.n_ctx) {
        st = kvs_fail(&err, KVS_ERR_ARG, "%s %d plus %s %d exceed the model's context of %d tokens",
                      a->given[FL_N_PROMPT] ? a->as[FL_N_PROMPT] : "-p", n_prompt,
                      a->given[FL_N_GEN] ? a->as[FL_N_GEN] : "-n", n_gen, info.n_ctx);
        goto fail;
    }
    if ((st = kvs_session_new(m, &params, &s, &err)) != KVS_OK)
        goto fail;
    if (!(tokens = malloc(sizeof(int32_t) * (size_t)(n_prompt + n_gen)))) {
        snprintf(err.msg, sizeof err.msg, "out of memory");
        goto fail;
    }
    unsigned state = 7;
    for (int i = 0; i < n_prompt + n_gen; i++)
        tokens[i] = (int32_t)(rand_next(&state) % (unsigned)info.n_vocab);

    /* Warm-up, as llama-bench's: the whole run once on the measured session, untimed, then
     * reset (which keeps the allocations), so the weights are paged in and the KV memory and
     * scratch buffers are touched before the timing; otherwise the first repetition would time
     * page faults that an engine preallocating its cache pays at start-up. */
    cli_progress("warm-up", 0, 1);
    if ((st = kvs_session_eval(s, tokens, n_prompt, NULL, 0, &err)) != KVS_OK)
        goto fail;
    for (int g = 0; g < n_gen; g++)
        if ((st = kvs_session_eval(s, tokens + n_prompt + g, 1, NULL, 0, &err)) != KVS_OK)
            goto fail;
    double sum_prefill = 0, sum_decode = 0, sum_attn_share = 0, sum_hook_share = 0;
    size_t kv_bytes = 0, kv_peak = 0;
    char report[10240] = "[]"; /* the policy's report lines of the last repetition, as JSON */
    for (int r = 0; r < reps; r++) {
        kvs_session_reset(s);
        cli_progress("prefill", r, reps);
        double t0 = cli_now();
        if ((st = kvs_session_eval(s, tokens, n_prompt, NULL, 0, &err)) != KVS_OK)
            goto fail;
        double t1 = cli_now();
        sum_hook_share += kvs_kv_prefill_hook_seconds(kvs_session_kv(s)) / (t1 - t0);
        for (int g = 0; g < n_gen; g++) {
            cli_progress("decode", g, n_gen);
            if ((st = kvs_session_eval(s, tokens + n_prompt + g, 1, NULL, 0, &err)) != KVS_OK)
                goto fail;
        }
        double t2 = cli_now();
        sum_prefill += n_prompt / (t1 - t0);
        if (n_gen) {
            sum_decode += n_gen / (t2 - t1);
            sum_attn_share += kvs_kv_decode_seconds(kvs_session_kv(s)) / (t2 - t1);
        }
        kv_bytes = kvs_session_kv_bytes(s);
        kv_peak = kvs_session_kv_peak_bytes(s);
        char line[512]; /* the policy's own per-step costs, if it measures any */
        size_t rlen = (size_t)snprintf(report, sizeof report, "[");
        for (int i = 0; i < 8; i++)
            if (kvs_session_policy_report(s, i, line, sizeof line) == 0) {
                cli_progress_end();
                fprintf(stderr, "%s\n", line);
                char esc[1024];
                if (rlen < sizeof report)
                    rlen += (size_t)snprintf(report + rlen, sizeof report - rlen, "%s\"%s\"",
                                             rlen > 1 ? ", " : "",
                                             cli_json_escape(esc, sizeof esc, line));
            }
        if (rlen < sizeof report)
            snprintf(report + rlen, sizeof report - rlen, "]");
    }
    cli_progress_end();
    double prefill = sum_prefill / reps, decode = sum_decode / reps,
           attn_share = sum_attn_share / reps, hook_share = sum_hook_share / reps;
    const char *kv_spec = params.kv_policy ? params.kv_policy : "full",
               *kv_type = params.kv_type ? params.kv_type : "f32";
    size_t rss = cli_peak_rss();
    char kvb[32], kvp[32], rssb[32], wb[32];
    printf("| model | params | weights | KV policy | KV type | threads | n_prompt | n_gen | "
           "prefill tok/s | prefill time in policy hooks | decode tok/s | decode time in KV layer | "
           "KV bytes (peak) | peak RSS |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    printf("| %s | %.1fM | %s %s | %s | %s | %d | %d | %d | %.1f | %.1f%% | %.1f | %.1f%% | %s (%s) "
           "| %s |\n",
           label, info.n_params / 1e6, info.weight_type,
           cli_bytes(wb, sizeof wb, (double)info.weight_bytes), kv_spec, kv_type, threads,
           n_prompt, n_gen, prefill, 100 * hook_share, decode, 100 * attn_share,
           cli_bytes(kvb, sizeof kvb, (double)kv_bytes), cli_bytes(kvp, sizeof kvp, (double)kv_peak),
           cli_bytes(rssb, sizeof rssb, (double)rss));
    if (json) {
        char buf[16384], jl[1024], jk[512];
        int len = snprintf(buf, sizeof buf,
                           "{\"model\": \"%s\", \"weight_type\": \"%s\", \"n_params\": %lld, "
                           "\"kv\": \"%s\", \"kv_type\": \"%s\", "
                           "\"threads\": %d, \"n_prompt\": %d, \"n_gen\": %d, "
                           "\"prefill_tok_s\": %.3f, \"decode_tok_s\": %.3f, "
                           "\"decode_kv_share\": %.4f, \"prefill_policy_share\": %.4f, \"kv_bytes\": %zu, \"kv_bytes_peak\": %zu, "
                           "\"peak_rss_bytes\": %zu, \"policy_report\": %s}\n",
                           cli_json_escape(jl, sizeof jl, label), info.weight_type,
                           (long long)info.n_params, cli_json_escape(jk, sizeof jk, kv_spec),
                           kv_type, threads, n_prompt, n_gen, prefill, decode, attn_share,
                           hook_share, kv_bytes, kv_peak, rss, report);
        if (cli_write_output(cmd, &json_out, buf, (size_t)len) != 0) {
            err.msg[0] = 0;
            goto fail;
        }
    }
    rc = CLI_OK;
fail:
    cli_progress_end();
    if (rc != CLI_OK && err.msg[0]) {
        cli_error(cmd, "%s", err.msg);
        rc = cli_status_exit(st);
    }
    free(tokens);
    kvs_session_free(s);
    kvs_model_free(m);
    return rc;
}

int cmd_bench(int argc, char **argv) { return cli_main(&bench_cmd, bench, argc, argv); }
