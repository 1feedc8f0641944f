/* The trainer's loader thread (trainer/data/prefetch.h): it yields exactly the batches of the synchronous
 * loop (indices, tokens, targets, target memory, loader positions) for every read-ahead depth, number of
 * loader threads and rank split; evaluation reads through its lock while it runs; it stops cleanly while blocked on a full ring;
 * a custom allocator is used for every buffer and every buffer is given back. Also run under
 * ASan + UBSan (build-san). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "trainer/data/data.h"
#include "trainer/data/prefetch.h"

static char tmpdir[256];
enum { NTOK = 4001, T = 16, L = 4, K = 3, D = 5 };

static int setup(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dfm-test-prefetch-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    return 0;
}
static int teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd);
}

static void open_data(DataSet *ds) {
    char tok[300], tgt[300];
    snprintf(tok, sizeof tok, "%s/tokens.bin", tmpdir);
    snprintf(tgt, sizeof tgt, "%s/targets.bin", tmpdir);
    uint32_t *ids = malloc(NTOK * sizeof *ids);
    for (int i = 0; i < NTOK; i++) ids[i] = (uint32_t)((i * 7919u) % 97u);
    assert_int_equal(tokens_bin_write(tok, ids, NTOK), 0);
    free(ids);
    size_t nch = NTOK / L + 1;
    uint8_t *mask = malloc(nch * K);
    float *emb = malloc(nch * K * D * sizeof(float));
    for (size_t i = 0; i < nch * K; i++) mask[i] = (uint8_t)(i % 5 != 0);
    for (size_t i = 0; i < nch * K * D; i++) emb[i] = (float)i * 0.25f;
    assert_int_equal(targets_file_write(tgt, K, D, L, nch, mask, emb), 0);
    free(mask);
    free(emb);
    memset(ds, 0, sizeof *ds);
    assert_int_equal(data_open(tok, T, ds), 0);
    assert_int_equal(data_open_targets(ds, tgt, NULL, L, K, D), 0);
}

/* a counting allocator: every buffer the prefetcher takes must come back */
static long g_live;
static void *count_alloc(size_t n, void *u) {
    (*(long *)u)++;
    g_live++;
    return malloc(n);
}
static void count_free(void *p, void *u) {
    (void)u;
    if (p) g_live--;
    free(p);
}

static void test_same_batches_as_the_synchronous_loop(void **state) {
    (void)state;
    DataSet ds;
    open_data(&ds);
    const int B = 3, NB = 60;
    size_t S = (size_t)B * (T / L) * K;
    for (int world = 1; world <= 3; world++)
        for (int rank = 0; rank < world; rank++)
            for (int depth = 2; depth <= 5; depth += 3)
                for (int threads = 1; threads <= 3; threads += 2) {
                Loader ref, ld;
                assert_int_equal(loader_init(&ref, 0, ds.n_seq - 4, 11, 1), 0);
                assert_int_equal(loader_init(&ld, 0, ds.n_seq - 4, 11, 1), 0);
                long allocs = 0;
                PrefetchAllocator al = {count_alloc, count_free, &allocs};
                Prefetcher *pf;
                assert_int_equal(prefetch_start(&pf, &ds, &ld, B, L, 1, rank, world, depth, threads, &al), 0);
                size_t idx[B], skip[B];
                int inp[B * T], tgt[B * T];
                float *tm = malloc(S * D * sizeof(float));
                uint8_t *tk = malloc(S);
                for (int i = 0; i < NB; i++) {
                    for (int w = 0; w < world; w++) loader_next(&ref, B, w == rank ? idx : skip);
                    assert_int_equal(data_batch(&ds, idx, B, L, inp, tgt, tm, tk), 0);
                    PrefetchBatch *b;
                    double waited = -1.0;
                    assert_int_equal(prefetch_next(pf, &b, &waited), 0);
                    assert_true(waited >= 0.0);
                    assert_memory_equal(b->idx, idx, sizeof idx);
                    assert_memory_equal(b->inputs, inp, sizeof inp);
                    assert_memory_equal(b->targets, tgt, sizeof tgt);
                    assert_memory_equal(b->tmem, tm, S * D * sizeof(float));
                    assert_memory_equal(b->tmask, tk, S);
                    assert_int_equal(b->epoch, ref.epoch);
                    assert_int_equal(b->pos, ref.pos);
                    /* evaluation reads while the thread runs */
                    if (i % 7 == 0) assert_int_equal(prefetch_data_batch(pf, idx, B, L, inp, tgt, tm, tk), 0);
                    prefetch_release(pf, b);
                }
                /* stop while the producer is blocked on a full ring */
                usleep(2000);
                prefetch_stop(pf);
                assert_int_equal(allocs, depth * 5); /* idx, inputs, targets, tmem, tmask per slot */
                assert_int_equal(g_live, 0);
                free(tm);
                free(tk);
                loader_free(&ref);
                loader_free(&ld);
            }
    data_close(&ds);
}

static void test_refusals(void **state) {
    (void)state;
    DataSet ds;
    open_data(&ds);
    Loader ld;
    assert_int_equal(loader_init(&ld, 0, ds.n_seq, 1, 1), 0);
    Prefetcher *pf = (Prefetcher *)&ld;
    assert_int_equal(prefetch_start(&pf, &ds, &ld, 2, L, 1, 0, 1, 1, 1, NULL), DFM_EARG); /* depth < 2 */
    assert_int_equal(prefetch_start(&pf, &ds, &ld, 2, L, 1, 0, 1, 2, 0, NULL), DFM_EARG); /* no thread */
    assert_null(pf);
    prefetch_stop(NULL); /* a no-op */
    /* without targets: no target buffers, batches carry tokens only */
    assert_int_equal(prefetch_start(&pf, &ds, &ld, 2, L, 0, 0, 1, 2, 2, NULL), 0);
    PrefetchBatch *b;
    assert_int_equal(prefetch_next(pf, &b, NULL), 0);
    assert_null(b->tmem);
    assert_null(b->tmask);
    prefetch_release(pf, b);
    prefetch_stop(pf);
    loader_free(&ld);
    data_close(&ds);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_batches_as_the_synchronous_loop),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
