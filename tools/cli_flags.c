/* The option table of every subcommand and the one parser that reads it (see cli_flags.h). */
#include "cli_flags.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "kvslim_tools.h"

#ifndef KVS_VERSION
#define KVS_VERSION "unknown"
#endif

typedef enum flag_kind {
    K_NONE,   /* a switch */
    K_INT,    /* a whole number in [min, max] */
    K_FLOAT,  /* a decimal number in [min, max] */
    K_U64,    /* a non-negative whole number (seeds) */
    K_STRING, /* any non-empty text */
    K_LIST,   /* comma-separated non-empty items */
    K_WORD,   /* one of words */
} flag_kind;

typedef struct flag_def {
    cli_flag_id id;
    const char *shrt; /* "-m" or NULL */
    const char *name; /* "--model" */
    flag_kind kind;
    const char *metavar;
    unsigned cmds;
    double min, max;
    int repeatable;
    const char *const *words; /* K_WORD: NULL-terminated */
    const char *help;         /* may hold newlines; continuation lines are indented */
} flag_def;

#define ALL (CMD_RUN | CMD_LOGITS | CMD_TOKENIZE | CMD_CONVERT | CMD_BENCH | CMD_EVAL | CMD_LAYERSIM | \
             CMD_EVAL_RECALL | CMD_EVAL_OPCOUNT | CMD_MPC | CMD_MPC_DEALER | CMD_MPC_PARTY | \
             CMD_SERVE)
#define MPC_ALL (CMD_MPC | CMD_MPC_DEALER | CMD_MPC_PARTY)
#define SESSION (CMD_RUN | CMD_LOGITS | CMD_BENCH | CMD_EVAL | CMD_LAYERSIM)

/* A word ending in "..." accepts any value with the part before it as prefix (the value's
 * own parser checks the rest, e.g. "kivi:..." for the session's KIVI parameters). */
static int word_prefix_match(const char *word, const char *v)
{
    size_t n = strlen(word);
    return n > 3 && strcmp(word + n - 3, "...") == 0 && strncmp(word, v, n - 3) == 0;
}

static const char *const kv_types[] = {"f32", "f16", "kivi4", "kivi2", "kivi:...", NULL};
/* kvs_wtype_parse's names (KVS_WTYPE_NAMES). */
static const char *const weight_types[] = {"f32",  "f16",  "bf16", "q8_0",   "q4_0",  "q4_k",
                                           "q5_k", "q6_k", "q4_k_m", "q5_k_m", NULL};
static const char *const eval_tasks[] = {"fidelity", "recall", "opcount", NULL};

