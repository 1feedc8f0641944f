/* cmd_train.c — `dfm-train pretrain | train | eval | generate`: the training loop, evaluation and
 * greedy generation around model.h. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/mpiutil.h"
#include "common/opts.h"
#include "pipeline/tokenizer/tokenizer.h"
#include "trainer/adamw.h"
#include "trainer/checkpoint.h"
#include "trainer/commands.h"
#include "trainer/data.h"
#include "trainer/engine.h"
#include "trainer/flops.h"
#include "trainer/hf_model.h"
#include "trainer/model_config.h"
#include "trainer/prefetch.h"
#include "schemas/safetensors.h"

/* ---- options shared by the commands ----------------------------------------------------------------- */
typedef struct {
    char *data, *targets, *out, *resume, *log, *backbone, *modules, *arch, *fusion, *gate, *tokens_run;
    int64_t seq_len, batch, accum, steps, warmup, seed, val_seqs, eval_every, eval_batches, ckpt_every, threads;
    double lr, min_lr_frac, wd, clip, beta2;
    /* where it runs */
    char *device, *precision, *attention;
    int64_t gpu, prefetch, no_ckpt, loader_threads;
    double peak_tflops;
    /* pretrain shape */
    int64_t layers, hidden, heads, kv_heads, head_dim, ffn, vocab, untied;
    /* dfm shape */
    int64_t chunk_len, slots, d_mem, pred_layers, pred_hidden, pred_heads, proj_hidden, xattn_heads, fuse_first,
        pred_input_layer;
    double gate_bias, mse_weight, init_std;
} Opts;

#define O_COMMON(o)                                                                                          \
    {"data", DFM_OPT_STR, &(o)->data, NULL, "PATH", "tokens: llm.c .bin shard or a `dfm chunk` run folder", 0}, \
    {"out", DFM_OPT_STR, &(o)->out, "dfm-train-out", "DIR", "output folder (model, checkpoints, log)", 1},      \
    {"seq-len", DFM_OPT_INT, &(o)->seq_len, "128", "T", "tokens per training sequence", 0},                    \
    {"batch", DFM_OPT_INT, &(o)->batch, "4", "B", "sequences per micro-batch", 0},                             \
    {"accum", DFM_OPT_INT, &(o)->accum, "1", "N", "micro-batches per optimizer step", 0},                      \
    {"steps", DFM_OPT_INT, &(o)->steps, "100", "N", "optimizer steps", 0},                                     \
    {"lr", DFM_OPT_DOUBLE, &(o)->lr, "1e-3", "X", "peak learning rate", 0},                                    \
    {"min-lr-frac", DFM_OPT_DOUBLE, &(o)->min_lr_frac, "0.1", "X", "final lr as a fraction of the peak", 0},  \
    {"warmup", DFM_OPT_INT, &(o)->warmup, "10", "N", "linear warm-up steps", 0},                              \
    {"wd", DFM_OPT_DOUBLE, &(o)->wd, "0.1", "X", "AdamW weight decay (matrices only)", 0},                     \
    {"beta2", DFM_OPT_DOUBLE, &(o)->beta2, "0.95", "X", "AdamW beta2", 0},                                     \
    {"clip", DFM_OPT_DOUBLE, &(o)->clip, "1.0", "X", "gradient-norm clipping (0 = off)", 0},                   \
    {"seed", DFM_OPT_INT, &(o)->seed, "1", "N", "initialisation and shuffling seed", 0},                      \
    {"val-seqs", DFM_OPT_INT, &(o)->val_seqs, "0", "N", "held-out sequences at the end (0 = 5%, at least 1)", 0}, \
    {"eval-every", DFM_OPT_INT, &(o)->eval_every, "0", "N", "evaluate every N steps (0 = only at the end)", 0}, \
    {"eval-batches", DFM_OPT_INT, &(o)->eval_batches, "0", "N", "held-out batches per evaluation (0 = all)", 0}, \
    {"ckpt-every", DFM_OPT_INT, &(o)->ckpt_every, "0", "N", "write OUT/ckpt_STEP.bin every N steps", 0},      \
    {"resume", DFM_OPT_STR, &(o)->resume, NULL, "FILE", "continue from a checkpoint (bit-identical)", 0},     \
    {"log", DFM_OPT_STR, &(o)->log, NULL, "FILE", "JSONL log (default OUT/log.jsonl)", 1},                     \
    {"threads", DFM_OPT_INT, &(o)->threads, "0", "N", "OpenMP/BLAS threads (0 = default)", 1},               \
    {"device", DFM_OPT_STR, &(o)->device, "cpu", "DEV", "cpu (fp32 reference) or cuda (needs a CUDA build)", 1}, \
    {"precision", DFM_OPT_STR, &(o)->precision, "bf16", "P", "cuda: bf16 (bf16 GEMMs; frozen backbone held in bf16) or fp32", 1}, \
    {"gpu", DFM_OPT_INT, &(o)->gpu, "-1", "N", "cuda: device index (-1 = node-local rank mod visible GPUs)", 1}, \
    {"attention", DFM_OPT_STR, &(o)->attention, "auto", "KIND", "cuda: flash (no T x T matrix, fp32), reference (T x T kept, cuBLAS GEMMs) or auto (reference while it fits)", 1}, \
    {"prefetch", DFM_OPT_INT, &(o)->prefetch, "6", "N", "micro-batches read ahead by the loader threads (>= 2)", 1}, \
    {"loader-threads", DFM_OPT_INT, &(o)->loader_threads, "0", "N", "threads reading batches (0 = 1 on the CPU, 4 with cuda)", 1}, \
    {"no-ckpt", DFM_OPT_FLAG, &(o)->no_ckpt, NULL, NULL, "write no checkpoint, not even the final one (benchmarks)", 1}, \
    {"peak-tflops", DFM_OPT_DOUBLE, &(o)->peak_tflops, "0", "X", "peak FLOP/s for MFU (0 = H100/H200 SXM: 989.4 bf16, 66.9 fp32; CPU: none)", 1}

