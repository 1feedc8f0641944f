/* reconstruct_mix.h — `dfm-train train --reconstruct-weight W`: the reading objective kept alive during DFM training.
 *
 *   loss = DFM loss (CE + mse_weight · predictor loss, and any margin or KL term) + W · reconstruction CE
 *
 * Why. A reading stage (--objective reconstruct, trainer/data/reading.h) teaches the fusion to regenerate a chunk from
 * its own memory slot, and DFM training started from its modules (--init-modules) abandons what it learnt: at 2400
 * invented entities the stage's modules reconstruct held-out chunks at 3.45 nats per token with their own slot against
 * 4.59 with a shuffled one, yet after 150 DFM steps own memory beats shuffled memory by 0.25 nats per probe answer, no
 * more than from scratch (bench/results/report-memory.md, "Ten times the entities"). The DFM objective has an easier
 * way down (capacity), so nothing keeps the reading. Here every DFM micro-batch is followed by a micro-batch of the
 * same run's reading set, whose loss can only fall through the slot's content.
 *
 * The reading batches: R sequences of 2 L tokens (--reconstruct-batch; 0 = B T / 2L, the tokens of a DFM micro-batch),
 * each a chunk regenerated after the --reading-prompt from its own slot (the encode stage's embedding, or its own
 * slots of --reading-slots: the space of --targets). Only the chunks of the DFM run's training sequences are drawn
 * (sequence i holds chunks i T/L to (i+1) T/L - 1); those of its held-out sequences are the reading evaluation's. The
 * draw of micro-batch a of step s on rank r of W is the stretch at position ((s · accum + a) · W + r) · R of a stream of
 * permutations of the training chunks, one per epoch, seeded by --seed: a pure function of those numbers, so a resumed
 * run and any rank split draw the same chunks, as DFM batches do. Fusion reads the target slot; the predictor's loss
 * weight is 0 in this pass (a chunk after a constant prompt has no context to predict its memory from).
 *
 * --reconstruct-context: the reading pass is instead the DFM run's own training sequences (R of T tokens; default B),
 * each chunk's memory its own slot (data_open_reading_context): the chunk is regenerated after its real preceding
 * context, as a question's answer would be, rather than after a constant prompt; the held-out sequences evaluate it.
 *
 * --reconstruct-memory shuffled: each reading sequence reads the memory of another of its micro-batch (the partner
 * rule of the evaluation's shuffled control, margin_partner_memory): the same extra passes over the corpus' text, with
 * nothing in the slot to read; what an arm gains with own slots beyond this control is reading, not more training on
 * the text. --memory-ablation zero zeroes the reading pass's slots too (the matched-capacity control trains on no
 * memory content anywhere); --memory-ablation random is refused beside it (no fixed code per reading chunk).
 *
 * Engine contract: the reading pass forwards a batch of its own, so nothing may be staged on the engine when it runs
 * (train_loop.c stages the next DFM batch after it). Cost: one more forward and backward of as many tokens per
 * micro-batch. With --cache-frozen the reading sequences get a frozen cache of their own (CPU).
 */
#ifndef DFM_TRAINER_RECONSTRUCT_MIX_H
#define DFM_TRAINER_RECONSTRUCT_MIX_H

#include <stddef.h>
#include <stdint.h>

#include "common/mpiutil.h"
#include "trainer/data/data.h"
#include "trainer/data/frozen_cache.h"
#include "trainer/model/model.h"
#include "trainer/run/engine.h"
#include "trainer/run/evaluate.h"
#include "trainer/run/train_opts.h"

typedef struct {
    DataSet ds;           /* the reading set of --data */
    Loader ld;            /* over its training chunks [0, ntrain) */
    size_t ntrain, nval;  /* reading sequences of the DFM training chunks; of the held-out ones (after them) */
    int B, T;             /* R, 2 L */
    float weight;         /* W */
    int shuffled, zero;   /* --reconstruct-memory shuffled; --memory-ablation zero */
    int *inp, *tgt;       /* one batch */
    float *tmem, *smem;   /* its own slots; the partners' (shuffled) */
    uint8_t *tmask, *smask;
    size_t *idx;
    FrozenCache fc;       /* --cache-frozen */
    int use_fc;
} ReconMix;

/* For a DFM run of model m on o (--data a run with chunk and encode stages, or --reading-slots), whose first
 * dfm_ntrain sequences of o->seq_len tokens train: the reading set, its split and buffers. use_cache: --cache-frozen
 * on the CPU engine. DFM_EARG for a batch that does not fit m, a run that leaves no training chunk, shuffled
 * memory with fewer than 2 sequences a micro-batch, or --memory-ablation random; the reading set's errors, prefixed
 * with the flag. */
int recon_mix_open(ReconMix *r, const TrainOpts *o, const DfmModel *m, size_t dfm_ntrain, int use_cache);
void recon_mix_close(ReconMix *r);

/* The reading pass of micro-batch a (of accum) of step `step` on rank mp->rank of mp->size: forward and backward,
 * its gradient added to the engine's with scale W / accum; its mean CE into *ce. mse_weight: the predictor loss's
 * weight, restored on the engine afterwards. Nothing may be staged on en. */
int recon_mix_micro(ReconMix *r, Engine *en, DfmModel *m, long step, int a, int accum, const dfm_mpi *mp,
                    float mse_weight, double *ce);

/* The held-out reading chunks (at most max_batches batches; <= 0 = all) evaluated as evaluate() does: own slot
 * (target), shuffled slot, fusion off. *ran = 0 (and DFM_OK, e untouched) when fewer than 2 chunks are held out. */
int recon_mix_eval(ReconMix *r, Engine *en, DfmModel *m, long max_batches, int modes, EvalResult *e, int *ran);

#endif
