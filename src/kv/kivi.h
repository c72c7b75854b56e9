/* KIVI quantised KV storage parameters (minicache.md §2.10): keys per channel in groups of G
 * tokens, values per token in groups of G channels, fp16 scale and min per group, and an fp16
 * residual window of the newest tokens (keys flushed R at a time, values once older than R). */
#ifndef KVS_KIVI_H
#define KVS_KIVI_H

#include "core/error.h"

typedef struct kvs_kivi_cfg {
    int k_bits, v_bits; /* 0 = not a KIVI store */
    int group;          /* G */
    int residual;       /* R, a multiple of G */
} kvs_kivi_cfg;

#define KVS_KIVI_MAX_GROUP 1024
#define KVS_KIVI_MAX_RESIDUAL 65536

/* Parses a --kv-type value: "kivi4", "kivi2", or "kivi:kbits=4,vbits=2,group=32,residual=128"
 * (omitted fields take the kivi4 defaults). Returns 1 with *out set for a KIVI type, 0 if name
 * is not a KIVI type (*out zeroed), or -1 with err set for a KIVI type with bad parameters. */
int kvs_kivi_parse(const char *name, kvs_kivi_cfg *out, kvs_error *err);

#endif
