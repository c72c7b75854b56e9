/* Chat templates (server_chat.h). The three formats are written out here rather than by a Jinja
 * interpreter: the GGUF's template only chooses among them. */
#include "server/server_chat.h"

#include <stdlib.h>
#include <string.h>

#include "server/server_buf.h"

/* memmem without relying on a GNU extension's declaration. */
static int contains(const char *hay, size_t len, const char *needle)
{
    size_t n = strlen(needle);
    for (size_t i = 0; hay && n <= len && i <= len - n; i++)
        if (!memcmp(hay + i, needle, n))
            return 1;
    return 0;
}

kvs_srv_chat_template kvs_srv_chat_detect(const char *jinja, size_t len)
{
    if (contains(jinja, len, "<|start_header_id|>"))
        return KVS_SRV_CHAT_LLAMA3;
    if (contains(jinja, len, "<|im_start|>"))
        return KVS_SRV_CHAT_CHATML;
    return KVS_SRV_CHAT_DEFAULT;
}

const char *kvs_srv_chat_name(kvs_srv_chat_template t)
{
    switch (t) {
    case KVS_SRV_CHAT_LLAMA3:
        return "llama3";
    case KVS_SRV_CHAT_CHATML:
        return "chatml";
    case KVS_SRV_CHAT_DEFAULT:
        break;
    }
    return "default";
}

const char *kvs_srv_chat_end(kvs_srv_chat_template t)
{
    return t == KVS_SRV_CHAT_LLAMA3 ? "<|eot_id|>" : t == KVS_SRV_CHAT_CHATML ? "<|im_end|>" : NULL;
}

char *kvs_srv_chat_apply(kvs_srv_chat_template t, const kvs_srv_message *msgs, int n)
{
    kvs_srv_buf b = {0};
    for (int i = 0; i < n; i++) {
        const char *role = msgs[i].role, *content = msgs[i].content;
        switch (t) {
        case KVS_SRV_CHAT_LLAMA3:
            kvs_srv_buf_printf(&b, "<|start_header_id|>%s<|end_header_id|>\n\n%s<|eot_id|>", role,
                               content);
            break;
        case KVS_SRV_CHAT_CHATML:
            kvs_srv_buf_printf(&b, "<|im_start|>%s\n%s<|im_end|>\n", role, content);
            break;
        case KVS_SRV_CHAT_DEFAULT:
            kvs_srv_buf_printf(&b, "%s: %s\n", role, content);
            break;
        }
    }
    switch (t) {
    case KVS_SRV_CHAT_LLAMA3:
        kvs_srv_buf_puts(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case KVS_SRV_CHAT_CHATML:
        kvs_srv_buf_puts(&b, "<|im_start|>assistant\n");
        break;
    case KVS_SRV_CHAT_DEFAULT:
        kvs_srv_buf_puts(&b, "assistant:");
        break;
    }
    if (b.failed) {
        kvs_srv_buf_free(&b);
        return NULL;
    }
    return b.data;
}
