/* One role of a two-party inference session over TCP (the library part of `kvslim mpc`): the
 * connections, the session setup messages, the step loop of greedy decoding and its cost
 * accounting, and the cost model that turns counts into LAN/WAN latencies.
 *
 * Session protocol (after each link's channel handshake, net.h; every message below is on op
 * KVS_OP_HANDSHAKE):
 *   1. the dealer draws two 16-byte seeds from the OS and sends seed b to party b: the
 *      correlated-randomness stream m.corr[b] (each role's private stream is an OS seed);
 *   2. party 1 sends the public model shape and the SHA-256 of its model file to party 0 and to
 *      the dealer (the party link's handshake already checked the hash party 0 expects; the
 *      dealer checks it when it was given one);
 *   3. party 0 sends the public step plan {tokens T, prompt length P, tokens to generate N} to
 *      party 1 and to the dealer, then its KV configuration (a --kv text of 256 bytes at most:
 *      "full" or "mpcache:budget=F,...", public like the budgets of any deployment; which
 *      tokens it keeps stays secret), which every role parses (mpcache.h);
 *   4. every role runs kvs_mpc_llama_setup (party 1 with its model) and attaches the KV
 *      selection;
 *   5. before each step party 0 sends party 1 and the dealer one control byte (1: a step
 *      follows, 0: the session ends; so the number of generated tokens, stopped early at EOS
 *      or BOS, is public, as in any deployment where the server sees the client's requests);
 *      every role runs kvs_mpc_llama_step; after step i >= P - 1 the argmax of the logits
 *      (the first of ties) is computed on shares and revealed to party 0 alone (KVS_OP_ARGMAX;
 *      no logit is revealed): a teacher-forced check while i < T - 1, else the next token,
 *      fed to the next step. Party 1 never learns a token;
 *   6. party 1 sends party 0 its cost counts (dealer bytes it received and its rounds per
 *      phase: public), so party 0 can report both parties.
 *
 * Phases of the accounting: setup (connections, steps 1-4), prefill (steps 0 .. P - 1 with the
 * first reveal), decode (the steps after: teacher-forced, then generated tokens, and the final
 * control byte). */
#ifndef KVS_MPC_SESSION_H
#define KVS_MPC_SESSION_H

#include <stdint.h>

#include "mpc/mpc.h"

struct kvs_model;

enum { KVS_MPC_PHASE_SETUP, KVS_MPC_PHASE_PREFILL, KVS_MPC_PHASE_DECODE, KVS_MPC_PHASE_N };

/* The protocol version both ends of every link must speak (checked at the handshake). */
#define KVS_MPC_PROTOCOL_VERSION 2

typedef struct kvs_mpc_session_cfg {
    kvs_mpc_role role;
    int frac;           /* fixed-point fraction bits */
    int insecure_plain; /* 1: channels without encryption */
    int timeout_ms;     /* per connect, accept and receive; > 0 */
    /* 32-byte keys: a party: psk_peer (the party link) and psk_dealer (its dealer link); the
     * dealer: psk_to[0], psk_to[1]. Ignored when insecure_plain. */
    const uint8_t *psk_peer, *psk_dealer, *psk_to[2];
    /* Where the links come from: a listening socket (>= 0, accepted on; the session closes
     * it) or host:port to connect to. Party 1 accepts party 0 (peer_listen_fd) or, with -1,
     * connects to peer_host:peer_port; party 0 connects (or accepts when peer_listen_fd >= 0).
     * The parties connect to the dealer (dealer_host:dealer_port); the dealer accepts party b
     * on dealer_listen_fd[b] (the same fd twice is fine: it accepts twice and tells the two
     * parties apart: each party sends one byte, its role, right after connecting to the
     * dealer, before the channel handshake, which then checks that role). */
    int peer_listen_fd;
    const char *peer_host;
    int peer_port;
    const char *dealer_host;
    int dealer_port;
    int dealer_listen_fd[2];
    /* The SHA-256 of party 1's model file: party 1's own; what party 0 expects (required);
     * what the dealer expects when has_model_hash (else it accepts party 1's). */
    uint8_t model_hash[32];
    int has_model_hash;
    const struct kvs_model *model; /* party 1 */
    /* Party 0: the tokens (T >= 1), the prompt length P (1 <= P <= T; the tokens after P are
     * teacher-forced), the tokens to generate N >= 0, the tokens that stop generation (EOS,
     * BOS; -1: none) and the vocabulary it expects (0: any). */
    const int32_t *tokens;
    int n_tokens, prompt_len, n_gen;
    const char *kv_spec; /* party 0: the KV configuration (NULL: the full cache) */
    int32_t stop_token[2];
    int vocab;
    /* Party 0's callbacks (may be NULL): after the last prompt token's step; each generated
     * token. */
    void (*on_prefilled)(void *ctx);
    void (*on_token)(void *ctx, int32_t token);
    void *cb_ctx;
    /* Tests only (KVS_MPC_TEST_KILL): this role (party 1 or the dealer) kills itself with
     * SIGKILL before step k (k >= 1 counts from 1; 0: never). */
    int test_kill_step;
    /* Tests only (KVS_MPC_TEST_VERSION): the protocol version this role claims at the
     * handshake (0: the real one, KVS_MPC_PROTOCOL_VERSION). */
    uint32_t test_version;
} kvs_mpc_session_cfg;

