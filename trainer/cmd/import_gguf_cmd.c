/* import_gguf_cmd.c — `dfm-train import-gguf MODEL.gguf --out DIR`: a GGUF model as a Hugging Face folder
 * (trainer/lm/gguf_import.h) for --backbone, and its tokenizer.json for `dfm chunk --tokenizer`. */
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "common/log.h"
#include "common/opts.h"
#include "schemas/gguf.h"
#include "trainer/cmd/commands.h"
#include "trainer/lm/gguf_import.h"

int cmd_import_gguf(int argc, char **argv) {
    char *out = NULL, *tokenizer = NULL;
    int force = 0;
    dfm_opt opts[] = {
        {"out", DFM_OPT_STR, &out, NULL, "DIR", "the Hugging Face folder to write (required)", 1},
        {"tokenizer", DFM_OPT_STR, &tokenizer, NULL, "FILE",
         "copy this tokenizer.json instead of building one from the file's tokenizer metadata", 1},
        {"force", DFM_OPT_FLAG, &force, NULL, NULL, "replace DIR when it exists", 1},
        {0},
    };
    char **pos = NULL;
    int npos = 0;
    int rc = dfm_opts_parse(
        "import-gguf", "MODEL.gguf --out DIR [options]",
        "Convert a GGUF model (llama.cpp's format; Llama and Qwen3 architectures) into a Hugging Face folder: "
        "config.json, model.safetensors with every tensor dequantized exactly to F32 (F32, F16, BF16, Q4_0, Q4_1, "
        "Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), Llama's q/k rows back in Hugging Face's order, and "
        "tokenizer.json + tokenizer_config.json built from the file's byte-level BPE vocabulary, merges and "
        "pre-tokenizer name (or copied with --tokenizer). dfm-train loads the folder with --backbone, dfm chunk "
        "its tokenizer.json with --tokenizer, transformers with from_pretrained. Written under DIR.partial and "
        "renamed when complete. Memory: the file plus the model in fp32.",
        opts, argc, argv, &pos, &npos, NULL);
    if (rc == DFM_OPTS_HELP) return 0;
    if (!rc && npos != 1) rc = DFM_FAIL(DFM_EARG, "import-gguf takes one MODEL.gguf (got %d). HINT: dfm-train "
                                        "import-gguf MODEL.gguf --out DIR", npos);
    if (!rc && !out) rc = DFM_FAIL(DFM_EARG, "--out DIR is required");
    GgufImportReport rep;
    if (!rc) {
        GgufImportOpts o = {.tokenizer = tokenizer, .force = force};
        rc = gguf_import(pos[0], out, &o, &rep);
    }
    if (!rc) {
        char types[256] = "";
        size_t n = 0;
        for (int t = 0; t < 64; t++)
            if (rep.type_counts[t] && n < sizeof types)
                n += (size_t)snprintf(types + n, sizeof types - n, "%s%s x%llu", n ? ", " : "", dfm_ggml_type_name(t),
                                      (unsigned long long)rep.type_counts[t]);
        DFM_LOG_I("%s: %s, %d layers, width %d, vocabulary %d, %.1fM weights (%s)%s; tokenizer.json %s", out,
                     rep.arch, rep.n_layers, rep.hidden, rep.vocab, (double)rep.n_params / 1e6, types,
                     rep.permuted ? "; q/k rows restored to Hugging Face order" : "",
                     rep.tokenizer_built ? "built from the file's metadata" : "copied");
        printf("%s\n", out);
    }
    free(pos);
    dfm_opts_free(opts);
    return rc;
}
