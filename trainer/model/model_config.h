/* model_config.h — model configurations to and from JSON.
 *
 * The backbone's config is a Hugging Face config.json (Qwen3ForCausalLM, LlamaForCausalLM,
 * MistralForCausalLM without sliding window); other architectures are rejected by name with
 * DFM_EUNSUPPORTED, as are features dfm does not implement (attention biases, rope_scaling, a sliding
 * window shorter than the sequence). The DFM modules' config is dfm's own JSON object (the same keys
 * as DfmConfig's fields), stored in checkpoints and exported module folders.
 */
#ifndef DFM_TRAINER_MODEL_CONFIG_H
#define DFM_TRAINER_MODEL_CONFIG_H

#include <jansson.h>

#include "trainer/model/model.h"

/* Bounds a real decoder stays far inside, for config.json and GGUF metadata alike (the weights they imply
 * are checked against the files later): vocabulary, width, FFN width, layers, heads, head size. */
#define DFM_MAX_VOCAB (1 << 24)
#define DFM_MAX_HIDDEN (1 << 20)
#define DFM_MAX_FFN (1 << 22)
#define DFM_MAX_LAYERS 4096
#define DFM_MAX_HEADS 4096
#define DFM_MAX_HEAD_DIM (1 << 16)

/* Fill bc from a parsed config.json. max_seq is left at its current value when > 0, else taken
 * from max_position_embeddings (capped at 4096). Errors name the key. */
int backbone_config_from_hf(json_t *cfg, BackboneConfig *bc);
/* A new config.json object for bc. */
json_t *backbone_config_to_hf(const BackboneConfig *bc);

json_t *dfm_config_to_json(const DfmConfig *dc);
int dfm_config_from_json(json_t *j, DfmConfig *dc);

/* Parse --fusion-memory: "predicted", "target", "mixed:P" (each chunk fuses its target with probability P)
 * or "mixed:P:decay" (P decays linearly to 0 at the last step) into dc->fusion_memory / tf_prob / tf_decay. */
int dfm_parse_fusion_memory(const char *s, DfmConfig *dc);
/* Parse "9,16,24,31" into dc->fusion_layers / n_fusion. */
int dfm_parse_fusion_layers(const char *s, DfmConfig *dc);

#endif
