/* flops.h — model FLOPs of one training step, for throughput and MFU (model-FLOPs utilisation).
 *
 * Matmuls only (2 FLOPs per multiply-add), per token of a B x T batch, as llm.c / PaLM count:
 *   - a weight matrix of P entries costs 2P per token forward; a backward adds 2P for the input
 *     gradient and 2P for the weight gradient when the weight trains (6P in all, the "6N" rule), 4P
 *     when it is frozen but gradients must pass through it (DFM: frozen decoder layers above the
 *     lowest fusion block), 2P when nothing below needs gradients (frozen layers below it);
 *   - causal self-attention: 2 * T * n_heads * head_dim per token forward (QK^T and AV over T/2 keys
 *     on average), x3 when the layer runs backward;
 *   - the LM head (V x C) like a matrix, its input gradient always needed when training;
 *   - DFM modules: the predictor runs once per chunk (1/L per token), the projector on K slots per chunk,
 *     fusion q/o/gate per token, k/v per slot, cross-attention 4*K*C per token; all trainable (x3).
 * tests/ref/train_flops.py implements the same count for the benchmark's PyTorch side.
 */
#ifndef DFM_TRAINER_FLOPS_H
#define DFM_TRAINER_FLOPS_H

#include "trainer/model/model.h"

/* FLOPs per token of one training step (forward + backward) at sequence length T. */
double model_train_flops_per_token(const DfmModel *m, int T);

#endif
