/* stage.h — `dfm index` and `dfm retrieve` as whole stages over a run directory.
 *
 * What the commands call once their flags are parsed: open the run's sources (run_sources.h), apply the
 * stage contract of common/manifest.h on rank 0 and agree its outcome on every rank (skip a complete
 * stage with the same config, refuse a differing one without --force), run the core (retrieve.h), and
 * record the finished stage in RUN/manifest.json with the config recorded at its begin. An interrupted
 * index is redone whole; an interrupted retrieve keeps its finished blocks (retrieve.c).
 * Both are collective and return the same code on every rank. */
#ifndef DFM_RETRIEVER_STAGE_H
#define DFM_RETRIEVER_STAGE_H

#include "common/mpiutil.h"
#include "retriever/retrieve.h"

#include <jansson.h>

/* The index stage of o->run_dir. cfg: the stage's effective config (the flags' table, as the manifest
 * records it, borrowed); force: redo a complete or differing stage. */
int dfm_index_stage(const dfm_mpi *m, const dfm_index_opts *o, json_t *cfg, int force);

/* The retrieve stage of o->run_dir. datastore: NULL (search RUN's own index, which must be complete), or
 * the folder of another run whose complete index and chunks are searched (a query-only run; the stage
 * then records {"datastore": {"run", "chunks"}}); o->datastore_run is set here from it. */
int dfm_retrieve_stage(const dfm_mpi *m, dfm_retrieve_opts *o, const char *datastore, json_t *cfg, int force);

#endif
