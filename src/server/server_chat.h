/* Chat templates: the messages of a chat request as the prompt text the model was trained on. */
#ifndef KVS_SERVER_CHAT_H
#define KVS_SERVER_CHAT_H

#include <stddef.h>

#include "server/server_request.h"

typedef enum kvs_srv_chat_template {
    KVS_SRV_CHAT_DEFAULT, /* "role: content\n" per message, then "assistant:" */
    KVS_SRV_CHAT_LLAMA3,  /* <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> */
    KVS_SRV_CHAT_CHATML,  /* <|im_start|>role\ncontent<|im_end|>\n */
} kvs_srv_chat_template;

/* The template a GGUF tokenizer.chat_template (Jinja text, len bytes, not NUL-terminated; NULL
 * for none) is recognised as: Llama-3 and ChatML by their markers, anything else the default. */
kvs_srv_chat_template kvs_srv_chat_detect(const char *jinja, size_t len);
const char *kvs_srv_chat_name(kvs_srv_chat_template t);
/* The prompt for messages, ending where the assistant's reply begins; malloc'd, NULL when out
 * of memory. The BOS token is not written: the server tokenizes with BOS. */
/* The text that closes an assistant turn in template t ("<|eot_id|>"), where generation stops;
 * NULL for the default template. */
const char *kvs_srv_chat_end(kvs_srv_chat_template t);
char *kvs_srv_chat_apply(kvs_srv_chat_template t, const kvs_srv_message *msgs, int n);

#endif