/* Rows appear in each command's --help in this order. */
static const flag_def flags[] = {
    {FL_MODEL, "-m", "--model", K_STRING, "MODEL",
     CMD_RUN | CMD_LOGITS | CMD_BENCH | CMD_EVAL | CMD_LAYERSIM, 0, 0, 0, NULL, "GGUF model (llama architecture)"},
    {FL_MODEL, "-m", "--model", K_STRING, "MODEL", CMD_TOKENIZE, 0, 0, 0, NULL,
     "GGUF model whose vocabulary to use"},
    {FL_SYNTHETIC, NULL, "--synthetic", K_STRING, "SHAPE", CMD_BENCH, 0, 0, 0, NULL,
     "random-weight llama model, SHAPE = comma-separated key=value of\n"
     "dim, hidden, layers, heads, kv_heads, vocab, ctx, type (f32, f16,\n"
     "bf16, q8_0, q4_0, q4_k, q5_k, q6_k, q4_k_m, q5_k_m: the last two\n"
     "llama.cpp's mixes); e.g. dim=768,hidden=2048,layers=12,heads=12,\n"
     "kv_heads=12,vocab=512,type=q8_0 (weights N(0, 0.02), seed fixed)"},
    {FL_SAVE, NULL, "--save", K_STRING, "FILE.gguf", CMD_BENCH, 0, 0, 0, NULL,
     "with --synthetic: keep the generated model as a GGUF file"},
    {FL_PROMPT, "-p", "--prompt", K_STRING, "TEXT", CMD_RUN, 0, 0, 0, NULL,
     "prompt text (BOS is prepended when the vocabulary adds one);\n"
     "with --chat: the first user turn"},
    {FL_PROMPT, "-p", "--prompt", K_STRING, "TEXT", CMD_TOKENIZE, 0, 0, 0, NULL,
     "text to tokenize"},
    {FL_FILE, "-f", "--file", K_STRING, "FILE", CMD_RUN, 0, 0, 0, NULL,
     "read the prompt from FILE; with --chat: the first user turn"},
    {FL_CHAT, NULL, "--chat", K_NONE, NULL, CMD_RUN, 0, 0, 0, NULL,
     "interactive chat: each line of stdin is a user turn, formatted with\n"
     "the model's chat template (tokenizer.chat_template: llama3, chatml,\n"
     "phi3, llama2, else the default 'role: content'); the reply (up to\n"
     "-n tokens, the turn's end or EOS) goes to stdout; the KV cache is\n"
     "kept, so each turn feeds only its own tokens; one line per turn and\n"
     "the stats line on stderr"},
    {FL_SYSTEM, NULL, "--system", K_STRING, "TEXT", CMD_RUN, 0, 0, 0, NULL,
     "with --chat: a system message before the first user turn"},
    {FL_CHAT_TEMPLATE, NULL, "--chat-template", K_STRING, "NAME", CMD_RUN, 0, 0, 0, NULL,
     "with --chat: use this format instead of the model's: default,\n"
     "llama3, chatml, phi3 or llama2"},
    {FL_CHAT_TEMPLATE, NULL, "--chat-template", K_STRING, "NAME", CMD_SERVE, 0, 0, 0, NULL,
     "chat format of /v1/chat/completions instead of the model's:\n"
     "default, llama3, chatml, phi3 or llama2"},
    {FL_FILE, "-f", "--file", K_STRING, "FILE", CMD_TOKENIZE, 0, 0, 0, NULL,
     "read the text from FILE"},
    {FL_NO_BOS, NULL, "--no-bos", K_NONE, NULL, CMD_TOKENIZE, 0, 0, 0, NULL,
     "do not prepend the BOS token (when the vocabulary would)"},
    {FL_SPECIAL, NULL, "--special", K_NONE, NULL, CMD_TOKENIZE, 0, 0, 0, NULL,
     "parse special tokens: the text of a control or user-defined token\n"
     "(e.g. <|im_start|>, </s>) becomes its id"},
    {FL_TOKENIZER, NULL, "--tokenizer", K_STRING, "TOK.bin", CMD_CONVERT, 0, 0, 0, NULL,
     "llama2.c tokenizer file"},
    {FL_OUT, "-o", "--output", K_STRING, "FILE", CMD_CONVERT, 0, 0, 0, NULL,
     "GGUF file to write (written atomically)"},
    {FL_TYPE, NULL, "--type", K_WORD, "TYPE", CMD_CONVERT, 0, 0, 0, weight_types,
     "f32 (default), f16, bf16, q8_0, q4_0, q4_k, q5_k or q6_k for\n"
     "weight matrices, or llama.cpp's mixes q4_k_m, q5_k_m (Q6_K output,\n"
     "attn_v, ffn_down in some layers); norms stay f32; a matrix whose\n"
     "rows do not divide into the type's blocks is stored as q8_0 (for\n"
     "k-quants) or f16, with a note on stderr"},
    {FL_DUPLICATE_LAYERS, NULL, "--duplicate-layers", K_LIST, "L1,L2,...", CMD_CONVERT, 0, 0, 0,
     NULL,
     "depth up-scaling: write each listed layer twice in a row (0-based,\n"
     "increasing, each once); 1,2,3 of 5 layers gives 0,1,1,2,2,3,3,4"},
    {FL_TOKENS, NULL, "--tokens", K_STRING, "FILE", CMD_LOGITS, 0, 0, 0, NULL,
     "token ids, one per line"},
    {FL_TOKENS, NULL, "--tokens", K_STRING, "FILE", CMD_EVAL, 0, 0, 0, NULL,
     "token ids, one per line (T of them)"},
    {FL_TOKENS, NULL, "--tokens", K_STRING, "FILE", CMD_LAYERSIM, 0, 0, 0, NULL,
     "token ids, one per line"},
    {FL_OUT, "-o", "--out", K_STRING, "FILE", CMD_LOGITS, 0, 0, 0, NULL,
     "output file (written atomically)"},
    {FL_PROMPT_LEN, NULL, "--prompt-len", K_INT, "N", CMD_EVAL, 1, 1 << 24, 0, NULL,
     "prompt tokens, 1 <= N <= T-2"},
    {FL_PROMPT_LEN, NULL, "--prompt-len", K_INT, "N", CMD_LAYERSIM, 1, 1 << 24, 0, NULL,
     "measure over the first N tokens of FILE (default: all of them)"},
    {FL_N_PREDICT, "-n", "--n-predict", K_INT, "N", CMD_RUN, 0, 1 << 24, 0, NULL,
     "tokens to generate (default 256); stops early at EOS or BOS"},
    {FL_N_PROMPT, "-p", "--n-prompt", K_INT, "N", CMD_BENCH, 1, 1 << 22, 0, NULL,
     "prompt tokens (default 512)"},
    {FL_N_GEN, "-n", "--n-gen", K_INT, "N", CMD_BENCH, 0, 1 << 22, 0, NULL,
     "generated tokens (default 128)"},
    {FL_REPS, "-r", "--reps", K_INT, "N", CMD_BENCH, 1, 1000, 0, NULL,
     "repetitions, reported as mean (default 1)"},
    {FL_TEMP, NULL, "--temp", K_FLOAT, "T", CMD_RUN, 0, 100, 0, NULL,
     "temperature (default 0.8); 0 = greedy"},
    {FL_TOP_K, NULL, "--top-k", K_INT, "K", CMD_RUN, 0, 1 << 24, 0, NULL,
     "keep the K most likely tokens (default 40; 0 = off)"},
    {FL_TOP_P, NULL, "--top-p", K_FLOAT, "P", CMD_RUN, 0, 1, 0, NULL,
     "nucleus sampling threshold (default 0.95; 1 = off)"},
    {FL_SEED, NULL, "--seed", K_U64, "S", CMD_RUN, 0, 0, 0, NULL,
     "sampling seed (default 42); same seed, same text"},
    {FL_KV, NULL, "--kv", K_STRING, "SPEC", CMD_RUN | CMD_LOGITS | CMD_BENCH, 0, 0, 0, NULL,
     "KV policy NAME[:key=value,...], e.g. h2o:budget=0.25 (default full);\n"
     "budget=F (0 < F <= 1, with a decimal point) or budget=P% is a\n"
     "fraction of the prompt, slots=N a slot count, per layer and KV head;\n"
     "--kv help lists the policies and their parameters"},
    {FL_KV, NULL, "--kv", K_STRING, "SPEC", CMD_EVAL, 0, 0, 1, NULL,
     "a policy NAME[:key=value,...]; repeat for more; '--kv a,b,c' lists\n"
     "bare names; '--kv help' lists the policies and their parameters"},
    {FL_BUDGET, NULL, "--budget", K_LIST, "B1,B2,...", CMD_EVAL, 0, 0, 0, NULL,
     "run every non-full policy at each budget (overrides a spec's own\n"
     "budget=): a fraction of the prompt (0.25 or 25%) or a slot count\n"
     "(slots=96)"},
    {FL_EQUAL_MEMORY, NULL, "--equal-memory", K_NONE, NULL, CMD_EVAL, 0, 0, 0, NULL,
     "also run each evicting policy given with --kv (all evicting\n"
     "policies if none is) at slots = round(mean slots attended) of\n"
     "every one-shot run, on its KV type; those rows have budget\n"
     "'eq:<slots>' and name the one-shot runs they match (equal_memory_of)"},
    {FL_KV_TYPE, NULL, "--kv-type", K_WORD, "TYPE", SESSION & ~CMD_EVAL, 0, 0, 0, kv_types,
     "KV storage type: f32 or f16 (default: f16 for run and bench,\n"
     "f32 for eval and logits, which measure); kivi4 or kivi2: KIVI\n"
     "4- or 2-bit codes (keys per channel, values per token, groups\n"
     "of 32, the newest 128 tokens in f16); kivi:kbits=B,vbits=B,\n"
     "group=G,residual=R sets them (B 1, 2, 4 or 8; R a multiple of G)"},
    {FL_KV_TYPE, NULL, "--kv-type", K_STRING, "TYPE", CMD_EVAL, 0, 0, 1, NULL,
     "storage of the evaluated runs (default f32): f32, f16, kivi4, kivi2\n"
     "or kivi:kbits=B,vbits=B,group=G,residual=R; '--kv-type f16,kivi4'\n"
     "lists bare names, repeat for more; every run is made on each type.\n"
     "The reference is always the full F32 cache; 'full' on another\n"
     "type measures what that storage costs"},
    {FL_THREADS, "-t", "--threads", K_INT, "N", SESSION, 1, 256, 0, NULL,
     "threads (default: online CPUs, at most 8; more than the online\n"
     "CPUs are clamped to their number)"},
    {FL_CTX, "-c", "--ctx", K_INT, "N", CMD_RUN, 1, 1 << 24, 0, NULL,
     "context length (default: the model's; a larger one is used with a notice)"},
    {FL_CONTEXT_SHIFT, NULL, "--context-shift", K_NONE, NULL, CMD_RUN, 0, 0, 0, NULL,
     "position shifting: with an evicting --kv policy, re-rotate the kept\n"
     "keys so generation goes on past the context in bounded memory"},
    {FL_IGNORE_EOS, NULL, "--ignore-eos", K_NONE, NULL, CMD_RUN, 0, 0, 0, NULL,
     "do not stop at an end-of-text (EOS or BOS) token: feed it back and go on\n"
     "(stories260K then starts a new story), shown as a line break"},
    {FL_PROGRESS, NULL, "--progress", K_INT, "N", CMD_RUN, 1, 1 << 30, 0, NULL,
     "every N generated tokens, one line on stderr: tokens generated,\n"
     "seconds since decoding began, decode tok/s since the previous line\n"
     "(long runs, e.g. bench/soak.sh; not with --chat)"},
    {FL_CHUNK, NULL, "--chunk", K_INT, "N", SESSION, 1, 1 << 20, 0, NULL,
     "prompt tokens per forward batch (default 512)"},
    {FL_EXACT_MATMUL, NULL, "--exact-matmul", K_NONE, NULL, (SESSION & ~CMD_EVAL) | CMD_SERVE, 0,
     0, 0, NULL,
     "multiply quantised weights with fp32 activations (llama.cpp's\n"
     "numbers on the file dequantised to F32; slower); default: 8-bit\n"
     "activations for the block types but q2_K and q3_K, as llama.cpp's\n"
     "CPU kernels"},
    {FL_JSON, NULL, "--json", K_STRING, "OUT", CMD_EVAL, 0, 0, 0, NULL,
     "results as a JSON array of objects (rewritten as each run ends)"},
    {FL_JSON, NULL, "--json", K_STRING, "OUT", CMD_LAYERSIM, 0, 0, 0, NULL,
     "the table as a JSON array, one object per adjacent layer pair"},
    {FL_CSV, NULL, "--csv", K_STRING, "OUT", CMD_EVAL, 0, 0, 0, NULL,
     "results as CSV with a header line (rewritten as each run ends)"},
    {FL_PLOT, NULL, "--plot", K_STRING, "OUT.png", CMD_EVAL, 0, 0, 0, NULL,
     "KL and top-1 against mean KV bytes relative to a full F16\n"
     "cache, one line per policy and KV type across budgets (needs gnuplot)"},
    {FL_JSON, NULL, "--json", K_STRING, "FILE", CMD_BENCH, 0, 0, 0, NULL,
     "write the results as JSON (fields: model, threads, n_prompt,\n"
     "n_gen, prefill_tok_s, decode_tok_s, kv_bytes, peak_rss_bytes)"},
    /* eval --task recall (its own command bit: a separate set of flags and its own --help) */
    {FL_TASK, NULL, "--task", K_WORD, "TASK", CMD_EVAL | CMD_EVAL_RECALL | CMD_EVAL_OPCOUNT, 0, 0,
     0, eval_tasks,
     "fidelity (default), recall: retrieval accuracy on the recall\n"
     "model's prompts (see kvslim eval --task recall --help), or opcount:\n"
     "the MPC op-count model (see kvslim eval --task opcount --help)"},
    {FL_MODEL, "-m", "--model", K_STRING, "MODEL", CMD_EVAL_RECALL, 0, 0, 0, NULL,
     "GGUF model, or a llama2.c checkpoint with --tokenizer"},
    {FL_TOKENIZER, NULL, "--tokenizer", K_STRING, "TOK.bin", CMD_EVAL_RECALL, 0, 0, 0, NULL,
     "the llama2.c checkpoint's tokenizer (its pieces name the\n"
     "question token Q and print the predictions)"},
    {FL_PROMPTS, NULL, "--prompts", K_STRING, "DIR", CMD_EVAL_RECALL, 0, 0, 1, NULL,
     "a prompt set: NNN.tokens with NNN.answer ('POS ID' lines);\n"
     "repeat for more sets"},
    {FL_KV, NULL, "--kv", K_STRING, "SPEC", CMD_EVAL_RECALL, 0, 0, 1, NULL,
     "a policy NAME[:key=value,...]; repeat for more; '--kv a,b,c' lists\n"
     "bare names; '--kv help' lists the policies and their parameters"},
    {FL_BUDGET, NULL, "--budget", K_LIST, "B1,B2,...", CMD_EVAL_RECALL, 0, 0, 0, NULL,
     "run every non-full policy at each budget: a fraction of the\n"
     "context (0.1 or 10%) or a slot count (slots=96)"},
    {FL_KV_TYPE, NULL, "--kv-type", K_STRING, "T1,T2,...", CMD_EVAL_RECALL, 0, 0, 0, NULL,
     "KV storage types to run, comma-separated: f32 (default), f16,\n"
     "kivi4, kivi2, kivi:kbits=B,vbits=B,group=G,residual=R"},
    {FL_LIMIT, NULL, "--limit", K_INT, "N", CMD_EVAL_RECALL, 1, 1 << 24, 0, NULL,
     "the first N prompts of each set (in name order)"},
    {FL_THREADS, "-t", "--threads", K_INT, "N", CMD_EVAL_RECALL, 1, 256, 0, NULL,
     "threads (default: online CPUs, at most 8)"},
    {FL_CHUNK, NULL, "--chunk", K_INT, "N", CMD_EVAL_RECALL, 1, 1 << 20, 0, NULL,
     "context tokens per forward batch (default 512; evicting policies\n"
     "evict after each batch)"},
    {FL_JSON, NULL, "--json", K_STRING, "OUT", CMD_EVAL_RECALL, 0, 0, 0, NULL,
     "one object per configuration (rewritten as each one ends)"},
    {FL_CSV, NULL, "--csv", K_STRING, "OUT", CMD_EVAL_RECALL, 0, 0, 0, NULL,
     "one row per configuration and prompt (rewritten as each\n"
     "configuration ends)"},
    {FL_PLOT, NULL, "--plot", K_STRING, "OUT.png", CMD_EVAL_RECALL, 0, 0, 0, NULL,
     "accuracy heat maps (needle depth x prompt set), one per policy,\n"
     "budget and KV type, and accuracy against the share of the context\n"
     "attended, one line per policy (needs gnuplot)"},
    /* eval --task opcount (its own command bit, like recall) */
    {FL_MODEL, "-m", "--model", K_STRING, "MODEL", CMD_EVAL_OPCOUNT, 0, 0, 0, NULL,
     "take the shape from this GGUF model, or llama2.c checkpoint with\n"
     "--tokenizer (only its layers, heads, KV heads and head_dim)"},
    {FL_TOKENIZER, NULL, "--tokenizer", K_STRING, "TOK.bin", CMD_EVAL_OPCOUNT, 0, 0, 0, NULL,
     "the llama2.c checkpoint's tokenizer (needed to read it)"},
    {FL_SHAPE, NULL, "--shape", K_STRING, "SHAPE", CMD_EVAL_OPCOUNT, 0, 0, 0, NULL,
     "instead of -m: layers=L,heads=H,kv_heads=K,head_dim=D (all four;\n"
     "K divides H)"},
    {FL_CTX, NULL, "--ctx", K_LIST, "T1,T2,...", CMD_EVAL_OPCOUNT, 0, 0, 0, NULL,
     "context lengths T (prompt tokens in the cache), 1 to 1048576"},
    {FL_BUDGET, NULL, "--budget", K_LIST, "F1,F2,...", CMD_EVAL_OPCOUNT, 0, 0, 0, NULL,
     "shares of the context attended, 0.05 or 5% (default: the --kv\n"
     "spec's budget=, else 0.05)"},
    {FL_KV, NULL, "--kv", K_STRING, "mpcache:...", CMD_EVAL_OPCOUNT, 0, 0, 0, NULL,
     "MPCache's configuration for the mp: rows (keep, s1, s2, rho1, sim,\n"
     "levels, share, skip, pad; see --kv help); default its defaults"},
    {FL_JSON, NULL, "--json", K_STRING, "OUT", CMD_EVAL_OPCOUNT, 0, 0, 0, NULL,
     "every field: shape, configuration, table2 and one object per\n"
     "context, budget and method (rows)"},
    /* mpc run | dealer | party (tools/cmd_mpc.c) */
    {FL_ROLE, NULL, "--role", K_INT, "0|1", CMD_MPC_PARTY, 0, 1, 0, NULL,
     "0: the client (owns the prompt), 1: the server (owns the model)"},
    {FL_MODEL, "-m", "--model", K_STRING, "MODEL", CMD_MPC, 0, 0, 0, NULL,
     "GGUF model (or llama2.c checkpoint with --tokenizer): party 1's\n"
     "weights; the run also takes the tokenizer and the model hash\n"
     "(SHA-256 of this file) from it"},
    {FL_MODEL, "-m", "--model", K_STRING, "MODEL", CMD_MPC_PARTY, 0, 0, 0, NULL,
     "party 1: the model it serves; party 0: a model file whose\n"
     "vocabulary it tokenizes with (its weights are not used) and whose\n"
     "SHA-256 it expects of party 1's unless --model-hash is given"},
    {FL_TOKENIZER, NULL, "--tokenizer", K_STRING, "TOK.bin", CMD_MPC | CMD_MPC_PARTY, 0, 0, 0,
     NULL, "the llama2.c checkpoint's tokenizer (with such a -m)"},
    {FL_PROMPT, "-p", "--prompt", K_STRING, "TEXT", CMD_MPC | CMD_MPC_PARTY, 0, 0, 0, NULL,
     "prompt text (BOS is prepended); party 0 only"},
    {FL_TOKENS, NULL, "--tokens", K_STRING, "FILE", CMD_MPC | CMD_MPC_PARTY, 0, 0, 0, NULL,
     "instead of -p: token ids, one per line (T of them); party 0 only"},
    {FL_PROMPT_LEN, NULL, "--prompt-len", K_INT, "P", CMD_MPC | CMD_MPC_PARTY, 1, 1 << 24, 0,
     NULL,
     "with --tokens: prefill the first P tokens, feed the rest as\n"
     "teacher-forced decode steps (their argmax agreement is reported),\n"
     "then generate N"},
    {FL_KV, NULL, "--kv", K_STRING, "SPEC", CMD_MPC | CMD_MPC_PARTY, 0, 0, 0, NULL,
     "KV cache under the protocol: full (default) or mpcache:budget=F[,...]\n"
     "(MPCache's static step and cluster selection on shares; the\n"
     "configuration is public, the kept and chosen tokens secret); party 0"},
    {FL_N_PREDICT, "-n", "--n-predict", K_INT, "N", CMD_MPC | CMD_MPC_PARTY, 0, 1 << 24, 0, NULL,
     "tokens to generate greedily (required; party 0); stops early at\n"
     "EOS or BOS"},
    {FL_LISTEN, NULL, "--listen", K_INT, "PORT", CMD_MPC_DEALER, 1, 65535, 0, NULL,
     "TCP port the parties connect to (every interface)"},
    {FL_LISTEN, NULL, "--listen", K_INT, "PORT", CMD_MPC_PARTY, 1, 65535, 0, NULL,
     "accept the other party on this TCP port (every interface)"},
    {FL_PEER, NULL, "--peer", K_STRING, "HOST:PORT", CMD_MPC_PARTY, 0, 0, 0, NULL,
     "instead of --listen: connect to the other party"},
    {FL_DEALER, NULL, "--dealer", K_STRING, "HOST:PORT", CMD_MPC_PARTY, 0, 0, 0, NULL,
     "the dealer's address (required)"},
    {FL_KEY0, NULL, "--key0", K_STRING, "FILE", CMD_MPC_DEALER, 0, 0, 0, NULL,
     "the key of the link to party 0: 64 hex digits (openssl rand -hex 32)"},
    {FL_KEY1, NULL, "--key1", K_STRING, "FILE", CMD_MPC_DEALER, 0, 0, 0, NULL,
     "the key of the link to party 1"},
    {FL_PEER_KEY, NULL, "--peer-key", K_STRING, "FILE", CMD_MPC_PARTY, 0, 0, 0, NULL,
     "the key of the party link: 64 hex digits (openssl rand -hex 32)"},
    {FL_DEALER_KEY, NULL, "--dealer-key", K_STRING, "FILE", CMD_MPC_PARTY, 0, 0, 0, NULL,
     "the key of this party's link to the dealer (the dealer's --key0\n"
     "or --key1)"},
    {FL_MODEL_HASH, NULL, "--model-hash", K_STRING, "HEX", CMD_MPC_DEALER | CMD_MPC_PARTY, 0, 0,
     0, NULL,
     "the SHA-256 (64 hex digits, sha256sum) of the model file party 1\n"
     "must serve (party 0; the dealer checks it when given)"},
    {FL_FRAC, NULL, "--frac", K_INT, "F", MPC_ALL, 8, 24, 0, NULL,
     "fixed-point fraction bits in Z_2^64 (default 16; every role the same)"},
    {FL_INSECURE_PLAIN, NULL, "--insecure-plain", K_NONE, NULL, MPC_ALL, 0, 0, 0, NULL,
     "channels without encryption or authentication: loopback\n"
     "measurements only (every role the same)"},
    {FL_TIMEOUT, NULL, "--timeout", K_INT, "S", MPC_ALL, 1, 86400, 0, NULL,
     "seconds to wait for a connection or a message (default 30)"},
    {FL_JSON, NULL, "--json", K_STRING, "OUT", CMD_MPC | CMD_MPC_PARTY, 0, 0, 0, NULL,
     "the text, tokens and cost table as JSON (party 0)"},
    /* serve (tools/cmd_serve.c) */
    {FL_MODEL, "-m", "--model", K_STRING, "MODEL", CMD_SERVE, 0, 0, 0, NULL,
     "GGUF model to serve (its file name is the model id)"},
    {FL_HOST, NULL, "--host", K_STRING, "ADDR", CMD_SERVE, 0, 0, 0, NULL,
     "address to listen on (default 127.0.0.1; 0.0.0.0: every\n"
     "interface)"},
    {FL_PORT, NULL, "--port", K_INT, "PORT", CMD_SERVE, 0, 65535, 0, NULL,
     "TCP port (default 8080; 0 picks a free one, named in the\n"
     "listen line)"},
    {FL_PARALLEL, NULL, "--parallel", K_INT, "N", CMD_SERVE, 1, 256, 0, NULL,
     "sequences decoding at once, one session each (default 2)"},
    {FL_QUEUE, NULL, "--queue", K_INT, "Q", CMD_SERVE, 0, 65536, 0, NULL,
     "requests waiting for a sequence (default 8); more answer 503"},
    {FL_CTX, "-c", "--ctx", K_INT, "N", CMD_SERVE, 0, 1 << 24, 0, NULL,
     "context per sequence (default 0: the model's; a larger one is used\n"
     "with a notice)"},
    {FL_KV, NULL, "--kv", K_STRING, "SPEC", CMD_SERVE, 0, 0, 0, NULL,
     "KV policy of requests without a \"kv\" field (default full);\n"
     "--kv help lists the policies and their parameters"},
    {FL_KV_TYPE, NULL, "--kv-type", K_WORD, "TYPE", CMD_SERVE, 0, 0, 0, kv_types,
     "KV storage of requests without a \"kv_type\" field: f16 (default,\n"
     "as run's), f32, kivi4, kivi2 or kivi:kbits=B,vbits=B,group=G,residual=R"},
    {FL_THREADS, "-t", "--threads", K_INT, "N", CMD_SERVE, 1, 256, 0, NULL,
     "threads per sequence (default 1; more than the online CPUs are\n"
     "clamped to their number)"},
    {FL_API_KEY, NULL, "--api-key", K_STRING, "KEY", CMD_SERVE, 0, 0, 0, NULL,
     "require the header 'Authorization: Bearer KEY' on every endpoint\n"
     "but / and /health (else 401)"},
    {FL_MAX_BODY, NULL, "--max-body", K_INT, "BYTES", CMD_SERVE, 1, 1 << 30, 0, NULL,
     "largest request body (default 1048576); a larger one answers\n"
     "413"},
    {FL_TIMEOUT, NULL, "--timeout", K_INT, "S", CMD_SERVE, 1, 86400, 0, NULL,
     "idle connection timeout in seconds (default 600)"},
    {FL_VERSION, NULL, "--version", K_NONE, NULL, ALL, 0, 0, 0, NULL, "print the version"},
    {FL_HELP, "-h", "--help", K_NONE, NULL, ALL, 0, 0, 0, NULL, "this help"},
};
#define N_FLAGS (sizeof flags / sizeof flags[0])

