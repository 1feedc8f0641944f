/* build.h — `dfm build CONFIG`: the whole pipeline (or some of its stages) in one MPI job from one config.
 *
 * CONFIG is a JSON object:
 *   {
 *     "run": "runs/demo",                 (or --run DIR)
 *     "inputs": ["corpus/a.jsonl"],       the chunk stage's inputs
 *     "chunk":   { "seq-len": 1024, ... },  each stage's flags, as in `dfm STAGE --help`
 *     "encode":  { ... }, "index": { ... }, "retrieve": { ... }, "write-targets": { ... }
 *   }
 * Top-level keys that are a stage's flag name apply to every stage that has that flag.
 * Each stage is called as `dfm STAGE RUN [INPUTS] --config CONFIG`: a stage the manifest records as
 * complete with the same configuration does nothing, an interrupted one resumes or restarts as that
 * stage defines, and a stage whose inputs or configuration changed is refused unless --force.
 * At the end rank 0 prints one summary table from the manifest.
 */
#ifndef DFM_DRIVER_BUILD_H
#define DFM_DRIVER_BUILD_H

#include "common/mpiutil.h"

typedef struct {
    const char *config; /* the JSON config file */
    const char *run;    /* the run directory (NULL: "run" in the config) */
    const char *stages; /* comma-separated stages to run (NULL: all) */
    int force;          /* pass --force to every stage */
} dfm_build_config;

/* Collective over m: the stages of cfg in pipeline order, each agreed by all ranks, then rank 0's
 * summary. DFM_EARG for an unreadable config, no run directory, no inputs or an unknown stage name. */
int dfm_build_run(const dfm_mpi *m, const dfm_build_config *cfg);

#endif
