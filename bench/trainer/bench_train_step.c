/* bench_train_step.c — dfm-train's CPU training step, timed step by step in CPU-seconds and wall time, with
 * everything a PyTorch peer needs to run the same steps (bench/trainer/train_torch_peer.py): the initial weights,
 * the batches and the optimiser settings. Run by bench/trainer/bench_train.sh.
 *
 *   bench_train_step pretrain DATA OUT STEPS B T LAYERS HIDDEN HEADS KV VOCAB THREADS
 *   bench_train_step dfm DATA OUT STEPS B T BACKBONE TARGETS L FUSION PRED_HIDDEN THREADS [PRED_INPUT_LAYER]
 *
 * pretrain: a Qwen3 decoder (QK-norm, tied head, FFN 3C, RoPE theta 1e4, as `dfm-train pretrain`) from
 * seed 1, every weight trainable. dfm: the DFM modules (defaults of `dfm-train train`, predictor of width
 * PRED_HIDDEN, fusion after the layers in FUSION, e.g. "1,3", the predictor reading the input embeddings or, with
 * PRED_INPUT_LAYER k > 0, the hidden states after layer k-1, as --pred-input-layer) on the frozen backbone
 * folder BACKBONE with the targets (a file or a run folder, as --targets) TARGETS; teacher forcing mixed:0.5 as `dfm-train train` (chunk sources drawn per step and
 * recorded for the peer). Batch s is sequences s*B .. s*B+B-1 (mod the count), in order.
 * A step is the engine's zero_grad, forward, backward, gradient norm, clipping to 1 and AdamW (lr 1e-3,
 * betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices), as train_loop.c's, at a constant lr.
 *
 * OUT/steps.jsonl   one line a step: loss, ce, mse, grad_norm, cpu_s (CLOCK_PROCESS_CPUTIME_ID), wall_s
 * OUT/bench.json    shapes and optimiser settings for the peer
 * OUT/init/         pretrain: the initial backbone (Hugging Face folder)
 * OUT/init_modules.safetensors   dfm: the initial DFM modules
 * OUT/batches.bin   per step: int32 inputs[B*T], int32 targets[B*T]; dfm adds float32 tmem[S*d],
 *                   uint8 tmask[S], uint8 mem_src[B*NC] (1 = the chunk fuses its target), S = B*NC*K
 *
 * Built by `make bench-programs` (build/bench/bench_train_step). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/blas_core.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "trainer/data/data.h"
#include "trainer/run/engine.h"
#include "trainer/lm/hf_model.h"
#include "trainer/model/model.h"
#include "trainer/model/model_config.h"
#include "trainer/run/train_opts.h"

static double clk(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int fail(int rc) {
    fprintf(stderr, "bench_train_step: %s\n", dfm_last_error()[0] ? dfm_last_error() : dfm_strerror(rc));
    return 1;
}

int main(int argc, char **argv) {
    int dfm = (argc == 13 || argc == 14) && !strcmp(argv[1], "dfm");
    if (!(dfm || (argc == 13 && !strcmp(argv[1], "pretrain")))) {
        fprintf(stderr, "usage: bench_train_step pretrain DATA OUT STEPS B T LAYERS HIDDEN HEADS KV VOCAB THREADS\n"
                        "       bench_train_step dfm DATA OUT STEPS B T BACKBONE TARGETS L FUSION PRED_HIDDEN THREADS "
                        "[PRED_INPUT_LAYER]\n");
        return 2;
    }
    /* as dfm-train's main: OpenBLAS's kernels for this CPU, passive OpenMP waiting (common/blas_core.h) */
    int reexec = dfm_blas_core_env();
    if (!getenv("OMP_WAIT_POLICY")) reexec = !setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    if (reexec) dfm_reexec_self(argv);
    dfm_log_init(DFM_LOG_WARN);
    const char *data = argv[2], *out = argv[3];
    int steps = atoi(argv[4]), B = atoi(argv[5]), T = atoi(argv[6]), threads = atoi(argv[12]);
    train_set_threads(threads);
    int rc = dfm_mkdir_p(out);
    if (rc) return fail(rc);

    BackboneConfig bc;
    DfmConfig dc;
    memset(&bc, 0, sizeof bc);
    memset(&dc, 0, sizeof dc);
    DataSet ds;
    if ((rc = data_open(data, T, &ds))) return fail(rc);
    if (!dfm) {
        int C = atoi(argv[8]), nh = atoi(argv[9]);
        snprintf(bc.arch, sizeof bc.arch, "Qwen3ForCausalLM");
        bc.vocab_size = atoi(argv[11]);
        bc.max_seq = T;
        bc.tie_embeddings = 1;
        bc.dec = (StackConfig){.n_layers = atoi(argv[7]), .hidden = C, .n_heads = nh, .n_kv_heads = atoi(argv[10]),
                               .head_dim = C / nh, .ffn = 3 * C, .qk_norm = 1, .eps = 1e-6f, .rope_theta = 10000.0f};
    } else {
        if ((rc = hf_read_config(argv[7], &bc))) return fail(rc);
        bc.max_seq = T;
        int L = atoi(argv[9]), P = atoi(argv[11]);
        if ((rc = data_open_targets(&ds, argv[8], NULL, L, 0, 0))) return fail(rc);
        dfm_config_defaults(&dc, &bc);
        dc.chunk_len = L;
        dc.n_slots = ds.K;
        dc.d_mem = ds.d;
        dc.pred.hidden = P;
        dc.pred.n_heads = dc.pred.n_kv_heads = P >= 64 ? P / 64 : 1;
        dc.pred.head_dim = P / dc.pred.n_heads;
        dc.pred.ffn = 4 * P;
        if ((rc = dfm_parse_fusion_layers(argv[10], &dc))) return fail(rc);
        dc.pred_input_layer = argc == 14 ? atoi(argv[13]) : 0; /* checked by model_config_check */
    }
    if ((rc = model_config_check(&bc, &dc))) return fail(rc);
    DfmModel *m;
    if ((rc = model_create(&bc, &dc, B, T, &m))) return fail(rc);
    char path[4096];
    if (!dfm) {
        model_init_backbone_random(m, 1);
        snprintf(path, sizeof path, "%s/init", out);
        rc = hf_save_backbone(m, path);
    } else {
        rc = hf_load_backbone(m, argv[7]);
        if (!rc) {
            model_init_dfm_random(m, 1);
            snprintf(path, sizeof path, "%s/init_modules.safetensors", out);
            rc = dfm_modules_save(m, path);
        }
    }
    if (rc) return fail(rc);

    dfm_mpi mp;
    memset(&mp, 0, sizeof mp);
    mp.size = 1;
    EngineOptions eo = {0, -1, 0, -1};
    Engine *en;
    if ((rc = engine_create(m, &eo, &mp, &en))) return fail(rc);
    AdamWConfig ac = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
    const float clip = 1.0f;
    int L = dfm ? dc.chunk_len : T, NC = T / L, K = dc.n_slots, d = dc.d_mem;
    size_t N = (size_t)B * T, S = (size_t)B * NC * K;
    int *inp = malloc(N * sizeof(int)), *tgt = malloc(N * sizeof(int));
    float *tmem = dfm ? malloc(S * d * sizeof(float)) : NULL;
    uint8_t *tmask = dfm ? malloc(S) : NULL, *mix = dfm ? malloc((size_t)B * NC) : NULL;
    size_t *idx = malloc((size_t)B * sizeof(size_t));
    snprintf(path, sizeof path, "%s/bench.json", out);
    FILE *fj = fopen(path, "w");
    snprintf(path, sizeof path, "%s/batches.bin", out);
    FILE *fb = fopen(path, "wb");
    snprintf(path, sizeof path, "%s/steps.jsonl", out);
    FILE *fs = fopen(path, "w");
    if (!inp || !tgt || !idx || (dfm && (!tmem || !tmask || !mix)) || !fj || !fb || !fs)
        return fail(DFM_FAIL(DFM_EIO, "buffers or output files in %s", out));
    fprintf(fj,
            "{\"mode\": \"%s\", \"steps\": %d, \"B\": %d, \"T\": %d, \"threads\": %d, \"lr\": %g, \"beta1\": %g, "
            "\"beta2\": %g, \"eps\": %g, \"weight_decay\": %g, \"clip\": %g, \"backbone\": \"%s\", \"K\": %d, "
            "\"d\": %d, \"chunk_len\": %d, \"mem\": \"%s\"}\n",
            argv[1], steps, B, T, threads, (double)ac.lr, (double)ac.beta1, (double)ac.beta2, (double)ac.eps,
            (double)ac.weight_decay, (double)clip, dfm ? argv[7] : "", K, d, L, dfm ? "mixed:0.5" : "none");
    fclose(fj);

    for (int s = 0; s < steps && !rc; s++) {
        for (int b = 0; b < B; b++) idx[b] = ((size_t)s * B + b) % ds.n_seq;
        if ((rc = data_batch(&ds, idx, B, L, inp, tgt, tmem, tmask))) break;
        int mode = MEM_NONE;
        if (dfm) { /* train_loop.c's draw, with its default --seed 1 */
            model_memory_mix_draw(mix, idx, B, NC, 0.5, 1ull * 0x9E3779B97F4A7C15ull + (uint64_t)s);
            if ((rc = model_set_memory_mix(m, mix, B * NC))) break;
            mode = MEM_MIXED;
        }
        fwrite(inp, sizeof(int), N, fb);
        fwrite(tgt, sizeof(int), N, fb);
        if (dfm) {
            fwrite(tmem, sizeof(float), S * d, fb);
            fwrite(tmask, 1, S, fb);
            fwrite(mix, 1, (size_t)B * NC, fb);
        }
        double c0 = clk(CLOCK_PROCESS_CPUTIME_ID), w0 = clk(CLOCK_MONOTONIC), gn = 0;
        rc = engine_zero_grad(en);
        if (!rc) rc = engine_forward(en, inp, tgt, tmem, tmask, B, T, mode, 1, 1.0f);
        if (!rc) rc = engine_backward(en);
        if (!rc) rc = engine_grad_norm(en, &gn);
        if (!rc && gn > clip) rc = engine_grad_scale(en, (float)(clip / gn));
        if (!rc) rc = engine_adamw(en, &ac, s + 1);
        double c1 = clk(CLOCK_PROCESS_CPUTIME_ID), w1 = clk(CLOCK_MONOTONIC);
        fprintf(fs, "{\"step\": %d, \"loss\": %.7f, \"ce\": %.7f, \"mse\": %.7f, \"grad_norm\": %.6f, \"cpu_s\": %.6f, "
                    "\"wall_s\": %.6f}\n", s + 1, m->loss, m->ce, m->mse, gn, c1 - c0, w1 - w0);
    }
    if (rc) return fail(rc);
    if (fclose(fb) || fclose(fs)) return fail(DFM_FAIL(DFM_EIO, "writing %s", out));
    engine_free(en);
    model_free(m);
    data_close(&ds);
    free(inp), free(tgt), free(tmem), free(tmask), free(mix), free(idx);
    return 0;
}
