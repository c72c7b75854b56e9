/* Files the CLI reads and writes for the user: prompt and token files (typed, bounded, text
 * only), output files (through core/outfile), and the removal of temporary files when the
 * process is interrupted. */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvslim_tools.h"

/* ---- temporary files removed on SIGINT / SIGTERM / SIGHUP ----
 *
 * A signal handler gets no context, so the paths it must remove live in this static table: the
 * library tells us each temporary file it creates (kvs_outfile_spec.on_temp) and when it is gone.
 * A slot's path is written before the slot is marked used, and the handler only reads marked
 * slots and calls unlink(), which is async-signal-safe. A command has at most one temporary
 * file at a time; the spare slots cover nesting. A path that does not fit is not tracked. */
enum { TEMP_SLOTS = 8, TEMP_PATH_MAX = 4096 };
static char temp_path[TEMP_SLOTS][TEMP_PATH_MAX];
static volatile sig_atomic_t temp_used[TEMP_SLOTS];
static int handlers_installed;

static const int cleanup_signals[] = {SIGINT, SIGTERM, SIGHUP};

static void remove_temps_and_die(int sig)
{
    for (int i = 0; i < TEMP_SLOTS; i++)
        if (temp_used[i])
            unlink(temp_path[i]);
    /* SA_RESETHAND restored the default action; re-raise so the exit status says "killed by
     * sig" (128 + sig in a shell). The signal is blocked until the handler returns. */
    raise(sig);
}

/* Installed on the first temporary file, so commands that never write keep the default
 * behaviour; a signal the parent made us ignore (nohup, background jobs) stays ignored. */
static void install_handlers(void)
{
    if (handlers_installed)
        return;
    handlers_installed = 1;
    for (size_t i = 0; i < sizeof cleanup_signals / sizeof cleanup_signals[0]; i++) {
        struct sigaction old, sa;
        if (sigaction(cleanup_signals[i], NULL, &old) != 0 || old.sa_handler != SIG_DFL)
            continue;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = remove_temps_and_die;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESETHAND;
        sigaction(cleanup_signals[i], &sa, NULL);
    }
}

void cli_temp_track(void *ctx, const char *path, int exists)
{
    (void)ctx;
    size_t n = strlen(path);
    if (exists) {
        install_handlers();
        for (int i = 0; i < TEMP_SLOTS; i++)
            if (!temp_used[i] && n < TEMP_PATH_MAX) {
                memcpy(temp_path[i], path, n + 1);
                atomic_signal_fence(memory_order_seq_cst); /* path complete before the mark */
                temp_used[i] = 1;
                return;
            }
        return;
    }
    for (int i = 0; i < TEMP_SLOTS; i++)
        if (temp_used[i] && strcmp(temp_path[i], path) == 0) {
            temp_used[i] = 0;
            return;
        }
}

/* ---- outputs ---- */

kvs_outfile_spec cli_output(const char *flag, const char *path, const kvs_outfile_input *inputs,
                            int n_inputs)
{
    return (kvs_outfile_spec){.path = path, .flag = flag, .inputs = inputs,
                              .n_inputs = n_inputs, .dash_is_stdout = 1,
                              .on_temp = cli_temp_track};
}

int cli_check_output(const char *cmd, const kvs_outfile_spec *out, kvs_outfile_kind *kind)
{
    kvs_error err = {0};
    if (kvs_outfile_check(out, kind, &err) != KVS_OK) {
        cli_error(cmd, "%s", err.msg);
        return -1;
    }
    return 0;
}

int cli_write_output(const char *cmd, const kvs_outfile_spec *out, const void *data, size_t len)
{
    kvs_error err = {0};
    if (kvs_outfile_write(out, data, len, &err) != KVS_OK) {
        cli_error(cmd, "%s", err.msg);
        return -1;
    }
    return 0;
}

int cli_write_built(const char *cmd, const kvs_outfile_spec *out, char *buf, size_t len)
{
    if (!buf) {
        cli_error(cmd, "out of memory");
        return -1;
    }
    int rc = cli_write_output(cmd, out, buf, len);
    free(buf);
    return rc;
}

