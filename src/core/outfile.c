/* Output files: see outfile.h for the rules. Everything the writers share lives here, so a
 * destination is looked at once, the same way, before any byte is written. */
#include "core/outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "core/number.h"

/* Symlink hops followed before giving up, as the kernel's own limit. */
enum { MAX_LINK_HOPS = 40, TEMP_ATTEMPTS = 100 };

struct kvs_outfile {
    const kvs_outfile_spec *spec;
    FILE *f;
    char *final; /* renamed onto; NULL when written through */
    char *tmp;   /* temporary file; NULL when written through */
};

/* How a destination will be written, as examined just now. */
typedef struct target {
    kvs_outfile_kind kind;
    char *final; /* NEW/REPLACE: the file to rename onto (after symlinks) */
    int fd;      /* THROUGH: a descriptor to duplicate (-1: open the path itself) */
    mode_t mode; /* REPLACE: permission bits of the file being replaced */
} target;

/* "--json out.json" or "out.json", for messages. */
static const char *label(const kvs_outfile_spec *s, char *buf, size_t size)
{
    if (s->flag && *s->flag)
        snprintf(buf, size, "%s %s", s->flag, s->path);
    else
        snprintf(buf, size, "%s", s->path);
    return buf;
}

static kvs_status refuse(const kvs_outfile_spec *s, kvs_error *err, const char *why)
{
    char name[320];
    return kvs_fail(err, KVS_ERR_IO, "%s: %s", label(s, name, sizeof name), why);
}

static char *dup_str(const char *s, size_t n)
{
    char *c = malloc(n + 1);
    if (c) {
        memcpy(c, s, n);
        c[n] = 0;
    }
    return c;
}

/* The descriptor a path stands for: "-" (if allowed), /dev/stdout, /dev/stderr, /dev/fd/N,
 * /proc/self/fd/N. Writing "to" these means writing to the open descriptor, as a shell does;
 * resolving them to a file and renaming onto it would bypass the descriptor. -1 if none. */
static int descriptor_of(const kvs_outfile_spec *s)
{
    const char *p = s->path, *num = NULL;
    if (s->dash_is_stdout && strcmp(p, "-") == 0)
        return STDOUT_FILENO;
    if (strcmp(p, "/dev/stdout") == 0)
        return STDOUT_FILENO;
    if (strcmp(p, "/dev/stderr") == 0)
        return STDERR_FILENO;
    if (strncmp(p, "/dev/fd/", 8) == 0)
        num = p + 8;
    else if (strncmp(p, "/proc/self/fd/", 14) == 0)
        num = p + 14;
    int64_t fd;
    if (num && kvs_parse_i64(num, 0, INT_MAX, &fd) == 0)
        return (int)fd;
    return -1;
}

/* The file a chain of symlinks ends at (which may not exist yet). NULL on out of memory or
 * a loop (errno ENOMEM / ELOOP). */
static char *follow_links(const char *path)
{
    char *cur = dup_str(path, strlen(path));
    for (int hops = 0; cur; hops++) {
        struct stat st;
        if (lstat(cur, &st) != 0 || !S_ISLNK(st.st_mode))
            return cur;
        if (hops == MAX_LINK_HOPS) {
            free(cur);
            errno = ELOOP;
            return NULL;
        }
        char link[PATH_MAX];
        ssize_t n = readlink(cur, link, sizeof link);
        if (n < 0 || (size_t)n >= sizeof link) {
            free(cur);
            errno = n < 0 ? errno : ENAMETOOLONG;
            return NULL;
        }
        /* A relative target is relative to the directory holding the link. */
        const char *slash = strrchr(cur, '/');
        size_t dir = link[0] == '/' || !slash ? 0 : (size_t)(slash - cur) + 1;
        char *next = malloc(dir + (size_t)n + 1);
        if (next) {
            memcpy(next, cur, dir);
            memcpy(next + dir, link, (size_t)n);
            next[dir + (size_t)n] = 0;
        } else {
            errno = ENOMEM;
        }
        free(cur);
        cur = next;
    }
    return NULL;
}

