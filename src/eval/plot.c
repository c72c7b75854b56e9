/* The eval plot: KL and top-1 against mean KV bytes relative to a full F16 cache of the same
 * tokens (the reference of the table's "KV bytes vs full F16" column), drawn by
 * gnuplot (run with posix_spawnp, no shell) from a data file and a script in a temporary
 * directory. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/error.h"
#include "eval/eval.h"

extern char **environ;

static const char *const install_hint =
    "gnuplot was not found on PATH; install it (Debian: apt-get install gnuplot-nox, or "
    "scripts/setup-deps.sh) or leave out --plot";

kvs_status kvs_eval_plot_check(kvs_error *err)
{
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    char dir[4096];
    while (*path) {
        size_t len = strcspn(path, ":");
        if (len > 0 && len < sizeof dir - 16) {
            memcpy(dir, path, len);
            snprintf(dir + len, sizeof dir - len, "/gnuplot");
            if (access(dir, X_OK) == 0)
                return KVS_OK;
        }
        path += len;
        if (*path == ':')
            path++;
    }
    return kvs_fail(err, KVS_ERR_UNSUPPORTED, "%s", install_hint);
}

/* s as a gnuplot single-quoted string: quotes doubled, control bytes as spaces. */
static void put_quoted(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\'')
            fputs("''", f);
        else
            fputc(c < 0x20 ? ' ' : c, f);
    }
    fputc('\'', f);
}

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

static kvs_status read_all(const char *path, void **out, size_t *len, kvs_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return kvs_fail(err, KVS_ERR_IO, "gnuplot produced no image (%s: %s)", path,
                        strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *nb = realloc(buf, cap *= 2);
        if (!nb) {
            free(buf);
            buf = NULL;
        } else {
            buf = nb;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad || n == 0) {
        free(buf);
        return kvs_fail(err, buf ? KVS_ERR_IO : KVS_ERR_NOMEM, "gnuplot image %s: %s", path,
                        !buf ? "out of memory" : bad ? "read error" : "empty file");
    }
    *out = buf;
    *len = n;
    return KVS_OK;
}

static const char *const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                     "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
#define N_COLORS ((int)(sizeof colors / sizeof colors[0]))
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
        const char *color = colors[s->color % N_COLORS];
        fputs(first ? "" : ", \\\n     ", f);
        first = 0;
        put_quoted(f, data);
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
        put_quoted(f, title);
    }
    /* The last block holds one labelled point per distinct (x, budget). */
    fputs(", \\\n     ", f);
    put_quoted(f, data);
    fprintf(f, " index %d using 1:%s:5 with labels offset 1.4,0.8 "
               "font ',9' tc rgb '#555555' notitle", n_series + (column == 3), y);
    fputc('\n', f);
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
    /* Log-scale KL when the values span more than a decade. */
    const int log_kl = max_kl > 0 && max_kl / min_kl > 10;

    char dir[4096], data[4200], script[4200], image[4200], log_path[4200];
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/kvslim-plot.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        st = kvs_fail(err, KVS_ERR_IO, "cannot create a temporary directory %s: %s", dir,
                      strerror(errno));
        goto out;
    }
    snprintf(data, sizeof data, "%s/data.dat", dir);
    snprintf(script, sizeof script, "%s/plot.gp", dir);
    snprintf(image, sizeof image, "%s/plot.png", dir);
    snprintf(log_path, sizeof log_path, "%s/gnuplot.log", dir);

    FILE *f = fopen(data, "w");
    if (!f) {
        st = kvs_fail(err, KVS_ERR_IO, "%s: %s", data, strerror(errno));
        goto cleanup;
    }
    sort_x = x;
    for (int i = 0; i < n_series; i++) {
        qsort(sr[i].rows, (size_t)sr[i].n, sizeof(int), by_x);
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
    if (fclose(f) != 0) {
        st = kvs_fail(err, KVS_ERR_IO, "%s: write failed", data);
        goto cleanup;
    }

    if (!(f = fopen(script, "w"))) {
        st = kvs_fail(err, KVS_ERR_IO, "%s: %s", script, strerror(errno));
        goto cleanup;
    }
    /* Tall enough for a legend entry per series beside each panel. */
    const int height = 640 > 160 + 19 * n_series ? 640 : 160 + 19 * n_series;
    fprintf(f, "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
               "  set terminal pngcairo noenhanced size 1700,%d font 'sans,11'\n"
               "} else {\n"
               "  set terminal png noenhanced size 1700,%d\n"
               "}\n"
               "set output ",
            height, height);
    put_quoted(f, image);
    fputs("\nset multiplot layout 1,2 title ", f);
    put_quoted(f, title ? title : "kvslim eval");
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
    plot_panel(f, data, sr, n_series, 2, log_kl);
    fputs("unset logscale y\nset format y '%g'\nset yrange [*:1.01]\n"
          "set key outside right top vertical box samplen 2 reverse Left width 1\n"
          "set ylabel 'top-1 agreement with the full cache'\n"
          "set title 'Top-1 agreement (higher is better)'\n",
          f);
    plot_panel(f, data, sr, n_series, 3, 0);
    fputs("unset multiplot\n", f);
    if (fclose(f) != 0) {
        st = kvs_fail(err, KVS_ERR_IO, "%s: write failed", script);
        goto cleanup;
    }

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    char *argv[] = {"gnuplot", script, NULL};
    pid_t pid;
    int rc = posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        st = rc == ENOENT ? kvs_fail(err, KVS_ERR_UNSUPPORTED, "%s", install_hint)
                          : kvs_fail(err, KVS_ERR_IO, "cannot run gnuplot: %s", strerror(rc));
        goto cleanup;
    }
    int status;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            st = kvs_fail(err, KVS_ERR_IO, "waiting for gnuplot: %s", strerror(errno));
            goto cleanup;
        }
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char msg[300] = "";
        FILE *lf = fopen(log_path, "r");
        if (lf) {
            size_t got = fread(msg, 1, sizeof msg - 1, lf);
            msg[got] = 0;
            fclose(lf);
            for (char *c = msg; *c; c++)
                if (*c == '\n' || *c == '\r')
                    *c = ' ';
        }
        if (WIFEXITED(status))
            st = kvs_fail(err, KVS_ERR_IO, "gnuplot failed (exit status %d): %s",
                          WEXITSTATUS(status), msg);
        else
            st = kvs_fail(err, KVS_ERR_IO, "gnuplot was killed by signal %d",
                          WIFSIGNALED(status) ? WTERMSIG(status) : 0);
        goto cleanup;
    }
    st = read_all(image, png, png_len, err);
cleanup:
    unlink(data);
    unlink(script);
    unlink(image);
    unlink(log_path);
    rmdir(dir);
out:
    for (int i = 0; i < n_series; i++)
        free(sr[i].rows);
    free(sr);
    free(x);
    return st;
}
