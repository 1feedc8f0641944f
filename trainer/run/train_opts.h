/* train_opts.h — the flags dfm-train's commands share: one struct, the rows of the option tables
 * (common/opts.h) that fill it, and what is derived from them alone: threads, engine options, the
 * held-out split and the target set-up. */
#ifndef DFM_TRAINER_TRAIN_OPTS_H
#define DFM_TRAINER_TRAIN_OPTS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "common/opts.h"
#include "trainer/data/data.h"
#include "trainer/run/engine.h"

typedef struct {
    char *data, *targets, *out, *resume, *log, *backbone, *modules, *arch, *fusion, *gate, *tokens_run;
    char *memory_align, *fusion_memory, *pred_loss, *memory_control;
    char *objective, *reading_prompt, *reading_slots, *init_modules, *memory_ablation; /* train only */
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
        pred_input_layer, pred_input_tokens, pred_skip, cache_frozen, content_only, centre_memory;
    double gate_bias, mse_weight, init_std;
    double margin_weight, margin; /* train only: the margin against shuffled memory (trainer/run/margin.h) */
    char *teacher;                 /* train only: the in-context teacher's file (trainer/data/teacher.h) */
    double distill_weight, gain_weighting, ce_weight; /* with it: the KL's weight; the gain weights' floor (< 0:
                                                       * off); the hard CE's weight */
    double reconstruct_weight;     /* train only: the reading objective beside DFM's (trainer/run/reconstruct_mix.h) */
    int64_t reconstruct_batch;     /* its sequences per micro-batch (0: as many tokens as a DFM micro-batch) */
    int64_t reconstruct_context;   /* its chunks after their real context (reading.h, data_open_reading_context) */
    char *reconstruct_memory;      /* own (default) or shuffled: the slot its chunks read (the control of reading) */
} TrainOpts;

/* Option-table rows of the data, optimisation, run and device flags (pretrain, train, eval). */
#define TRAIN_OPTS_COMMON(o)                                                                                          \
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
    {"memory-control", DFM_OPT_STR, &(o)->memory_control, "shuffle", "KIND", "evaluation control: shuffle also fuses each held-out sequence with another's memory (predicted, and target) through the same modules; its CE minus the real memory's is the memory effect, which fusion off confounds with the modules' capacity; none skips it", 1, .choices = "shuffle|none"}, \
    {"ckpt-every", DFM_OPT_INT, &(o)->ckpt_every, "0", "N", "write OUT/ckpt_STEP.bin every N steps", 0},      \
    {"resume", DFM_OPT_STR, &(o)->resume, NULL, "FILE", "continue from a checkpoint (bit-identical)", 0},     \
    {"log", DFM_OPT_STR, &(o)->log, NULL, "FILE", "JSONL log (default OUT/log.jsonl)", 1},                     \
    {"threads", DFM_OPT_INT, &(o)->threads, "0", "N", "OpenMP/BLAS threads (0 = default)", 1},               \
    {"device", DFM_OPT_STR, &(o)->device, "cpu", "DEV", "cpu (fp32 reference) or cuda (needs a CUDA build)", 1, .choices = "cpu|cuda"}, \
    {"precision", DFM_OPT_STR, &(o)->precision, "bf16", "P", "cuda: bf16 (bf16 GEMMs; frozen backbone held in bf16) or fp32", 1, .choices = "bf16|fp32"}, \
    {"gpu", DFM_OPT_INT, &(o)->gpu, "-1", "N", "cuda: device index (-1 = node-local rank mod visible GPUs)", 1}, \
    {"attention", DFM_OPT_STR, &(o)->attention, "auto", "KIND", "cuda: flash (no T x T matrix, fp32), reference (T x T kept, cuBLAS GEMMs) or auto (reference while it fits)", 1, .choices = "auto|flash|reference"}, \
    {"prefetch", DFM_OPT_INT, &(o)->prefetch, "6", "N", "micro-batches read ahead by the loader threads", 1, .min = "2"}, \
    {"loader-threads", DFM_OPT_INT, &(o)->loader_threads, "0", "N", "threads reading batches (0 = 1 on the CPU, 4 with cuda)", 1}, \
    {"no-ckpt", DFM_OPT_FLAG, &(o)->no_ckpt, NULL, NULL, "write no checkpoint, not even the final one (benchmarks)", 1}, \
    {"peak-tflops", DFM_OPT_DOUBLE, &(o)->peak_tflops, "0", "X", "peak FLOP/s for MFU (0 = H100/H200 SXM: 989.4 bf16, 66.9 fp32; CPU: none)", 1}

/* --fusion-memory's default: see "Teacher forcing" in trainer/README.md for the measurement behind it */
#define TRAIN_FUSION_MEMORY_DEFAULT "mixed:0.5"

