// model_cuda_check.cu — whole training steps of the CUDA model (model_cuda.h) against the CPU model
// (model.h): loss terms, every trainable gradient tensor, evaluation modes, AdamW steps, determinism.
//
// A separate program (its body exists only with -DDFM_MODEL_CUDA_CHECK_MAIN, so the Makefile's
// trainer/*/*.cu glob compiles it to nothing), built by tests/gpu/gpu_check_trainer.sh for a GPU and by
// tests/py/cuda/test_train_cuda_model_emu.py against the host emulation of CUDA (no GPU: CI).
// Variants: DFM with per-head and per-channel gates (Qwen3 and Llama backbones, predictor fed from a
// hidden layer, first chunk fused), pretraining with tied and untied heads; each with the reference
// attention and with flash attention; DFM with the frozen backbone in bf16; soft targets (--teacher: the KL
// toward a teacher's distribution and row weights, CeSoft set on the host model) in fp32 and with the bf16 backbone.
// Per tensor: rel = max|gpu - cpu| / max|cpu| and the cosine between the two gradient tensors.
// Bounds: fp32 rel <= 1e-4 for gradients and 1e-5 (relative) for the loss terms; bf16 (GEMM operands
// and frozen weights rounded to bf16) rel <= 5e-2 and cosine >= 0.999 for gradients, 1e-2 for losses.
// A value that is not finite (a gradient, a loss, a parameter after AdamW) fails every bound
// (tests/cuda/check_compare.h).
// Exit 0 pass, 1 a bound failed, 2 no GPU or a CUDA error.
#ifdef DFM_MODEL_CUDA_CHECK_MAIN

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

extern "C" {
#include "common/error.h"
#include "trainer/kernels/adamw.h"
#include "trainer/model/model.h"
#include "trainer/kernels/rng.h"
}
#include "trainer/model/model_cuda.h"
#include "trainer/kernels/ops_cuda.h"
#include "tests/cuda/check_common.h"

static int g_fail = 0, g_checks = 0;
static double g_worst[2] = {0, 0};  // fp32, bf16 gradient rel


struct Variant {
    const char *name;
    int dfm, qwen3, tied, per_channel, fuse_first, pred_input_layer, flash, bf16;
    int quick;  // in the quick set (MODEL_CHECK_SET=quick: CI's emulated run, which is slow)
    int content_only;  // DfmConfig.content_only (the projector's biases held at 0) and centred memory
    int soft;          // soft targets (model_set_soft_targets) before every training forward, CPU and GPU
    int pred_tail;     // DfmConfig.pred_input_tokens (0: the predictor reads the whole previous chunk) and, when
                       // set, DfmConfig.pred_skip (the linear path from the pooled input to the slots)
};

static void check_scalar(const char *v, const char *what, double gpu, double cpu, double tol) {
    double r = check_scalar_rel(gpu, cpu, 1e-6);  // INFINITY if either is not finite
    int ok = r <= tol;
    g_checks++;
    if (!ok) g_fail++;
    printf("%-4s %-34s %-22s gpu %.8f cpu %.8f rel %.2e (bound %.0e)\n", ok ? "PASS" : "FAIL", v, what, gpu, cpu, r, tol);
}

// gradients: every named trainable tensor of the host model, the GPU's taken at the same offsets
static void check_grads(const Variant *va, DfmModel *h, const float *gpu_grads, const char *tag) {
    int n = h->dc.enabled ? model_dfm_tensors(h, NULL, 1) : model_backbone_tensors(h, NULL, 1);
    std::vector<TensorView> v(n);
    if (h->dc.enabled) model_dfm_tensors(h, v.data(), 1);
    else model_backbone_tensors(h, v.data(), 1);
    double tol = va->bf16 ? 5e-2 : 1e-4, worst = 0;
    const char *worst_name = "";
    int bad = 0;
    for (int i = 0; i < n; i++) {
        if (!v[i].data) continue;
        if (!h->dc.enabled && h->bc.tie_embeddings && !strcmp(v[i].name, "lm_head.weight")) continue;
        size_t off = (size_t)(v[i].data - h->grad_memory);
        // every non-finite value fails, in fp32 and bf16 alike (rel is then INFINITY, the cosine NaN)
        check_diff d = check_compare(gpu_grads + off, v[i].data, v[i].numel);
        double r = d.rel, cs = d.cosine;
        int ok = r <= tol && (!va->bf16 || cs >= 0.999);
        g_checks++;
        if (!ok) {
            g_fail++;
            bad++;
            printf("FAIL %-34s %-40s rel %.2e cos %.6f (bound %.0e)%s\n", va->name, v[i].name, r, cs, tol,
                   d.nonfinite ? ": VALUES NOT FINITE" : "");
        }
        if (!(r <= worst)) worst = r, worst_name = v[i].name;
    }
    if (!(worst <= g_worst[va->bf16])) g_worst[va->bf16] = worst;
    printf("%-4s %-34s %s: %d gradient tensors, worst rel %.2e (%s)\n", bad ? "FAIL" : "PASS", va->name, tag, n, worst,
           worst_name);
}

