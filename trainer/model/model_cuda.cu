// model_cuda.cu — the DFM model on the GPU: allocation, upload/download, staging, and model.c's forward and
// backward step for step on the kernels of ops_cuda.h / stack_cuda.h (see model_cuda.h).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "common/error.h"
}
#include "trainer/kernels/attention_cuda.h"
#include "common/cuda_check.h"
#include "trainer/model/model_cuda.h"
#include "trainer/kernels/ops_cuda.h"
#include "trainer/kernels/stack_cuda.h"

namespace {

struct Stage {
    int *inputs, *targets;  // device [maxB*maxT]
    float *tgt_mem;         // device [S*d] (DFM)
    uint8_t *tgt_mask;      // device [S]
    cudaEvent_t copied;     // recorded on the copy stream after the H2D copies
    cudaEvent_t consumed;   // recorded on the compute stream after the D2D copies out of this slot
    int B, T, have_t, n_valid, n_tvalid, full;  // n_tvalid: valid target slots
};

}  // namespace

struct DfmModelCuda {
    DfmModel *host;
    DfmModel d;  // same struct, device pointers
    ModelCudaOptions opt;
    OpsCudaContext ctx;
    cudaStream_t copy_stream;
    int frozen16;                    // DFM mode with bf16: backbone only in bf16
    uint16_t *bb16;                  // [bb_num] bf16 copy of the backbone (frozen16)
    uint16_t *wte16, *lm_head16;     // views into bb16
    StackMats16 dec16;               // views into bb16
    float *norms;                    // frozen16: the backbone's norm weights (fp32)
    uint16_t *mirror16;              // bf16: a bf16 copy of the trainable block, read by the GEMMs
    int flash;
    Stage stage[2];
    int stage_head, stage_count;     // oldest staged slot, number staged
    float *cos_dev;                  // [S] per-slot cosine
    float *cos_host;                 // pinned [S]
    uint8_t *src_host;               // pinned [maxB*NC]: the host model's mem_src of the forward, copied up
    float *centre;                   // [d] DfmConfig.mem_centre (NULL: no centring), copied at creation
    int n_target_chunks;             // chunks of the last forward that fused their target memory
    int n_tvalid;                    // valid target slots of the batch in the model
    CeSoft soft;                     // the host model's soft targets (h->soft) of a training forward, on the device
    int *soft_ids;                   // [maxB*maxT*soft_cap] the device arrays soft points to (grown on first use)
    float *soft_p, *soft_w;          // [maxB*maxT*soft_cap], [maxB*maxT]
    uint8_t *soft_has;               // [maxB*maxT]
    int soft_cap;                    // ids per row they hold (0: none yet)
    ModelCudaMemory mem;
};

namespace {

// ---- small model-specific kernels ---------------------------------------------------------------------
// model.c's prepare_memory loop: each chunk's slots (predicted, or its target when src says so) and slot mask
// (predicted: chunk c attends its K slots iff c > 0 or fuse_first; target: the target mask)
// (centre: DfmConfig.mem_centre on the device, subtracted from every slot; NULL: none)
__global__ void memory_in_kernel(float *mem_in, uint8_t *slot_mask, const float *slots, const float *tgt,
                                 const uint8_t *tgt_mask, const uint8_t *src, const float *centre, int NC, int K, int d,
                                 int fuse_first, size_t n) {
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= n) return;
    size_t s = idx / d, chunk = s / K;
    int t = src[chunk];
    mem_in[idx] = (t ? tgt[idx] : slots[idx]) - (centre ? centre[idx % d] : 0.0f);
    if (idx % d == 0) slot_mask[s] = t ? tgt_mask[s] : (uint8_t)((chunk % NC) > 0 || fuse_first);
}
// no gradient to the predictor through a chunk that fused its target: d_slots rows of those chunks = 0
__global__ void zero_target_chunks_kernel(float *d_slots, const uint8_t *src, size_t Kd, size_t n) {
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx < n && src[idx / Kd]) d_slots[idx] = 0.0f;
}
// row b*NC of x (chunk 0 of each sequence) = placeholder
__global__ void placeholder_forward_kernel(float *x, const float *ph, int B, int NC, int P) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * P) return;
    x[(size_t)(i / P) * NC * P + i % P] = ph[i % P];
}
// gph += sum over b (in order) of row b*NC of dx; those rows are then zeroed (placeholder has no input)
__global__ void placeholder_backward_kernel(float *gph, float *dx, int B, int NC, int P) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= P) return;
    float s = 0.0f;
    for (int b = 0; b < B; b++) {
        float *r = dx + (size_t)b * NC * P + i;
        s += *r;
        *r = 0.0f;
    }
    gph[i] += s;
}
// cosine of predicted vs target slot s (one warp per slot, double accumulation like the CPU)
__global__ void slot_cos_kernel(float *out, const float *a, const float *t, const uint8_t *mask, int S, int d) {
    int s = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (s >= S) return;
    double ab = 0, aa = 0, tt = 0;
    if (mask[s])
        for (int i = lane; i < d; i += 32) {
            double x = a[(size_t)s * d + i], y = t[(size_t)s * d + i];
            ab += x * y;
            aa += x * x;
            tt += y * y;
        }
    float fab = (float)ab, faa = (float)aa, ftt = (float)tt;
    for (int o = 16; o > 0; o >>= 1) {
        fab += __shfl_xor_sync(0xffffffffu, fab, o);
        faa += __shfl_xor_sync(0xffffffffu, faa, o);
        ftt += __shfl_xor_sync(0xffffffffu, ftt, o);
    }
    if (lane == 0) out[s] = mask[s] ? fab / (sqrtf(faa * ftt) + 1e-12f) : 0.0f;
}

size_t slots_max(const DfmModel *m) {
    return m->dc.enabled ? (size_t)m->maxB * (m->maxT / m->dc.chunk_len) * m->dc.n_slots : 0;
}

int dmalloc(void **p, size_t bytes, const char *what, size_t *acc) {
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        *p = NULL;
        return DFM_FAIL(DFM_ECUDA, "cudaMalloc of %.1f MiB for %s failed: %s. HINT: smaller --batch / --seq-len, "
                        "--precision bf16, or a GPU with more memory", bytes / 1048576.0, what, cudaGetErrorString(e));
    }
    if (acc) *acc += bytes;
    return DFM_OK;
}

// element offset of a host backbone tensor inside the host backbone block
size_t bb_off(const DfmModel *h, const float *p) { return (size_t)(p - h->bb_memory); }

int flash_ok(const DfmModel *h) {
    if (!attention_flash_supported(h->maxT, h->bc.dec.head_dim)) return 0;
    if (h->dc.enabled && !attention_flash_supported(h->maxT / h->dc.chunk_len, h->dc.pred.head_dim)) return 0;
    return 1;
}

