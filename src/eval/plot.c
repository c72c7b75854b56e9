/* The eval plot: KL and top-1 against mean KV bytes relative to a full F16 cache of the same
 * tokens (the reference of the table's "KV bytes vs full F16" column), drawn by gnuplot
 * (gnuplot.c) from a data file and a script in a temporary directory. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "eval/eval.h"
#include "eval/gnuplot.h"

/* The policy a result belongs to: its canonical spec without the budget (or slots) item. */
static void policy_key(const kvs_eval_result *r, char *buf, size_t size)
{
    const char *colon = strchr(r->params, ':');
    if (!colon) {
        snprintf(buf, size, "%s", r->params);
        return;
    }
    size_t len = (size_t)snprintf(buf, size, "%.*s", (int)(colon - r->params), r->params);
    char sep = ':';
    const char *p = colon + 1;
    while (*p && len < size) {
        size_t item = strcspn(p, ",");
        int budget = (item >= 7 && !strncmp(p, "budget=", 7)) ||
                     (item >= 6 && !strncmp(p, "slots=", 6));
        if (!budget) {
            len += (size_t)snprintf(buf + len, size - len, "%c%.*s", sep, (int)item, p);
            sep = ',';
        }
        p += item;
        if (*p == ',')
            p++;
    }
}

/* One line of the plot: a configuration, policy x storage type (x equal-memory or not), its
 * points the budgets. */
typedef struct series {
    char key[256];   /* the policy's key (policy_key) */
    char type[128];  /* the storage type */
    int eq;          /* equal-memory rows */
    int color;       /* index of the policy's colour */
    int shape;       /* index of the storage type's point shape */
    int any_kl;      /* some point has KL > 0 (drawable on a log scale) */
    int *rows;
    int n;
} series;

static const double *sort_x;
static int by_x(const void *a, const void *b)
{
    double x = sort_x[*(const int *)a], y = sort_x[*(const int *)b];
    return x < y ? -1 : x > y;
}

/* gnuplot point types by storage type: filled (a plain run) and open (equal memory) circle,
 * square, triangle, inverted triangle, diamond, pentagon. */
static const int filled_pt[] = {7, 5, 9, 11, 13, 15}, open_pt[] = {6, 4, 8, 10, 12, 14};
#define N_SHAPES ((int)(sizeof filled_pt / sizeof filled_pt[0]))

/* One panel: a line per series, points labelled with their budgets. A series without a KL
 * above 0 (the reference, the full F32 cache) is left out of a log-scale KL panel, which says
 * so in its title. */
static void plot_panel(FILE *f, const char *data, const series *sr, int n_series, int column,
                       int log_kl)
{
    const char *y = column == 2 && log_kl ? "($2 > 0 ? $2 : 1/0)" : column == 2 ? "2" : "3";
    int first = 1;
    fputs("plot ", f);
    for (int i = 0; i < n_series; i++) {
        const series *s = &sr[i];
        if (column == 2 && log_kl && !s->any_kl)
            continue;
        const char *color = kvs_gnuplot_color(s->color);
        fputs(first ? "" : ", \\\n     ", f);
        first = 0;
        kvs_gnuplot_quote(f, data);
        fprintf(f, " index %d using 1:%s", i, y);
        if (s->eq)
            fprintf(f, " with linespoints dt 2 lw 1.5 pt %d ps 1.6 lc rgb '%s' title ",
                    open_pt[s->shape % N_SHAPES], color);
        else
            fprintf(f, " with linespoints lw 2 pt %d ps 1.2 lc rgb '%s' title ",
                    filled_pt[s->shape % N_SHAPES], color);
        char title[420];
        snprintf(title, sizeof title, "%s, %s%s", s->key, s->type,
                 s->eq ? " (equal memory)" : "");
        kvs_gnuplot_quote(f, title);
    }
    /* The last block holds one labelled point per distinct (x, budget). */
    fputs(", \\\n     ", f);
    kvs_gnuplot_quote(f, data);
    fprintf(f, " index %d using 1:%s:5 with labels offset 1.4,0.8 "
               "font ',9' tc rgb '#555555' notitle", n_series + (column == 3), y);
    fputc('\n', f);
}

