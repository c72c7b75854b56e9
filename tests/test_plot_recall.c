/* eval --task recall's plot (src/eval/plot_recall.c) on made-up rows: a PNG comes back, the
 * temporary directory is removed, bad input and an unusable TMPDIR fail with a message. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "eval/eval.h"
#include "eval/recall.h"

#define HAS(msg, part) CHECKF(strstr((msg), (part)) != NULL, "'%s' lacks '%s'", (msg), (part))

/* Entries of dir other than . and .. (-1 if it cannot be opened). */
static int entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

/* Three configurations (full, two budgets of one policy) on two KV types, three prompt sets
 * given out of context order: one without depths, one named with a quote; depths across the
 * bins, 0 and 1 included. */
static int make_rows(kvs_recall_plot_row *rows, int max)
{
    static const char *const specs[] = {"full", "streaming:budget=0.1", "streaming:budget=0.25"};
    static const char *const labels[] = {"-", "0.1", "0.25"};
    static const char *const sets[] = {"recall-1024", "it's-256", "no-manifest"};
    static const int contexts[] = {1022, 254, 510};
    static const char *const types[] = {NULL, "kivi4"};
    int n = 0;
    for (int t = 0; t < 2; t++)
        for (int s = 0; s < 3; s++)
            for (int c = 0; c < 3; c++)
                for (int i = 0; i < 12 && n < max; i++, n++) {
                    double share = c == 0 ? 1 : c == 1 ? 0.1 : 0.25;
                    rows[n] = (kvs_recall_plot_row){specs[c], labels[c], types[t], sets[s],
                                                    contexts[s], s == 2 ? -1 : i / 11.0, 1,
                                                    c == 0 || (i + c) % 3 == 0, share,
                                                    share * contexts[s]};
                }
    return n;
}

static void test_bad_input(void)
{
    void *png = (void *)&png;
    size_t len = 7;
    kvs_error err = {0};
    CHECK(kvs_recall_plot(NULL, 0, NULL, &png, &len, &err) == KVS_ERR_ARG);
    CHECK(png == NULL && len == 0);
    HAS(err.msg, "nothing to plot");
    if (kvs_eval_plot_check(&err) != KVS_OK)
        return;
    kvs_recall_plot_row row = {.params = "full", .set = NULL, .context = 10, .depth = 0.5};
    CHECK(kvs_recall_plot(&row, 1, NULL, &png, &len, &err) == KVS_ERR_ARG);
    CHECK(png == NULL);
    HAS(err.msg, "no spec or prompt set");
}

static void test_png(const char *tmpdir)
{
    kvs_recall_plot_row rows[256];
    int n = make_rows(rows, 256);
    void *png = NULL;
    size_t len = 0;
    kvs_error err = {0};
    kvs_status st = kvs_recall_plot(rows, n, "test: it's a title", &png, &len, &err);
    CHECKF(st == KVS_OK, "%s", err.msg);
    CHECK(png && len > 20000 && !memcmp(png, "\x89PNG\r\n\x1a\n", 8));
    free(png);
    CHECK(entries(tmpdir) == 0); /* gnuplot's files and their directory are gone */

    /* One row, no depth: a heat map without cells still draws. */
    kvs_recall_plot_row one = {"h2o:budget=0.5", "0.5", "f16", "x", 100, -1, 1, 0, 0.5, 50};
    png = NULL;
    st = kvs_recall_plot(&one, 1, NULL, &png, &len, &err);
    CHECKF(st == KVS_OK, "%s", err.msg);
    CHECK(png && len > 1000 && !memcmp(png, "\x89PNG", 4));
    free(png);
    CHECK(entries(tmpdir) == 0);
}

int main(void)
{
    char tmpdir[4096], missing[4200];
    check_tmp_path(tmpdir, sizeof tmpdir, "plot_recall.XXXXXX");
    if (!mkdtemp(tmpdir)) {
        fprintf(stderr, "cannot create %s\n", tmpdir);
        return 1;
    }
    setenv("TMPDIR", tmpdir, 1);
    test_bad_input();
    kvs_error err = {0};
    if (kvs_eval_plot_check(&err) == KVS_OK) {
        test_png(tmpdir);
        /* A TMPDIR that does not exist: the error names the directory. */
        snprintf(missing, sizeof missing, "%s/missing", tmpdir);
        setenv("TMPDIR", missing, 1);
        kvs_recall_plot_row rows[8];
        int n = make_rows(rows, 8);
        void *png = NULL;
        size_t len = 0;
        CHECK(kvs_recall_plot(rows, n, NULL, &png, &len, &err) == KVS_ERR_IO);
        CHECK(png == NULL);
        HAS(err.msg, "cannot create a temporary directory");
        HAS(err.msg, missing);
    } else {
        fprintf(stderr, "gnuplot not on PATH: the PNG checks are skipped (%s)\n", err.msg);
    }
    rmdir(tmpdir);
    return check_summary("test_plot_recall");
}
