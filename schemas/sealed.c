/* sealed.c — opening a sealed file (see sealed.h). */
#include "schemas/sealed.h"

#include <string.h>

#include "common/error.h"
#include "common/fsutil.h"

int dfm_sealed_map(const char *path, const dfm_sealed_spec *s, void *hdr, const uint8_t **map, size_t *bytes) {
    *map = NULL;
    *bytes = 0;
    const uint8_t *m = NULL;
    size_t n = 0;
    DFM_TRY(dfm_map_file(path, s->hint, &m, &n));
    int rc = DFM_OK;
    if (n < s->header_bytes) {
        rc = DFM_FAIL(DFM_ETRUNCATED, "%s: %zu bytes, shorter than the %zu-byte header", path, n, s->header_bytes);
    } else {
        memcpy(hdr, m, s->header_bytes);
        rc = s->check(path, hdr, n);
    }
    if (!rc) { /* the check has bounded the payload by the file's length */
        uint64_t pb, ck;
        memcpy(&pb, (const uint8_t *)hdr + s->payload_bytes_at, 8);
        memcpy(&ck, (const uint8_t *)hdr + s->payload_xxh64_at, 8);
        if (dfm_checksum64(m + s->header_bytes, pb) != ck)
            rc = DFM_FAIL(DFM_ECHECKSUM, "%s: payload checksum mismatch (%s)", path, s->damaged);
    }
    if (rc) {
        dfm_unmap_file(m, n);
        return rc;
    }
    *map = m;
    *bytes = n;
    return DFM_OK;
}
