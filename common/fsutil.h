/* fsutil.h — files written safely, read whole, hashed.
 *
 * Every artefact dfm writes goes through dfm_atomic_*: the bytes are written to "PATH.tmp.PID",
 * flushed (fsync), then renamed onto PATH, so a reader or a re-run never sees a half-written file
 * under its final name. A full disk or file-size limit is reported as DFM_ENOSPACE naming the path.
 */
#ifndef DFM_FSUTIL_H
#define DFM_FSUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
    FILE *fp;
    char *path;     /* final name */
    char *tmp_path; /* name while writing */
    uint64_t bytes; /* written so far */
    int enospc;     /* fault injection: DFM_FAULT_ENOSPC names part of this path (common/fault.h) */
} dfm_atomic_file;

/* Open TMP for writing. Returns DFM_EIO naming the path when the folder is missing or read-only. */
int dfm_atomic_open(dfm_atomic_file *f, const char *path);
/* Write n bytes; DFM_ENOSPACE / DFM_EIO name the file. */
int dfm_atomic_write(dfm_atomic_file *f, const void *buf, size_t n);
/* Flush, fsync, close and rename onto the final name. On failure the temporary is removed. */
int dfm_atomic_commit(dfm_atomic_file *f);
/* Close and remove the temporary (after an error). Safe on a zeroed or committed struct. */
void dfm_atomic_abort(dfm_atomic_file *f);

/* Write a whole buffer to PATH atomically. */
int dfm_write_file_atomic(const char *path, const void *buf, size_t n);

/* Open PATH read-only for a reader of untrusted input: only a regular file is accepted. The check is made
 * on the open descriptor, opened without blocking: a FIFO, socket, device or folder is DFM_EARG ("... is not
 * a regular file (a FIFO)") instead of a reader that waits forever for a writer. A missing file is
 * DFM_ENOTFOUND, other failures DFM_EIO; messages name the path and end with hint (NULL: none). Every
 * reader below opens its files through this; the descriptor is blocking and close-on-exec. */
int dfm_open_regular(const char *path, const char *hint, int *fd);

/* Read a whole file into a malloc'd buffer (NUL-terminated, *len excludes the NUL). */
int dfm_read_file(const char *path, char **out, size_t *len);

/* Map a whole file read-only (MAP_PRIVATE). *map is NULL for an empty file. A missing file is
 * DFM_ENOTFOUND, other failures DFM_EIO; both name the path and end with hint (NULL: none), e.g.
 * "HINT: run 'dfm encode RUN' first". Release with dfm_unmap_file. */
int dfm_map_file(const char *path, const char *hint, const uint8_t **map, size_t *bytes);
/* Unmap what dfm_map_file returned; NULL is a no-op. */
void dfm_unmap_file(const void *map, size_t bytes);

/* Make room for n more open files in this process: when the files open now plus n (and a margin of 16)
 * exceed the soft RLIMIT_NOFILE, raise it (up to the hard limit). DFM_ERANGE when even the hard limit is
 * too low, saying how many files what (e.g. "a reader of the 64 target shards of RUN") needs, how many
 * are open, the limits, and hint (the ways to need fewer) with "ulimit -n N" as the fix. */
int dfm_fd_reserve(size_t n, const char *what, const char *hint);

/* mkdir -p. */
int dfm_mkdir_p(const char *path);

/* 1 if the path exists (any type), else 0. */
int dfm_path_exists(const char *path);

/* Size of a file in bytes. */
int dfm_file_size(const char *path, uint64_t *size);

/* XXH3-128 of a file's bytes as 32 lowercase hex digits (out must hold 33 bytes). Streams. */
int dfm_file_hash(const char *path, char out[33]);
/* The same of n bytes in memory (a file already read whole). */
void dfm_buf_hash(const void *buf, size_t n, char out[33]);

/* XXH3-64 of a buffer (the checksum used inside every dfm binary format). */
uint64_t dfm_checksum64(const void *buf, size_t n);

/* Join a folder and a name into a malloc'd path ("a/b" + "c" -> "a/b/c"). NULL on no memory. */
char *dfm_path_join(const char *dir, const char *name);

/* printf into a malloc'd string. NULL on no memory. */
char *dfm_strdupf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