// the device model's backbone in bf16 with fp32 norms (frozen16)
int create_frozen16(DfmModelCuda *mc) {
    DfmModel *h = mc->host, *d = &mc->d;
    DFM_TRY(dmalloc((void **)&mc->bb16, h->bb_num * sizeof(uint16_t), "the bf16 backbone", &mc->mem.params_bf16));
    mc->wte16 = mc->bb16 + bb_off(h, h->bb.wte);
    mc->lm_head16 = mc->bb16 + bb_off(h, h->bb.lm_head);
    const StackParams *hp = &h->bb.dec;
    mc->dec16 = StackMats16{mc->bb16 + bb_off(h, hp->wq),    mc->bb16 + bb_off(h, hp->wk),
                            mc->bb16 + bb_off(h, hp->wv),    mc->bb16 + bb_off(h, hp->wo),
                            mc->bb16 + bb_off(h, hp->wgate), mc->bb16 + bb_off(h, hp->wup),
                            mc->bb16 + bb_off(h, hp->wdown)};
    const StackConfig *c = &h->bc.dec;
    size_t NL = c->n_layers, C = c->hidden, hd = c->head_dim, qk = c->qk_norm ? NL * hd : 0;
    size_t n = 2 * NL * C + 2 * qk + C;
    DFM_TRY(dmalloc((void **)&mc->norms, n * sizeof(float), "the backbone's norm weights", &mc->mem.params_fp32));
    memset(&d->bb, 0, sizeof d->bb);
    float *p = mc->norms;
    d->bb.dec.ln1w = p, p += NL * C;
    d->bb.dec.ln2w = p, p += NL * C;
    d->bb.dec.qnorm = qk ? p : NULL, p += qk;
    d->bb.dec.knorm = qk ? p : NULL, p += qk;
    d->bb.lnf = p;
    return DFM_OK;
}

int upload_floats(float *dst, const float *src, size_t n, cudaStream_t st) {
    if (!n) return DFM_OK;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, st));
    return DFM_OK;
}

}  // namespace

extern "C" int model_cuda_create(DfmModel *host, const ModelCudaOptions *o, DfmModelCuda **out) {
    *out = NULL;
    DfmModelCuda *mc = (DfmModelCuda *)calloc(1, sizeof *mc);
    if (!mc) return DFM_FAIL(DFM_ENOMEM, "device model struct");
    mc->host = host;
    mc->opt = *o;
    int rc = ops_cuda_init(&mc->ctx, o->device, o->bf16);
    if (rc) {
        free(mc);
        return rc;
    }
    DfmModel *d = &mc->d;
    d->bc = host->bc;
    d->dc = host->dc;
    d->maxB = host->maxB;
    d->maxT = host->maxT;
    d->bb_num = host->bb_num;
    d->dfm_num = host->dfm_num;
    d->grad_num = host->grad_num;
    mc->frozen16 = host->dc.enabled && o->bf16;
    {
        cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, o->device) == cudaSuccess) {
            snprintf(mc->mem.gpu_name, sizeof mc->mem.gpu_name, "%s", prop.name);
            mc->mem.gpu_mem_total = (double)prop.totalGlobalMem;
        }
    }
    {
        // attention: flash (no T x T matrices) or the materialising one (tensor-core GEMMs, T x T kept per
        // layer); auto (< 0) takes the latter while the matrices it keeps stay under 30 % of the GPU
        const BackboneConfig *bc = &host->bc;
        double tt = (double)host->maxB * host->maxT * host->maxT * 4.0;
        // att per layer and datt, plus (bf16) the backward's two bf16 copies of a layer's P and dS
        int extra = o->bf16 ? 1 : 0;
        double keep = tt * (bc->dec.n_layers + 1 + extra) * bc->dec.n_heads;
        if (host->dc.enabled) keep += tt / ((double)host->dc.chunk_len * host->dc.chunk_len) *
                                      (host->dc.pred.n_layers + 1 + extra) * host->dc.pred.n_heads;
        int want = o->flash >= 0 ? o->flash : keep > 0.3 * mc->mem.gpu_mem_total;
        mc->flash = want && flash_ok(host);
    }
    mc->mem.flash_decoder = mc->mem.flash_predictor = mc->flash;
#define R(x)           \
    do {               \
        rc = (x);      \
        if (rc) goto fail; \
    } while (0)
    R(DFM_CUDA_STATUS(cudaStreamCreateWithFlags(&mc->copy_stream, cudaStreamNonBlocking)));
    if (mc->frozen16) {
        R(create_frozen16(mc));
    } else {
        R(dmalloc((void **)&d->bb_memory, host->bb_num * sizeof(float), "the backbone", &mc->mem.params_fp32));
        model_carve_backbone(&d->bc, &d->bb, d->bb_memory);
    }
    if (host->dc.enabled) {
        R(dmalloc((void **)&d->dfm_memory, host->dfm_num * sizeof(float), "the DFM modules", &mc->mem.params_fp32));
        model_carve_dfm(&d->bc, &d->dc, &d->dp, d->dfm_memory);
    }
    R(dmalloc((void **)&d->grad_memory, host->grad_num * sizeof(float), "the gradients", &mc->mem.grads));
    if (o->bf16) {  // the trainable weights rounded once per step instead of at every GEMM
        size_t n;
        float *tp = model_cuda_trainable_params(mc, &n);
        R(dmalloc((void **)&mc->mirror16, n * sizeof(uint16_t), "the bf16 copy of the trainable weights",
                  &mc->mem.params_bf16));
        ops_cuda_set_bf16_mirror(&mc->ctx, tp, mc->mirror16, n);
    }
    if (host->dc.enabled) model_carve_dfm(&d->bc, &d->dc, &d->dp_grad, d->grad_memory);
    else model_carve_backbone(&d->bc, &d->bb_grad, d->grad_memory);
    d->act_num = model_carve_acts(d, NULL, CE_ROWS_BLOCK_CUDA, mc->flash);
    R(dmalloc((void **)&d->act_memory, d->act_num * sizeof(float), "the activations", &mc->mem.acts));
    model_carve_acts(d, d->act_memory, CE_ROWS_BLOCK_CUDA, mc->flash);
    R(DFM_CUDA_STATUS(cudaMemsetAsync(d->act_memory, 0, d->act_num * sizeof(float), mc->ctx.stream)));
    R(DFM_CUDA_STATUS(cudaMemsetAsync(d->grad_memory, 0, d->grad_num * sizeof(float), mc->ctx.stream)));
    // RoPE tables: the host's, so both sides rotate by the same angles
    R(upload_floats(d->rope_cos, host->rope_cos, (size_t)host->maxT * host->bc.dec.head_dim / 2, mc->ctx.stream));
    R(upload_floats(d->rope_sin, host->rope_sin, (size_t)host->maxT * host->bc.dec.head_dim / 2, mc->ctx.stream));
    if (host->dc.enabled) {
        size_t n = (size_t)(host->maxT / host->dc.chunk_len) * host->dc.pred.head_dim / 2;
        R(upload_floats(d->prope_cos, host->prope_cos, n, mc->ctx.stream));
        R(upload_floats(d->prope_sin, host->prope_sin, n, mc->ctx.stream));
    }
    {
        size_t N = (size_t)host->maxB * host->maxT, S = slots_max(host), dm = host->dc.d_mem;
        for (int i = 0; i < 2; i++) {
            Stage *s = &mc->stage[i];
            R(dmalloc((void **)&s->inputs, N * sizeof(int), "staging", &mc->mem.staging));
            R(dmalloc((void **)&s->targets, N * sizeof(int), "staging", &mc->mem.staging));
            if (S) {
                R(dmalloc((void **)&s->tgt_mem, S * dm * sizeof(float), "staging", &mc->mem.staging));
                R(dmalloc((void **)&s->tgt_mask, S, "staging", &mc->mem.staging));
            }
            R(DFM_CUDA_STATUS(cudaEventCreateWithFlags(&s->copied, cudaEventDisableTiming)));
            R(DFM_CUDA_STATUS(cudaEventCreateWithFlags(&s->consumed, cudaEventDisableTiming)));
        }
        if (S) {
            size_t nch = S / host->dc.n_slots;
            R(dmalloc((void **)&mc->cos_dev, S * sizeof(float), "slot cosines", &mc->mem.staging));
            R(DFM_CUDA_STATUS(cudaMallocHost((void **)&mc->cos_host, S * sizeof(float))));
            R(dmalloc((void **)&d->mem_src, nch, "memory sources", &mc->mem.staging));
            R(DFM_CUDA_STATUS(cudaMallocHost((void **)&mc->src_host, nch)));
        }
        if (S && host->dc.n_centre == host->dc.d_mem) {
            R(dmalloc((void **)&mc->centre, dm * sizeof(float), "memory centre", &mc->mem.staging));
            R(DFM_CUDA_STATUS(cudaMemcpy(mc->centre, host->dc.mem_centre, dm * sizeof(float), cudaMemcpyHostToDevice)));
        }
    }
    R(model_cuda_upload_params(mc));
