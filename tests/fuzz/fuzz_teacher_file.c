/* fuzz_teacher_file.c — libFuzzer harness: a teacher file (schemas/teacher_file.h) through dfm_teacher_open,
 * resealed (payload checksum at 72 over the bytes after the header, header checksum at 80 over the header with
 * that field zero) so that mutations reach the shape and row checks behind the checksums; a file that opens
 * must hold its last row inside the mapping, with ids below vocab and non-increasing log-probs. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "schemas/teacher_file.h"
#include "tests/fuzz/fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *b = malloc(size ? size : 1);
    if (!b) return 0;
    memcpy(b, data, size);
    if (size >= DFM_TEACHER_HEADER_BYTES) {
        uint64_t pc = XXH3_64bits(b + DFM_TEACHER_HEADER_BYTES, size - DFM_TEACHER_HEADER_BYTES), zero = 0, hc;
        memcpy(b + offsetof(dfm_teacher_header, payload_xxh64), &pc, 8);
        memcpy(b + offsetof(dfm_teacher_header, header_xxh64), &zero, 8);
        hc = XXH3_64bits(b, DFM_TEACHER_HEADER_BYTES);
        memcpy(b + offsetof(dfm_teacher_header, header_xxh64), &hc, 8);
    }
    const char *path = fuzz_file("t.bin", b, size);
    free(b);
    dfm_teacher_file *f;
    if (!path || dfm_teacher_open(path, &f)) return 0;
    uint64_t n = f->hdr.n_seq * f->hdr.seq_len;
    if (n) {
        if (f->rows + n * f->hdr.row_bytes > f->map + f->map_bytes) abort();
        uint32_t ids[DFM_TEACHER_MAX_TOP];
        float lp[DFM_TEACHER_MAX_TOP];
        dfm_teacher_row_tail t;
        dfm_teacher_row(f, n - 1, ids, lp, &t);
        if (t.flags & DFM_TEACHER_F_TEACHER)
            for (uint32_t i = 0; i < f->hdr.top; i++)
                if (ids[i] >= f->hdr.vocab || (i && lp[i] > lp[i - 1])) abort();
    }
    dfm_teacher_close(f);
    return 0;
}