#define O_DFM(o)                                                                                              \
    {"chunk-len", DFM_OPT_INT, &(o)->chunk_len, "32", "L", "tokens per chunk", 0},                            \
    {"slots", DFM_OPT_INT, &(o)->slots, "0", "K", "memory slots per chunk (0 = the targets')", 0},            \
    {"d-mem", DFM_OPT_INT, &(o)->d_mem, "0", "D", "memory dimension (0 = the targets')", 0},                  \
    {"pred-layers", DFM_OPT_INT, &(o)->pred_layers, "2", "N", "predictor Transformer layers", 0},            \
    {"pred-hidden", DFM_OPT_INT, &(o)->pred_hidden, "0", "P", "predictor width (0 = min(C, 256))", 0},       \
    {"pred-input-layer", DFM_OPT_INT, &(o)->pred_input_layer, "0", "K", "predictor input: mean of the input embeddings (0) or of the hidden states after decoder layer K-1 (K <= first fusion layer)", 0}, \
    {"pred-heads", DFM_OPT_INT, &(o)->pred_heads, "0", "N", "predictor heads (0 = P / 64, at least 1)", 0},  \
    {"proj-hidden", DFM_OPT_INT, &(o)->proj_hidden, "0", "H", "projector hidden width (0 = 2C)", 0},         \
    {"fusion-layers", DFM_OPT_STR, &(o)->fusion, NULL, "LIST", "0-based decoder layers followed by a fusion block (default scaled from 9,16,24,31 of 32)", 0}, \
    {"xattn-heads", DFM_OPT_INT, &(o)->xattn_heads, "0", "N", "cross-attention heads (0 = the decoder's)", 0}, \
    {"gate", DFM_OPT_STR, &(o)->gate, "head", "KIND", "fusion gate per head or per channel", 0},             \
    {"gate-bias", DFM_OPT_DOUBLE, &(o)->gate_bias, "0", "X", "initial gate bias (paper: 0 is best)", 0},      \
    {"mse-weight", DFM_OPT_DOUBLE, &(o)->mse_weight, "1.0", "X", "weight of the slot MSE in the loss", 0},    \
    {"fuse-first-chunk", DFM_OPT_FLAG, &(o)->fuse_first, NULL, NULL, "also fuse the placeholder-based memory into chunk 0", 0}, \
    {"init-std", DFM_OPT_DOUBLE, &(o)->init_std, "0.02", "X", "std of the DFM modules' initial weights", 0}

void openblas_set_num_threads(int n); /* cblas.h of some OpenBLAS builds lacks the prototype */

static void set_threads(int64_t n) {
    if (n <= 0) return;
    omp_set_num_threads((int)n);
    openblas_set_num_threads((int)n);
}

static json_t *opts_json(const Opts *o) {
    return json_pack("{s:I, s:I, s:I, s:I, s:f, s:f, s:I, s:f, s:f, s:f, s:I, s:I}", "seq_len", (json_int_t)o->seq_len,
                     "batch", (json_int_t)o->batch, "accum", (json_int_t)o->accum, "steps", (json_int_t)o->steps, "lr",
                     o->lr, "min_lr_frac", o->min_lr_frac, "warmup", (json_int_t)o->warmup, "wd", o->wd, "clip", o->clip,
                     "beta2", o->beta2, "seed", (json_int_t)o->seed, "val_seqs", (json_int_t)o->val_seqs);
}

/* Build the DFM config from flags given the backbone and (optional) targets' K, d. */
static int dfm_config_from_opts(const Opts *o, const BackboneConfig *bc, int K, int d, DfmConfig *dc) {
    dfm_config_defaults(dc, bc);
    dc->chunk_len = (int)o->chunk_len;
    if (o->slots > 0) dc->n_slots = (int)o->slots;
    else if (K > 0) dc->n_slots = K;
    if (o->d_mem > 0) dc->d_mem = (int)o->d_mem;
    else if (d > 0) dc->d_mem = d;
    int P = o->pred_hidden > 0 ? (int)o->pred_hidden : dc->pred.hidden;
    int ph = o->pred_heads > 0 ? (int)o->pred_heads : (P >= 64 ? P / 64 : 1);
    if (P % ph) return DFM_FAIL(DFM_EARG, "--pred-heads %d must divide --pred-hidden %d", ph, P);
    dc->pred.hidden = P;
    dc->pred.n_heads = dc->pred.n_kv_heads = ph;
    dc->pred.head_dim = P / ph;
    dc->pred.ffn = 4 * P;
    dc->pred.n_layers = (int)o->pred_layers;
    if (o->proj_hidden > 0) dc->proj_hidden = (int)o->proj_hidden;
    if (o->fusion) DFM_TRY(dfm_parse_fusion_layers(o->fusion, dc));
    if (o->xattn_heads > 0) dc->xattn_heads = (int)o->xattn_heads;
    if (strcmp(o->gate, "head") && strcmp(o->gate, "channel"))
        return DFM_FAIL(DFM_EARG, "--gate %s: use head or channel", o->gate);
    dc->gate_per_channel = !strcmp(o->gate, "channel");
    dc->gate_bias = (float)o->gate_bias;
    dc->mse_weight = (float)o->mse_weight;
    dc->fuse_first_chunk = (int)o->fuse_first;
    dc->init_std = (float)o->init_std;
    dc->pred_input_layer = (int)o->pred_input_layer;
    return DFM_OK;
}

/* --targets on ds: a run's targets are checked against the token run (--tokens-run, else --data when
 * it is a run folder) */
static int open_targets(const Opts *o, DataSet *ds) {
    const char *trun = o->tokens_run;
    char *man = dfm_path_join(o->data, "manifest.json");
    if (!trun && man && dfm_path_exists(man)) trun = o->data;
    int rc = data_open_targets(ds, o->targets, trun, (int)o->chunk_len, (int)o->slots, (int)o->d_mem);
    free(man);
    return rc;
}

/* held-out sequences: the last --val-seqs (default 5 %), at least one batch */
static size_t held_out(const Opts *o, const DataSet *ds) {
    size_t nval = o->val_seqs > 0 ? (size_t)o->val_seqs : ds->n_seq / 20;
    return nval < (size_t)o->batch ? (size_t)o->batch : nval;
}

/* ---- evaluation -------------------------------------------------------------------------------------- */
typedef struct {
    double ce_pred, ce_none, ce_target, mse, cos;
    long n_batches;
} EvalResult;