#undef R
    *out = mc;
    return DFM_OK;
fail:
    model_cuda_free(mc);
    return rc;
}

extern "C" void model_cuda_free(DfmModelCuda *mc) {
    if (!mc) return;
    if (mc->ctx.stream) cudaStreamSynchronize(mc->ctx.stream);
    if (mc->copy_stream) cudaStreamSynchronize(mc->copy_stream);
    DfmModel *d = &mc->d;
    cudaFree(d->bb_memory);
    cudaFree(d->dfm_memory);
    cudaFree(d->grad_memory);
    cudaFree(d->act_memory);
    cudaFree(mc->bb16);
    cudaFree(mc->norms);
    cudaFree(mc->mirror16);
    for (int i = 0; i < 2; i++) {
        Stage *s = &mc->stage[i];
        cudaFree(s->inputs);
        cudaFree(s->targets);
        cudaFree(s->tgt_mem);
        cudaFree(s->tgt_mask);
        if (s->copied) cudaEventDestroy(s->copied);
        if (s->consumed) cudaEventDestroy(s->consumed);
    }
    cudaFree(mc->cos_dev);
    cudaFree(mc->centre);
    cudaFree(mc->soft_ids);
    cudaFree(mc->soft_p);
    cudaFree(mc->soft_w);
    cudaFree(mc->soft_has);
    if (mc->cos_host) cudaFreeHost(mc->cos_host);
    cudaFree(d->mem_src);
    if (mc->src_host) cudaFreeHost(mc->src_host);
    if (mc->copy_stream) cudaStreamDestroy(mc->copy_stream);
    ops_cuda_free(&mc->ctx);
    free(mc);
}

extern "C" const ModelCudaMemory *model_cuda_memory(const DfmModelCuda *mc) { return &mc->mem; }

extern "C" int model_cuda_upload_params(DfmModelCuda *mc) {
    DfmModel *h = mc->host, *d = &mc->d;
    cudaStream_t st = mc->ctx.stream;
    if (!mc->frozen16) {
        DFM_TRY(upload_floats(d->bb_memory, h->bb_memory, h->bb_num, st));
    } else {
        // the backbone through a bounded fp32 bounce buffer, rounded to bf16 on the device
        const StackConfig *c = &h->bc.dec;
        size_t NL = c->n_layers, C = c->hidden, qk = c->qk_norm ? NL * c->head_dim : 0;
        DFM_TRY(upload_floats(d->bb.dec.ln1w, h->bb.dec.ln1w, NL * C, st));
        DFM_TRY(upload_floats(d->bb.dec.ln2w, h->bb.dec.ln2w, NL * C, st));
        if (qk) {
            DFM_TRY(upload_floats(d->bb.dec.qnorm, h->bb.dec.qnorm, qk, st));
            DFM_TRY(upload_floats(d->bb.dec.knorm, h->bb.dec.knorm, qk, st));
        }
        DFM_TRY(upload_floats(d->bb.lnf, h->bb.lnf, C, st));
        size_t chunk = (size_t)1 << 24, n = h->bb_num;
        float *bounce = NULL;
        CUDA_CHECK(cudaMalloc((void **)&bounce, (n < chunk ? n : chunk) * sizeof(float)));
        int rc = DFM_OK;
        for (size_t i = 0; i < n && !rc; i += chunk) {
            size_t k = n - i < chunk ? n - i : chunk;
            cudaError_t e = cudaMemcpyAsync(bounce, h->bb_memory + i, k * sizeof(float), cudaMemcpyHostToDevice, st);
            if (e != cudaSuccess) rc = DFM_FAIL(DFM_ECUDA, "uploading the backbone: %s", cudaGetErrorString(e));
            if (!rc) rc = to_bf16_cuda(mc->bb16 + i, bounce, k, st);
            if (!rc && (e = cudaStreamSynchronize(st)) != cudaSuccess)  // the bounce buffer is reused
                rc = DFM_FAIL(DFM_ECUDA, "uploading the backbone: %s", cudaGetErrorString(e));
        }
        cudaFree(bounce);
        DFM_TRY(rc);
    }
    if (h->dc.enabled) DFM_TRY(upload_floats(d->dfm_memory, h->dfm_memory, h->dfm_num, st));
    DFM_TRY(model_cuda_params_updated(mc));
    CUDA_CHECK(cudaStreamSynchronize(st));
    return DFM_OK;
}

extern "C" int model_cuda_params_updated(DfmModelCuda *mc) {
    if (!mc->mirror16) return DFM_OK;
    size_t n;
    float *tp = model_cuda_trainable_params(mc, &n);
    return to_bf16_cuda(mc->mirror16, tp, n, mc->ctx.stream);
}

