/* The two-party engine's per-process context: the role (party 0, party 1 or the dealer), the
 * fixed-point format, the channels and the PRG streams shared with the dealer. Every gate takes
 * it; the dealer runs the same gate calls with no data (shapes only) and produces the
 * correlated randomness the parties consume in the same order. */
#ifndef KVS_MPC_MPC_H
#define KVS_MPC_MPC_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "mpc/net.h"
#include "mpc/prg.h"

typedef enum kvs_mpc_role { KVS_MPC_P0 = 0, KVS_MPC_P1 = 1, KVS_MPC_DEALER = 2 } kvs_mpc_role;

typedef struct kvs_mpc {
    kvs_mpc_role role;
    int frac;             /* fixed-point fraction bits: value v is round(v 2^frac) in Z_2^64 */
    kvs_chan *peer;       /* a party: the other party */
    kvs_chan *dealer;     /* a party: the dealer */
    kvs_chan *to[2];      /* the dealer: party 0 and party 1 */
    kvs_prg *corr[2];     /* a party b: corr[b], the stream it shares with the dealer; the
                           * dealer: both */
    kvs_prg *own;         /* private randomness (input shares) */
    uint64_t dealer_bytes; /* correlated-randomness bytes that travelled from the dealer */
} kvs_mpc;

static inline int kvs_mpc_is_dealer(const kvs_mpc *m) { return m->role == KVS_MPC_DEALER; }

/* A share plus a public constant: party 0 adds it, party 1 keeps its share (the constant is then
 * shared as (v, 0)). */
static inline uint64_t kvs_mpc_add_public(const kvs_mpc *m, uint64_t share, uint64_t v)
{
    return m->role == KVS_MPC_P0 ? share + v : share;
}

/* The channel a party receives dealer material on, or the dealer's channel to party b. */
static inline kvs_chan *kvs_mpc_dealer_chan(const kvs_mpc *m, int b)
{
    return kvs_mpc_is_dealer(m) ? m->to[b] : m->dealer;
}

#endif
