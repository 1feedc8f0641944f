/* engine.h — where a training step runs: the CPU reference (model.h) or an NVIDIA GPU (model_cuda.h).
 *
 * The training loop (cmd_train.c) is written once against these verbs; each forwards to the CPU model
 * or to its CUDA twin. The engine owns the AdamW moments (host arrays on the CPU, device arrays on a
 * GPU) and, for checkpoints, brings parameters and moments to the host (engine_sync_host) or takes them
 * from there (engine_load_state). Data parallelism: engine_allreduce_grads sums the trainable gradients
 * over the MPI ranks and divides by their count, with NCCL on GPUs where dfm was built with it (a fixed
 * algorithm for a fixed rank count: reproducible), else through host memory and MPI_Allreduce.
 * Every function returns DFM_OK or a DFM_E* code with a message; nothing exits.
 */
#ifndef DFM_TRAINER_ENGINE_H
#define DFM_TRAINER_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "common/mpiutil.h"
#include "trainer/kernels/adamw.h"
#include "trainer/model/model.h"
#include "trainer/data/prefetch.h"

typedef struct {
    int cuda;   /* 0: CPU, 1: GPU */
    int gpu;    /* device index; -1: the node-local rank modulo the visible devices */
    int bf16;   /* GPU precision (model_cuda.h); the CPU is always fp32 */
    int flash;  /* GPU: 1 flash attention, 0 the materialising one, -1 auto (model_cuda.h) */
} EngineOptions;

typedef struct Engine Engine;

/* For model m (which the engine does not own); mp: the ranks (for the GPU choice and NCCL). A GPU
 * engine uploads m's parameters; DFM_ECUDA when dfm was built without CUDA or no GPU is usable. */
int engine_create(DfmModel *m, const EngineOptions *o, const dfm_mpi *mp, Engine **out);
void engine_free(Engine *e);
/* A line describing the device and its memory use (params, grads, activations), for the log. */
const char *engine_describe(const Engine *e);
/* Host buffers for batches: pinned on a GPU engine (asynchronous copies), malloc on the CPU. */
PrefetchAllocator engine_host_allocator(Engine *e);

/* Start copying a batch to the device (GPU; a no-op on the CPU, which reads it in place). The arrays
 * must stay valid until the engine_forward that consumes it returns. */
int engine_stage(Engine *e, const int *inputs, const int *targets, const float *tmem, const uint8_t *tmask, int B,
                 int T);
/* model_forward on the engine's device (results in m: ce, mse, cos, loss). inputs NULL: the staged batch. */
int engine_forward(Engine *e, const int *inputs, const int *targets, const float *tmem, const uint8_t *tmask, int B,
                   int T, int mem_mode, int train, float grad_scale);
/* The per-row CE of the last forward (B*T floats; 0 where the target is -1) into host out. */
int engine_row_losses(Engine *e, float *out);
/* The per-row top-1 flags of the last forward (B*T floats; 1 where the target is the argmax, 0 elsewhere and
 * where the target is -1) into host out. */
int engine_row_top1(Engine *e, float *out);
/* The predicted slots of the last forward that ran the predictor (B*NC*K*d floats) into host out. */
int engine_pred_slots(Engine *e, float *out);
int engine_backward(Engine *e);
/* The predictor loss's weight (DfmConfig.mse_weight) for the forwards and backwards to come, on the
 * engine's device (the margin's passes set it per pass: trainer/run/margin.h). */
void engine_set_mse_weight(Engine *e, float w);
int engine_zero_grad(Engine *e);

/* Sum the trainable gradients over the ranks of mp and divide by their count (collective). */
int engine_allreduce_grads(Engine *e, const dfm_mpi *mp);
int engine_grad_norm(Engine *e, double *norm);
int engine_grad_scale(Engine *e, float s);
/* One AdamW step (t 1-based) with weight decay on the matrices of the trainable block. */
int engine_adamw(Engine *e, const AdamWConfig *c, long t);

/* Host copies of the trainable parameters (m's own block) and moments, current after this call. */
int engine_sync_host(Engine *e, float **params, float **m1, float **m2);
/* Host arrays to fill (with ckpt_load) before engine_load_state pushes them to the device. */
void engine_host_state(Engine *e, float **params, float **m1, float **m2);
int engine_load_state(Engine *e);

#endif