/* The directory a new file at path would be created in. */
static char *parent_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return dup_str(".", 1);
    if (slash == path)
        return dup_str("/", 1);
    return dup_str(path, (size_t)(slash - path));
}

static kvs_status check_parent(const kvs_outfile_spec *s, const char *final, kvs_error *err)
{
    char *dir = parent_of(final), why[PATH_MAX + 96];
    if (!dir)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    struct stat st;
    kvs_status rc = KVS_OK;
    if (stat(dir, &st) != 0) {
        if (errno == ENOENT)
            snprintf(why, sizeof why, "not writable: directory %s does not exist", dir);
        else
            snprintf(why, sizeof why, "not writable: directory %s: %s", dir, strerror(errno));
        rc = refuse(s, err, why);
    } else if (!S_ISDIR(st.st_mode)) {
        snprintf(why, sizeof why, "not writable: %s is not a directory", dir);
        rc = refuse(s, err, why);
    } else if (access(dir, W_OK | X_OK) != 0) {
        snprintf(why, sizeof why, "not writable: directory %s: %s", dir, strerror(errno));
        rc = refuse(s, err, why);
    }
    free(dir);
    return rc;
}

/* Refuses a destination that is one of the command's inputs (same device and inode). */
static kvs_status check_not_input(const kvs_outfile_spec *s, const struct stat *dst,
                                  kvs_error *err)
{
    for (int i = 0; i < s->n_inputs; i++) {
        const kvs_outfile_input *in = &s->inputs[i];
        struct stat st;
        if (!in->path || stat(in->path, &st) != 0)
            continue;
        if (st.st_dev == dst->st_dev && st.st_ino == dst->st_ino) {
            char why[PATH_MAX + 160];
            snprintf(why, sizeof why, "is the same file as %s%s%s, which this command reads; "
                     "refusing to overwrite it", in->flag ? in->flag : "", in->flag ? " " : "",
                     in->path);
            return refuse(s, err, why);
        }
    }
    return KVS_OK;
}

/* Why a file of this type cannot be written, or NULL if it can (regular, FIFO, char device). */
static const char *type_problem(mode_t mode)
{
    if (S_ISDIR(mode))
        return "is a directory";
    if (S_ISBLK(mode))
        return "is a block device; refusing to write to it";
    if (S_ISSOCK(mode))
        return "is a socket; cannot write to it";
    if (S_ISREG(mode) || S_ISFIFO(mode) || S_ISCHR(mode))
        return NULL;
    return "is not a file that can be written";
}

static kvs_status examine_descriptor(const kvs_outfile_spec *s, int fd, target *t,
                                     kvs_error *err)
{
    struct stat st;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fstat(fd, &st) != 0)
        return refuse(s, err, "not writable: the descriptor is not open");
    if ((fl & O_ACCMODE) == O_RDONLY)
        return refuse(s, err, "not writable: the descriptor is open for reading only");
    const char *why = type_problem(st.st_mode);
    kvs_status rc = why ? refuse(s, err, why) : check_not_input(s, &st, err);
    if (rc == KVS_OK) {
        t->kind = KVS_OUTFILE_THROUGH;
        t->fd = fd;
    }
    return rc;
}

static kvs_status examine(const kvs_outfile_spec *s, target *t, kvs_error *err)
{
    *t = (target){.fd = -1};
    if (!s || !s->path)
        return kvs_fail(err, KVS_ERR_ARG, "output file: NULL path");
    if (!*s->path)
        return refuse(s, err, "empty path");
    int fd = descriptor_of(s);
    if (fd >= 0)
        return examine_descriptor(s, fd, t, err);

    struct stat st;
    char why[PATH_MAX + 96];
    if (stat(s->path, &st) == 0) {
        const char *problem = type_problem(st.st_mode);
        if (problem)
            return refuse(s, err, problem);
        if (access(s->path, W_OK) != 0) {
            snprintf(why, sizeof why, "not writable: %s", strerror(errno));
            return refuse(s, err, why);
        }
        kvs_status rc = check_not_input(s, &st, err);
        if (rc != KVS_OK)
            return rc;
        if (!S_ISREG(st.st_mode)) {
            t->kind = KVS_OUTFILE_THROUGH;
            return KVS_OK;
        }
        t->kind = KVS_OUTFILE_REPLACE;
        t->mode = st.st_mode & 0777;
    } else if (errno == ENOENT || errno == ENOTDIR) {
        /* Absent, or a symlink to an absent file: created at the end of the chain (the parent
         * check below names a missing directory or a file in the way). */
        t->kind = KVS_OUTFILE_NEW;
    } else {
        snprintf(why, sizeof why, "not writable: %s", strerror(errno));
        return refuse(s, err, why);
    }
    if (s->path[strlen(s->path) - 1] == '/')
        return refuse(s, err, "names a directory (it ends in '/')");
    if (!(t->final = follow_links(s->path))) {
        snprintf(why, sizeof why, "not writable: %s", strerror(errno));
        return refuse(s, err, why);
    }
    kvs_status rc = check_parent(s, t->final, err);
    if (rc != KVS_OK) {
        free(t->final);
        t->final = NULL;
    }
    return rc;
}

