/* target_tools_cmd.c — `dfm inspect RUN --chunk ID` and `dfm verify RUN [--stages LIST] [--compare RUN_B]`:
 * flags, then target_check.h and run_verify.h. */
#include "common/error.h"
#include "common/opts.h"
#include "shard/run_verify.h"
#include "shard/target_check.h"

#include <stdlib.h>

int dfm_cmd_inspect(int argc, char **argv) {
    int64_t chunk = -1, nvals = 4;
    char *tokenizer = NULL;
    dfm_opt table[] = {
        {"chunk", DFM_OPT_INT, &chunk, "-1", "ID", "chunk id whose target record to print", 0},
        {"values", DFM_OPT_INT, &nvals, "4", "N", "first N values of each embedding", 0, .min = "0"},
        {"tokenizer", DFM_OPT_STR, &tokenizer, NULL, "FILE", "LM tokenizer.json for the texts (default: the chunk stage's)", 0},
        {0},
    };
    char **pos = NULL;
    int npos = 0;
    int rc = dfm_opts_parse("inspect", "RUN --chunk ID",
                            "Print one target record: flags, the neighbours' ids, scores and mask in rank order, the first "
                            "values of each embedding, and (when the run has chunks and a tokenizer) the texts of the query "
                            "chunk and of its neighbours.",
                            table, argc, argv, &pos, &npos, NULL);
    if (rc == DFM_OPTS_HELP) {
        free(pos);
        dfm_opts_free(table);
        return 0;
    }
    if (!rc && (npos != 1 || chunk < 0)) rc = DFM_FAIL(DFM_EARG, "usage: dfm inspect RUN --chunk ID");
    if (!rc) rc = dfm_target_inspect(pos[0], (uint64_t)chunk, nvals, tokenizer);
    free(pos);
    dfm_opts_free(table);
    return rc;
}

int dfm_cmd_verify(int argc, char **argv) {
    char *compare = NULL, *tokens_run = NULL, *stages = NULL;
    double recompute = 0, recompute_records = 0;
    int64_t seed = 1;
    dfm_opt table[] = {
        {"stages", DFM_OPT_STR, &stages, "all", "LIST", "stages to check: comma-separated chunk, encode, index, retrieve, targets, or all", 0},
        {"compare", DFM_OPT_STR, &compare, NULL, "RUN_B", "also check that RUN_B holds the same records (ids, scores, mask, embeddings)", 0},
        {"tokens-run", DFM_OPT_STR, &tokens_run, NULL, "RUN", "check the targets against this run's upstream stages (default: RUN)", 0},
        {"recompute", DFM_OPT_DOUBLE, &recompute, "0", "F", "re-run retrieval for a fraction of chunks (not available yet; see --recompute-records)", 0},
        {"recompute-records", DFM_OPT_DOUBLE, &recompute_records, "0", "F",
         "rebuild a random fraction F of the records from RUN/retrieve and RUN/encode and compare them bit for bit", 0, .min = "0", .max = "1"},
        {"seed", DFM_OPT_INT, &seed, "1", "N", "sample seed of --recompute-records", 0},
        {0},
    };
    char **pos = NULL;
    int npos = 0;
    int rc = dfm_opts_parse("verify", "RUN [--stages LIST] [--compare RUN_B]",
                            "Check every stage's files of a run (or those --stages names), reading only: chunk shards and "
                            "embedding blocks (headers, payload checksums, token ids, tiling), index shards (sizes, hashes, "
                            "FAISS loads, id ranges), neighbour blocks (checksums, every row, tiling), target shards (shard.json "
                            "and data.mdb sizes, every record's header, checksum and decode, key order without gaps or "
                            "duplicates, per-shard record checksums), each against the files and counts the manifest lists. "
                            "Exits non-zero naming the file (and the shard and key of a target record) of the first problem.",
                            table, argc, argv, &pos, &npos, NULL);
    if (rc == DFM_OPTS_HELP) {
        free(pos);
        dfm_opts_free(table);
        return 0;
    }
    unsigned mask = 0;
    if (!rc && npos != 1) rc = DFM_FAIL(DFM_EARG, "usage: dfm verify RUN [--stages LIST] [--compare RUN_B]");
    if (!rc) rc = dfm_verify_stages_parse(stages, &mask);
    if (!rc && !(mask & DFM_VERIFY_TARGETS) && (compare || recompute_records > 0))
        rc = DFM_FAIL(DFM_EARG, "--compare and --recompute-records check target records. HINT: add 'targets' to --stages");
    if (!rc && recompute > 0)
        rc = DFM_FAIL(DFM_EUNSUPPORTED, "--recompute (re-running retrieval) is not implemented yet. HINT: --recompute-records F rebuilds "
                      "records from the stored neighbours and embeddings; --compare checks against a second run of the pipeline");
    if (!rc) {
        dfm_target_verify_config vc = {compare, tokens_run, recompute_records, (uint64_t)seed};
        rc = dfm_run_verify(pos[0], mask, &vc);
    }
    free(pos);
    dfm_opts_free(table);
    return rc;
}