int cli_write_file(const char *cmd, const char *path, const void *data, size_t len)
{
    kvs_outfile_spec out = cli_output(NULL, path, NULL, 0);
    return cli_write_output(cmd, &out, data, len);
}

int cli_copy_to_output(const char *cmd, const kvs_outfile_spec *out, const char *src_path)
{
    kvs_error err = {0};
    FILE *in = fopen(src_path, "rb");
    if (!in) {
        cli_error(cmd, "%s: %s", src_path, strerror(errno));
        return -1;
    }
    kvs_outfile *o;
    if (kvs_outfile_open(out, &o, &err) != KVS_OK) {
        fclose(in);
        cli_error(cmd, "%s", err.msg);
        return -1;
    }
    FILE *f = kvs_outfile_stream(o);
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, f) != n)
            break;
    int bad_read = ferror(in);
    fclose(in);
    if (bad_read) {
        kvs_outfile_abort(o);
        cli_error(cmd, "%s: read error", src_path);
        return -1;
    }
    if (kvs_outfile_commit(o, &err) != KVS_OK) {
        cli_error(cmd, "%s", err.msg);
        return -1;
    }
    return 0;
}

/* ---- inputs ---- */

/* Why a file of this type is not read as text, or NULL. Pipes and FIFOs are read (with the
 * bound enforced as the bytes arrive); devices would never end (/dev/zero) or block. */
static const char *input_type_problem(mode_t mode)
{
    if (S_ISREG(mode) || S_ISFIFO(mode))
        return NULL;
    if (S_ISDIR(mode))
        return "is a directory";
    if (S_ISCHR(mode))
        return "is a character device, not a file (give a file, a pipe, or - for standard "
               "input)";
    if (S_ISBLK(mode))
        return "is a block device, not a file";
    if (S_ISSOCK(mode))
        return "is a socket, not a file";
    return "is not a regular file";
}

/* size: "N bytes" for a file whose size is known, NULL for a stream cut off at the bound. */
static void too_big(const char *cmd, const char *path, const char *size)
{
    char lim[32];
    cli_error(cmd, "%s: %s more than the %s bytes (64 MiB) a prompt or token file may hold",
              path, size ? size : "holds", kvs_format_number(lim, sizeof lim,
                                                             (double)CLI_TEXT_MAX));
}

/* Prints why a file of this type and size is not read, and returns -1; 0 if it may be read. */
static int refuse_input(const char *cmd, const char *path, const struct stat *st)
{
    const char *why = input_type_problem(st->st_mode);
    if (why) {
        cli_error(cmd, "%s: %s", path, why);
        return -1;
    }
    if (S_ISREG(st->st_mode) && (uint64_t)st->st_size > CLI_TEXT_MAX) {
        char size[48];
        snprintf(size, sizeof size, "%llu bytes is", (unsigned long long)st->st_size);
        too_big(cmd, path, size);
        return -1;
    }
    return 0;
}

/* Checks what path is before opening it (opening a device can have effects of its own), and
 * again on the open descriptor (the path may have changed in between). Returns the
 * descriptor, or -1 after printing the error. */
