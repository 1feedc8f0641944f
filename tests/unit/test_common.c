/* Unit tests of the shared conventions: errors, options/config, atomic files, hashing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "common/mpiutil.h"
#include "common/opts.h"
#include "common/stop.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[256];

static int setup(void **state) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dfm-test-common-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    return 0;
}
static int teardown(void **state) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd);
}

/* the GPU of a rank (encoder/encode.c, trainer/run/engine.c): node-local rank mod the GPUs it sees */
static void test_gpu_for_rank(void **state) {
    /* 2 nodes x 2 ranks, each rank seeing its node's 2 GPUs (mpirun; Slurm --gres=gpu:2): GPUs 0, 1 per node */
    const int local[4] = {0, 1, 0, 1}, want[4] = {0, 1, 0, 1};
    for (int r = 0; r < 4; r++) assert_int_equal(dfm_gpu_for_rank(local[r], 2, -1), want[r]);
    /* 4 ranks on one node with 2 GPUs: two ranks per GPU, alternating */
    for (int r = 0; r < 4; r++) assert_int_equal(dfm_gpu_for_rank(r, 2, -1), r % 2);
    /* --gpus-per-task 1: every rank sees one GPU, its own, as index 0 */
    for (int r = 0; r < 8; r++) assert_int_equal(dfm_gpu_for_rank(r, 1, -1), 0);
    /* 8 GPUs, 3 ranks: the first three */
    for (int r = 0; r < 3; r++) assert_int_equal(dfm_gpu_for_rank(r, 8, -1), r);
    /* no GPU visible: the CPU, whatever the rank */
    assert_int_equal(dfm_gpu_for_rank(0, 0, -1), -1);
    assert_int_equal(dfm_gpu_for_rank(5, 0, -1), -1);
    /* a requested GPU wins (the caller checks it exists); a failed node split (rank 0) still works */
    assert_int_equal(dfm_gpu_for_rank(3, 4, 2), 2);
    assert_int_equal(dfm_gpu_for_rank(3, 4, 0), 0);
    assert_int_equal(dfm_gpu_for_rank(-1, 4, -1), 0);
}

static void test_error_message_has_place(void **state) {
    int rc = DFM_FAIL(DFM_EFORMAT, "bad line %d in %s", 7, "x.jsonl");
    assert_int_equal(rc, DFM_EFORMAT);
    assert_int_equal(dfm_last_error_code(), DFM_EFORMAT);
    assert_non_null(strstr(dfm_last_error(), "bad line 7 in x.jsonl"));
    assert_non_null(strstr(dfm_last_error(), "test_common.c:"));
    dfm_error_prefix("while chunking");
    assert_memory_equal(dfm_last_error(), "while chunking: ", 16);
    assert_string_equal(dfm_strerror(DFM_ECHECKSUM), "checksum mismatch");
    assert_string_equal(dfm_strerror(12345), "unknown error code");
    dfm_error_clear();
    assert_string_equal(dfm_last_error(), "");
}

