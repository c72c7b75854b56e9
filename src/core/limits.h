/* Limits on the sizes a model file states, checked (with overflow-safe arithmetic) before
 * anything is allocated from them, so that a file claiming absurd sizes fails at once with a
 * message naming the file and the field instead of exhausting memory. Each is far beyond any
 * released model; the GGUF container's own limits (key, tensor and array counts) are in
 * gguf/gguf.h. */
#ifndef KVS_LIMITS_H
#define KVS_LIMITS_H

/* Vocabulary entries (tokenizer.ggml.tokens, token_embd.weight rows, llama2.c vocab_size):
 * the largest vocabularies have about 260k tokens; token ids must also stay exact in a float
 * (the samplers and the MPC engine carry them as such), which 2^24 is the last integer of. */
#define KVS_MAX_VOCAB (1 << 24)
/* Bytes of all the vocabulary's token texts together: a few MB in real vocabularies; the
 * tokenizer copies them (and a decoded form), so this bounds its memory. */
#define KVS_MAX_VOCAB_BYTES (1u << 28)
/* Context length (<arch>.context_length, llama2.c seq_len, -c): the longest trained contexts
 * are about 10M tokens; positions are ints and an evicting KV cache holds up to twice the
 * context, which must stay below INT32_MAX. Equal to the -c flag's maximum. */
#define KVS_MAX_CTX (1 << 24)
/* Transformer blocks (<arch>.block_count, llama2.c n_layers): the deepest models have under
 * 200; the loader allocates per-layer records before it looks at the tensors. */
#define KVS_MAX_LAYERS (1 << 16)
/* Widths and head counts (embedding_length, feed_forward_length, head_count, head_count_kv,
 * key_length, llama2.c dim and hidden_dim): the widest models have FFNs of about 50k; a
 * matrix of two such widths (2^40 elements) is then far past any file, and every product of a
 * few of them fits in 64 bits. */
#define KVS_MAX_WIDTH (1 << 20)

#endif
