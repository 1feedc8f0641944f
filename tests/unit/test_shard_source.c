/* The real data path of write-targets: a run with chunk/encode/retrieve stages (written here with the
 * embedding and neighbour writers, no encoder needed) -> target shards. Checks that every valid slot
 * holds exactly the stored embedding of its neighbour (fp16 blocks widened, then rounded to the
 * target dtype), that ranks own contiguous block ranges that tile the ids for P = 1..4 and serve
 * exactly the stored rows, and that sequence starts come from the chunk stage's L and S. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "common/manifest.h"
#include "common/mpiutil.h"
#include "schemas/embedding_shard.h"
#include "schemas/neighbor_shard.h"
#include "shard/target_build.h"
#include "shard/target_reader.h"
#include "shard/target_source.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N = 90, BC = 32, DIM = 12, K = 5, L = 4, S = 16 };
static char tmpdir[256];
static dfm_mpi mpi;

static int teardown(void **state) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd);
}

static void nbr_row(uint64_t q, int64_t *ids, float *sc, uint64_t *mask) {
    int valid = q % (S / L) == 0 ? 0 : (q % 3 == 0 ? K - 2 : K);
    *mask = valid ? (1ULL << valid) - 1 : 0;
    for (int r = 0; r < K; r++) {
        ids[r] = r < valid ? (int64_t)((q * 7 + (uint64_t)r * 11 + 1) % N) : -1;
        sc[r] = r < valid ? 1.0f - 0.1f * (float)r : 0.0f;
    }
}

static void make_fixture(void) {
    char *run = tmpdir;
    char *enc = dfm_path_join(run, "encode"), *ret = dfm_path_join(run, "retrieve");
    assert_int_equal(dfm_mkdir_p(enc), DFM_OK);
    assert_int_equal(dfm_mkdir_p(ret), DFM_OK);
    json_t *eouts = json_array(), *routs = json_array();
    float row[DIM];
    for (uint64_t b = 0; b * BC < N; b++) {
        uint64_t first = b * BC, n = first + BC <= N ? BC : N - first;
        char *name = dfm_emb_block_name(b), *path = dfm_path_join(run, name);
        dfm_emb_header h = {0};
        h.dim = DIM;
        h.dtype = DFM_EMB_F16;
        h.first_chunk = first;
        h.model_hash = 11;
        h.tokenizer_hash = 22;
        dfm_emb_writer *w;
        assert_int_equal(dfm_emb_writer_open(path, &h, &w), DFM_OK);
        for (uint64_t i = 0; i < n; i++) {
            for (int j = 0; j < DIM; j++) row[j] = (float)((first + i) * 31 + (uint64_t)j * 7 % 13) / 1000.0f - 0.3f;
            assert_int_equal(dfm_emb_writer_add(w, row, 1), DFM_OK);
        }
        assert_int_equal(dfm_emb_writer_close(w), DFM_OK);
        json_array_append_new(eouts, json_pack("{s:s, s:I, s:I}", "file", name, "first_chunk", (json_int_t)first, "n_rows", (json_int_t)n));
        free(name);
        free(path);
    }
    const uint64_t nb_first[2] = {0, 50}, nb_n[2] = {50, N - 50};
    for (int b = 0; b < 2; b++) {
        char name[64];
        snprintf(name, sizeof name, "retrieve/nbr-%06d.bin", b);
        char *path = dfm_path_join(run, name);
        dfm_nbr_header h = {0};
        h.k = K;
        h.metric = DFM_METRIC_IP;
        h.first_chunk = nb_first[b];
        h.n_rows = nb_n[b];
        h.n_chunks_total = N;
        h.query_window = 1;
        dfm_nbr_writer *w;
        assert_int_equal(dfm_nbr_writer_open(path, &h, &w), DFM_OK);
        for (uint64_t q = nb_first[b]; q < nb_first[b] + nb_n[b]; q++) {
            int64_t ids[K];
            float sc[K];
            uint64_t mask;
            nbr_row(q, ids, sc, &mask);
            int rc = dfm_nbr_writer_add(w, ids, sc, mask);
            if (rc) fail_msg("nbr row %llu: %s", (unsigned long long)q, dfm_last_error());
        }
        assert_int_equal(dfm_nbr_writer_close(w), DFM_OK);
        json_array_append_new(routs, json_pack("{s:s, s:I, s:I}", "file", name, "first_chunk", (json_int_t)nb_first[b], "n_rows",
                                               (json_int_t)nb_n[b]));
        free(path);
    }
    json_t *man;
    assert_int_equal(dfm_manifest_load(run, 1, &man), DFM_OK);
    dfm_manifest_set_stage(man, "chunk", json_pack("{s:s, s:{s:i, s:i, s:s}, s:[], s:{s:i}}", "state", "complete", "config", "chunk-len", L,
                                                   "seq-len", S, "tokenizer_hash", "0000000000000016", "inputs", "counts", "chunks", N));
    dfm_manifest_set_stage(man, "encode", json_pack("{s:s, s:{s:s}, s:i, s:i, s:s, s:o}", "state", "complete", "config", "model", "test",
                                                    "block_chunks", BC, "dim", DIM, "dtype", "fp16", "outputs", eouts));
    dfm_manifest_set_stage(man, "retrieve", json_pack("{s:s, s:{s:i}, s:o}", "state", "complete", "config", "k", K, "outputs", routs));
    assert_int_equal(dfm_manifest_save(run, man), DFM_OK);
    json_decref(man);
    free(enc);
    free(ret);
}

static int setup(void **state) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dfm-test-source-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    make_fixture();
    return 0;
}

static void test_ownership_and_rows(void **state) {
    dfm_emb_set *es;
    assert_int_equal(dfm_emb_set_open(tmpdir, &es), DFM_OK);
    float got[DIM], want[DIM];
    for (int P = 1; P <= 4; P++) {
        uint64_t at = 0;
        for (int r = 0; r < P; r++) {
            dfm_mpi fake = {.rank = r, .size = P, .comm = MPI_COMM_NULL};
            dfm_target_real *real;
            dfm_target_source src;
            int rc = dfm_target_real_open(&fake, tmpdir, &real, &src);
            if (rc) fail_msg("real_open r%d/%d: %s", r, P, dfm_last_error());
            assert_true(src.n_chunks == N && src.k == K && src.d == DIM);
            if (src.own_count) assert_true(src.own_first == at);
            at += src.own_count;
            for (uint64_t id = src.own_first; id < src.own_first + src.own_count; id++) {
                assert_int_equal(src.rows(src.ctx, &id, 1, got), DFM_OK);
                assert_int_equal(dfm_emb_set_rows_f32(es, id, 1, want), DFM_OK);
                assert_memory_equal(got, want, sizeof got);
            }
            if (src.own_first + src.own_count < N) {
                uint64_t other = src.own_first + src.own_count;
                assert_int_equal(src.rows(src.ctx, &other, 1, got), DFM_EINTERNAL); /* not this rank's row */
            }
            dfm_target_real_close(real);
        }
        assert_true(at == N);
    }
    dfm_emb_set_close(es);
}

