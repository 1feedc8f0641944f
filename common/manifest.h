/* manifest.h — RUN/manifest.json: what a run directory holds and how it got there.
 *
 *   {
 *     "format": "dfm-manifest", "version": 1, "dfm_version": "0.1.0",
 *     "stages": {
 *       "chunk": {
 *         "state": "running" | "complete",
 *         "ranks": 2,
 *         "config": { ...effective flags of the stage... },
 *         "inputs": [ {"path": "...", "bytes": N, "xxh128": "..."} ],
 *         "counts": { "documents": N, "tokens": N, ... },
 *         "timings": { "total_s": 1.23, ... },
 *         "outputs": [ {"file": "chunk/chunks-00000.bin", "first_chunk": 0, "n_chunks": N, ...} ]
 *       }, ...
 *     }
 *   }
 * Spec: schemas/manifest.md. Only rank 0 writes it, always atomically (temp + rename).
 */
#ifndef DFM_MANIFEST_H
#define DFM_MANIFEST_H

#include <jansson.h>

#define DFM_MANIFEST_VERSION 1

/* Load RUN/manifest.json. A missing file gives a new empty manifest when create != 0, else
 * DFM_ENOTFOUND. A malformed or newer-version file is DFM_EFORMAT / DFM_EVERSION naming it. */
int dfm_manifest_load(const char *run_dir, int create, json_t **out);
/* Write RUN/manifest.json atomically (pretty-printed, keys in insertion order). */
int dfm_manifest_save(const char *run_dir, json_t *m);
/* The stage object (borrowed), or NULL. */
json_t *dfm_manifest_stage(json_t *m, const char *stage);
/* Replace the stage object (takes ownership of obj). */
int dfm_manifest_set_stage(json_t *m, const char *stage, json_t *obj);
/* Remove every stage that comes after `stage` in the pipeline (chunk, encode, index, retrieve,
 * targets, audit) from m only: once a stage is redone, what was built from its old output is stale.
 * Stages use dfm_stage_begin, which also removes their files. */
void dfm_manifest_drop_later(json_t *m, const char *stage);
/* DFM_OK if stage exists with state "complete", else DFM_ESTATE saying which command to run. */
int dfm_manifest_require_complete(json_t *m, const char *stage, const char *run_dir);
/* The generation of a complete stage: 16 hex digits, new each time the stage runs (given by
 * dfm_stage_begin, kept by dfm_manifest_set_stage), "" when none is recorded (a run of an older dfm). Readers compare it before and
 * after opening a stage's files, and between readers of one job (schemas/manifest.md, "Readers"). */
const char *dfm_manifest_generation(json_t *m, const char *stage);
/* For readers: DFM_OK if stage is complete; else DFM_ESTATE, naming the writer from RUN/.lock when one is
 * rebuilding the run ("being rebuilt by host H pid P command C since T"), else as
 * dfm_manifest_require_complete. */
int dfm_manifest_require_readable(json_t *m, const char *stage, const char *run_dir);
/* For readers: load run_dir's manifest, copy stage's generation into gen ("" when none) and check the
 * stage as dfm_manifest_require_readable does. */
int dfm_manifest_read_generation(const char *run_dir, const char *stage, char gen[17]);
/* Integer count of a stage ("chunk", "chunks") or -1 if absent. */
long long dfm_manifest_count(json_t *m, const char *stage, const char *count);

/* ---- The stage contract (schemas/manifest.md, "Stage contract"): every writing stage, one home ----
 *
 * A stage's rank 0 calls dfm_stage_begin before the stage writes anything, with the stage's effective
 * config (and, for the chunk stage, its hashed inputs); all ranks then follow *action:
 *
 *   manifest entry of the stage           no --force            --force
 *   none                                  DFM_STAGE_FRESH       DFM_STAGE_FRESH
 *   complete, same config and inputs      DFM_STAGE_SKIP        DFM_STAGE_FRESH
 *   running,  same config and inputs      DFM_STAGE_RESUME      DFM_STAGE_FRESH
 *   other config or inputs                DFM_EMISMATCH         DFM_STAGE_FRESH
 *
 * A stage recorded complete is re-checked before it is skipped, never trusted: every file its
 * "outputs" name must exist and, with spec->file_ok, open whole (checksums), and spec->intact (when
 * set) must say the files are whole; otherwise it is resumed (RESUME), which redoes what is missing
 * or damaged.
 *
 * SKIP writes nothing. FRESH and RESUME, in this order: take the run lock (common/runlock.h); remove
 * the later stages from the manifest and save it; then delete their folders (RUN/<stage>), so a crash
 * in between leaves no stage claiming files that are gone; FRESH also empties the stage's own folder;
 * delete the temporaries of dead writers (*.tmp.PID, see common/fsutil.h) in the stage's folder and of
 * the manifest (under the lock, every writer that made one is gone); finally record the stage as
 * "running" with ranks, config and inputs, and save. The stage then resumes what it can (RESUME) and
 * marks itself "complete" at the end. */
typedef enum { DFM_STAGE_FRESH = 0, DFM_STAGE_RESUME = 1, DFM_STAGE_SKIP = 2 } dfm_stage_action;

typedef struct {
    const char *stage; /* the manifest key: chunk, encode, index, retrieve, targets */
    json_t *config;    /* the effective config (borrowed; copied into the manifest) */
    json_t *inputs;    /* hashed input files (borrowed), or NULL when the stage's input is the stage before */
    int force;         /* --force */
    int ranks;         /* ranks of this run */
    /* optional, for a complete identical stage: 1 if its files on disk are whole, 0 if not */
    int (*intact)(void *ctx, const char *run_dir);
    void *intact_ctx;
    /* optional: DFM_OK if one output file (full path) opens whole in its format (magic, version,
     * header and payload checksums), else a DFM_E* code with the message set */
    int (*file_ok)(const char *path);
} dfm_stage_spec;

/* The contract above, on rank 0, on the loaded manifest m of run_dir (saved by this call unless SKIP).
 * DFM_EMISMATCH names the first differing config key (or the inputs) and the hint; DFM_ESTATE when
 * another process holds the run lock; DFM_EIO naming a file that cannot be removed. */
int dfm_stage_begin(json_t *m, const char *run_dir, const dfm_stage_spec *spec, dfm_stage_action *action);

/* The command that makes a stage ("targets" -> "write-targets"), for hints. */
const char *dfm_stage_command(const char *stage);

#endif
