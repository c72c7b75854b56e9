#include "kvslim.h"

const char *kvs_status_name(kvs_status s)
{
    switch (s) {
    case KVS_OK: return "ok";
    case KVS_ERR_IO: return "i/o error";
    case KVS_ERR_FORMAT: return "format error";
    case KVS_ERR_UNSUPPORTED: return "unsupported";
    case KVS_ERR_ARG: return "bad argument";
    case KVS_ERR_NOMEM: return "out of memory";
    }
    return "unknown status";
}
