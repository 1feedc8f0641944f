/* evaluate.h — held-out evaluation, written once against engine.h (CPU or CUDA): predicted memory, fusion
 * off, target memory and the shuffled controls of the memory modes, each also by position inside the chunk;
 * used by dfm-train train (every --eval-every steps), dfm-train eval and the reading pass's evaluation. */
#ifndef DFM_TRAINER_EVALUATE_H
#define DFM_TRAINER_EVALUATE_H

#include <jansson.h>
#include <stdio.h>

#include "trainer/data/data.h"
#include "trainer/data/prefetch.h"
#include "trainer/model/model.h"
#include "trainer/run/engine.h"
#include "trainer/run/train_opts.h"

/* Mean held-out losses over n_batches batches, and the CE by position of the predicted token inside its
 * chunk (model_ce_by_position; j = 0 is a chunk's first token) for each mode: pos[EVAL_PRED / _NONE /
 * _TARGET / _PRED_SHUF / _TARGET_SHUF][j], j < L (NULL when the mode did not run). eval_result_free
 * releases them.
 *
 * The shuffled controls keep the trained modules and swap the memory: held-out sequence i of the n
 * evaluated fuses the memory of sequence (i + n/2) mod n (predicted slots, or target slots and mask), chunk
 * for chunk; everything else is the same forward. The modules add parameters beside the frozen LM, so
 * "fusion off" removes capacity with the memory; the control removes the memory only. The memory effect
 * is ce_*_shuf - ce_* (positive: the sequence's own memory helps); batch[] gives it per batch, and eval_json its
 * standard error over the batches. */
enum { EVAL_PRED = 0, EVAL_NONE = 1, EVAL_TARGET = 2, EVAL_PRED_SHUF = 3, EVAL_TARGET_SHUF = 4, EVAL_NMODES = 5 };
typedef struct {
    double ce_pred, ce_none, ce_target, ce_pred_shuf, ce_target_shuf, mse, cos;
    long n_batches;
    int L, shuffled; /* shuffled: the controls ran */
    double *pos[EVAL_NMODES];
    double acc[EVAL_NMODES]; /* top-1 token accuracy of each mode that ran (NaN otherwise): the share of
                                positions with a target where it is the argmax, i.e. what greedy decoding emits */
    double acc_n[EVAL_NMODES][2]; /* its sums while evaluating: correct positions, positions */
    double *batch[EVAL_NMODES];   /* each batch's mean CE in every mode that ran (n_batches each; NULL otherwise):
                                     the spread of the memory effect over batches, its noise */
} EvalResult;
void eval_result_free(EvalResult *r);

/* Held-out evaluation of sequences [first, first + count) in batches of B (at most max_batches; <= 0 =
 * all) on en's device. modes: bit 1 predicted memory, bit 2 fusion off, bit 4 target memory (when ds
 * has targets), bit 8 the shuffled controls of the memory modes that run (at least 2 sequences); a
 * pretraining model always gives ce_none. Data is read through pf's lock when loader threads run (pf may
 * be NULL). DFM_EARG when count is smaller than one batch. */
enum { EVAL_MODE_PRED = 1, EVAL_MODE_NONE = 2, EVAL_MODE_TARGET = 4, EVAL_MODE_SHUFFLE = 8, EVAL_MODE_ALL = 15 };
/* The modes of dfm-train's evaluations: every one, the controls unless --memory-control none. */
int train_eval_modes(const TrainOpts *o);
int evaluate(Engine *en, DfmModel *m, DataSet *ds, Prefetcher *pf, size_t first, size_t count, int B,
             long max_batches, int modes, EvalResult *r);

/* Logs e at step, each mode named for what it is (target memory is a retrieval bound only for modules
 * trained with it), and appends {"step", "eval": eval_json} to logf as one JSON line when logf is not
 * NULL. has_t: the data has targets (else ce_target is reported as n/a / NaN). */
void eval_print(FILE *logf, long step, const DfmModel *m, const EvalResult *e, int has_t);
/* The evaluation as a JSON object: ce_pred, ce_none, ce_target (NaN without targets), mse, cos, batches,
 * trained_with_target (the modules saw target memory in training), ce_pos_pred / ce_pos_none /
 * ce_pos_target (per-position CE lists), acc_pred / acc_none / acc_target (top-1 token accuracy); with the controls also ce_pred_shuffled, ce_target_shuffled,
 * memory_effect_pred (ce_pred_shuffled - ce_pred), memory_effect_target, their ce_pos_* lists and acc_*, and
 * per batch memory_effect_pred_batches / _target_batches with memory_effect_pred_se / _target_se (standard error of
 * the mean over the batches; null with one batch); a
 * pretraining model: ce, batches. */
json_t *eval_json(const DfmModel *m, const EvalResult *e, int has_t);

#endif