static const flag_def *find_long(unsigned bit, const char *name, size_t len)
{
    for (size_t k = 0; k < N_FLAGS; k++)
        if ((flags[k].cmds & bit) && strlen(flags[k].name) == len &&
            !strncmp(flags[k].name, name, len))
            return &flags[k];
    return NULL;
}

static const flag_def *find_short(unsigned bit, char c)
{
    for (size_t k = 0; k < N_FLAGS; k++)
        if ((flags[k].cmds & bit) && flags[k].shrt && flags[k].shrt[1] == c)
            return &flags[k];
    return NULL;
}

/* "f32, f16" into buf. */
static const char *word_list(const char *const *w, char *buf, size_t size)
{
    size_t n = 0;
    buf[0] = 0;
    for (; *w && n < size; w++)
        n += (size_t)snprintf(buf + n, size - n, "%s%s", n ? ", " : "", *w);
    return buf;
}

/* Checks and stores one value; prints the error and returns -1 if it is bad. */
static int take_value(cli_args *a, const flag_def *d, const char *as, const char *v)
{
    const char *cmd = a->cmd->name;
    char lo[32], hi[32];
    kvs_format_number(lo, sizeof lo, d->min);
    kvs_format_number(hi, sizeof hi, d->max);
    switch (d->kind) {
    case K_NONE:
        break;
    case K_INT: {
        int64_t x;
        if (kvs_parse_i64(v, (int64_t)d->min, (int64_t)d->max, &x) != 0) {
            cli_error(cmd, "%s expects a whole number in [%s, %s], got '%s'", as, lo, hi, v);
            return -1;
        }
        a->i[d->id] = x;
        break;
    }
    case K_FLOAT: {
        double x;
        if (kvs_parse_f64(v, d->min, d->max, &x) != 0) {
            cli_error(cmd, "%s expects a number in [%s, %s], got '%s'", as, lo, hi, v);
            return -1;
        }
        a->f[d->id] = x;
        break;
    }
    case K_U64: {
        int64_t x;
        if (kvs_parse_i64(v, 0, INT64_MAX, &x) != 0) {
            cli_error(cmd, "%s expects a non-negative whole number, got '%s'", as, v);
            return -1;
        }
        a->i[d->id] = x;
        break;
    }
    case K_STRING:
        if (!*v) {
            cli_error(cmd, "%s needs a value (see kvslim %s --help)", as, cmd);
            return -1;
        }
        break;
    case K_LIST:
        for (const char *p = v;; p++) {
            size_t len = strcspn(p, ",");
            if (len == 0) {
                cli_error(cmd, "%s '%s': empty item in the list", as, v);
                return -1;
            }
            p += len;
            if (!*p)
                break;
        }
        break;
    case K_WORD: {
        const char *const *w = d->words;
        while (*w && strcmp(*w, v) && !word_prefix_match(*w, v))
            w++;
        if (!*w) {
            char list[128], noun[32];
            size_t n = 0;
            for (; d->metavar[n] && n + 1 < sizeof noun; n++)
                noun[n] = (char)(d->metavar[n] | 0x20); /* "TYPE" -> "type" */
            noun[n] = 0;
            cli_error(cmd, "%s: unknown %s '%s' (expected %s)", as, noun, v,
                      word_list(d->words, list, sizeof list));
            return -1;
        }
        break;
    }
    }
    a->str[d->id] = v;
    return 0;
}

