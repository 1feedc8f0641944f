/* fuzz_target_record.c — libFuzzer harness: one target record (schemas/target_record.h) through
 * dfm_trec_check_header and dfm_trec_decode. The input's header checksum is resealed (so mutations of
 * the zstd payload and of the fields reach the decoder) and the codec is made with the k, d, dtype and
 * store the header claims, as a reader of a shard with those parameters would. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/fsutil.h"
#include "schemas/target_record.h"
#include "tests/fuzz/fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < DFM_TREC_HEADER_BYTES) {
        dfm_trec_header h;
        if (dfm_trec_check_header(data, size, &h) == 0) abort(); /* too short to be a record */
        return 0;
    }
    uint8_t *b = malloc(size);
    if (!b) return 0;
    memcpy(b, data, size);
    uint64_t hc = XXH3_64bits_withSeed(b + DFM_TREC_HEADER_BYTES, size - DFM_TREC_HEADER_BYTES,
                                       dfm_checksum64(b, DFM_TREC_HEADER_BYTES - 8));
    memcpy(b + DFM_TREC_HEADER_BYTES - 8, &hc, 8);
    dfm_trec_header h;
    if (dfm_trec_check_header(b, size, &h) || h.k > 64 || h.d > 4096) goto out;
    dfm_trec_params p = {.k = h.k, .d = h.d, .dtype = h.dtype, .ids_only = !!(h.flags & DFM_TREC_F_IDS_ONLY), .slots = h.slots};
    dfm_trec_codec *c;
    if (dfm_trec_codec_create(&p, &c)) goto out;
    int64_t ids[64];
    float scores[64], *emb = malloc((size_t)h.k * h.d * sizeof *emb);
    dfm_trec rec = {.ids = ids, .scores = scores, .emb = emb};
    const uint8_t *payload;
    size_t pb;
    if (emb && dfm_trec_decode(c, b, size, &rec, &payload, &pb) == 0) {
        for (uint32_t i = 0; i < h.k; i++) /* a decoded record keeps the mask/ids promise */
            if (((rec.mask >> i) & 1) != (ids[i] >= 0)) abort();
    }
    free(emb);
    dfm_trec_codec_free(c);
out:
    free(b);
    return 0;
}
