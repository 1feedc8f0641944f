/* engine.c — the CPU and GPU back ends of a training step (see engine.h). */
#include "trainer/run/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/blas_core.h"
#include "common/error.h"

#ifdef DFM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "common/cuda_check.h"
#include "trainer/model/model_cuda.h"
#include "trainer/kernels/ops_cuda.h"
#ifdef DFM_HAVE_NCCL
#include <nccl.h>
#endif
#endif

struct Engine {
    DfmModel *m;
    EngineOptions o;
    size_t np;
    float *m1, *m2;          /* AdamW moments: host (CPU) */
    unsigned char *decay;    /* host mask */
    char desc[512];
    struct { /* CPU: batches staged by engine_stage, read in place by engine_forward(NULL) */
        const int *inputs, *targets;
        const float *tmem;
        const uint8_t *tmask;
        int B, T;
    } staged[2];
    int st_head, st_count;
#ifdef DFM_HAVE_CUDA
    DfmModelCuda *mc;
    float *d_m1, *d_m2;      /* device moments */
    unsigned char *d_decay;
    float *h_grads;          /* pinned, for the MPI all-reduce without NCCL */
#ifdef DFM_HAVE_NCCL
    ncclComm_t nccl;
    int have_nccl;
#endif
#endif
};

/* 1 where weight decay applies: the 2-D tensors (matrices) of the trainable block */
static unsigned char *decay_mask(DfmModel *m) {
    size_t n;
    float *base = model_trainable_params(m, &n);
    unsigned char *mask = calloc(n ? n : 1, 1);
    int nv = m->dc.enabled ? model_dfm_tensors(m, NULL, 0) : model_backbone_tensors(m, NULL, 0);
    TensorView *v = calloc((size_t)nv, sizeof *v);
    if (!mask || !v) {
        free(mask);
        free(v);
        return NULL;
    }
    if (m->dc.enabled) model_dfm_tensors(m, v, 0);
    else model_backbone_tensors(m, v, 0);
    for (int i = 0; i < nv; i++)
        if (v[i].ndim == 2 && v[i].data) memset(mask + (v[i].data - base), 1, v[i].numel);
    free(v);
    return mask;
}

#ifdef DFM_HAVE_CUDA
static cudaStream_t stream_of(Engine *e) { return ((OpsCudaContext *)model_cuda_context(e->mc))->stream; }

