/* write_targets_cmd.c — `dfm write-targets RUN`: flags into a dfm_write_targets_config, then
 * dfm_write_targets_run (write_targets.h). */
#include "common/error.h"
#include "common/mpiutil.h"
#include "common/opts.h"
#include "shard/write_targets.h"

#include <stdlib.h>
#include <string.h>

int dfm_cmd_write_targets(int argc, char **argv) {
    dfm_mpi m;
    DFM_TRY(dfm_mpi_init(&argc, &argv, &m));
    dfm_write_targets_config o;
    memset(&o, 0, sizeof o);
    dfm_opt table[] = {
        {"target-shards", DFM_OPT_INT, &o.shards, "4", "N", "number of output shards (fixed id ranges; independent of the ranks)", 0, .min = "1", .max = "99999"},
        {"dtype", DFM_OPT_STR, &o.dtype, "fp16", "T", "stored embedding type (bf16: rounded to nearest even)", 0, .choices = "fp32|fp16|bf16"},
        {"store", DFM_OPT_STR, &o.store, "embeddings", "S", "embeddings (K x d per record) or ids (ids + scores, one table per shard)", 0, .choices = "embeddings|ids"},
        {"slots-hold", DFM_OPT_STR, &o.slots_hold, "neighbour", "H", "what slot r holds: neighbour r, its continuation (the next chunk of the neighbour's document; masked where the document ends), or both (2K slots: the K neighbours, then their K continuations)", 1, .choices = "neighbour|continuation|both"},
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
    json_t *cfg = NULL;
    int rc = dfm_opts_parse("write-targets", "RUN",
                            "Write RUN/targets/shard-SSSSS/: one LMDB record per chunk with its K neighbours' exact stored "
                            "embeddings in rank order (zstd, checksummed); --slots-hold continuation puts the chunk after each neighbour in its own "
                            "document in its slot instead, --slots-hold both the neighbours and then their continuations. The owner of each query fetches the rows from the "
                            "ranks that own them (MPI all-to-all in bounded blocks). Shards are id ranges set by "
                            "--target-shards, so results do not depend on the number of ranks; complete shards are skipped "
                            "on a re-run. Run under mpirun for several ranks.",
                            table, argc, argv, &pos, &npos, &cfg);
    if (rc == DFM_OPTS_HELP) {
        dfm_opts_free(table);
        json_decref(cfg);
        free(pos);
        return 0;
    }
    if (!rc && npos != 1) rc = DFM_FAIL(DFM_EARG, "usage: dfm write-targets RUN [options] (see --help)");
    /* --slots-hold enters the stage's config only when it is not the default, so the manifest of a default run
     * stays as before the option and such runs re-run without --force; any change is still a config change */
    if (!rc && strcmp(o.slots_hold, "neighbour") && json_object_set_new(cfg, "slots-hold", json_string(o.slots_hold)))
        rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc) rc = dfm_write_targets_run(&m, &o, pos[0], cfg);
    else rc = dfm_mpi_agree(&m, rc);
    json_decref(cfg);
    free(pos);
    dfm_opts_free(table);
    return rc;
}
