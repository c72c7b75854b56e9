/* The token-gather cost of MPCache's Table 2 in our two-party engine: the same rows of a secret
 * KV cache (T tokens, heads x d values a row, filled by party 0) gathered two ways in one run,
 * side by side. Token-level: a secret 0/1 mask over the T tokens with k1 ones a head, its
 * k1 x T gather matrix (kvs_mpc_gather_matrix) and kvs_mpc_cache_gather over clusters of one
 * row. Cluster-level: a secret mask over C clusters of s = T / C rows with k2 = k1 / s ones a
 * head, its k2 x C gather matrix and kvs_mpc_cache_gather over clusters of s rows. The token
 * mask selects exactly the rows of the chosen clusters, so both gather the same k1 rows a head;
 * both outputs are opened at the end and checked against the plaintext rows (exit 1 if they
 * differ). Each phase (gather matrix, cache gather) is measured on its own after a three-role
 * barrier, R = 3 times: online bytes (payload both parties send on the party link), rounds
 * (party 0's on the party link), dealer bytes (received by both parties) and party 0's wall
 * time (the median), excluding the setup (the cache fill and the masks' input). Three threads,
 * plain loopback channels (kvs_mpc_run_local). A benchmark, not a test.
 *   mpc_gather_bench [T (1024)] [C (64)] [PERCENT (25)] [HEADS (16)] [D (64)] [--json PATH] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/random.h"
#include "mpc/fxp.h"
#include "mpc/gates.h"
#include "mpc/gates_cache.h"
#include "mpc/gates_select.h"
#include "mpc/local.h"
#include "mpc/net.h"

enum { RUNS = 3, METHODS = 2, PHASES = 2 }; /* methods: token, cluster; phases: matrix, gather */

static const char *const method_name[METHODS] = {"token-level", "cluster-level"};
static const char *const method_key[METHODS] = {"token", "cluster"};
static const char *const phase_name[PHASES + 1] = {"gather matrix", "cache gather", "total"};
static const char *const phase_key[PHASES + 1] = {"gather_matrix", "cache_gather", "total"};

/* Paper (MPCache, Table 2: token- vs cluster-level gather, 3PC PUMA, LAN). */
#define PAPER_COMM_RATIO 369.8
#define PAPER_LATENCY_RATIO 73.5

typedef struct phase_cost {
    uint64_t sent;   /* payload bytes this party sent on the party link */
    uint64_t rounds; /* this party's rounds on the party link */
    uint64_t dealer; /* bytes this party received from the dealer */
    double secs;
} phase_cost;

typedef struct bench_ctx {
    size_t T, H, d;
    size_t len[METHODS], k[METHODS], s[METHODS]; /* mask length, ones a head, cluster size */
    const uint64_t *rows;                         /* party 0's plaintext rows: T x H x d */
    const uint64_t *sel[METHODS];                 /* party 0's plaintext masks: H x len */
    phase_cost cost[2][RUNS][METHODS][PHASES];    /* [party][run][method][phase] */
    uint64_t *opened[METHODS];                    /* party 0's: H x k1 x d each */
} bench_ctx;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A party's counters at this point (the dealer's are not read). */
static phase_cost counters(const kvs_mpc *m)
{
    kvs_chan_stats s;
    kvs_chan_stats_get(m->peer, &s);
    phase_cost c = {.dealer = m->dealer_bytes};
    for (int op = 0; op < KVS_OP_N; op++) {
        c.sent += s.sent_payload[op];
        c.rounds += s.rounds[op];
    }
    c.secs = now();
    return c;
}