/* Held-out evaluation on the engine's device; data read through pf's lock when a loader thread runs. */
static int evaluate(Engine *en, DfmModel *m, DataSet *ds, Prefetcher *pf, size_t first, size_t count, int B,
                    long max_batches, int modes, EvalResult *r) {
    memset(r, 0, sizeof *r);
    int T = ds->T, L = m->dc.enabled ? m->dc.chunk_len : T, NC = T / L, K = m->dc.n_slots, d = m->dc.d_mem;
    int *inp = malloc((size_t)B * T * sizeof(int)), *tgt = malloc((size_t)B * T * sizeof(int));
    size_t S = (size_t)B * NC * K;
    int use_t = m->dc.enabled && ds->tgt;
    float *tmem = use_t ? malloc(S * d * sizeof(float)) : NULL;
    uint8_t *tmask = use_t ? malloc(S) : NULL;
    size_t *idx = malloc(B * sizeof(size_t));
    int rc = DFM_OK;
    long nb = (long)(count / B);
    if (max_batches > 0 && nb > max_batches) nb = max_batches;
    if (nb < 1) {
        rc = DFM_FAIL(DFM_EARG, "held-out split of %zu sequences is smaller than one batch of %d. HINT: --val-seqs",
                      count, B);
        nb = 0;
    }
    for (long i = 0; i < nb && !rc; i++) {
        for (int b = 0; b < B; b++) idx[b] = first + (size_t)i * B + b;
        rc = pf ? prefetch_data_batch(pf, idx, B, L, inp, tgt, tmem, tmask)
                : data_batch(ds, idx, B, L, inp, tgt, tmem, tmask);
        if (rc) break;
        if (!m->dc.enabled) {
            rc = engine_forward(en, inp, tgt, NULL, NULL, B, T, MEM_NONE, 0, 1.0f);
            r->ce_none += m->ce;
            continue;
        }
        rc = engine_forward(en, inp, tgt, tmem, tmask, B, T, MEM_PREDICTED, 0, 1.0f);
        r->ce_pred += m->ce;
        r->mse += m->mse;
        r->cos += m->cos;
        if (!rc && (modes & 2)) {
            rc = engine_forward(en, inp, tgt, NULL, NULL, B, T, MEM_NONE, 0, 1.0f);
            r->ce_none += m->ce;
        }
        if (!rc && (modes & 4) && use_t) {
            rc = engine_forward(en, inp, tgt, tmem, tmask, B, T, MEM_TARGET, 0, 1.0f);
            r->ce_target += m->ce;
        }
    }
    if (nb > 0) {
        r->ce_pred /= nb;
        r->ce_none /= nb;
        r->ce_target /= nb;
        r->mse /= nb;
        r->cos /= nb;
    }
    r->n_batches = nb;
    free(inp), free(tgt), free(tmem), free(tmask), free(idx);
    return rc;
}

static void eval_print(FILE *logf, long step, const DfmModel *m, const EvalResult *e, int has_t) {
    if (m->dc.enabled) {
        char tbuf[32] = "n/a (no targets)";
        if (has_t) snprintf(tbuf, sizeof tbuf, "%.4f", e->ce_target);
        DFM_LOG_I("eval step %ld (%ld batches): CE predicted memory %.4f | fusion off %.4f | target memory %s | "
                  "MSE %.4f | cosine %.4f",
                  step, e->n_batches, e->ce_pred, e->ce_none, tbuf, e->mse, e->cos);
    } else {
        DFM_LOG_I("eval step %ld (%ld batches): CE %.4f (ppl %.2f)", step, e->n_batches, e->ce_none, exp(e->ce_none));
    }
    if (logf) {
        if (m->dc.enabled)
            fprintf(logf,
                    "{\"step\": %ld, \"eval\": {\"ce_pred\": %.6f, \"ce_none\": %.6f, \"ce_target\": %.6f, \"mse\": %.6f, "
                    "\"cos\": %.6f, \"batches\": %ld}}\n",
                    step, e->ce_pred, e->ce_none, has_t ? e->ce_target : NAN, e->mse, e->cos, e->n_batches);
        else
            fprintf(logf, "{\"step\": %ld, \"eval\": {\"ce\": %.6f, \"batches\": %ld}}\n", step, e->ce_none,
                    e->n_batches);
        fflush(logf);
    }
}

/* ---- the training loop ---------------------------------------------------------------------------------- */
/* XXH3-64 of the frozen backbone's weights, so DFM checkpoints refuse another backbone of the same shape. */
static json_t *backbone_hash(const DfmModel *m) {
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx",
             (unsigned long long)dfm_checksum64(m->bb_memory, m->bb_num * sizeof(float)));
    return json_string(hex);
}

static json_t *run_config(const DfmModel *m, const Opts *o) {
    return json_pack("{s:o, s:o, s:o, s:o}", "backbone", backbone_config_to_hf(&m->bc), "dfm",
                     dfm_config_to_json(&m->dc), "train", opts_json(o), "backbone_hash",
                     m->dc.enabled ? backbone_hash(m) : json_string("trained"));
}

static int g_rank = 0; /* only rank 0 writes logs, checkpoints and models */

/* --device / --precision / --attention / --gpu into engine options */
static int engine_options(const Opts *o, EngineOptions *eo) {
    memset(eo, 0, sizeof *eo);
    if (strcmp(o->device, "cpu") && strcmp(o->device, "cuda"))
        return DFM_FAIL(DFM_EARG, "--device %s: use cpu or cuda", o->device);
    if (strcmp(o->precision, "bf16") && strcmp(o->precision, "fp32"))
        return DFM_FAIL(DFM_EARG, "--precision %s: use bf16 or fp32", o->precision);
    if (strcmp(o->attention, "flash") && strcmp(o->attention, "reference") && strcmp(o->attention, "auto"))
        return DFM_FAIL(DFM_EARG, "--attention %s: use auto, flash or reference", o->attention);
    eo->cuda = !strcmp(o->device, "cuda");
    eo->bf16 = eo->cuda && !strcmp(o->precision, "bf16");
    eo->flash = !strcmp(o->attention, "auto") ? -1 : !strcmp(o->attention, "flash");
    eo->gpu = (int)o->gpu;
    return DFM_OK;
}

/* peak FLOP/s for MFU: --peak-tflops, else the H100/H200 SXM dense figures on a GPU; 0 on the CPU */
static double peak_flops(const Opts *o, const EngineOptions *eo) {
    if (o->peak_tflops > 0) return o->peak_tflops * 1e12;
    if (!eo->cuda) return 0.0;
    return eo->bf16 ? 989.4e12 : 66.9e12;
}

/* Data parallel over MPI ranks: every rank draws the same global order; micro-batch a of a step takes
 * sequences [(a*W + r)*B, (a*W + r + 1)*B) of the step's accum*W*B for rank r of W. Gradients are
 * summed (engine_allreduce_grads: a fixed order for a fixed rank count) and divided by W, so a run on W
 * ranks with batch B equals a single-rank run with batch W*B up to the summation order.
 * A loader thread (prefetch.h) reads batches ahead; the next micro-batch's copy to the device is started
 * before the current one's backward, so it overlaps compute. "stall" in the log is the fraction of the
 * step spent waiting for data. */
