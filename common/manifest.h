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
 * targets, audit): once a stage is redone, what was built from its old output is stale. */
void dfm_manifest_drop_later(json_t *m, const char *stage);
/* DFM_OK if stage exists with state "complete", else DFM_ESTATE saying which command to run. */
int dfm_manifest_require_complete(json_t *m, const char *stage, const char *run_dir);
/* Integer count of a stage ("chunk", "chunks") or -1 if absent. */
long long dfm_manifest_count(json_t *m, const char *stage, const char *count);

#endif