/* device AdamW moments (zero) and the decay mask, ordered on the model's (non-blocking) stream */
static int alloc_moments(Engine *e) {
    size_t n = e->np;
    cudaStream_t st = stream_of(e);
    CUDA_CHECK(cudaMalloc((void **)&e->d_m1, (n ? n : 1) * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&e->d_m2, (n ? n : 1) * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&e->d_decay, n ? n : 1));
    CUDA_CHECK(cudaMemsetAsync(e->d_m1, 0, n * sizeof(float), st));
    CUDA_CHECK(cudaMemsetAsync(e->d_m2, 0, n * sizeof(float), st));
    CUDA_CHECK(cudaMemcpyAsync(e->d_decay, e->decay, n, cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    return DFM_OK;
}

/* rc: the host side's result so far. No return before the ranks agree on the device set-up: the others
 * would wait in the NCCL set-up below. */
static int create_cuda(Engine *e, const dfm_mpi *mp, int rc) {
    int lr = e->o.gpu < 0 ? dfm_mpi_local_rank(mp) : 0; /* collective: every rank, before anything can fail */
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (!rc && (ce != cudaSuccess || ndev < 1))
        rc = DFM_FAIL(DFM_ECUDA, "--device cuda: no usable GPU (%s). HINT: check nvidia-smi and "
                      "CUDA_VISIBLE_DEVICES, or train with --device cpu",
                      ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
    size_t n = e->np;
    if (!rc) {
        int gpu = dfm_gpu_for_rank(lr, ndev, e->o.gpu);
        ModelCudaOptions mo = {gpu, e->o.bf16, e->o.flash};
        rc = model_cuda_create(e->m, &mo, &e->mc);
        if (!rc) rc = alloc_moments(e);
    }
    if (mp->size > 1) DFM_TRY(dfm_mpi_agree(mp, rc));
    DFM_TRY(rc);
    int gpu = 0;
    cudaGetDevice(&gpu);
    const char *coll = "";
    if (mp->size > 1) {
#ifdef DFM_HAVE_NCCL
        struct {
            int ok;
            ncclUniqueId id;
        } msg;
        memset(&msg, 0, sizeof msg);
        if (mp->rank == 0) msg.ok = ncclGetUniqueId(&msg.id) == ncclSuccess;
        DFM_TRY(DFM_MPI_CHECK(MPI_Bcast(&msg, sizeof msg, MPI_BYTE, 0, mp->comm)));
        if (!msg.ok) return DFM_FAIL(DFM_ECUDA, "ncclGetUniqueId failed on rank 0. HINT: NCCL_DEBUG=INFO tells why");
        ncclResult_t nr = ncclCommInitRank(&e->nccl, mp->size, msg.id, mp->rank);
        rc = nr == ncclSuccess ? DFM_OK
                               : DFM_FAIL(DFM_ECUDA, "ncclCommInitRank (rank %d of %d) failed: %s. HINT: NCCL_DEBUG=INFO "
                                          "tells why", mp->rank, mp->size, ncclGetErrorString(nr));
        e->have_nccl = nr == ncclSuccess;
        DFM_TRY(dfm_mpi_agree(mp, rc));
        coll = ", gradients all-reduced with NCCL";
#else
        CUDA_CHECK(cudaMallocHost((void **)&e->h_grads, n * sizeof(float)));
        coll = ", gradients all-reduced with MPI through host memory (built without NCCL)";
#endif
    }
    const ModelCudaMemory *mm = model_cuda_memory(e->mc);
    double MiB = 1048576.0;
    snprintf(e->desc, sizeof e->desc,
             "GPU %d (%s, %.0f GiB): %s; device memory: parameters %.1f MiB fp32 + %.1f MiB bf16, gradients %.1f "
             "MiB, AdamW %.1f MiB, activations %.1f MiB, staging %.1f MiB; attention %s%s",
             gpu, mm->gpu_name, mm->gpu_mem_total / (1024.0 * MiB),
             e->o.bf16 ? (e->m->dc.enabled ? "bf16 GEMMs, frozen backbone held in bf16" : "bf16 GEMMs, fp32 master weights")
                       : "fp32 (parity mode)",
             mm->params_fp32 / MiB, mm->params_bf16 / MiB, mm->grads / MiB, 2.0 * n * sizeof(float) / MiB,
             mm->acts / MiB, mm->staging / MiB, mm->flash_decoder ? "flash (fp32, no T x T matrix)" : "materialised T x T, cuBLAS GEMMs", coll);
    return DFM_OK;
}

static void *pinned_alloc(size_t n, void *u) {
    (void)u;
    void *p = NULL;
    return cudaMallocHost(&p, n ? n : 1) == cudaSuccess ? p : NULL;
}
static void pinned_free(void *p, void *u) {
    (void)u;
    if (p) cudaFreeHost(p);
}
#endif

int engine_create(DfmModel *m, const EngineOptions *o, const dfm_mpi *mp, Engine **out) {
    *out = NULL;
#ifndef DFM_HAVE_CUDA
    (void)mp;
    if (o->cuda)
        return DFM_FAIL(DFM_ECUDA, "--device cuda: this dfm-train was built without CUDA. HINT: make CUDA=1 "
                        "BUILD=build-cuda and run build-cuda/dfm-train");
#endif
    Engine *e = calloc(1, sizeof *e);
    if (!e) {
        int rc = DFM_FAIL(DFM_ENOMEM, "engine");
#ifdef DFM_HAVE_CUDA
        if (o->cuda && mp->size > 1) { /* the others agree after their device set-up: take part */
            dfm_mpi_local_rank(mp);
            dfm_mpi_agree(mp, rc);
        }
#endif
        return rc;
    }
    e->m = m;
    e->o = *o;
    model_trainable_params(m, &e->np);
    e->m1 = calloc(e->np ? e->np : 1, sizeof(float));
    e->m2 = calloc(e->np ? e->np : 1, sizeof(float));
    e->decay = decay_mask(m);
    int rc = (!e->m1 || !e->m2 || !e->decay) ? DFM_FAIL(DFM_ENOMEM, "optimizer state for %zu parameters", e->np)
                                             : DFM_OK;
    snprintf(e->desc, sizeof e->desc,
             "CPU, fp32 (the reference), OpenBLAS %s kernels; memory: parameters %.1f MiB, gradients %.1f MiB, "
             "AdamW %.1f MiB, activations %.1f MiB", dfm_blas_core_name(), (m->bb_num + m->dfm_num) * 4.0 / 1048576.0,
             m->grad_num * 4.0 / 1048576.0, e->np * 8.0 / 1048576.0, m->act_num * 4.0 / 1048576.0);
#ifdef DFM_HAVE_CUDA
    if (o->cuda) rc = create_cuda(e, mp, rc);
#endif
    if (rc) {
        engine_free(e);
        return rc;
    }
    *out = e;
    return DFM_OK;
}

void engine_free(Engine *e) {
    if (!e) return;
#ifdef DFM_HAVE_CUDA
#ifdef DFM_HAVE_NCCL
    if (e->have_nccl) ncclCommDestroy(e->nccl);
#endif
    if (e->mc) {
        cudaFree(e->d_m1);
        cudaFree(e->d_m2);
        cudaFree(e->d_decay);
        if (e->h_grads) cudaFreeHost(e->h_grads);
        model_cuda_free(e->mc);
    }
#endif
    free(e->m1);
    free(e->m2);
    free(e->decay);
    free(e);
}

const char *engine_describe(const Engine *e) { return e->desc; }

PrefetchAllocator engine_host_allocator(Engine *e) {
#ifdef DFM_HAVE_CUDA
    if (e->mc) return (PrefetchAllocator){pinned_alloc, pinned_free, NULL};
#endif
    (void)e;
    return (PrefetchAllocator){NULL, NULL, NULL};
}

int engine_stage(Engine *e, const int *inputs, const int *targets, const float *tmem, const uint8_t *tmask, int B,
                 int T) {
#ifdef DFM_HAVE_CUDA
    if (e->mc) return model_cuda_stage(e->mc, inputs, targets, tmem, tmask, B, T);
#endif
    if (e->st_count == 2) return DFM_FAIL(DFM_EARG, "two batches are staged already: forward one first");
    int i = (e->st_head + e->st_count++) % 2;
    e->staged[i].inputs = inputs, e->staged[i].targets = targets, e->staged[i].tmem = tmem;
    e->staged[i].tmask = tmask, e->staged[i].B = B, e->staged[i].T = T;
    return DFM_OK;
}

int engine_forward(Engine *e, const int *inputs, const int *targets, const float *tmem, const uint8_t *tmask, int B,
                   int T, int mem_mode, int train, float grad_scale) {
#ifdef DFM_HAVE_CUDA
    if (e->mc) return model_forward_cuda(e->mc, inputs, targets, tmem, tmask, B, T, mem_mode, train, grad_scale);
#endif
    if (!inputs) {
        if (!e->st_count) return DFM_FAIL(DFM_EARG, "engine_forward without inputs and nothing staged");
        int i = e->st_head;
        e->st_head = (e->st_head + 1) % 2, e->st_count--;
        if (e->staged[i].B != B || e->staged[i].T != T)
            return DFM_FAIL(DFM_EARG, "the staged batch is %d x %d, the forward asks for %d x %d", e->staged[i].B,
                            e->staged[i].T, B, T);
        inputs = e->staged[i].inputs, targets = e->staged[i].targets;
        tmem = e->staged[i].tmem, tmask = e->staged[i].tmask;
    }
    return model_forward(e->m, inputs, targets, tmem, tmask, B, T, mem_mode, train, grad_scale);
}

int engine_row_top1(Engine *e, float *out) {
#ifdef DFM_HAVE_CUDA
    if (e->mc) return model_cuda_row_top1(e->mc, out);
#endif
    memcpy(out, e->m->row_top1, (size_t)e->m->B * e->m->T * sizeof(float));
    return DFM_OK;
}

int engine_row_losses(Engine *e, float *out) {
#ifdef DFM_HAVE_CUDA
    if (e->mc) return model_cuda_row_losses(e->mc, out);
#endif
    memcpy(out, e->m->row_losses, (size_t)e->m->B * e->m->T * sizeof(float));
    return DFM_OK;
}

int engine_pred_slots(Engine *e, float *out) {
#ifdef DFM_HAVE_CUDA
    if (e->mc) return model_cuda_pred_slots(e->mc, out);
#endif
    const DfmModel *m = e->m;
    memcpy(out, m->slots, (size_t)m->B * (m->T / m->dc.chunk_len) * m->dc.n_slots * m->dc.d_mem * sizeof(float));
    return DFM_OK;
}

void engine_set_mse_weight(Engine *e, float w) {
#ifdef DFM_HAVE_CUDA
    if (e->mc) {
        model_cuda_set_mse_weight(e->mc, w);
        return;
    }
#endif
    e->m->dc.mse_weight = w;
}

int engine_backward(Engine *e) {
#ifdef DFM_HAVE_CUDA
    if (e->mc) return model_backward_cuda(e->mc);
#endif
    return model_backward(e->m);
}

int engine_zero_grad(Engine *e) {
#ifdef DFM_HAVE_CUDA
    if (e->mc) return model_zero_grad_cuda(e->mc);
#endif
    model_zero_grad(e->m);
    return DFM_OK;
}

int engine_allreduce_grads(Engine *e, const dfm_mpi *mp) {
    int W = mp->size;
    if (W < 2) return DFM_OK;
    size_t n = e->np;
    if (n > 2147483647u) return DFM_FAIL(DFM_EARG, "%zu trainable parameters exceed one MPI all-reduce", n);
#ifdef DFM_HAVE_CUDA
    if (e->mc) {
        float *g = model_cuda_trainable_grads(e->mc);
        cudaStream_t st = stream_of(e);
#ifdef DFM_HAVE_NCCL
        ncclResult_t nr = ncclAllReduce(g, g, n, ncclFloat, ncclSum, e->nccl, st);
        if (nr != ncclSuccess) return DFM_FAIL(DFM_ECUDA, "ncclAllReduce failed: %s", ncclGetErrorString(nr));
#else
        CUDA_CHECK(cudaMemcpyAsync(e->h_grads, g, n * sizeof(float), cudaMemcpyDeviceToHost, st));
        CUDA_CHECK(cudaStreamSynchronize(st));
        DFM_TRY(DFM_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, e->h_grads, (int)n, MPI_FLOAT, MPI_SUM, mp->comm)));
        CUDA_CHECK(cudaMemcpyAsync(g, e->h_grads, n * sizeof(float), cudaMemcpyHostToDevice, st));
#endif
        return grad_scale_cuda(g, n, 1.0f / (float)W, st);
    }
#endif
    float *g = model_trainable_grads(e->m);
    DFM_TRY(DFM_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, g, (int)n, MPI_FLOAT, MPI_SUM, mp->comm)));
    grad_scale(g, n, 1.0f / (float)W);
    return DFM_OK;
}