static int train_loop(DfmModel *m, DataSet *ds, const Opts *o) {
    dfm_mpi mp;
    DFM_TRY(dfm_mpi_init(NULL, NULL, &mp));
    g_rank = mp.rank;
    int W = mp.size;
    int B = (int)o->batch, T = (int)o->seq_len, L = m->dc.enabled ? m->dc.chunk_len : T;
    size_t nval = held_out(o, ds);
    if (nval >= ds->n_seq) return DFM_FAIL(DFM_EARG, "%zu sequences leave nothing to train on after %zu held out. "
                                           "HINT: --val-seqs or more data", ds->n_seq, nval);
    if (o->prefetch < 2) return DFM_FAIL(DFM_EARG, "--prefetch %lld: at least 2", (long long)o->prefetch);
    size_t ntrain = ds->n_seq - nval;
    DFM_LOG_I("split: %zu training sequences, %zu held out (the last ones)", ntrain, nval);
    EngineOptions eo;
    DFM_TRY(engine_options(o, &eo));
    Engine *en = NULL;
    int rc = dfm_mpi_agree(&mp, engine_create(m, &eo, &mp, &en));
    if (rc) {
        engine_free(en);
        return rc;
    }
    DFM_LOG_I("engine: %s", engine_describe(en));
    Loader ld;
    memset(&ld, 0, sizeof ld);
    Prefetcher *pf = NULL;
    PrefetchBatch *cur = NULL, *nxt = NULL;
    FILE *logf = NULL;
    int use_t = m->dc.enabled && ds->tgt;
    long step0 = 0;
    uint64_t done_epoch = 0, done_pos = 0; /* loader position after the last consumed batch */
    size_t np;
    model_trainable_params(m, &np);
    if ((rc = loader_init(&ld, 0, ntrain, (uint64_t)o->seed, 1))) goto out;
    if (o->resume) {
        CkptInfo ci;
        json_t *saved = NULL;
        float *hp, *h1, *h2;
        engine_host_state(en, &hp, &h1, &h2);
        rc = ckpt_load(o->resume, &ci, &saved, hp, h1, h2, np);
        if (rc) goto out;
        json_t *now = run_config(m, o);
        const char *parts[4] = {"backbone", "dfm", "train", "backbone_hash"};
        for (int i = 0; i < 4 && !rc; i++)
            if (!json_equal(json_object_get(saved, parts[i]), json_object_get(now, parts[i])))
                rc = DFM_FAIL(DFM_EMISMATCH, "%s was written with another %s configuration. HINT: resume with the "
                              "same flags and backbone as the run that wrote it", o->resume, parts[i]);
        json_decref(saved);
        json_decref(now);
        if (rc) goto out;
        if ((int)ci.mode != m->dc.enabled) {
            rc = DFM_FAIL(DFM_EMISMATCH, "%s is a %s checkpoint", o->resume, ci.mode ? "DFM" : "pretraining");
            goto out;
        }
        if ((rc = engine_load_state(en))) goto out;
        step0 = (long)ci.step;
        loader_seek(&ld, ci.epoch, ci.pos);
        done_epoch = ci.epoch, done_pos = ci.pos;
        DFM_LOG_I("resumed from %s at step %ld (epoch %llu, position %llu)", o->resume, step0,
                  (unsigned long long)ci.epoch, (unsigned long long)ci.pos);
    }
    {
        PrefetchAllocator pa = engine_host_allocator(en);
        int lt = o->loader_threads > 0 ? (int)o->loader_threads : (eo.cuda ? 4 : 1);
        if ((rc = prefetch_start(&pf, ds, &ld, B, L, use_t, mp.rank, W, (int)o->prefetch, lt, pa.alloc ? &pa : NULL)))
            goto out;
    }
    char *logpath = o->log ? strdup(o->log) : dfm_path_join(o->out, "log.jsonl");
    logf = g_rank ? NULL : fopen(logpath, o->resume ? "a" : "w");
    if (!logf && !g_rank) DFM_LOG_W("cannot write the log %s; going on without it", logpath);
    free(logpath);
    AdamWConfig ac = {.lr = (float)o->lr, .beta1 = 0.9f, .beta2 = (float)o->beta2, .eps = 1e-8f,
                      .weight_decay = (float)o->wd};
    double fpt = model_train_flops_per_token(m, T), peak = peak_flops(o, &eo);
    DFM_LOG_I("training %zu parameters (%s), %lld steps of %lld x %d x %d tokens on %d rank(s); %.7g GFLOP per token",
              np, m->dc.enabled ? "DFM modules; backbone frozen" : "backbone", (long long)o->steps,
              (long long)o->accum, B, T, W, fpt / 1e9);
    for (long step = step0; step < o->steps && !rc; step++) {
        double t0 = dfm_now(), stall = 0.0, waited;
        int last = step + 1 == o->steps;
        int eval_now = (o->eval_every > 0 && (step + 1) % o->eval_every == 0) || last;
        rc = engine_zero_grad(en);
        double loss = 0, ce = 0, mse = 0;
        for (int a = 0; a < o->accum && !rc; a++) {
            if (!cur) { /* first micro-batch of the run (later ones were staged during the previous backward) */
                rc = prefetch_next(pf, &cur, &waited);
                stall += waited;
                if (!rc) rc = engine_stage(en, cur->inputs, cur->targets, cur->tmem, cur->tmask, B, T);
                if (rc) break;
            }
            rc = engine_forward(en, NULL, NULL, NULL, NULL, B, T, m->dc.enabled ? MEM_PREDICTED : MEM_NONE, 1,
                                1.0f / (float)o->accum);
            done_epoch = cur->epoch, done_pos = cur->pos;
            prefetch_release(pf, cur); /* consumed: its buffers are on the device (or used) */
            cur = NULL;
            /* (not across an evaluation: its forwards would consume the staged batch first) */
            int more = a + 1 < o->accum || (!last && !eval_now);
            if (!rc && more) { /* stage the next micro-batch: its copy overlaps this backward */
                rc = prefetch_next(pf, &nxt, &waited);
                stall += waited;
                if (!rc) rc = engine_stage(en, nxt->inputs, nxt->targets, nxt->tmem, nxt->tmask, B, T);
                cur = nxt;
            }
            if (!rc) rc = engine_backward(en);
            loss += m->loss / o->accum;
            ce += m->ce / o->accum;
            mse += m->mse / o->accum;
        }
        rc = dfm_mpi_agree(&mp, rc);
        if (rc) break;
        if (W > 1) {
            double parts[3] = {loss, ce, mse};
            if ((rc = engine_allreduce_grads(en, &mp)) ||
                (rc = DFM_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, parts, 3, MPI_DOUBLE, MPI_SUM, mp.comm))))
                break;
            loss = parts[0] / W;
            ce = parts[1] / W;
            mse = parts[2] / W;
        }
        double gn = 0.0;
        if ((rc = engine_grad_norm(en, &gn))) break;
        if (!isfinite(gn)) {
            rc = DFM_FAIL(DFM_ERANGE, "gradient norm is %f at step %ld. HINT: lower --lr", gn, step);
            break;
        }
        if (o->clip > 0 && gn > o->clip && (rc = engine_grad_scale(en, (float)(o->clip / gn)))) break;
        ac.lr = lr_schedule(step, o->warmup, o->steps, (float)o->lr, (float)o->min_lr_frac);
        if ((rc = engine_adamw(en, &ac, step + 1))) break;
        double dt = dfm_now() - t0;
        double tps = (double)o->accum * W * B * T / dt;
        double mfu = peak > 0 ? tps * fpt / (W * peak) : NAN;
        char mfus[32] = "";
        char mfus_json[32] = "null";
        if (peak > 0) {
            snprintf(mfus, sizeof mfus, " | MFU %.1f%%", 100.0 * mfu);
            snprintf(mfus_json, sizeof mfus_json, "%.4f", mfu);
        }
        if (g_rank) {
        } else if (m->dc.enabled)
            DFM_LOG_I("step %5ld/%lld | loss %.4f (ce %.4f mse %.4f) | lr %.2e | norm %.3f | %.0f tok/s%s | stall %.1f%% "
                      "| %.0f ms",
                      step + 1, (long long)o->steps, loss, ce, mse, ac.lr, gn, tps, mfus, 100.0 * stall / dt, dt * 1e3);
        else
            DFM_LOG_I("step %5ld/%lld | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s%s | stall %.1f%% | %.0f ms",
                      step + 1, (long long)o->steps, loss, ac.lr, gn, tps, mfus, 100.0 * stall / dt, dt * 1e3);
        if (logf) {
            fprintf(logf,
                    "{\"step\": %ld, \"loss\": %.6f, \"ce\": %.6f, \"mse\": %.6f, \"lr\": %.6e, \"grad_norm\": %.6f, "
                    "\"tok_per_s\": %.1f, \"ms\": %.1f, \"stall\": %.4f, \"mfu\": %s}\n",
                    step + 1, loss, ce, mse, ac.lr, gn, tps, dt * 1e3, stall / dt, mfus_json);
            fflush(logf);
        }
        if (eval_now) {
            EvalResult e;
            rc = evaluate(en, m, ds, pf, ntrain, nval, B, o->eval_batches, 7, &e);
            if (rc) break;
            eval_print(logf, step + 1, m, &e, use_t);
        }
        if (last || (!o->no_ckpt && o->ckpt_every > 0 && (step + 1) % o->ckpt_every == 0)) {
            float *hp, *h1, *h2;
            if ((rc = engine_sync_host(en, &hp, &h1, &h2))) break; /* also brings the params to m for the export */
            if (g_rank == 0 && !o->no_ckpt) {
                CkptInfo ci = {.mode = (uint32_t)m->dc.enabled, .step = (uint64_t)step + 1, .epoch = done_epoch,
                               .pos = done_pos, .n_params = np};
                char name[64];
                snprintf(name, sizeof name, last ? "ckpt_final.bin" : "ckpt_%06ld.bin", step + 1);
                char *cp = dfm_path_join(o->out, name);
                json_t *cfg = run_config(m, o);
                rc = ckpt_save(cp, &ci, cfg, hp, h1, h2);
                json_decref(cfg);
                if (!rc) DFM_LOG_I("checkpoint %s", cp);
                free(cp);
            }
        }
    }
