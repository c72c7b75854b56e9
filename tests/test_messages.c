/* Messages in the user's terms: out-of-memory while tokenizing does not leak an internal
 * function name. (Memory is limited with RLIMIT_AS, which sanitizer builds cannot use: there the
 * check is skipped.) */
#include <string.h>
#include <sys/resource.h>

#include "check.h"
#include "kvslim.h"

#if defined(__SANITIZE_ADDRESS__)
#define KVS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVS_ASAN 1
#endif
#endif

#ifndef KVS_ASAN
static long vm_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0;
    if (f) {
        if (fscanf(f, "%ld", &pages) != 1)
            pages = 0;
        fclose(f);
    }
    return pages * 4096;
}
#endif

int main(void)
{
#ifdef KVS_ASAN
    printf("messages: skipped under AddressSanitizer (RLIMIT_AS)\n");
    return 0;
#else
    char path[512];
    kvs_model *m = NULL;
    kvs_error err = {0};
    CHECKF(kvs_model_load(check_shared_path(path, sizeof path, "models/gguf/stories260K-f32.gguf"),
                          &m, &err) == KVS_OK, "%s", err.msg);
    const size_t n = 64u << 20;
    char *text = malloc(n + 1);
    long vm = vm_bytes();
    if (!m || !text || vm <= 0) {
        free(text);
        kvs_model_free(m);
        return check_summary("messages");
    }
    memset(text, 'a', n);
    text[n] = 0;
    struct rlimit old, lim;
    getrlimit(RLIMIT_AS, &old);
    lim = old;
    lim.rlim_cur = (rlim_t)vm + (32u << 20); /* tokenizing 64 MB needs far more than 32 MB */
    int32_t *ids = NULL;
    int n_ids = 0;
    kvs_status st = KVS_OK;
    if (setrlimit(RLIMIT_AS, &lim) == 0) {
        st = kvs_tokenize(m, text, 1, &ids, &n_ids, &err);
        setrlimit(RLIMIT_AS, &old);
        CHECKF(st == KVS_ERR_NOMEM && strstr(err.msg, "out of memory") &&
                   !strstr(err.msg, "tokenizer_encode"),
               "status %d: '%s'", st, err.msg);
    }
    free(ids);
    free(text);
    kvs_model_free(m);
    return check_summary("messages");
#endif
}
