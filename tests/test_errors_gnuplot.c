/* Error paths of the gnuplot runner (eval/gnuplot.c, issue 16), with a fake gnuplot first on
 * PATH: a gnuplot that fails (its exit status and output quoted), one killed by a signal, one
 * that makes no image or an empty one, a gnuplot that cannot be executed, none at all, and a
 * data file whose stream reports an error. Each asserts the status and the distinctive part of
 * the message; a last run with a working fake checks the image comes back. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "eval/eval.h"
#include "eval/gnuplot.h"

static char bindir[512], fake[600];

static const char fake_script[] =
    "#!/bin/sh\n"
    "img=\"${1%/*}/plot.png\"\n"
    "case \"$KVS_FAKE_GNUPLOT\" in\n"
    "fail) echo \"line 3: undefined variable: oops\"; exit 3 ;;\n"
    "kill) kill -TERM $$ ;;\n"
    "none) exit 0 ;;\n"
    "empty) : > \"$img\"; exit 0 ;;\n"
    "*) printf 'PNGDATA' > \"$img\"; exit 0 ;;\n"
    "esac\n";

static void write_data(FILE *f, const kvs_gnuplot *g, void *ctx)
{
    (void)g;
    (void)ctx;
    fputs("1 2\n", f);
}

/* Sets the stream's error flag, as a failed write (ENOSPC) would: reading a write-only stream
 * fails with EBADF. */
static void write_data_error(FILE *f, const kvs_gnuplot *g, void *ctx)
{
    write_data(f, g, ctx);
    (void)fgetc(f);
}

static void write_script(FILE *f, const kvs_gnuplot *g, void *ctx)
{
    (void)ctx;
    kvs_gnuplot_terminal(f, g, 200, 100);
    fprintf(f, "plot '%s' using 1:2\n", g->data);
}

static kvs_status draw(const char *mode, kvs_gnuplot_writer data, void **png, size_t *len,
                       kvs_error *err)
{
    setenv("KVS_FAKE_GNUPLOT", mode, 1);
    *png = NULL;
    *len = 0;
    return kvs_gnuplot_draw(data, write_script, NULL, png, len, err);
}

#define CHECK_ERR(st_, want_st, needle)                                                      \
    CHECKF((st_) == (want_st) && strstr(err.msg, (needle)), "status %d, message '%s' (want %d, " \
           "'%s')", (int)(st_), err.msg, (int)(want_st), (needle))

int main(void)
{
    char tmpl[512];
    check_tmp_path(tmpl, sizeof tmpl, "kvs-fake-gnuplot.XXXXXX");
    if (!mkdtemp(tmpl)) {
        perror(tmpl);
        return 1;
    }
    snprintf(bindir, sizeof bindir, "%s", tmpl);
    snprintf(fake, sizeof fake, "%s/gnuplot", bindir);
    FILE *f = fopen(fake, "w");
    CHECK(f != NULL);
    if (!f)
        return check_summary("test_errors_gnuplot");
    fputs(fake_script, f);
    fclose(f);
    chmod(fake, 0700);
    /* Only the fake directory (the script uses sh builtins alone), so that a real gnuplot
     * cannot be found instead. */
    setenv("PATH", bindir, 1);
    unsetenv("TMPDIR");

    kvs_error err = {0};
    void *png = NULL;
    size_t len = 0;

    /* The working fake: the image comes back whole. */
    kvs_status st = draw("ok", write_data, &png, &len, &err);
    CHECKF(st == KVS_OK && len == 7 && png && !memcmp(png, "PNGDATA", 7), "%d %s", st, err.msg);
    free(png);

    st = draw("fail", write_data, &png, &len, &err);
    CHECK_ERR(st, KVS_ERR_IO, "gnuplot failed (exit status 3): line 3: undefined variable: oops");
    CHECK(png == NULL);

    st = draw("kill", write_data, &png, &len, &err);
    CHECK_ERR(st, KVS_ERR_IO, "gnuplot was killed by signal 15");

    st = draw("none", write_data, &png, &len, &err);
    CHECK_ERR(st, KVS_ERR_IO, "gnuplot produced no image (");
    CHECK(strstr(err.msg, "plot.png: No such file or directory") != NULL);

    st = draw("empty", write_data, &png, &len, &err);
    CHECK_ERR(st, KVS_ERR_IO, "plot.png: empty file");
    CHECK(strstr(err.msg, "gnuplot image ") != NULL);

    /* The data file's stream fails: named, and gnuplot never runs. */
    st = draw("ok", write_data_error, &png, &len, &err);
    CHECK_ERR(st, KVS_ERR_IO, "data.dat: write failed");
    CHECK(png == NULL);

    /* A gnuplot that is there but cannot be executed: the exec error, not the install hint. */
    chmod(fake, 0600);
    st = draw("ok", write_data, &png, &len, &err);
    CHECK_ERR(st, KVS_ERR_IO, "cannot run gnuplot: Permission denied");

    /* None on PATH: the install hint, as kvs_eval_plot_check gives it. */
    unlink(fake);
    st = draw("ok", write_data, &png, &len, &err);
    CHECK_ERR(st, KVS_ERR_UNSUPPORTED, "gnuplot was not found on PATH");
    CHECK(kvs_eval_plot_check(&err) == KVS_ERR_UNSUPPORTED);
    rmdir(bindir);
    return check_summary("test_errors_gnuplot");
}