/* One occurrence of flag d, spelled as, with value v (NULL for a switch). */
static int occurrence(cli_args *a, const flag_def *d, const char *as, const char *v)
{
    const char *cmd = a->cmd->name;
    if (a->given[d->id] && !d->repeatable) {
        if (strcmp(a->as[d->id], as))
            cli_error(cmd, "%s given twice (as %s and %s)", d->name, a->as[d->id], as);
        else
            cli_error(cmd, "%s given twice", as);
        return -1;
    }
    if (v && take_value(a, d, as, v) != 0)
        return -1;
    a->given[d->id]++;
    a->as[d->id] = as;
    a->occ_id[a->n_occ] = d->id;
    a->occ_val[a->n_occ++] = v;
    return 0;
}

void cli_help(const cli_command *c, FILE *f)
{
    fputs(c->help, f);
    for (size_t k = 0; k < N_FLAGS; k++) {
        const flag_def *d = &flags[k];
        if (!(d->cmds & c->bit))
            continue;
        char head[64];
        snprintf(head, sizeof head, "%s%s%s%s%s", d->shrt ? d->shrt : "", d->shrt ? ", " : "",
                 d->name, d->metavar ? " " : "", d->metavar ? d->metavar : "");
        fprintf(f, "  %-21s", head);
        if (strlen(head) >= 21)
            fprintf(f, "\n  %-21s", "");
        for (const char *p = d->help;;) {
            size_t len = strcspn(p, "\n");
            fprintf(f, " %.*s\n", (int)len, p);
            p += len;
            if (!*p++)
                break;
            fprintf(f, "  %-21s", "");
        }
    }
}

