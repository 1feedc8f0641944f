/* reading.c — the reading-pretraining set of a run (reading.h). */
#include "trainer/data/reading.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "schemas/chunk_shard.h"
#include "schemas/embedding_shard.h"

/* chunk c's own slots into dst (K x d floats) and mask: own's row of c, or the encode stage's row of c in slot 0 */
static int own_slots_of(const DataSet *own, const dfm_emb_set *es, uint64_t c, float *dst, uint8_t *mask) {
    if (own) return data_target_row(own, c, dst, mask);
    DFM_TRY(dfm_emb_set_rows_f32(es, c, 1, dst));
    mask[0] = 1;
    return DFM_OK;
}

/* the sequences and their target table, from open chunk and embedding sets */
static int build(const dfm_chunk_set *cs, const dfm_emb_set *es, const DataSet *own, int L, int K, const int *prompt,
                 int n_prompt, uint64_t split_chunk, size_t *n_before, DataSet *ds) {
    if ((int)cs->chunk_len != L)
        return DFM_FAIL(DFM_EARG, "its chunks are %u tokens long, the model's %d. HINT: --chunk-len %u", cs->chunk_len, L,
                        cs->chunk_len);
    if (own && own->K > K)
        return DFM_FAIL(DFM_EARG, "its own-slots file holds %d slots per chunk, more than the %d memory slots. HINT: --slots %d",
                        own->K, K, own->K);
    if (es && es->n_rows != cs->n_chunks)
        return DFM_FAIL(DFM_EMISMATCH, "%llu embeddings for %llu chunks. HINT: run dfm encode again",
                        (unsigned long long)es->n_rows, (unsigned long long)cs->n_chunks);
    size_t n = 0; /* chunks that hold a token */
    for (uint64_t c = 0; c < cs->n_chunks; c++) {
        const dfm_chunk_meta *meta;
        const uint32_t *tok;
        DFM_TRY(dfm_chunk_set_get(cs, c, &meta, &tok));
        n += meta->n_valid > 0;
    }
    if (n < 2) return DFM_FAIL(DFM_EARG, "%zu chunks hold tokens: fewer than 2 sequences", n);
    const int T = 2 * L, d = own ? own->d : (int)es->dim;
    size_t nt = n * (size_t)T + 1; /* one filler token after the last sequence: its last token predicts nothing */
    ds->tokens = malloc(nt * sizeof(int));
    ds->pad = malloc(nt);
    size_t nchunks = 2 * n, table = nchunks * K + nchunks * (size_t)K * d * sizeof(float);
    uint8_t *tab = calloc(table, 1);
    if (!ds->tokens || !ds->pad || !tab) {
        free(tab);
        return DFM_FAIL(DFM_ENOMEM, "reading set: %zu sequences of %d tokens, K %d x d %d", n, T, K, d);
    }
    uint8_t *mask = tab;
    size_t i = 0;
    int rc = DFM_OK;
    for (uint64_t c = 0; c < cs->n_chunks && !rc; c++) {
        const dfm_chunk_meta *meta;
        const uint32_t *tok;
        rc = dfm_chunk_set_get(cs, c, &meta, &tok);
        if (rc || !meta->n_valid) continue;
        if (n_before && c < split_chunk) *n_before = i + 1;
        int *t = ds->tokens + i * T;
        uint8_t *p = ds->pad + i * T;
        for (int s = 0; s < L; s++) { /* chunk 0: filler, then the prompt; all padding but the prompt's last token */
            int k = s - (L - n_prompt);
            t[s] = prompt[k < 0 ? 0 : k];
            p[s] = s != L - 1;
        }
        for (int s = 0; s < L; s++) {
            t[L + s] = (int)tok[s];
            p[L + s] = s >= meta->n_valid;
            if (tok[s] > ds->max_token) ds->max_token = tok[s];
        }
        /* chunk 1 of sequence i: slot 0 is chunk c's own embedding, or slots 0..k-1 its own slots of the file
         * (the table is [2n][K] masks, then [2n][K][d]) */
        size_t chunk = 2 * i + 1;
        float *dst = (float *)(void *)(tab + nchunks * K + chunk * (size_t)K * d * sizeof(float));
        rc = own_slots_of(own, es, c, dst, mask + chunk * K);
        i++;
    }
    for (int s = 0; s < n_prompt; s++)
        if ((uint32_t)prompt[s] > ds->max_token) ds->max_token = (uint32_t)prompt[s];
    ds->tokens[nt - 1] = prompt[0];
    ds->pad[nt - 1] = 1;
    ds->n_tokens = nt;
    ds->T = T;
    ds->n_seq = n;
    ds->chunk_len = L;
    ds->tokenizer_hash = cs->n_shards ? cs->shards[0]->hdr.tokenizer_hash : 0;
    if (!rc) rc = data_attach_targets(ds, K, d, nchunks, tab);
    else free(tab);
    return rc;
}

