/* reading.h — the reading-pretraining set: every chunk of a run, to be regenerated from its own memory slot.
 *
 * Injected memory goes unread when the objective never needs it (the context already predicts most
 * tokens, so capacity is the easier way down; xRAG, ICAE). Reconstruction makes the memory necessary: the
 * frozen LM sees only a constant prompt and must regenerate a chunk's text from that chunk's own stored
 * embedding, fused as memory. The targets cost nothing: the slot a chunk fills here is the vector it fills
 * as a neighbour in the target records (the encode stage's row of that chunk).
 *
 * Sequence i (T = 2L tokens) is built from the run's i-th chunk j that holds any token:
 *   chunk 0: the prompt's tokens right-aligned in its L positions, filler before them (filler and prompt
 *            are padding, except the prompt's last token, which predicts chunk j's first token);
 *   chunk 1: chunk j's L tokens (its filler after n_valid is padding, as in a doc-aligned run).
 * Its target memory: chunk 0 none; chunk 1 slot 0 = chunk j's embedding, slots 1..K-1 empty. So the loss
 * falls on chunk j's tokens only, and each is predicted by a token that reads chunk 1's memory
 * (--memory-align next). Sequences follow chunk-id order: the held-out split (the last sequences) is the
 * run's last chunks, whole documents the modules never trained on.
 */
#ifndef DFM_TRAINER_READING_H
#define DFM_TRAINER_READING_H

#include "trainer/data/data.h"

/* ds = the reading set of RUN (a run with complete chunk and encode stages) for chunks of L tokens
 * and K memory slots. prompt: n_prompt token ids (1 <= n_prompt <= L). own_slots: NULL, or a targets file over
 * RUN's chunks (`dfm-train slots --own`, trainer/data/lm_slots.h) whose chunk c row (k <= K slots, its masks)
 * fills slots 0..k-1 instead of the encode stage's embedding (the encode stage is then not read). n_before: NULL,
 * or where the number of sequences whose chunk id is below split_chunk goes (they come first: a split by chunk id,
 * e.g. the chunks of a DFM run's training sequences against those of its held-out ones). DFM_EARG when the run's
 * chunks are not L tokens long or leave fewer than 2 sequences; the readers' errors otherwise (prefixed with the run). */
int data_open_reading(const char *run, int L, int K, const int *prompt, int n_prompt, const char *own_slots,
                      uint64_t split_chunk, size_t *n_before, DataSet *ds);

/* ds = the in-context reading set of RUN: its DFM sequences of T tokens (data_open), where chunk c's memory is chunk
 * c's own slot (slot 0 = the encode stage's row of c, or rows 0..k-1 of c in own_slots; the other slots empty), so the
 * tokens that predict chunk c read c's own content (--memory-align next) after c's real preceding context, not after a
 * constant prompt: reading where the context already names what the memory holds, as a question does. Chunk 0 of every
 * sequence gets none (data_batch). Sequences and split are the DFM run's. Errors as data_open_reading. */
int data_open_reading_context(const char *run, int T, int L, int K, const char *own_slots, DataSet *ds);

#endif