int cli_parse(const cli_command *c, int argc, char **argv, cli_args *a)
{
    memset(a, 0, sizeof *a);
    a->cmd = c;
    a->occ_id = malloc(sizeof *a->occ_id * (size_t)(argc + 1));
    a->occ_val = malloc(sizeof *a->occ_val * (size_t)(argc + 1));
    if (!a->occ_id || !a->occ_val) {
        cli_error(c->name, "out of memory");
        return CLI_FAIL;
    }
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *v = NULL, *as;
        const flag_def *d;
        if (arg[0] != '-' || !arg[1]) {
            if (!c->positional || a->positional)
                return cli_bad_arg(c->name, arg);
            a->positional = arg;
            continue;
        }
        if (arg[1] == '-') { /* --name, --name=value */
            size_t len = strcspn(arg, "=");
            if (!(d = find_long(c->bit, arg, len))) {
                if (arg[len]) /* name the option, not its value */
                    cli_error(c->name, "unknown option '%.*s' (see kvslim %s --help)", (int)len,
                              arg, c->name);
                return arg[len] ? CLI_USAGE : cli_bad_arg(c->name, arg);
            }
            as = d->name;
            if (arg[len]) {
                v = arg + len + 1;
                if (d->kind == K_NONE) {
                    cli_error(c->name, "%s takes no value (see kvslim %s --help)", as, c->name);
                    return CLI_USAGE;
                }
            }
        } else { /* -n, -n VALUE, -nVALUE */
            if (!(d = find_short(c->bit, arg[1])) || (d->kind == K_NONE && arg[2]))
                return cli_bad_arg(c->name, arg);
            as = d->shrt;
            if (arg[2])
                v = arg + 2;
        }
        if (d->kind != K_NONE && !v) {
            if (i + 1 >= argc) {
                cli_error(c->name, "%s needs a value (see kvslim %s --help)", as, c->name);
                return CLI_USAGE;
            }
            v = argv[++i];
        }
        if (d->id == FL_HELP) {
            cli_help(c, stdout);
            return CLI_OK;
        }
        if (d->id == FL_VERSION) {
            printf("kvslim %s\n", KVS_VERSION);
            return CLI_OK;
        }
        if (d->id == FL_KV && !strcmp(v, "help")) {
            kvs_kv_policy_help(stdout);
            return CLI_OK;
        }
        if (occurrence(a, d, as, v) != 0)
            return CLI_USAGE;
    }
    return -1;
}

