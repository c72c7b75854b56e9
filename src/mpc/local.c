/* The three roles of a two-party program on three threads of one process (local.h). */
#include "mpc/local.h"

#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "mpc/gates.h"

typedef struct role_ctx {
    kvs_mpc_role role;
    int fd_peer, fd_dealer, fd_to[2];
    const uint8_t *psk_peer, *psk_dealer[2];
    kvs_mpc_program prog;
    void *ctx;
    const kvs_mpc_local_cfg *cfg;
    kvs_mpc_local_result *res;
} role_ctx;

static kvs_status open_chan(const role_ctx *r, int fd, int peer, const uint8_t *psk,
                            kvs_chan **c, kvs_error *err)
{
    kvs_chan_params p = {.insecure_plain = r->cfg->insecure_plain, .psk = psk,
                         .timeout_ms = r->cfg->timeout_ms > 0 ? r->cfg->timeout_ms : 10000,
                         .version = 1, .ring_bits = 64, .frac_bits = r->cfg->frac,
                         .role = (int)r->role, .peer_role = peer};
    return kvs_chan_open(fd, &p, c, err);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *run_role(void *arg)
{
    role_ctx *r = arg;
    kvs_error err = {0};
    const double t0 = now();
    kvs_mpc m = {.role = r->role, .frac = r->cfg->frac};
    kvs_status st = kvs_prg_new(r->cfg->own_seed[r->role], &m.own, &err);
    for (int b = 0; b < 2 && st == KVS_OK; b++)
        if ((int)r->role == b || r->role == KVS_MPC_DEALER)
            st = kvs_prg_new(r->cfg->corr_seed[b], &m.corr[b], &err);
    if (r->role == KVS_MPC_DEALER) {
        for (int b = 0; b < 2 && st == KVS_OK; b++)
            st = open_chan(r, r->fd_to[b], b, r->psk_dealer[b], &m.to[b], &err);
    } else {
        const int me = (int)r->role;
        if (st == KVS_OK)
            st = open_chan(r, r->fd_dealer, KVS_MPC_DEALER, r->psk_dealer[me], &m.dealer, &err);
        if (st == KVS_OK)
            st = open_chan(r, r->fd_peer, 1 - me, r->psk_peer, &m.peer, &err);
    }
    /* channels own their fds from here on (kvs_chan_open closes them on failure too) */
    r->fd_peer = r->fd_dealer = r->fd_to[0] = r->fd_to[1] = -1;
    if (st == KVS_OK && m.peer && r->cfg->capture)
        kvs_chan_capture(m.peer, 1);
    if (st == KVS_OK)
        st = r->prog(&m, r->ctx, &err);
    kvs_chan *all[4] = {m.peer, m.dealer, m.to[0], m.to[1]};
    for (int i = 0; i < 4; i++)
        if (all[i] && st == KVS_OK)
            st = kvs_chan_flush(all[i], &err);
    kvs_mpc_local_result *res = r->res;
    if (m.peer)
        kvs_chan_stats_get(m.peer, &res->peer);
    if (m.peer && r->cfg->capture) {
        size_t n = 0;
        const uint8_t *p = kvs_chan_captured(m.peer, 0, &n);
        if (n && (res->payload = malloc(n))) {
            memcpy(res->payload, p, n);
            res->payload_len = n;
        }
        p = kvs_chan_captured(m.peer, 1, &n);
        if (n && (res->wire = malloc(n))) {
            memcpy(res->wire, p, n);
            res->wire_len = n;
        }
    }
    if (m.dealer)
        kvs_chan_stats_get(m.dealer, &res->dealer);
    for (int b = 0; b < 2; b++)
        if (m.to[b]) {
            kvs_chan_stats s;
            kvs_chan_stats_get(m.to[b], &s);
            for (int op = 0; op < KVS_OP_N; op++) {
                res->dealer.sent_payload[op] += s.sent_payload[op];
                res->dealer.sent_wire[op] += s.sent_wire[op];
                res->dealer.msgs_sent[op] += s.msgs_sent[op];
            }
        }
    res->dealer_bytes = m.dealer_bytes;
    res->st = st;
    snprintf(res->msg, sizeof res->msg, "%s", st == KVS_OK ? "" : err.msg);
    for (int i = 0; i < 4; i++)
        kvs_chan_close(all[i]);
    kvs_prg_free(m.own);
    kvs_prg_free(m.corr[0]);
    kvs_prg_free(m.corr[1]);
    res->seconds = now() - t0;
    return NULL;
}

void kvs_mpc_local_result_free(kvs_mpc_local_result *r)
{
    free(r->payload);
    free(r->wire);
    r->payload = r->wire = NULL;
    r->payload_len = r->wire_len = 0;
}

kvs_status kvs_mpc_run_local(kvs_mpc_program prog, void *ctx, const kvs_mpc_local_cfg *cfg,
                             kvs_mpc_local_result res[3], kvs_error *err)
{
    int pp[2] = {-1, -1}, d0[2] = {-1, -1}, d1[2] = {-1, -1};
    uint8_t psk[3][32];
    kvs_status st = KVS_OK;
    for (int i = 0; i < 3 && st == KVS_OK && !cfg->insecure_plain; i++)
        st = kvs_net_random_key(psk[i], err);
    if (st != KVS_OK)
        return st;
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pp) || socketpair(AF_UNIX, SOCK_STREAM, 0, d0) ||
        socketpair(AF_UNIX, SOCK_STREAM, 0, d1)) {
        int fds[6] = {pp[0], pp[1], d0[0], d0[1], d1[0], d1[1]};
        for (int i = 0; i < 6; i++)
            if (fds[i] >= 0)
                close(fds[i]);
        return kvs_fail(err, KVS_ERR_IO, "cannot make socket pairs for a local run");
    }
    role_ctx r[3] = {
        {.role = KVS_MPC_P0, .fd_peer = pp[0], .fd_dealer = d0[1], .fd_to = {-1, -1}},
        {.role = KVS_MPC_P1, .fd_peer = pp[1], .fd_dealer = d1[1], .fd_to = {-1, -1}},
        {.role = KVS_MPC_DEALER, .fd_peer = -1, .fd_dealer = -1, .fd_to = {d0[0], d1[0]}},
    };
    pthread_t t[3];
    int started = 0;
    for (int i = 0; i < 3; i++) {
        r[i].psk_peer = psk[0];
        r[i].psk_dealer[0] = psk[1];
        r[i].psk_dealer[1] = psk[2];
        r[i].prog = prog;
        r[i].ctx = ctx;
        r[i].cfg = cfg;
        r[i].res = &res[i];
        memset(&res[i], 0, sizeof res[i]);
    }
    for (; started < 3; started++)
        if (pthread_create(&t[started], NULL, run_role, &r[started]))
            break;
    for (int i = 0; i < started; i++)
        pthread_join(t[i], NULL);
    if (started < 3) {
        /* a role that never started leaves its peers to time out; close what it owned */
        for (int i = started; i < 3; i++) {
            int fds[4] = {r[i].fd_peer, r[i].fd_dealer, r[i].fd_to[0], r[i].fd_to[1]};
            for (int j = 0; j < 4; j++)
                if (fds[j] >= 0)
                    close(fds[j]);
        }
        return kvs_fail(err, KVS_ERR_NOMEM, "cannot start the threads of a local run");
    }
    for (int i = 0; i < 3; i++)
        if (res[i].st != KVS_OK)
            return kvs_fail(err, res[i].st, "%s: %s",
                            i == 2 ? "dealer" : i == 0 ? "party 0" : "party 1", res[i].msg);
    return KVS_OK;
}

kvs_status kvs_mpc_barrier(kvs_mpc *m, kvs_error *err)
{
    uint8_t none = 0;
    kvs_status st = KVS_OK;
    if (kvs_mpc_is_dealer(m)) {
        for (int b = 0; b < 2 && st == KVS_OK; b++)
            st = kvs_chan_recv(m->to[b], KVS_OP_OPEN, &none, 0, err);
        for (int b = 0; b < 2 && st == KVS_OK; b++)
            if ((st = kvs_chan_send(m->to[b], KVS_OP_OPEN, &none, 0, err)) == KVS_OK)
                st = kvs_chan_flush(m->to[b], err);
        return st;
    }
    st = kvs_chan_send(m->dealer, KVS_OP_OPEN, &none, 0, err);
    if (st == KVS_OK)
        st = kvs_chan_recv(m->dealer, KVS_OP_OPEN, &none, 0, err);
    uint64_t one = m->role == KVS_MPC_P0, got = 0;
    return st == KVS_OK ? kvs_mpc_open(m, KVS_OP_OPEN, &one, 1, &got, err) : st;
}
