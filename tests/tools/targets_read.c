/* targets_read — one reader process for the many-readers test (tests/py/pkg/test_many_readers.py).
 *
 *   targets_read RUN READERS [BARRIER_DIR N] [SLOW]
 *
 * Opens READERS target readers of RUN at once (shard/target_reader.h; each as a thread of dfm-train's loader
 * or of dfm.Batches would), and, with BARRIER_DIR, creates BARRIER_DIR/ready.PID and waits (up to 120 s)
 * until N such files exist, so that every process of the test holds its readers open at the same moment.
 * Then each reader reads every record (with SLOW, 5 ms per record: a reader to be killed mid-read) and the
 * program prints one line: "digest HEX" (XXH3-64 over every record's chunk id, mask, ids and embeddings,
 * the same for every reader, or it fails). Exit status 0, or 1 with dfm's message. Built by `make tools`. */
#include "common/error.h"
#include "common/fsutil.h"
#include "shard/target_reader.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

static int count_ready(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (!strncmp(e->d_name, "ready.", 6)) n++;
    if (d) closedir(d);
    return n;
}

static int read_all(dfm_target_reader *r, int slow, uint64_t *digest) {
    const dfm_target_info *inf = dfm_target_reader_info(r);
    int64_t *ids = malloc(inf->k * sizeof *ids);
    float *scores = malloc(inf->k * sizeof *scores), *emb = malloc((size_t)inf->k * inf->d * sizeof *emb);
    XXH3_state_t *st = XXH3_createState();
    int rc = ids && scores && emb && st ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory");
    if (!rc) XXH3_64bits_reset(st);
    for (uint64_t c = 0; c < inf->n_chunks && !rc; c++) {
        dfm_trec t = {.ids = ids, .scores = scores, .emb = emb};
        rc = dfm_target_reader_get(r, c, &t);
        if (rc) break;
        XXH3_64bits_update(st, &t.chunk_id, sizeof t.chunk_id);
        XXH3_64bits_update(st, &t.mask, sizeof t.mask);
        XXH3_64bits_update(st, ids, inf->k * sizeof *ids);
        XXH3_64bits_update(st, emb, (size_t)inf->k * inf->d * sizeof *emb);
        if (slow) nanosleep(&(struct timespec){0, 5000000L}, NULL);
    }
    if (!rc) *digest = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    free(ids), free(scores), free(emb);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: targets_read RUN READERS [BARRIER_DIR N] [SLOW]\n");
        return 2;
    }
    int n = atoi(argv[2]), want = argc > 4 ? atoi(argv[4]) : 0, slow = argc > 5 && atoi(argv[5]);
    dfm_target_reader **rs = calloc(n > 0 ? n : 1, sizeof *rs);
    int rc = rs && n > 0 ? DFM_OK : DFM_FAIL(DFM_EARG, "READERS must be positive");
    for (int i = 0; i < n && !rc; i++) rc = dfm_target_reader_open(argv[1], &(dfm_target_open_opts){.prefetch = -1}, &rs[i]);
    if (!rc && argc > 4) {
        char name[64];
        snprintf(name, sizeof name, "ready.%ld", (long)getpid());
        char *p = dfm_path_join(argv[3], name);
        FILE *f = p ? fopen(p, "w") : NULL;
        if (f) fclose(f);
        free(p);
        for (int waited = 0; count_ready(argv[3]) < want && waited < 12000; waited++) nanosleep(&(struct timespec){0, 10000000L}, NULL);
        if (count_ready(argv[3]) < want) rc = DFM_FAIL(DFM_ESTATE, "only %d of %d readers came up in 120 s", count_ready(argv[3]), want);
    }
    uint64_t first = 0;
    for (int i = 0; i < n && !rc; i++) {
        uint64_t dg = 0;
        rc = read_all(rs[i], slow, &dg);
        if (!rc && i && dg != first) rc = DFM_FAIL(DFM_EINTERNAL, "reader %d read other records than reader 0", i);
        if (!i) first = dg;
    }
    for (int i = 0; rs && i < n; i++) dfm_target_reader_close(rs[i]);
    free(rs);
    if (rc) {
        fprintf(stderr, "targets_read: %s\n", dfm_last_error());
        return 1;
    }
    printf("digest %016llx\n", (unsigned long long)first);
    return 0;
}
