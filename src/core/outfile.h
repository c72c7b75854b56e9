/* Output files written on the user's behalf (results, logits, GGUF models): one module, so every
 * writer treats a destination the same way.
 *
 * - absent or a regular file: written to a temporary file beside it, then renamed into place
 *   (readers never see a half-written file). A new file gets mode 0666 & ~umask; a replaced
 *   file keeps its permission bits.
 * - a symlink: the same, beside and onto the file the link finally points to; the link stays.
 * - a FIFO or a character device (/dev/null, a terminal), "-" (when dash_is_stdout), and the
 *   names of open descriptors (/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N): written
 *   through, never replaced or renamed.
 * - refused, with a message naming the flag and path: a directory (or a path ending in '/'), a
 *   block device, a socket, a missing or unwritable parent directory, a read-only file, and
 *   the same file (device and inode, after symlinks) as one of the command's inputs.
 *
 * The library installs no signal handlers: a caller that wants temporary files removed on
 * SIGINT/SIGTERM passes on_temp, which is told each temporary path just before it is created
 * and again once it has been renamed or removed. */
#ifndef KVS_OUTFILE_H
#define KVS_OUTFILE_H

#include <stddef.h>
#include <stdio.h>

#include "kvslim.h"

/* A file the command reads, never to be overwritten: flag as the user wrote it ("-m",
 * "--tokens"; NULL if none) and its path (NULL entries are skipped). */
typedef struct kvs_outfile_input {
    const char *flag;
    const char *path;
} kvs_outfile_input;

/* exists = 1: tmp_path is about to be created (announced first, so a signal handler that removes
 * it never misses a created file); 0: it has been renamed into place, removed, or was never
 * created (the name was taken). */
typedef void (*kvs_outfile_temp_fn)(void *ctx, const char *tmp_path, int exists);

typedef struct kvs_outfile_spec {
    const char *path;                /* destination as the user gave it */
    const char *flag;                /* how messages name it ("--json"); NULL: the path alone */
    const kvs_outfile_input *inputs; /* files the command reads */
    int n_inputs;
    int dash_is_stdout; /* "-" means standard output */
    int sync;           /* fsync the data (and the directory) before reporting success */
    kvs_outfile_temp_fn on_temp;
    void *on_temp_ctx;
} kvs_outfile_spec;

typedef enum kvs_outfile_kind {
    KVS_OUTFILE_NEW,     /* created: temporary file, then rename */
    KVS_OUTFILE_REPLACE, /* an existing regular file (possibly behind symlinks), replaced whole */
    KVS_OUTFILE_THROUGH, /* FIFO, character device or open descriptor: written through */
} kvs_outfile_kind;

/* Whether spec->path can be written, without creating anything: run it before the work. kind
 * (may be NULL) says how it would be written. KVS_ERR_IO, with the problem in err. */
kvs_status kvs_outfile_check(const kvs_outfile_spec *spec, kvs_outfile_kind *kind,
                             kvs_error *err);

typedef struct kvs_outfile kvs_outfile;

/* Checks again, then opens the destination (a temporary file, or the destination itself when
 * written through). The spec, and the strings it points to, must outlive the kvs_outfile. */
kvs_status kvs_outfile_open(const kvs_outfile_spec *spec, kvs_outfile **out, kvs_error *err);
/* The stream to write to. Write errors are collected and reported by kvs_outfile_commit. */
FILE *kvs_outfile_stream(kvs_outfile *o);
/* Flushes, closes and renames into place; on any failure removes the temporary file. Always
 * frees o. */
kvs_status kvs_outfile_commit(kvs_outfile *o, kvs_error *err);
/* Closes and removes the temporary file (bytes already written through stay written). Frees o;
 * NULL is accepted. */
void kvs_outfile_abort(kvs_outfile *o);

/* open + one write + commit. */
kvs_status kvs_outfile_write(const kvs_outfile_spec *spec, const void *data, size_t len,
                             kvs_error *err);

#endif
