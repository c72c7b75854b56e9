/* Names of the two-party engine's operation types (ops.h). */
#include "mpc/ops.h"

const char *kvs_mpc_op_name(kvs_mpc_op op)
{
    static const char *const names[KVS_OP_N] = {
        "handshake", "input", "matmul", "mul", "trunc", "cmp", "lut", "softmax",
        "rmsnorm", "silu", "argmax", "topk", "gather", "open"};
    return op >= 0 && op < KVS_OP_N ? names[op] : "?";
}