extern "C" int model_cuda_download_trainable(DfmModelCuda *mc) {
    size_t n;
    float *dst = model_trainable_params(mc->host, &n);
    float *src = model_cuda_trainable_params(mc, &n);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, mc->ctx.stream));
    CUDA_CHECK(cudaStreamSynchronize(mc->ctx.stream));
    return DFM_OK;
}

extern "C" int model_cuda_download_grads(DfmModelCuda *mc, float *grads) {
    CUDA_CHECK(cudaMemcpyAsync(grads, mc->d.grad_memory, mc->d.grad_num * sizeof(float), cudaMemcpyDeviceToHost,
                               mc->ctx.stream));
    CUDA_CHECK(cudaStreamSynchronize(mc->ctx.stream));
    return DFM_OK;
}

extern "C" float *model_cuda_trainable_params(DfmModelCuda *mc, size_t *n) {
    *n = mc->d.grad_num;
    return mc->d.dc.enabled ? mc->d.dfm_memory : mc->d.bb_memory;
}
extern "C" float *model_cuda_trainable_grads(DfmModelCuda *mc) { return mc->d.grad_memory; }
extern "C" int model_cuda_row_top1(DfmModelCuda *mc, float *out) {
    CUDA_CHECK(cudaStreamSynchronize(mc->ctx.stream));
    CUDA_CHECK(cudaMemcpy(out, mc->d.row_top1, (size_t)mc->d.B * mc->d.T * sizeof(float), cudaMemcpyDeviceToHost));
    return DFM_OK;
}
extern "C" int model_cuda_row_losses(DfmModelCuda *mc, float *out) {
    CUDA_CHECK(cudaStreamSynchronize(mc->ctx.stream));
    CUDA_CHECK(cudaMemcpy(out, mc->d.row_losses, (size_t)mc->d.B * mc->d.T * sizeof(float), cudaMemcpyDeviceToHost));
    return DFM_OK;
}
extern "C" int model_cuda_pred_slots(DfmModelCuda *mc, float *out) {
    const DfmConfig *dc = &mc->d.dc;
    size_t n = (size_t)mc->d.B * (mc->d.T / dc->chunk_len) * dc->n_slots * dc->d_mem;
    CUDA_CHECK(cudaStreamSynchronize(mc->ctx.stream));
    CUDA_CHECK(cudaMemcpy(out, mc->d.slots, n * sizeof(float), cudaMemcpyDeviceToHost));
    return DFM_OK;
}
extern "C" void *model_cuda_context(DfmModelCuda *mc) { return &mc->ctx; }
extern "C" void model_cuda_set_mse_weight(DfmModelCuda *mc, float w) { mc->host->dc.mse_weight = mc->d.dc.mse_weight = w; }

extern "C" int model_zero_grad_cuda(DfmModelCuda *mc) {
    return vec_zero_cuda(mc->d.grad_memory, mc->d.grad_num, mc->ctx.stream);
}

// ---- staging ------------------------------------------------------------------------------------------
extern "C" int model_cuda_stage(DfmModelCuda *mc, const int *inputs, const int *targets, const float *tgt_mem,
                                const uint8_t *tgt_mask, int B, int T) {
    const DfmModel *h = mc->host;
    const DfmConfig *dc = &h->dc;
    if (!model_batch_fits(h, B, T))
        return DFM_FAIL(DFM_EARG, "batch %d x %d does not fit the model's %d x %d (chunk %d)", B, T, h->maxB, h->maxT,
                        dc->chunk_len);
    if (mc->stage_count == 2) return DFM_FAIL(DFM_EARG, "two batches are staged already: forward one first");
    int V = h->bc.vocab_size, N = B * T, n_valid = 0;
    for (int i = 0; i < N; i++) {
        if (inputs[i] < 0 || inputs[i] >= V || targets[i] < -1 || targets[i] >= V)
            return DFM_FAIL(DFM_ERANGE, "token id %d / %d at %d outside the vocabulary of %d", inputs[i], targets[i],
                            i, V);
        n_valid += targets[i] >= 0;
    }
    int slot = (mc->stage_head + mc->stage_count) % 2;
    Stage *s = &mc->stage[slot];
    cudaStream_t cs = mc->copy_stream;
    CUDA_CHECK(cudaStreamWaitEvent(cs, s->consumed, 0));  // the previous batch in this slot was copied out
    CUDA_CHECK(cudaMemcpyAsync(s->inputs, inputs, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, cs));
    CUDA_CHECK(cudaMemcpyAsync(s->targets, targets, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, cs));
    s->have_t = dc->enabled && tgt_mem && tgt_mask;
    if (s->have_t) {
        size_t S = (size_t)B * (T / dc->chunk_len) * dc->n_slots;
        CUDA_CHECK(cudaMemcpyAsync(s->tgt_mem, tgt_mem, S * dc->d_mem * sizeof(float), cudaMemcpyHostToDevice, cs));
        CUDA_CHECK(cudaMemcpyAsync(s->tgt_mask, tgt_mask, S, cudaMemcpyHostToDevice, cs));
        s->n_tvalid = 0;
        for (size_t i = 0; i < S; i++) s->n_tvalid += tgt_mask[i] != 0;
    }
    CUDA_CHECK(cudaEventRecord(s->copied, cs));
    s->B = B;
    s->T = T;
    s->n_valid = n_valid;
    s->full = 1;
    mc->stage_count++;
    return DFM_OK;
}

// the oldest staged batch into the model's input buffers (on the compute stream, after its copy)
static int consume_stage(DfmModelCuda *mc, int B, int T) {
    Stage *s = &mc->stage[mc->stage_head];
    if (!mc->stage_count) return DFM_FAIL(DFM_EARG, "model_forward_cuda without inputs and nothing staged");
    if (s->B != B || s->T != T)
        return DFM_FAIL(DFM_EARG, "the staged batch is %d x %d, the forward asks for %d x %d", s->B, s->T, B, T);
    DfmModel *d = &mc->d, *h = mc->host;
    cudaStream_t st = mc->ctx.stream;
    size_t N = (size_t)B * T;
    CUDA_CHECK(cudaStreamWaitEvent(st, s->copied, 0));
    CUDA_CHECK(cudaMemcpyAsync(d->inputs, s->inputs, N * sizeof(int), cudaMemcpyDeviceToDevice, st));
    CUDA_CHECK(cudaMemcpyAsync(d->targets, s->targets, N * sizeof(int), cudaMemcpyDeviceToDevice, st));
    h->have_targets = s->have_t;
    if (s->have_t) {
        size_t S = (size_t)B * (T / h->dc.chunk_len) * h->dc.n_slots;
        CUDA_CHECK(cudaMemcpyAsync(d->tgt_mem, s->tgt_mem, S * h->dc.d_mem * sizeof(float), cudaMemcpyDeviceToDevice,
                                   st));
        CUDA_CHECK(cudaMemcpyAsync(d->tgt_mask, s->tgt_mask, S, cudaMemcpyDeviceToDevice, st));
    }
    CUDA_CHECK(cudaEventRecord(s->consumed, st));
    // the caller may reuse its host arrays once this returns: wait for the H2D copy (long done in a
    // pipelined loop, where the batch was staged during the previous micro-batch's compute)
    CUDA_CHECK(cudaEventSynchronize(s->copied));
    h->n_valid = s->n_valid;
    mc->n_tvalid = s->n_tvalid;
    s->full = 0;
    mc->stage_head = (mc->stage_head + 1) % 2;
    mc->stage_count--;
    return DFM_OK;
}

