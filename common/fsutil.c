#include "common/fsutil.h"

#include "common/error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

char *dfm_strdupf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0) s = NULL;
    va_end(ap);
    return s;
}

char *dfm_path_join(const char *dir, const char *name) {
    size_t n = strlen(dir);
    return dfm_strdupf("%s%s%s", dir, (n && dir[n - 1] == '/') ? "" : "/", name);
}

int dfm_atomic_open(dfm_atomic_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    f->tmp_path = dfm_strdupf("%s.tmp.%ld", path, (long)getpid());
    if (!f->path || !f->tmp_path) {
        dfm_atomic_abort(f);
        return DFM_FAIL(DFM_ENOMEM, "no memory for path %s", path);
    }
    const char *full = getenv("DFM_FAULT_ENOSPC"); /* tests: a disk that is full for this file (common/fault.h) */
    f->enospc = full && *full && strstr(path, full);
    f->fp = fopen(f->tmp_path, "wb");
    if (!f->fp) {
        int e = errno;
        int rc = DFM_FAIL(dfm_errno_code(e), "cannot create %s: %s. HINT: check that the folder exists and is writable",
                          f->tmp_path, strerror(e));
        dfm_atomic_abort(f);
        return rc;
    }
    return DFM_OK;
}

int dfm_atomic_write(dfm_atomic_file *f, const void *buf, size_t n) {
    if (f->enospc) errno = ENOSPC;
    if (n && (f->enospc || fwrite(buf, 1, n, f->fp) != n)) {
        int e = errno ? errno : EIO;
        return DFM_FAIL(dfm_errno_code(e), "writing %s (at byte %llu): %s%s", f->tmp_path,
                        (unsigned long long)f->bytes, strerror(e),
                        dfm_errno_code(e) == DFM_ENOSPACE ? ". HINT: free space or raise the file-size limit, then re-run; finished work is kept" : "");
    }
    f->bytes += n;
    return DFM_OK;
}

int dfm_atomic_commit(dfm_atomic_file *f) {
    int rc = DFM_OK;
    errno = 0;
    if (fflush(f->fp) != 0 || fsync(fileno(f->fp)) != 0) {
        int e = errno ? errno : EIO;
        rc = DFM_FAIL(dfm_errno_code(e), "flushing %s: %s", f->tmp_path, strerror(e));
    }
    if (fclose(f->fp) != 0 && !rc) {
        int e = errno ? errno : EIO;
        rc = DFM_FAIL(dfm_errno_code(e), "closing %s: %s", f->tmp_path, strerror(e));
    }
    f->fp = NULL;
    if (!rc && rename(f->tmp_path, f->path) != 0) {
        int e = errno;
        rc = DFM_FAIL(DFM_EIO, "renaming %s to %s: %s", f->tmp_path, f->path, strerror(e));
    }
    if (rc) unlink(f->tmp_path);
    free(f->path);
    free(f->tmp_path);
    memset(f, 0, sizeof *f);
    return rc;
}

void dfm_atomic_abort(dfm_atomic_file *f) {
    if (f->fp) fclose(f->fp);
    if (f->tmp_path) unlink(f->tmp_path);
    free(f->path);
    free(f->tmp_path);
    memset(f, 0, sizeof *f);
}

int dfm_write_file_atomic(const char *path, const void *buf, size_t n) {
    dfm_atomic_file f;
    DFM_TRY(dfm_atomic_open(&f, path));
    int rc = dfm_atomic_write(&f, buf, n);
    if (rc) {
        dfm_atomic_abort(&f);
        return rc;
    }
    return dfm_atomic_commit(&f);
}

static const char *file_kind(mode_t m) {
    return S_ISFIFO(m) ? "a FIFO" : S_ISDIR(m) ? "a folder" : S_ISSOCK(m) ? "a socket" : S_ISCHR(m) ? "a character device"
           : S_ISBLK(m) ? "a block device" : "not a file";
}