static void test_opts_defaults_config_cmdline(void **state) {
    char *name = NULL, *path = NULL;
    int64_t n = 0;
    double x = 0;
    int flag = 0;
    dfm_opt opts[] = {
        {"name", DFM_OPT_STR, &name, "abc", "S", "a name", 0},
        {"count", DFM_OPT_INT, &n, "32", "N", "a count", 0},
        {"ratio", DFM_OPT_DOUBLE, &x, "0.5", "R", "a ratio", 0},
        {"fast", DFM_OPT_FLAG, &flag, NULL, NULL, "go fast", 0},
        {"out", DFM_OPT_STR, &path, NULL, "DIR", "where", 1},
        {0},
    };
    char *cfg = dfm_path_join(tmpdir, "c.json");
    FILE *f = fopen(cfg, "w");
    fprintf(f, "{\"count\": 64, \"other-stage-key\": 1, \"chunk\": {\"ratio\": 0.25, \"fast\": true}}");
    fclose(f);
    char *argv[] = {"chunk", "--config", cfg, "--count", "2k", "in1", "in2", NULL};
    char **pos = NULL;
    int npos = 0;
    json_t *eff = NULL;
    assert_int_equal(dfm_opts_parse("chunk", NULL, NULL, opts, 7, argv, &pos, &npos, &eff), 0);
    assert_string_equal(name, "abc");
    assert_int_equal(n, 2000); /* command line wins over config */
    assert_true(x == 0.25);
    assert_int_equal(flag, 1);
    assert_int_equal(npos, 2);
    assert_string_equal(pos[1], "in2");
    assert_int_equal(json_integer_value(json_object_get(eff, "count")), 2000);
    assert_null(json_object_get(eff, "out")); /* no_manifest */
    json_decref(eff);
    free(pos);
    dfm_opts_free(opts);

    /* bad values and typos are errors that name the flag */
    char *bad[] = {"chunk", "--count", "12x", NULL};
    assert_int_equal(dfm_opts_parse("chunk", NULL, NULL, opts, 3, bad, NULL, NULL, NULL), DFM_EARG);
    assert_non_null(strstr(dfm_last_error(), "--count"));
    f = fopen(cfg, "w");
    fprintf(f, "{\"chunk\": {\"cuont\": 3}}");
    fclose(f);
    char *typo[] = {"chunk", "--config", cfg, NULL};
    assert_int_equal(dfm_opts_parse("chunk", NULL, NULL, opts, 3, typo, NULL, NULL, NULL), DFM_EARG);
    assert_non_null(strstr(dfm_last_error(), "cuont"));
    char *unknown[] = {"chunk", "--nope", NULL};
    assert_int_equal(dfm_opts_parse("chunk", NULL, NULL, opts, 2, unknown, NULL, NULL, NULL), DFM_EARG);
    /* a flags-only command (no pos/npos) refuses a stray word instead of ignoring it */
    char *stray[] = {"chunk", "--count", "3", "leftover", NULL};
    assert_int_equal(dfm_opts_parse("chunk", NULL, NULL, opts, 4, stray, NULL, NULL, NULL), DFM_EARG);
    assert_non_null(strstr(dfm_last_error(), "'leftover'"));
    dfm_opts_free(opts);
    free(cfg);
}

/* Parse argv (NULL-terminated) with opts; the return code. */
static int parse_argv(dfm_opt *opts, char **argv) {
    int argc = 0;
    while (argv[argc]) argc++;
    int rc = dfm_opts_parse("stage", NULL, NULL, opts, argc, argv, NULL, NULL, NULL);
    dfm_opts_free(opts);
    return rc;
}

/* A value out of the declared limits is DFM_EARG naming flag, value and range, from the command line
 * and from a config file; the bounds themselves and values inside pass. */