int data_open_reading(const char *run, int L, int K, const int *prompt, int n_prompt, const char *own_slots,
                      uint64_t split_chunk, size_t *n_before, DataSet *ds) {
    memset(ds, 0, sizeof *ds);
    if (n_before) *n_before = 0;
    if (n_prompt < 1 || n_prompt > L)
        return DFM_FAIL(DFM_EARG, "a reading prompt of %d tokens: it must fill 1 to %d (one chunk)", n_prompt, L);
    if (K < 1) return DFM_FAIL(DFM_EARG, "reading set: %d memory slots", K);
    dfm_chunk_set *cs = NULL;
    dfm_emb_set *es = NULL;
    DataSet own = {.T = L};
    int rc = dfm_chunk_set_open(run, &cs);
    if (!rc && own_slots) rc = data_open_targets(&own, own_slots, NULL, L, 0, 0);
    if (!rc && !own_slots) rc = dfm_emb_set_open(run, &es);
    if (!rc) rc = build(cs, es, own_slots ? &own : NULL, L, K, prompt, n_prompt, split_chunk, n_before, ds);
    data_close(&own);
    dfm_emb_set_close(es);
    dfm_chunk_set_close(cs);
    if (rc) {
        data_close(ds);
        return dfm_error_prefix("while building the reading set of %s", run);
    }
    DFM_LOG_I("reading set: %zu chunks of %s, each regenerated from its own %s (d %d, of %d slots) after a %d-token prompt",
              ds->n_seq, run, own_slots ? "slots" : "embedding", ds->d, K, n_prompt);
    if (own_slots) DFM_LOG_I("reading set: the chunks' own slots from %s", own_slots);
    return DFM_OK;
}

int data_open_reading_context(const char *run, int T, int L, int K, const char *own_slots, DataSet *ds) {
    if (K < 1) return DFM_FAIL(DFM_EARG, "in-context reading set: %d memory slots", K);
    DFM_TRY(data_open(run, T, ds));
    dfm_emb_set *es = NULL;
    DataSet own = {.T = L};
    uint8_t *tab = NULL;
    uint64_t n = ds->chunk_len == L ? ds->n_tokens / (size_t)L : 0;
    int rc = n ? DFM_OK
               : DFM_FAIL(DFM_EARG, "its chunks are %d tokens long, the model's %d. HINT: --chunk-len %d", ds->chunk_len, L,
                          ds->chunk_len);
    if (!rc && own_slots) rc = data_open_targets(&own, own_slots, NULL, L, 0, 0);
    if (!rc && !own_slots) rc = dfm_emb_set_open(run, &es);
    if (!rc && own_slots && own.K > K)
        rc = DFM_FAIL(DFM_EARG, "its own-slots file holds %d slots per chunk, more than the %d memory slots. HINT: --slots %d",
                      own.K, K, own.K);
    if (!rc && es && es->n_rows != n)
        rc = DFM_FAIL(DFM_EMISMATCH, "%llu embeddings for %llu chunks. HINT: run dfm encode again",
                      (unsigned long long)es->n_rows, (unsigned long long)n);
    int d = own_slots ? own.d : es ? (int)es->dim : 0;
    size_t bytes = n * K + n * (size_t)K * d * sizeof(float);
    if (!rc && !(tab = calloc(bytes, 1)))
        rc = DFM_FAIL(DFM_ENOMEM, "in-context reading set: %llu chunks, K %d x d %d", (unsigned long long)n, K, d);
    for (uint64_t c = 0; c < n && !rc; c++) { /* the table is [n][K] masks, then [n][K][d] */
        float *dst = (float *)(void *)(tab + n * K + c * (size_t)K * d * sizeof(float));
        rc = own_slots_of(own_slots ? &own : NULL, es, c, dst, tab + c * K);
    }
    data_close(&own);
    dfm_emb_set_close(es);
    if (!rc) rc = data_attach_targets(ds, K, d, n, tab);
    else free(tab);
    if (rc) {
        data_close(ds);
        return dfm_error_prefix("while building the in-context reading set of %s", run);
    }
    DFM_LOG_I("in-context reading set: %zu sequences of %d tokens of %s, each chunk's memory its own %s (d %d, of %d slots)",
              ds->n_seq, T, run, own_slots ? "slots" : "embedding", d, K);
    return DFM_OK;
}