static kvs_status program(kvs_mpc *m, void *vctx, kvs_error *err)
{
    bench_ctx *c = vctx;
    const int dealer = kvs_mpc_is_dealer(m), p0 = m->role == KVS_MPC_P0;
    const size_t H = c->H, d = c->d, nrows = c->T * H * d, nout = H * c->k[0] * d;
    kvs_mpc_cache cache;
    kvs_mpc_cache_init(&cache, (int)H, (int)d);
    uint64_t *rows = NULL, *sel[METHODS] = {NULL}, *G[METHODS] = {NULL}, *out[METHODS] = {NULL};
    uint64_t *scratch = NULL; /* party 1's opened outputs */
    kvs_status st = KVS_OK;
    if (!dealer) {
        int ok = (rows = malloc(sizeof *rows * nrows)) != NULL;
        for (int t = 0; t < METHODS; t++) {
            ok = ok && (sel[t] = malloc(sizeof *sel[t] * H * c->len[t])) != NULL;
            ok = ok && (G[t] = malloc(sizeof *G[t] * H * c->k[t] * c->len[t])) != NULL;
            ok = ok && (out[t] = malloc(sizeof *out[t] * nout)) != NULL;
        }
        ok = ok && (p0 || (scratch = malloc(sizeof *scratch * nout)) != NULL);
        if (!ok)
            st = kvs_fail(err, KVS_ERR_NOMEM, "out of memory for the gather benchmark");
    }
    /* setup, not measured: the cache from party 0's rows, then both masks */
    if (st == KVS_OK)
        st = kvs_mpc_input(m, 0, p0 ? c->rows : NULL, nrows, rows, err);
    if (st == KVS_OK)
        st = kvs_mpc_cache_append(m, KVS_OP_INPUT, &cache, dealer ? NULL : rows, c->T, err);
    free(rows);
    for (int t = 0; t < METHODS && st == KVS_OK; t++)
        st = kvs_mpc_input(m, 0, p0 ? c->sel[t] : NULL, H * c->len[t], sel[t], err);
    /* the measured phases */
    for (int r = 0; r < RUNS && st == KVS_OK; r++)
        for (int t = 0; t < METHODS && st == KVS_OK; t++)
            for (int ph = 0; ph < PHASES && st == KVS_OK; ph++) {
                st = kvs_mpc_barrier(m, err);
                if (st != KVS_OK)
                    break;
                const phase_cost a = dealer ? (phase_cost){0} : counters(m);
                if (ph == 0)
                    st = kvs_mpc_gather_matrix(m, KVS_OP_GATHER, sel[t], H, c->len[t], c->k[t],
                                               G[t], err);
                else
                    st = kvs_mpc_cache_gather(m, KVS_OP_GATHER, &cache, G[t], c->k[t], c->s[t],
                                              out[t], err);
                if (!dealer && st == KVS_OK) {
                    const phase_cost b = counters(m);
                    c->cost[m->role][r][t][ph] = (phase_cost){
                        .sent = b.sent - a.sent, .rounds = b.rounds - a.rounds,
                        .dealer = b.dealer - a.dealer, .secs = b.secs - a.secs};
                }
            }
    /* both outputs opened, for the check */
    for (int t = 0; t < METHODS && st == KVS_OK; t++)
        st = kvs_mpc_open(m, KVS_OP_OPEN, out[t], nout, p0 ? c->opened[t] : scratch, err);
    for (int t = 0; t < METHODS; t++) {
        free(sel[t]);
        free(G[t]);
        free(out[t]);
    }
    free(scratch);
    kvs_mpc_cache_free(&cache);
    return st;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The per-phase numbers of a method (ph = PHASES: the sum of both phases), seconds the median
 * over the runs of party 0's time; bytes and rounds from the first run (the same every run). */
typedef struct summary {
    uint64_t online, rounds, dealer;
    double secs;
} summary;

static summary summarize(const bench_ctx *c, int t, int ph)
{
    summary s = {0};
    double secs[RUNS];
    for (int r = 0; r < RUNS; r++) {
        secs[r] = 0;
        for (int p = 0; p < PHASES; p++) {
            if (ph != PHASES && p != ph)
                continue;
            secs[r] += c->cost[0][r][t][p].secs;
            if (r == 0) {
                s.online += c->cost[0][0][t][p].sent + c->cost[1][0][t][p].sent;
                s.rounds += c->cost[0][0][t][p].rounds;
                s.dealer += c->cost[0][0][t][p].dealer + c->cost[1][0][t][p].dealer;
            }
        }
    }
    qsort(secs, RUNS, sizeof *secs, cmp_double);
    s.secs = secs[RUNS / 2];
    return s;
}

static double ratio(double a, double b) { return b > 0 ? a / b : 0; }

static int log2_ceil(size_t n)
{
    int b = 0;
    while (((size_t)1 << b) < n)
        b++;
    return b;
}

static int parse_size(const char *s, size_t *v)
{
    char *end = NULL;
    const long x = strtol(s, &end, 10);
    if (!end || *end || x <= 0)
        return 0;
    *v = (size_t)x;
    return 1;
}

int main(int argc, char **argv)
{
    size_t arg[5] = {1024, 64, 25, 16, 64}; /* T C PERCENT HEADS D */
    const char *json = NULL;
    int npos = 0, bad = 0;
    for (int i = 1; i < argc && !bad; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else if (npos < 5)
            bad = !parse_size(argv[i], &arg[npos++]);
        else
            bad = 1;
    }
    const size_t T = arg[0], C = arg[1], pct = arg[2], H = arg[3], d = arg[4];
    const size_t s = C ? T / C : 0, k2 = (C * pct + 50) / 100, k1 = k2 * s;
    if (bad || C > T || T % C || pct > 100 || k2 < 1 || k1 + 1 > ((size_t)1 << 16) ||
        H > 4096 || d > 4096) {
        fprintf(stderr, "usage: mpc_gather_bench [T (1024)] [C (64)] [PERCENT (25)] "
                        "[HEADS (16)] [D (64)] [--json PATH]\n"
                        "  (C divides T, 1 <= C PERCENT / 100 rounded, selected tokens < 65536)\n");
        return 2;
    }
    bench_ctx c = {.T = T, .H = H, .d = d, .len = {T, C}, .k = {k1, k2}, .s = {1, s}};
    const size_t nrows = T * H * d, nout = H * k1 * d;
    uint64_t *rows = malloc(sizeof *rows * nrows), *sel_tok = malloc(sizeof *sel_tok * H * T);
    uint64_t *sel_cl = malloc(sizeof *sel_cl * H * C), *expect = malloc(sizeof *expect * nout);
    size_t *perm = malloc(sizeof *perm * C);
    c.opened[0] = malloc(sizeof *c.opened[0] * nout);
    c.opened[1] = malloc(sizeof *c.opened[1] * nout);
    int rc = 1;
    if (!rows || !sel_tok || !sel_cl || !expect || !perm || !c.opened[0] || !c.opened[1]) {
        fprintf(stderr, "mpc_gather_bench: out of memory\n");
        goto done;
    }
    /* the rows: values in [-1, 1] at frac 16; the clusters: k2 of C a head, a partial
     * Fisher-Yates shuffle; the token mask: the rows of those clusters */
    const int frac = 16;
    uint64_t g = 20240601;
    for (size_t i = 0; i < nrows; i++)
        rows[i] = kvs_fx_encode(2.0 * ldexp((double)(kvs_splitmix64_next(&g) >> 11), -53) - 1.0, frac);
    for (size_t h = 0; h < H; h++) {
        for (size_t i = 0; i < C; i++) {
            perm[i] = i;
            sel_cl[h * C + i] = 0;
        }
        for (size_t i = 0; i < k2; i++) {
            const size_t j = i + (size_t)(kvs_splitmix64_next(&g) % (C - i)), x = perm[i];
            perm[i] = perm[j];
            perm[j] = x;
            sel_cl[h * C + perm[i]] = 1;
        }
        size_t p = 0;
        for (size_t t = 0; t < T; t++) {
            sel_tok[h * T + t] = sel_cl[h * C + t / s];
            if (sel_tok[h * T + t])
                memcpy(expect + (h * k1 + p++) * d, rows + (t * H + h) * d, sizeof *expect * d);
        }
    }
    c.rows = rows;
    c.sel[0] = sel_tok;
    c.sel[1] = sel_cl;

    kvs_mpc_local_cfg cfg = {.frac = frac, .insecure_plain = 1, .corr_seed = {{7}, {8}},
                             .own_seed = {{9}, {10}, {11}}, .timeout_ms = 600000};
    kvs_mpc_local_result res[3];
    memset(res, 0, sizeof res);
    kvs_error err = {0};
    const double t0 = now();
    kvs_status st = kvs_mpc_run_local(program, &c, &cfg, res, &err);
    const double total_secs = now() - t0;
    for (int i = 0; i < 3; i++)
        kvs_mpc_local_result_free(&res[i]);
    if (st != KVS_OK) {
        fprintf(stderr, "mpc_gather_bench: %s\n", err.msg);
        goto done;
    }

    const int equal_tok = !memcmp(c.opened[0], expect, sizeof *expect * nout);
    const int equal_cl = !memcmp(c.opened[1], expect, sizeof *expect * nout);
    summary sum[METHODS][PHASES + 1];
    for (int t = 0; t < METHODS; t++)
        for (int ph = 0; ph <= PHASES; ph++)
            sum[t][ph] = summarize(&c, t, ph);
    const int ohbits[METHODS] = {log2_ceil(k1 + 1), log2_ceil(k2 + 1)};
    const size_t eqtests[METHODS] = {H * T, H * C};

    printf("gather of %zu of %zu rows (%zu heads x %zu), T=%zu, C=%zu, %zu%% selected "
           "(k1 = %zu tokens, k2 = %zu clusters of %zu a head)\n",
           k1, T, H, d, T, C, pct, k1, k2, s);
    printf("two parties + dealer on three threads, plain loopback; per phase after a barrier; "
           "wall s: party 0's, median of %d runs; whole run %.1f s\n", RUNS, total_secs);
    printf("one-hot widths: ours ceil(log2(k+1)) = %d (token) vs %d (cluster) bits; the paper's "
           "log2 T = %d vs log2 C = %d bits\n",
           ohbits[0], ohbits[1], log2_ceil(T), log2_ceil(C));
    printf("%-14s %-14s %12s %15s %14s %7s %14s %9s\n", "method", "phase", "one-hot bits",
           "equality tests", "online bytes", "rounds", "dealer bytes", "wall s");
    for (int t = 0; t < METHODS; t++)
        for (int ph = 0; ph <= PHASES; ph++) {
            const summary *x = &sum[t][ph];
            char bits[16] = "-", tests[24] = "-";
            if (ph != 1) {
                snprintf(bits, sizeof bits, "%d", ohbits[t]);
                snprintf(tests, sizeof tests, "%zu", eqtests[t]);
            }
            printf("%-14s %-14s %12s %15s %14llu %7llu %14llu %9.4f\n", method_name[t],
                   phase_name[ph], bits, tests, (unsigned long long)x->online,
                   (unsigned long long)x->rounds, (unsigned long long)x->dealer, x->secs);
        }
    for (int ph = 0; ph <= PHASES; ph++) {
        const summary *a = &sum[0][ph], *b = &sum[1][ph];
        char tests[24] = "-";
        if (ph != 1)
            snprintf(tests, sizeof tests, "%.1fx", ratio((double)eqtests[0], (double)eqtests[1]));
        printf("%-14s %-14s %12s %15s %13.1fx %6.1fx %13.1fx %8.1fx\n",
               "token/cluster", phase_name[ph], "", tests,
               ratio((double)a->online, (double)b->online),
               ratio((double)a->rounds, (double)b->rounds),
               ratio((double)a->dealer, (double)b->dealer), ratio(a->secs, b->secs));
    }
    printf("%-29s %12s %15s %13.1fx %7s %14s %8.1fx\n", "paper (Table 2, 3PC PUMA, LAN)", "",
           "", PAPER_COMM_RATIO, "", "", PAPER_LATENCY_RATIO);
    printf("%s: token-level %s, cluster-level %s the plaintext rows (%zu values)\n",
           equal_tok && equal_cl ? "check passed" : "CHECK FAILED",
           equal_tok ? "equals" : "DIFFERS FROM", equal_cl ? "equals" : "DIFFERS FROM", nout);

    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            fprintf(stderr, "mpc_gather_bench: cannot write %s\n", json);
            goto done;
        }
        fprintf(f, "{\"T\": %zu, \"C\": %zu, \"percent\": %zu, \"heads\": %zu, \"d\": %zu, "
                   "\"k_tokens\": %zu, \"k_clusters\": %zu, \"cluster_size\": %zu, "
                   "\"runs\": %d, \"equal\": %s",
                T, C, pct, H, d, k1, k2, s, RUNS, equal_tok && equal_cl ? "true" : "false");
        for (int t = 0; t < METHODS; t++) {
            const summary *x = &sum[t][PHASES];
            fprintf(f, ",\n \"%s\": {\"onehot_bits\": %d, \"equality_tests\": %zu, "
                       "\"online_bytes\": %llu, \"rounds\": %llu, \"dealer_bytes\": %llu, "
                       "\"seconds\": %.6f",
                    method_key[t], ohbits[t], eqtests[t], (unsigned long long)x->online,
                    (unsigned long long)x->rounds, (unsigned long long)x->dealer, x->secs);
            for (int ph = 0; ph < PHASES; ph++) {
                const summary *y = &sum[t][ph];
                fprintf(f, ", \"%s\": {\"online_bytes\": %llu, \"rounds\": %llu, "
                           "\"dealer_bytes\": %llu, \"seconds\": %.6f}",
                        phase_key[ph], (unsigned long long)y->online,
                        (unsigned long long)y->rounds, (unsigned long long)y->dealer, y->secs);
            }
            fprintf(f, "}");
        }
        fprintf(f, ",\n \"ratios\": {");
        for (int ph = 0; ph <= PHASES; ph++) {
            const summary *a = &sum[0][ph], *b = &sum[1][ph];
            fprintf(f, "%s\"%s\": {\"online_bytes\": %.4f, \"rounds\": %.4f, "
                       "\"dealer_bytes\": %.4f, \"seconds\": %.4f}",
                    ph ? ", " : "", phase_key[ph], ratio((double)a->online, (double)b->online),
                    ratio((double)a->rounds, (double)b->rounds),
                    ratio((double)a->dealer, (double)b->dealer), ratio(a->secs, b->secs));
        }
        fprintf(f, "},\n \"paper\": {\"comm_ratio\": %.1f, \"latency_ratio\": %.1f}}\n",
                PAPER_COMM_RATIO, PAPER_LATENCY_RATIO);
        if (fclose(f)) {
            fprintf(stderr, "mpc_gather_bench: cannot write %s\n", json);
            goto done;
        }
    }
    rc = equal_tok && equal_cl ? 0 : 1;
done:
    free(rows);
    free(sel_tok);
    free(sel_cl);
    free(expect);
    free(perm);
    free(c.opened[0]);
    free(c.opened[1]);
    return rc;
}