// ---- DFM modules (model.c's predictor_*, projector_*, fusion_*) ---------------------------------------
static int predictor_forward_cuda(DfmModelCuda *mc, int B, int T) {
    DfmModel *m = &mc->d;
    const DfmConfig *dc = &m->dc;
    const DfmParams *p = &m->dp;
    OpsCudaContext *ctx = &mc->ctx;
    cudaStream_t st = ctx->stream;
    int C = m->bc.dec.hidden, P = dc->pred.hidden, NCc = T / dc->chunk_len, Np = B * NCc, NLp = dc->pred.n_layers;
    size_t NCs = (size_t)B * T * C;
    DFM_TRY(chunk_pool_forward_cuda(m->pool, m->x_layer_in + (size_t)dc->pred_input_layer * NCs, B, T, dc->chunk_len,
                                    dfm_pred_tail(dc), C, st));
    DFM_TRY(matmul_forward_cuda(m->pred_x, m->pool, p->pred_win, p->pred_bin, Np, C, P, ctx));
    placeholder_forward_kernel<<<blocks_for((size_t)B * P, 256), 256, 0, st>>>(m->pred_x, p->pred_placeholder, B, NCc, P);
    LAUNCH_CHECK("placeholder_forward_kernel");
    for (int l = 0; l < NLp; l++)
        DFM_TRY(stack_layer_forward_cuda(&dc->pred, &p->pred, NULL, &m->pred_acts, l,
                                         m->pred_x + (size_t)(l + 1) * Np * P, m->pred_x + (size_t)l * Np * P,
                                         m->pred_tmp, B, NCc, m->prope_cos, m->prope_sin, mc->flash, ctx));
    DFM_TRY(rmsnorm_forward_cuda(m->pred_ln, m->pred_rstd, m->pred_x + (size_t)NLp * Np * P, p->pred_lnf, Np, P,
                                 dc->pred.eps, st));
    DFM_TRY(matmul_forward_cuda(m->slots, m->pred_ln, p->pred_wout, p->pred_bout, Np, P, dc->n_slots * dc->d_mem, ctx));
    if (p->pred_wskip)
        DFM_TRY(matmul_forward_acc_cuda(m->slots, m->pool, p->pred_wskip, Np, C, dc->n_slots * dc->d_mem, ctx));
    return DFM_OK;
}

static int predictor_backward_cuda(DfmModelCuda *mc, int B, int T) {
    DfmModel *m = &mc->d;
    const DfmConfig *dc = &m->dc;
    const DfmParams *p = &m->dp;
    DfmParams *g = &m->dp_grad;
    OpsCudaContext *ctx = &mc->ctx;
    cudaStream_t st = ctx->stream;
    int C = m->bc.dec.hidden, P = dc->pred.hidden, NCc = T / dc->chunk_len, Np = B * NCc, NLp = dc->pred.n_layers;
    size_t NP = (size_t)Np * P;
    float *da = m->d_pred_a, *db = m->d_pred_b, *dc_ = m->d_pred_c;
    DFM_TRY(vec_zero_cuda(da, NP, st));
    DFM_TRY(matmul_backward_cuda(da, g->pred_wout, g->pred_bout, m->d_slots, m->pred_ln, p->pred_wout, Np, P,
                                 dc->n_slots * dc->d_mem, ctx));
    if (p->pred_wskip) /* the pooled input is frozen: the skip path's weight alone has a gradient */
        DFM_TRY(matmul_backward_cuda(NULL, g->pred_wskip, NULL, m->d_slots, m->pool, p->pred_wskip, Np, C,
                                     dc->n_slots * dc->d_mem, ctx));
    DFM_TRY(vec_zero_cuda(db, NP, st));
    DFM_TRY(rmsnorm_backward_cuda(db, g->pred_lnf, da, m->pred_x + (size_t)NLp * NP, p->pred_lnf, m->pred_rstd, Np, P,
                                  st));
    for (int l = NLp - 1; l >= 0; l--) {
        DFM_TRY(vec_zero_cuda(dc_, NP, st));
        DFM_TRY(stack_layer_backward_cuda(&dc->pred, &p->pred, NULL, &g->pred, &m->pred_acts, &m->pred_scr, l, dc_, db,
                                          m->pred_x + (size_t)l * NP, B, NCc, m->prope_cos, m->prope_sin, mc->flash,
                                          ctx));
        float *t = db;
        db = dc_;
        dc_ = t;
    }
    placeholder_backward_kernel<<<blocks_for(P, 128), 128, 0, st>>>(g->pred_placeholder, db, B, NCc, P);
    LAUNCH_CHECK("placeholder_backward_kernel");
    return matmul_backward_cuda(NULL, g->pred_win, g->pred_bin, db, m->pool, p->pred_win, Np, C, P, ctx);
}

static int projector_forward_cuda(DfmModelCuda *mc, int S) {
    DfmModel *m = &mc->d;
    const DfmParams *p = &m->dp;
    OpsCudaContext *ctx = &mc->ctx;
    int d = m->dc.d_mem, H = m->dc.proj_hidden, C = m->bc.dec.hidden;
    DFM_TRY(layernorm_forward_cuda(m->pj_ln, m->pj_mean, m->pj_rstd, m->mem_in, p->proj_lnw, p->proj_lnb, S, d, 1e-5f,
                                   ctx->stream));
    DFM_TRY(matmul_forward_cuda(m->pj_h, m->pj_ln, p->proj_w1, p->proj_b1, S, d, H, ctx));
    DFM_TRY(gelu_forward_cuda(m->pj_a, m->pj_h, (size_t)S * H, ctx->stream));
    return matmul_forward_cuda(m->mem, m->pj_a, p->proj_w2, p->proj_b2, S, H, C, ctx);
}

