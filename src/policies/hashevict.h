/* HashEvict (methods/hashevict.md): SimHash codes of post-RoPE keys and queries, and a
 * pre-attention victim with the largest summed Hamming distance to the current token's query
 * codes. Also its sibling baseline l2evict (the paper's "L2": the largest key norm goes;
 * l2evict.c).
 *
 * This header exposes the pure pieces (projection, hashing, Hamming distance, victim choice)
 * for tests and benchmarks, and read-only views of a running policy's state. Nothing here has
 * global state.
 *
 * Projection generator (spec 2.2, the documented PRNG). R_l of layer l for seed s is bits x dim
 * float32, row-major, filled in order with standard normal draws from the stream (s, l):
 *   - SplitMix64 (x += 0x9e3779b97f4a7c15; z = x; z = (z ^ z>>30) * 0xbf58476d1ce4e5b9;
 *     z = (z ^ z>>27) * 0x94d049bb133111eb; z ^= z>>31) started at
 *     x = s ^ (0xd1b54a32d192ed03 * (l + 1)) gives the four words of a xoshiro256** state;
 *   - xoshiro256** gives u = (next >> 11) * 2^-53, uniform in [0, 1);
 *   - Box-Muller on consecutive pairs (u1, u2): r = sqrt(-2 ln(1 - u1)), z0 = r cos(2 pi u2),
 *     z1 = r sin(2 pi u2), used in that order (in double, stored as float); an odd count drops
 *     the last z1.
 * (kvs_xoshiro_seed, kvs_xoshiro_next and kvs_random_unit of core/random.h.) The same
 * (seed, layer) always gives bit-identical R, whatever the thread count.
 *
 * Code of x (spec 2.3): bit i = ((R x)_i >= 0), the dot product in float32; bit i lives in word
 * i >> 6 at bit i & 63 of ceil(bits / 64) uint64 words; unused high bits are 0. */
#ifndef KVS_HASHEVICT_H
#define KVS_HASHEVICT_H

#include <stddef.h>
#include <stdint.h>

#include "kv/policy.h"

#define KVS_HE_MAX_BITS 512

/* Word values of the parameters (their index in the words lists). */
enum { KVS_HE_MODE_QUERY = 0, KVS_HE_MODE_KEY = 1 };
enum { KVS_HE_TIES_OLDEST = 0, KVS_HE_TIES_SLOT = 1 };
enum { KVS_HE_PREFILL_PAPER = 0, KVS_HE_PREFILL_RECENT = 1 };
enum { KVS_HE_GQA_SUM = 0, KVS_HE_GQA_MEANQ = 1 };

static inline int kvs_he_words(int bits) { return (bits + 63) / 64; }

/* n standard normal draws of the stream (seed, stream) in the order described above; R_l is
 * kvs_he_gauss(seed, l, R, bits * dim). */
void kvs_he_gauss(uint64_t seed, uint64_t stream, float *out, size_t n);
/* R_l: bits x dim floats. */
void kvs_he_projection(uint64_t seed, int layer, int bits, int dim, float *R);
/* code = h(R x): kvs_he_words(bits) words. */
void kvs_he_hash(const float *R, int bits, int dim, const float *x, uint64_t *code);
/* popcount(a XOR b) over nw words. */
int kvs_he_hamming(const uint64_t *a, const uint64_t *b, int nw);

/* The victim among the n filled slots of a table (codes: n x nw words, pos: positions) for the
 * token at position t: the slot with the largest sum over the nq query codes of the Hamming
 * distance, among slots with sinks <= pos < t - recent. Ties: KVS_HE_TIES_SLOT the lowest slot
 * index, KVS_HE_TIES_OLDEST the lowest position. -1 when no slot is evictable. */
int kvs_he_victim(const uint64_t *codes, const int32_t *pos, int n, int nw,
                  const uint64_t *qcodes, int nq, int32_t t, int sinks, int recent, int ties);
/* kvs_he_victim's portable path for one-word codes (nw = 1), which it uses on CPUs without
 * AVX-512 VPOPCNTDQ; exposed so tests check it on every machine. */
