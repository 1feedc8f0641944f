/* write_targets.c — the write-targets stage (see write_targets.h). */
#include "shard/write_targets.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/manifest.h"
#include "shard/target_build.h"
#include "shard/target_source.h"

#include <stdio.h>
#include <string.h>

/* The build configuration from the options. */
static int build_config(const dfm_write_targets_config *o, dfm_target_build_config *bc) {
    memset(bc, 0, sizeof *bc);
    DFM_TRY(dfm_dtype_parse(o->dtype, &bc->rec.dtype));
    DFM_TRY(dfm_trec_slots_parse(o->slots_hold, &bc->rec.slots));
    bc->n_shards = (uint32_t)o->shards;
    bc->rec.ids_only = !strcmp(o->store, "ids");
    bc->rec.shuffle = !strcmp(o->shuffle, "yes") || (!strcmp(o->shuffle, "auto") && bc->rec.dtype != DFM_DTYPE_FP16);
    bc->rec.level = (int)o->level;
    bc->block_queries = (uint32_t)o->block;
    bc->batch_records = (uint32_t)o->batch;
    bc->map_bytes = (uint64_t)o->map_bytes;
    bc->force = o->force;
    bc->threads = o->threads > 1 ? (uint32_t)o->threads : 1;
    return DFM_OK;
}

/* A continuation is the chunk after a neighbour. Retrieved with --exclude none from its own chunks, a run's
 * best neighbour is often the query's own source chunk c-1, whose continuation is chunk c: the very chunk
 * the memory is meant to help predict. Refused; every other policy keeps the continuation in the past or
 * out of the query's document (schemas/target_record.md, "What the slots hold"). */
static int check_continuation_leak(json_t *man, const char *run, int slots) {
    json_t *rs = dfm_manifest_stage(man, "retrieve");
    const char *ex = json_string_value(json_object_get(json_object_get(rs, "config"), "exclude"));
    if (slots == DFM_TREC_SLOTS_NEIGHBOUR || json_object_get(rs, "datastore") || !ex || strcmp(ex, "none")) return DFM_OK;
    return DFM_FAIL(DFM_EARG, "%s was retrieved with --exclude none from its own chunks: the continuation of the query's own source "
                    "chunk would be the chunk it is meant to predict. HINT: re-run 'dfm retrieve %s --exclude self' (or sequence, "
                    "document), or keep --slots-hold neighbour", run, run);
}

/* Totals over ranks into the manifest (rank 0 finishes the stage and prints the summary). */
static int record_totals(const dfm_mpi *m, json_t *man, const char *run, const dfm_target_build_config *bc,
                         const dfm_target_build_stats *bs, double t_start) {
    uint64_t loc[8] = {bs->shards_built, bs->shards_skipped, bs->records, bs->raw_bytes, bs->stored_bytes, bs->rows_requested,
                       bs->exchange_bytes, bs->rounds}, tot[8];
    double tl[3] = {bs->exchange_s, bs->encode_s, bs->write_s}, tmax[3];
    DFM_TRY(DFM_MPI_CHECK(MPI_Reduce(loc, tot, 8, MPI_UINT64_T, MPI_SUM, 0, m->comm)));
    DFM_TRY(DFM_MPI_CHECK(MPI_Reduce(tl, tmax, 3, MPI_DOUBLE, MPI_MAX, 0, m->comm)));
    if (m->rank != 0) return DFM_OK;
    dfm_target_build_stats tb = {.shards_built = tot[0], .shards_skipped = tot[1], .rows_requested = tot[5],
                                 .exchange_bytes = tot[6], .exchange_s = tmax[0], .encode_s = tmax[1], .write_s = tmax[2]};
    DFM_TRY(dfm_target_stage_finish(man, run, bc->n_shards, &tb, dfm_now() - t_start));
    json_t *c = json_object_get(dfm_manifest_stage(man, "targets"), "counts");
    double raw = (double)json_integer_value(json_object_get(c, "raw_bytes"));
    double stored = (double)json_integer_value(json_object_get(c, "stored_bytes"));
    printf("write-targets: %lld records in %u shards (%llu built, %llu complete already), %.1f MB raw, %.1f MB "
           "stored (ratio %.3f), %.2fs on %d rank%s\n",
           (long long)json_integer_value(json_object_get(c, "records")), bc->n_shards, (unsigned long long)tot[0],
           (unsigned long long)tot[1], raw / 1e6, stored / 1e6, raw > 0 ? stored / raw : 0.0, dfm_now() - t_start, m->size,
           m->size > 1 ? "s" : "");
    return DFM_OK;
}

