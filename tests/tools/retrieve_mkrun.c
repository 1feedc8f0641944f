/* retrieve_mkrun — make a synthetic run directory (chunk + encode stages) for the retrieval tests
 * and benchmarks, in the real file formats, without a tokenizer or an encoder.
 *
 *   retrieve_mkrun RUN N DIM CHUNKS_PER_SEQ BLOCK SEED [fp32|fp16|bf16] [CLUSTERS] [CHUNK_SHARDS] [--minilm-like]
 *
 * Chunks: documents of 1..6 chunks, half of the document boundaries inside a chunk (doc_last =
 * doc_first + 1), ~2% all-padding chunks (n_valid 0), sequences of CHUNKS_PER_SEQ chunks.
 * Embeddings: unit vectors around CLUSTERS random centres (default 32), ~3% exact duplicates of an
 * earlier chunk's vector (score ties). Built by `make tools` (build/tools/retrieve_mkrun); run by
 * tests/integration/pipeline/test_retrieve_mpi.sh and bench/retrieval/bench_retrieve.sh.
 *
 * --minilm-like (anywhere after RUN; the files written without it are unchanged): embeddings with the
 * statistics of real all-MiniLM-L6-v2 embeddings, written block by block (memory: one block of
 * BLOCK_GEN rows, whatever N; 2e6 x 384 is fine), each row drawn from its own seeded generator (row i
 * is the same for any N and BLOCK). CLUSTERS is then the number of topics (default 2000), grouped into
 * CLUSTERS/20 super-topics (topic t in super-topic t mod S). Row i, topic t uniform:
 *
 *     v = normalise(sqrt(.185) mu + sqrt(.19) super[t mod S] + sqrt(.16) topic[t] + sqrt(.465) noise)
 *
 * mu, super[], topic[] random unit vectors; noise Gaussian with per-dimension standard deviations
 * sigma_j proportional to (r_j + 8)^-0.7 (r a random permutation of the dimensions: a decaying
 * spectrum, spread over PQ's sub-spaces), scaled so E|noise|^2 = 1. No duplicates.
 *
 * The targets are the demo run's MiniLM embeddings (runs/demo, 10,432 chunks of the GCIDE corpus, d =
 * 384), measured by /tmp/issue39/embstats.py on 8,000 of them (issue 39): mean pairwise cosine 0.186,
 * mean top-1 neighbour cosine 0.634, mean top-16 neighbour cosine 0.487; variance in the top 10 / 50
 * principal components 0.22 / 0.52; norm of the mean 0.431. The weights above were fitted on 20,000 rows
 * of this model at d = 384 (numpy): 0.186, 0.632, 0.490; 0.21 / 0.49; 0.432. With 2000 topics a 20k
 * sample has ~10 rows a topic and ~200 a super-topic: the top-1 neighbour is mostly of the same topic,
 * the top-16th of the same super-topic. tests/py/retriever/test_mkrun_minilm.py checks the first three
 * on 20,000 rows. Unlike the 32-cluster default (0.02 / 0.73 / 0.70), the top-16th neighbour is much
 * farther than the first, as in real text, so ANN recall is not unrealistically hard. */
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

/* ---- --minilm-like: one seeded generator a row, so a block needs nothing but its rows ---- */

#define BLOCK_GEN 4096 /* rows generated and written at a time */
#define TOPICS_PER_SUPER 20

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double srand01(uint64_t *x) { return (double)(splitmix64(x) >> 11) / 9007199254740992.0; }
static double snrand(uint64_t *x) {
    double u = srand01(x) + 1e-12, v = srand01(x);
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}
static void unit_gauss(uint64_t *x, float *v, uint32_t dim) {
    double s = 0;
    for (uint32_t t = 0; t < dim; t++) {
        v[t] = (float)snrand(x);
        s += (double)v[t] * v[t];
    }
    for (uint32_t t = 0; t < dim; t++) v[t] = (float)(v[t] / sqrt(s));
}

typedef struct {
    uint32_t dim, topics, supers;
    uint64_t seed;
    float *mu, *super, *topic, *sigma; /* dim; supers x dim; topics x dim; dim */
} minilm_model;

/* the mixture weights (squared: shares of a row's expected squared norm), fitted as the header says */
static const double W_MEAN = 0.185, W_SUPER = 0.19, W_TOPIC = 0.16, W_NOISE = 0.465, SPECTRUM_DECAY = 0.7, SPECTRUM_OFFSET = 8;

