/* chunk_cmd.c — `dfm chunk RUN INPUT...`: flags into a dfm_chunk_config, then dfm_chunk_run (chunk.h). */
#include "pipeline/chunk/chunk.h"

#include "common/error.h"
#include "common/mpiutil.h"
#include "common/opts.h"
#include "pipeline/corpus/corpus.h"

#include <stdlib.h>

#define STR_(x) #x
#define STR(x) STR_(x) /* a default number as the option table's text */

int dfm_cmd_chunk(int argc, char **argv) {
    dfm_mpi m;
    DFM_TRY(dfm_mpi_init(&argc, &argv, &m));
    dfm_chunk_config o;
    dfm_opt table[] = {
        {"tokenizer", DFM_OPT_STR, &o.tokenizer, getenv("DFM_TOKENIZER"), "FILE", "the LM's Hugging Face tokenizer.json (env DFM_TOKENIZER)", 0},
        {"chunk-len", DFM_OPT_INT, &o.chunk_len, "32", "L", "tokens per chunk", 0, .min = "1", .max = "4096"},
        {"seq-len", DFM_OPT_INT, &o.seq_len, "1024", "S", "tokens per training sequence, a multiple of L", 0},
        {"text-field", DFM_OPT_STR, &o.text_field, "text", "NAME", "JSONL field or Parquet column holding the text", 0},
        {"doc-aligned", DFM_OPT_FLAG, &o.doc_aligned, NULL, NULL, "pad every document to a chunk boundary (padding masked)", 0},
        {"skip-bad-lines", DFM_OPT_FLAG, &o.skip_bad, NULL, NULL, "count and skip malformed lines/documents instead of failing", 0},
        {"max-doc-bytes", DFM_OPT_INT, &o.max_doc_bytes, STR(DFM_MAX_DOC_BYTES), "N", "longest document read, in bytes (a JSONL line, a text file, a Parquet value): a longer one is malformed, refused naming the file and line, or skipped and counted with --skip-bad-lines; it bounds each rank's read buffers", 0, .min = "1", .max = "4294967296"},
        {"eos-id", DFM_OPT_INT, &o.eos_id, "-1", "ID", "document separator (default: the first of <|endoftext|>, <|end_of_text|>, </s>, <eos>, [SEP] in the vocabulary; tokenizer_config.json's eos_token is not used, since chat models name their turn end there, e.g. Qwen2.5's <|im_end|>)", 0},
        {"pad-id", DFM_OPT_INT, &o.pad_id, "-1", "ID", "padding token (default: EOS)", 0},
        {"threads", DFM_OPT_INT, &o.threads, "1", "N", "tokenizer threads per rank", 1},
        {"window-tokens", DFM_OPT_INT, &o.window_tokens, "1048576", "N", "stream tokens a rank holds in memory (4 bytes each); the rest of its share spills to RUN/chunk/ and is read back (outputs do not depend on it)", 1, .min = "64", .max = "1073741824"},
        {"force", DFM_OPT_FLAG, &o.force, NULL, NULL, "redo the stage even if the manifest says it is complete, or differs", 1},
        {0},
    };
    char **pos = NULL;
    int npos = 0;
    json_t *cfg = NULL;
    int rc = dfm_opts_parse("chunk", "RUN INPUT...",
                            "Tokenize INPUT files (JSONL, text, llm.c .bin token shards, each also .zst or .gz compressed; Parquet: "
                            "the --text-field column of every row group) with the LM "
                            "tokenizer, pack them into sequences of S tokens and cut them into chunks of L tokens, written "
                            "to RUN/chunk/ with the stage recorded in RUN/manifest.json. Special-token text in a document (e.g. "
                            "'<|endoftext|>') is matched as that token, as Hugging Face does by default, and a document ends "
                            "after every EOS id in every input format. Run under mpirun for several ranks.",
                            table, argc, argv, &pos, &npos, &cfg);
    if (rc == DFM_OPTS_HELP) {
        return 0;
    }
    if (!rc && npos < 2) rc = DFM_FAIL(DFM_EARG, "usage: dfm chunk RUN INPUT... (see --help)");
    if (!rc && !o.tokenizer) rc = DFM_FAIL(DFM_EARG, "no tokenizer: pass --tokenizer FILE (a Hugging Face tokenizer.json) or set DFM_TOKENIZER");
    if (!rc) rc = dfm_chunk_run(&m, &o, pos[0], pos + 1, npos - 1, cfg);
    else rc = dfm_mpi_agree(&m, rc);
    json_decref(cfg);
    free(pos);
    dfm_opts_free(table);
    return rc;
}