static int run_variant(const Variant *va) {
    BackboneConfig bc;
    memset(&bc, 0, sizeof bc);
    snprintf(bc.arch, sizeof bc.arch, "%s", va->qwen3 ? "Qwen3ForCausalLM" : "LlamaForCausalLM");
    const int B = 2, T = 64, L = 16;
    bc.vocab_size = 96;
    bc.max_seq = T;
    bc.tie_embeddings = va->tied;
    bc.dec = StackConfig{3, 32, 4, 2, 8, 48, va->qwen3, 1e-6f, 10000.0f};
    DfmConfig dc;
    memset(&dc, 0, sizeof dc);
    if (va->dfm) {
        dfm_config_defaults(&dc, &bc);
        dc.chunk_len = L;
        dc.n_slots = 4;
        dc.d_mem = 24;
        dc.pred = StackConfig{2, 32, 2, 1, 16, 64, 0, 1e-6f, 10000.0f};
        dc.proj_hidden = 40;
        dc.n_fusion = 2;
        dc.fusion_layers[0] = 1;
        dc.fusion_layers[1] = 2;
        dc.xattn_heads = 4;
        dc.gate_per_channel = va->per_channel;
        dc.fuse_first_chunk = va->fuse_first;
        dc.pred_input_layer = va->pred_input_layer;
        dc.pred_input_tokens = va->pred_tail;
        dc.pred_skip = va->pred_tail != 0;
        dc.mem_align = va->per_channel ? MEM_ALIGN_SAME : MEM_ALIGN_NEXT;  // both alignments covered
        dc.pred_loss = va->per_channel ? PRED_LOSS_MSE_ELEM : PRED_LOSS_MSE;  // both loss scales
        dc.mse_weight = 0.7f;
        dc.content_only = va->content_only;
        if (va->content_only) {  // with centred memory (--centre-memory): the device subtracts the same centre
            dc.n_centre = dc.d_mem;
            for (int i = 0; i < dc.d_mem; i++) dc.mem_centre[i] = 0.1f * (float)((i * 7) % 11 - 5);
        }
    }
    DfmModel *h = NULL;
    GT(model_create(&bc, &dc, B, T, &h));
    model_init_backbone_random(h, 7);
    if (va->dfm) {
        model_init_dfm_random(h, 11);
        dfm_rng r;
        rng_seed(&r, 99);
        std::vector<float> noise(h->dfm_num);
        rng_normal(&r, noise.data(), noise.size(), 0.05f);  // non-zero gates, norms off 1
        for (size_t i = 0; i < h->dfm_num; i++) h->dfm_memory[i] += noise[i];
        model_content_only_apply(h);  // (content_only variants: the noisy biases back to 0)
    }
    // a batch: some targets -1 (padding), some target slots masked
    dfm_rng r;
    rng_seed(&r, 5);
    int N = B * T, NC = T / L, K = dc.n_slots, d = dc.d_mem;
    size_t S = va->dfm ? (size_t)B * NC * K : 0;
    std::vector<int> inp(N), tgt(N);
    for (int i = 0; i < N; i++) {
        inp[i] = (int)(rng_u32(&r) % bc.vocab_size);
        tgt[i] = (rng_u32(&r) % 10 == 0) ? -1 : (int)(rng_u32(&r) % bc.vocab_size);
    }
    std::vector<float> tmem(S * (d ? d : 1));
    std::vector<uint8_t> tmask(S ? S : 1);
    rng_normal(&r, tmem.data(), tmem.size(), 0.5f);
    for (size_t s = 0; s < S; s++) tmask[s] = ((s / K) % NC != 0) && (rng_u32(&r) % 5 != 0);
    const float *tm = va->dfm ? tmem.data() : NULL;
    const uint8_t *tk = va->dfm ? tmask.data() : NULL;
    // per-head DFM variants train with teacher forcing: every third chunk fuses its target memory (the CPU
    // and the GPU model read the draws from the host model)
    int mode = !va->dfm ? MEM_NONE : va->per_channel ? MEM_PREDICTED : MEM_MIXED;
    if (mode == MEM_MIXED) {
        std::vector<uint8_t> src((size_t)B * NC);
        for (size_t i = 0; i < src.size(); i++) src[i] = i % 3 == 1;
        GT(model_set_memory_mix(h, src.data(), B * NC));
    }
    double lt = va->bf16 ? 1e-2 : 1e-5;
    // soft targets: S distinct ids per row (one in each band of V / S), on two rows in three, a tail bucket (their
    // probabilities summing below 1) on most of them, row weights off 1, KL weight 0.6; set on the host model
    // before each training forward, which resets them (its own RNG: the batch above is every variant's)
    const int SS = 6, band = bc.vocab_size / SS;
    std::vector<int> sids((size_t)N * SS);
    std::vector<float> sp((size_t)N * SS), sw(N);
    std::vector<uint8_t> shas(N);
    dfm_rng rs;
    rng_seed(&rs, 23);
    for (int n = 0; n < N; n++) {
        shas[n] = n % 3 != 2;
        sw[n] = 0.5f + (float)(rng_u32(&rs) % 100) / 100.0f;
        double z = 0.0;
        for (int i = 0; i < SS; i++) {
            sids[(size_t)n * SS + i] = i * band + (int)(rng_u32(&rs) % band);
            sp[(size_t)n * SS + i] = 0.1f + (float)(rng_u32(&rs) % 100) / 100.0f;
            z += sp[(size_t)n * SS + i];
        }
        // the teacher's own probabilities: their rest of 1 is the tail bucket (ops.h), none on every fourth row
        double mass = n % 4 == 1 ? 1.0 : 0.5 + 0.45 * (double)(rng_u32(&rs) % 1000) / 1000.0;
        for (int i = 0; i < SS; i++) sp[(size_t)n * SS + i] = (float)(mass * sp[(size_t)n * SS + i] / z);
    }
    CeSoft soft = {sids.data(), sp.data(), shas.data(), sw.data(), SS, 0.6f, 0.0, 0.0, 0};
    auto set_soft = [&]() {
        if (va->soft) model_set_soft_targets(h, &soft);
    };

    // CPU: one training forward/backward (grad_scale 0.5), eval modes
    model_zero_grad(h);
    set_soft();
    GT(model_forward(h, inp.data(), tgt.data(), tm, tk, B, T, mode, 1, 0.5f));
    double c_loss = h->loss, c_ce = h->ce, c_mse = h->mse, c_cos = h->cos, c_kl = h->kl, c_wce = soft.wce_sum;
    long c_nt = h->n_teacher;
    GT(model_backward(h));
    std::vector<float> cpu_grads(h->grad_memory, h->grad_memory + h->grad_num);
    double c_none = 0, c_target = 0;
    if (va->dfm) {
        GT(model_forward(h, inp.data(), tgt.data(), tm, tk, B, T, MEM_NONE, 0, 1.0f));
        c_none = h->ce;
        GT(model_forward(h, inp.data(), tgt.data(), tm, tk, B, T, MEM_TARGET, 0, 1.0f));
        c_target = h->ce;
    }

    ModelCudaOptions o = {0, va->bf16, va->flash};
    DfmModelCuda *mc = NULL;
    GT(model_cuda_create(h, &o, &mc));
    const ModelCudaMemory *mm = model_cuda_memory(mc);
    if (va->flash && !mm->flash_decoder) printf("note %-34s flash attention not supported for this shape\n", va->name);
    std::vector<float> g1(h->grad_num), g2(h->grad_num);
    GT(model_zero_grad_cuda(mc));
    set_soft();
    soft.kl_sum = soft.wce_sum = 0.0, soft.n_teacher = 0, h->kl = 0.0, h->n_teacher = 0;
    GT(model_forward_cuda(mc, inp.data(), tgt.data(), tm, tk, B, T, mode, 1, 0.5f));
    check_scalar(va->name, "loss", h->loss, c_loss, lt);
    check_scalar(va->name, "ce", h->ce, c_ce, lt);
    if (va->soft) {  // the KL and the weighted CE are in the loss above; the rows they cover are counted exactly
        check_scalar(va->name, "kl (soft targets)", h->kl, c_kl, va->bf16 ? 5e-2 : 1e-5);
        check_scalar(va->name, "w*ce sum (soft targets)", soft.wce_sum, c_wce, lt);
        int ok = h->n_teacher == c_nt && soft.n_teacher == c_nt && c_nt > 0 && !h->soft;
        g_checks++;
        if (!ok) g_fail++;
        printf("%-4s %-34s soft targets: %ld rows with a teacher (cpu %ld), reset after the forward: %s\n",
               ok ? "PASS" : "FAIL", va->name, h->n_teacher, c_nt, h->soft ? "NO" : "yes");
    }
    if (va->dfm) {
        check_scalar(va->name, "mse", h->mse, c_mse, va->bf16 ? 5e-2 : 1e-5);
        check_scalar(va->name, "cos", h->cos, c_cos, va->bf16 ? 5e-2 : 1e-5);
    }
    GT(model_backward_cuda(mc));
    GT(model_cuda_download_grads(mc, g1.data()));
    // compare against the CPU's gradients (restore them in the host block for the named views)
    memcpy(h->grad_memory, cpu_grads.data(), cpu_grads.size() * sizeof(float));
    check_grads(va, h, g1.data(), "train step");

    // determinism and the staged path: stage first, then forward without inputs
    GT(model_zero_grad_cuda(mc));
    GT(model_cuda_stage(mc, inp.data(), tgt.data(), tm, tk, B, T));
    set_soft();
    GT(model_forward_cuda(mc, NULL, NULL, NULL, NULL, B, T, mode, 1, 0.5f));
    GT(model_backward_cuda(mc));
    GT(model_cuda_download_grads(mc, g2.data()));
    int same = !memcmp(g1.data(), g2.data(), g1.size() * sizeof(float));
    g_checks++;
    if (!same) g_fail++;
    printf("%-4s %-34s determinism: two steps (direct, staged) give %s gradients\n", same ? "PASS" : "FAIL", va->name,
           same ? "bit-identical" : "DIFFERENT");

    if (va->dfm) {  // evaluation modes
        GT(model_forward_cuda(mc, inp.data(), tgt.data(), tm, tk, B, T, MEM_NONE, 0, 1.0f));
        check_scalar(va->name, "ce fusion off", h->ce, c_none, lt);
        GT(model_forward_cuda(mc, inp.data(), tgt.data(), tm, tk, B, T, MEM_TARGET, 0, 1.0f));
        check_scalar(va->name, "ce target memory", h->ce, c_target, lt);
    }
    if (va->dfm) {  // the same tokens as more, shorter sequences (--reconstruct-weight's reading batches: B x T
                    // within maxB x maxT, B above maxB): a training step with target memory, both sides
        int B2 = B * T / (2 * L), T2 = 2 * L;
        model_zero_grad(h);
        GT(model_forward(h, inp.data(), tgt.data(), tm, tk, B2, T2, MEM_TARGET, 1, 0.5f));
        double r_loss = h->loss;
        GT(model_backward(h));
        std::vector<float> r_grads(h->grad_memory, h->grad_memory + h->grad_num);
        GT(model_zero_grad_cuda(mc));
        GT(model_forward_cuda(mc, inp.data(), tgt.data(), tm, tk, B2, T2, MEM_TARGET, 1, 0.5f));
        check_scalar(va->name, "loss of a 4 x 32 batch (model 2 x 64)", h->loss, r_loss, lt);
        GT(model_backward_cuda(mc));
        GT(model_cuda_download_grads(mc, g2.data()));
        memcpy(h->grad_memory, r_grads.data(), r_grads.size() * sizeof(float));
        check_grads(va, h, g2.data(), "4 x 32 batch");
    }

    // three AdamW steps on both sides from the same state, then the trainable parameters (with bf16 this also
    // checks that the GEMMs read the refreshed bf16 copy of the weights: a stale copy is far off)
    {
        size_t np;
        float *hp = model_trainable_params(h, &np);
        std::vector<float> p0(hp, hp + np), mh(np, 0.0f), vh(np, 0.0f);
        float *dp = model_cuda_trainable_params(mc, &np), *dg = model_cuda_trainable_grads(mc);
        OpsCudaContext *ctx = (OpsCudaContext *)model_cuda_context(mc);
        float *dm = NULL, *dv = NULL;
        if (cudaMalloc((void **)&dm, np * 4) != cudaSuccess || cudaMalloc((void **)&dv, np * 4) != cudaSuccess) return 2;
        // everything on the model's stream, which is non-blocking: plain cudaMemset/cudaMemcpy would not
        // be ordered against it
        cudaMemsetAsync(dm, 0, np * 4, ctx->stream);
        cudaMemsetAsync(dv, 0, np * 4, ctx->stream);
        AdamWConfig ac = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
        for (int t = 1; t <= 3; t++) {
            model_zero_grad(h);
            set_soft();
            GT(model_forward(h, inp.data(), tgt.data(), tm, tk, B, T, mode, 1, 1.0f));
            GT(model_backward(h));
            adamw_update(hp, h->grad_memory, mh.data(), vh.data(), NULL, np, &ac, t);
            GT(model_zero_grad_cuda(mc));
            set_soft();
            GT(model_forward_cuda(mc, inp.data(), tgt.data(), tm, tk, B, T, mode, 1, 1.0f));
            GT(model_backward_cuda(mc));
            GT(adamw_update_cuda(dp, dg, dm, dv, NULL, np, &ac, t, ctx->stream));
            GT(model_cuda_params_updated(mc));
        }
        // Adam's first steps are sign-like (m / sqrt(v) ~ +-1), so near-zero gradients whose rounding differs
        // move a parameter by up to 2 lr either way: compare what the steps did to the loss, and count such
        // parameters (a wrong update rule moves most of them)
        std::vector<float> hp_gpu(np);
        if (cudaStreamSynchronize(ctx->stream) != cudaSuccess ||
            cudaMemcpy(hp_gpu.data(), dp, np * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
            return 2;
        size_t off = 0, nonfinite = 0;  // a parameter that is not finite counts as off, and fails on its own
        for (size_t i = 0; i < np; i++) {
            off += !(fabs((double)hp_gpu[i] - hp[i]) <= 0.1 * ac.lr);
            nonfinite += !isfinite(hp_gpu[i]) || !isfinite(hp[i]);
        }
        double frac = (double)off / np;
        GT(model_forward(h, inp.data(), tgt.data(), tm, tk, B, T, mode, 0, 1.0f));
        double c_after = h->loss;
        GT(model_forward_cuda(mc, inp.data(), tgt.data(), tm, tk, B, T, mode, 0, 1.0f));
        check_scalar(va->name, "loss after 3 AdamW steps", h->loss, c_after, va->bf16 ? 1e-2 : 1e-4);
        // bf16 gradients flip the sign of more near-zero Adam steps: no bound on frac there
        int ok = nonfinite == 0 && (va->bf16 || frac <= 0.01);
        g_checks++;
        if (!ok) g_fail++;
        printf("%-4s %-34s 3 AdamW steps: %.3f%% of parameters differ by more than 0.1 lr (bound %s), %zu not finite "
               "(bound 0)\n", ok ? "PASS" : "FAIL", va->name, 100.0 * frac, va->bf16 ? "none in bf16" : "1%",
               nonfinite);
        cudaFree(dm);
        cudaFree(dv);
    }
    model_cuda_free(mc);
    model_free(h);
    return DFM_OK;
}

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        fprintf(stderr, "model_cuda_check: no CUDA device. HINT: run on a GPU machine (tests/gpu/gpu_check_trainer.sh)\n");
        printf("RESULT: NO GPU\n");
        return 2;
    }
    const Variant vs[] = {
        {"dfm qwen3 head-gate soft targets", 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1},
        {"dfm qwen3 head-gate flash", 1, 1, 1, 0, 0, 0, 1, 0, 1},
        {"dfm llama channel-gate first layer1 last-token skip", 1, 0, 0, 1, 1, 1, 0, 0, 1, 0, 0, 1},
        {"dfm llama channel-gate flash content-only", 1, 0, 0, 1, 1, 1, 1, 0, 0, 1},
        {"pretrain qwen3 tied", 0, 1, 1, 0, 0, 0, 0, 0, 1},
        {"pretrain llama untied flash", 0, 0, 0, 0, 0, 0, 1, 0, 1},
        {"dfm qwen3 bf16 backbone soft targets", 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 1},
        {"dfm qwen3 bf16 backbone flash", 1, 1, 1, 0, 0, 0, 1, 1, 1},
        {"pretrain qwen3 bf16", 0, 1, 1, 0, 0, 0, 1, 1, 1},
    };
    const char *only = getenv("MODEL_CHECK_ONLY");  // substring filter (debugging)
    const char *set = getenv("MODEL_CHECK_SET");
    int quick = set && !strcmp(set, "quick");
    for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) {
        if (only && !strstr(vs[i].name, only)) continue;
        if (quick && !vs[i].quick) continue;
        int rc = run_variant(&vs[i]);
        if (rc) {
            printf("RESULT: ERROR (%s)\n", vs[i].name);
            return 2;
        }
        fflush(stdout);
    }
    printf("worst gradient rel: fp32 %.2e, bf16 %.2e\n", g_worst[0], g_worst[1]);
    printf("%d checks, %d failed\nRESULT: %s\n", g_checks, g_fail, g_fail ? "FAIL" : "PASS");
    return g_fail ? 1 : 0;
}

#endif  // DFM_MODEL_CUDA_CHECK_MAIN
