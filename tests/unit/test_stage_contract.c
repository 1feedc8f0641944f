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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_contract_table),
        cmocka_unit_test(test_run_lock),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
