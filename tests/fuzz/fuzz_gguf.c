/* fuzz_gguf.c — libFuzzer harness: a GGUF model file through dfm_gguf_open, every key-value pair read with
 * the typed getters, every tensor checked to lie inside the file with its exact byte count (no wrap of the
 * element count times the block size) and, for small ones, dequantized; then the
 * tokenizer.json that dfm-train import-gguf would build from the metadata, loaded back by dfm's tokenizer
 * (a built tokenizer must load: it is dfm's own output) and used once. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "tokenizer/tokenizer.h"
#include "schemas/gguf.h"
#include "tests/fuzz/fuzz_file.h"

static void read_values(const dfm_gguf *g) {
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const dfm_gguf_kv *kv = &g->kv[i];
        char key[256];
        size_t n = kv->key.n < sizeof key - 1 ? kv->key.n : sizeof key - 1;
        memcpy(key, kv->key.p, n);
        key[n] = 0;
        uint32_t u;
        float f;
        int b;
        char *s = NULL;
        dfm_gguf_get_u32(g, key, 0, 0, &u);
        dfm_gguf_get_f32(g, key, 0, 0, &f);
        dfm_gguf_get_bool(g, key, 0, &b);
        dfm_gguf_get_str(g, key, 0, &s);
        free(s);
        dfm_gguf_str *strs = NULL;
        int64_t *ints = NULL;
        if (!dfm_gguf_strings(g, kv, &strs))
            for (uint64_t j = 0; j < kv->count; j++) /* every string lies inside the file */
                if ((const uint8_t *)strs[j].p < g->map || (const uint8_t *)strs[j].p + strs[j].n > g->map + g->map_bytes)
                    abort();
        free(strs);
        dfm_gguf_ints(g, kv, &ints);
        free(ints);
        dfm_error_clear();
    }
}

static void read_tensors(const dfm_gguf *g) {
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const dfm_gguf_tensor *t = &g->tensors[i];
        if (t->data < g->data || t->data + t->bytes > g->map + g->map_bytes) abort(); /* inside the file */
        uint32_t be, bb; /* the byte count is the exact one, not wrapped (2^62 F32 elements once made 0 bytes) */
        if (!dfm_ggml_type_layout(t->type, &be, &bb) || (unsigned __int128)t->numel / be * bb != t->bytes) abort();
        if (dfm_gguf_tensor_find(g, t->name) != t) abort();                           /* names are unique */
        if (t->numel > (1u << 16) || !dfm_gguf_type_dequantizable(t->type)) continue;
        float *w = malloc(t->numel * sizeof *w);
        if (w) dfm_gguf_dequantize(g, t, w);
        free(w);
    }
}

static void build_tokenizer(const dfm_gguf *g) {
    json_t *tj = NULL, *cfg = NULL;
    if (dfm_tokenizer_json_from_gguf(g, 1u << 20, &tj, &cfg)) return;
    char *text = json_dumps(tj, JSON_COMPACT);
    const char *path = text ? fuzz_file("tokenizer.json", (const uint8_t *)text, strlen(text)) : NULL;
    dfm_tokenizer *tok = NULL;
    if (path) {
        if (dfm_tokenizer_load(path, &tok)) { /* what import-gguf writes, dfm chunk must read */
            fprintf(stderr, "built tokenizer.json refused: %s\n", dfm_last_error());
            abort();
        }
        dfm_ids ids = {0};
        if (!dfm_tokenizer_encode(tok, "The 12 cats\n", 12, &ids, NULL))
            for (size_t i = 0; i < ids.n; i++)
                if (ids.ids[i] >= dfm_tokenizer_vocab_size(tok)) abort();
        dfm_ids_free(&ids);
        dfm_tokenizer_free(tok);
    }
    free(text);
    json_decref(tj);
    json_decref(cfg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setenv("DFM_TOKENIZER_CACHE", "off", 1);
    const char *path = fuzz_file("model.gguf", data, size);
    dfm_gguf *g;
    if (!path || dfm_gguf_open(path, &g)) return 0;
    read_values(g);
    read_tensors(g);
    build_tokenizer(g);
    dfm_gguf_close(g);
    dfm_error_clear();
    return 0;
}