out:
    if (logf) fclose(logf);
    engine_free(en); /* first: it waits for the device, which may still read a staged pinned buffer */
    prefetch_stop(pf);
    loader_free(&ld);
    return rc;
}

/* ---- pretrain ------------------------------------------------------------------------------------------- */
int cmd_pretrain(int argc, char **argv) {
    Opts o;
    memset(&o, 0, sizeof o);
    dfm_opt opts[] = {
        O_COMMON(&o),
        {"arch", DFM_OPT_STR, &o.arch, "qwen3", "NAME", "qwen3 (QK-norm) or llama", 0},
        {"layers", DFM_OPT_INT, &o.layers, "4", "N", "decoder layers", 0},
        {"hidden", DFM_OPT_INT, &o.hidden, "128", "C", "hidden size", 0},
        {"heads", DFM_OPT_INT, &o.heads, "4", "N", "attention heads", 0},
        {"kv-heads", DFM_OPT_INT, &o.kv_heads, "2", "N", "key/value heads (grouped-query)", 0},
        {"head-dim", DFM_OPT_INT, &o.head_dim, "0", "N", "head size (0 = hidden / heads)", 0},
        {"ffn", DFM_OPT_INT, &o.ffn, "0", "F", "SwiGLU width (0 = 3 * hidden)", 0},
        {"vocab", DFM_OPT_INT, &o.vocab, "0", "V", "vocabulary (0 = largest token id + 1, rounded up to 64)", 0},
        {"untied", DFM_OPT_FLAG, &o.untied, NULL, NULL, "separate LM head (default: tied to the embedding)", 0},
        {0},
    };
    char **pos = NULL;
    int npos = 0;
    int rc = dfm_opts_parse("pretrain", "--data TOKENS --out DIR [options]",
                            "Trains a small Llama/Qwen3-family decoder from scratch and saves it as a Hugging Face "
                            "folder OUT/model (config.json + model.safetensors) to serve as DFM's frozen backbone.",
                            opts, argc, argv, &pos, &npos, NULL);
    free(pos);
    if (rc == DFM_OPTS_HELP) {
        dfm_opts_free(opts);
        return 0;
    }
    DataSet ds;
    memset(&ds, 0, sizeof ds);
    DfmModel *m = NULL;
    if (!rc && !o.data) rc = DFM_FAIL(DFM_EARG, "--data is required");
    if (!rc) set_threads(o.threads);
    if (!rc) rc = dfm_mkdir_p(o.out);
    if (!rc) rc = data_open(o.data, (int)o.seq_len, &ds);
    if (!rc) {
        BackboneConfig bc;
        memset(&bc, 0, sizeof bc);
        if (strcmp(o.arch, "qwen3") && strcmp(o.arch, "llama")) rc = DFM_FAIL(DFM_EARG, "--arch %s: qwen3 or llama", o.arch);
        snprintf(bc.arch, sizeof bc.arch, "%s", !strcmp(o.arch, "llama") ? "LlamaForCausalLM" : "Qwen3ForCausalLM");
        bc.vocab_size = o.vocab > 0 ? (int)o.vocab : (int)((ds.max_token + 1 + 63) / 64 * 64);
        if (!rc && (uint32_t)bc.vocab_size <= ds.max_token)
            rc = DFM_FAIL(DFM_EARG, "--vocab %d is not above the largest token id %u", bc.vocab_size, ds.max_token);
        bc.max_seq = (int)o.seq_len;
        bc.tie_embeddings = !o.untied;
        int hd = o.head_dim > 0 ? (int)o.head_dim : (int)(o.hidden / (o.heads > 0 ? o.heads : 1));
        bc.dec = (StackConfig){.n_layers = (int)o.layers, .hidden = (int)o.hidden, .n_heads = (int)o.heads,
                               .n_kv_heads = (int)o.kv_heads, .head_dim = hd,
                               .ffn = o.ffn > 0 ? (int)o.ffn : (int)(3 * o.hidden),
                               .qk_norm = !strcmp(o.arch, "qwen3"), .eps = 1e-6f, .rope_theta = 10000.0f};
        DfmConfig dc;
        memset(&dc, 0, sizeof dc);
        if (!rc) rc = model_create_ex(&bc, &dc, (int)o.batch, (int)o.seq_len, strcmp(o.device, "cuda") != 0, &m);
        if (!rc) {
            model_init_backbone_random(m, (uint64_t)o.seed);
            DFM_LOG_I("backbone %s: %d layers, hidden %d, heads %d/%d, ffn %d, vocab %d, %zu parameters", bc.arch,
                      bc.dec.n_layers, bc.dec.hidden, bc.dec.n_heads, bc.dec.n_kv_heads, bc.dec.ffn, bc.vocab_size,
                      m->bb_num);
            rc = train_loop(m, &ds, &o);
        }
    }
    if (!rc && g_rank == 0) {
        char *dir = dfm_path_join(o.out, "model");
        rc = hf_save_backbone(m, dir);
        if (!rc) DFM_LOG_I("saved the backbone as a Hugging Face folder: %s", dir);
        free(dir);
    }
    model_free(m);
    data_close(&ds);
    dfm_opts_free(opts);
    return rc;
}

