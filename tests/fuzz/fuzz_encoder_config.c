/* fuzz_encoder_config.c — libFuzzer harness: an encoder config.json through dfm_encoder_load on a model
 * folder holding only that file. The load must refuse (no weights, no vocabulary); what is fuzzed is
 * that every config is refused cleanly, before or at the missing weights, never by a crash. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "encoder/encoder.h"
#include "tests/fuzz/fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char d[1024];
    strcpy(d, fuzz_dir("bert_model"));
    if (!fuzz_file("bert_model/config.json", data, size)) return 0;
    dfm_encoder *enc;
    if (dfm_encoder_load(d, DFM_DEVICE_CPU, DFM_COMPUTE_F32, &enc) == 0) abort(); /* nothing to load */
    return 0;
}
