/* model_cuda.h — the DFM model of trainer/model/model.h on an NVIDIA GPU.
 *
 * A DfmModelCuda pairs the CPU model (`host`: configuration, the parameter values that are initialised,
 * loaded and saved there, and the results of the last forward) with the same DfmModel struct whose every
 * pointer is device memory (`d`), carved by the CPU layout (model_carve_backbone / _dfm / _acts), so a
 * reader recognises every buffer. model_forward_cuda / model_backward_cuda are model_forward /
 * model_backward, step for step, on the kernels of ops_cuda.h and stack_cuda.h.
 *
 * Precision (ModelCudaOptions.bf16):
 *   0  fp32 everywhere, GEMMs in fp32 without TF32: the parity mode, equal to the CPU model up to
 *      summation order (tests/py/cuda/test_train_cuda_model_emu.py, tests/gpu/gpu_check_trainer.sh);
 *   1  GEMM operands rounded to bf16, fp32 accumulation, fp32 activations, fp32 master weights and
 *      AdamW state for whatever trains, plus a bf16 copy of those weights refreshed after each step
 *      (model_cuda_params_updated) so GEMMs do not round them again. In DFM mode the frozen backbone is held ONLY in bf16 on the
 *      device (its norm weights stay fp32): half the memory, no gradient, no optimizer state.
 * Attention (ModelCudaOptions.flash): the decoder's and predictor's self-attention either through
 * attention_cuda.h (flash: no [T, T] probabilities kept; fp32 SIMT) or attention_forward_cuda (the
 * probabilities kept, products as batched cuBLAS GEMMs: tensor cores with bf16), chosen by memory.
 *
 * Batches: model_cuda_stage copies a batch from host memory (pinned for a real overlap; see
 * trainer/data/prefetch.h) on a separate copy stream into one of two device staging slots, so the copy
 * overlaps the previous micro-batch's compute; model_forward_cuda with inputs == NULL consumes the oldest
 * staged batch. With inputs != NULL it stages and consumes at once (the CPU signature).
 *
 * Everything returns DFM_OK or a DFM_E* code with a message (DFM_ECUDA: the failing CUDA/cuBLAS call and
 * file:line); nothing exits. Not thread-safe: one host thread drives one DfmModelCuda.
 */
#ifndef DFM_TRAINER_MODEL_CUDA_H
#define DFM_TRAINER_MODEL_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "trainer/model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int device; /* CUDA device index */
    int bf16;   /* see above */
    int flash;  /* 1: flash attention where supported; 0: the materialising one (cuBLAS GEMMs); -1: auto,
                   the materialising one while its T x T matrices take under 30 % of the GPU's memory */
} ModelCudaOptions;

typedef struct DfmModelCuda DfmModelCuda;

/* Device memory in bytes, split by use (filled by model_cuda_create; printed before the first step). */
typedef struct {
    size_t params_fp32, params_bf16, grads, acts, staging;
    int flash_decoder, flash_predictor; /* whether flash attention is in use */
    char gpu_name[128];
    double gpu_mem_total;               /* bytes */
} ModelCudaMemory;

/* Allocate the device model for `host` (which stays owned by the caller and must outlive it) and upload
 * its parameters. DFM_ECUDA with a hint when no GPU / out of memory. */
int model_cuda_create(DfmModel *host, const ModelCudaOptions *o, DfmModelCuda **out);
void model_cuda_free(DfmModelCuda *mc);
const ModelCudaMemory *model_cuda_memory(const DfmModelCuda *mc);

/* host -> device: every parameter (after init, load or resume). */
int model_cuda_upload_params(DfmModelCuda *mc);
/* After the trainable parameters changed on the device (an optimizer step): refresh what is derived from
 * them (with bf16, their bf16 copy read by the GEMMs). model_cuda_upload_params does it itself. */
int model_cuda_params_updated(DfmModelCuda *mc);
/* device -> host: the trainable block (before saving a checkpoint or a model). */
int model_cuda_download_trainable(DfmModelCuda *mc);
/* device -> host: the trainable block's gradients into grads[grad_num] (parity tests, debugging). */
int model_cuda_download_grads(DfmModelCuda *mc, float *grads);

/* Validate a host batch (token ids in range) and start its copy to the device; the host arrays must stay
 * untouched until the model_forward_cuda that consumes it returns. At most two batches staged. */
int model_cuda_stage(DfmModelCuda *mc, const int *inputs, const int *targets, const float *tgt_mem,
                     const uint8_t *tgt_mask, int B, int T);

/* As model_forward (results in mc->host: ce, mse, cos, loss, n_valid). inputs == NULL: the oldest staged
 * batch (B and T must match it); inputs != NULL: this batch, refused (DFM_EARG) while one is staged.
 * Soft targets: a training forward takes the host model's (model_set_soft_targets; host arrays, copied to
 * the device, ids checked against the vocabulary: DFM_ERANGE) and sets kl, n_teacher and the loss as
 * model_forward does; mc->host->soft is reset after every forward, whatever its outcome. */
int model_forward_cuda(DfmModelCuda *mc, const int *inputs, const int *targets, const float *tgt_mem,
                       const uint8_t *tgt_mask, int B, int T, int mem_mode, int train, float grad_scale);
int model_backward_cuda(DfmModelCuda *mc);
int model_zero_grad_cuda(DfmModelCuda *mc);

/* The per-row CE of the last forward (B*T floats, 0 where the target is -1) into host out. */
int model_cuda_row_losses(DfmModelCuda *mc, float *out);
/* The per-row top-1 flags of the last forward (B*T floats: 1 where the target is the argmax) into host out. */
int model_cuda_row_top1(DfmModelCuda *mc, float *out);
/* The predicted slots of the last forward that ran the predictor (B*NC*K*d floats) into host out. */
int model_cuda_pred_slots(DfmModelCuda *mc, float *out);

/* The predictor loss's weight (DfmConfig.mse_weight) for the forwards and backwards to come, in the host
 * model and in the device model's copy of its configuration (the margin's passes: trainer/run/margin.h). */
void model_cuda_set_mse_weight(DfmModelCuda *mc, float w);

/* Device pointers to the trainable block (n = grad_num) and its gradients, and the model's context
 * (an OpsCudaContext *, for the optimizer kernels). */
float *model_cuda_trainable_params(DfmModelCuda *mc, size_t *n);
float *model_cuda_trainable_grads(DfmModelCuda *mc);
void *model_cuda_context(DfmModelCuda *mc);

#ifdef __cplusplus
}
#endif

#endif
