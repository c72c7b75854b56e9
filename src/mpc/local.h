/* Runs the three roles of a two-party program in one process: three threads joined by socket
 * pairs and real channels (the tests, and single-machine measurements without process
 * start-up). Each role gets its own context (mpc.h) with PRG streams from the given seeds. */
#ifndef KVS_MPC_LOCAL_H
#define KVS_MPC_LOCAL_H

#include "mpc/mpc.h"

/* The program every role runs; ctx is shared (read-only inputs; each role writes only its own
 * outputs, indexed by m->role). */
typedef kvs_status (*kvs_mpc_program)(kvs_mpc *m, void *ctx, kvs_error *err);

typedef struct kvs_mpc_local_cfg {
    int frac;                 /* fixed-point fraction bits */
    int insecure_plain;       /* 0: AES-256-GCM channels with fresh keys */
    uint8_t corr_seed[2][16]; /* party b's stream shared with the dealer */
    uint8_t own_seed[3][16];  /* each role's private stream */
    int timeout_ms;           /* per receive; 0: 10 s */
    int capture;              /* keep what each party receives from the other (the tests) */
} kvs_mpc_local_cfg;

/* What one role ended with. */
typedef struct kvs_mpc_local_result {
    kvs_status st;
    char msg[600];
    kvs_chan_stats peer;   /* a party: its channel to the other party */
    kvs_chan_stats dealer; /* a party: its channel to the dealer; the dealer: both summed */
    uint64_t dealer_bytes;
    double seconds;
    /* with capture, a party: every payload byte and every wire byte it received from the other
     * party, in order (malloc'd; kvs_mpc_local_result_free) */
    uint8_t *payload, *wire;
    size_t payload_len, wire_len;
} kvs_mpc_local_result;

void kvs_mpc_local_result_free(kvs_mpc_local_result *r);

/* Measurements only: every role waits for the others (the parties meet the dealer with empty
 * messages, then each other with a one-word opening), so that a phase timed after it starts
 * together; its messages count under KVS_OP_OPEN. */
kvs_status kvs_mpc_barrier(kvs_mpc *m, kvs_error *err);

/* Runs prog on the three roles; res[0], res[1]: the parties, res[2]: the dealer. Returns
 * KVS_OK when every role did, else the first failure (its message in err). */
kvs_status kvs_mpc_run_local(kvs_mpc_program prog, void *ctx, const kvs_mpc_local_cfg *cfg,
                             kvs_mpc_local_result res[3], kvs_error *err);

#endif
