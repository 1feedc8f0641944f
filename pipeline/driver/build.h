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
 * Rank 0 first takes the run lock (common/runlock.h: a second writer is refused at once). Each stage
 * is then called as `dfm STAGE RUN [INPUTS] --config CONFIG [--force]` and follows the stage contract
 * (common/manifest.h): a complete identical stage does nothing, an interrupted one resumes, a changed
 * one is refused unless --force. Rank 0 logs "build: stage S skipped|ran in T s" for each stage
 * ("skipped": its manifest entry is unchanged) and prints one summary table from the manifest.
 */
#ifndef DFM_DRIVER_BUILD_H
#define DFM_DRIVER_BUILD_H

#include "common/mpiutil.h"

typedef struct {
    const char *config; /* the JSON config file */
    const char *run;    /* the run directory (NULL: "run" in the config) */
    const char *stages; /* comma-separated stages to run (NULL: all) */
    int force;          /* pass --force to every stage */
    int check;          /* dfm_build_check instead of dfm_build_run */
} dfm_build_config;

/* Collective over m: the stages of cfg in pipeline order, each agreed by all ranks, then rank 0's
 * summary. DFM_EARG for an unreadable config, no run directory, no inputs or an unknown stage name. */
int dfm_build_run(const dfm_mpi *m, const dfm_build_config *cfg);
/* `dfm build CONFIG --check`: no MPI, no lock, nothing run. DFM_OK (printing one line per stage) if every
 * stage of cfg->stages (all: the whole pipeline) is "complete" in the run's manifest, else the DFM_ESTATE of
 * the first that is not, naming the command that completes it. It reads the manifest only (the files'
 * checksums are checked when a stage or reader opens them): what a job script asks after its step, since a
 * step that fails to launch can leave srun with status 0 (jobs/dfm-stage.sbatch). */
int dfm_build_check(const dfm_build_config *cfg);

#endif
