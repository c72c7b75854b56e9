/* kvslim mpc: two-party secure inference (src/mpc/session.h). `mpc run` starts the dealer,
 * party 1 (the server, the weights) and party 0 (the client, the prompt) as three processes on
 * loopback; `mpc dealer` and `mpc party` run one role each, for separate machines.
 *
 * Test hooks (tests/cli/mpc*.sh only), read from the environment by every role:
 * KVS_MPC_TEST_KILL=K makes party 1 (=dealer:K: the dealer) kill itself with SIGKILL before its
 * K-th step, to check that the others fail cleanly; KVS_MPC_TEST_VERSION=V makes the role claim
 * protocol version V at its handshakes. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cli_flags.h"
#include "kvslim_tools.h"

static const cli_command run_cmd = {
    "mpc", CMD_MPC,
    "usage: kvslim mpc run -m MODEL [--tokenizer TOK.bin] (-p TEXT | --tokens FILE\n"
    "                      [--prompt-len P]) -n N [--kv full|mpcache:budget=F,...]\n"
    "                      [--frac F] [--insecure-plain] [--timeout S] [--json OUT]\n"
    "\n"
    "Greedy generation under two-party computation with a dealer, the three roles as separate\n"
    "processes on 127.0.0.1 (fresh ports and fresh 32-byte keys per run): the dealer\n"
    "(correlated randomness, sees no data), party 1 (the server: loads MODEL, its weights stay\n"
    "secret) and party 0 (the client: the prompt; it alone learns the generated tokens, each\n"
    "the argmax of the logits computed on shares: no logit is revealed).\n"
    "Party 0 prints the prompt, the generated text and the cost table per decoded token:\n"
    "online bytes of both parties on the party link (payload and wire), party 0's rounds,\n"
    "dealer bytes (offline), loopback wall time, and the latency a LAN (377 MB/s, 0.3 ms RTT)\n"
    "and a WAN (100 Mbit/s, 40 ms RTT) would add: rounds x RTT + wire bytes / bandwidth. The\n"
    "model hash checked between the parties is the SHA-256 of the -m file. A failing role\n"
    "stops the others; the run then exits 1 naming it.\n"
    "\n",
    NULL};

static const cli_command dealer_cmd = {
    "mpc", CMD_MPC_DEALER,
    "usage: kvslim mpc dealer --listen PORT (--key0 FILE --key1 FILE | --insecure-plain)\n"
    "                         [--frac F] [--model-hash HEX] [--timeout S]\n"
    "\n"
    "The dealer alone: waits for party 0 and party 1 on PORT, sends each its seed of\n"
    "correlated randomness and then the correction words of every step. It never sees the\n"
    "prompt, the weights or any value.\n"
    "\n",
    NULL};

static const cli_command party_cmd = {
    "mpc", CMD_MPC_PARTY,
    "usage: kvslim mpc party --role 1 -m MODEL (--listen PORT | --peer HOST:PORT)\n"
    "                        --dealer HOST:PORT (--peer-key FILE --dealer-key FILE |\n"
    "                        --insecure-plain) [--frac F] [--timeout S]\n"
    "       kvslim mpc party --role 0 -m MODEL (-p TEXT | --tokens FILE [--prompt-len P]) -n N\n"
    "                        [--kv full|mpcache:budget=F,...]\n"
    "                        (--peer HOST:PORT | --listen PORT) --dealer HOST:PORT\n"
    "                        (--peer-key FILE --dealer-key FILE | --insecure-plain)\n"
    "                        [--model-hash HEX] [--frac F] [--timeout S] [--json OUT]\n"
    "\n"
    "One party alone: party 1 serves the model, party 0 owns the prompt and prints what\n"
    "`kvslim mpc run` prints. Start the dealer first, then the listening party, then the\n"
    "other. Keys are files of 64 hex digits (openssl rand -hex 32), the same file on both\n"
    "ends of a link.\n"
    "\n",
    NULL};

static void mpc_usage(FILE *f)
{
    fputs("usage: kvslim mpc run|dealer|party [options]   (kvslim mpc run --help for details)\n"
          "\n"
          "  run     the three roles as processes on this machine: generated text and costs\n"
          "  dealer  the dealer alone (correlated randomness)\n"
          "  party   party 0 (the client, the prompt) or party 1 (the server, the model)\n",
          f);
}

/* ---- small parsers ---- */

