/* Output files (core/outfile): what each kind of destination becomes, through the GGUF writer
 * (the library's big writer) and through the module's own API. Issue 7, defects 2, 6, 7, 8. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "core/outfile.h"
#include "gguf/gguf.h"

static char dir[512];

static const char *at(char *buf, size_t size, const char *name)
{
    snprintf(buf, size, "%s/%s", dir, name);
    return buf;
}

static kvs_status write_gguf(const char *path, kvs_error *err)
{
    kvs_gguf_writer *w = kvs_gguf_writer_new();
    kvs_gguf_set_u32(w, "a", 7);
    kvs_status st = kvs_gguf_write(w, path, err);
    kvs_gguf_writer_free(w);
    return st;
}

static int mode_of(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (int)(st.st_mode & 0777) : -1;
}

/* Whether any "NAME.tmp.*" is left in dir. */
static int tmp_left(void)
{
    char cmd[700];
    snprintf(cmd, sizeof cmd, "ls '%s' | grep -q '\\.tmp\\.'", dir);
    return system(cmd) == 0;
}

static int starts_with_gguf(const char *path)
{
    char magic[4] = {0};
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(magic, 1, 4, f) : 0;
    if (f)
        fclose(f);
    return n == 4 && memcmp(magic, "GGUF", 4) == 0;
}

static void test_mode_from_umask(void)
{
    char p[700];
    kvs_error err = {0};
    mode_t old = umask(022);
    unlink(at(p, sizeof p, "m022.gguf"));
    CHECKF(write_gguf(p, &err) == KVS_OK, "%s", err.msg);
    CHECKF(mode_of(p) == 0644, "umask 022: mode %o", mode_of(p));
    umask(077);
    unlink(at(p, sizeof p, "m077.gguf"));
    CHECKF(write_gguf(p, &err) == KVS_OK, "%s", err.msg);
    CHECKF(mode_of(p) == 0600, "umask 077: mode %o", mode_of(p));
    umask(old);
}

