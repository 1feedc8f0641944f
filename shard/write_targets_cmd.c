/* write_targets_cmd.c — `dfm write-targets RUN`: target shards from the retrieve stage (MPI). */
#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/manifest.h"
#include "common/mpiutil.h"
#include "common/opts.h"
#include "shard/target_build.h"
#include "shard/target_source.h"
#include "common/version.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t shards, level, block, batch, map_bytes, synthetic, k, d, seq_chunks, seed, threads;
    char *dtype, *store, *shuffle;
    int force;
} wt_opts;

int dfm_cmd_write_targets(int argc, char **argv) {
    dfm_mpi m;
    DFM_TRY(dfm_mpi_init(&argc, &argv, &m));
    wt_opts o;
    memset(&o, 0, sizeof o);
    dfm_opt table[] = {
        {"target-shards", DFM_OPT_INT, &o.shards, "4", "N", "number of output shards (fixed id ranges; independent of the ranks)", 0, .min = "1", .max = "99999"},
        {"dtype", DFM_OPT_STR, &o.dtype, "fp16", "T", "stored embedding type (bf16: rounded to nearest even)", 0, .choices = "fp32|fp16|bf16"},
        {"store", DFM_OPT_STR, &o.store, "embeddings", "S", "embeddings (K x d per record) or ids (ids + scores, one table per shard)", 0, .choices = "embeddings|ids"},
        {"shuffle", DFM_OPT_STR, &o.shuffle, "auto", "M", "byte-shuffle embeddings before zstd (auto: yes for fp32 and bf16, where it pays; no for fp16, where it does not)", 0, .choices = "yes|no|auto"},
        {"zstd-level", DFM_OPT_INT, &o.level, "3", "N", "zstd compression level", 0, .min = "1", .max = "19"},
        {"block-queries", DFM_OPT_INT, &o.block, "1024", "N", "queries per exchange round (bounds memory: N*K*d floats)", 1, .min = "1", .max = "1048576"},
        {"batch-records", DFM_OPT_INT, &o.batch, "512", "N", "records per LMDB transaction", 1, .min = "1", .max = "1048576"},
        {"map-bytes", DFM_OPT_INT, &o.map_bytes, "0", "B", "initial LMDB map size (0 = estimate; grown when full)", 1, .min = "0"},
        {"force", DFM_OPT_FLAG, &o.force, NULL, NULL, "rebuild shards that are already complete", 1},
        {"threads", DFM_OPT_INT, &o.threads, "1", "N", "encoding (zstd) threads per rank; records do not depend on it", 1, .min = "1", .max = "256"},
        {"synthetic", DFM_OPT_INT, &o.synthetic, "0", "N", "tests/benchmarks: N synthetic chunks instead of the retrieve stage", 1},
        {"k", DFM_OPT_INT, &o.k, "16", "K", "with --synthetic: neighbours per chunk", 1, .min = "1", .max = "64"},
        {"d", DFM_OPT_INT, &o.d, "384", "D", "with --synthetic: embedding width", 1, .min = "1", .max = "65536"},
        {"seq-chunks", DFM_OPT_INT, &o.seq_chunks, "8", "N", "with --synthetic: chunks per training sequence", 1, .min = "0"},
        {"seed", DFM_OPT_INT, &o.seed, "1", "N", "with --synthetic: data seed", 1},
        {0},
    };
    char **pos = NULL;
    int npos = 0;
    json_t *cfg = NULL, *man = NULL, *upstream = NULL;
    dfm_target_source src;
    dfm_target_synth syn = {0};
    dfm_target_real *real = NULL;
    memset(&src, 0, sizeof src);
    int rc = dfm_opts_parse("write-targets", "RUN",
                            "Write RUN/targets/shard-SSSSS/: one LMDB record per chunk with its K neighbours' exact stored "
                            "embeddings in rank order (zstd, checksummed). The owner of each query fetches the rows from the "
                            "ranks that own them (MPI all-to-all in bounded blocks). Shards are id ranges set by "
                            "--target-shards, so results do not depend on the number of ranks; complete shards are skipped "
                            "on a re-run. Run under mpirun for several ranks.",
                            table, argc, argv, &pos, &npos, &cfg);
    if (rc == DFM_OPTS_HELP) {
        dfm_opts_free(table);
        json_decref(cfg);
        free(pos);
        dfm_mpi_finalize();
        return 0;
    }
    double t_start = dfm_now();
    const char *run = npos >= 1 ? pos[0] : NULL;
    dfm_target_build_config bc = {0};
    if (!rc && npos != 1) rc = DFM_FAIL(DFM_EARG, "usage: dfm write-targets RUN [options] (see --help)");
    if (!rc) rc = dfm_dtype_parse(o.dtype, &bc.rec.dtype);
    if (!rc) {
        bc.n_shards = (uint32_t)o.shards;
        bc.rec.ids_only = !strcmp(o.store, "ids");
        bc.rec.shuffle = !strcmp(o.shuffle, "yes") || (!strcmp(o.shuffle, "auto") && bc.rec.dtype != DFM_DTYPE_FP16);
        bc.rec.level = (int)o.level;
        bc.block_queries = (uint32_t)o.block;
        bc.batch_records = (uint32_t)o.batch;
        bc.map_bytes = (uint64_t)o.map_bytes;
        bc.force = o.force;
        bc.threads = o.threads > 1 ? (uint32_t)o.threads : 1;
    }
    rc = dfm_mpi_agree(&m, rc);
    /* the data source */
    if (!rc && o.synthetic) {
        syn = (dfm_target_synth){.n_chunks = (uint64_t)o.synthetic, .k = (uint32_t)o.k, .d = (uint32_t)o.d,
                                 .seq_chunks = (uint32_t)o.seq_chunks, .seed = (uint64_t)o.seed};
        dfm_target_synth_source(&syn, m.rank, m.size, &src);
    } else if (!rc) {
        rc = dfm_target_real_open(&m, run, &real, &src);
    }
    rc = dfm_mpi_agree(&m, rc);
    if (!rc) {
        bc.rec.k = src.k;
        bc.rec.d = src.d;
    }
    /* rank 0: manifest, fingerprint; everyone: the fingerprint */
    char fp[17] = {0};
    if (!rc && m.rank == 0) {
        if (o.synthetic) rc = dfm_mkdir_p(run);
        if (!rc) rc = dfm_manifest_load(run, o.synthetic ? 1 : 0, &man);
        if (!rc && o.synthetic) rc = dfm_target_synth_stage(man, &syn);
        if (!rc) rc = dfm_target_stage_begin(man, run, cfg, &bc, src.n_chunks, m.size, fp);
    }
    rc = dfm_mpi_agree(&m, rc);
    if (!rc) rc = DFM_MPI_CHECK(MPI_Bcast(fp, 17, MPI_CHAR, 0, m.comm));
    rc = dfm_mpi_agree(&m, rc);
    dfm_target_build_stats bs = {0};
    if (!rc) {
        bc.fingerprint = fp;
        rc = dfm_target_build(&m, run, &src, &bc, &bs);
    }
    /* totals into the manifest */
    if (!rc) {
        uint64_t loc[8] = {bs.shards_built, bs.shards_skipped, bs.records, bs.raw_bytes, bs.stored_bytes, bs.rows_requested,
                           bs.exchange_bytes, bs.rounds}, tot[8];
        double tl[3] = {bs.exchange_s, bs.encode_s, bs.write_s}, tmax[3];
        rc = DFM_MPI_CHECK(MPI_Reduce(loc, tot, 8, MPI_UINT64_T, MPI_SUM, 0, m.comm));
        if (!rc) rc = DFM_MPI_CHECK(MPI_Reduce(tl, tmax, 3, MPI_DOUBLE, MPI_MAX, 0, m.comm));
        if (!rc && m.rank == 0) {
            dfm_target_build_stats tb = {.shards_built = tot[0], .shards_skipped = tot[1], .rows_requested = tot[5],
                                         .exchange_bytes = tot[6], .exchange_s = tmax[0], .encode_s = tmax[1], .write_s = tmax[2]};
            rc = dfm_target_stage_finish(man, run, bc.n_shards, &tb, dfm_now() - t_start);
            if (!rc) {
                json_t *c = json_object_get(dfm_manifest_stage(man, "targets"), "counts");
                double raw = (double)json_integer_value(json_object_get(c, "raw_bytes"));
                double stored = (double)json_integer_value(json_object_get(c, "stored_bytes"));
                printf("write-targets: %lld records in %u shards (%llu built, %llu complete already), %.1f MB raw, %.1f MB "
                       "stored (ratio %.3f), %.2fs on %d rank%s\n",
                       (long long)json_integer_value(json_object_get(c, "records")), bc.n_shards, (unsigned long long)tot[0],
                       (unsigned long long)tot[1], raw / 1e6, stored / 1e6, raw > 0 ? stored / raw : 0.0, dfm_now() - t_start, m.size,
                       m.size > 1 ? "s" : "");
            }
        }
    }
    rc = dfm_mpi_agree(&m, rc);
    dfm_target_real_close(real);
    json_decref(man);
    json_decref(cfg);
    json_decref(upstream);
    free(pos);
    dfm_opts_free(table);
    dfm_mpi_finalize();
    return rc;
}
