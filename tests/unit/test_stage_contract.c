/* Unit tests of the stage contract (common/manifest.h: dfm_stage_begin) and the run lock
 * (common/runlock.h): every row of the contract's table, the later stages removed from the manifest
 * and then the disk, temporaries of dead writers removed, a complete stage with a missing output
 * resumed, a second writer refused naming the holder, a stale holder line taken over. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "common/manifest.h"
#include "common/runlock.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char run[256];

static int setup(void **state) {
    snprintf(run, sizeof run, "/tmp/dfm-test-stage-XXXXXX");
    assert_non_null(mkdtemp(run));
    return 0;
}
static int teardown(void **state) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", run);
    return system(cmd);
}

static void touch(const char *rel) {
    char *p = dfm_path_join(run, rel);
    assert_int_equal(dfm_write_file_atomic(p, "x", 1), DFM_OK);
    free(p);
}
static int there(const char *rel) {
    char *p = dfm_path_join(run, rel);
    int e = dfm_path_exists(p);
    free(p);
    return e;
}
static const char *state_of(json_t *m, const char *stage) {
    return json_string_value(json_object_get(dfm_manifest_stage(m, stage), "state"));
}
/* a complete stage with config {"k": k} and one output file */
static void complete(json_t *m, const char *stage, int k, const char *file) {
    dfm_stage_spec s = {stage, json_pack("{s:i}", "k", k), NULL, 0, 1};
    dfm_stage_action a;
    assert_int_equal(dfm_stage_begin(m, run, &s, &a), DFM_OK);
    touch(file);
    json_t *st = dfm_manifest_stage(m, stage);
    json_object_set_new(st, "state", json_string("complete"));
    json_object_set_new(st, "outputs", json_pack("[{s:s}]", "file", file));
    assert_int_equal(dfm_manifest_save(run, m), DFM_OK);
    json_decref(s.config);
}

static void test_contract_table(void **state) {
    json_t *m;
    assert_int_equal(dfm_manifest_load(run, 1, &m), DFM_OK);
    complete(m, "chunk", 1, "chunk/c.bin");
    complete(m, "encode", 1, "encode/e.bin");
    complete(m, "index", 1, "index/i.faiss");
    complete(m, "retrieve", 1, "retrieve/n.bin");
    json_t *k1 = json_pack("{s:i}", "k", 1), *k2 = json_pack("{s:i}", "k", 2);
    dfm_stage_action a;
    /* complete, same: skipped, nothing touched */
    dfm_stage_spec s = {"index", k1, NULL, 0, 1};
    assert_int_equal(dfm_stage_begin(m, run, &s, &a), DFM_OK);
    assert_int_equal(a, DFM_STAGE_SKIP);
    assert_string_equal(state_of(m, "retrieve"), "complete");
    /* other config: refused, naming the option */
    s.config = k2;
    assert_int_equal(dfm_stage_begin(m, run, &s, &a), DFM_EMISMATCH);
    assert_non_null(strstr(dfm_last_error(), "'k' was 1, now 2"));
    assert_non_null(strstr(dfm_last_error(), "--force"));
    assert_true(there("retrieve/n.bin"));
    /* --force: fresh; later stages gone from the manifest and the disk; own folder emptied */
    s.force = 1;
    assert_int_equal(dfm_stage_begin(m, run, &s, &a), DFM_OK);
    assert_int_equal(a, DFM_STAGE_FRESH);
    assert_null(dfm_manifest_stage(m, "retrieve"));
    assert_false(there("retrieve"));
    assert_false(there("index/i.faiss"));
    assert_true(there("index"));
    assert_true(there("encode/e.bin"));
    assert_string_equal(state_of(m, "index"), "running");
    json_t *saved;
    assert_int_equal(dfm_manifest_load(run, 0, &saved), DFM_OK);
    assert_null(dfm_manifest_stage(saved, "retrieve"));
    assert_string_equal(state_of(saved, "index"), "running");
    json_decref(saved);
    /* running, same: resumed, files kept; temporaries of dead writers removed */
    touch("index/i0.faiss");
    touch("index/i1.faiss.tmp.99999999");
    touch("manifest.json.tmp.99999998");
    touch("index/keep.tmp.x");
    s.force = 0;
    assert_int_equal(dfm_stage_begin(m, run, &s, &a), DFM_OK);
    assert_int_equal(a, DFM_STAGE_RESUME);
    assert_true(there("index/i0.faiss"));
    assert_false(there("index/i1.faiss.tmp.99999999"));
    assert_false(there("manifest.json.tmp.99999998"));
    assert_true(there("index/keep.tmp.x"));
    /* complete but an output missing: resumed, not skipped */
    s.config = k1;
    json_decref(m);
    assert_int_equal(dfm_manifest_load(run, 0, &m), DFM_OK);
    s.stage = "encode";
    char *e = dfm_path_join(run, "encode/e.bin");
    assert_int_equal(remove(e), 0);
    free(e);
    assert_int_equal(dfm_stage_begin(m, run, &s, &a), DFM_OK);
    assert_int_equal(a, DFM_STAGE_RESUME);
    assert_null(dfm_manifest_stage(m, "index"));
    assert_false(there("index"));
    /* the hint names the command of a stage, not its manifest key */
    assert_int_equal(dfm_manifest_require_complete(m, "targets", run), DFM_ESTATE);
    assert_non_null(strstr(dfm_last_error(), "'dfm write-targets'"));
    json_decref(k1);
    json_decref(k2);
    json_decref(m);
}