static int minilm_make(minilm_model *m, uint32_t dim, uint32_t topics, uint64_t seed) {
    m->dim = dim, m->topics = topics, m->seed = seed;
    m->supers = topics / TOPICS_PER_SUPER ? topics / TOPICS_PER_SUPER : 1;
    m->mu = malloc(sizeof(float) * dim), m->sigma = malloc(sizeof(float) * dim);
    m->super = malloc(sizeof(float) * m->supers * dim), m->topic = malloc(sizeof(float) * (size_t)topics * dim);
    uint32_t *perm = malloc(sizeof *perm * dim);
    if (!m->mu || !m->sigma || !m->super || !m->topic || !perm) return DFM_FAIL(DFM_ENOMEM, "no memory for %u topics of dim %u", topics, dim);
    uint64_t x = seed * 0xd1342543de82ef95ull + 0x5851f42d4c957f2dull;
    unit_gauss(&x, m->mu, dim);
    for (uint32_t k = 0; k < m->supers; k++) unit_gauss(&x, m->super + (size_t)k * dim, dim);
    for (uint32_t t = 0; t < topics; t++) unit_gauss(&x, m->topic + (size_t)t * dim, dim);
    for (uint32_t j = 0; j < dim; j++) perm[j] = j;
    for (uint32_t j = dim - 1; j > 0; j--) { /* Fisher-Yates */
        uint32_t r = (uint32_t)(srand01(&x) * (j + 1)), tmp = perm[j];
        perm[j] = perm[r], perm[r] = tmp;
    }
    double s2 = 0;
    for (uint32_t j = 0; j < dim; j++) {
        m->sigma[j] = (float)pow(perm[j] + SPECTRUM_OFFSET, -SPECTRUM_DECAY);
        s2 += (double)m->sigma[j] * m->sigma[j];
    }
    for (uint32_t j = 0; j < dim; j++) m->sigma[j] = (float)(m->sigma[j] / sqrt(s2)); /* sum sigma^2 = 1 */
    free(perm);
    return DFM_OK;
}

static void minilm_free(minilm_model *m) {
    free(m->mu), free(m->sigma), free(m->super), free(m->topic);
}

static void minilm_row(const minilm_model *m, uint64_t i, float *v) {
    uint64_t x = (m->seed ^ 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull + i * 0x94d049bb133111ebull;
    splitmix64(&x);
    uint32_t t = (uint32_t)(srand01(&x) * m->topics);
    if (t >= m->topics) t = m->topics - 1;
    const float *sp = m->super + (size_t)(t % m->supers) * m->dim, *tp = m->topic + (size_t)t * m->dim;
    const double a = sqrt(W_MEAN), b = sqrt(W_SUPER), c = sqrt(W_TOPIC), e = sqrt(W_NOISE);
    double s = 0;
    for (uint32_t j = 0; j < m->dim; j++) {
        double y = a * m->mu[j] + b * sp[j] + c * tp[j] + e * m->sigma[j] * snrand(&x);
        v[j] = (float)y;
        s += y * y;
    }
    for (uint32_t j = 0; j < m->dim; j++) v[j] = (float)(v[j] / sqrt(s));
}

/* rows [lo, hi) into w, BLOCK_GEN at a time */
static int minilm_write(const minilm_model *m, dfm_emb_writer *w, uint64_t lo, uint64_t hi, float *buf) {
    for (uint64_t r = lo; r < hi; r += BLOCK_GEN) {
        uint64_t e = r + BLOCK_GEN < hi ? r + BLOCK_GEN : hi;
        for (uint64_t i = r; i < e; i++) minilm_row(m, i, buf + (i - r) * m->dim);
        DFM_TRY(dfm_emb_writer_add(w, buf, e - r));
    }
    return DFM_OK;
}

static int fail(void) {
    fprintf(stderr, "retrieve_mkrun: %s\n", dfm_last_error());
    return 1;
}

int main(int argc, char **argv) {
    int minilm = 0;
    for (int a = 1; a < argc; a++) /* the flag, wherever it is, out of the positional arguments */
        if (!strcmp(argv[a], "--minilm-like")) {
            minilm = 1;
            memmove(argv + a, argv + a + 1, sizeof *argv * (size_t)(argc - a));
            argc--, a--;
        }
    if (argc < 7) {
        fprintf(stderr, "usage: %s RUN N DIM CHUNKS_PER_SEQ BLOCK SEED [fp32|fp16|bf16] [CLUSTERS] [CHUNK_SHARDS] [--minilm-like]\n", argv[0]);
        return 2;
    }
    const uint64_t seed = strtoull(argv[6], NULL, 10);
    const char *run = argv[1];
    uint64_t n = strtoull(argv[2], NULL, 10), block = strtoull(argv[5], NULL, 10);
    uint32_t dim = (uint32_t)atoi(argv[3]), cps = (uint32_t)atoi(argv[4]);
    st = strtoull(argv[6], NULL, 10) * 2654435761ull + 1;
    int dtype = argc > 7 ? dfm_emb_dtype_parse(argv[7]) : DFM_EMB_F32;
    int clusters = argc > 8 ? atoi(argv[8]) : minilm ? 2000 : 32;
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

    /* embeddings: all in memory (default), or generated block by block (--minilm-like) */
    float *cent = NULL, *x = NULL;
    minilm_model mm = {0};
    if (minilm) {
        if (minilm_make(&mm, dim, (uint32_t)clusters, seed)) return fail();
        x = malloc(sizeof(float) * BLOCK_GEN * dim);
        if (!x) return 2;
    } else {
        cent = malloc(sizeof(float) * (size_t)clusters * dim), x = malloc(sizeof(float) * n * dim);
        for (size_t i = 0; i < (size_t)clusters * dim; i++) cent[i] = (float)nrand();
    }
    for (uint64_t i = 0; !minilm && i < n; i++) {
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
        if (minilm ? minilm_write(&mm, w, lo, hi, x) : dfm_emb_writer_add(w, x + lo * dim, hi - lo)) return fail();
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
    if (minilm) printf("  MiniLM-like embeddings: %u topics in %u super-topics\n", mm.topics, mm.supers);
    minilm_free(&mm);
    free(meta);
    free(tok);
    free(cent);
    free(x);
    free(cdir);
    free(edir);
    return 0;
}
