/* DCF and DPF key generation and evaluation over Z_2^64, and the DPF table lookup (fss.h). */
#include "mpc/fss.h"

#include <string.h>

#include "core/debug.h"
#include "mpc/fss_internal.h"

typedef kvs_fss_block block;

/* One node's expansion: the two children (seed with its control bit cleared, control bit) and,
 * for the DCF, the two value words. */
typedef struct node_exp {
    block s[2];
    int t[2];
    uint64_t v[2];
} node_exp;

static uint64_t mask_bits(int n)
{
    return n >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << n) - 1;
}

/* Bit n-1-i of x: the input bit that level i reads. */
static int level_bit(uint64_t x, int n, int i)
{
    return (int)((x >> (n - 1 - i)) & 1);
}

static size_t tbit_bytes(int n)
{
    return (size_t)(n + 3) / 4;
}

static block xor_block(block a, block b)
{
    block r = {a.lo ^ b.lo, a.hi ^ b.hi};
    return r;
}

/* a if t, else the zero block (t in {0, 1}). */
static block and_block(block a, int t)
{
    uint64_t m = (uint64_t)0 - (uint64_t)t;
    block r = {a.lo & m, a.hi & m};
    return r;
}

/* A leaf seed as an element of Z_2^64: its high word (the low word lost its lowest bit). */
static uint64_t convert(block s)
{
    return s.hi;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static block get_block(const uint8_t *p)
{
    block b = {get_u64(p), get_u64(p + 8)};
    return b;
}

static void put_block(uint8_t *p, block b)
{
    put_u64(p, b.lo);
    put_u64(p + 8, b.hi);
}

static int get_tbit(const uint8_t *tbits, int j)
{
    return (tbits[j >> 3] >> (j & 7)) & 1;
}

static void set_tbit(uint8_t *tbits, int j, int v)
{
    tbits[j >> 3] = (uint8_t)(tbits[j >> 3] | (v << (j & 7)));
}

/* (-1)^b v in Z_2^64. */
static uint64_t signed_by(int b, uint64_t v)
{
    return b ? (uint64_t)0 - v : v;
}

/* A node's expansion from G's outputs: children from G_0 (left) and G_1 (right), values from
 * G_2 when with_values. */
static void split(const block *out, int with_values, node_exp *e)
{
    for (int d = 0; d < 2; d++) {
        e->t[d] = (int)(out[d].lo & 1);
        e->s[d] = out[d];
        e->s[d].lo &= ~(uint64_t)1;
    }
    e->v[0] = with_values ? out[2].lo : 0;
    e->v[1] = with_values ? out[2].hi : 0;
}

static void expand(const kvs_fss_prg *g, block s, int with_values, node_exp *e)
{
    block out[KVS_FSS_PRG_KEYS];
    kvs_fss_prg_expand(g, s, with_values ? 3 : 2, out);
    split(out, with_values, e);
}

/* A party's node after its expansion is corrected: with t set, both children take the seed
 * correction and their control-bit corrections. */
static void correct(node_exp *e, int t, block scw, int tcw_l, int tcw_r)
{
    block c = and_block(scw, t);
    e->s[0] = xor_block(e->s[0], c);
    e->s[1] = xor_block(e->s[1], c);
    e->t[0] ^= t & tcw_l;
    e->t[1] ^= t & tcw_r;
}

/* ---- DCF ---- */

#define DCF_LEVEL 24 /* s_CW (16) + V_CW (8) */
#define DPF_LEVEL 16 /* s_CW */

size_t kvs_dcf_key_bytes(int n)
{
    KVS_ASSERT(n >= 1 && n <= 64);
    return 16 + (size_t)DCF_LEVEL * (size_t)n + tbit_bytes(n) + 8;
}

/* ---- key generation (both schemes) ---- */

/* One key pair's state while its levels are generated. */
typedef struct gen_state {
    block s0, s1;
    int t0, t1;
    uint64_t v_alpha; /* DCF: the sum of both parties' outputs along alpha's path so far */
    uint64_t alpha, beta;
    uint8_t *k0;
} gen_state;

/* Level i of one key pair, from the expansions of both parties' seeds; dcf: with the value
 * correction of the level. */
static void gen_level(gen_state *g, int dcf, int n, int i, const node_exp *e0,
                      const node_exp *e1, size_t tb_off)
{
    int a = level_bit(g->alpha, n, i), keep = a, lose = 1 - a;
    block scw = xor_block(e0->s[lose], e1->s[lose]);
    uint8_t *lv = g->k0 + 16 + (size_t)(dcf ? DCF_LEVEL : DPF_LEVEL) * (size_t)i;
    put_block(lv, scw);
    if (dcf) {
        /* Leaving alpha's path here must bring the sum to beta if the path left goes below
         * alpha (lose = left, so a = 1), else to 0; the parties' t differ on the path. */
        uint64_t vcw = e1->v[lose] - e0->v[lose] - g->v_alpha;
        if (lose == 0)
            vcw += g->beta;
        vcw = signed_by(g->t1, vcw);
        g->v_alpha += e0->v[keep] - e1->v[keep] + signed_by(g->t1, vcw);
        put_u64(lv + 16, vcw);
    }
    int tcw[2] = {e0->t[0] ^ e1->t[0] ^ a ^ 1, e0->t[1] ^ e1->t[1] ^ a};
    set_tbit(g->k0 + tb_off, 2 * i, tcw[0]);
    set_tbit(g->k0 + tb_off, 2 * i + 1, tcw[1]);

    g->s0 = xor_block(e0->s[keep], and_block(scw, g->t0));
    g->s1 = xor_block(e1->s[keep], and_block(scw, g->t1));
    g->t0 = e0->t[keep] ^ (g->t0 & tcw[keep]);
    g->t1 = e1->t[keep] ^ (g->t1 & tcw[keep]);
}

/* Keys per batch: both parties' seeds of each, KVS_FSS_PRG_BATCH seeds in all. */
#define GEN_BATCH (KVS_FSS_PRG_BATCH / 2)

/* count key pairs of either scheme, GEN_BATCH at a time so that their AES blocks pipeline. */
static void gen_many(int dcf, int n, size_t count, const uint64_t *alpha, const uint64_t *beta,
                     const uint8_t *seeds, uint8_t *k0, uint8_t *k1)
{
    KVS_ASSERT(n >= 1 && n <= 64);
    const size_t bytes = dcf ? kvs_dcf_key_bytes(n) : kvs_dpf_key_bytes(n);
    const size_t tb_off = 16 + (size_t)(dcf ? DCF_LEVEL : DPF_LEVEL) * (size_t)n;
    const size_t cw_off = tb_off + tbit_bytes(n);
    const int nout = dcf ? 3 : 2;
    kvs_fss_prg g;
    kvs_fss_prg_init(&g, 0);
    for (size_t k0i = 0; k0i < count; k0i += GEN_BATCH) {
        const size_t m = count - k0i < GEN_BATCH ? count - k0i : GEN_BATCH;
        gen_state st[GEN_BATCH];
        for (size_t j = 0; j < m; j++) {
            const size_t k = k0i + j;
            KVS_ASSERT((alpha[k] & ~mask_bits(n)) == 0);
            st[j] = (gen_state){get_block(seeds + 32 * k), get_block(seeds + 32 * k + 16), 0, 1,
                                0, alpha[k], beta[k], k0 + bytes * k};
            memset(st[j].k0, 0, bytes);
            memcpy(st[j].k0, seeds + 32 * k, 16);
        }
        for (int i = 0; i < n; i++) {
            block in[2 * GEN_BATCH], out[2 * GEN_BATCH * KVS_FSS_PRG_KEYS];
            for (size_t j = 0; j < m; j++) {
                in[2 * j] = st[j].s0;
                in[2 * j + 1] = st[j].s1;
            }
            kvs_fss_prg_expand_batch(&g, in, (int)(2 * m), nout, out);
            for (size_t j = 0; j < m; j++) {
                node_exp e0, e1;
                split(out + (size_t)nout * 2 * j, dcf, &e0);
                split(out + (size_t)nout * (2 * j + 1), dcf, &e1);
                gen_level(&st[j], dcf, n, i, &e0, &e1, tb_off);
            }
        }
        for (size_t j = 0; j < m; j++) {
            const gen_state *e = &st[j];
            /* DCF: at alpha itself f is 0, the leaf correction cancels the path's sum; DPF: the
             * leaf correction brings alpha's leaf to beta */
            put_u64(e->k0 + cw_off,
                    dcf ? signed_by(e->t1, convert(e->s1) - convert(e->s0) - e->v_alpha)
                        : signed_by(e->t1, e->beta - convert(e->s0) + convert(e->s1)));
            uint8_t *kk1 = k1 + bytes * (k0i + j);
            memcpy(kk1, e->k0, bytes);
            memcpy(kk1, seeds + 32 * (k0i + j) + 16, 16);
        }
    }
    kvs_fss_prg_free(&g);
}

void kvs_dcf_gen_many(int n, size_t count, const uint64_t *alpha, const uint64_t *beta,
                      const uint8_t *seeds, uint8_t *k0, uint8_t *k1)
{
    gen_many(1, n, count, alpha, beta, seeds, k0, k1);
}

void kvs_dpf_gen_many(int n, size_t count, const uint64_t *alpha, const uint64_t *beta,
                      const uint8_t *seeds, uint8_t *k0, uint8_t *k1)
{
    gen_many(0, n, count, alpha, beta, seeds, k0, k1);
}

/* One pair from its two root seeds. */
static void gen_one(int dcf, int n, uint64_t alpha, uint64_t beta, const uint8_t seed0[16],
                    const uint8_t seed1[16], uint8_t *k0, uint8_t *k1)
{
    KVS_ASSERT(n >= 1 && n <= 64 && (alpha & ~mask_bits(n)) == 0);
    uint8_t seeds[32];
    memcpy(seeds, seed0, 16);
    memcpy(seeds + 16, seed1, 16);
    gen_many(dcf, n, 1, &alpha, &beta, seeds, k0, k1);
}

void kvs_dcf_gen(int n, uint64_t alpha, uint64_t beta, const uint8_t seed0[16],
                 const uint8_t seed1[16], uint8_t *k0, uint8_t *k1)
{
    gen_one(1, n, alpha, beta, seed0, seed1, k0, k1);
}

void kvs_dpf_gen(int n, uint64_t alpha, uint64_t beta, const uint8_t seed0[16],
                 const uint8_t seed1[16], uint8_t *k0, uint8_t *k1)
{
    gen_one(0, n, alpha, beta, seed0, seed1, k0, k1);
}

/* ---- evaluation ---- */

static uint64_t dcf_eval1(const kvs_fss_prg *g, int b, const uint8_t *key, int n, uint64_t x)
{
    const uint8_t *tbits = key + 16 + (size_t)DCF_LEVEL * (size_t)n;
    block s = get_block(key);
    int t = b;
    uint64_t v = 0;
    for (int i = 0; i < n; i++) {
        const uint8_t *lv = key + 16 + (size_t)DCF_LEVEL * (size_t)i;
        node_exp e;
        expand(g, s, 1, &e);
        correct(&e, t, get_block(lv), get_tbit(tbits, 2 * i), get_tbit(tbits, 2 * i + 1));
        int d = level_bit(x, n, i);
        v += signed_by(b, e.v[d] + (get_u64(lv + 16) & ((uint64_t)0 - (uint64_t)t)));
        s = e.s[d];
        t = e.t[d];
    }
    uint64_t cw = get_u64(tbits + tbit_bytes(n));
    return v + signed_by(b, convert(s) + (cw & ((uint64_t)0 - (uint64_t)t)));
}

uint64_t kvs_dcf_eval(int b, const uint8_t *key, int n, uint64_t x)
{
    KVS_ASSERT((b == 0 || b == 1) && n >= 1 && n <= 64 && (x & ~mask_bits(n)) == 0);
    kvs_fss_prg g;
    kvs_fss_prg_init(&g, 0);
    uint64_t r = dcf_eval1(&g, b, key, n, x);
    kvs_fss_prg_free(&g);
    return r;
}

/* Up to KVS_FSS_PRG_BATCH evaluations side by side, level by level, so that their AES blocks
 * pipeline (one evaluation alone waits on each level's AES latency). */
static void dcf_eval_batch(const kvs_fss_prg *g, int b, const uint8_t *keys, size_t kb, int n,
                           const uint64_t *xs, int count, uint64_t *out)
{
    block s[KVS_FSS_PRG_BATCH], raw[KVS_FSS_PRG_BATCH * KVS_FSS_PRG_KEYS];
    int t[KVS_FSS_PRG_BATCH];
    const uint8_t *tbits = keys + 16 + (size_t)DCF_LEVEL * (size_t)n;
    for (int k = 0; k < count; k++) {
        s[k] = get_block(keys + (size_t)k * kb);
        t[k] = b;
        out[k] = 0;
    }
    for (int i = 0; i < n; i++) {
        kvs_fss_prg_expand_batch(g, s, count, 3, raw);
        for (int k = 0; k < count; k++) {
            const uint8_t *key = keys + (size_t)k * kb;
            const uint8_t *lv = key + 16 + (size_t)DCF_LEVEL * (size_t)i;
            const uint8_t *tb = tbits + (size_t)k * kb;
            node_exp e;
            split(raw + k * 3, 1, &e);
            correct(&e, t[k], get_block(lv), get_tbit(tb, 2 * i), get_tbit(tb, 2 * i + 1));
            int d = level_bit(xs[k], n, i);
            out[k] += signed_by(b, e.v[d] + (get_u64(lv + 16) & ((uint64_t)0 - (uint64_t)t[k])));
            s[k] = e.s[d];
            t[k] = e.t[d];
        }
    }
    for (int k = 0; k < count; k++) {
        uint64_t cw = get_u64(tbits + (size_t)k * kb + tbit_bytes(n));
        out[k] += signed_by(b, convert(s[k]) + (cw & ((uint64_t)0 - (uint64_t)t[k])));
    }
}

void kvs_dcf_eval_many(int b, const uint8_t *keys, int n, const uint64_t *xs, size_t count,
                       uint64_t *out)
{
    KVS_ASSERT((b == 0 || b == 1) && n >= 1 && n <= 64);
    size_t kb = kvs_dcf_key_bytes(n);
    kvs_fss_prg g;
    kvs_fss_prg_init(&g, 0);
    for (size_t i = 0; i < count; i += KVS_FSS_PRG_BATCH) {
        int m = count - i < KVS_FSS_PRG_BATCH ? (int)(count - i) : KVS_FSS_PRG_BATCH;
        for (int k = 0; k < m; k++)
            KVS_ASSERT((xs[i + (size_t)k] & ~mask_bits(n)) == 0);
        dcf_eval_batch(&g, b, keys + i * kb, kb, n, xs + i, m, out + i);
    }
    kvs_fss_prg_free(&g);
}

/* ---- DPF ---- */


size_t kvs_dpf_key_bytes(int n)
{
    KVS_ASSERT(n >= 1 && n <= 64);
    return 16 + (size_t)DPF_LEVEL * (size_t)n + tbit_bytes(n) + 8;
}


uint64_t kvs_dpf_eval(int b, const uint8_t *key, int n, uint64_t x)
{
    KVS_ASSERT((b == 0 || b == 1) && n >= 1 && n <= 64 && (x & ~mask_bits(n)) == 0);
    const uint8_t *tbits = key + 16 + (size_t)DPF_LEVEL * (size_t)n;
    kvs_fss_prg g;
    kvs_fss_prg_init(&g, 0);
    block s = get_block(key);
    int t = b;
    for (int i = 0; i < n; i++) {
        node_exp e;
        expand(&g, s, 0, &e);
        correct(&e, t, get_block(key + 16 + (size_t)DPF_LEVEL * (size_t)i),
                get_tbit(tbits, 2 * i), get_tbit(tbits, 2 * i + 1));
        int d = level_bit(x, n, i);
        s = e.s[d];
        t = e.t[d];
    }
    kvs_fss_prg_free(&g);
    uint64_t cw = get_u64(tbits + tbit_bytes(n));
    return signed_by(b, convert(s) + (cw & ((uint64_t)0 - (uint64_t)t)));
}

/* The decoded corrections of a DPF key, for the full-domain walk. */
typedef struct dpf_walk {
    const kvs_fss_prg *g;
    int b, n;
    block scw[KVS_FSS_FULL_MAX_BITS];
    int tcw[KVS_FSS_FULL_MAX_BITS][2];
    uint64_t cw;
    uint64_t *out;
} dpf_walk;

/* The last levels of the walk go breadth first, a subtree of this height at a time, so that the
 * PRG expands KVS_FSS_PRG_BATCH independent nodes at once (AES-NI pipelines them; one node at a
 * time waits on each AES's latency). */
#define DPF_SUBTREE_BITS 8

/* The subtree below the node at level i (index idx), breadth first, in place: the children of
 * node j are 2j and 2j + 1, so going from the last node down never overwrites a node not yet
 * expanded. */
static void dpf_walk_subtree(const dpf_walk *w, int i, block s, int t, uint64_t idx)
{
    block S[1 << DPF_SUBTREE_BITS];
    uint8_t T[1 << DPF_SUBTREE_BITS];
    S[0] = s;
    T[0] = (uint8_t)t;
    size_t width = 1;
    for (int lv = i; lv < w->n; lv++, width *= 2) {
        const block scw = w->scw[lv];
        const uint8_t tl = (uint8_t)w->tcw[lv][0], tr = (uint8_t)w->tcw[lv][1];
        for (size_t end = width; end > 0;) {
            const size_t cnt = end < KVS_FSS_PRG_BATCH ? end : KVS_FSS_PRG_BATCH, j0 = end - cnt;
            block out[2 * KVS_FSS_PRG_BATCH];
            uint8_t tin[KVS_FSS_PRG_BATCH];
            memcpy(tin, T + j0, cnt);
            kvs_fss_prg_expand_batch(w->g, S + j0, (int)cnt, 2, out); /* read before written */
            for (size_t k = 0; k < cnt; k++) {
                /* split and correct (as split and correct above), without the node struct */
                const uint64_t m = (uint64_t)0 - (uint64_t)tin[k];
                const block l = out[2 * k], r = out[2 * k + 1];
                const size_t c = 2 * (j0 + k);
                S[c].lo = (l.lo & ~(uint64_t)1) ^ (scw.lo & m);
                S[c].hi = l.hi ^ (scw.hi & m);
                T[c] = (uint8_t)((l.lo & 1) ^ (tin[k] & tl));
                S[c + 1].lo = (r.lo & ~(uint64_t)1) ^ (scw.lo & m);
                S[c + 1].hi = r.hi ^ (scw.hi & m);
                T[c + 1] = (uint8_t)((r.lo & 1) ^ (tin[k] & tr));
            }
            end = j0;
        }
    }
    for (size_t j = 0; j < width; j++)
        w->out[(idx << (w->n - i)) | j] =
            signed_by(w->b, convert(S[j]) + (w->cw & ((uint64_t)0 - (uint64_t)T[j])));
}

/* Depth first from the node at level i with index idx (its path bits so far), down to the
 * subtrees. */
static void dpf_walk_node(const dpf_walk *w, int i, block s, int t, uint64_t idx)
{
    if (w->n - i <= DPF_SUBTREE_BITS) {
        dpf_walk_subtree(w, i, s, t, idx);
        return;
    }
    node_exp e;
    expand(w->g, s, 0, &e);
    correct(&e, t, w->scw[i], w->tcw[i][0], w->tcw[i][1]);
    dpf_walk_node(w, i + 1, e.s[0], e.t[0], idx << 1);
    dpf_walk_node(w, i + 1, e.s[1], e.t[1], (idx << 1) | 1);
}

void kvs_dpf_eval_all(int b, const uint8_t *key, int n, uint64_t *out)
{
    KVS_ASSERT((b == 0 || b == 1) && n >= 1 && n <= KVS_FSS_FULL_MAX_BITS);
    const uint8_t *tbits = key + 16 + (size_t)DPF_LEVEL * (size_t)n;
    kvs_fss_prg g;
    kvs_fss_prg_init(&g, 0);
    dpf_walk w;
    w.g = &g;
    w.b = b;
    w.n = n;
    for (int i = 0; i < n; i++) {
        w.scw[i] = get_block(key + 16 + (size_t)DPF_LEVEL * (size_t)i);
        w.tcw[i][0] = get_tbit(tbits, 2 * i);
        w.tcw[i][1] = get_tbit(tbits, 2 * i + 1);
    }
    w.cw = get_u64(tbits + tbit_bytes(n));
    w.out = out;
    dpf_walk_node(&w, 0, get_block(key), b, 0);
    kvs_fss_prg_free(&g);
}

uint64_t kvs_lut_eval(int b, const uint8_t *key, int n, uint64_t c, const uint64_t *table,
                      uint64_t *scratch)
{
    KVS_ASSERT(n >= 1 && n <= KVS_FSS_FULL_MAX_BITS && (c & ~mask_bits(n)) == 0);
    kvs_dpf_eval_all(b, key, n, scratch);
    uint64_t m = mask_bits(n), acc = 0;
    for (uint64_t y = 0; y <= m; y++)
        acc += scratch[y] * table[(c - y) & m];
    return acc;
}