static int hexval(int c)
{
    return c >= '0' && c <= '9' ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* 64 hex digits (surrounding whitespace allowed) into 32 bytes; -1 if not. */
static int parse_hex32(const char *s, uint8_t out[32])
{
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
        s++;
    for (int i = 0; i < 32; i++) {
        int hi = hexval((unsigned char)s[2 * i]), lo = hi < 0 ? -1 : hexval((unsigned char)s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    for (s += 64; *s; s++)
        if (*s != ' ' && *s != '\t' && *s != '\n' && *s != '\r')
            return -1;
    return 0;
}

/* A key file for flag; CLI_USAGE after the message. */
static int read_key(const char *flag, const char *path, uint8_t key[32])
{
    char *text = cli_read_file("mpc", path, NULL);
    if (!text) {
        cli_error("mpc", "%s %s: cannot read the key file", flag, path);
        return CLI_USAGE;
    }
    int bad = parse_hex32(text, key);
    memset(text, 0, strlen(text));
    free(text);
    if (bad) {
        cli_error("mpc", "%s %s: a key file holds 64 hex digits (openssl rand -hex 32)", flag,
                  path);
        return CLI_USAGE;
    }
    return CLI_OK;
}

/* HOST:PORT into host (buf) and port; CLI_USAGE after the message. */
static int parse_hostport(const char *flag, const char *v, char *host, size_t size, int *port)
{
    const char *colon = strrchr(v, ':');
    int64_t p;
    if (!colon || colon == v || (size_t)(colon - v) >= size ||
        kvs_parse_i64(colon + 1, 1, 65535, &p) != 0) {
        cli_error("mpc", "%s expects HOST:PORT (port 1 to 65535), got '%s'", flag, v);
        return CLI_USAGE;
    }
    memcpy(host, v, (size_t)(colon - v));
    host[colon - v] = 0;
    *port = (int)p;
    return CLI_OK;
}

/* ---- party 0's output: text as it comes, then the cost table and JSON ---- */

typedef struct p0_out {
    const kvs_model *model;   /* the vocabulary */
    const char *prompt_text;  /* -p, or NULL: print the tokens' pieces */
    const int32_t *tokens;
    int n_tokens;
    int32_t prev;
    char *text; /* the generated text */
    size_t len, cap;
    size_t *ends; /* where each generated token's piece ends in text */
    int n_ends;
} p0_out;

static void on_prefilled(void *ctx)
{
    p0_out *o = ctx;
    if (o->prompt_text) {
        fputs(o->prompt_text, stdout);
    } else {
        for (int i = 0; i < o->n_tokens; i++) {
            if (o->tokens[i] == kvs_token_bos(o->model))
                continue;
            int len;
            const char *p = kvs_token_text(o->model, i ? o->tokens[i - 1] : -1, o->tokens[i], &len);
            fwrite(p, 1, (size_t)len, stdout);
        }
    }
    fflush(stdout);
    o->prev = o->tokens[o->n_tokens - 1];
}

static void on_token(void *ctx, int32_t tok)
{
    p0_out *o = ctx;
    int len;
    const char *p = kvs_token_text(o->model, o->prev, tok, &len);
    o->prev = tok;
    fwrite(p, 1, (size_t)len, stdout);
    fflush(stdout);
    if (o->len + (size_t)len + 1 > o->cap) {
        size_t cap = (o->cap ? 2 * o->cap : 256) + (size_t)len;
        char *t = realloc(o->text, cap);
        if (!t)
            return; /* the JSON text is then short; the terminal got it all */
        o->text = t;
        o->cap = cap;
    }
    memcpy(o->text + o->len, p, (size_t)len);
    o->len += (size_t)len;
    o->text[o->len] = 0;
    size_t *e = realloc(o->ends, sizeof *e * (size_t)(o->n_ends + 1));
    if (e) {
        o->ends = e;
        o->ends[o->n_ends++] = o->len;
    }
}

typedef struct totals {
    double steps, payload, wire, msgs, rounds, dealer, wall, lan, wan, security, sent0, sent1;
} totals;

static totals phase_totals(const kvs_mpc_phase_cost *p, int enc)
{
    totals t = {.steps = (double)p->steps, .payload = (double)p->online_payload,
                .wire = (double)p->online_wire, .msgs = (double)p->online_msgs,
                .rounds = (double)p->rounds,
                .dealer = (double)(p->dealer_payload[0] + p->dealer_payload[1]),
                .wall = p->wall_s, .sent0 = (double)p->online_sent[0],
                .sent1 = (double)p->online_sent[1]};
    t.lan = kvs_mpc_model_seconds(&kvs_mpc_lan, t.rounds, t.wire);
    t.wan = kvs_mpc_model_seconds(&kvs_mpc_wan, t.rounds, t.wire);
    t.security = enc ? (double)KVS_CHAN_TAG_BYTES * t.msgs : 0;
    return t;
}

static totals per(totals t, double n)
{
    if (n <= 0)
        n = 1;
    totals r = {t.steps,     t.payload / n, t.wire / n, t.msgs / n,     t.rounds / n,
                t.dealer / n, t.wall / n,    t.lan / n,  t.wan / n,      t.security / n,
                t.sent0 / n, t.sent1 / n};
    return r;
}

static void print_report(FILE *f, const kvs_mpc_session_result *r, int plain, int frac,
                         const char *model_label, int n_prompt_steps, const char *kv)
{
    const kvs_mpc_phase_cost *ph = r->phase;
    const double nd = (double)ph[KVS_MPC_PHASE_DECODE].steps;
    totals d = per(phase_totals(&ph[KVS_MPC_PHASE_DECODE], !plain), nd);
    totals pf = phase_totals(&ph[KVS_MPC_PHASE_PREFILL], !plain);
    totals su = phase_totals(&ph[KVS_MPC_PHASE_SETUP], !plain);
    char b[6][32];
    fprintf(f, "\n%s\n", plain ? "channels: plain (no encryption) — loopback measurement only"
                               : "channels: AES-256-GCM");
    fprintf(f, "mpc: %s, Z_2^64 with %d fraction bits; %d prompt tokens (prefilled in blocks), "
               "%d generated token%s (%.0f decode step%s)\n", model_label, frac, n_prompt_steps,
            r->n_generated, r->n_generated == 1 ? "" : "s", nd, nd == 1 ? "" : "s");
    fprintf(f, "kv: %s\n", kv && *kv ? kv : "full");
    if (r->forced)
        fprintf(f, "teacher-forced: %d steps, argmax = next token on %d (%.2f%%)\n", r->forced,
                r->forced_top1, 100.0 * r->forced_top1 / r->forced);
    fprintf(f, "%-26s %14s %14s %14s\n", "", "per decode step", "prefill (all)", "setup");
    fprintf(f, "%-26s %14s %14s %14s\n", "online bytes (both)",
            cli_bytes(b[0], 32, d.payload), cli_bytes(b[1], 32, pf.payload),
            cli_bytes(b[2], 32, su.payload));
    fprintf(f, "%-26s %14s %14s %14s\n", "  sent by party 0", cli_bytes(b[0], 32, d.sent0),
            cli_bytes(b[1], 32, pf.sent0), cli_bytes(b[2], 32, su.sent0));
    fprintf(f, "%-26s %14s %14s %14s\n", "  sent by party 1", cli_bytes(b[0], 32, d.sent1),
            cli_bytes(b[1], 32, pf.sent1), cli_bytes(b[2], 32, su.sent1));
    fprintf(f, "%-26s %14s %14s %14s\n", "  on the wire", cli_bytes(b[0], 32, d.wire),
            cli_bytes(b[1], 32, pf.wire), cli_bytes(b[2], 32, su.wire));
    fprintf(f, "%-26s %14s %14s %14s\n", plain ? "  framing (no security)" : "  framing + GCM tags",
            cli_bytes(b[0], 32, d.wire - d.payload), cli_bytes(b[1], 32, pf.wire - pf.payload),
            cli_bytes(b[2], 32, su.wire - su.payload));
    fprintf(f, "%-26s %14.1f %14.0f %14.0f\n", "messages", d.msgs, pf.msgs, su.msgs);
    fprintf(f, "%-26s %14.1f %14.0f %14.0f\n", "rounds (party 0)", d.rounds, pf.rounds,
            su.rounds);
    fprintf(f, "%-26s %14s %14s %14s\n", "dealer bytes (offline)", cli_bytes(b[0], 32, d.dealer),
            cli_bytes(b[1], 32, pf.dealer), cli_bytes(b[2], 32, su.dealer));
    fprintf(f, "%-26s %14.4f %14.4f %14.4f\n", "wall s (loopback)", d.wall, pf.wall, su.wall);
    fprintf(f, "%-26s %14.4f %14.4f %14.4f\n", "LAN s (model)", d.lan, pf.lan, su.lan);
    fprintf(f, "%-26s %14.4f %14.4f %14.4f\n", "WAN s (model)", d.wan, pf.wan, su.wan);
    fprintf(f, "channel security costs %s per decode step (GCM tags, %.0f B per message)%s\n",
            cli_bytes(b[0], 32, d.security), (double)KVS_CHAN_TAG_BYTES,
            plain ? ": not paid, --insecure-plain" : "");
    fprintf(f, "per op, per decode step (online: party link, both parties; rounds: party 0's; "
               "dealer: to both parties):\n");
    fprintf(f, "  %-10s %14s %8s %14s\n", "op", "online bytes", "rounds", "dealer bytes");
    for (int op = 0; op < KVS_OP_N; op++) {
        const double per = nd > 0 ? 1.0 / nd : 1.0;
        const double by = (double)ph[KVS_MPC_PHASE_DECODE].op_bytes[op] * per,
                     ro = (double)ph[KVS_MPC_PHASE_DECODE].op_rounds[op] * per,
                     de = (double)ph[KVS_MPC_PHASE_DECODE].op_dealer[op] * per;
        if (by > 0 || ro > 0 || de > 0)
            fprintf(f, "  %-10s %14s %8.1f %14s\n", kvs_mpc_op_name((kvs_mpc_op)op),
                    cli_bytes(b[0], 32, by), ro, cli_bytes(b[1], 32, de));
    }
    fflush(f);
}

/* s (n bytes) as a JSON string: escapes, and U+FFFD for bytes that are not UTF-8 (a token's
 * piece may be part of a character). */
static void json_text(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        const unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3
                 : (c & 0xf8) == 0xf0 ? 4 : 0;
        for (size_t j = 1; k && j < k; j++)
            if (i + j >= n || ((unsigned char)s[i + j] & 0xc0) != 0x80)
                k = 0;
        if (k == 2 && c < 0xc2)
            k = 0; /* overlong */
        if (k == 0) {
            fputs("\ufffd", f);
            i++;
        } else if (k == 1) {
            if (c == '"' || c == '\\')
                fprintf(f, "\\%c", c);
            else if (c < 0x20)
                fprintf(f, "\\u%04x", c);
            else
                fputc(c, f);
            i++;
        } else {
            fwrite(s + i, 1, k, f);
            i += k;
        }
    }
    fputc('"', f);
}

static void json_phase(FILE *f, const char *name, totals t, int last)
{
    fprintf(f, "  \"%s\": {\"steps\": ", name);
    cli_json_num(f, t.steps);
    const char *k[] = {"online_bytes", "online_bytes_party0", "online_bytes_party1",
                       "online_wire_bytes", "messages", "rounds", "dealer_bytes", "wall_s",
                       "lan_s", "wan_s"};
    const double v[] = {t.payload, t.sent0, t.sent1, t.wire, t.msgs, t.rounds, t.dealer,
                        t.wall, t.lan, t.wan};
    for (int i = 0; i < 10; i++) {
        fprintf(f, ", \"%s\": ", k[i]);
        cli_json_num(f, v[i]);
    }
    fprintf(f, "}%s\n", last ? "" : ",");
}

static char *build_json(const kvs_mpc_session_result *r, const p0_out *o, int plain, int frac,
                        const char *model_label, int prompt_len, const char *kv, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f)
        return NULL;
    const kvs_mpc_phase_cost *ph = r->phase;
    const double nd = (double)ph[KVS_MPC_PHASE_DECODE].steps;
    totals d = per(phase_totals(&ph[KVS_MPC_PHASE_DECODE], !plain), nd);
    fputs("{\n  \"model\": ", f);
    cli_json_str(f, model_label);
    fputs(",\n  \"kv\": ", f);
    cli_json_str(f, kv && *kv ? kv : "full");
    fputs(",\n  \"text\": ", f);
    json_text(f, o->text ? o->text : "", o->len);
    fputs(",\n  \"tokens\": [", f);
    for (int i = 0; i < r->n_generated; i++)
        fprintf(f, "%s%d", i ? ", " : "", (int)r->generated[i]);
    fputs("],\n  \"pieces\": [", f);
    for (int i = 0; i < o->n_ends; i++) {
        const size_t from = i ? o->ends[i - 1] : 0;
        fputs(i ? ", " : "", f);
        json_text(f, o->text + from, o->ends[i] - from);
    }
    fprintf(f, "],\n  \"prompt_tokens\": %d,\n  \"prompt_len\": %d,\n  \"generated\": %d,\n"
               "  \"decode_steps\": %.0f,\n  \"stopped_at_eos\": %s,\n",
            o->n_tokens, prompt_len, r->n_generated, nd, r->stopped_at_end ? "true" : "false");
    fprintf(f, "  \"teacher_forced\": %d,\n  \"teacher_forced_top1\": %d,\n", r->forced,
            r->forced_top1);
    fprintf(f, "  \"frac\": %d,\n  \"ring_bits\": 64,\n  \"insecure_plain\": %s,\n"
               "  \"channels\": \"%s\",\n", frac, plain ? "true" : "false",
            plain ? "plain" : "AES-256-GCM");
    const char *k[] = {"online_bytes_per_token", "online_bytes_party0_per_token",
                       "online_bytes_party1_per_token", "online_wire_bytes_per_token",
                       "channel_security_bytes_per_token", "messages_per_token",
                       "rounds_per_token", "dealer_bytes_per_token", "wall_s_per_token",
                       "lan_s_per_token", "wan_s_per_token"};
    const double v[] = {d.payload, d.sent0, d.sent1, d.wire, d.security, d.msgs,
                        d.rounds, d.dealer, d.wall, d.lan, d.wan};
    for (int i = 0; i < 11; i++) {
        fprintf(f, "  \"%s\": ", k[i]);
        cli_json_num(f, nd > 0 ? v[i] : NAN);
        fputs(",\n", f);
    }
    fprintf(f, "  \"lan\": {\"bytes_per_s\": %.0f, \"rtt_s\": %g},\n", kvs_mpc_lan.bytes_per_s,
            kvs_mpc_lan.rtt_s);
    fprintf(f, "  \"wan\": {\"bytes_per_s\": %.0f, \"rtt_s\": %g},\n", kvs_mpc_wan.bytes_per_s,
            kvs_mpc_wan.rtt_s);
    fputs("  \"ops\": {", f);
    int first = 1;
    for (int op = 0; op < KVS_OP_N; op++) {
        uint64_t any = 0;
        for (int p = 0; p < KVS_MPC_PHASE_N; p++)
            any |= ph[p].op_bytes[op] | ph[p].op_rounds[op] | ph[p].op_dealer[op];
        if (!any)
            continue;
        fprintf(f, "%s\n    \"%s\": {\"bytes\": ", first ? "" : ",",
                kvs_mpc_op_name((kvs_mpc_op)op));
        cli_json_num(f, nd > 0 ? (double)ph[KVS_MPC_PHASE_DECODE].op_bytes[op] / nd : NAN);
        fputs(", \"rounds\": ", f);
        cli_json_num(f, nd > 0 ? (double)ph[KVS_MPC_PHASE_DECODE].op_rounds[op] / nd : NAN);
        fputs(", \"dealer_bytes\": ", f);
        cli_json_num(f, nd > 0 ? (double)ph[KVS_MPC_PHASE_DECODE].op_dealer[op] / nd : NAN);
        fputs(", \"prefill_bytes\": ", f);
        cli_json_num(f, (double)ph[KVS_MPC_PHASE_PREFILL].op_bytes[op]);
        fputs(", \"prefill_rounds\": ", f);
        cli_json_num(f, (double)ph[KVS_MPC_PHASE_PREFILL].op_rounds[op]);
        fputs("}", f);
        first = 0;
    }
    fputs("\n  },\n", f);
    json_phase(f, "setup", phase_totals(&ph[KVS_MPC_PHASE_SETUP], !plain), 0);
    json_phase(f, "prefill", phase_totals(&ph[KVS_MPC_PHASE_PREFILL], !plain), 0);
    json_phase(f, "decode", phase_totals(&ph[KVS_MPC_PHASE_DECODE], !plain), 1);
    fputs("}\n", f);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* ---- one role ---- */

typedef struct role_job {
    kvs_mpc_session_cfg cfg;
    const char *label;        /* "mpc (party 1)": the error prefix */
    /* party 0 */
    const kvs_model *vocab;
    const char *prompt_text;
    const char *model_label;
    const char *json_path;
    kvs_outfile_spec json;
} role_job;

/* The test hooks of the header comment, for this role. */
static void test_hooks(kvs_mpc_session_cfg *cfg)
{
    const char *kill = getenv("KVS_MPC_TEST_KILL"), *version = getenv("KVS_MPC_TEST_VERSION");
    if (kill) {
        const int dealer = strncmp(kill, "dealer:", 7) == 0;
        if (cfg->role == (dealer ? KVS_MPC_DEALER : KVS_MPC_P1))
            cfg->test_kill_step = atoi(kill + (dealer ? 7 : 0));
    }
    if (version)
        cfg->test_version = (uint32_t)strtoul(version, NULL, 10);
}

/* Runs the session; party 0 prints. Returns the exit code. */
static int run_role(role_job *j)
{
    kvs_error err = {0};
    test_hooks(&j->cfg);
    kvs_mpc_session_result res;
    p0_out o = {.model = j->vocab, .prompt_text = j->prompt_text, .tokens = j->cfg.tokens,
                .n_tokens = j->cfg.n_tokens};
    if (j->cfg.role == KVS_MPC_P0) {
        j->cfg.on_prefilled = on_prefilled;
        j->cfg.on_token = on_token;
        j->cfg.cb_ctx = &o;
    }
    kvs_status st = kvs_mpc_session_run(&j->cfg, &res, &err);
    int rc = CLI_OK;
    if (j->cfg.role == KVS_MPC_P0 && (o.len || res.n_generated || res.phase[1].steps))
        fputc('\n', stdout); /* the text ends; an error goes on a line of its own */
    if (st != KVS_OK) {
        cli_error(j->label, "%s", err.msg);
        rc = CLI_FAIL;
    } else if (j->cfg.role == KVS_MPC_P0) {
        print_report(stdout, &res, j->cfg.insecure_plain, j->cfg.frac, j->model_label,
                     j->cfg.prompt_len, j->cfg.kv_spec);
        if (j->json_path) {
            size_t len = 0;
            char *buf = build_json(&res, &o, j->cfg.insecure_plain, j->cfg.frac,
                                   j->model_label, j->cfg.prompt_len, j->cfg.kv_spec, &len);
            if (cli_write_built(j->label, &j->json, buf, len) != 0)
                rc = CLI_FAIL;
        }
    }
    fflush(stdout);
    free(o.text);
    free(o.ends);
    kvs_mpc_session_result_free(&res);
    return rc;
}

/* Party 0's inputs from the flags: tokens, prompt length, N. CLI_OK or the exit code. */
static int client_inputs(const cli_args *a, const kvs_model *model, int32_t **tokens, int *n,
                         int *prompt_len)
{
    const char *text = a->str[FL_PROMPT], *file = a->str[FL_TOKENS];
    kvs_model_info info;
    kvs_model_get_info(model, &info);
    if (text) {
        kvs_error err = {0};
        kvs_status st = kvs_tokenize(model, text, 1, tokens, n, &err);
        if (st != KVS_OK) {
            cli_error("mpc", "-p: %s", err.msg);
            return cli_status_exit(st);
        }
    } else {
        if (cli_read_tokens("mpc", file, tokens, n) != 0)
            return CLI_FAIL;
        for (int i = 0; i < *n; i++)
            if ((*tokens)[i] < 0 || (*tokens)[i] >= info.n_vocab) {
                cli_error("mpc", "--tokens %s: token %d at line %d is outside the vocabulary of "
                                 "%d", file, (int)(*tokens)[i], i + 1, info.n_vocab);
                return CLI_USAGE;
            }
    }
    if (*n < 1) {
        cli_error("mpc", "%s: no tokens", text ? "-p" : "--tokens");
        return CLI_USAGE;
    }
    if (a->str[FL_KV]) { /* checked here, before any connection */
        kvs_mpc_kv_cfg kc;
        kvs_error err = {0};
        if (kvs_mpc_kv_parse(a->str[FL_KV], info.n_layers, &kc, &err) != KVS_OK) {
            cli_error("mpc", "%s", err.msg);
            return CLI_USAGE;
        }
    }
    *prompt_len = a->given[FL_PROMPT_LEN] ? (int)a->i[FL_PROMPT_LEN] : *n;
    if (*prompt_len > *n) {
        cli_error("mpc", "--prompt-len %d is larger than the %d tokens of %s", *prompt_len, *n,
                  file);
        return CLI_USAGE;
    }
    return CLI_OK;
}

/* Flags every party-0 command needs: -m, one of -p/--tokens, -n. */
static int check_client_flags(const cli_args *a)
{
    if (!a->str[FL_PROMPT] == !a->str[FL_TOKENS]) {
        cli_error("mpc", "needs exactly one of -p TEXT or --tokens FILE (the prompt; see --help)");
        return CLI_USAGE;
    }
    if (a->given[FL_PROMPT_LEN] && !a->str[FL_TOKENS]) {
        cli_error("mpc", "--prompt-len needs --tokens FILE");
        return CLI_USAGE;
    }
    if (!a->given[FL_N_PREDICT]) {
        cli_error("mpc", "needs -n N, the tokens to generate (see --help)");
        return CLI_USAGE;
    }
    return CLI_OK;
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* ---- mpc run ---- */

typedef struct child {
    const char *name;
    pid_t pid;
    int done, status;
    int order; /* when it ended: the number of the reap that saw it (from 1) */
} child;

static double mono(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void sleep_ms(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* Reaps what has ended; returns how many are still running. */
static int reap(child *c, int n)
{
    static int rounds;
    int running = 0;
    rounds++;
    for (int i = 0; i < n; i++) {
        if (c[i].done || c[i].pid <= 0)
            continue;
        int status;
        pid_t r = waitpid(c[i].pid, &status, WNOHANG);
        if (r == c[i].pid) {
            c[i].done = 1;
            c[i].status = status;
            c[i].order = rounds;
        } else if (r < 0 && errno == ECHILD) {
            c[i].done = 1;
            c[i].order = rounds;
            c[i].status = 0x7f00; /* unknown: treated as a failure */
        } else {
            running++;
        }
    }
    return running;
}

static int failed(const child *c)
{
    return c->done && !(WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0);
}

/* SIGTERM, then SIGKILL after a second, to the children still running; reaps them all. */
static void stop_all(child *c, int n)
{
    for (int i = 0; i < n; i++)
        if (!c[i].done && c[i].pid > 0)
            kill(c[i].pid, SIGTERM);
    const double t0 = mono();
    while (reap(c, n) > 0 && mono() - t0 < 1.0)
        sleep_ms(10);
    for (int i = 0; i < n; i++)
        if (!c[i].done && c[i].pid > 0)
            kill(c[i].pid, SIGKILL);
    for (int i = 0; i < n; i++)
        if (!c[i].done && c[i].pid > 0 && waitpid(c[i].pid, &c[i].status, 0) == c[i].pid)
            c[i].done = 1, c[i].status = -1;
}

static void describe(const child *c)
{
    if (c->status == -1)
        cli_error("mpc", "%s was stopped (the run had failed)", c->name);
    else if (WIFSIGNALED(c->status))
        cli_error("mpc", "%s was killed by signal %d (%s)", c->name, WTERMSIG(c->status),
                  strsignal(WTERMSIG(c->status)));
    else if (WIFEXITED(c->status))
        cli_error("mpc", "%s failed (exit status %d)", c->name, WEXITSTATUS(c->status));
    else
        cli_error("mpc", "%s ended abnormally", c->name);
}

static int mpc_run(const cli_args *a)
{
    const char *model_path = a->str[FL_MODEL], *tok = a->str[FL_TOKENIZER];
    if (!model_path) {
        cli_error("mpc", "needs -m MODEL (see kvslim mpc run --help)");
        return CLI_USAGE;
    }
    int rc = check_client_flags(a);
    if (rc != CLI_OK)
        return rc;
    const int frac = cli_get_int(a, FL_FRAC, 16), timeout_s = cli_get_int(a, FL_TIMEOUT, 30),
              plain = a->given[FL_INSECURE_PLAIN] > 0, n_gen = (int)a->i[FL_N_PREDICT];
    kvs_outfile_input inputs[3] = {{"-m", model_path}, {"--tokenizer", tok}, {"--tokens", a->str[FL_TOKENS]}};
    kvs_outfile_spec json = cli_output("--json", a->str[FL_JSON], inputs, 3);
    if (a->str[FL_JSON] && cli_check_output("mpc", &json, NULL) != 0)
        return CLI_FAIL;

    kvs_model *model = NULL;
    int32_t *tokens = NULL;
    int n_tokens = 0, prompt_len = 0;
    int lfd[3] = {-1, -1, -1}, port[3] = {0, 0, 0};
    uint8_t psk[3][32], hash[32];
    kvs_error err = {0};
    if ((rc = cli_load_model("mpc", model_path, tok, &model)) != CLI_OK)
        return rc;
    if ((rc = client_inputs(a, model, &tokens, &n_tokens, &prompt_len)) != CLI_OK)
        goto done;
    rc = CLI_FAIL;
    if (kvs_mpc_file_sha256(model_path, hash, &err) != KVS_OK)
        goto fail;
    for (int i = 0; i < 3; i++)
        if (kvs_net_random_key(psk[i], &err) != KVS_OK)
            goto fail;
    /* lfd[0]: party 1 listens for party 0; lfd[1], lfd[2]: the dealer for party 0 and 1 */
    for (int i = 0; i < 3; i++)
        if (kvs_net_listen("127.0.0.1", 0, &lfd[i], &port[i], &err) != KVS_OK)
            goto fail;

    kvs_mpc_session_cfg base = {
        .frac = frac, .insecure_plain = plain, .timeout_ms = timeout_s * 1000,
        .peer_listen_fd = -1, .peer_host = "127.0.0.1", .peer_port = port[0],
        .dealer_host = "127.0.0.1", .dealer_listen_fd = {-1, -1}, .has_model_hash = 1,
        .stop_token = {-1, -1}};
    memcpy(base.model_hash, hash, 32);
    child kids[3] = {{"the dealer", 0, 0, 0, 0}, {"party 1", 0, 0, 0, 0}, {"party 0", 0, 0, 0, 0}};
    const pid_t parent = getpid();
    fflush(stdout);
    fflush(stderr);
    for (int k = 0; k < 3; k++) {
        pid_t pid = fork();
        if (pid < 0) {
            kvs_fail(&err, KVS_ERR_IO, "cannot start %s: %s", kids[k].name, strerror(errno));
            stop_all(kids, k);
            goto fail;
        }
        if (pid > 0) {
            kids[k].pid = pid;
            continue;
        }
        /* the child: dies with the parent */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(CLI_FAIL);
        role_job j = {.cfg = base};
        int code = CLI_OK;
        if (k == 0) {
            j.label = "mpc (dealer)";
            j.cfg.role = KVS_MPC_DEALER;
            j.cfg.dealer_listen_fd[0] = lfd[1];
            j.cfg.dealer_listen_fd[1] = lfd[2];
            j.cfg.psk_to[0] = psk[1];
            j.cfg.psk_to[1] = psk[2];
            close(lfd[0]);
        } else if (k == 1) {
            j.label = "mpc (party 1)";
            j.cfg.role = KVS_MPC_P1;
            j.cfg.peer_listen_fd = lfd[0];
            j.cfg.dealer_port = port[2];
            j.cfg.psk_peer = psk[0];
            j.cfg.psk_dealer = psk[2];
            close(lfd[1]);
            close(lfd[2]);
            /* the server loads its model itself and hashes its own file */
            kvs_model *own = NULL;
            code = cli_load_model(j.label, model_path, tok, &own);
            if (code == CLI_OK && kvs_mpc_file_sha256(model_path, j.cfg.model_hash, &err) != KVS_OK) {
                cli_error(j.label, "%s", err.msg);
                code = CLI_FAIL;
            }
            j.cfg.model = own;
        } else {
            j.label = "mpc (party 0)";
            j.cfg.role = KVS_MPC_P0;
            j.cfg.dealer_port = port[1];
            j.cfg.psk_peer = psk[0];
            j.cfg.psk_dealer = psk[1];
            j.cfg.tokens = tokens;
            j.cfg.kv_spec = a->str[FL_KV];
            j.cfg.n_tokens = n_tokens;
            j.cfg.prompt_len = prompt_len;
            j.cfg.n_gen = n_gen;
            j.cfg.stop_token[0] = kvs_token_eos(model);
            j.cfg.stop_token[1] = kvs_token_bos(model);
            kvs_model_info info;
            kvs_model_get_info(model, &info);
            j.cfg.vocab = info.n_vocab;
            j.vocab = model;
            j.prompt_text = a->str[FL_PROMPT];
            j.model_label = base_name(model_path);
            j.json_path = a->str[FL_JSON];
            j.json = json;
            for (int i = 0; i < 3; i++)
                close(lfd[i]);
        }
        if (code == CLI_OK)
            code = run_role(&j);
        fflush(stdout);
        fflush(stderr);
        _exit(code);
    }
    /* the parent: the listening sockets are the children's now */
    for (int i = 0; i < 3; i++) {
        close(lfd[i]);
        lfd[i] = -1;
    }
    memset(psk, 0, sizeof psk);
    double first_end = 0;
    const double slack = timeout_s + 5.0;
    int first_fail = -1;
    for (;;) {
        int running = reap(kids, 3);
        /* the first to fail: the earliest; among those seen at once, one killed by a signal
         * (the others then only lost their peer) */
        for (int i = 0; i < 3; i++)
            if (failed(&kids[i]) &&
                (first_fail < 0 || kids[i].order < kids[first_fail].order ||
                 (kids[i].order == kids[first_fail].order && WIFSIGNALED(kids[i].status) &&
                  !WIFSIGNALED(kids[first_fail].status))))
                first_fail = i;
        if (first_fail >= 0 || running == 0)
            break;
        if (running < 3 && first_end == 0)
            first_end = mono();
        if (first_end > 0 && mono() - first_end > slack) {
            for (int i = 0; i < 3; i++)
                if (!kids[i].done)
                    cli_error("mpc", "%s did not finish within %.0f s of the others", kids[i].name,
                              slack);
            stop_all(kids, 3);
            rc = CLI_FAIL;
            goto done;
        }
        sleep_ms(5);
    }
    if (first_fail >= 0) {
        stop_all(kids, 3);
        describe(&kids[first_fail]);
        for (int i = 0; i < 3; i++)
            if (i != first_fail && failed(&kids[i]) && kids[i].status != -1)
                describe(&kids[i]);
        rc = CLI_FAIL;
        goto done;
    }
    rc = CLI_OK;
    goto done;
fail:
    cli_error("mpc", "%s", err.msg);
    rc = CLI_FAIL;
done:
    for (int i = 0; i < 3; i++)
        if (lfd[i] >= 0)
            close(lfd[i]);
    free(tokens);
    kvs_model_free(model);
    return rc;
}

/* ---- mpc dealer / mpc party ---- */

static int common_flags(const cli_args *a, role_job *j)
{
    j->cfg.frac = cli_get_int(a, FL_FRAC, 16);
    j->cfg.insecure_plain = a->given[FL_INSECURE_PLAIN] > 0;
    j->cfg.timeout_ms = cli_get_int(a, FL_TIMEOUT, 30) * 1000;
    j->cfg.peer_listen_fd = -1;
    j->cfg.dealer_listen_fd[0] = j->cfg.dealer_listen_fd[1] = -1;
    j->cfg.stop_token[0] = j->cfg.stop_token[1] = -1;
    if (a->str[FL_MODEL_HASH]) {
        if (parse_hex32(a->str[FL_MODEL_HASH], j->cfg.model_hash) != 0) {
            cli_error("mpc", "--model-hash expects 64 hex digits (sha256sum MODEL), got '%s'",
                      a->str[FL_MODEL_HASH]);
            return CLI_USAGE;
        }
        j->cfg.has_model_hash = 1;
    }
    return CLI_OK;
}

static int listen_on(int port, int *fd)
{
    kvs_error err = {0};
    int bound;
    if (kvs_net_listen(NULL, port, fd, &bound, &err) != KVS_OK) {
        cli_error("mpc", "--listen %d: %s", port, err.msg);
        return CLI_FAIL;
    }
    return CLI_OK;
}

static int mpc_dealer(const cli_args *a)
{
    role_job j = {.label = "mpc (dealer)"};
    uint8_t k0[32], k1[32];
    int rc = common_flags(a, &j);
    if (rc != CLI_OK)
        return rc;
    if (!a->given[FL_LISTEN]) {
        cli_error("mpc", "dealer: needs --listen PORT");
        return CLI_USAGE;
    }
    if (!j.cfg.insecure_plain) {
        if (!a->str[FL_KEY0] || !a->str[FL_KEY1]) {
            cli_error("mpc", "dealer: needs --key0 FILE and --key1 FILE (or --insecure-plain)");
            return CLI_USAGE;
        }
        if ((rc = read_key("--key0", a->str[FL_KEY0], k0)) != CLI_OK ||
            (rc = read_key("--key1", a->str[FL_KEY1], k1)) != CLI_OK)
            return rc;
        j.cfg.psk_to[0] = k0;
        j.cfg.psk_to[1] = k1;
    }
    j.cfg.role = KVS_MPC_DEALER;
    int fd = -1;
    if ((rc = listen_on((int)a->i[FL_LISTEN], &fd)) != CLI_OK)
        return rc;
    j.cfg.dealer_listen_fd[0] = j.cfg.dealer_listen_fd[1] = fd;
    rc = run_role(&j);
    memset(k0, 0, sizeof k0);
    memset(k1, 0, sizeof k1);
    return rc;
}

static int mpc_party(const cli_args *a)
{
    role_job j = {0};
    uint8_t kp[32], kd[32];
    char peer_host[256], dealer_host[256];
    int rc = common_flags(a, &j);
    if (rc != CLI_OK)
        return rc;
    if (!a->given[FL_ROLE]) {
        cli_error("mpc", "party: needs --role 0 or --role 1");
        return CLI_USAGE;
    }
    const int role = (int)a->i[FL_ROLE];
    j.label = role ? "mpc (party 1)" : "mpc (party 0)";
    j.cfg.role = role ? KVS_MPC_P1 : KVS_MPC_P0;
    if (!a->str[FL_MODEL]) {
        cli_error("mpc", "party %d: needs -m MODEL (%s)", role,
                  role ? "the model it serves" : "the vocabulary");
        return CLI_USAGE;
    }
    if (role == 0 && (rc = check_client_flags(a)) != CLI_OK)
        return rc;
    if (role == 1 && (a->str[FL_PROMPT] || a->str[FL_TOKENS] || a->given[FL_N_PREDICT] ||
                      a->str[FL_JSON] || a->str[FL_KV])) {
        cli_error("mpc", "party 1: -p, --tokens, -n, --kv and --json are party 0's (party 1 and "
                         "the dealer learn the KV configuration at the handshake)");
        return CLI_USAGE;
    }
    if (!a->given[FL_LISTEN] == !a->str[FL_PEER]) {
        cli_error("mpc", "party %d: needs exactly one of --listen PORT or --peer HOST:PORT", role);
        return CLI_USAGE;
    }
    if (!a->str[FL_DEALER]) {
        cli_error("mpc", "party %d: needs --dealer HOST:PORT", role);
        return CLI_USAGE;
    }
    if (a->str[FL_PEER] &&
        (rc = parse_hostport("--peer", a->str[FL_PEER], peer_host, sizeof peer_host,
                             &j.cfg.peer_port)) != CLI_OK)
        return rc;
    if ((rc = parse_hostport("--dealer", a->str[FL_DEALER], dealer_host, sizeof dealer_host,
                             &j.cfg.dealer_port)) != CLI_OK)
        return rc;
    j.cfg.peer_host = peer_host;
    j.cfg.dealer_host = dealer_host;
    if (!j.cfg.insecure_plain) {
        if (!a->str[FL_PEER_KEY] || !a->str[FL_DEALER_KEY]) {
            cli_error("mpc", "party %d: needs --peer-key FILE and --dealer-key FILE (or "
                             "--insecure-plain)", role);
            return CLI_USAGE;
        }
        if ((rc = read_key("--peer-key", a->str[FL_PEER_KEY], kp)) != CLI_OK ||
            (rc = read_key("--dealer-key", a->str[FL_DEALER_KEY], kd)) != CLI_OK)
            return rc;
        j.cfg.psk_peer = kp;
        j.cfg.psk_dealer = kd;
    }
    const char *model_path = a->str[FL_MODEL], *tok = a->str[FL_TOKENIZER];
    kvs_outfile_input inputs[3] = {{"-m", model_path}, {"--tokenizer", tok}, {"--tokens", a->str[FL_TOKENS]}};
    j.json = cli_output("--json", a->str[FL_JSON], inputs, 3);
    if (a->str[FL_JSON] && cli_check_output("mpc", &j.json, NULL) != 0)
        return CLI_FAIL;
    kvs_model *model = NULL;
    int32_t *tokens = NULL;
    if ((rc = cli_load_model(j.label, model_path, tok, &model)) != CLI_OK)
        return rc;
    kvs_error err = {0};
    if (role == 1 || !j.cfg.has_model_hash) {
        if (kvs_mpc_file_sha256(model_path, j.cfg.model_hash, &err) != KVS_OK) {
            cli_error(j.label, "%s", err.msg);
            rc = CLI_FAIL;
            goto done;
        }
        j.cfg.has_model_hash = 1;
    }
    if (role == 1) {
        j.cfg.model = model;
    } else {
        int n = 0, p = 0;
        if ((rc = client_inputs(a, model, &tokens, &n, &p)) != CLI_OK)
            goto done;
        kvs_model_info info;
        kvs_model_get_info(model, &info);
        j.cfg.tokens = tokens;
        j.cfg.kv_spec = a->str[FL_KV];
        j.cfg.n_tokens = n;
        j.cfg.prompt_len = p;
        j.cfg.n_gen = (int)a->i[FL_N_PREDICT];
        j.cfg.stop_token[0] = kvs_token_eos(model);
        j.cfg.stop_token[1] = kvs_token_bos(model);
        j.cfg.vocab = info.n_vocab;
        j.vocab = model;
        j.prompt_text = a->str[FL_PROMPT];
        j.model_label = base_name(model_path);
        j.json_path = a->str[FL_JSON];
    }
    if (a->given[FL_LISTEN] && (rc = listen_on((int)a->i[FL_LISTEN], &j.cfg.peer_listen_fd)) != CLI_OK)
        goto done;
    rc = run_role(&j);
done:
    memset(kp, 0, sizeof kp);
    memset(kd, 0, sizeof kd);
    free(tokens);
    kvs_model_free(model);
    return rc;
}

int cmd_mpc(int argc, char **argv)
{
    if (argc < 2) {
        mpc_usage(stderr);
        return CLI_USAGE;
    }
    const char *sub = argv[1];
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
        mpc_usage(stdout);
        return CLI_OK;
    }
    if (!strcmp(sub, "run"))
        return cli_main(&run_cmd, mpc_run, argc - 1, argv + 1);
    if (!strcmp(sub, "dealer"))
        return cli_main(&dealer_cmd, mpc_dealer, argc - 1, argv + 1);
    if (!strcmp(sub, "party"))
        return cli_main(&party_cmd, mpc_party, argc - 1, argv + 1);
    cli_error("mpc", "unknown subcommand '%s' (run, dealer or party)", sub);
    mpc_usage(stderr);
    return CLI_USAGE;
}