/* Option-table rows of the DFM modules' shape (train, eval, generate). */
#define TRAIN_OPTS_DFM(o)                                                                                              \
    {"chunk-len", DFM_OPT_INT, &(o)->chunk_len, "32", "L", "tokens per chunk", 0},                            \
    {"slots", DFM_OPT_INT, &(o)->slots, "0", "K", "memory slots per chunk (0 = the targets')", 0},            \
    {"d-mem", DFM_OPT_INT, &(o)->d_mem, "0", "D", "memory dimension (0 = the targets')", 0},                  \
    {"pred-layers", DFM_OPT_INT, &(o)->pred_layers, "2", "N", "predictor Transformer layers", 0},            \
    {"pred-hidden", DFM_OPT_INT, &(o)->pred_hidden, "0", "P", "predictor width (0 = min(C, 256))", 0},       \
    {"pred-input-layer", DFM_OPT_INT, &(o)->pred_input_layer, "0", "K", "predictor input: mean of the input embeddings (0) or of the hidden states after decoder layer K-1 (K <= first fusion layer)", 0}, \
    {"pred-skip", DFM_OPT_FLAG, &(o)->pred_skip, NULL, NULL, "a linear path from the predictor's pooled input straight to its slots beside its Transformer (both start at zero): the map a ridge regression finds, which the Transformer alone does not learn", 0}, \
    {"pred-input-tokens", DFM_OPT_INT, &(o)->pred_input_tokens, "0", "N", "predictor input: the mean over the previous chunk's last N tokens only (1: the last token's state, which has read the whole context; 0: the whole chunk)", 0}, \
    {"pred-heads", DFM_OPT_INT, &(o)->pred_heads, "0", "N", "predictor heads (0 = P / 64, at least 1)", 0},  \
    {"proj-hidden", DFM_OPT_INT, &(o)->proj_hidden, "0", "H", "projector hidden width (0 = 2C)", 0},         \
    {"fusion-layers", DFM_OPT_STR, &(o)->fusion, NULL, "LIST", "0-based decoder layers followed by a fusion block (default scaled from 9,16,24,31 of 32)", 0}, \
    {"xattn-heads", DFM_OPT_INT, &(o)->xattn_heads, "0", "N", "cross-attention heads (0 = the decoder's)", 0}, \
    {"gate", DFM_OPT_STR, &(o)->gate, "head", "KIND", "fusion gate per head or per channel", 0, .choices = "head|channel"},             \
    {"gate-bias", DFM_OPT_DOUBLE, &(o)->gate_bias, "0", "X", "initial gate bias (paper: 0 is best)", 0},      \
    {"mse-weight", DFM_OPT_DOUBLE, &(o)->mse_weight, "1.0", "X", "weight of the predictor loss (--pred-loss) in the loss", 0}, \
    {"pred-loss", DFM_OPT_STR, &(o)->pred_loss, "mse", "KIND", "predictor loss: mse (squared error summed over d, mean over valid slots) or mse_elem (mean over the K*d elements: 1/d of it)", 0, .choices = "mse|mse_elem"}, \
    {"memory-align", DFM_OPT_STR, &(o)->memory_align, "next", "A", "memory a token attends: next (of the chunk holding the token it predicts) or same (of its own chunk: ablation)", 0, .choices = "next|same"}, \
    {"fusion-memory", DFM_OPT_STR, &(o)->fusion_memory, TRAIN_FUSION_MEMORY_DEFAULT, "M", "memory fusion trains on: predicted, target (teacher forcing), mixed:P (each chunk its target with probability P) or mixed:P:decay (P falls linearly to 0 by the last step)", 0}, \
    {"fuse-first-chunk", DFM_OPT_FLAG, &(o)->fuse_first, NULL, NULL, "also fuse the placeholder-based memory into chunk 0", 0}, \
    {"content-only-fusion", DFM_OPT_FLAG, &(o)->content_only, NULL, NULL, "no capacity shortcut: the projector's biases (LayerNorm, fc1, fc2) held at 0, so a zero memory slot adds exactly nothing and the fusion's update comes from memory content alone (trainer/README.md)", 0}, \
    {"init-std", DFM_OPT_DOUBLE, &(o)->init_std, "0.02", "X", "std of the predictor's initial weights (projector, fusion: 1/sqrt(fan-in))", 0}

/* OpenMP and OpenBLAS threads; n <= 0 leaves the defaults. */
void train_set_threads(int64_t n);

/* The optimisation flags as the "train" object of a checkpoint's configuration (new reference). */
json_t *train_opts_json(const TrainOpts *o);

/* --device / --precision / --attention / --gpu into engine options. DFM_EARG for an unknown value. */
int train_engine_options(const TrainOpts *o, EngineOptions *eo);

/* Held-out sequences: the last --val-seqs (default 5 %), at least one batch (may exceed ds->n_seq). */
size_t train_held_out(const TrainOpts *o, const DataSet *ds);

/* --targets onto ds. A run's targets are checked against the token run: --tokens-run, else --data
 * when it is a run folder. Returns data_open_targets' code. */
int train_open_targets(const TrainOpts *o, DataSet *ds);

/* text (the value of flag) encoded by BACKBONE/tokenizer.json into *ids (malloc'd) and *n: 1 to L tokens (one chunk),
 * DFM_EARG naming the flag otherwise. */
int train_encode_prompt(const char *backbone, const char *flag, const char *text, int L, int **ids, int *n);

/* --objective reconstruct (train): ds = the reading set of --data (trainer/data/reading.h), with
 * --reading-prompt encoded by the backbone's tokenizer.json, --slots K (default 16) and the chunks' own slots from
 * --reading-slots FILE when given (else the encode stage's embeddings); o's sequence length
 * becomes 2 L, teacher forcing "target" and the predictor's weight 0 (the predictor is not trained: reading
 * has no preceding context to predict from), each change logged where it overrides a given value. */
int train_open_reading(TrainOpts *o, DataSet *ds);

#endif
