/* error.h — dfm's error convention (in the manner of LMDB and the FAISS C API).
 *
 * Every library function returns an int: DFM_OK (0) on success, a negative DFM_E* code on failure.
 * The failing function also records a message saying what went wrong, where (file, line of input,
 * rank) and, when there is one, how to fix it ("HINT: ..."). The message is per thread and stays
 * until the next error on that thread. Only main() prints it and exits.
 *
 *   int rc = dfm_chunk_shard_open(path, &shard);
 *   if (rc) { fprintf(stderr, "%s\n", dfm_last_error()); return rc; }
 *
 * Library code sets errors with DFM_FAIL(code, fmt, ...), which prefixes the source location, and
 * adds context on the way up with dfm_error_prefix("while reading %s", path).
 */
#ifndef DFM_ERROR_H
#define DFM_ERROR_H

#include <stddef.h>

enum {
    DFM_OK = 0,
    DFM_EIO = -1,          /* a read, write, open, rename or stat failed (errno text included) */
    DFM_ENOMEM = -2,       /* an allocation failed */
    DFM_EFORMAT = -3,      /* malformed input: bad JSON, wrong magic, impossible sizes, bad token id */
    DFM_EVERSION = -4,     /* a file written by an unknown (newer) format version */
    DFM_ECHECKSUM = -5,    /* stored checksum does not match the data */
    DFM_EARG = -6,         /* bad flag, option or config value */
    DFM_EMISMATCH = -7,    /* artefacts or configuration that do not belong together */
    DFM_EUNSUPPORTED = -8, /* a model, tokenizer or feature dfm does not implement */
    DFM_EMPI = -9,         /* an MPI call failed, or another rank failed */
    DFM_EFAISS = -10,      /* a FAISS call failed */
    DFM_ELMDB = -11,       /* an LMDB call failed */
    DFM_ECUDA = -12,       /* a CUDA, cuBLAS or cuBLASLt call failed, or no GPU */
    DFM_ENOSPACE = -13,    /* the disk or a file-size limit is full */
    DFM_ESTATE = -14,      /* a stage was run out of order or an earlier stage is incomplete */
    DFM_ENOTFOUND = -15,   /* a file, key, token or record that must exist does not */
    DFM_ETRUNCATED = -16,  /* a file ends before its header says it should */
    DFM_ERANGE = -17,      /* a value outside its allowed range (ids, sizes, counts) */
    DFM_EINTERNAL = -18,   /* a broken invariant: a bug in dfm; please report it */
    DFM_ESTOPPED = -19,    /* stopped on request (SIGTERM, SIGUSR1) after keeping finished work (common/stop.h) */
};

/* Short fixed description of a code ("I/O error", ...). Never NULL; unknown codes say so. */
const char *dfm_strerror(int code);

/* The detailed message of the last error set on this thread ("" if none). */
const char *dfm_last_error(void);

/* The code of the last error set on this thread (DFM_OK if none). */
int dfm_last_error_code(void);

/* Record an error: code plus a printf-style message; returns code so callers can `return dfm_fail(...)`.
 * Prefer the DFM_FAIL macro, which adds the source location. */
int dfm_fail_at(const char *src_file, int src_line, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define DFM_FAIL(code, ...) dfm_fail_at(__FILE__, __LINE__, (code), __VA_ARGS__)

/* Prepend context to the current message: "while encoding shard 3: <old message>". Returns the
 * current code, so `return dfm_error_prefix("...")` propagates it. */
int dfm_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Forget the current error (tests, and code that handles an error and goes on). */
void dfm_error_clear(void);

/* Propagate a non-zero rc unchanged. */
#define DFM_TRY(expr)            \
    do {                         \
        int dfm_try_rc_ = (expr); \
        if (dfm_try_rc_) return dfm_try_rc_; \
    } while (0)

/* Map an errno value from a failed write to DFM_ENOSPACE or DFM_EIO. */
int dfm_errno_code(int err);

#endif