/* One phase's costs, as party 0 saw them (and party 1 reported). */
typedef struct kvs_mpc_phase_cost {
    uint64_t steps;
    double wall_s;                  /* party 0's wall time */
    uint64_t online_payload;        /* party link: payload sent + received (both parties) */
    uint64_t online_sent[2];        /* of it, what party 0 and party 1 sent */
    uint64_t online_wire;           /* the same on the wire (headers, GCM tags) */
    uint64_t online_msgs;           /* messages sent + received on the party link */
    uint64_t rounds;                /* party 0's rounds on the party link */
    uint64_t rounds_p1;             /* party 1's (reported) */
    uint64_t dealer_payload[2], dealer_wire[2]; /* received from the dealer, per party */
    uint64_t op_bytes[KVS_OP_N];    /* party link payload per op, both directions */
    uint64_t op_rounds[KVS_OP_N];   /* party 0's rounds per op */
    uint64_t op_dealer[KVS_OP_N];   /* dealer payload per op, received by both parties */
} kvs_mpc_phase_cost;

typedef struct kvs_mpc_session_result {
    int vocab, dim, n_layers; /* the public shape (from party 1) */
    kvs_mpc_phase_cost phase[KVS_MPC_PHASE_N]; /* party 0 fills it all; the others their own */
    int32_t *generated;  /* party 0: the generated tokens (malloc'd) */
    int n_generated;
    int stopped_at_end;  /* party 0: generation met a stop token */
    int forced, forced_top1; /* party 0: teacher-forced steps and how many the argmax got */
    double total_s;
} kvs_mpc_session_result;

/* Runs cfg->role's side of a session to its end. Errors name the link and the peer
 * ("party 1: cannot reach 127.0.0.1:7001 ...") and never contain shares or keys. res is
 * filled as far as the session got; free it with kvs_mpc_session_result_free. */
kvs_status kvs_mpc_session_run(const kvs_mpc_session_cfg *cfg, kvs_mpc_session_result *res,
                               kvs_error *err);
void kvs_mpc_session_result_free(kvs_mpc_session_result *res);

/* The cost model: seconds = rounds x RTT + bytes / bandwidth. */
typedef struct kvs_mpc_netmodel {
    const char *name;
    double bytes_per_s, rtt_s;
} kvs_mpc_netmodel;
extern const kvs_mpc_netmodel kvs_mpc_lan; /* 377 MB/s, 0.3 ms RTT (MPCache's LAN) */
extern const kvs_mpc_netmodel kvs_mpc_wan; /* 100 Mbit/s, 40 ms RTT */
double kvs_mpc_model_seconds(const kvs_mpc_netmodel *net, double rounds, double bytes);

/* The SHA-256 of a whole file (OpenSSL EVP): the model hash the party link checks. */
kvs_status kvs_mpc_file_sha256(const char *path, uint8_t out[32], kvs_error *err);

#endif