static void test_opts_limits(void **state) {
    char *dev = NULL;
    int64_t k = 0, blk = 0;
    double r = 0;
    dfm_opt opts[] = {
        {"k", DFM_OPT_INT, &k, "16", "K", "neighbours", 0, .min = "1", .max = "64"},
        {"block", DFM_OPT_INT, &blk, "4k", "N", "block", 0, .min = "1k"},
        {"recall", DFM_OPT_DOUBLE, &r, "0", "R", "recall", 0, .min = "0", .max = "1"},
        {"device", DFM_OPT_STR, &dev, "cpu", "DEV", "where", 0, .choices = "cpu|cuda|auto"},
        {0},
    };
    const char *ok[][2] = {{"--k", "1"}, {"--k", "64"}, {"--block", "1000"}, {"--recall", "1"}, {"--recall", "0"},
                           {"--device", "cuda"}, {"--device", "auto"}, {"--device", "cpu"}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        char *argv[] = {"stage", (char *)ok[i][0], (char *)ok[i][1], NULL};
        assert_int_equal(parse_argv(opts, argv), DFM_OK);
    }
    const char *bad[][3] = {{"--k", "0", "1 to 64"},         {"--k", "65", "1 to 64"},
                            {"--block", "999", "at least 1k"}, {"--recall", "1.5", "0 to 1"},
                            {"--recall", "-0.1", "0 to 1"},    {"--recall", "nan", "0 to 1"},
                            {"--device", "gpu", "one of cpu|cuda|auto"}, {"--device", "cu", "one of cpu|cuda|auto"},
                            {"--device", "cudaa", "one of"},  {"--device", "", "one of"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *argv[] = {"stage", (char *)bad[i][0], (char *)bad[i][1], NULL};
        assert_int_equal(parse_argv(opts, argv), DFM_EARG);
        char want[64];
        snprintf(want, sizeof want, "%s %s (command line)", bad[i][0], bad[i][1]);
        assert_non_null(strstr(dfm_last_error(), want));
        assert_non_null(strstr(dfm_last_error(), bad[i][2]));
    }
    /* a config file's value is checked too, and named by the file */
    char *cfg = dfm_path_join(tmpdir, "limits.json");
    FILE *f = fopen(cfg, "w");
    fprintf(f, "{\"stage\": {\"k\": 100}}");
    fclose(f);
    char *argv[] = {"stage", "--config", cfg, NULL};
    assert_int_equal(parse_argv(opts, argv), DFM_EARG);
    assert_non_null(strstr(dfm_last_error(), "--k 100"));
    assert_non_null(strstr(dfm_last_error(), cfg));
    free(cfg);
    /* a default outside its own limits, or limits on the wrong type, are table errors */
    int64_t z = 0;
    char *s = NULL;
    dfm_opt bad_default[] = {{"z", DFM_OPT_INT, &z, "0", "N", "z", 0, .min = "1"}, {0}};
    char *none[] = {"stage", NULL};
    assert_int_equal(parse_argv(bad_default, none), DFM_EARG);
    dfm_opt bad_type[] = {{"s", DFM_OPT_STR, &s, NULL, "S", "s", 0, .min = "1"}, {0}};
    assert_int_equal(parse_argv(bad_type, none), DFM_EINTERNAL);
    dfm_opt bad_bound[] = {{"z", DFM_OPT_INT, &z, NULL, "N", "z", 0, .max = "ten"}, {0}};
    assert_int_equal(parse_argv(bad_bound, none), DFM_EINTERNAL);
    dfm_opt bad_choices[] = {{"z", DFM_OPT_INT, &z, NULL, "N", "z", 0, .choices = "1|2"}, {0}};
    assert_int_equal(parse_argv(bad_choices, none), DFM_EINTERNAL);
}

/* --help shows the declared limits next to the default. */
static void test_opts_help_shows_limits(void **state) {
    char *dev = NULL;
    int64_t k = 0;
    dfm_opt opts[] = {
        {"k", DFM_OPT_INT, &k, "16", "K", "neighbours", 0, .min = "1", .max = "64"},
        {"device", DFM_OPT_STR, &dev, NULL, "DEV", "where", 0, .choices = "cpu|cuda"},
        {0},
    };
    char *out = dfm_path_join(tmpdir, "help.txt");
    fflush(stdout);
    int saved = dup(1);
    assert_non_null(freopen(out, "w", stdout));
    char *argv[] = {"stage", "--help", NULL};
    int rc = dfm_opts_parse("stage", NULL, NULL, opts, 2, argv, NULL, NULL, NULL);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    assert_int_equal(rc, DFM_OPTS_HELP);
    char text[2048] = "";
    FILE *f = fopen(out, "r");
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    free(out);
    assert_non_null(strstr(text, "neighbours (default: 16; 1 to 64)"));
    assert_non_null(strstr(text, "where (one of cpu|cuda)"));
}

static void test_atomic_file_commit_and_abort(void **state) {
    char *p = dfm_path_join(tmpdir, "a.bin");
    dfm_atomic_file f;
    assert_int_equal(dfm_atomic_open(&f, p), 0);
    assert_int_equal(dfm_atomic_write(&f, "hello", 5), 0);
    assert_false(dfm_path_exists(p)); /* not visible before commit */
    assert_int_equal(dfm_atomic_commit(&f), 0);
    char *buf;
    size_t n;
    assert_int_equal(dfm_read_file(p, &buf, &n), 0);
    assert_int_equal(n, 5);
    assert_memory_equal(buf, "hello", 5);
    free(buf);
    char *q = dfm_path_join(tmpdir, "b.bin");
    assert_int_equal(dfm_atomic_open(&f, q), 0);
    assert_int_equal(dfm_atomic_write(&f, "x", 1), 0);
    dfm_atomic_abort(&f);
    assert_false(dfm_path_exists(q));
    assert_int_equal(dfm_read_file(q, &buf, &n), DFM_ENOTFOUND);
    free(p);
    free(q);
}

static void test_file_size_limit_is_nospace(void **state) {
    /* a file-size limit makes writes fail with EFBIG: must surface as DFM_ENOSPACE naming the file */
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 4096;
    setrlimit(RLIMIT_FSIZE, &lim);
    char *p = dfm_path_join(tmpdir, "big.bin");
    char block[1024] = {0};
    dfm_atomic_file f;
    assert_int_equal(dfm_atomic_open(&f, p), 0);
    int rc = 0;
    for (int i = 0; i < 64 && !rc; i++) rc = dfm_atomic_write(&f, block, sizeof block);
    if (!rc) rc = dfm_atomic_commit(&f);
    else dfm_atomic_abort(&f);
    setrlimit(RLIMIT_FSIZE, &old);
    assert_int_equal(rc, DFM_ENOSPACE);
    assert_non_null(strstr(dfm_last_error(), "big.bin"));
    assert_false(dfm_path_exists(p));
    free(p);
}

/* SIGTERM / SIGUSR1 become a request (common/stop.h): the process lives on, the check says which signal,
 * (that dfm_mpi_agree passes a stop on to the other ranks: test_stage_signals, test_train_signals) */
static void test_stop_on_signal(void **state) {
    dfm_stop_install();
    dfm_stop_reset();
    assert_int_equal(dfm_stop_check("before block %d", 3), DFM_OK);
    raise(SIGTERM);
    raise(SIGUSR1); /* a second signal changes nothing: the first is reported */
    assert_int_equal(dfm_stop_signal(), SIGTERM);
    assert_int_equal(dfm_stop_check("before block %d", 3), DFM_ESTOPPED);
    assert_non_null(strstr(dfm_last_error(), "stopped by SIGTERM before block 3"));
    assert_non_null(strstr(dfm_last_error(), "HINT: run the same command again"));
    dfm_stop_reset();
    assert_int_equal(dfm_stop_check("x"), DFM_OK);
    raise(SIGUSR1);
    assert_int_equal(dfm_stop_check("after round %d", 2), DFM_ESTOPPED);
    assert_non_null(strstr(dfm_last_error(), "stopped by SIGUSR1 after round 2"));
    dfm_stop_reset();
}

/* room for n open files: the soft limit is raised up to the hard one; beyond it a refusal saying what to set */
static void test_fd_reserve(void **state) {
    struct rlimit old, lim;
    getrlimit(RLIMIT_NOFILE, &old);
    lim.rlim_cur = 64, lim.rlim_max = old.rlim_max;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &lim), 0);
    assert_int_equal(dfm_fd_reserve(200, "a test", "need less"), DFM_OK);
    struct rlimit now;
    getrlimit(RLIMIT_NOFILE, &now);
    assert_true(now.rlim_cur >= 200);
    lim.rlim_cur = 64, lim.rlim_max = 64; /* (lowering the hard limit cannot be undone without privileges) */
    pid_t child = fork();
    if (child == 0) {
        setrlimit(RLIMIT_NOFILE, &lim);
        int rc = dfm_fd_reserve(200, "a test", "need less");
        _exit(rc == DFM_ERANGE && strstr(dfm_last_error(), "ulimit -n") && strstr(dfm_last_error(), "need less") ? 0 : 1);
    }
    int st = 0;
    assert_int_equal(waitpid(child, &st, 0), child);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    setrlimit(RLIMIT_NOFILE, &old);
}

