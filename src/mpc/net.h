/* The two-party engine's transport: framed, counted, optionally AES-256-GCM-protected TCP channels. */
#ifndef KVS_MPC_NET_H
#define KVS_MPC_NET_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "mpc/ops.h"

/* Wire format of one message: a 20-byte little-endian header {u32 magic 'KVS2', u16 op, u16 flags,
 * u32 payload length, u64 sequence}, the payload, and a 16-byte GCM tag when encrypted. */
#define KVS_CHAN_HEADER_BYTES 20
#define KVS_CHAN_TAG_BYTES 16
#define KVS_CHAN_MAX_PAYLOAD ((size_t)1 << 30) /* 1 GiB: larger lengths are rejected */
#define KVS_CHAN_ROLE_DEALER 2

typedef struct kvs_chan kvs_chan; /* one end of a connection between two of the three roles */

typedef struct kvs_chan_params {
    int insecure_plain;     /* 1: no encryption or authentication (loopback measurements) */
    const uint8_t *psk;     /* 32-byte pre-shared key of this link (ignored when plain) */
    int timeout_ms;         /* per receive and per connect attempt; > 0 */
    uint32_t version;       /* protocol version, checked at the handshake */
    int ring_bits, frac_bits; /* session parameters, checked at the handshake */
    uint8_t model_hash[32]; /* checked at the handshake (zero for the dealer link) */
    int role, peer_role;    /* 0 party 0, 1 party 1, 2 dealer: checked */
} kvs_chan_params;

/* Wraps a connected socket (takes ownership of fd: it is closed on failure too, and switched to
 * non-blocking mode) and runs the handshake: each side sends hello {magic, version, role, the role
 * it expects of the peer, ring/frac bits, whether it encrypts, model hash, a 32-byte random
 * nonce}; mismatches fail naming the field and both values. With encryption, per-direction
 * AES-256-GCM keys come from HKDF-SHA256(psk, salt = both nonces, info = direction label and the
 * SHA-256 of both hellos); each side then sends an encrypted key confirmation, so a wrong psk or
 * an altered hello fails the handshake. The 96-bit GCM nonce is the per-direction message counter
 * (the header's sequence number: never reused under one key); the header is the associated data. */
kvs_status kvs_chan_open(int fd, const kvs_chan_params *p, kvs_chan **out, kvs_error *err);
/* Flushes pending sends (best effort, waits at most timeout_ms), closes the socket, frees. */
void kvs_chan_close(kvs_chan *c);

/* One message of n bytes (n may be 0) tagged with op. Sends are buffered until the next receive
 * or kvs_chan_flush, so a protocol step of several sends is one round trip. While flushing, the
 * channel also reads what the peer sends, so two sides flushing large messages at each other
 * cannot deadlock. After any error the channel is unusable (every call fails). */
kvs_status kvs_chan_send(kvs_chan *c, kvs_mpc_op op, const void *buf, size_t n, kvs_error *err);
kvs_status kvs_chan_flush(kvs_chan *c, kvs_error *err);
/* Receives the next message, which must have tag op and exactly n bytes (else KVS_ERR_FORMAT
 * naming what was expected and what came); flushes pending sends first. A failed GCM tag is
 * KVS_ERR_FORMAT and leaves buf zeroed; a timeout (no bytes for timeout_ms) or a closed peer is
 * KVS_ERR_IO. Error messages never contain payload bytes. */
kvs_status kvs_chan_recv(kvs_chan *c, kvs_mpc_op op, void *buf, size_t n, kvs_error *err);

/* Counters per op (index kvs_mpc_op): payload bytes and bytes on the wire (headers, GCM tags)
 * sent and received, messages sent and received, and rounds: a round is counted on the op of a
 * receive that follows a send (the point where this side waits for the peer). The handshake's
 * messages and rounds count under KVS_OP_HANDSHAKE. */
typedef struct kvs_chan_stats {
    uint64_t sent_payload[KVS_OP_N], sent_wire[KVS_OP_N], recv_payload[KVS_OP_N],
        recv_wire[KVS_OP_N], msgs_sent[KVS_OP_N], msgs_recv[KVS_OP_N], rounds[KVS_OP_N];
} kvs_chan_stats;
void kvs_chan_stats_get(const kvs_chan *c, kvs_chan_stats *s);
void kvs_chan_stats_reset(kvs_chan *c);
/* Bytes a message adds on the wire beyond its payload: 20 plain, 36 encrypted. */
size_t kvs_chan_overhead(const kvs_chan *c);

/* Optional transcript capture for the security tests: every payload received (after
 * decryption) and every raw wire byte of each message received (header, ciphertext, tag) are
 * appended to these growable buffers. on = 1 clears both and starts capturing; on = 0 stops and
 * keeps what was captured until the next start or the close. wire = 0: payloads, 1: wire. */
void kvs_chan_capture(kvs_chan *c, int on);
const uint8_t *kvs_chan_captured(const kvs_chan *c, int wire, size_t *n);

/* TCP helpers. listen: host NULL or "" binds every interface; EADDRINUSE -> KVS_ERR_IO "port 7001
 * is in use". accept waits at most timeout_ms ("no peer connected to port 7001 within 10 s").
 * connect retries until timeout_ms ("cannot reach 127.0.0.1:7001: connection refused"). The
 * returned fds are blocking, close-on-exec, with TCP_NODELAY. */
kvs_status kvs_net_listen(const char *host, int port, int *fd, int *bound_port, kvs_error *err); /* port 0: any free port, reported in *bound_port */
kvs_status kvs_net_accept(int listen_fd, int timeout_ms, int *fd, kvs_error *err);
kvs_status kvs_net_connect(const char *host, int port, int timeout_ms, int *fd, kvs_error *err);
/* A fresh 32-byte key from the OS (getrandom), for `mpc run`'s ephemeral keys. */
kvs_status kvs_net_random_key(uint8_t key[32], kvs_error *err);

#endif