static void build_and_check(int dtype, int ids_only) {
    dfm_mpi fake = {.rank = 0, .size = 1, .comm = MPI_COMM_NULL};
    dfm_target_real *real;
    dfm_target_source src;
    assert_int_equal(dfm_target_real_open(&fake, tmpdir, &real, &src), DFM_OK);
    json_t *man;
    assert_int_equal(dfm_manifest_load(tmpdir, 0, &man), DFM_OK);
    dfm_target_build_config bc = {.n_shards = 3, .rec = {.k = K, .d = DIM, .dtype = dtype, .ids_only = ids_only, .shuffle = 1, .level = 3},
                                  .block_queries = 7};
    char fp[17];
    int skip;
    assert_int_equal(dfm_target_stage_begin(man, tmpdir, NULL, &bc, N, 1, fp, &skip), DFM_OK);
    bc.fingerprint = fp;
    dfm_target_build_stats st;
    int rc = dfm_target_build(&mpi, tmpdir, &src, &bc, &st);
    if (rc) fail_msg("build: %s", dfm_last_error());
    assert_int_equal(dfm_target_stage_finish(man, tmpdir, 3, &st, 0), DFM_OK);
    json_decref(man);
    dfm_target_real_close(real);

    dfm_emb_set *es;
    assert_int_equal(dfm_emb_set_open(tmpdir, &es), DFM_OK);
    dfm_target_reader *r;
    dfm_target_open_opts o = {.tokens_run = tmpdir, .k = K, .d = DIM, .n_chunks = N};
    assert_int_equal(dfm_target_reader_open(tmpdir, &o, &r), DFM_OK);
    int64_t ids[K], wid[K];
    float sc[K], wsc[K], emb[K * DIM], row[DIM];
    dfm_trec t = {.ids = ids, .scores = sc, .emb = emb};
    uint64_t n = 0, wmask;
    while ((rc = dfm_target_reader_next(r, &t)) == DFM_OK) {
        uint64_t q = n++;
        nbr_row(q, wid, wsc, &wmask);
        assert_true(t.chunk_id == q && t.mask == wmask);
        assert_int_equal(!!(t.flags & DFM_TREC_F_SEQ_START), q % (S / L) == 0);
        assert_memory_equal(ids, wid, sizeof ids);
        assert_memory_equal(sc, wsc, sizeof sc);
        for (int s = 0; s < K; s++) {
            if (!((wmask >> s) & 1u)) {
                for (int j = 0; j < DIM; j++) assert_true(emb[s * DIM + j] == 0.0f);
                continue;
            }
            assert_int_equal(dfm_emb_set_rows_f32(es, (uint64_t)wid[s], 1, row), DFM_OK);
            for (int j = 0; j < DIM; j++) {
                float want = row[j];
                if (dtype == DFM_DTYPE_BF16) want = dfm_bf16_to_f32(dfm_f32_to_bf16(row[j]));
                if (memcmp(&want, &emb[s * DIM + j], 4) != 0)
                    fail_msg("chunk %llu slot %d value %d: %g, stored embedding %g", (unsigned long long)q, s, j, emb[s * DIM + j], want);
            }
        }
    }
    assert_int_equal(rc, DFM_TARGET_END);
    assert_true(n == N);
    dfm_target_reader_close(r);
    dfm_emb_set_close(es);
}

static void test_real_source_exact_embeddings(void **state) {
    build_and_check(DFM_DTYPE_FP16, 0); /* fp16 blocks -> fp16 targets: bit-exact */
    build_and_check(DFM_DTYPE_FP32, 0); /* widened exactly */
    build_and_check(DFM_DTYPE_BF16, 1); /* rounded to bf16, store ids */
}

int main(int argc, char **argv) {
    if (dfm_mpi_init(&argc, &argv, &mpi)) {
        fprintf(stderr, "%s\n", dfm_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ownership_and_rows),
        cmocka_unit_test(test_real_source_exact_embeddings),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    dfm_mpi_finalize();
    return rc;
}
