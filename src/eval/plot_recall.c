/* The recall plot: accuracy heat maps (needle depth x prompt set), accuracy vs share attended. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval/eval.h"
#include "eval/gnuplot.h"
#include "eval/plan.h"
#include "eval/recall.h"

#define BINS KVS_RECALL_PLOT_BINS

/* A column of the heat maps: a prompt set. */
typedef struct column {
    const char *name;
    double context_sum;
    int n;       /* its rows (all configurations) */
    int n_depth; /* of which with a known depth */
    int x;       /* its place from the left (by mean context) */
} column;

/* A heat map: a configuration (params x KV type). */
typedef struct panel {
    const char *params, *kv_type, *budget;
    int line;
    int n_prompts, n_answers, n_correct;
    double share_sum, slots_sum;
} panel;

/* A line of the second chart: a policy on a KV type; its points are panels, by share. */
typedef struct line {
    char key[256];
    const char *kv_type;
    int color, shape;
    int n;
} line;

typedef struct layout {
    column *cols;
    panel *panels;
    line *lines;
    int n_cols, n_panels, n_lines;
    int *row_col, *row_panel; /* per row */
    int *points;              /* line l's panels from points[l * n_panels], by share */
    int *cells;               /* (panel, column, bin): answers, correct */
    const char *title;
} layout;

static void layout_free(layout *L)
{
    free(L->cols);
    free(L->panels);
    free(L->lines);
    free(L->row_col);
    free(L->row_panel);
    free(L->points);
    free(L->cells);
}

static double share(const panel *p)
{
    return p->n_prompts ? p->share_sum / p->n_prompts : 0;
}

static double accuracy(const panel *p)
{
    return p->n_answers ? (double)p->n_correct / p->n_answers : 0;
}

static int *cell(const layout *L, int p, int c, int bin)
{
    return &L->cells[(((size_t)p * (size_t)L->n_cols + (size_t)c) * BINS + (size_t)bin) * 2];
}

/* The line of a new panel: its policy (params without the budget) on its KV type. */
static int find_line(layout *L, const char *params, const char *kv_type)
{
    char key[256];
    kvs_eval_policy_label(params, key, sizeof key);
    int color = -1, shape = -1, l;
    for (l = 0; l < L->n_lines; l++) {
        int same_key = !strcmp(L->lines[l].key, key);
        int same_type = !strcmp(L->lines[l].kv_type, kv_type);
        if (same_key && same_type)
            return l;
        if (same_key)
            color = L->lines[l].color;
        if (same_type)
            shape = L->lines[l].shape;
    }
    int n_colors = 0, n_shapes = 0;
    for (int k = 0; k < L->n_lines; k++) {
        n_colors = L->lines[k].color + 1 > n_colors ? L->lines[k].color + 1 : n_colors;
        n_shapes = L->lines[k].shape + 1 > n_shapes ? L->lines[k].shape + 1 : n_shapes;
    }
    line *ln = &L->lines[L->n_lines++];
    snprintf(ln->key, sizeof ln->key, "%s", key);
    ln->kv_type = kv_type;
    ln->color = color >= 0 ? color : n_colors;
    ln->shape = shape >= 0 ? shape : n_shapes;
    return l;
}

static int find_column(layout *L, const char *name)
{
    for (int c = 0; c < L->n_cols; c++)
        if (!strcmp(L->cols[c].name, name))
            return c;
    L->cols[L->n_cols].name = name;
    return L->n_cols++;
}

static int find_panel(layout *L, const kvs_recall_plot_row *r, const char *kv_type)
{
    for (int p = 0; p < L->n_panels; p++)
        if (!strcmp(L->panels[p].params, r->params) && !strcmp(L->panels[p].kv_type, kv_type))
            return p;
    panel *pn = &L->panels[L->n_panels];
    pn->params = r->params;
    pn->kv_type = kv_type;
    pn->budget = r->budget_label && *r->budget_label && strcmp(r->budget_label, "-")
                     ? r->budget_label : NULL;
    pn->line = find_line(L, r->params, kv_type);
    return L->n_panels++;
}

/* Columns in order of mean context (the order given on ties), and each line's points in order
 * of share (an insertion sort: a handful of budgets). */
