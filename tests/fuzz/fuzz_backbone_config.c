/* fuzz_backbone_config.c — libFuzzer harness: a backbone config.json (Hugging Face Llama/Qwen/GPT-2
 * style) through backbone_config_from_hf, and the same JSON as a dfm checkpoint config through
 * dfm_config_from_json. */
#include <jansson.h>
#include <stdint.h>

#include "trainer/model/model_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_error_t e;
    json_t *j = json_loadb((const char *)data, size, 0, &e);
    if (!j) return 0;
    BackboneConfig bc;
    backbone_config_from_hf(j, &bc);
    DfmConfig dc;
    dfm_config_from_json(j, &dc);
    json_decref(j);
    return 0;
}