int kvs_he_victim_portable(const uint64_t *codes, const int32_t *pos, int n,
                           const uint64_t *qcodes, int nq, int32_t t, int sinks, int recent,
                           int ties);
/* l2evict's victim: the largest norm[] among the evictable slots, same protection and ties. */
int kvs_he_victim_norm(const float *norm, const int32_t *pos, int n, int32_t t, int sinks,
                       int recent, int ties);

/* ---- a running policy (hashevict or l2evict), for tests and benchmarks ---- */

/* The physical slot table of one (layer, KV head): the spec's pos[C] and code[C][nw], where a
 * new token takes the next free slot, else the victim's slot (in-place overwrite). The store
 * holds the same tokens in an order of its own (kvs_store_remove_unordered); slot s of the
 * table holds position pos[s]. */
typedef struct kvs_he_view {
    int cap, n_filled;     /* C, and slots in use */
    int bits, nw;          /* hashevict; 0 for l2evict */
    const int32_t *pos;    /* n_filled positions */
    const uint64_t *codes; /* n_filled x nw words (NULL for l2evict) */
    const float *norm;     /* n_filled key norms (NULL for hashevict) */
    const float *R;        /* the layer's projection, bits x head_dim (NULL for l2evict) */
    /* The last token given to before_append on this layer (decode or fed prompt token):
     * position (-1 if none yet), its post-RoPE query rows (n_heads x head_dim) and key rows
     * (n_kv_heads x head_dim), and the position it evicted in this head (-1: none). */
    int32_t last_pos, last_victim;
    const float *last_q, *last_k;
} kvs_he_view;

/* 0 and fills v if p is a started hashevict or l2evict policy; else -1. */
int kvs_hashevict_view(const kvs_policy *p, int layer, int head, kvs_he_view *v);

/* Memory of the policy state (all counted by state_bytes). */
typedef struct kvs_he_bytes {
    size_t codes_packed;    /* L * Hkv * C * ceil(bits / 8): the paper-comparable size */
    size_t codes_allocated; /* L * Hkv * C * nw * 8: as stored */
    size_t projection;      /* L * bits * head_dim * 4 */
    size_t slot_table;      /* L * Hkv * C * 4: the physical slots' positions */
    size_t norms;           /* l2evict: L * Hkv * C * 4 */
    size_t total;           /* codes_allocated + projection + slot_table + norms */
} kvs_he_bytes;
int kvs_hashevict_bytes(const kvs_policy *p, kvs_he_bytes *b);

/* Time spent inside before_append (CLOCK_MONOTONIC) since the prompt started, summed over
 * layers, split by phase: [KVS_HE_DECODE] decode steps, [KVS_HE_FED] fed prompt tokens.
 * hash = hashing the new key and the queries; victim = the victim search; evict = removing the
 * victim from the store (finding its row, moving the last row into it) and writing the table. steps counts tokens
 * (before_append calls on layer 0). The policy never prints them: `kvslim bench` reads them
 * after its decode loop (before the next prompt restarts the policy) through
 * kvs_hashevict_timing of kvs_kv_policy(kvs_session_kv(session)), and prints
 * kvs_hashevict_timing_line for each phase that has steps. */
enum { KVS_HE_DECODE = 0, KVS_HE_FED = 1 };
typedef struct kvs_he_timing {
    long steps[2];
    double hash_s[2], victim_s[2], evict_s[2];
} kvs_he_timing;
/* 0 and fills t if p is a started hashevict or l2evict policy; else -1 and zeros. */
int kvs_hashevict_timing(const kvs_policy *p, kvs_he_timing *t);
/* One line (no newline) of a phase's per-step costs in microseconds:
 *   "SPEC timing, decode: N steps; per step: hash X us, victim search Y us, evict (store
 *    removal + table) Z us"   (phase "fed prompt tokens" for KVS_HE_FED)
 * with SPEC the spec as the user typed it. Returns 0 when written, -1 (buf empty) if p is not a
 * started hashevict or l2evict policy or the phase has no steps. bench/hashevict_bench.sh
 * parses this line from bench's stderr. */
int kvs_hashevict_timing_line(const kvs_policy *p, int phase, char *buf, size_t size);

#endif
