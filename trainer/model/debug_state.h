/* debug_state.h — a reference dump for the PyTorch parity test (tests/py/train/test_train_torch_parity.py).
 *
 * Builds a tiny random model (seeded), runs one training forward + backward and writes a safetensors
 * file with: every parameter (Hugging Face / "dfm." names), every trainable gradient ("grad." + name),
 * the inputs ("in.tokens", "in.targets" I32 [B,T], "in.tgt_mem" [B*NC*K, d], "in.tgt_mask" U8),
 * results ("out.loss", "out.ce", "out.mse" [1]) and activations ("act.x_layer_in" [NL+1, B*T, C],
 * "act.slots", "act.mem", "act.lnf_out", "act.row_losses"). Metadata "backbone_config" (config.json
 * text) and "dfm_config" describe the model.
 */
#ifndef DFM_TRAINER_DEBUG_STATE_H
#define DFM_TRAINER_DEBUG_STATE_H

#include <stdint.h>

/* variant: "dfm-head" (per-head gate, Qwen3 QK-norm, tied), "dfm-channel" (per-channel gate, Llama,
 * untied), "pretrain" (backbone trainable). */
int debug_state_write(const char *path, const char *variant, uint64_t seed);

#endif