static int open_text(const char *cmd, const char *path)
{
    struct stat st;
    if (!strcmp(path, "-"))
        return STDIN_FILENO; /* whatever it is: a terminal, a pipe, a file */
    if (stat(path, &st) != 0) {
        cli_error(cmd, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (refuse_input(cmd, path, &st) != 0)
        return -1;
    int fd = open(path, O_RDONLY | O_NOCTTY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) != 0) {
        cli_error(cmd, "%s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (refuse_input(cmd, path, &st) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

char *cli_read_file(const char *cmd, const char *path, size_t *len)
{
    int fd = open_text(cmd, path);
    if (fd < 0)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    int eno = 0;
    while (buf) {
        if (n == cap) {
            if (cap > CLI_TEXT_MAX)
                break; /* read one byte past the bound: too big */
            size_t nc = 2 * cap > CLI_TEXT_MAX + 1 ? CLI_TEXT_MAX + 1 : 2 * cap;
            char *nb = realloc(buf, nc + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap = nc;
        }
        ssize_t got = read(fd, buf + n, cap - n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            eno = errno;
            break;
        }
        if (got == 0)
            break;
        n += (size_t)got;
    }
    if (fd != STDIN_FILENO)
        close(fd);
    if (!buf || eno) {
        cli_error(cmd, "%s: %s", path, buf ? strerror(eno) : "out of memory");
        free(buf);
        return NULL;
    }
    if (n > CLI_TEXT_MAX) {
        too_big(cmd, path, NULL);
        free(buf);
        return NULL;
    }
    /* A NUL would silently end the text here (C strings): refuse it, saying where it is. */
    const char *nul = memchr(buf, 0, n);
    if (nul) {
        size_t off = (size_t)(nul - buf);
        long line = 1;
        for (const char *p = buf; p < nul; p++)
            line += *p == '\n';
        cli_error(cmd, "%s:%ld: NUL byte at byte offset %zu: not a text file", path, line, off);
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    if (len)
        *len = n;
    return buf;
}

int cli_read_tokens(const char *cmd, const char *path, int32_t **ids, int *n)
{
    size_t len;
    char *text = cli_read_file(cmd, path, &len);
    if (!text)
        return -1;
    int cap = 256, count = 0, line = 0;
    int32_t *out = malloc(sizeof *out * cap);
    char *p = text;
    while (out && *p) {
        line++;
        char *eol = strchr(p, '\n');
        if (eol)
            *eol = 0;
        char *s = p, *e = eol ? eol : p + strlen(p);
        while (*s == ' ' || *s == '\t' || *s == '\r')
            s++;
        while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
            e--;
        if (e > s) {
            char keep = *e;
            *e = 0;
            int64_t v;
            int bad = kvs_parse_i64(s, 0, INT32_MAX, &v) != 0;
            *e = keep;
            if (bad) {
                cli_error(cmd, "%s:%d: expected a token id (a non-negative integer), got '%.40s'",
                          path, line, s);
                free(out);
                free(text);
                return -1;
            }
            if (count == cap) {
                int32_t *no = realloc(out, sizeof *out * (cap *= 2));
                if (!no) {
                    free(out);
                    out = NULL;
                    break;
                }
                out = no;
            }
            out[count++] = (int32_t)v;
        }
        if (!eol)
            break;
        p = eol + 1;
    }
    free(text);
    if (!out) {
        cli_error(cmd, "%s: out of memory", path);
        return -1;
    }
    if (count == 0) {
        cli_error(cmd, "%s: no token ids in file", path);
        free(out);
        return -1;
    }
    *ids = out;
    *n = count;
    return 0;
}

int cli_load_model(const char *cmd, const char *path, const char *tok, kvs_model **out)
{
    kvs_error err = {0};
    kvs_status st;
    *out = NULL;
    if (!kvs_llama2c_sniff(path)) {
        if (tok) {
            cli_error(cmd, "--tokenizer only applies to a llama2.c checkpoint; -m %s is not one "
                           "(a GGUF file carries its vocabulary)", path);
            return CLI_USAGE;
        }
        st = kvs_model_load(path, out, &err);
    } else if (!tok) {
        cli_error(cmd, "-m %s is a llama2.c checkpoint: give its tokenizer with --tokenizer "
                       "TOK.bin", path);
        return CLI_USAGE;
    } else {
        const char *dir = getenv("TMPDIR");
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s/kvslim-%s-%d.gguf", dir && *dir ? dir : "/tmp", cmd,
                 (int)getpid());
        kvs_outfile_spec o = cli_output(NULL, tmp, NULL, 0);
        st = kvs_llama2c_convert_to(path, tok, KVS_WTYPE(KVS_F32), &o, NULL, &err);
        if (st == KVS_OK) {
            cli_temp_track(NULL, tmp, 1);
            st = kvs_model_load(tmp, out, &err);
            unlink(tmp); /* the mapping stays valid */
            cli_temp_track(NULL, tmp, 0);
        }
    }
    if (st != KVS_OK) {
        cli_error(cmd, "%s", err.msg);
        return cli_status_exit(st);
    }
    return CLI_OK;
}