/* What the writers of the plot's two files read. */
typedef struct fidelity_plot {
    const kvs_eval_result *r;
    const int *equal_memory;
    int n;
    const char *title;
    const series *sr; /* each series' rows in order of x */
    int n_series;
    const double *x;
    double max_kl;
    int log_kl;
} fidelity_plot;

/* The data file: a block per series, then a label block per panel. */
static void write_data(FILE *f, const kvs_gnuplot *g, void *ctx)
{
    (void)g;
    const fidelity_plot *p = ctx;
    const kvs_eval_result *r = p->r;
    const int *equal_memory = p->equal_memory;
    const series *sr = p->sr;
    const double *x = p->x, max_kl = p->max_kl;
    const int n = p->n, n_series = p->n_series, log_kl = p->log_kl;
    for (int i = 0; i < n_series; i++) {
        fprintf(f, "# %s%s: rel_kv_bytes kl top1 budget\n", sr[i].key, sr[i].eq ? " eq" : "");
        for (int k = 0; k < sr[i].n; k++) {
            const kvs_eval_result *e = &r[sr[i].rows[k]];
            fprintf(f, "%.9g %.9g %.9g %.9g\n", x[sr[i].rows[k]], e->kl, e->top1, e->budget);
        }
        fputs("\n\n", f);
    }
    /* Two label blocks (KL panel, top-1 panel): budgeted rows that are not equal-memory runs,
     * a label left out where the same budget already sits at nearly the same place. */
    for (int panel = 0; panel < 2; panel++) {
        fprintf(f, "# %s labels: rel_kv_bytes kl top1 budget label\n", panel ? "top1" : "kl");
        int n_labels = 0;
        for (int i = 0; i < n; i++) {
            if (r[i].budget <= 0 || (equal_memory && equal_memory[i]))
                continue;
            int dup = 0;
            for (int k = 0; k < i && !dup; k++) {
                if (r[k].budget != r[i].budget || (equal_memory && equal_memory[k]) ||
                    fabs(x[k] - x[i]) > 0.03)
                    continue;
                if (panel)
                    dup = fabs(r[k].top1 - r[i].top1) < 0.006;
                else if (log_kl)
                    dup = r[k].kl > 0 && r[i].kl > 0 && fabs(log(r[k].kl / r[i].kl)) < 0.15;
                else
                    dup = fabs(r[k].kl - r[i].kl) < 0.03 * max_kl;
            }
            if (dup)
                continue;
            char label[32];
            snprintf(label, sizeof label, "%g", r[i].budget);
            if (r[i].budget_is_fraction && !strpbrk(label, ".e"))
                snprintf(label, sizeof label, "%g.0", r[i].budget);
            fprintf(f, "%.9g %.9g %.9g %.9g %s\n", x[i], r[i].kl, r[i].top1, r[i].budget,
                    label);
            n_labels++;
        }
        if (n_labels == 0) /* gnuplot needs a point; this one lies outside the ranges */
            fputs("-1 -1 -1 0 none\n", f);
        fputs("\n\n", f);
    }
}

static void write_script(FILE *f, const kvs_gnuplot *g, void *ctx)
{
    const fidelity_plot *p = ctx;
    const series *sr = p->sr;
    const double *x = p->x;
    const char *title = p->title;
    const int n = p->n, n_series = p->n_series, log_kl = p->log_kl;
    /* Tall enough for a legend entry per series beside each panel. */
    const int height = 640 > 160 + 19 * n_series ? 640 : 160 + 19 * n_series;
    kvs_gnuplot_terminal(f, g, 1700, height);
    fputs("set multiplot layout 1,2 title ", f);
    kvs_gnuplot_quote(f, title ? title : "kvslim eval");
    fputs(" font ',13'\n"
          "set grid\n"
          "set border lw 1.2\n"
          "set xlabel 'mean KV bytes during decoding / full F16 cache of the same tokens'\n"
          "set key outside right top vertical box samplen 2 reverse Left width 1\n",
          f);
    double x_max = 1;
    for (int i = 0; i < n; i++)
        x_max = fmax(x_max, x[i]);
    fprintf(f, "set xrange [0:%.4g]\n", x_max * 1.08);
    fprintf(f, "set ylabel 'mean KL(full || policy), nats%s'\n", log_kl ? " (log scale)" : "");
    if (log_kl)
        fputs("set logscale y\nset format y '%g'\n", f);
    else
        fputs("set yrange [0:*]\n", f);
    /* The reference has KL 0: no place on a log scale, so it is left out and the title says so. */
    if (log_kl)
        fputs("set title \"KL from the full F32 cache (lower is better); points labelled with "
              "their budget\\nthe reference itself (KL 0) is not drawn on the log scale\"\n",
              f);
    else
        fputs("set title \"KL from the full F32 cache (lower is better); points labelled with "
              "their budget\\nthe reference itself sits at KL 0\"\n", f);
    plot_panel(f, g->data, sr, n_series, 2, log_kl);
    fputs("unset logscale y\nset format y '%g'\nset yrange [*:1.01]\n"
          "set key outside right top vertical box samplen 2 reverse Left width 1\n"
          "set ylabel 'top-1 agreement with the full cache'\n"
          "set title 'Top-1 agreement (higher is better)'\n",
          f);
    plot_panel(f, g->data, sr, n_series, 3, 0);
    fputs("unset multiplot\n", f);
}