int engine_grad_norm(Engine *e, double *norm) {
#ifdef DFM_HAVE_CUDA
    if (e->mc)
        return grad_norm_cuda(norm, model_cuda_trainable_grads(e->mc), e->np, (OpsCudaContext *)model_cuda_context(e->mc));
#endif
    *norm = grad_norm(model_trainable_grads(e->m), e->np);
    return DFM_OK;
}

int engine_grad_scale(Engine *e, float s) {
#ifdef DFM_HAVE_CUDA
    if (e->mc) return grad_scale_cuda(model_cuda_trainable_grads(e->mc), e->np, s, stream_of(e));
#endif
    grad_scale(model_trainable_grads(e->m), e->np, s);
    return DFM_OK;
}

int engine_adamw(Engine *e, const AdamWConfig *c, long t) {
#ifdef DFM_HAVE_CUDA
    if (e->mc) {
        size_t n;
        float *p = model_cuda_trainable_params(e->mc, &n);
        DFM_TRY(adamw_update_cuda(p, model_cuda_trainable_grads(e->mc), e->d_m1, e->d_m2, e->d_decay, n, c, t,
                                  stream_of(e)));
        return model_cuda_params_updated(e->mc);
    }
#endif
    size_t n;
    float *p = model_trainable_params(e->m, &n);
    adamw_update(p, model_trainable_grads(e->m), e->m1, e->m2, e->decay, n, c, t);
    return DFM_OK;
}

