/* generate: kvslim as a library. Loads a GGUF model, tokenizes a prompt, runs a session whose
 * KV cache is held by a compression policy, samples greedily with the public sampler, and
 * prints the prompt and the generated text to stdout, then the KV bytes held to stderr.
 *
 *   generate MODEL.gguf PROMPT [KV_POLICY]     (KV_POLICY e.g. streaming:slots=24; default full)
 *
 * Greedy sampling (temperature 0) prints what `kvslim run --temp 0 --kv-type f16` prints. Only
 * <kvslim.h> is used: build with
 *   cc generate.c $(pkg-config --cflags --libs kvslim)
 * or with examples/CMakeLists.txt (find_package(kvslim)). */
#include <stdio.h>
#include <stdlib.h>

#include <kvslim.h>

enum { N_PREDICT = 64 };

int main(int argc, char **argv)
{
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT [KV_POLICY]\n", argv[0]);
        return 2;
    }
    kvs_error err = {0};
    kvs_model *model = NULL;
    kvs_session *session = NULL;
    kvs_sampler *sampler = NULL;
    int32_t *prompt = NULL;
    float *logits = NULL;
    int n_prompt = 0, n_gen = 0, rc = 1;

    if (kvs_model_load(argv[1], &model, &err) != KVS_OK)
        goto done;
    kvs_model_info info;
    kvs_model_get_info(model, &info);
    if (kvs_tokenize(model, argv[2], 1, &prompt, &n_prompt, &err) != KVS_OK)
        goto done;

    kvs_session_params sp = kvs_session_default_params();
    sp.n_threads = 2;
    sp.kv_policy = argc == 4 ? argv[3] : NULL; /* NULL: the full cache */
    sp.kv_type = "f16";                        /* half the bytes of f32 per slot */
    if (kvs_session_new(model, &sp, &session, &err) != KVS_OK)
        goto done;

    kvs_sampler_params smp = kvs_sampler_default_params();
    smp.temperature = 0.0f; /* greedy; keep the defaults (0.8, top-k 40, top-p 0.95) to sample */
    if (kvs_sampler_new(info.n_vocab, &smp, &sampler, &err) != KVS_OK)
        goto done;
    if (!(logits = malloc(sizeof(float) * (size_t)info.n_vocab))) {
        fprintf(stderr, "generate: out of memory\n");
        goto done;
    }

    /* The prompt in one call (the policy compresses it by its rule), then one token a step. */
    fputs(argv[2], stdout);
    if (kvs_session_eval(session, prompt, n_prompt, logits, 0, &err) != KVS_OK)
        goto done;
    /* Tokens the context still takes (an evicting policy's cache is bounded: no limit). */
    const int room = kvs_session_ctx_left(session);
    int prev = prompt[n_prompt - 1];
    for (; n_gen < N_PREDICT && n_gen < room; n_gen++) {
        int32_t tok = kvs_sampler_sample(sampler, logits);
        if (tok == kvs_token_eos(model) || tok == kvs_token_bos(model))
            break;
        int len;
        const char *piece = kvs_token_text(model, prev, tok, &len);
        fwrite(piece, 1, (size_t)len, stdout);
        prev = tok;
        if (n_gen + 1 < N_PREDICT && n_gen + 1 < room && kvs_session_eval(session, &tok, 1, logits, 0, &err) != KVS_OK)
            goto done;
    }
    fputc('\n', stdout);
    fprintf(stderr, "generated %d tokens; KV %zu bytes held (full F16 cache: %zu bytes)\n", n_gen,
            kvs_session_kv_bytes(session), kvs_session_kv_bytes_full_f16(session));
    rc = 0;
done:
    if (rc != 0 && err.code != KVS_OK)
        fprintf(stderr, "generate: %s\n", err.msg);
    free(logits);
    free(prompt);
    kvs_sampler_free(sampler);
    kvs_session_free(session);
    kvs_model_free(model);
    return rc;
}