void cli_args_free(cli_args *a)
{
    free(a->occ_id);
    free(a->occ_val);
    a->occ_id = NULL;
    a->occ_val = NULL;
}

const char *cli_each(const cli_args *a, cli_flag_id id, int k)
{
    for (int j = 0; j < a->n_occ; j++)
        if (a->occ_id[j] == id && k-- == 0)
            return a->occ_val[j];
    return NULL;
}

int cli_get_int(const cli_args *a, cli_flag_id id, int def)
{
    return a->given[id] ? (int)a->i[id] : def;
}

double cli_get_f64(const cli_args *a, cli_flag_id id, double def)
{
    return a->given[id] ? a->f[id] : def;
}

const char *cli_get_str(const cli_args *a, cli_flag_id id, const char *def)
{
    return a->given[id] ? a->str[id] : def;
}

int cli_threads(const cli_args *a)
{
    if (!a->given[FL_THREADS])
        return cli_default_threads();
    int n = (int)a->i[FL_THREADS];
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    /* More threads than cores make every barrier wait for a descheduled thread: decode gets
     * many times slower, never faster. */
    if (cpus >= 1 && n > cpus) {
        fprintf(stderr, "kvslim %s: %s %d is more than the %ld online CPU%s; using %ld\n",
                a->cmd->name, a->as[FL_THREADS], n, cpus, cpus == 1 ? "" : "s", cpus);
        n = (int)cpus;
    }
    return n;
}