kvs_status kvs_eval_plot(const kvs_eval_result *r, const int *equal_memory, int n,
                         const char *title, void **png, size_t *png_len, kvs_error *err)
{
    *png = NULL;
    *png_len = 0;
    if (n <= 0)
        return kvs_fail(err, KVS_ERR_ARG, "nothing to plot");
    kvs_status st = kvs_eval_plot_check(err);
    if (st != KVS_OK)
        return st;

    /* Series in order of first appearance; colours by policy, point shapes by storage type. */
    series *sr = calloc((size_t)n, sizeof *sr);
    double *x = malloc(sizeof(double) * (size_t)n);
    int n_series = 0, n_colors = 0, n_shapes = 0;
    if (!sr || !x) {
        free(sr);
        free(x);
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    }
    double min_kl = INFINITY, max_kl = 0;
    for (int i = 0; i < n; i++) {
        /* The same ratio as the table's column; every run sees the same tokens, so the F16
         * reference is the same for all (a full F32 cache sits at 2). */
        x[i] = r[i].kv_bytes_rel_f16;
        if (r[i].kl > 0) {
            min_kl = fmin(min_kl, r[i].kl);
            max_kl = fmax(max_kl, r[i].kl);
        }
        char key[256];
        policy_key(&r[i], key, sizeof key);
        const char *type = r[i].kv_type[0] ? r[i].kv_type : "f32";
        int eq = equal_memory && equal_memory[i];
        int j, color = -1, shape = -1;
        for (j = 0; j < n_series; j++) {
            if (!strcmp(sr[j].key, key))
                color = sr[j].color;
            if (!strcmp(sr[j].type, type))
                shape = sr[j].shape;
            if (!strcmp(sr[j].key, key) && !strcmp(sr[j].type, type) && sr[j].eq == eq)
                break;
        }
        if (j == n_series) {
            snprintf(sr[j].key, sizeof sr[j].key, "%s", key);
            snprintf(sr[j].type, sizeof sr[j].type, "%s", type);
            sr[j].eq = eq;
            sr[j].color = color >= 0 ? color : n_colors++;
            sr[j].shape = shape >= 0 ? shape : n_shapes++;
            if (!(sr[j].rows = malloc(sizeof(int) * (size_t)n))) {
                st = kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
                goto out;
            }
            n_series++;
        }
        sr[j].rows[sr[j].n++] = i;
        sr[j].any_kl |= r[i].kl > 0;
    }
    sort_x = x;
    for (int i = 0; i < n_series; i++)
        qsort(sr[i].rows, (size_t)sr[i].n, sizeof(int), by_x);
    /* Log-scale KL when the values span more than a decade. */
    fidelity_plot fp = {r, equal_memory, n, title, sr, n_series, x, max_kl,
                        max_kl > 0 && max_kl / min_kl > 10};
    st = kvs_gnuplot_draw(write_data, write_script, &fp, png, png_len, err);
out:
    for (int i = 0; i < n_series; i++)
        free(sr[i].rows);
    free(sr);
    free(x);
    return st;
}