int dfm_open_regular(const char *path, const char *hint, int *fd) {
    *fd = -1;
    const char *sep = hint ? ". " : "";
    hint = hint ? hint : "";
    /* O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer before the check can run */
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (f < 0) {
        int e = errno;
        return DFM_FAIL(e == ENOENT ? DFM_ENOTFOUND : DFM_EIO, "cannot open %s: %s%s%s", path, strerror(e), sep, hint);
    }
    struct stat st;
    if (fstat(f, &st) != 0) {
        int e = errno;
        close(f);
        return DFM_FAIL(DFM_EIO, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(f);
        return DFM_FAIL(DFM_EARG, "%s is not a regular file (%s)%s%s", path, file_kind(st.st_mode), sep, hint);
    }
    int fl = fcntl(f, F_GETFL);
    if (fl < 0 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(f);
        return DFM_FAIL(DFM_EIO, "cannot read %s: %s", path, strerror(e));
    }
    *fd = f;
    return DFM_OK;
}

/* dfm_open_regular as a stdio stream */
static int fopen_regular(const char *path, FILE **fp) {
    int fd;
    *fp = NULL;
    DFM_TRY(dfm_open_regular(path, NULL, &fd));
    if (!(*fp = fdopen(fd, "rb"))) {
        close(fd);
        return DFM_FAIL(DFM_ENOMEM, "no memory to read %s", path);
    }
    return DFM_OK;
}

int dfm_read_file(const char *path, char **out, size_t *len) {
    *out = NULL;
    if (len) *len = 0;
    FILE *fp;
    DFM_TRY(fopen_regular(path, &fp));
    struct stat st;
    if (fstat(fileno(fp), &st) != 0) {
        fclose(fp);
        return DFM_FAIL(DFM_EIO, "cannot stat %s: %s", path, strerror(errno));
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(fp);
        return DFM_FAIL(DFM_ENOMEM, "no memory to read %s (%zu bytes)", path, n);
    }
    size_t got = fread(buf, 1, n, fp);
    int err = ferror(fp);
    fclose(fp);
    if (got != n || err) {
        free(buf);
        return DFM_FAIL(DFM_EIO, "short read on %s (%zu of %zu bytes)", path, got, n);
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return DFM_OK;
}

int dfm_fd_reserve(size_t n, const char *what, const char *hint) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return DFM_OK;
    size_t open_now = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return DFM_OK; /* no /proc: let open(2) say it */
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') open_now++;
    closedir(d);
    rlim_t need = (rlim_t)(open_now + n + 16);
    if (need <= rl.rlim_cur) return DFM_OK;
    if (rl.rlim_max == RLIM_INFINITY || need <= rl.rlim_max) {
        rlim_t want = need * 2; /* room for the next readers too */
        if (rl.rlim_max != RLIM_INFINITY && want > rl.rlim_max) want = rl.rlim_max;
        struct rlimit nr = {want, rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &nr) == 0) return DFM_OK;
    }
    return DFM_FAIL(DFM_ERANGE, "%s needs %zu more open files; this process has %zu open and may have %llu (hard limit "
                    "%llu). HINT: raise the limit (ulimit -n %llu, or LimitNOFILE= / the cluster's setting), or %s",
                    what, n, open_now, (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max,
                    (unsigned long long)(need * 2), hint);
}

int dfm_mkdir_p(const char *path) {
    char *p = strdup(path);
    if (!p) return DFM_FAIL(DFM_ENOMEM, "no memory");
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            int e = errno;
            int rc = DFM_FAIL(DFM_EIO, "cannot create folder %s: %s", p, strerror(e));
            free(p);
            return rc;
        }
        *s = '/';
    }
    if (mkdir(p, 0755) != 0 && errno != EEXIST) {
        int e = errno;
        int rc = DFM_FAIL(DFM_EIO, "cannot create folder %s: %s", p, strerror(e));
        free(p);
        return rc;
    }
    free(p);
    return DFM_OK;
}

int dfm_path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int dfm_file_size(const char *path, uint64_t *size) {
    struct stat st;
    if (stat(path, &st) != 0)
        return DFM_FAIL(errno == ENOENT ? DFM_ENOTFOUND : DFM_EIO, "cannot stat %s: %s", path, strerror(errno));
    *size = (uint64_t)st.st_size;
    return DFM_OK;
}

static void hash_hex(XXH128_hash_t h, char out[33]) {
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);
}

void dfm_buf_hash(const void *buf, size_t n, char out[33]) { hash_hex(XXH3_128bits(buf, n), out); }

int dfm_file_hash(const char *path, char out[33]) {
    FILE *fp;
    DFM_TRY(fopen_regular(path, &fp));
    XXH3_state_t *st = XXH3_createState();
    if (!st) {
        fclose(fp);
        return DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    XXH3_128bits_reset(st);
    static _Thread_local char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, fp)) > 0) XXH3_128bits_update(st, buf, n);
    int err = ferror(fp);
    fclose(fp);
    XXH128_hash_t h = XXH3_128bits_digest(st);
    XXH3_freeState(st);
    if (err) return DFM_FAIL(DFM_EIO, "read error on %s", path);
    hash_hex(h, out);
    return DFM_OK;
}

uint64_t dfm_checksum64(const void *buf, size_t n) { return XXH3_64bits(buf, n); }

int dfm_map_file(const char *path, const char *hint, const uint8_t **map, size_t *bytes) {
    *map = NULL;
    *bytes = 0;
    int fd;
    DFM_TRY(dfm_open_regular(path, hint, &fd));
    struct stat st;
    int rc = DFM_OK;
    if (fstat(fd, &st) != 0) {
        rc = DFM_FAIL(DFM_EIO, "cannot stat %s: %s", path, strerror(errno));
    } else if (st.st_size > 0) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            rc = DFM_FAIL(DFM_EIO, "cannot map %s: %s", path, strerror(errno));
        } else {
            *map = m;
            *bytes = (size_t)st.st_size;
        }
    }
    close(fd);
    return rc;
}

void dfm_unmap_file(const void *map, size_t bytes) {
    if (map && bytes) munmap((void *)map, bytes);
}