static void order(layout *L)
{
    for (int c = 0; c < L->n_cols; c++) {
        double mean = L->cols[c].context_sum / L->cols[c].n;
        L->cols[c].x = 0;
        for (int k = 0; k < L->n_cols; k++) {
            double other = L->cols[k].context_sum / L->cols[k].n;
            L->cols[c].x += other < mean || (other == mean && k < c);
        }
    }
    for (int p = 0; p < L->n_panels; p++) {
        line *ln = &L->lines[L->panels[p].line];
        int *pts = &L->points[(size_t)L->panels[p].line * (size_t)L->n_panels];
        int k = ln->n++;
        for (; k > 0 && share(&L->panels[pts[k - 1]]) > share(&L->panels[p]); k--)
            pts[k] = pts[k - 1];
        pts[k] = p;
    }
}

static kvs_status collect(layout *L, const kvs_recall_plot_row *rows, int n, kvs_error *err)
{
    size_t un = (size_t)n;
    L->cols = calloc(un, sizeof *L->cols);
    L->panels = calloc(un, sizeof *L->panels);
    L->lines = calloc(un, sizeof *L->lines);
    L->row_col = malloc(un * sizeof *L->row_col);
    L->row_panel = malloc(un * sizeof *L->row_panel);
    if (!L->cols || !L->panels || !L->lines || !L->row_col || !L->row_panel)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        const kvs_recall_plot_row *r = &rows[i];
        if (!r->params || !r->set)
            return kvs_fail(err, KVS_ERR_ARG, "recall plot: row %d has no spec or prompt set", i);
        int c = L->row_col[i] = find_column(L, r->set);
        int p = L->row_panel[i] = find_panel(L, r, r->kv_type ? r->kv_type : "f32");
        column *col = &L->cols[c];
        col->context_sum += r->context;
        col->n++;
        col->n_depth += r->depth >= 0; /* false for NaN too */
        panel *pn = &L->panels[p];
        pn->n_prompts++;
        pn->n_answers += r->n_answers;
        pn->n_correct += r->n_correct;
        pn->share_sum += r->attended_share;
        pn->slots_sum += r->slots_attended;
    }
    size_t n_cells = (size_t)L->n_panels * (size_t)L->n_cols * BINS * 2;
    L->cells = calloc(n_cells, sizeof *L->cells);
    L->points = malloc((size_t)L->n_lines * (size_t)L->n_panels * sizeof *L->points);
    if (!L->cells || !L->points)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        if (!(rows[i].depth >= 0)) /* unknown (or not a number) */
            continue;
        int bin = (int)floor(fmin(rows[i].depth, 1.0) * (BINS - 1) + 0.5);
        int *cl = cell(L, L->row_panel[i], L->row_col[i], bin);
        cl[0] += rows[i].n_answers;
        cl[1] += rows[i].n_correct;
    }
    order(L);
    return KVS_OK;
}

/* A budget label fit for a whitespace-separated data file. */
static void data_word(FILE *f, const char *s)
{
    for (; *s; s++)
        fputc((unsigned char)*s <= ' ' || *s == '"' || *s == '#' || *s == '\'' ? '_' : *s, f);
}

/* Blocks: a heat map's cells per panel ("x depth accuracy correct/answers"), a line's points
 * per line ("share accuracy"), then the line chart's labels ("share accuracy budget"). An empty
 * block gets a point outside the ranges: gnuplot needs one. */
static void write_data(FILE *f, const kvs_gnuplot *g, void *ctx)
{
    (void)g;
    const layout *L = ctx;
    for (int p = 0; p < L->n_panels; p++) {
        fprintf(f, "# %s, %s: column depth accuracy correct/answers\n", L->panels[p].params,
                L->panels[p].kv_type);
        int any = 0;
        for (int c = 0; c < L->n_cols; c++)
            for (int b = 0; b < BINS; b++) {
                const int *cl = cell(L, p, c, b);
                if (cl[0] == 0)
                    continue;
                fprintf(f, "%d %.2f %.6f %d/%d\n", L->cols[c].x, (double)b / (BINS - 1),
                        (double)cl[1] / cl[0], cl[1], cl[0]);
                any = 1;
            }
        fputs(any ? "\n\n" : "-10 -10 0 none\n\n\n", f);
    }
    for (int l = 0; l < L->n_lines; l++) {
        fprintf(f, "# %s, %s: share accuracy\n", L->lines[l].key, L->lines[l].kv_type);
        for (int k = 0; k < L->lines[l].n; k++) {
            const panel *pn = &L->panels[L->points[(size_t)l * (size_t)L->n_panels + (size_t)k]];
            fprintf(f, "%.6f %.6f\n", share(pn), accuracy(pn));
        }
        fputs("\n\n", f);
    }
    /* A label left out where the same budget already sits at nearly the same place. */
    fputs("# labels: share accuracy budget\n", f);
    int n_labels = 0;
    for (int p = 0; p < L->n_panels; p++) {
        const panel *pn = &L->panels[p];
        int dup = !pn->budget;
        for (int k = 0; k < p && !dup; k++)
            dup = L->panels[k].budget && !strcmp(L->panels[k].budget, pn->budget) &&
                  fabs(share(&L->panels[k]) - share(pn)) < 0.02 &&
                  fabs(accuracy(&L->panels[k]) - accuracy(pn)) < 0.02;
        if (dup)
            continue;
        fprintf(f, "%.6f %.6f ", share(pn), accuracy(pn));
        data_word(f, pn->budget);
        fputc('\n', f);
        n_labels++;
    }
    fputs(n_labels ? "\n\n" : "-1 -1 none\n\n\n", f);
}

