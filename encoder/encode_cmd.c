/* encode_cmd.c — `dfm encode RUN` and `dfm encode --texts IN.jsonl --out OUT.bin`: flags into a
 * dfm_encode_config, then dfm_encode_run or dfm_encode_texts (encode.h). */
#include "encoder/encode.h"

#include "common/error.h"
#include "common/mpiutil.h"
#include "common/opts.h"

#include <stdlib.h>
#include <string.h>

int dfm_cmd_encode(int argc, char **argv) {
    dfm_mpi m;
    DFM_TRY(dfm_mpi_init(&argc, &argv, &m));
    dfm_encode_config o;
    memset(&o, 0, sizeof o);
    const char *def_model = getenv("DFM_MODEL");
    if (!def_model || !*def_model) def_model = "/var/cache/dfm/models/all-MiniLM-L6-v2";
    dfm_opt table[] = {
        {"model", DFM_OPT_STR, &o.model, def_model, "DIR", "BERT-family sentence-transformers model folder (env DFM_MODEL)", 0},
        {"device", DFM_OPT_STR, &o.device, "auto", "DEV", "where to encode (auto: cuda when a GPU is visible)", 1, .choices = "auto|cpu|cuda"},
        {"dtype", DFM_OPT_STR, &o.dtype, "fp32", "T", "stored embedding dtype", 0, .choices = "fp32|fp16|bf16"},
        {"precision", DFM_OPT_STR, &o.precision, "auto", "P",
         "linear layers' precision: fp32, bf16 (CPU avx512_bf16 or CUDA), int8 (CPU VNNI), fp16 (CUDA); auto: fp16 on "
         "CUDA, fp32 on the CPU. Recorded in the manifest: a resume under another precision is refused",
         1, .choices = "auto|fp32|fp16|bf16|int8"},
        {"batch", DFM_OPT_INT, &o.batch, "0", "N", "texts per forward batch, length-bucketed (0: 64 on the CPU, 1024 on CUDA)", 1, .min = "0", .max = "65536"},
        {"block-chunks", DFM_OPT_INT, &o.block_chunks, "65536", "B", "chunks per embedding block file", 0, .min = "1", .max = "4294967296"},
        {"window", DFM_OPT_INT, &o.window, "4096", "N", "chunks decoded, sorted by length and encoded together", 0, .min = "1", .max = "1048576"},
        {"max-len", DFM_OPT_INT, &o.max_len, "0", "N", "token limit per text (default: the model's max_seq_length)", 0},
        {"tokenizer", DFM_OPT_STR, &o.tokenizer, NULL, "FILE", "LM tokenizer.json (default: the one the chunk stage used)", 1},
        {"texts", DFM_OPT_STR, &o.texts, NULL, "FILE", "instead of a run: embed the \"text\" of each JSONL line", 1},
        {"out", DFM_OPT_STR, &o.out, NULL, "FILE", "with --texts: the embedding file to write", 1},
        {"tokens-out", DFM_OPT_STR, &o.tokens_out, NULL, "FILE", "with --texts: also write WordPiece ids as JSONL", 1},
        {"force", DFM_OPT_FLAG, &o.force, NULL, NULL, "re-encode every block even if finished", 1},
        {0},
    };
    char **pos = NULL;
    int npos = 0;
    json_t *cfg = NULL;
    int rc = dfm_opts_parse("encode", "RUN | --texts FILE --out FILE",
                            "Embed every chunk of RUN with the frozen encoder: decode with the LM tokenizer, tokenize with "
                            "WordPiece, run the BERT model (CPU or CUDA), mean/CLS-pool, L2-normalise, and write "
                            "RUN/encode/emb-BBBBBB.bin blocks of --block-chunks chunks, recorded in RUN/manifest.json. "
                            "Run under mpirun for several ranks; the files do not depend on the number of ranks.",
                            table, argc, argv, &pos, &npos, &cfg);
    if (rc == DFM_OPTS_HELP) {
        dfm_opts_free(table);
        free(pos);
        json_decref(cfg);
        return 0;
    }
    if (!rc && o.texts) {
        if (m.rank == 0) rc = dfm_encode_texts(&o);
    } else if (!rc) {
        if (npos != 1) rc = DFM_FAIL(DFM_EARG, "usage: dfm encode RUN (or --texts FILE --out FILE); see --help");
        else rc = dfm_encode_run(&m, &o, pos[0], cfg);
    }
    dfm_opts_free(table);
    free(pos);
    json_decref(cfg);
    return rc;
}