/* The DFM config stored with trained modules (a checkpoint's "dfm" or the export's "dfm_config"). */
static int modules_config(const char *path, DfmConfig *dc) {
    json_t *cfg = NULL;
    int rc;
    size_t len = strlen(path);
    if (len > 12 && !strcmp(path + len - 12, ".safetensors")) {
        dfm_safetensors *st;
        DFM_TRY(dfm_safetensors_open(path, &st));
        const char *txt = dfm_safetensors_meta(st, "dfm_config");
        json_error_t e;
        cfg = txt ? json_loads(txt, 0, &e) : NULL;
        dfm_safetensors_close(st);
        if (!cfg) return DFM_FAIL(DFM_EFORMAT, "%s has no readable dfm_config metadata. HINT: a file written by "
                                  "dfm-train train", path);
        rc = dfm_config_from_json(cfg, dc);
    } else {
        CkptInfo ci;
        DFM_TRY(ckpt_peek(path, &ci, &cfg));
        rc = ci.mode == 1 ? dfm_config_from_json(json_object_get(cfg, "dfm"), dc)
                          : DFM_FAIL(DFM_EMISMATCH, "%s is a pretraining checkpoint, not DFM modules", path);
    }
    json_decref(cfg);
    if (rc) dfm_error_prefix("%s", path);
    return rc;
}

/* Build a DFM model on a frozen backbone folder (max_seq = T). */
static int build_dfm_model(const Opts *o, int T, int B, int K, int d, DfmModel **out) {
    BackboneConfig bc;
    memset(&bc, 0, sizeof bc);
    bc.max_seq = T;
    DFM_TRY(hf_read_config(o->backbone, &bc));
    DfmConfig dc;
    DFM_TRY(dfm_config_from_opts(o, &bc, K, d, &dc));
    if (o->modules) DFM_TRY(modules_config(o->modules, &dc)); /* eval / generate: the modules' own shape */
    DfmModel *m;
    DFM_TRY(model_create_ex(&bc, &dc, B, T, !o->device || strcmp(o->device, "cuda") != 0, &m));
    int rc = hf_load_backbone(m, o->backbone);
    if (rc) {
        model_free(m);
        return rc;
    }
    model_init_dfm_random(m, (uint64_t)o->seed);
    *out = m;
    DFM_LOG_I("backbone %s from %s (frozen, %zu parameters); DFM modules %zu parameters: K=%d d=%d L=%d, "
              "predictor %d x %d, %d fusion blocks (gate per %s)",
              bc.arch, o->backbone, m->bb_num, m->dfm_num, dc.n_slots, dc.d_mem, dc.chunk_len, dc.pred.n_layers,
              dc.pred.hidden, dc.n_fusion, dc.gate_per_channel ? "channel" : "head");
    return DFM_OK;
}

/* Modules from a checkpoint or a safetensors export. */
static int load_modules(DfmModel *m, const char *path) {
    size_t len = strlen(path);
    if (len > 12 && !strcmp(path + len - 12, ".safetensors")) return dfm_modules_load(m, path);
    CkptInfo ci;
    size_t np;
    float *p = model_trainable_params(m, &np);
    float *tm = malloc(np * sizeof(float)), *tv = malloc(np * sizeof(float));
    json_t *saved = NULL;
    int rc = ckpt_load(path, &ci, &saved, p, tm, tv, np);
    if (!rc && ci.mode != 1) rc = DFM_FAIL(DFM_EMISMATCH, "%s is a pretraining checkpoint, not DFM modules", path);
    if (!rc) {
        json_t *h = backbone_hash(m);
        if (!json_equal(json_object_get(saved, "backbone_hash"), h))
            rc = DFM_FAIL(DFM_EMISMATCH, "%s was trained on another backbone (weights hash %s, this one %s). "
                          "HINT: --backbone of the training run", path,
                          json_string_value(json_object_get(saved, "backbone_hash")), json_string_value(h));
        json_decref(h);
    }
    json_decref(saved);
    free(tm);
    free(tv);
    return rc;
}