static int projector_backward_cuda(DfmModelCuda *mc, int S) {
    DfmModel *m = &mc->d;
    const DfmParams *p = &m->dp;
    DfmParams *g = &m->dp_grad;
    OpsCudaContext *ctx = &mc->ctx;
    cudaStream_t st = ctx->stream;
    int d = m->dc.d_mem, H = m->dc.proj_hidden, C = m->bc.dec.hidden;
    DFM_TRY(vec_zero_cuda(m->d_pj_a, (size_t)S * H, st));
    int co = m->dc.content_only; /* its biases held at 0 (model.h) */
    DFM_TRY(matmul_backward_cuda(m->d_pj_a, g->proj_w2, co ? NULL : g->proj_b2, m->d_mem, m->pj_a, p->proj_w2, S, H, C, ctx));
    DFM_TRY(vec_zero_cuda(m->d_pj_h, (size_t)S * H, st));
    DFM_TRY(gelu_backward_cuda(m->d_pj_h, m->d_pj_a, m->pj_h, (size_t)S * H, st));
    DFM_TRY(vec_zero_cuda(m->d_pj_ln, (size_t)S * d, st));
    DFM_TRY(matmul_backward_cuda(m->d_pj_ln, g->proj_w1, co ? NULL : g->proj_b1, m->d_pj_h, m->pj_ln, p->proj_w1, S, d, H, ctx));
    return layernorm_backward_cuda(m->d_slots, g->proj_lnw, co ? NULL : g->proj_lnb, m->d_pj_ln, m->mem_in, p->proj_lnw,
                                   m->pj_mean, m->pj_rstd, S, d, st);
}

static int fusion_forward_cuda(DfmModelCuda *mc, int f, float *out, const float *h) {
    DfmModel *m = &mc->d;
    OpsCudaContext *ctx = &mc->ctx;
    int B = m->B, T = m->T, N = B * T, C = m->bc.dec.hidden, K = m->dc.n_slots, L = m->dc.chunk_len;
    int S = B * (T / L) * K, nhx = m->dc.xattn_heads, G = model_fusion_gates(m);
    FusionView v = model_fusion_view(m, &m->dp, f);
    DFM_TRY(rmsnorm_forward_cuda(v.xn, v.rstd, h, v.lnw, N, C, m->bc.dec.eps, ctx->stream));
    DFM_TRY(matmul_forward_cuda(v.q, v.xn, v.wq, NULL, N, C, C, ctx));
    DFM_TRY(matmul_forward_cuda(v.km, m->mem, v.wk, NULL, S, C, C, ctx));
    DFM_TRY(matmul_forward_cuda(v.vm, m->mem, v.wv, NULL, S, C, C, ctx));
    DFM_TRY(crossattn_forward_cuda(v.y, v.p, v.q, v.km, v.vm, m->slot_mask, B, T, L, m->dc.mem_align, K, nhx, C / nhx,
                                   ctx->stream));
    DFM_TRY(matmul_forward_cuda(v.o, v.y, v.wo, NULL, N, C, C, ctx));
    DFM_TRY(matmul_forward_cuda(v.gl, h, v.wg, v.bg, N, C, G, ctx));
    return gate_forward_cuda(out, v.g, v.gl, h, v.o, N, C, G, ctx->stream);
}

static int fusion_backward_cuda(DfmModelCuda *mc, int f, float *dh, const float *dout, const float *h) {
    DfmModel *m = &mc->d;
    OpsCudaContext *ctx = &mc->ctx;
    cudaStream_t st = ctx->stream;
    int B = m->B, T = m->T, N = B * T, C = m->bc.dec.hidden, K = m->dc.n_slots, L = m->dc.chunk_len;
    int S = B * (T / L) * K, nhx = m->dc.xattn_heads, G = model_fusion_gates(m);
    FusionView v = model_fusion_view(m, &m->dp, f);
    FusionView gv = model_fusion_view(m, &m->dp_grad, f);
    size_t NCs = (size_t)N * C, SC = (size_t)S * C;
    float *d_o = m->d_fu_a, *d_y = m->d_fu_b, *d_q = m->d_fu_c, *d_xn = m->d_fu_a;
    DFM_TRY(vec_zero_cuda(d_o, NCs, st));
    DFM_TRY(vec_zero_cuda(m->d_fu_gl, (size_t)N * G, st));
    DFM_TRY(gate_backward_cuda(dh, m->d_fu_gl, d_o, dout, v.g, v.o, N, C, G, st));
    DFM_TRY(matmul_backward_cuda(dh, gv.wg, gv.bg, m->d_fu_gl, h, v.wg, N, C, G, ctx));
    DFM_TRY(vec_zero_cuda(d_y, NCs, st));
    DFM_TRY(matmul_backward_cuda(d_y, gv.wo, NULL, d_o, v.y, v.wo, N, C, C, ctx));
    DFM_TRY(vec_zero_cuda(d_q, NCs, st));
    DFM_TRY(vec_zero_cuda(m->d_fu_kv, SC, st));
    DFM_TRY(vec_zero_cuda(m->d_fu_kv2, SC, st));
    DFM_TRY(crossattn_backward_cuda(d_q, m->d_fu_kv, m->d_fu_kv2, d_y, v.p, v.q, v.km, v.vm, B, T, L, m->dc.mem_align, K,
                                    nhx, C / nhx,
                                    st));
    DFM_TRY(matmul_backward_cuda(m->d_mem, gv.wk, NULL, m->d_fu_kv, m->mem, v.wk, S, C, C, ctx));
    DFM_TRY(matmul_backward_cuda(m->d_mem, gv.wv, NULL, m->d_fu_kv2, m->mem, v.wv, S, C, C, ctx));
    DFM_TRY(vec_zero_cuda(d_xn, NCs, st));
    DFM_TRY(matmul_backward_cuda(d_xn, gv.wq, NULL, d_q, v.xn, v.wq, N, C, C, ctx));
    return rmsnorm_backward_cuda(dh, gv.lnw, d_xn, h, v.lnw, v.rstd, N, C, st);
}

