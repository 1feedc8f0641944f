/* hf_model.h — Hugging Face model folders (config.json + safetensors) for the backbone, and
 * safetensors export/import of the trained DFM modules.
 *
 * A backbone folder holds config.json and either model.safetensors or model.safetensors.index.json
 * with its shards; tensors use Hugging Face names (model.layers.3.self_attn.q_proj.weight) and may be
 * F32, F16 or BF16 (converted to fp32). Every expected tensor must exist with its exact shape.
 */
#ifndef DFM_TRAINER_HF_MODEL_H
#define DFM_TRAINER_HF_MODEL_H

#include "trainer/model/model.h"

/* Read DIR/config.json into bc (max_seq kept when > 0). */
int hf_read_config(const char *dir, BackboneConfig *bc);
/* Load the backbone's weights of an allocated model from DIR. */
int hf_load_backbone(DfmModel *m, const char *dir);
/* Write DIR/config.json and DIR/model.safetensors (F32) from the model's backbone. Creates DIR. */
int hf_save_backbone(const DfmModel *m, const char *dir);

/* Write the DFM modules as PATH (safetensors, F32, "dfm.*" names) with the DFM config, the backbone's
 * config.json and its weights hash in the metadata ("dfm_config", "backbone_config", "backbone_hash"). */
int dfm_modules_save(const DfmModel *m, const char *path);
/* Load DFM modules written by dfm_modules_save into an allocated model (shapes must match; a file that
 * records another backbone's weights hash, XXH3-64 of its fp32 parameters, is DFM_EMISMATCH). */
int dfm_modules_load(DfmModel *m, const char *path);

#endif