/* Pixels of the image: a heat map is at least PANEL_W wide, COLUMN_W a prompt set beside
 * MARGINS_W of axis and colour box; as many side by side as fit in MAX_W (3 at the most). */
enum { PANEL_W = 560, COLUMN_W = 95, MARGINS_W = 200, PANEL_H = 440, TOP_H = 70,
       CHART_H = 540, MAX_W = 1800, MAX_PANEL_COLS = 3 };

/* One heat map at (x, y, w, h), screen fractions. */
static void write_panel(FILE *f, const char *data, const layout *L, int p, double x, double y,
                        double w, double h)
{
    const panel *pn = &L->panels[p];
    char head[400], stats[200];
    snprintf(head, sizeof head, "%s, %s", pn->params, pn->kv_type);
    snprintf(stats, sizeof stats, "accuracy %.0f%% (%d/%d), attends %.1f%% of the context "
             "(%.1f slots)", 100 * accuracy(pn), pn->n_correct, pn->n_answers, 100 * share(pn),
             pn->n_prompts ? pn->slots_sum / pn->n_prompts : 0.0);
    fprintf(f, "set origin %.5f,%.5f\nset size %.5f,%.5f\nset title ", x, y, w, h);
    kvs_gnuplot_quote(f, head);
    fputs(".\"\\n\".", f);
    kvs_gnuplot_quote(f, stats);
    fprintf(f, "\nplot ");
    kvs_gnuplot_quote(f, data);
    fprintf(f, " index %d using 1:2:(0.5):(0.05):3 with boxxyerror fs solid 1.0 border "
               "lc rgb 'white' fc palette notitle, \\\n     ", p);
    kvs_gnuplot_quote(f, data);
    fprintf(f, " index %d using 1:2:4 with labels font ',8' notitle\n", p);
}

/* The heat maps' shared settings: palette, fixed [0, 1] colour range, axes. */
static void write_heat_axes(FILE *f, const layout *L)
{
    fprintf(f, "set palette defined (0 '#d73027', 0.5 '#fee08b', 1 '#1a9850')\n"
               "set cbrange [0:1]\nset cbtics 0.2\nset cblabel 'accuracy'\nset colorbox\n"
               "unset grid\nunset key\nset border lw 1.2\n"
               "set xrange [-0.5:%.1f]\nset yrange [1.05:-0.05]\n"
               "set ytics 0,0.1,1 format '%%.1f'\n"
               "set ylabel 'needle depth (0 = start of the context)'\nunset xlabel\n"
               "set xtics scale 0 (",
            L->n_cols - 0.5);
    for (int c = 0; c < L->n_cols; c++) {
        const column *col = &L->cols[c];
        char sub[64];
        snprintf(sub, sizeof sub, "%.0f tokens", col->context_sum / col->n);
        fputs(c ? ", " : "", f);
        kvs_gnuplot_quote(f, col->name);
        fputs(".\"\\n\".", f);
        kvs_gnuplot_quote(f, sub);
        fprintf(f, "%s %d", col->n_depth ? "" : ".\"\\nno depths\"", col->x);
    }
    fputs(")\n", f);
    /* Room for the tick labels' lines (gnuplot leaves too little for three). */
    int no_depths = 0;
    for (int c = 0; c < L->n_cols; c++)
        no_depths |= L->cols[c].n_depth == 0;
    fprintf(f, "set bmargin %d\n", no_depths ? 5 : 4);
}

