/* The operation types the two-party engine counts bytes, messages and rounds by (the rows of its
 * cost table). Every message on a channel carries one of them; the dealer's correlated
 * randomness carries the op of the gate it serves. */
#ifndef KVS_MPC_OPS_H
#define KVS_MPC_OPS_H

typedef enum kvs_mpc_op {
    KVS_OP_HANDSHAKE, /* protocol version, roles, parameters, model hash, key agreement */
    KVS_OP_INPUT,     /* sharing an input (the prompt's embeddings, the masked weights) */
    KVS_OP_MATMUL,    /* linear layers: x W with the server's weights */
    KVS_OP_MUL,       /* products of two shared values (Beaver) */
    KVS_OP_TRUNC,     /* fixed-point truncation */
    KVS_OP_CMP,       /* comparisons (DCF) */
    KVS_OP_LUT,       /* table lookups (DPF): exp, reciprocal, rsqrt, SiLU */
    KVS_OP_SOFTMAX,   /* softmax's max tree and normalisation */
    KVS_OP_RMSNORM,
    KVS_OP_SILU,
    KVS_OP_ARGMAX,
    KVS_OP_TOPK,      /* selection (next issue: MPCache) */
    KVS_OP_GATHER,
    KVS_OP_OPEN,      /* revealing an output */
    KVS_OP_N
} kvs_mpc_op;

/* The op's name in cost tables and JSON ("matmul", "softmax", ...). */
const char *kvs_mpc_op_name(kvs_mpc_op op);

#endif
