#!/usr/bin/env bash
# bench_targets.sh — target shards: write throughput vs a plain sequential write of the same bytes,
# C and Python reader stream throughput, compression ratio and bytes per chunk per dtype / shuffle /
# store option. Prints a Markdown table block for BENCHMARKS.md.
#   bash bench/bench_targets.sh                  synthetic data (N=8000, K=16, d=384)
#   REAL_RUN=runs/demo bash bench/bench_targets.sh   also ratios on a real run's neighbours/embeddings
#   N=.. K=.. D=.. DIR=/path/on/the/disk/to/measure
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DFM=${DFM:-$ROOT/build/dfm}
PY=${DFM_PYTHON:-/var/cache/dfm/venv/bin/python}
N=${N:-8000}; K=${K:-16}; D=${D:-384}
DIR=${DIR:-$(mktemp -d /tmp/dfm-bench-targets-XXXXXX)}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DFM_LOG_LEVEL=warn
trap 'rm -rf "$DIR"' EXIT
mkdir -p "$DIR"
[ -x "$DFM" ] && [ -f "$ROOT/build/libdfm.a" ] || { echo "build first: make build/dfm build/libdfm.a"; exit 1; }

# ---- a small C driver over libdfm: pre-encode records, then time the shard writer against write()+fsync,
#      and stream a run with the C reader
cat >"$DIR/bench.c" <<'CEOF'
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
CEOF
# shellcheck disable=SC2046
mpicc -std=c11 -O2 -D_GNU_SOURCE -I"$ROOT" -I"$ROOT/pipeline" $(pkg-config --cflags jansson libzstd lmdb libxxhash) -o "$DIR/bench" \
  "$DIR/bench.c" "$ROOT/build/libdfm.a" $(pkg-config --libs jansson libpcre2-8 libutf8proc libzstd lmdb libxxhash openblas) \
  ${FAISS_C_LIB:-/var/cache/dfm/faiss_c-1.7.3/lib/libfaiss_c.a} /usr/lib/x86_64-linux-gnu/libfaiss.a -fopenmp -lstdc++ -lm -pthread

echo "## date $(date -u +%F) host $(hostname) cpus $(nproc) disk of $DIR: $(df -h "$DIR" | tail -1 | awk '{print $1" "$2}')"
echo "### write throughput (synthetic, N=$N, K=$K, d=$D, fp16 without shuffle (its default), zstd 3)"
"$DIR/bench" write "$DIR" "$N" "$K" "$D"

ratios() {  # label run-args...
  local label=$1; shift
  echo "### bytes per chunk and compression ($label)"
  echo "| dtype | store | shuffle | record bytes/chunk | raw payload bytes/chunk | stored/raw | disk bytes/chunk (data.mdb + table) | write-targets s |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
  for dt in fp32 fp16 bf16; do
    for st in embeddings ids; do
      for sh in yes no; do
        [ $st = ids ] && [ $sh = no ] && continue
        local out=$DIR/r-$dt-$st-$sh
        "$@" --dtype $dt --store $st --shuffle $sh "$out" >/dev/null
        "$PY" - "$out" "$dt" "$st" "$sh" <<'PYEOF'
import json, sys
run, dt, st, sh = sys.argv[1:]
t = json.load(open(run + "/manifest.json"))["stages"]["targets"]
c = t["counts"]; n = c["records"]
print(f"| {dt} | {st} | {sh if st == 'embeddings' else '-'} | {c['stored_bytes']/n:.0f} | {c['raw_bytes']/n:.0f} | "
      f"{c['stored_bytes']/c['raw_bytes']:.3f} | {(c['lmdb_bytes']+c['table_bytes'])/n:.0f} | {t['timings']['total_s']:.2f} |")
PYEOF
      done
    done
  done
}
synth() { local out=${!#}; "$DFM" write-targets "$out" --synthetic "$N" --k "$K" --d "$D" --seq-chunks 32 --target-shards 2 "${@:1:$#-1}"; }
ratios "synthetic unit vectors, N=$N, K=$K, d=$D" synth

echo "### read throughput (synthetic fp16 embeddings run above, no shuffle = the fp16 default)"
R=$DIR/r-fp16-embeddings-no
"$DIR/bench" read "$R" 0
"$DIR/bench" read "$R" -1
"$DIR/bench" read "$DIR/r-fp16-ids-yes" 0
"$PY" - "$ROOT/python" "$R" <<'PYEOF'
import sys, time
sys.path.insert(0, sys.argv[1])
import dfm_targets
t0 = time.time(); r = dfm_targets.TargetRun(sys.argv[2]); t1 = time.time(); n = 0
for rec in r.records(): n += 1
t2 = time.time()
print(f"python read {n} records: open {t1-t0:.3f}s, stream {t2-t1:.3f}s = {n/(t2-t1):.0f} records/s, "
      f"{n*r.k*(r.d*4+12)/(t2-t1)/1e9:.3f} GB/s decoded fp32")
PYEOF

if [ -n "${REAL_RUN:-}" ]; then
  real() { local out=${!#}; rm -rf "$out"; mkdir -p "$out"; cp -r "$REAL_RUN"/manifest.json "$REAL_RUN"/chunk "$REAL_RUN"/encode "$REAL_RUN"/retrieve "$out"/ 2>/dev/null;
           "$DFM" write-targets "$out" --target-shards 2 "${@:1:$#-1}"; }
  NREAL=$("$PY" -c "import json,sys;print(json.load(open(sys.argv[1]+'/manifest.json'))['stages']['chunk']['counts']['chunks'])" "$REAL_RUN")
  ratios "real run $REAL_RUN: all-MiniLM-L6-v2 embeddings, N=$NREAL" real
fi