int cmd_train(int argc, char **argv) {
    Opts o;
    memset(&o, 0, sizeof o);
    dfm_opt opts[] = {
        O_COMMON(&o),
        O_DFM(&o),
        {"backbone", DFM_OPT_STR, &o.backbone, NULL, "DIR", "frozen backbone: Hugging Face folder", 0},
        {"targets", DFM_OPT_STR, &o.targets, NULL, "PATH", "target memory: targets file or a run with targets", 0},
        {"tokens-run", DFM_OPT_STR, &o.tokens_run, NULL, "DIR", "token run the targets must match (default --data when it is a run)", 0},
        {0},
    };
    char **pos = NULL;
    int npos = 0;
    int rc = dfm_opts_parse("train", "--backbone DIR --data TOKENS --targets PATH --out DIR [options]",
                            "Trains DFM's memory predictor, memory projector and gated cross-attention fusion on top "
                            "of a frozen decoder with next-token CE + mse-weight * MSE(predicted, target slots). "
                            "Writes OUT/ckpt_final.bin, OUT/dfm_modules.safetensors and OUT/log.jsonl.",
                            opts, argc, argv, &pos, &npos, NULL);
    free(pos);
    if (rc == DFM_OPTS_HELP) {
        dfm_opts_free(opts);
        return 0;
    }
    DataSet ds;
    memset(&ds, 0, sizeof ds);
    DfmModel *m = NULL;
    if (!rc && (!o.data || !o.backbone || !o.targets)) rc = DFM_FAIL(DFM_EARG, "--backbone, --data and --targets are required");
    if (!rc) set_threads(o.threads);
    if (!rc) rc = dfm_mkdir_p(o.out);
    if (!rc) rc = data_open(o.data, (int)o.seq_len, &ds);
    if (!rc) rc = open_targets(&o, &ds);
    if (!rc) rc = build_dfm_model(&o, (int)o.seq_len, (int)o.batch, ds.K, ds.d, &m);
    if (!rc && (uint32_t)m->bc.vocab_size <= ds.max_token)
        rc = DFM_FAIL(DFM_EMISMATCH, "token id %u is outside the backbone's vocabulary of %d", ds.max_token,
                      m->bc.vocab_size);
    if (!rc) rc = train_loop(m, &ds, &o);
    if (!rc && g_rank == 0) {
        char *p = dfm_path_join(o.out, "dfm_modules.safetensors");
        rc = dfm_modules_save(m, p);
        if (!rc) DFM_LOG_I("exported the trained modules: %s", p);
        free(p);
    }
    model_free(m);
    data_close(&ds);
    dfm_opts_free(opts);
    return rc;
}

int cmd_eval(int argc, char **argv) {
    Opts o;
    memset(&o, 0, sizeof o);
    dfm_opt opts[] = {
        O_COMMON(&o),
        O_DFM(&o),
        {"backbone", DFM_OPT_STR, &o.backbone, NULL, "DIR", "frozen backbone: Hugging Face folder", 0},
        {"modules", DFM_OPT_STR, &o.modules, NULL, "FILE", "trained modules: ckpt_*.bin or dfm_modules.safetensors", 0},
        {"targets", DFM_OPT_STR, &o.targets, NULL, "PATH", "target memory (for MSE, cosine and the upper bound)", 0},
        {0},
    };
    char **pos = NULL;
    int npos = 0;
    int rc = dfm_opts_parse("eval", "--backbone DIR --modules FILE --data TOKENS [--targets PATH]",
                            "Held-out CE with predicted memory, with fusion off (the frozen backbone alone) and with "
                            "the target memory fused instead (upper bound); MSE and mean cosine of predicted vs target "
                            "slots. The held-out split is the last --val-seqs sequences, as in training.",
                            opts, argc, argv, &pos, &npos, NULL);
    free(pos);
    if (rc == DFM_OPTS_HELP) {
        dfm_opts_free(opts);
        return 0;
    }
    DataSet ds;
    memset(&ds, 0, sizeof ds);
    DfmModel *m = NULL;
    if (!rc && (!o.data || !o.backbone || !o.modules)) rc = DFM_FAIL(DFM_EARG, "--backbone, --modules and --data are required");
    if (!rc) { /* chunk length and slot shape come from the modules */
        DfmConfig mc;
        rc = modules_config(o.modules, &mc);
        if (!rc) o.chunk_len = mc.chunk_len, o.slots = mc.n_slots, o.d_mem = mc.d_mem;
    }
    if (!rc) set_threads(o.threads);
    if (!rc) rc = data_open(o.data, (int)o.seq_len, &ds);
    if (!rc && o.targets) rc = open_targets(&o, &ds);
    if (!rc) rc = build_dfm_model(&o, (int)o.seq_len, (int)o.batch, ds.K, ds.d, &m);
    if (!rc) rc = load_modules(m, o.modules);
    if (!rc) {
        size_t nval = held_out(&o, &ds);
        if (nval > ds.n_seq) nval = ds.n_seq;
        EvalResult e;
        EngineOptions eo;
        dfm_mpi mp;
        Engine *en = NULL;
        rc = engine_options(&o, &eo);
        if (!rc) rc = dfm_mpi_init(NULL, NULL, &mp);
        if (!rc) rc = engine_create(m, &eo, &mp, &en);
        if (!rc) rc = evaluate(en, m, &ds, NULL, ds.n_seq - nval, nval, (int)o.batch, o.eval_batches, 7, &e);
        engine_free(en);
        if (!rc) {
            eval_print(NULL, 0, m, &e, ds.tgt != NULL);
            printf("{\"ce_pred\": %.6f, \"ce_none\": %.6f, \"ce_target\": %.6f, \"mse\": %.6f, \"cos\": %.6f, "
                   "\"batches\": %ld}\n",
                   e.ce_pred, e.ce_none, ds.tgt ? e.ce_target : NAN, e.mse, e.cos, e.n_batches);
        }
    }
    model_free(m);
    data_close(&ds);
    dfm_opts_free(opts);
    return rc;
}