int dfm_write_targets_run(const dfm_mpi *m, const dfm_write_targets_config *o, const char *run, json_t *config) {
    double t_start = dfm_now();
    json_t *man = NULL;
    dfm_target_source src;
    dfm_target_synth syn = {0};
    dfm_target_real *real = NULL;
    memset(&src, 0, sizeof src);
    dfm_target_build_config bc;
    int rc = dfm_mpi_agree(m, build_config(o, &bc));
    /* the data source */
    if (!rc && o->synthetic) {
        syn = (dfm_target_synth){.n_chunks = (uint64_t)o->synthetic, .k = (uint32_t)o->k, .d = (uint32_t)o->d,
                                 .seq_chunks = (uint32_t)o->seq_chunks, .seed = (uint64_t)o->seed};
        dfm_target_synth_source(&syn, m->rank, m->size, &src);
    } else if (!rc) {
        rc = dfm_target_real_open(m, run, &real, &src);
    }
    rc = dfm_mpi_agree(m, rc);
    if (!rc) {
        bc.rec.k = dfm_target_slot_count(src.k, bc.rec.slots);
        bc.rec.d = src.d;
    }
    if (!rc && bc.rec.k > DFM_TREC_MAX_K)
        rc = DFM_FAIL(DFM_EARG, "--slots-hold both needs 2K = %u slots; a record holds at most %u. HINT: retrieve at most %u neighbours "
                      "('dfm retrieve --k'), or --slots-hold continuation", bc.rec.k, DFM_TREC_MAX_K, DFM_TREC_MAX_K / 2);
    if (!rc && bc.rec.ids_only && src.n_rows)
        rc = DFM_FAIL(DFM_EARG, "%s retrieved its neighbours from another run (a datastore): --store ids keeps only this "
                      "run's own embeddings. HINT: --store embeddings", run);
    /* rank 0: manifest, fingerprint; everyone: the fingerprint */
    char fp[17] = {0};
    int skip = 0;
    if (!rc && m->rank == 0) {
        if (o->synthetic) rc = dfm_mkdir_p(run);
        if (!rc) rc = dfm_manifest_load(run, o->synthetic ? 1 : 0, &man);
        if (!rc && o->synthetic) rc = dfm_target_synth_stage(man, &syn);
        if (!rc && !o->synthetic) rc = check_continuation_leak(man, run, bc.rec.slots);
        if (!rc) rc = dfm_target_stage_begin(man, run, config, &bc, src.n_chunks, m->size, fp, &skip);
    }
    rc = dfm_mpi_agree(m, rc);
    if (!rc) rc = DFM_MPI_CHECK(MPI_Bcast(fp, 17, MPI_CHAR, 0, m->comm));
    if (!rc) rc = DFM_MPI_CHECK(MPI_Bcast(&skip, 1, MPI_INT, 0, m->comm));
    rc = dfm_mpi_agree(m, rc);
    dfm_target_build_stats bs = {0};
    if (!rc && !skip) {
        bc.fingerprint = fp;
        rc = dfm_target_build(m, run, &src, &bc, &bs);
    }
    if (!rc && !skip) rc = record_totals(m, man, run, &bc, &bs, t_start);
    rc = dfm_mpi_agree(m, rc);
    dfm_target_real_close(real);
    json_decref(man);
    return rc;
}