static void test_symlink(void)
{
    char link[700], target[700];
    kvs_error err = {0};
    at(target, sizeof target, "sym-target.gguf");
    at(link, sizeof link, "sym-link.gguf");
    FILE *f = fopen(target, "w");
    fputs("old", f);
    fclose(f);
    unlink(link);
    CHECK(symlink("sym-target.gguf", link) == 0);
    CHECKF(write_gguf(link, &err) == KVS_OK, "%s", err.msg);
    struct stat st;
    CHECK(lstat(link, &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(starts_with_gguf(target));
    /* A dangling link: its target is created, the link stays. */
    unlink(target);
    CHECKF(write_gguf(link, &err) == KVS_OK, "%s", err.msg);
    CHECK(lstat(link, &st) == 0 && S_ISLNK(st.st_mode) && starts_with_gguf(target));
}

/* A FIFO gets the bytes (a child reads them) and stays a FIFO. Returns whether it worked. */
static int test_fifo(void)
{
    char p[700];
    kvs_error err = {0};
    at(p, sizeof p, "out.fifo");
    unlink(p);
    CHECK(mkfifo(p, 0600) == 0);
    pid_t child = fork();
    if (child == 0) {
        alarm(20);
        int fd = open(p, O_RDONLY);
        char magic[4];
        ssize_t n = fd >= 0 ? read(fd, magic, 4) : -1;
        _exit(n == 4 && memcmp(magic, "GGUF", 4) == 0 ? 0 : 1);
    }
    kvs_status st = write_gguf(p, &err);
    struct stat sb;
    int still_fifo = lstat(p, &sb) == 0 && S_ISFIFO(sb.st_mode);
    if (!still_fifo)
        kill(child, SIGKILL); /* the FIFO it waits on is gone */
    int status = 0;
    waitpid(child, &status, 0);
    int got = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    CHECKF(st == KVS_OK, "%s", err.msg);
    CHECKF(still_fifo, "the FIFO was replaced");
    CHECKF(got, "the reader did not get the GGUF magic");
    return st == KVS_OK && still_fifo && got;
}

/* Only after the FIFO case works: the unfixed writer (run as root) replaced /dev/null. */
static void test_dev_null(void)
{
    struct stat before, after;
    kvs_error err = {0};
    CHECK(stat("/dev/null", &before) == 0 && S_ISCHR(before.st_mode));
    CHECKF(write_gguf("/dev/null", &err) == KVS_OK, "%s", err.msg);
    CHECK(stat("/dev/null", &after) == 0 && S_ISCHR(after.st_mode) &&
          after.st_ino == before.st_ino && after.st_rdev == before.st_rdev);
}

static void test_directory(void)
{
    char p[700];
    kvs_error err = {0};
    at(p, sizeof p, "a-dir");
    mkdir(p, 0755);
    CHECKF(write_gguf(p, &err) == KVS_ERR_IO && strstr(err.msg, "is a directory"), "%s",
           err.msg);
    struct stat st;
    CHECK(stat(p, &st) == 0 && S_ISDIR(st.st_mode));
    CHECK(!tmp_left());
}

/* ---- the module's API ---- */

static void test_kinds(void)
{
    char p[700];
    kvs_error err = {0};
    kvs_outfile_kind kind;
    kvs_outfile_spec s = {.path = at(p, sizeof p, "kind-new")};
    unlink(p);
    CHECK(kvs_outfile_check(&s, &kind, &err) == KVS_OK && kind == KVS_OUTFILE_NEW);
    CHECK(access(p, F_OK) != 0); /* checking creates nothing */
    FILE *f = fopen(p, "w");
    fclose(f);
    CHECK(kvs_outfile_check(&s, &kind, &err) == KVS_OK && kind == KVS_OUTFILE_REPLACE);
    s.path = "/dev/null";
    CHECK(kvs_outfile_check(&s, &kind, &err) == KVS_OK && kind == KVS_OUTFILE_THROUGH);
    s.path = "/dev/stdout";
    CHECK(kvs_outfile_check(&s, &kind, &err) == KVS_OK && kind == KVS_OUTFILE_THROUGH);
    s.path = "-";
    s.dash_is_stdout = 1;
    CHECK(kvs_outfile_check(&s, &kind, &err) == KVS_OK && kind == KVS_OUTFILE_THROUGH);
    s.dash_is_stdout = 0;
    CHECK(kvs_outfile_check(&s, &kind, &err) == KVS_OK && kind != KVS_OUTFILE_THROUGH);
}

static void test_refusals(void)
{
    char p[700], q[700];
    kvs_error err = {0};
    kvs_outfile_spec s = {.flag = "--json"};
    s.path = at(p, sizeof p, "no/such/x.json");
    CHECKF(kvs_outfile_check(&s, NULL, &err) == KVS_ERR_IO && strstr(err.msg, "--json ") &&
           strstr(err.msg, p) && strstr(err.msg, "does not exist"), "%s", err.msg);
    at(q, sizeof q, "plain-file");
    FILE *f = fopen(q, "w");
    fclose(f);
    char under_file[800];
    snprintf(under_file, sizeof under_file, "%s/x.json", q);
    s.path = under_file;
    CHECKF(kvs_outfile_check(&s, NULL, &err) == KVS_ERR_IO && strstr(err.msg, "not a directory"),
           "%s", err.msg);
    s.path = at(p, sizeof p, "not-yet/");
    CHECKF(kvs_outfile_check(&s, NULL, &err) == KVS_ERR_IO && strstr(err.msg, "names a directory"),
           "%s", err.msg);
    s.path = "";
    CHECK(kvs_outfile_check(&s, NULL, &err) == KVS_ERR_IO && strstr(err.msg, "empty path"));
    /* a loop of symlinks */
    at(p, sizeof p, "loop-a");
    at(q, sizeof q, "loop-b");
    unlink(p);
    unlink(q);
    CHECK(symlink("loop-b", p) == 0 && symlink("loop-a", q) == 0);
    s.path = p;
    CHECKF(kvs_outfile_check(&s, NULL, &err) == KVS_ERR_IO && strstr(err.msg, "symbolic links"),
           "%s", err.msg);
}

static void test_inputs(void)
{
    char in[700], hard[700], sym[700];
    kvs_error err = {0};
    at(in, sizeof in, "input.bin");
    at(hard, sizeof hard, "input-hardlink.bin");
    at(sym, sizeof sym, "input-symlink.bin");
    FILE *f = fopen(in, "w");
    fputs("precious", f);
    fclose(f);
    unlink(hard);
    unlink(sym);
    CHECK(link(in, hard) == 0 && symlink("input.bin", sym) == 0);
    kvs_outfile_input inputs[] = {{"-m", NULL}, {"--tokens", in}};
    const char *dsts[] = {in, hard, sym};
    for (int i = 0; i < 3; i++) {
        kvs_outfile_spec s = {.path = dsts[i], .flag = "--out", .inputs = inputs, .n_inputs = 2};
        CHECKF(kvs_outfile_check(&s, NULL, &err) == KVS_ERR_IO &&
               strstr(err.msg, "same file as --tokens") && strstr(err.msg, in), "%s", err.msg);
        CHECK(kvs_outfile_write(&s, "x", 1, &err) == KVS_ERR_IO);
    }
    char buf[16] = {0};
    f = fopen(in, "r");
    CHECK(fread(buf, 1, sizeof buf - 1, f) == 8 && strcmp(buf, "precious") == 0);
    fclose(f);
}

typedef struct temp_log {
    char path[800];
    int created, removed, absent_when_told;
} temp_log;

static void on_temp(void *ctx, const char *tmp, int exists)
{
    temp_log *t = ctx;
    if (exists) {
        t->created++;
        snprintf(t->path, sizeof t->path, "%s", tmp);
        t->absent_when_told = access(tmp, F_OK) != 0;
    } else if (strcmp(tmp, t->path) == 0) {
        t->removed++;
    }
}

static void test_temp_callback(void)
{
    char p[700];
    kvs_error err = {0};
    temp_log log = {0};
    kvs_outfile_spec s = {.path = at(p, sizeof p, "cb.out"), .on_temp = on_temp,
                          .on_temp_ctx = &log, .sync = 1};
    unlink(p);
    kvs_outfile *o;
    CHECK(kvs_outfile_open(&s, &o, &err) == KVS_OK);
    /* told before the file exists, so a signal handler can never miss a created file */
    CHECK(log.created == 1 && log.absent_when_told && strstr(log.path, "cb.out.tmp."));
    CHECK(access(log.path, F_OK) == 0);
    fputs("hello", kvs_outfile_stream(o));
    CHECK(access(p, F_OK) != 0); /* nothing under the real name before the commit */
    CHECKF(kvs_outfile_commit(o, &err) == KVS_OK, "%s", err.msg);
    CHECK(log.removed == 1 && access(log.path, F_OK) != 0 && access(p, F_OK) == 0);

    /* abort: the temporary file goes, the destination keeps its old content */
    memset(&log, 0, sizeof log);
    CHECK(kvs_outfile_open(&s, &o, &err) == KVS_OK);
    fputs("partial", kvs_outfile_stream(o));
    kvs_outfile_abort(o);
    CHECK(log.created == 1 && log.removed == 1 && access(log.path, F_OK) != 0);
    char buf[16] = {0};
    FILE *f = fopen(p, "r");
    CHECK(fread(buf, 1, sizeof buf - 1, f) == 5 && strcmp(buf, "hello") == 0);
    fclose(f);
    kvs_outfile_abort(NULL);

    /* a GGUF write reports its temporary file too */
    memset(&log, 0, sizeof log);
    kvs_gguf_writer *w = kvs_gguf_writer_new();
    kvs_gguf_set_u32(w, "a", 1);
    kvs_outfile_spec g = {.path = at(p, sizeof p, "cb.gguf"), .on_temp = on_temp,
                          .on_temp_ctx = &log};
    CHECKF(kvs_gguf_write_to(w, &g, &err) == KVS_OK, "%s", err.msg);
    CHECK(log.created == 1 && log.removed == 1 && starts_with_gguf(p));
    kvs_gguf_writer_free(w);
}

static void test_replace_keeps_mode(void)
{
    char p[700];
    kvs_error err = {0};
    at(p, sizeof p, "keep-mode.out");
    FILE *f = fopen(p, "w");
    fclose(f);
    chmod(p, 0640);
    mode_t old = umask(022);
    kvs_outfile_spec s = {.path = p};
    CHECKF(kvs_outfile_write(&s, "new", 3, &err) == KVS_OK, "%s", err.msg);
    CHECKF(mode_of(p) == 0640, "mode %o", mode_of(p));
    umask(old);
}

int main(void)
{
    check_tmp_path(dir, sizeof dir, "");
    snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "outfile_%d", (int)getpid());
    if (mkdir(dir, 0755) != 0) {
        fprintf(stderr, "cannot create %s: %s\n", dir, strerror(errno));
        return 1;
    }
    test_mode_from_umask();
    test_symlink();
    if (test_fifo())
        test_dev_null();
    test_directory();
    test_kinds();
    test_refusals();
    test_inputs();
    test_temp_callback();
    test_replace_keeps_mode();
    CHECK(!tmp_left());
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("outfile");
}
