/* retrieve_mkrun — make a synthetic run directory (chunk + encode stages) for the retrieval tests
 * and benchmarks, in the real file formats, without a tokenizer or an encoder.
 *
 *   retrieve_mkrun RUN N DIM CHUNKS_PER_SEQ BLOCK SEED [fp32|fp16|bf16] [CLUSTERS] [CHUNK_SHARDS]
 *
 * Chunks: documents of 1..6 chunks, half of the document boundaries inside a chunk (doc_last =
 * doc_first + 1), ~2% all-padding chunks (n_valid 0), sequences of CHUNKS_PER_SEQ chunks.
 * Embeddings: unit vectors around CLUSTERS random centres (default 32), ~3% exact duplicates of an
 * earlier chunk's vector (score ties). Built by `make tools` (build/tools/retrieve_mkrun); run by
 * tests/integration/pipeline/test_retrieve_mpi.sh and bench/retrieval/bench_retrieve.sh. */
#include "common/error.h"
#include "common/fsutil.h"
#include "common/manifest.h"
#include "schemas/chunk_shard.h"
#include "schemas/embedding_shard.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t st;
static double urand(void) {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(st >> 11) / 9007199254740992.0;
}
static double nrand(void) {
    double u = urand() + 1e-12, v = urand();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static int fail(void) {
    fprintf(stderr, "retrieve_mkrun: %s\n", dfm_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s RUN N DIM CHUNKS_PER_SEQ BLOCK SEED [fp32|fp16|bf16] [CLUSTERS] [CHUNK_SHARDS]\n", argv[0]);
        return 2;
    }
    const char *run = argv[1];
    uint64_t n = strtoull(argv[2], NULL, 10), block = strtoull(argv[5], NULL, 10);
    uint32_t dim = (uint32_t)atoi(argv[3]), cps = (uint32_t)atoi(argv[4]);
    st = strtoull(argv[6], NULL, 10) * 2654435761ull + 1;
    int dtype = argc > 7 ? dfm_emb_dtype_parse(argv[7]) : DFM_EMB_F32;
    int clusters = argc > 8 ? atoi(argv[8]) : 32;
    int nshards = argc > 9 ? atoi(argv[9]) : 2;
    const uint32_t L = 4;
    if (!n || !dim || !cps || !block || dtype < 0 || clusters < 1 || nshards < 1) return 2;
    char *cdir = dfm_path_join(run, "chunk"), *edir = dfm_path_join(run, "encode");
    if (dfm_mkdir_p(cdir) || dfm_mkdir_p(edir)) return fail();

    /* chunks */
    dfm_chunk_meta *meta = calloc(n, sizeof *meta);
    uint64_t doc = 0;
    int left = 1 + (int)(urand() * 6);
    for (uint64_t i = 0; i < n; i++) {
        meta[i].doc_first = doc;
        meta[i].n_valid = urand() < 0.02 ? 0 : (urand() < 0.1 ? 1u + (uint32_t)(urand() * (L - 1)) : L);
        meta[i].flags = (uint16_t)((i % cps == 0 ? DFM_CHUNK_SEQ_START : 0) | (i == 0 ? DFM_CHUNK_DOC_START : 0));
        if (--left == 0) {
            int inside = urand() < 0.5 && i + 1 < n;
            meta[i].doc_last = inside ? doc + 1 : doc;
            if (inside) meta[i].flags |= DFM_CHUNK_DOC_START;
            doc++;
            left = 1 + (int)(urand() * 6);
            if (!inside && i + 1 < n) meta[i + 1].flags |= DFM_CHUNK_DOC_START;
        } else {
            meta[i].doc_last = doc;
        }
    }
    uint64_t n_docs = meta[n - 1].doc_last + 1;
    json_t *couts = json_array();
    uint32_t *tok = calloc(L, sizeof *tok);
    for (int s = 0; s < nshards; s++) {
        uint64_t lo = n * (uint64_t)s / (uint64_t)nshards, hi = n * (uint64_t)(s + 1) / (uint64_t)nshards;
        char name[64];
        snprintf(name, sizeof name, "chunk/chunks-%05d.bin", s);
        char *path = dfm_path_join(run, name);
        dfm_chunk_header h = {0};
        h.chunk_len = L;
        h.seq_len = L * cps;
        h.first_chunk = lo;
        h.vocab_size = 16;
        h.tokenizer_hash = 0x1234;
        dfm_chunk_writer *w;
        if (dfm_chunk_writer_open(path, &h, &w)) return fail();
        for (uint64_t i = lo; i < hi; i++)
            if (dfm_chunk_writer_add(w, &meta[i], tok)) return fail();
        if (dfm_chunk_writer_close(w)) return fail();
        json_array_append_new(couts, json_pack("{s:s, s:I, s:I}", "file", name, "first_chunk", (json_int_t)lo, "n_chunks", (json_int_t)(hi - lo)));
        free(path);
    }

    /* embeddings */
    float *cent = malloc(sizeof(float) * (size_t)clusters * dim), *x = malloc(sizeof(float) * n * dim);
    for (size_t i = 0; i < (size_t)clusters * dim; i++) cent[i] = (float)nrand();
    for (uint64_t i = 0; i < n; i++) {
        float *v = x + i * dim;
        if (i > 10 && urand() < 0.03) {
            memcpy(v, x + (uint64_t)(urand() * (double)(i - 1)) * dim, sizeof(float) * dim);
            continue;
        }
        int c = (int)(urand() * clusters);
        double s = 0;
        for (uint32_t t = 0; t < dim; t++) {
            v[t] = cent[(size_t)c * dim + t] + (float)(0.7 * nrand());
            s += (double)v[t] * v[t];
        }
        for (uint32_t t = 0; t < dim; t++) v[t] = (float)(v[t] / sqrt(s));
    }
    json_t *eouts = json_array();
    for (uint64_t b = 0; b * block < n; b++) {
        uint64_t lo = b * block, hi = lo + block < n ? lo + block : n;
        char *name = dfm_emb_block_name(b), *path = dfm_path_join(run, name);
        dfm_emb_header h = {0};
        h.dim = dim;
        h.dtype = (uint32_t)dtype;
        h.first_chunk = lo;
        h.model_hash = 0x5678;
        h.tokenizer_hash = 0x1234;
        dfm_emb_writer *w;
        if (dfm_emb_writer_open(path, &h, &w)) return fail();
        if (dfm_emb_writer_add(w, x + lo * dim, hi - lo)) return fail();
        if (dfm_emb_writer_close(w)) return fail();
        json_array_append_new(eouts, json_pack("{s:s, s:I, s:I}", "file", name, "first_chunk", (json_int_t)lo, "n_rows", (json_int_t)(hi - lo)));
        free(name);
        free(path);
    }
    json_t *man = NULL;
    if (dfm_manifest_load(run, 1, &man)) return fail();
    dfm_manifest_set_stage(man, "chunk",
                           json_pack("{s:s, s:i, s:{s:s, s:i, s:i}, s:{s:I, s:I}, s:o}", "state", "complete", "ranks", 1, "config", "synthetic",
                                     "retrieve_mkrun", "chunk-len", (int)L, "seq-len", (int)(L * cps), "counts", "chunks", (json_int_t)n, "documents", (json_int_t)n_docs, "outputs", couts));
    dfm_manifest_set_stage(man, "encode",
                           json_pack("{s:s, s:i, s:I, s:i, s:s, s:o}", "state", "complete", "ranks", 1, "block_chunks", (json_int_t)block, "dim",
                                     (int)dim, "dtype", dfm_emb_dtype_name((uint32_t)dtype), "outputs", eouts));
    if (dfm_manifest_save(run, man)) return fail();
    json_decref(man);
    printf("%s: %llu chunks, %llu documents, dim %u, %u chunks/sequence, blocks of %llu, %s\n", run, (unsigned long long)n,
           (unsigned long long)n_docs, dim, cps, (unsigned long long)block, dfm_emb_dtype_name((uint32_t)dtype));
    free(meta);
    free(tok);
    free(cent);
    free(x);
    free(cdir);
    free(edir);
    return 0;
}