// model.c's prepare_memory: predictor, memory and slot mask, projector, MSE and cosine vs the targets
static int prepare_memory_cuda(DfmModelCuda *mc, int B, int T, int mem_mode) {
    DfmModel *m = &mc->d, *h = mc->host;
    const DfmConfig *dc = &m->dc;
    cudaStream_t st = mc->ctx.stream;
    int L = dc->chunk_len, NCc = T / L, K = dc->n_slots, d = dc->d_mem;
    int S = B * NCc * K;
    if (mem_mode == MEM_PREDICTED || h->have_targets) DFM_TRY(predictor_forward_cuda(mc, B, T));
    mc->n_target_chunks = model_memory_sources(h, B, NCc, mem_mode);
    if (mem_mode != MEM_NONE) {
        // the pinned buffer is free again: the previous forward's CE synchronised the stream after its copy
        memcpy(mc->src_host, h->mem_src, (size_t)B * NCc);
        CUDA_CHECK(cudaMemcpyAsync(m->mem_src, mc->src_host, (size_t)B * NCc, cudaMemcpyHostToDevice, st));
        memory_in_kernel<<<blocks_for((size_t)S * d, 256), 256, 0, st>>>(m->mem_in, m->slot_mask, m->slots, m->tgt_mem,
                                                                         m->tgt_mask, m->mem_src, mc->centre, NCc, K,
                                                                         d, dc->fuse_first_chunk, (size_t)S * d);
        LAUNCH_CHECK("memory_in_kernel");
        DFM_TRY(projector_forward_cuda(mc, S));
    }
    if (!h->have_targets) return DFM_OK;
    DFM_TRY(mse_forward_backward_cuda(&h->mse, NULL, m->slots, m->tgt_mem, m->tgt_mask, S, d, 0.0f, &mc->ctx));
    slot_cos_kernel<<<blocks_for((size_t)S * 32, 128), 128, 0, st>>>(mc->cos_dev, m->slots, m->tgt_mem, m->tgt_mask, S, d);
    LAUNCH_CHECK("slot_cos_kernel");
    // summed on the host over valid slots by model_forward_cuda (after the stream's next sync)
    CUDA_CHECK(cudaMemcpyAsync(mc->cos_host, mc->cos_dev, (size_t)S * sizeof(float), cudaMemcpyDeviceToHost, st));
    return DFM_OK;
}

