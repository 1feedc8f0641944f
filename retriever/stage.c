/* stage.c — the index and retrieve stages around their cores: sources, the stage contract, the manifest
 * entry (stage.h). */
#include "retriever/stage.h"

#include "common/error.h"
#include "common/manifest.h"
#include "retriever/run_sources.h"
#include "schemas/neighbor_shard.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* one index shard, whole: sidecar, size, hash, and FAISS can read it */
static int index_file_ok(const char *path) {
    FaissIndex *idx = NULL;
    dfm_index_info info;
    DFM_TRY(dfm_index_load(path, 0, -1, &idx, &info));
    faiss_Index_free(idx);
    return DFM_OK;
}

/* The stage contract (common/manifest.h) on rank 0, its outcome on every rank (*skip); agreed. */
static int stage_begin(const dfm_mpi *m, const char *run, const char *name, json_t *cfg, int force, int *skip) {
    int rc = DFM_OK, sk = 0;
    if (m->rank == 0) {
        json_t *man = NULL;
        dfm_stage_spec spec = {name, cfg, NULL, force, m->size};
        spec.file_ok = !strcmp(name, "index") ? index_file_ok : dfm_nbr_block_check;
        dfm_stage_action act = DFM_STAGE_FRESH;
        rc = dfm_manifest_load(run, 0, &man);
        if (!rc) rc = dfm_stage_begin(man, run, &spec, &act);
        sk = act == DFM_STAGE_SKIP;
        json_decref(man);
    }
    rc = dfm_mpi_agree(m, rc);
    if (!rc) rc = DFM_MPI_CHECK(MPI_Bcast(&sk, 1, MPI_INT, 0, m->comm));
    *skip = sk;
    return rc;
}

/* rank 0: the finished stage object st into the manifest, with the config recorded at its begin
 * (what later runs compare against, whatever the core resolved since) */
static int stage_end(const dfm_mpi *m, const char *run, const char *name, json_t *st) {
    if (m->rank != 0) return DFM_OK;
    json_t *man = NULL;
    DFM_TRY(dfm_manifest_load(run, 0, &man));
    json_t *cfg = json_object_get(dfm_manifest_stage(man, name), "config");
    json_incref(st);
    if (cfg) json_object_set(st, "config", cfg);
    int rc = dfm_manifest_set_stage(man, name, st);
    if (!rc) rc = dfm_manifest_save(run, man);
    json_decref(man);
    return rc;
}

int dfm_index_stage(const dfm_mpi *m, const dfm_index_opts *o, json_t *cfg, int force) {
    const char *run = o->run_dir;
    dfm_run_sources src = {0};
    json_t *stage = NULL;
    int skip = 0;
    int rc = dfm_run_sources_open(run, &src);
    rc = dfm_mpi_agree(m, rc);
    if (!rc) rc = stage_begin(m, run, "index", cfg, force, &skip);
    if (!rc && !skip) rc = dfm_index_build(m, o, &src.vs, &src.cs, src.emb->block_chunks, &stage);
    if (!rc && !skip) rc = stage_end(m, run, "index", stage);
    rc = dfm_mpi_agree(m, rc);
    json_decref(stage);
    dfm_run_sources_close(&src);
    return rc;
}

int dfm_retrieve_stage(const dfm_mpi *m, dfm_retrieve_opts *o, const char *datastore, json_t *cfg, int force) {
    const char *run = o->run_dir;
    json_t *stage = NULL, *man = NULL, *dman = NULL;
    dfm_run_sources src = {0}, dsrc = {0};
    char *ds_abs = NULL;
    int skip = 0;
    int rc = dfm_run_sources_open(run, &src);
    if (!rc) rc = dfm_manifest_load(run, 0, &man);
    if (!rc && !datastore) rc = dfm_manifest_require_complete(man, "index", run);
    if (!rc && datastore) { /* a query-only run: the datastore's index, chunks and rows */
        if (!(ds_abs = realpath(datastore, NULL))) rc = DFM_FAIL(DFM_ENOTFOUND, "--datastore %s: %s", datastore, strerror(errno));
        if (!rc) rc = dfm_run_sources_open(ds_abs, &dsrc);
        if (!rc) rc = dfm_manifest_load(ds_abs, 0, &dman);
        if (!rc) rc = dfm_manifest_require_complete(dman, "index", ds_abs);
        if (rc) dfm_error_prefix("--datastore %s", datastore);
    }
    o->datastore_run = ds_abs;
    rc = dfm_mpi_agree(m, rc);
    if (!rc) rc = stage_begin(m, run, "retrieve", cfg, force, &skip);
    if (!rc && !skip)
        rc = dfm_retrieve_run(m, o, &src.vs, &src.cs, src.emb->block_chunks, ds_abs ? &dsrc.vs : NULL, ds_abs ? &dsrc.cs : NULL,
                              dfm_manifest_stage(ds_abs ? dman : man, "index"), &stage);
    if (!rc && !skip && stage && ds_abs) /* rank 0: which run the neighbour ids index (shard/target_source.c reads it) */
        json_object_set_new(stage, "datastore", json_pack("{s:s, s:I}", "run", ds_abs, "chunks", (json_int_t)dsrc.vs.n_rows));
    if (!rc && !skip) rc = stage_end(m, run, "retrieve", stage);
    rc = dfm_mpi_agree(m, rc);
    o->datastore_run = NULL;
    json_decref(stage);
    json_decref(man);
    json_decref(dman);
    free(ds_abs);
    dfm_run_sources_close(&dsrc);
    dfm_run_sources_close(&src);
    return rc;
}
