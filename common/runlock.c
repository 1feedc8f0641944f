/* runlock.c — one writer per run directory (see runlock.h). */
#include "common/runlock.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* the run directories whose lock this process holds (by device and inode: one directory, any spelling);
 * the descriptors stay open until exit, which is what holds the flock */
#define MAX_HELD 16
static struct { dev_t dev; ino_t ino; int fd; } held[MAX_HELD];
static int n_held;

static int find_held(const char *run_dir) {
    struct stat st;
    if (stat(run_dir, &st) != 0) return -1;
    for (int i = 0; i < n_held; i++)
        if (held[i].dev == st.st_dev && held[i].ino == st.st_ino) return i;
    return -1;
}

int dfm_runlock_held(const char *run_dir) { return find_held(run_dir) >= 0; }

int dfm_runlock_holder(const char *run_dir, char *buf, size_t n) {
    if (n) buf[0] = 0;
    char *path = dfm_path_join(run_dir, ".lock");
    int fd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    free(path);
    if (fd < 0 || n < 2) {
        if (fd >= 0) close(fd);
        return 0;
    }
    ssize_t got = pread(fd, buf, n - 1, 0);
    close(fd);
    buf[got > 0 ? got : 0] = 0;
    buf[strcspn(buf, "\n")] = 0;
    return buf[0] != 0;
}

/* a clean exit leaves an empty lock file: a holder line found later was left by a writer that died */
static void clear_holders(void) {
    for (int i = 0; i < n_held; i++)
        if (ftruncate(held[i].fd, 0) != 0) DFM_LOG_D("cannot clear the run lock's holder line");
}

/* "dfm build cfg.json" from /proc/self/cmdline (the program's own name when unreadable) */
static void own_command(char *out, size_t cap) {
    snprintf(out, cap, "dfm");
    FILE *f = fopen("/proc/self/cmdline", "rb");
    if (!f) return;
    size_t n = fread(out, 1, cap - 1, f);
    fclose(f);
    out[n] = 0;
    for (size_t i = 0; n > 0 && i < n - 1; i++)
        if (out[i] == 0 || out[i] == '\n') out[i] = ' ';
}

/* the holder line written by the process that holds (or held) the lock, without its newline */
static void read_holder(int fd, char *out, size_t cap) {
    ssize_t n = pread(fd, out, cap - 1, 0);
    out[n > 0 ? n : 0] = 0;
    out[strcspn(out, "\n")] = 0;
    if (!out[0]) snprintf(out, cap, "a process that wrote no holder line (not dfm, or it is just starting)");
}

static int write_holder(int fd, const char *path) {
    char host[256] = "?", cmd[512], since[32] = "?", line[1024];
    gethostname(host, sizeof host - 1);
    own_command(cmd, sizeof cmd);
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm)) strftime(since, sizeof since, "%Y-%m-%dT%H:%M:%SZ", &tm);
    /* on a cluster, the job to wait for or cancel (a job's ranks can run on any of its nodes) */
    char job[160] = "";
    if (getenv("SLURM_JOB_ID"))
        snprintf(job, sizeof job, " (Slurm job %.40s, node %.80s)", getenv("SLURM_JOB_ID"),
                 getenv("SLURMD_NODENAME") ? getenv("SLURMD_NODENAME") : host);
    int n = snprintf(line, sizeof line, "host %s pid %ld command %s since %s%s\n", host, (long)getpid(), cmd, since, job);
    if (n < 0 || (size_t)n >= sizeof line) n = (int)sizeof line - 1, line[n - 1] = '\n';
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)n, 0) != n)
        return DFM_FAIL(DFM_EIO, "cannot write the holder line of %s: %s", path, strerror(errno));
    return DFM_OK;
}

int dfm_runlock_take(const char *run_dir) {
    const char *off = getenv("DFM_NO_RUN_LOCK");
    if (off && !strcmp(off, "1")) return DFM_OK;
    DFM_TRY(dfm_mkdir_p(run_dir));
    if (find_held(run_dir) >= 0) return DFM_OK;
    if (n_held == MAX_HELD) return DFM_FAIL(DFM_EINTERNAL, "more than %d run directories locked by one process", MAX_HELD);
    char *path = dfm_path_join(run_dir, ".lock");
    if (!path) return DFM_FAIL(DFM_ENOMEM, "no memory");
    int rc = DFM_OK, fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = DFM_FAIL(DFM_EIO, "cannot open the run lock %s: %s. HINT: the run directory must be writable", path, strerror(errno));
    } else if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        if (e == EWOULDBLOCK) {
            char holder[1024];
            read_holder(fd, holder, sizeof holder);
            rc = DFM_FAIL(DFM_ESTATE, "run %s is being written by another process: %s (lock %s). HINT: one writer per run "
                          "directory; wait for it to finish, or stop it, or use another run directory",
                          run_dir, holder, path);
        } else {
            rc = DFM_FAIL(DFM_EIO, "cannot lock %s: %s. HINT: the file system does not support flock (Lustre: mount with -o flock; "
                          "NFS: use NFSv4); or set DFM_NO_RUN_LOCK=1 and make sure yourself that one process writes the run",
                          path, strerror(e));
        }
    } else {
        char old[1024] = "";
        ssize_t n = pread(fd, old, sizeof old - 1, 0);
        if (n > 0) { /* a holder line with no flock behind it: its writer died */
            old[n] = 0;
            old[strcspn(old, "\n")] = 0;
            DFM_LOG_I("run lock %s: taking over from a writer that died (%s)", path, old);
        }
        rc = write_holder(fd, path);
        struct stat st;
        if (!rc && fstat(fd, &st) == 0 && stat(run_dir, &st) == 0) { /* the directory's identity */
            held[n_held].dev = st.st_dev, held[n_held].ino = st.st_ino, held[n_held].fd = fd;
            if (n_held++ == 0) atexit(clear_holders);
            fd = -1;
        } else if (!rc) {
            rc = DFM_FAIL(DFM_EIO, "cannot stat %s: %s", run_dir, strerror(errno));
        }
    }
    if (fd >= 0) close(fd);
    free(path);
    return rc;
}
