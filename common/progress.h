/* progress.h — one progress line for work spread over all ranks.
 *
 * Every rank calls dfm_progress_update() with its own count as it goes; rank 0 adds up the
 * latest counts of all ranks (sent without blocking, at most every 0.25 s) and prints
 *   [chunk] 1.2M/3.4M documents (35.3%) 210k/s ETA 10s
 * On a terminal the line is redrawn in place; otherwise a line is printed every
 * DFM_PROGRESS_INTERVAL seconds (default 30), so batch logs stay short. DFM_PROGRESS=0 silences it.
 * Begin and end are collective.
 */
#ifndef DFM_PROGRESS_H
#define DFM_PROGRESS_H

#include "common/mpiutil.h"

#include <stdint.h>

typedef struct dfm_progress dfm_progress;

/* Collective. total_local: this rank's total (0 if unknown); unit: "documents", "chunks", ... */
int dfm_progress_begin(const dfm_mpi *m, const char *stage, const char *unit, uint64_t total_local, dfm_progress **out);
/* Not collective; cheap to call often. */
void dfm_progress_update(dfm_progress *p, uint64_t done_local);
/* Collective: prints the final line (rank 0) and frees. NULL is a no-op. */
void dfm_progress_end(dfm_progress *p);

#endif