int engine_sync_host(Engine *e, float **params, float **m1, float **m2) {
    size_t n;
    *params = model_trainable_params(e->m, &n);
    *m1 = e->m1;
    *m2 = e->m2;
#ifdef DFM_HAVE_CUDA
    if (e->mc) {
        DFM_TRY(model_cuda_download_trainable(e->mc)); /* synchronises the stream */
        cudaStream_t st = stream_of(e);
        CUDA_CHECK(cudaMemcpyAsync(e->m1, e->d_m1, n * sizeof(float), cudaMemcpyDeviceToHost, st));
        CUDA_CHECK(cudaMemcpyAsync(e->m2, e->d_m2, n * sizeof(float), cudaMemcpyDeviceToHost, st));
        CUDA_CHECK(cudaStreamSynchronize(st));
    }
#endif
    return DFM_OK;
}

void engine_host_state(Engine *e, float **params, float **m1, float **m2) {
    size_t n;
    *params = model_trainable_params(e->m, &n);
    *m1 = e->m1;
    *m2 = e->m2;
}

int engine_load_state(Engine *e) {
#ifdef DFM_HAVE_CUDA
    if (e->mc) {
        DFM_TRY(model_cuda_upload_params(e->mc)); /* synchronises the stream */
        cudaStream_t st = stream_of(e);
        CUDA_CHECK(cudaMemcpyAsync(e->d_m1, e->m1, e->np * sizeof(float), cudaMemcpyHostToDevice, st));
        CUDA_CHECK(cudaMemcpyAsync(e->d_m2, e->m2, e->np * sizeof(float), cudaMemcpyHostToDevice, st));
        CUDA_CHECK(cudaStreamSynchronize(st));
    }
#endif
    (void)e;
    return DFM_OK;
}