/* ---- generate ---------------------------------------------------------------------------------------- */
static int parse_ids(const char *s, int **ids, int *n) {
    int cap = 16;
    *ids = malloc(cap * sizeof(int));
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) return DFM_FAIL(DFM_EARG, "--prompt-ids \"%s\": expected comma-separated token ids", s);
        if (*n == cap) *ids = realloc(*ids, (cap *= 2) * sizeof(int));
        (*ids)[(*n)++] = (int)v;
        p = end;
        if (*p == ',') p++;
    }
    return *n ? DFM_OK : DFM_FAIL(DFM_EARG, "empty prompt");
}

int cmd_generate(int argc, char **argv) {
    Opts o;
    memset(&o, 0, sizeof o);
    char *prompt_ids = NULL, *prompt = NULL, *tokenizer = NULL;
    int64_t max_new = 0, no_memory = 0;
    dfm_opt opts[] = {
        O_DFM(&o),
        {"backbone", DFM_OPT_STR, &o.backbone, NULL, "DIR", "frozen backbone: Hugging Face folder", 0},
        {"modules", DFM_OPT_STR, &o.modules, NULL, "FILE", "trained modules (ckpt or safetensors)", 0},
        {"prompt-ids", DFM_OPT_STR, &prompt_ids, NULL, "LIST", "prompt as comma-separated token ids", 0},
        {"prompt", DFM_OPT_STR, &prompt, NULL, "TEXT", "prompt text (needs --tokenizer)", 0},
        {"tokenizer", DFM_OPT_STR, &tokenizer, NULL, "FILE", "tokenizer.json of the backbone", 0},
        {"max-new", DFM_OPT_INT, &max_new, "32", "N", "tokens to generate", 0},
        {"no-memory", DFM_OPT_FLAG, &no_memory, NULL, NULL, "fusion off: the frozen backbone alone", 0},
        {"seed", DFM_OPT_INT, &o.seed, "1", "N", "seed (unused by greedy decoding; module init without --modules)", 0},
        {"threads", DFM_OPT_INT, &o.threads, "0", "N", "threads", 1},
        {0},
    };
    char **pos = NULL;
    int npos = 0;
    int rc = dfm_opts_parse("generate", "--backbone DIR --modules FILE (--prompt-ids LIST | --prompt TEXT --tokenizer FILE)",
                            "Greedy decoding as at DFM inference: the memory is predicted once from the prompt's "
                            "chunks and held fixed while the answer is generated (chunks after the prompt reuse the "
                            "last prediction). No retrieval.",
                            opts, argc, argv, &pos, &npos, NULL);
    free(pos);
    if (rc == DFM_OPTS_HELP) {
        dfm_opts_free(opts);
        return 0;
    }
    int *ids = NULL, n = 0;
    dfm_tokenizer *tok = NULL;
    DfmModel *m = NULL;
    if (!rc && !o.backbone) rc = DFM_FAIL(DFM_EARG, "--backbone is required");
    if (!rc) set_threads(o.threads);
    if (!rc && tokenizer) rc = dfm_tokenizer_load(tokenizer, &tok);
    if (!rc) {
        if (prompt_ids) rc = parse_ids(prompt_ids, &ids, &n);
        else if (prompt && tok) {
            dfm_ids v = {0};
            rc = dfm_tokenizer_encode(tok, prompt, strlen(prompt), &v, 0);
            if (!rc) {
                n = (int)v.n;
                ids = malloc((n ? n : 1) * sizeof(int));
                for (int i = 0; i < n; i++) ids[i] = (int)v.ids[i];
            }
            dfm_ids_free(&v);
        } else rc = DFM_FAIL(DFM_EARG, "give --prompt-ids, or --prompt with --tokenizer");
    }
    int L = (int)o.chunk_len;
    if (!rc && o.modules) {
        DfmConfig mc;
        rc = modules_config(o.modules, &mc);
        if (!rc) L = mc.chunk_len;
    }
    int total = n + (int)max_new;
    int T = (total + L - 1) / L * L;
    if (!rc && n == 0) rc = DFM_FAIL(DFM_EARG, "empty prompt");
    if (!rc) rc = build_dfm_model(&o, T, 1, (int)o.slots, (int)o.d_mem, &m);
    if (!rc && o.modules) rc = load_modules(m, o.modules);
    int *seq = calloc(T, sizeof(int)), *tg = calloc(T, sizeof(int));
    float *mem = NULL, *logits = NULL;
    uint8_t *mask = NULL;
    if (!rc) {
        int NC = T / L, K = m->dc.n_slots, d = m->dc.d_mem;
        mem = calloc((size_t)NC * K * d, sizeof(float));
        mask = calloc((size_t)NC * K, 1);
        logits = malloc((size_t)m->bc.vocab_size * sizeof(float));
        memcpy(seq, ids, n * sizeof(int));
        /* memory from the prompt: chunk c <= np is predicted from the prompt's chunk c-1; later chunks keep
         * the prediction of chunk np */
        int npc = n / L;
        rc = model_forward(m, seq, tg, NULL, NULL, 1, T, MEM_PREDICTED, 0, 1.0f);
        for (int c = 0; c < NC && !rc; c++) {
            int src = c <= npc ? c : npc;
            memcpy(mem + (size_t)c * K * d, m->slots + (size_t)src * K * d, (size_t)K * d * sizeof(float));
            memset(mask + (size_t)c * K, (c > 0 || m->dc.fuse_first_chunk) ? 1 : 0, K);
        }
        for (int i = n; i < total && !rc; i++) {
            rc = model_forward(m, seq, tg, mem, mask, 1, T, no_memory ? MEM_NONE : MEM_TARGET, 0, 1.0f);
            if (rc) break;
            model_logits_row(m, i - 1, logits);
            int best = 0;
            for (int v = 1; v < m->bc.vocab_size; v++)
                if (logits[v] > logits[best]) best = v;
            seq[i] = best;
        }
    }
    if (!rc) {
        printf("ids:");
        for (int i = n; i < total; i++) printf("%s%d", i == n ? " " : ",", seq[i]);
        printf("\n");
        if (tok) {
            uint32_t *u = malloc((size_t)(total - n + 1) * sizeof(uint32_t));
            for (int i = n; i < total; i++) u[i - n] = (uint32_t)seq[i];
            char *text = NULL;
            size_t tl = 0;
            if (!dfm_tokenizer_decode(tok, u, (size_t)(total - n), 1, &text, &tl)) printf("text: %s%s\n", prompt ? prompt : "", text);
            free(text);
            free(u);
        }
    }
    free(seq), free(tg), free(mem), free(mask), free(logits), free(ids);
    dfm_tokenizer_free(tok);
    model_free(m);
    dfm_opts_free(opts);
    return rc;
}