/* Accuracy against share attended at (0, 0), the image's width, chart_h high (a fraction). */
static void write_chart(FILE *f, const char *data, const layout *L, double chart_h)
{
    static const int filled_pt[] = {7, 5, 9, 11, 13, 15};
    const int n_pt = (int)(sizeof filled_pt / sizeof filled_pt[0]);
    /* A log scale for the share: the budgets worth comparing sit at 1-10% of the context,
     * which a linear axis to 1 (the full cache) squeezes into its left edge. */
    double lo = 0.005;
    for (int i = 0; i < L->n_panels; i++) {
        const double share = L->panels[i].n_prompts ? L->panels[i].share_sum /
                                                          L->panels[i].n_prompts : 1;
        if (share > 0 && share / 1.5 < lo)
            lo = share / 1.5;
    }
    fprintf(f, "set origin 0,0\nset size 1,%.5f\nset bmargin\nset logscale x 10\n"
               "set xrange [%g:1.3]\nset yrange [-0.02:1.05]\n"
               "set xtics (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1) scale 1\n"
               "set ytics autofreq format '%%g'\nset format x '%%g'\n"
               "set grid\nset key outside right top vertical box samplen 2 reverse Left width 1\n"
               "set xlabel 'share of the context attended (slots attended / tokens seen, mean "
               "over decode steps and prompts)'\n"
               "set ylabel 'accuracy (answers whose argmax is right)'\n"
               "set title 'Accuracy against the share of the context attended, all prompt sets "
               "pooled; points labelled with their budget'\n"
               "plot ",
            chart_h, lo);
    for (int l = 0; l < L->n_lines; l++) {
        const line *ln = &L->lines[l];
        char title[400];
        snprintf(title, sizeof title, "%s, %s", ln->key, ln->kv_type);
        kvs_gnuplot_quote(f, data);
        fprintf(f, " index %d using 1:2 with linespoints lw 2 pt %d ps 1.3 lc rgb '%s' title ",
                L->n_panels + l, filled_pt[ln->shape % n_pt], kvs_gnuplot_color(ln->color));
        kvs_gnuplot_quote(f, title);
        fputs(", \\\n     ", f);
    }
    kvs_gnuplot_quote(f, data);
    fprintf(f, " index %d using 1:2:3 with labels offset 1.4,0.8 font ',9' tc rgb '#555555' "
               "notitle\n", L->n_panels + L->n_lines);
}

static void write_script(FILE *f, const kvs_gnuplot *g, void *ctx)
{
    const layout *L = ctx;
    int panel_w = MARGINS_W + COLUMN_W * L->n_cols;
    panel_w = panel_w > PANEL_W ? panel_w : PANEL_W;
    int n_pc = MAX_W / panel_w < MAX_PANEL_COLS ? MAX_W / panel_w : MAX_PANEL_COLS;
    n_pc = n_pc < 1 ? 1 : n_pc > L->n_panels ? L->n_panels : n_pc;
    int n_rows = (L->n_panels + n_pc - 1) / n_pc;
    int slots = n_pc < 2 ? 2 : n_pc; /* a lone heat map takes half the width, centred */
    int width = slots * panel_w, height = TOP_H + n_rows * PANEL_H + CHART_H;
    kvs_gnuplot_terminal(f, g, width, height);
    fputs("set multiplot title ", f);
    kvs_gnuplot_quote(f, L->title ? L->title : "kvslim eval --task recall");
    fputs(" font ',13'\n", f);
    write_heat_axes(f, L);
    const double w = 1.0 / slots, h = (double)PANEL_H / height;
    const double x0 = (slots - n_pc) * w / 2;
    for (int p = 0; p < L->n_panels; p++) {
        int r = p / n_pc, c = p % n_pc;
        double y = (double)(CHART_H + (n_rows - 1 - r) * PANEL_H) / height;
        write_panel(f, g->data, L, p, x0 + c * w, y, w, h);
    }
    write_chart(f, g->data, L, (double)CHART_H / height);
    fputs("unset multiplot\n", f);
}

kvs_status kvs_recall_plot(const kvs_recall_plot_row *rows, int n, const char *title,
                           void **png, size_t *png_len, kvs_error *err)
{
    *png = NULL;
    *png_len = 0;
    if (n <= 0)
        return kvs_fail(err, KVS_ERR_ARG, "nothing to plot");
    kvs_status st = kvs_eval_plot_check(err);
    if (st != KVS_OK)
        return st;
    layout L = {.title = title};
    if ((st = collect(&L, rows, n, err)) == KVS_OK)
        st = kvs_gnuplot_draw(write_data, write_script, &L, png, png_len, err);
    layout_free(&L);
    return st;
}
