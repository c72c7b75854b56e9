/* Running gnuplot for the eval plots: temporary files, posix_spawnp, the PNG read back. */
#include "eval/gnuplot.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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

void kvs_gnuplot_quote(FILE *f, const char *s)
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

static const char *const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                     "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};

const char *kvs_gnuplot_color(int i)
{
    const int n = (int)(sizeof colors / sizeof colors[0]);
    return colors[(i % n + n) % n];
}

static kvs_status gnuplot_open(kvs_gnuplot *g, kvs_error *err)
{
    const char *tmp = getenv("TMPDIR");
    memset(g, 0, sizeof *g);
    char dir[sizeof g->dir];
    snprintf(dir, sizeof dir, "%s/kvslim-plot.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir))
        return kvs_fail(err, KVS_ERR_IO, "cannot create a temporary directory %s: %s", dir,
                        strerror(errno));
    memcpy(g->dir, dir, sizeof dir);
    snprintf(g->data, sizeof g->data, "%s/data.dat", dir);
    snprintf(g->script, sizeof g->script, "%s/plot.gp", dir);
    snprintf(g->image, sizeof g->image, "%s/plot.png", dir);
    snprintf(g->log, sizeof g->log, "%s/gnuplot.log", dir);
    return KVS_OK;
}

static void gnuplot_close(kvs_gnuplot *g)
{
    const char *const files[] = {g->data, g->script, g->image, g->log};
    if (g->dir[0]) {
        for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
            unlink(files[i]);
        rmdir(g->dir);
        g->dir[0] = 0;
    }
}

void kvs_gnuplot_terminal(FILE *f, const kvs_gnuplot *g, int width, int height)
{
    fprintf(f, "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
               "  set terminal pngcairo noenhanced size %d,%d font 'sans,11'\n"
               "} else {\n"
               "  set terminal png noenhanced size %d,%d\n"
               "}\n"
               "set output ",
            width, height, width, height);
    kvs_gnuplot_quote(f, g->image);
    fputc('\n', f);
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

static kvs_status gnuplot_run(const kvs_gnuplot *g, void **png, size_t *png_len,
                              kvs_error *err)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, g->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    char script[sizeof g->script];
    memcpy(script, g->script, sizeof script);
    char *argv[] = {"gnuplot", script, NULL};
    pid_t pid;
    int rc = posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        return rc == ENOENT ? kvs_fail(err, KVS_ERR_UNSUPPORTED, "%s", install_hint)
                            : kvs_fail(err, KVS_ERR_IO, "cannot run gnuplot: %s", strerror(rc));
    int status;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR)
            return kvs_fail(err, KVS_ERR_IO, "waiting for gnuplot: %s", strerror(errno));
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char msg[300] = "";
        FILE *lf = fopen(g->log, "r");
        if (lf) {
            size_t got = fread(msg, 1, sizeof msg - 1, lf);
            msg[got] = 0;
            fclose(lf);
            for (char *c = msg; *c; c++)
                if (*c == '\n' || *c == '\r')
                    *c = ' ';
        }
        if (WIFEXITED(status))
            return kvs_fail(err, KVS_ERR_IO, "gnuplot failed (exit status %d): %s",
                            WEXITSTATUS(status), msg);
        return kvs_fail(err, KVS_ERR_IO, "gnuplot was killed by signal %d",
                        WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    }
    return read_all(g->image, png, png_len, err);
}

/* Writes path with write; an error names the file. */
static kvs_status write_file(const char *path, kvs_gnuplot_writer write, const kvs_gnuplot *g,
                             void *ctx, kvs_error *err)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return kvs_fail(err, KVS_ERR_IO, "%s: %s", path, strerror(errno));
    write(f, g, ctx);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad)
        return kvs_fail(err, KVS_ERR_IO, "%s: write failed", path);
    return KVS_OK;
}

kvs_status kvs_gnuplot_draw(kvs_gnuplot_writer data, kvs_gnuplot_writer script, void *ctx,
                            void **png, size_t *png_len, kvs_error *err)
{
    kvs_gnuplot g;
    kvs_status st = gnuplot_open(&g, err);
    if (st == KVS_OK)
        st = write_file(g.data, data, &g, ctx, err);
    if (st == KVS_OK)
        st = write_file(g.script, script, &g, ctx, err);
    if (st == KVS_OK)
        st = gnuplot_run(&g, png, png_len, err);
    gnuplot_close(&g);
    return st;
}
