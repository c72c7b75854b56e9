/* Running gnuplot for the eval plots (plot.c, plot_recall.c): a temporary directory for the
 * data file and script a plot writes, gnuplot run on the script with posix_spawnp (no shell),
 * the PNG it makes read back. kvs_eval_plot_check (eval.h) is defined with these. */
#ifndef KVS_EVAL_GNUPLOT_H
#define KVS_EVAL_GNUPLOT_H

#include <stddef.h>
#include <stdio.h>

#include "core/error.h"

/* One gnuplot job: the directory and the files in it. */
typedef struct kvs_gnuplot {
    char dir[4096];     /* "" until it is created */
    char data[4200];    /* the plot's data file */
    char script[4200];  /* its gnuplot script */
    char image[4200];   /* the PNG gnuplot writes */
    char log[4200];     /* gnuplot's stdout and stderr */
} kvs_gnuplot;

/* Writes one of a plot's two files (g names both). */
typedef void (*kvs_gnuplot_writer)(FILE *f, const kvs_gnuplot *g, void *ctx);

/* Creates the directory ($TMPDIR, else /tmp), has data write g->data and script g->script
 * (starting with kvs_gnuplot_terminal), runs gnuplot on the script, reads the image into *png
 * (malloc'd) and removes the directory. A failing gnuplot's error quotes the start of its
 * output. */
kvs_status kvs_gnuplot_draw(kvs_gnuplot_writer data, kvs_gnuplot_writer script, void *ctx,
                            void **png, size_t *png_len, kvs_error *err);
/* The script's first lines: a PNG terminal of width x height pixels (pngcairo when gnuplot has
 * it), no enhanced text, output to g->image. */
void kvs_gnuplot_terminal(FILE *f, const kvs_gnuplot *g, int width, int height);

/* s as a gnuplot single-quoted string: quotes doubled, control bytes as spaces. */
void kvs_gnuplot_quote(FILE *f, const char *s);
/* Line colour i ("#rrggbb"), cycling through ten. */
const char *kvs_gnuplot_color(int i);

#endif