static void test_run_lock(void **state) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/locked", run);
    int ready[2], go[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(go), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) { /* another writer: takes the lock, waits, exits */
        char c = 0;
        int rc = dfm_runlock_take(dir);
        if (write(ready[1], &c, 1) != 1) _exit(2);
        if (read(go[0], &c, 1) != 1) _exit(3);
        _exit(rc ? 1 : 0);
    }
    char c;
    assert_int_equal(read(ready[0], &c, 1), 1);
    assert_int_equal(dfm_runlock_take(dir), DFM_ESTATE);
    char pid[32];
    snprintf(pid, sizeof pid, "pid %d ", (int)child);
    assert_non_null(strstr(dfm_last_error(), "being written by another process: host "));
    assert_non_null(strstr(dfm_last_error(), pid));
    assert_non_null(strstr(dfm_last_error(), " since "));
    assert_false(dfm_runlock_held(dir));
    /* the holder dies without clearing its line (killed): the lock is free, the line stale */
    kill(child, SIGKILL);
    int st;
    assert_int_equal(waitpid(child, &st, 0), child);
    assert_int_equal(dfm_runlock_take(dir), DFM_OK);
    assert_true(dfm_runlock_held(dir));
    assert_int_equal(dfm_runlock_take(dir), DFM_OK); /* again in the same process: a no-op */
    char *lock = dfm_path_join(dir, ".lock"), *text = NULL;
    size_t n;
    assert_int_equal(dfm_read_file(lock, &text, &n), DFM_OK);
    snprintf(pid, sizeof pid, "pid %d ", (int)getpid());
    assert_non_null(strstr(text, pid));
    free(text);
    free(lock);
}

/* generations: a stage gets a new one each time it runs, kept when it completes; readers see "being
 * rebuilt by" the writer while it runs */
static void test_generations(void **state) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/gen", run);
    char *saved = strdup(run);
    snprintf(run, sizeof run, "%s", dir); /* complete() works on `run` */
    assert_int_equal(dfm_mkdir_p(run), DFM_OK);
    json_t *m = NULL;
    assert_int_equal(dfm_manifest_load(run, 1, &m), DFM_OK);
    complete(m, "chunk", 1, "chunk/a.bin");
    char g1[17], g2[17];
    snprintf(g1, sizeof g1, "%s", dfm_manifest_generation(m, "chunk"));
    assert_int_equal(strlen(g1), 16);
    char g[17];
    assert_int_equal(dfm_manifest_read_generation(run, "chunk", g), DFM_OK);
    assert_string_equal(g, g1);
    /* the same stage again (--force): another generation, also when the stage object is replaced */
    dfm_stage_spec s = {"chunk", json_pack("{s:i}", "k", 1), NULL, 1, 1};
    dfm_stage_action a;
    assert_int_equal(dfm_stage_begin(m, run, &s, &a), DFM_OK);
    assert_int_equal(dfm_manifest_read_generation(run, "chunk", g), DFM_ESTATE); /* running: a reader is refused */
    assert_non_null(strstr(dfm_last_error(), "is being rebuilt by host "));
    assert_int_equal(dfm_manifest_set_stage(m, "chunk", json_pack("{s:s}", "state", "complete")), DFM_OK);
    assert_int_equal(dfm_manifest_save(run, m), DFM_OK);
    snprintf(g2, sizeof g2, "%s", dfm_manifest_generation(m, "chunk"));
    assert_int_equal(strlen(g2), 16);
    assert_string_not_equal(g1, g2);
    assert_int_equal(dfm_manifest_read_generation(run, "chunk", g), DFM_OK);
    assert_string_equal(g, g2);
    /* a stage of an older dfm has none, and saving does not invent one */
    json_object_del(dfm_manifest_stage(m, "chunk"), "generation");
    assert_int_equal(dfm_manifest_save(run, m), DFM_OK);
    assert_int_equal(dfm_manifest_read_generation(run, "chunk", g), DFM_OK);
    assert_string_equal(g, "");
    json_decref(s.config);
    json_decref(m);
    snprintf(run, sizeof run, "%s", saved);
    free(saved);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_contract_table),
        cmocka_unit_test(test_run_lock),
        cmocka_unit_test(test_generations),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