static void test_hashes(void **state) {
    char *p = dfm_path_join(tmpdir, "h.txt");
    assert_int_equal(dfm_write_file_atomic(p, "abc", 3), 0);
    char h1[33], h2[33];
    assert_int_equal(dfm_file_hash(p, h1), 0);
    assert_int_equal(strlen(h1), 32);
    assert_int_equal(dfm_write_file_atomic(p, "abd", 3), 0);
    assert_int_equal(dfm_file_hash(p, h2), 0);
    assert_string_not_equal(h1, h2);
    assert_true(dfm_checksum64("abc", 3) != dfm_checksum64("abd", 3));
    assert_int_equal(dfm_mkdir_p("/proc/definitely/not"), DFM_EIO);
    free(p);
}

/* Every whole-file reader refuses what is not a regular file at once: a FIFO blocked them forever (an open
 * for reading waits for a writer), a folder or device gave odd errors. alarm: a hang fails the test. */
static void test_readers_refuse_non_regular(void **state) {
    char *fifo = dfm_path_join(tmpdir, "model.fifo");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    alarm(20);
    const char *paths[] = {fifo, tmpdir, "/dev/null"};
    const char *kinds[] = {"(a FIFO)", "(a folder)", "(a character device)"};
    for (int i = 0; i < 3; i++) {
        char *buf = NULL, h[33];
        size_t n;
        const uint8_t *map = NULL;
        int fd = -1;
        assert_int_equal(dfm_read_file(paths[i], &buf, &n), DFM_EARG);
        assert_non_null(strstr(dfm_last_error(), "is not a regular file"));
        assert_non_null(strstr(dfm_last_error(), kinds[i]));
        assert_int_equal(dfm_map_file(paths[i], "HINT: x", &map, &n), DFM_EARG);
        assert_non_null(strstr(dfm_last_error(), paths[i]));
        assert_int_equal(dfm_file_hash(paths[i], h), DFM_EARG);
        assert_int_equal(dfm_open_regular(paths[i], NULL, &fd), DFM_EARG);
        assert_int_equal(fd, -1);
    }
    alarm(0);
    /* a regular file opens, blocking (reads wait for data, not EAGAIN) */
    char *p = dfm_path_join(tmpdir, "r.txt");
    assert_int_equal(dfm_write_file_atomic(p, "abc", 3), 0);
    int fd;
    assert_int_equal(dfm_open_regular(p, NULL, &fd), DFM_OK);
    assert_true(fd >= 0 && !(fcntl(fd, F_GETFL) & O_NONBLOCK));
    close(fd);
    free(p);
    free(fifo);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_readers_refuse_non_regular),
        cmocka_unit_test(test_error_message_has_place),
        cmocka_unit_test(test_opts_defaults_config_cmdline),
        cmocka_unit_test(test_opts_limits),
        cmocka_unit_test(test_opts_help_shows_limits),
        cmocka_unit_test(test_atomic_file_commit_and_abort),
        cmocka_unit_test(test_file_size_limit_is_nospace),
        cmocka_unit_test(test_hashes),
        cmocka_unit_test(test_stop_on_signal),
        cmocka_unit_test(test_fd_reserve),
        cmocka_unit_test(test_gpu_for_rank),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
