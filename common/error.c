#include "common/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define DFM_ERRMSG_MAX 2048

static _Thread_local char tls_msg[DFM_ERRMSG_MAX];
static _Thread_local int tls_code;

const char *dfm_strerror(int code) {
    switch (code) {
    case DFM_OK: return "success";
    case DFM_EIO: return "I/O error";
    case DFM_ENOMEM: return "out of memory";
    case DFM_EFORMAT: return "malformed input";
    case DFM_EVERSION: return "unsupported format version";
    case DFM_ECHECKSUM: return "checksum mismatch";
    case DFM_EARG: return "invalid argument";
    case DFM_EMISMATCH: return "mismatched inputs or configuration";
    case DFM_EUNSUPPORTED: return "unsupported";
    case DFM_EMPI: return "MPI error";
    case DFM_EFAISS: return "FAISS error";
    case DFM_ELMDB: return "LMDB error";
    case DFM_ECUDA: return "CUDA error";
    case DFM_ENOSPACE: return "no space left";
    case DFM_ESTATE: return "wrong stage state";
    case DFM_ENOTFOUND: return "not found";
    case DFM_ETRUNCATED: return "truncated file";
    case DFM_ERANGE: return "value out of range";
    case DFM_EINTERNAL: return "internal error";
    case DFM_ESTOPPED: return "stopped on request";
    default: return "unknown error code";
    }
}

const char *dfm_last_error(void) { return tls_msg; }
int dfm_last_error_code(void) { return tls_code; }

void dfm_error_clear(void) {
    tls_msg[0] = 0;
    tls_code = DFM_OK;
}

int dfm_fail_at(const char *src_file, int src_line, int code, const char *fmt, ...) {
    const char *base = strrchr(src_file, '/');
    base = base ? base + 1 : src_file;
    int n = snprintf(tls_msg, sizeof tls_msg, "%s: ", dfm_strerror(code));
    if (n < 0 || n >= (int)sizeof tls_msg) n = 0;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(tls_msg + n, sizeof tls_msg - (size_t)n, fmt, ap);
    va_end(ap);
    if (m > 0) n += m;
    if (n < (int)sizeof tls_msg)
        snprintf(tls_msg + n, sizeof tls_msg - (size_t)n, " [%s:%d]", base, src_line);
    tls_code = code;
    return code;
}

int dfm_error_prefix(const char *fmt, ...) {
    char pre[512], old[DFM_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    snprintf(old, sizeof old, "%s", tls_msg);
    snprintf(tls_msg, sizeof tls_msg, "%s: %s", pre, old);
    return tls_code;
}

int dfm_errno_code(int err) {
    return (err == ENOSPC || err == EFBIG || err == EDQUOT) ? DFM_ENOSPACE : DFM_EIO;
}