// the host model's soft targets (model_set_soft_targets) of a training forward over N rows to the device, as
// mc->soft; the ids are checked first (on the GPU one out of [0, V) would write outside the logits)
static int upload_soft_targets(DfmModelCuda *mc, const CeSoft *hs, int N, int V) {
    DfmModel *h = mc->host;
    int S = hs->S;
    if (S < 1 || S > CE_MAX_SOFT || !hs->ids || !hs->p || !hs->has)
        return DFM_FAIL(DFM_EARG, "soft targets need ids, p and has and 1..%d ids per row (S = %d)", CE_MAX_SOFT, S);
    for (int r = 0; r < N; r++)
        for (int i = 0; hs->has[r] && i < S; i++)
            if (hs->ids[(size_t)r * S + i] < 0 || hs->ids[(size_t)r * S + i] >= V)
                return DFM_FAIL(DFM_ERANGE, "soft target id %d of row %d outside the vocabulary of %d",
                                hs->ids[(size_t)r * S + i], r, V);
    size_t rows = (size_t)h->maxB * h->maxT;
    if (S > mc->soft_cap) {  // once per run: the teacher's S is fixed (cudaFree waits for the last forward's use)
        cudaFree(mc->soft_ids), cudaFree(mc->soft_p), cudaFree(mc->soft_w), cudaFree(mc->soft_has);
        mc->soft_ids = NULL, mc->soft_p = mc->soft_w = NULL, mc->soft_has = NULL, mc->soft_cap = 0;
        DFM_TRY(dmalloc((void **)&mc->soft_ids, rows * S * sizeof(int), "soft target ids", &mc->mem.staging));
        DFM_TRY(dmalloc((void **)&mc->soft_p, rows * S * sizeof(float), "soft target probabilities", &mc->mem.staging));
        DFM_TRY(dmalloc((void **)&mc->soft_w, rows * sizeof(float), "soft target row weights", &mc->mem.staging));
        DFM_TRY(dmalloc((void **)&mc->soft_has, rows, "soft target rows", &mc->mem.staging));
        mc->soft_cap = S;
    }
    // from the caller's (pageable) arrays, which live until the forward returns; the CE synchronises before that
    cudaStream_t st = mc->ctx.stream;
    CUDA_CHECK(cudaMemcpyAsync(mc->soft_ids, hs->ids, (size_t)N * S * sizeof(int), cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaMemcpyAsync(mc->soft_p, hs->p, (size_t)N * S * sizeof(float), cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaMemcpyAsync(mc->soft_has, hs->has, (size_t)N, cudaMemcpyHostToDevice, st));
    if (hs->row_w) CUDA_CHECK(cudaMemcpyAsync(mc->soft_w, hs->row_w, (size_t)N * sizeof(float), cudaMemcpyHostToDevice, st));
    mc->soft = CeSoft{mc->soft_ids, mc->soft_p, mc->soft_has, hs->row_w ? mc->soft_w : NULL, S, hs->weight, 0.0, 0.0, 0};
    return DFM_OK;
}

static int forward_cuda_impl(DfmModelCuda *mc, const int *inputs, const int *targets, const float *tgt_mem,
                             const uint8_t *tgt_mask, int B, int T, int mem_mode, int train, float grad_scale) {
    DfmModel *h = mc->host, *m = &mc->d;
    const BackboneConfig *bc = &h->bc;
    const DfmConfig *dc = &h->dc;
    OpsCudaContext *ctx = &mc->ctx;
    cudaStream_t st = ctx->stream;
    if (!dc->enabled) mem_mode = MEM_NONE;
    if (train && dc->enabled && mem_mode == MEM_NONE)
        return DFM_FAIL(DFM_EARG, "a training forward must fuse memory (predicted, target or mixed)");
    if (inputs && mc->stage_count)  // batches are consumed in order: this one would take the staged one's place
        return DFM_FAIL(DFM_EARG, "model_forward_cuda with inputs while a batch is staged: forward that one first");
    if (inputs) DFM_TRY(model_cuda_stage(mc, inputs, targets, tgt_mem, tgt_mask, B, T));
    if ((mem_mode == MEM_TARGET || mem_mode == MEM_MIXED) && !mc->stage[mc->stage_head].have_t)
        return DFM_FAIL(DFM_EARG, "target-memory forward needs target slots and mask. HINT: --targets");
    DFM_TRY(consume_stage(mc, B, T));
    int V = bc->vocab_size, C = bc->dec.hidden, NL = bc->dec.n_layers, N = B * T;
    int denom = h->n_valid ? h->n_valid : 1;
    h->B = m->B = B;
    h->T = m->T = T;
    h->mem_mode = m->mem_mode = mem_mode;
    h->mse = h->cos = 0.0;
    size_t NCs = (size_t)N * C;

    if (mc->frozen16) DFM_TRY(embedding_forward_w16_cuda(m->x_layer_in, m->inputs, mc->wte16, N, C, st));
    else DFM_TRY(embedding_forward_cuda(m->x_layer_in, m->inputs, m->bb.wte, N, C, st));
    for (int l = 0; l < NL; l++) {
        int f = model_fusion_after(m, l);
        float *in = m->x_layer_in + (size_t)l * NCs, *next = m->x_layer_in + (size_t)(l + 1) * NCs;
        float *dst = f >= 0 ? m->x_fuse_in + (size_t)f * m->maxB * m->maxT * C : next;
        DFM_TRY(stack_layer_forward_cuda(&bc->dec, &m->bb.dec, mc->frozen16 ? &mc->dec16 : NULL, &m->dec_acts, l, dst,
                                         in, m->tmp, B, T, m->rope_cos, m->rope_sin, mc->flash, ctx));
        if (f >= 0) {
            if (f == 0) DFM_TRY(prepare_memory_cuda(mc, B, T, mem_mode));
            if (mem_mode == MEM_NONE)
                CUDA_CHECK(cudaMemcpyAsync(next, dst, NCs * sizeof(float), cudaMemcpyDeviceToDevice, st));
            else DFM_TRY(fusion_forward_cuda(mc, f, next, dst));
        }
    }
    float *x_final = m->x_layer_in + (size_t)NL * NCs;
    DFM_TRY(rmsnorm_forward_cuda(m->lnf_out, m->lnf_rstd, x_final, m->bb.lnf, N, C, bc->dec.eps, st));
    double ce_sum = 0.0;
    float *dx = NULL, *dhead = NULL;
    float dloss = 0.0f;
    if (train) {
        h->grad_scale = m->grad_scale = grad_scale;
        DFM_TRY(vec_zero_cuda(m->d_x2, NCs, st));
        dx = m->d_x2;
        dhead = dc->enabled ? NULL : m->bb_grad.lm_head;
        dloss = grad_scale / denom;
    }
    CeSoft *soft = NULL;  // a training forward's soft targets (model_forward: the plain CE otherwise)
    if (train && h->soft) {
        DFM_TRY(upload_soft_targets(mc, h->soft, N, V));
        soft = &mc->soft;
    }
    if (mc->frozen16)
        DFM_TRY(lmhead_ce_soft_forward_backward_w16_cuda(&ce_sum, m->row_losses, m->row_top1, dx, m->lnf_out,
                                                         mc->lm_head16, m->targets, N, C, V, dloss, m->ce_scratch,
                                                         soft, ctx));
    else
        DFM_TRY(lmhead_ce_soft_forward_backward_cuda(&ce_sum, m->row_losses, m->row_top1, dx, dhead, m->lnf_out,
                                                     m->bb.lm_head, m->targets, N, C, V, dloss, m->ce_scratch, soft,
                                                     ctx));
    if (soft)  // the outputs in the caller's struct, as on the CPU
        h->soft->kl_sum = soft->kl_sum, h->soft->wce_sum = soft->wce_sum, h->soft->n_teacher = soft->n_teacher;
    if (h->have_targets) {  // mean cosine over valid slots (invalid ones are 0: adding them changes nothing)
        size_t S = (size_t)B * (T / dc->chunk_len) * dc->n_slots;
        // the CE above synchronised the stream: the cosines copied in prepare_memory_cuda are here
        double cs = 0.0;
        for (size_t s = 0; s < S; s++) cs += mc->cos_host[s];
        h->cos = mc->n_tvalid ? cs / mc->n_tvalid : 0.0;
    }
    model_set_losses(h, ce_sum, denom, soft ? h->soft : NULL);
    m->have_targets = h->have_targets;
    return DFM_OK;
}

extern "C" int model_forward_cuda(DfmModelCuda *mc, const int *inputs, const int *targets, const float *tgt_mem,
                                  const uint8_t *tgt_mask, int B, int T, int mem_mode, int train, float grad_scale) {
    int rc = forward_cuda_impl(mc, inputs, targets, tgt_mem, tgt_mask, B, T, mem_mode, train, grad_scale);
    mc->host->soft = NULL;  // soft targets serve one forward, whatever its outcome (model_forward)
    return rc;
}

extern "C" int model_backward_cuda(DfmModelCuda *mc) {
    DfmModel *m = &mc->d;
    const BackboneConfig *bc = &m->bc;
    const DfmConfig *dc = &m->dc;
    OpsCudaContext *ctx = &mc->ctx;
    cudaStream_t st = ctx->stream;
    int B = m->B, T = m->T, N = B * T, C = bc->dec.hidden, NL = bc->dec.n_layers;
    size_t NCs = (size_t)N * C;
    int pretrain = !dc->enabled;
    BackboneParams *bg = pretrain ? &m->bb_grad : NULL;
    const StackMats16 *w16 = mc->frozen16 ? &mc->dec16 : NULL;
    float *d = m->d_x, *other = m->d_x2;
    DFM_TRY(vec_zero_cuda(d, NCs, st));
    DFM_TRY(rmsnorm_backward_cuda(d, bg ? bg->lnf : NULL, m->d_x2, m->x_layer_in + (size_t)NL * NCs, m->bb.lnf,
                                  m->lnf_rstd, N, C, st));
    int S = 0;
    if (dc->enabled) {
        S = B * (T / dc->chunk_len) * dc->n_slots;
        DFM_TRY(vec_zero_cuda(m->d_mem, (size_t)S * C, st));
    }
    int lowest = pretrain ? 0 : dc->fusion_layers[0];
    for (int l = NL - 1; l >= lowest; l--) {
        int f = model_fusion_after(m, l);
        if (f >= 0) {
            DFM_TRY(vec_zero_cuda(other, NCs, st));
            DFM_TRY(fusion_backward_cuda(mc, f, other, d, m->x_fuse_in + (size_t)f * m->maxB * m->maxT * C));
            float *t = d;
            d = other;
            other = t;
            if (l == lowest) break;
        }
        DFM_TRY(vec_zero_cuda(other, NCs, st));
        DFM_TRY(stack_layer_backward_cuda(&bc->dec, &m->bb.dec, w16, bg ? &bg->dec : NULL, &m->dec_acts, &m->dec_scr,
                                          l, other, d, m->x_layer_in + (size_t)l * NCs, B, T, m->rope_cos, m->rope_sin,
                                          mc->flash, ctx));
        float *t = d;
        d = other;
        other = t;
    }
    if (pretrain) return embedding_backward_cuda(bg->wte, d, m->inputs, N, C, st);
    DFM_TRY(vec_zero_cuda(m->d_slots, (size_t)S * dc->d_mem, st));
    DFM_TRY(projector_backward_cuda(mc, S));
    if (mc->n_target_chunks) {  // chunks that fused their target pass nothing to the predictor this way
        size_t n = (size_t)S * dc->d_mem;
        zero_target_chunks_kernel<<<blocks_for(n, 256), 256, 0, st>>>(m->d_slots, m->mem_src,
                                                                      (size_t)dc->n_slots * dc->d_mem, n);
        LAUNCH_CHECK("zero_target_chunks_kernel");
    }
    if (m->have_targets) {
        double unused;
        DFM_TRY(mse_forward_backward_cuda(&unused, m->d_slots, m->slots, m->tgt_mem, m->tgt_mask, S, dc->d_mem,
                                          (float)(dc->mse_weight * model_pred_loss_scale(dc) * m->grad_scale), ctx));
    }
    return predictor_backward_cuda(mc, B, T);
}
