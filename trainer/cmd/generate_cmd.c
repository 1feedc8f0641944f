/* generate_cmd.c — `dfm-train generate`: a prompt (token ids, or text through the backbone's
 * tokenizer) into greedy decoding (generate.h); prints the new ids and, with a tokenizer, the text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/opts.h"
#include "tokenizer/tokenizer.h"
#include "trainer/cmd/commands.h"
#include "trainer/run/generate.h"
#include "trainer/run/model_setup.h"
#include "trainer/data/vocab_map.h"

static int parse_ids(const char *s, int **ids, int *n) {
    int cap = 16;
    *ids = malloc(cap * sizeof(int));
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) return DFM_FAIL(DFM_EARG, "--prompt-ids \"%s\": expected comma-separated token ids", s);
        if (*n == cap) *ids = realloc(*ids, (cap *= 2) * sizeof(int));
        (*ids)[(*n)++] = (int)v;
        p = end;
        if (*p == ',') p++;
    }
    return *n ? DFM_OK : DFM_FAIL(DFM_EARG, "empty prompt");
}

/* The prompt's ids: --prompt-ids, else --prompt through the tokenizer. */
static int prompt_ids(const char *list, const char *text, dfm_tokenizer *tok, int **ids, int *n) {
    if (list) return parse_ids(list, ids, n);
    if (!text || !tok) return DFM_FAIL(DFM_EARG, "give --prompt-ids, or --prompt with --tokenizer");
    dfm_ids v = {0};
    int rc = dfm_tokenizer_encode(tok, text, strlen(text), &v, 0);
    if (!rc) {
        *n = (int)v.n;
        *ids = malloc((*n ? *n : 1) * sizeof(int));
        for (int i = 0; i < *n; i++) (*ids)[i] = (int)v.ids[i];
    }
    dfm_ids_free(&v);
    return rc;
}

/* The generated ids seq[n, total) and, with a tokenizer, the prompt followed by their text. */
static void print_answer(const int *seq, int n, int total, dfm_tokenizer *tok, const char *prompt) {
    printf("ids:");
    for (int i = n; i < total; i++) printf("%s%d", i == n ? " " : ",", seq[i]);
    printf("\n");
    if (!tok) return;
    uint32_t *u = malloc((size_t)(total - n + 1) * sizeof(uint32_t));
    for (int i = n; i < total; i++) u[i - n] = (uint32_t)seq[i];
    char *text = NULL;
    size_t tl = 0;
    if (!dfm_tokenizer_decode(tok, u, (size_t)(total - n), 1, &text, &tl)) printf("text: %s%s\n", prompt ? prompt : "", text);
    free(text);
    free(u);
}

int cmd_generate(int argc, char **argv) {
    TrainOpts o;
    memset(&o, 0, sizeof o);
    char *prompt_list = NULL, *prompt = NULL, *tokenizer = NULL;
    int64_t max_new = 0, no_memory = 0;
    dfm_opt opts[] = {
        TRAIN_OPTS_DFM(&o),
        {"backbone", DFM_OPT_STR, &o.backbone, NULL, "DIR", "frozen backbone: Hugging Face folder", 0},
        {"modules", DFM_OPT_STR, &o.modules, NULL, "FILE", "trained modules (ckpt or safetensors)", 0},
        {"prompt-ids", DFM_OPT_STR, &prompt_list, NULL, "LIST", "prompt as comma-separated token ids", 0},
        {"prompt", DFM_OPT_STR, &prompt, NULL, "TEXT", "prompt text (needs --tokenizer)", 0},
        {"tokenizer", DFM_OPT_STR, &tokenizer, NULL, "FILE", "tokenizer.json of the backbone", 0},
        {"max-new", DFM_OPT_INT, &max_new, "32", "N", "tokens to generate", 0},
        {"no-memory", DFM_OPT_FLAG, &no_memory, NULL, NULL, "fusion off: the frozen backbone alone", 0},
        {"seed", DFM_OPT_INT, &o.seed, "1", "N", "seed (unused by greedy decoding; module init without --modules)", 0},
        {"threads", DFM_OPT_INT, &o.threads, "0", "N", "threads", 1},
        {0},
    };
    int rc = dfm_opts_parse("generate", "--backbone DIR --modules FILE (--prompt-ids LIST | --prompt TEXT --tokenizer FILE)",
                            "Greedy decoding as at DFM inference: the memory is predicted once from the prompt's "
                            "chunks and held fixed while the answer is generated (chunks after the prompt reuse the "
                            "last prediction). No retrieval.",
                            opts, argc, argv, NULL, NULL, NULL);
    if (rc == DFM_OPTS_HELP) return 0; /* the parser freed the options */
    int *ids = NULL, n = 0, compact = 0;
    dfm_tokenizer *tok = NULL;
    DfmModel *m = NULL;
    VocabMap vm = {0};
    if (!rc && !o.backbone) rc = DFM_FAIL(DFM_EARG, "--backbone is required");
    if (!rc) train_set_threads(o.threads);
    if (!rc && tokenizer) rc = dfm_tokenizer_load(tokenizer, &tok);
    if (!rc) rc = prompt_ids(prompt_list, prompt, tok, &ids, &n);
    if (!rc) rc = vocab_map_load(o.backbone, &vm, &compact); /* a compact-vocabulary backbone: ids in and out */
    if (!rc && compact) rc = vocab_map_to_compact(&vm, ids, (size_t)n, "prompt");
    int L = (int)o.chunk_len;
    if (!rc && o.modules) {
        DfmConfig mc;
        rc = setup_modules_config(o.modules, &mc);
        if (!rc) L = mc.chunk_len;
    }
    int total = n + (int)max_new;
    int T = (total + L - 1) / L * L;
    if (!rc && n == 0) rc = DFM_FAIL(DFM_EARG, "empty prompt");
    if (!rc) rc = setup_dfm_model(&o, T, 1, (int)o.slots, (int)o.d_mem, &m);
    if (!rc && o.modules) rc = setup_load_modules(m, o.modules);
    int *seq = calloc(T, sizeof(int));
    if (!rc) {
        memcpy(seq, ids, n * sizeof(int));
        rc = generate_greedy(m, seq, n, total, T, (int)no_memory);
    }
    if (!rc && compact) vocab_map_to_source(&vm, seq, (size_t)total);
    if (!rc) print_answer(seq, n, total, tok, prompt);
    free(seq), free(ids);
    vocab_map_free(&vm);
    dfm_tokenizer_free(tok);
    model_free(m);
    dfm_opts_free(opts);
    return rc;
}