kvs_status kvs_outfile_check(const kvs_outfile_spec *spec, kvs_outfile_kind *kind,
                             kvs_error *err)
{
    target t;
    kvs_status rc = examine(spec, &t, err);
    if (rc == KVS_OK && kind)
        *kind = t.kind;
    free(t.final);
    return rc;
}

static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void announce(const kvs_outfile_spec *s, const char *tmp, int exists)
{
    if (s->on_temp && tmp)
        s->on_temp(s->on_temp_ctx, tmp, exists);
}

/* Creates FINAL.tmp.XXXXXX beside final with mode 0666 (the kernel applies the umask: mkstemp
 * would force 0600). Returns the descriptor, or -1 with errno set. Each name is announced
 * before open() creates it, so a signal arriving at any moment finds a created file already
 * tracked; a name that turns out taken (EEXIST) is withdrawn at once. */
static int create_temp(const kvs_outfile_spec *s, const char *final, char **tmp_out)
{
    static const char digits[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    size_t n = strlen(final);
    char *tmp = malloc(n + sizeof ".tmp.XXXXXX");
    if (!tmp) {
        errno = ENOMEM;
        return -1;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t seed = mix((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
                        ((uint64_t)getpid() << 16) ^ (uint64_t)(uintptr_t)tmp);
    for (int attempt = 0; attempt < TEMP_ATTEMPTS; attempt++) {
        uint64_t r = mix(seed + 0x9E3779B97F4A7C15ull * (uint64_t)(attempt + 1));
        memcpy(tmp, final, n);
        memcpy(tmp + n, ".tmp.", 5);
        for (int i = 0; i < 6; i++, r /= 62)
            tmp[n + 5 + i] = digits[r % 62];
        tmp[n + 11] = 0;
        announce(s, tmp, 1);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0) {
            *tmp_out = tmp;
            return fd;
        }
        int e = errno;
        announce(s, tmp, 0);
        errno = e;
        if (errno != EEXIST)
            break;
    }
    int e = errno;
    free(tmp);
    errno = e;
    return -1;
}

/* Opens a FIFO or character device found at the path, making sure it still is one. */
static int open_through(const kvs_outfile_spec *s, kvs_error *err, kvs_status *rc)
{
    char why[PATH_MAX + 96];
    int fd = open(s->path, O_WRONLY | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, sizeof why, "cannot open: %s", strerror(errno));
        *rc = refuse(s, err, why);
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !(S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode))) {
        /* Replaced by something else since it was examined: do not write into it blindly. */
        close(fd);
        *rc = refuse(s, err, "changed while being opened; not written");
        return -1;
    }
    return fd;
}

