/* lm_slots.h — memory slots in the frozen LM's own space: each neighbour chunk's hidden states at a chosen
 * depth, token by token or pooled, in place of its sentence-encoder embedding (`dfm-train slots`).
 *
 * Why. The fusion's cross-attention reads the LM's residual stream; a MiniLM vector is a foreign space the
 * projector must map into it, and one pooled vector per neighbour keeps little of its tokens. RETRO's values
 * are token-level states of the neighbour and its continuation; ICAE's slots live in the LM's own space. Here a
 * slot can be one token's state (pool = L: K x L slots, the RETRO-like upper bound) or the mean over L / pool
 * consecutive tokens (pool = 1: one vector per neighbour, the same count as today's slots).
 *
 * What a chunk's states are. Datastore chunk j (tokens [jL, jL+L) of its run, the filler after n_valid left
 * out) is run alone through the frozen backbone after a constant prefix (the reading prompt, "Text:"): the
 * sequence [prefix][chunk j's L tokens], positions from 0, so the states depend on the chunk's text alone, as
 * the sentence encoder's vector does, and the first position (where decoders park their attention sink) is the
 * prefix's. The residual stream after `layer` decoder blocks at the chunk's positions is averaged per group
 * of L / pool tokens (valid tokens only) and scaled to unit L2 norm, as the encoder's vectors are. A group
 * with no valid token is an empty slot (mask 0).
 *
 * The file written is a simple targets file (schemas/targets_file.md) over the chunks of the token run
 * --data, so `dfm-train train --targets FILE`, `eval` and dfm.Batches(targets=FILE) read it unchanged:
 *   neighbours mode: chunk c's slot j*pool + g = group g of the neighbour in slot j of c's target record
 *                    (the first `neighbours` slots, rank order; an empty record slot gives pool empty slots);
 *   own mode:        chunk c's slots 0..pool-1 = its own states (the reading stage's memory:
 *                    `train --objective reconstruct --reading-slots FILE`).
 * Cost: one backbone forward of (prefix + L) tokens through `layer` blocks per distinct chunk used, and
 * N x K x pool x C floats in memory and on disk (N chunks of --data, C the backbone's width). */
#ifndef DFM_TRAINER_LM_SLOTS_H
#define DFM_TRAINER_LM_SLOTS_H

#include <stdint.h>

#include "trainer/data/data.h"
#include "trainer/model/model.h"

typedef struct dfm_target_reader dfm_target_reader;

typedef struct {
    int layer;      /* the residual stream after this many decoder blocks (1 .. the backbone's layers) */
    int pool;       /* slots per chunk; a divisor of L (L: one slot per token) */
    int neighbours; /* neighbours mode: record slots taken, best-ranked first (0: all of the record's) */
    int batch;      /* chunks per backbone forward */
} LmSlotOptions;

typedef struct {
    uint64_t chunks_out;     /* chunks of --data written */
    uint64_t states_chunks;  /* distinct datastore chunks run through the backbone */
    uint64_t slots_valid;    /* slots with mask 1 */
    int k_out, d_out;        /* slots per chunk and their width in the file */
} LmSlotStats;

/* Write OUT: the LM-state slots of every chunk of ds (a chunk run opened with T = L). tr: the target records of
 * ds's chunks (their ids name chunks of store), or NULL for own mode (store = ds). store: the datastore's
 * tokens opened with T = L. m: the backbone alone, created for o->batch sequences of n_prefix + L tokens.
 * prefix: n_prefix >= 1 token ids. DFM_EARG for options that do not fit (layer, pool, neighbours); DFM_EFORMAT
 * for an id outside the datastore or a token outside the backbone's vocabulary, naming the chunk. */
int lm_slots_build(DfmModel *m, const DataSet *ds, dfm_target_reader *tr, const DataSet *store, int L,
                   const int *prefix, int n_prefix, const LmSlotOptions *o, const char *out, LmSlotStats *st);

#endif
