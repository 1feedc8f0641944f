/* sealed.h — opening a sealed file: a fixed header that states the payload's length and XXH3-64 checksum,
 * then the payload (schemas/hidden_states.h, schemas/teacher_file.h). One home for the steps every such reader
 * takes: map the file (a FIFO or other non-regular file refused), the header copied out and checked by the
 * format's own rule (magic, version, sizes against the file's length), the payload's checksum. */
#ifndef DFM_SCHEMAS_SEALED_H
#define DFM_SCHEMAS_SEALED_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *hint;           /* how to write the file, for a missing one ("HINT: write it with ...") */
    const char *damaged;        /* what a checksum mismatch means ("the rows are damaged") */
    size_t header_bytes;        /* the header's length: *hdr receives that many bytes */
    size_t payload_bytes_at;    /* offsets in the header of the u64 payload length and the u64 XXH3-64 */
    size_t payload_xxh64_at;
    /* the format's header rule: DFM_OK or the error (with its message) for PATH; file_bytes is the file's length */
    int (*check)(const char *path, const void *hdr, uint64_t file_bytes);
} dfm_sealed_spec;

/* Map PATH and check it as s describes: *hdr (s->header_bytes) holds its header, *map / *bytes the mapping
 * (release with dfm_unmap_file), the payload at *map + s->header_bytes. DFM_ETRUNCATED for a file shorter than
 * the header, the check's error, DFM_ECHECKSUM for a damaged payload; nothing stays mapped on error. */
int dfm_sealed_map(const char *path, const dfm_sealed_spec *s, void *hdr, const uint8_t **map, size_t *bytes);

#endif