kvs_status kvs_outfile_open(const kvs_outfile_spec *spec, kvs_outfile **out, kvs_error *err)
{
    *out = NULL;
    target t;
    kvs_status rc = examine(spec, &t, err);
    if (rc != KVS_OK)
        return rc;
    kvs_outfile *o = calloc(1, sizeof *o);
    if (!o) {
        free(t.final);
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    }
    o->spec = spec;
    char why[PATH_MAX + 96];
    int fd = -1;
    if (t.kind == KVS_OUTFILE_THROUGH) {
        if (t.fd >= 0) {
            /* What the program already printed there comes first. */
            if (t.fd == STDOUT_FILENO)
                fflush(stdout);
            else if (t.fd == STDERR_FILENO)
                fflush(stderr);
            fd = fcntl(t.fd, F_DUPFD_CLOEXEC, 0);
            if (fd < 0) {
                snprintf(why, sizeof why, "cannot write: %s", strerror(errno));
                rc = refuse(spec, err, why);
            }
        } else {
            fd = open_through(spec, err, &rc);
        }
    } else {
        o->final = t.final;
        t.final = NULL;
        fd = create_temp(spec, o->final, &o->tmp);
        if (fd < 0) {
            snprintf(why, sizeof why, "cannot create a temporary file beside %s: %s", o->final,
                     strerror(errno));
            rc = refuse(spec, err, why);
        } else {
            /* Replacing a file keeps who may read it, as writing into it would. */
            if (t.kind == KVS_OUTFILE_REPLACE && fchmod(fd, t.mode) != 0) {
                snprintf(why, sizeof why, "cannot set the mode of %s: %s", o->tmp,
                         strerror(errno));
                rc = refuse(spec, err, why);
            }
        }
    }
    if (rc == KVS_OK && !(o->f = fdopen(fd, "wb")))
        rc = kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    if (rc != KVS_OK) {
        if (fd >= 0 && !o->f)
            close(fd);
        kvs_outfile_abort(o);
        return rc;
    }
    *out = o;
    return KVS_OK;
}

FILE *kvs_outfile_stream(kvs_outfile *o) { return o ? o->f : NULL; }

static void free_outfile(kvs_outfile *o)
{
    if (o->tmp) {
        unlink(o->tmp);
        announce(o->spec, o->tmp, 0);
    }
    free(o->tmp);
    free(o->final);
    free(o);
}

void kvs_outfile_abort(kvs_outfile *o)
{
    if (!o)
        return;
    if (o->f)
        fclose(o->f);
    free_outfile(o);
}

static void sync_dir(const char *final)
{
    char *dir = parent_of(final);
    int fd = dir ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(dir);
}

kvs_status kvs_outfile_commit(kvs_outfile *o, kvs_error *err)
{
    if (!o)
        return kvs_fail(err, KVS_ERR_ARG, "output file: not open");
    const kvs_outfile_spec *s = o->spec;
    int eno = 0;
    if (fflush(o->f) != 0 || ferror(o->f))
        eno = errno ? errno : EIO;
    /* fsync of a FIFO or terminal fails with EINVAL: nothing to make durable there. */
    if (!eno && s->sync && fsync(fileno(o->f)) != 0 && errno != EINVAL)
        eno = errno;
    if (fclose(o->f) != 0 && !eno)
        eno = errno ? errno : EIO;
    o->f = NULL;
    char why[2 * PATH_MAX + 96];
    kvs_status rc = KVS_OK;
    if (eno) {
        snprintf(why, sizeof why, "write failed: %s", strerror(eno));
        rc = refuse(s, err, why);
    } else if (o->tmp && rename(o->tmp, o->final) != 0) {
        snprintf(why, sizeof why, "cannot rename %s onto %s: %s", o->tmp, o->final,
                 strerror(errno));
        rc = refuse(s, err, why);
    } else if (o->tmp) {
        if (s->sync)
            sync_dir(o->final);
        announce(s, o->tmp, 0);
        free(o->tmp);
        o->tmp = NULL;
    }
    free_outfile(o);
    return rc;
}

kvs_status kvs_outfile_write(const kvs_outfile_spec *spec, const void *data, size_t len,
                             kvs_error *err)
{
    kvs_outfile *o;
    kvs_status rc = kvs_outfile_open(spec, &o, err);
    if (rc != KVS_OK)
        return rc;
    if (len && fwrite(data, 1, len, o->f) != len) {
        char why[160];
        snprintf(why, sizeof why, "write failed: %s", strerror(errno ? errno : EIO));
        kvs_outfile_abort(o);
        return refuse(spec, err, why);
    }
    return kvs_outfile_commit(o, err);
}
