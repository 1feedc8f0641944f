/* bench_targets.c — target shards: encode throughput, the shard writer against a plain sequential write
 * of the same bytes, and the C reader's stream throughput. Run by bench/retrieval/bench_targets.sh.
 *
 *   bench_targets write DIR N K D        encode N synthetic records (fp16, zstd 3), then time both writes
 *   bench_targets read RUN [prefetch]    stream a run's target shards with the C reader
 *
 * Built by `make bench-programs` (build/bench/bench_targets). */
#include "common/error.h"
#include "common/log.h"
#include "common/fsutil.h"
#include "shard/target_build.h"
#include "shard/target_reader.h"
#include "shard/target_writer.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static void die(int rc) { fprintf(stderr, "bench: %s\n", dfm_last_error()); exit(rc ? 1 : 0); }
int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "read")) {
        dfm_target_open_opts o = {.prefetch = argc > 3 ? atoi(argv[3]) : 0};
        dfm_target_reader *r; int rc;
        double t0 = dfm_now();
        if ((rc = dfm_target_reader_open(argv[2], &o, &r))) die(rc);
        double t1 = dfm_now();
        const dfm_target_info *inf = dfm_target_reader_info(r);
        int64_t ids[64]; float sc[64]; float *emb = malloc(sizeof(float) * inf->k * inf->d);
        dfm_trec t = {.ids = ids, .scores = sc, .emb = emb};
        uint64_t n = 0; double sum = 0;
        while ((rc = dfm_target_reader_next(r, &t)) == DFM_OK) { n++; sum += emb[0]; }
        if (rc != DFM_TARGET_END) die(rc);
        double t2 = dfm_now();
        double dec = (double)n * inf->k * (inf->d * 4.0 + 12.0);
        printf("read %llu records: open %.3fs, stream %.3fs = %.0f records/s, %.3f GB/s decoded fp32 (prefetch %d) [%g]\n",
               (unsigned long long)n, t1 - t0, t2 - t1, n / (t2 - t1), dec / (t2 - t1) / 1e9, o.prefetch, sum);
        free(emb); dfm_target_reader_close(r); return 0;
    }
    if (argc < 6) { fprintf(stderr, "usage: bench write DIR N K D | bench read RUN [prefetch]\n"); return 2; }
    const char *dir = argv[2]; uint64_t N = strtoull(argv[3], 0, 10); uint32_t K = atoi(argv[4]), D = atoi(argv[5]);
    dfm_target_synth syn = {.n_chunks = N, .k = K, .d = D, .seq_chunks = 32, .seed = 1};
    dfm_target_source src; dfm_target_synth_source(&syn, 0, 1, &src);
    dfm_trec_params p = {.k = K, .d = D, .dtype = DFM_DTYPE_FP16, .shuffle = 0, .level = 3}; /* the fp16 default */
    dfm_trec_codec *c; int rc;
    if ((rc = dfm_trec_codec_create(&p, &c))) die(rc);
    size_t cap = dfm_trec_max_bytes(K, D, p.dtype, 0);
    uint8_t *all = malloc(cap * N); size_t *off = malloc(sizeof(size_t) * (N + 1)); uint64_t *masks = malloc(8 * N);
    int64_t *ids = malloc(8 * K); float *sc = malloc(4 * K), *emb = malloc(4 * (size_t)K * D); uint8_t seq;
    uint64_t u[1]; off[0] = 0;
    double te0 = dfm_now();
    for (uint64_t q = 0; q < N; q++) {
        src.neighbors(src.ctx, q, 1, ids, sc, &masks[q], &seq);
        for (uint32_t r = 0; r < K; r++) if ((masks[q] >> r) & 1) { u[0] = (uint64_t)ids[r]; src.rows(src.ctx, u, 1, emb + (size_t)r * D); }
        dfm_trec t = {.chunk_id = q, .flags = seq ? DFM_TREC_F_SEQ_START : 0, .mask = masks[q], .ids = ids, .scores = sc, .emb = emb};
        size_t n; if ((rc = dfm_trec_encode(c, &t, all + off[q], cap, &n))) die(rc);
        off[q + 1] = off[q] + n; if (seq) masks[q] = 0;
    }
    double te = dfm_now() - te0;
    double bytes = (double)off[N];
    /* interleaved repetitions (the disk is shared): a plain sequential write of the same bytes to the
     * same folder + fsync, then the shard writer (LMDB batches, final sync, shard.json, rename) */
    enum { REPS = 5 };
    double tp[REPS], tw[REPS];
    char *plain = dfm_path_join(dir, "plain.bin");
    dfm_target_writer_config wc = {.run_dir = dir, .shard = 0, .n_shards = 1, .n_chunks_total = N, .rec = p, .fingerprint = "0123456789abcdef",
                                   .batch_records = getenv("BATCH") ? (uint32_t)atoi(getenv("BATCH")) : 0};
    dfm_target_shard_meta m;
    for (int rep = 0; rep < REPS; rep++) {
        double t0 = dfm_now();
        int fd = open(plain, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        for (size_t at = 0; at < off[N];) { size_t n = off[N] - at > (1u << 20) ? (1u << 20) : off[N] - at; if (write(fd, all + at, n) != (ssize_t)n) die(1); at += n; }
        fsync(fd); close(fd);
        tp[rep] = dfm_now() - t0;
        unlink(plain);
        dfm_target_writer *w;
        t0 = dfm_now();
        if ((rc = dfm_target_writer_open(&wc, &w))) die(rc);
        for (uint64_t q = 0; q < N; q++) if ((rc = dfm_target_writer_put(w, q, all + off[q], off[q + 1] - off[q], masks[q]))) die(rc);
        if ((rc = dfm_target_writer_finish(w, &m))) die(rc);
        tw[rep] = dfm_now() - t0;
        char cmd[4200]; snprintf(cmd, sizeof cmd, "rm -rf %s/targets", dir); if (system(cmd)) die(1);
    }
    for (int i = 0; i < REPS; i++) for (int j = i + 1; j < REPS; j++) { if (tp[j] < tp[i]) { double x = tp[i]; tp[i] = tp[j]; tp[j] = x; } if (tw[j] < tw[i]) { double x = tw[i]; tw[i] = tw[j]; tw[j] = x; } }
    printf("encode %llu records (K %u, d %u, fp16, zstd 3, 1 thread): %.2fs = %.0f records/s, %.1f MB/s of raw payload\n",
           (unsigned long long)N, K, D, te, N / te, (double)m.raw_bytes / te / 1e6);
    printf("write %.1f MB of records, median of %d interleaved runs (best): plain write+fsync %.3fs = %.0f MB/s (%.0f); shard writer %.3fs = %.0f MB/s (%.0f); writer/plain = %.0f%% (best %.0f%%); data.mdb %.1f MB = %.2fx the record bytes\n",
           bytes / 1e6, REPS, tp[REPS / 2], bytes / tp[REPS / 2] / 1e6, bytes / tp[0] / 1e6, tw[REPS / 2], bytes / tw[REPS / 2] / 1e6, bytes / tw[0] / 1e6,
           100.0 * tp[REPS / 2] / tw[REPS / 2], 100.0 * tp[0] / tw[0], m.data_bytes / 1e6, m.data_bytes / bytes);
    free(all); free(off); free(masks); free(ids); free(sc); free(emb); free(plain); dfm_trec_codec_free(c);
    return 0;
}
