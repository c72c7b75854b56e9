/* KIVI attention kernels (kernels_kivi.c), on the layouts of the KIVI store (kv/kv_store.c):
 *  - a key group of n tokens is channel-major: channel c's n codes sit at bits (c * n + j) * b,
 *    so that one channel's codes of every token in the group are contiguous and a group's
 *    scores are a sum over channels of a broadcast weight times a vector of codes;
 *  - a value row is one token's packed codes, then fp16 scale and min per group of channels
 *    (kvs_kivi_value_row_bytes in kernels.h).
 * Each kernel has a scalar reference (_ref) that the tests hold it to. */
#ifndef KVS_KERNELS_KIVI_H
#define KVS_KERNELS_KIVI_H

#include <stddef.h>
#include <stdint.h>

/* kvs_kivi_code (kernels.h) against the scale and min already converted to floats. */
int kvs_kivi_code_f(float x, float s, float m, int bits);

/* qs[c] = q[c] * scale[c] and the return value sum_c q[c] * min[c], for sm holding a key
 * group's fp16 scale[hd] then min[hd]: a quantised key's dot product with q is then
 * sum_c qs[c] * code[c] + that sum. */
float kvs_kivi_key_prep(const float *q, const uint16_t *sm, int hd, float *qs);
float kvs_kivi_key_prep_ref(const float *q, const uint16_t *sm, int hd, float *qs);
/* out[j] = bias + sum_c qs[c] * code(c, j) for the n tokens of a channel-major key group. */
void kvs_kivi_key_scores(const uint8_t *codes, int n, int hd, int bits, const float *qs,
                         float bias, float *out);
void kvs_kivi_key_scores_ref(const uint8_t *codes, int n, int hd, int bits, const float *qs,
                             float bias, float *out);
/* Adds p times a value row to y, with the minima folded out: y[d] += (p * scale_k) * code[d]
 * and msum[k] += p * min_k for each channel group k; kvs_kivi_value_finish then adds msum[k]
 * to the channels of group k. Over many rows this costs one multiply-add per element. */
void kvs_kivi_value_acc(float *y, float *msum, const uint8_t *row, float p, int hd, int bits,
                        int group);
void kvs_kivi_value_acc_ref(float *y, float *msum, const uint8_t *row, float p, int hd,
                            int bits, int group);
/* kvs_kivi_value_acc over n consecutive rows, row t weighted by p[t]. */
void kvs_kivi_value_rows(float *y, float *msum, const uint8_t *rows, size_t row_bytes,
                         const float *p, int n, int hd, int bits, int group);
void kvs_kivi_value_rows_ref(float *y, float *msum, const uint8_t *rows, size_t row_bytes,
                             const float *p, int n, int hd, int bits, int group);
void kvs_kivi_value_finish(float *y, const float *msum, int hd, int group);

#endif
