/* vocab_map.h — a compact vocabulary: the token ids a run uses, numbered densely.
 *
 * A backbone pretrained on a small corpus with a 151k-id tokenizer spends most of its step on embedding
 * rows and LM-head columns of ids the corpus never holds. `dfm-train pretrain --compact-vocab` trains on
 * compact ids instead: compact id i stands for source (tokenizer) id ids[i], ids strictly increasing,
 * so the model's vocabulary is the number of distinct ids (unless --vocab says more). The map is stored beside
 * the model, and every command that reads tokens for that backbone (train, eval) maps them to compact ids;
 * generate maps the prompt in and the answer back out.
 *
 * The file (MODEL_DIR/vocab_map.bin) and its note in config.json: schemas/vocab_map.md.
 */
#ifndef DFM_TRAINER_VOCAB_MAP_H
#define DFM_TRAINER_VOCAB_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "trainer/data/data.h"

typedef struct {
    uint32_t n;            /* compact ids */
    uint32_t source_vocab; /* largest source id + 1 */
    uint32_t *to_source;   /* [n] */
    int32_t *to_compact;   /* [source_vocab], -1 where the id is not used */
} VocabMap;

/* The ids that occur in tokens[0, n) (all >= 0). DFM_ENOMEM. */
int vocab_map_build(const int *tokens, size_t n, VocabMap *vm);
void vocab_map_free(VocabMap *vm);

/* Source ids to compact ids in place. DFM_EMISMATCH naming `what` and the first id the map lacks. */
int vocab_map_to_compact(const VocabMap *vm, int *ids, size_t n, const char *what);
/* Compact ids to source ids in place (ids outside [0, n) are left as they are: padding or -1). */
void vocab_map_to_source(const VocabMap *vm, int *ids, size_t n);

/* Write MODEL_DIR/vocab_map.bin and add "dfm_vocab_map" to MODEL_DIR/config.json (atomically). */
int vocab_map_save(const VocabMap *vm, const char *model_dir);
/* Read MODEL_DIR/vocab_map.bin into *vm; *found = 0 (and DFM_OK) when the folder has none.
 * DFM_EFORMAT / DFM_EVERSION / DFM_ETRUNCATED / DFM_ECHECKSUM for a damaged file. */
int vocab_map_load(const char *model_dir, VocabMap *vm, int *found);

/* pretrain --compact-vocab: build the map of ds's tokens and renumber them (ds->max_token = n - 1). */
int vocab_map_compact_data(DataSet *ds, VocabMap *vm);
/* When the backbone folder has a vocab_map.bin, renumber ds's tokens through it (train, eval); a
 * no-op otherwise. DFM_EMISMATCH for a token the backbone never saw. */
int vocab_map_apply_backbone(const char *model_dir, DataSet *ds);

#endif