const char *cli_default_kv_type(const char *cmd)
{
    /* run, bench and serve store F16 as llama.cpp does; eval and logits measure against F32,
     * the reference ../shared/reference was made with. */
    return !strcmp(cmd, "run") || !strcmp(cmd, "bench") || !strcmp(cmd, "serve") ? "f16" : "f32";
}

int cli_session_params(const cli_args *a, kvs_session_params *p)
{
    *p = kvs_session_default_params();
    p->log = cli_notice; /* notices as "kvslim CMD: ..." */
    p->log_ctx = (void *)a->cmd->name;
    p->n_threads = cli_threads(a);
    p->chunk = cli_get_int(a, FL_CHUNK, 0);
    p->exact_matmul = a->given[FL_EXACT_MATMUL] > 0;
    p->kv_type = a->given[FL_KV_TYPE] ? a->str[FL_KV_TYPE] : cli_default_kv_type(a->cmd->name);
    if (!a->given[FL_KV])
        return 0;
    kvs_error err = {0};
    if (kvs_kv_policy_check(a->str[FL_KV], &err) != KVS_OK) {
        cli_error(a->cmd->name, "%s", err.msg);
        return -1;
    }
    p->kv_policy = a->str[FL_KV];
    return 0;
}

int cli_main(const cli_command *cmd, int (*body)(const cli_args *a), int argc, char **argv)
{
    cli_args a;
    int rc = cli_parse(cmd, argc, argv, &a);
    if (rc < 0)
        rc = body(&a);
    cli_args_free(&a);
    return rc;
}
