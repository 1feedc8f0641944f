/* generate.h — greedy decoding as at DFM inference: the memory is predicted once from the prompt's
 * chunks and held fixed while the answer is generated. No retrieval. */
#ifndef DFM_TRAINER_GENERATE_H
#define DFM_TRAINER_GENERATE_H

#include "trainer/model/model.h"

/* seq[0, n) is the prompt; fills seq[n, total) with the argmax token at each position. T (a multiple
 * of the chunk length, >= total) is the length m runs at (m was created for batches of one sequence of
 * T tokens); seq holds T ids. Chunk c <= n / L takes the memory predicted for the prompt's chunk c,
 * later chunks that of chunk n / L. no_memory: fusion off (the frozen backbone alone). Returns the
 * forward passes' code. */
int generate_greedy(DfmModel *m, int *seq, int n, int total, int T, int no_memory);

#endif
