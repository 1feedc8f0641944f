/* margin.h — the margin against shuffled memory (dfm-train train --margin-weight W --margin M):
 *
 *   loss = CE(own memory) + mse_weight · predictor loss + W · relu(M + CE(own) − CE(shuffled))
 *
 * CE(shuffled) is the same micro-batch through the same modules with every sequence b fusing the target
 * slots (and mask) of its partner (b + B/2) mod B, the rule of the evaluation's shuffled control
 * (evaluate.h). Where the own memory helps by at least M nats per token the term is 0; below that, the
 * only way down is through the memory's content: lowering CE(own) alone is rewarded (1 + W) times, and
 * raising CE(shuffled) W times, so a capacity that serves both (the fusion's learned values and biases)
 * gains nothing from the term. The hinge is taken on the micro-batch's mean CE.
 *
 * What a pass fuses: the step's memory mode, unchanged. With --fusion-memory target every chunk reads the
 * (partner's) target slots; with mixed:P the teacher-forced chunks read the partner's target and the others
 * the sequence's own predicted slots, so the term acts on the teacher-forced chunks only. The predictor
 * loss is counted once, in the own pass (the shuffled pass has weight 0 on it: its targets are the
 * partner's).
 *
 * Cost per micro-batch: two forwards without gradient (CE own, CE shuffled), then the own forward and
 * backward with its gradient scaled by 1 + W·[hinge active], and, when the hinge is active, the shuffled
 * forward and backward scaled by −W: 3 forwards and 1 backward where the margin is met, 4 and 2 where not.
 */
#ifndef DFM_TRAINER_MARGIN_H
#define DFM_TRAINER_MARGIN_H

#include <stddef.h>
#include <stdint.h>

#include "trainer/run/engine.h"

typedef struct {
    float weight; /* W (> 0: the margin is on) */
    float margin; /* M, nats per token */
} MarginConfig;

/* One micro-batch: its own arrays and room for the partner's memory (B*NC*K*d floats, B*NC*K bytes). */
typedef struct {
    const int *inputs, *targets;
    const float *tmem;
    const uint8_t *tmask;
    float *shuf_mem;
    uint8_t *shuf_mask;
    int B, T;
} MarginBatch;

/* Called before and after each of the (up to 4) forwards, with pass 0..3 (e.g. to give the model a cached
 * frozen prefix, and to store it after the first); either may be NULL. */
typedef struct {
    void (*before)(void *ctx, int pass);
    void (*after)(void *ctx, int pass);
    void *ctx;
} MarginHooks;

typedef struct {
    double ce_own, ce_shuf; /* mean CE of the micro-batch with its own and with the partner's memory */
    double mse, loss;       /* the own pass's predictor loss (per element) and the loss above */
    int active;             /* M + CE(own) − CE(shuffled) > 0 */
} MarginResult;

/* The partner's memory: sequence b of out gets sequence (b + B/2) mod B of tmem / tmask (B >= 2: never
 * itself). per_seq: slots per sequence (NC·K). */
void margin_partner_memory(const float *tmem, const uint8_t *tmask, int B, size_t per_seq, int d, float *mem_out,
                           uint8_t *mask_out);

/* The margin's passes over batch b, gradients added to the engine's (scaled by scale: 1 / accumulation
 * steps). Staging: b (its own arrays) is already staged on the engine for the next forward, as the
 * training loop stages every batch; this stages the later passes itself. mode: the step's memory mode
 * (MEM_TARGET or MEM_MIXED: the shuffled pass swaps target slots). mse_weight: the configured predictor
 * weight, restored on the engine on return. */
int margin_step(Engine *en, const DfmModel *m, const MarginConfig *c, const MarginBatch *b, int mode, float scale,
                float mse_weight, const MarginHooks *h, MarginResult *r);

#endif
