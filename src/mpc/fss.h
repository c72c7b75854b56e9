/* Function secret sharing for the two-party engine: DCF (comparison), DPF (point) and DPF lookup. */
#ifndef KVS_MPC_FSS_H
#define KVS_MPC_FSS_H

/* Two-party FSS over the output group Z_2^64 (uint64 arithmetic mod 2^64) with n-bit inputs,
 * 1 <= n <= 64. The dealer makes a key pair from two 16-byte root seeds it draws from its PRG;
 * party b in {0, 1} evaluates its key locally, and the two outputs sum to f(x) mod 2^64.
 *
 * Both schemes walk a GGM tree of depth n, most significant input bit first. The tree PRG is
 * fixed-key AES-128 in Matyas-Meyer-Oseas mode, G_j(s) = AES_{K_j}(s) xor s for three fixed
 * public keys (AES-NI, else OpenSSL; src/mpc/fss_prg.c). G_0 and G_1 give the left and right
 * children: the lowest bit of the block is the control bit t, the rest (that bit cleared) the
 * child seed. G_2 gives the DCF's two value words (left: low 64 bits, right: high 64 bits). A
 * leaf seed converts to Z_2^64 as its high 64 bits.
 *
 * DCF: f_{alpha,beta}(x) = beta if x < alpha (unsigned n-bit), else 0. The construction of Boyle,
 * Chandran, Gilboa, Gupta, Ishai, Kumar and Rathee, "Function Secret Sharing for Mixed-Mode and
 * Fixed-Point Secure Computation" (Eurocrypt 2021), Fig. 1.
 * DPF: f_{alpha,beta}(x) = beta if x == alpha, else 0 (Boyle, Gilboa and Ishai, CCS 2016).
 *
 * Key layout (flat bytes: they travel from the dealer to the parties). Blocks are 16 bytes in
 * AES byte order; words are 8 bytes little-endian; level i = 0..n-1 reads input bit n-1-i.
 *   DCF, kvs_dcf_key_bytes(n) = 24 n + ceil(n/4) + 24 bytes:
 *     [0, 16)                 root seed s_b
 *     [16 + 24 i, +16)        seed correction s_CW of level i
 *     [32 + 24 i, +8)         value correction V_CW of level i
 *     [16 + 24 n, +ceil(n/4)) control-bit corrections: bit 2i (LSB first within each byte) is
 *                             t_CW^L of level i, bit 2i+1 is t_CW^R
 *     [16 + 24 n + ceil(n/4), +8)  final correction CW^(n+1)
 *   DPF, kvs_dpf_key_bytes(n) = 16 n + ceil(n/4) + 24 bytes: the same with 16-byte levels (s_CW
 *     only): root seed, n seed corrections, control-bit corrections, final correction.
 * The two keys of a pair differ only in the root seed; which party holds a key is the b passed
 * to the evaluation. Sizes: DCF 218, 412, 800, 1576 bytes and DPF 154, 284, 544, 1064 bytes at
 * n = 8, 16, 32, 64.
 *
 * Preconditions (KVS_ASSERT in debug builds): 1 <= n <= 64, alpha < 2^n, inputs x < 2^n, b in
 * {0, 1}; full-domain evaluation and lookups need n <= KVS_FSS_FULL_MAX_BITS. The functions keep
 * no state. Without AES-NI they use OpenSSL, and abort if it cannot make a cipher context. */

#include <stddef.h>
#include <stdint.h>

/* Largest n for kvs_dpf_eval_all and kvs_lut_eval (2^20 outputs: 8 MB). */
#define KVS_FSS_FULL_MAX_BITS 20

/* Serialized DCF key size for n-bit inputs. */
size_t kvs_dcf_key_bytes(int n);
/* Dealer: the keys of f_{alpha,beta} over n bits from two 16-byte root seeds (fresh random ones
 * for every key pair). k0, k1: kvs_dcf_key_bytes(n) bytes each. */
void kvs_dcf_gen(int n, uint64_t alpha, uint64_t beta, const uint8_t seed0[16],
                 const uint8_t seed1[16], uint8_t *k0, uint8_t *k1);
/* The same for count key pairs at once (their AES blocks pipelined): pair i from the seeds
 * seeds[32 i, +16) and [32 i + 16, +16), written to k0 + i kvs_dcf_key_bytes(n) and k1 + i
 * kvs_dcf_key_bytes(n); equal to count calls of kvs_dcf_gen. */
void kvs_dcf_gen_many(int n, size_t count, const uint64_t *alpha, const uint64_t *beta,
                      const uint8_t *seeds, uint8_t *k0, uint8_t *k1);
/* Party b: its share of f(x); the two parties' shares sum to f(x) mod 2^64. */
uint64_t kvs_dcf_eval(int b, const uint8_t *key, int n, uint64_t x);
/* Party b: out[i] = its share of f_i(xs[i]) for count keys laid out consecutively in keys
 * (kvs_dcf_key_bytes(n) bytes apart), all over n bits. */
void kvs_dcf_eval_many(int b, const uint8_t *keys, int n, const uint64_t *xs, size_t count,
                       uint64_t *out);

/* Serialized DPF key size for n-bit inputs. */
size_t kvs_dpf_key_bytes(int n);
/* Dealer: the keys of the point function f_{alpha,beta} over n bits (as kvs_dcf_gen). */
void kvs_dpf_gen(int n, uint64_t alpha, uint64_t beta, const uint8_t seed0[16],
                 const uint8_t seed1[16], uint8_t *k0, uint8_t *k1);
/* count pairs at once, as kvs_dcf_gen_many. */
void kvs_dpf_gen_many(int n, size_t count, const uint64_t *alpha, const uint64_t *beta,
                      const uint8_t *seeds, uint8_t *k0, uint8_t *k1);
/* Party b: its share of f(x). */
uint64_t kvs_dpf_eval(int b, const uint8_t *key, int n, uint64_t x);
/* Party b: out[x] = its share of f(x) for every x < 2^n (n <= KVS_FSS_FULL_MAX_BITS), by one
 * walk of the whole tree (2^n - 1 node expansions). */
void kvs_dpf_eval_all(int b, const uint8_t *key, int n, uint64_t *out);

/* Table lookup on a masked input. The dealer makes a DPF key pair over n bits for the point
 * alpha = r (its n-bit mask of x) with beta = 1; the parties open c = (x + r) mod 2^n. Party b's
 * share of table[x] is sum_y dpf_b(y) table[(c - y) mod 2^n] (mod 2^64). table: 2^n public
 * entries; scratch: 2^n words of workspace; n <= KVS_FSS_FULL_MAX_BITS. */
uint64_t kvs_lut_eval(int b, const uint8_t *key, int n, uint64_t c, const uint64_t *table,
                      uint64_t *scratch);

#endif
