/* dump_batches_cmd.c — `dfm-train dump-batches`: write the micro-batches dfm-train's loader hands one rank
 * (trainer/data/prefetch.h over trainer/data/data.h, the code `dfm-train train` runs) to a file, so other loaders
 * (the Python package's dfm.Batches) can be checked against them byte for byte.
 * The file's layout: schemas/batch_dump.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/opts.h"
#include "trainer/cmd/commands.h"
#include "trainer/data/data.h"
#include "trainer/data/prefetch.h"
#include "trainer/data/reading.h"
#include "trainer/run/train_opts.h"

#define DUMP_MAGIC "DFMBTCH1"
#define DUMP_MAX_BYTES (1ull << 30)

typedef struct {
    uint8_t *buf;
    size_t n, cap;
} Bytes;

static int put(Bytes *b, const void *p, size_t n) {
    if (b->n + n > DUMP_MAX_BYTES)
        return DFM_FAIL(DFM_ERANGE, "dump-batches: more than %llu bytes. HINT: fewer --steps or a smaller --batch",
                        (unsigned long long)DUMP_MAX_BYTES);
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 20;
        while (cap < b->n + n) cap *= 2;
        uint8_t *nb = realloc(b->buf, cap);
        if (!nb) return DFM_FAIL(DFM_ENOMEM, "dump-batches: %zu bytes", cap);
        b->buf = nb, b->cap = cap;
    }
    memcpy(b->buf + b->n, p, n);
    b->n += n;
    return DFM_OK;
}

/* One batch's fields into the payload. */
static int put_batch(Bytes *out, uint64_t epoch, uint64_t pos, const size_t *idx, int B, int T, const int *inp,
                     const int *tgt, const uint8_t *tmask, const float *tmem, size_t S, int d) {
    DFM_TRY(put(out, &epoch, 8));
    DFM_TRY(put(out, &pos, 8));
    for (int b = 0; b < B; b++) {
        uint64_t v = idx[b];
        DFM_TRY(put(out, &v, 8));
    }
    DFM_TRY(put(out, inp, (size_t)B * T * sizeof(int)));
    DFM_TRY(put(out, tgt, (size_t)B * T * sizeof(int)));
    if (tmask) {
        DFM_TRY(put(out, tmask, S));
        DFM_TRY(put(out, tmem, S * (size_t)d * sizeof(float)));
    }
    return DFM_OK;
}

/* The training split through the prefetching loader, as train_loop.c starts it. */
static int dump_train(DataSet *ds, const TrainOpts *o, int L, int rank, int world, int64_t epoch, int64_t steps,
                      size_t ntrain, Bytes *out) {
    Loader ld;
    Prefetcher *pf = NULL;
    int B = (int)o->batch, with_t = ds->tgt != NULL;
    size_t S = (size_t)B * (ds->T / L) * ds->K;
    DFM_TRY(loader_init(&ld, 0, ntrain, (uint64_t)o->seed, 1));
    loader_seek(&ld, (uint64_t)epoch, 0);
    int rc = prefetch_start(&pf, ds, &ld, B, L, with_t, rank, world, (int)o->prefetch,
                            o->loader_threads > 0 ? (int)o->loader_threads : 1, NULL);
    for (int64_t s = 0; s < steps && !rc; s++) {
        PrefetchBatch *pb = NULL;
        rc = prefetch_next(pf, &pb, NULL);
        if (!rc)
            rc = put_batch(out, pb->epoch, pb->pos, pb->idx, B, ds->T, pb->inputs, pb->targets,
                           with_t ? pb->tmask : NULL, pb->tmem, S, ds->d);
        if (pb) prefetch_release(pf, pb);
    }
    prefetch_stop(pf);
    loader_free(&ld);
    return rc;
}

/* The held-out split in order, as evaluate() (evaluate.c) reads it. */
static int dump_heldout(DataSet *ds, const TrainOpts *o, int L, size_t first, size_t nval, Bytes *out) {
    int B = (int)o->batch, T = ds->T, with_t = ds->tgt != NULL;
    size_t S = (size_t)B * (T / L) * ds->K;
    long nb = (long)(nval / B);
    if (o->eval_batches > 0 && nb > o->eval_batches) nb = (long)o->eval_batches;
    int *inp = malloc((size_t)B * T * sizeof(int)), *tgt = malloc((size_t)B * T * sizeof(int));
    size_t *idx = malloc((size_t)B * sizeof(size_t));
    uint8_t *tmask = with_t ? malloc(S ? S : 1) : NULL;
    float *tmem = with_t ? malloc((S ? S : 1) * ds->d * sizeof(float)) : NULL;
    int rc = inp && tgt && idx && (!with_t || (tmask && tmem)) ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "dump-batches");
    for (long i = 0; i < nb && !rc; i++) {
        for (int b = 0; b < B; b++) idx[b] = first + (size_t)i * B + b;
        rc = data_batch(ds, idx, B, L, inp, tgt, tmem, tmask);
        if (!rc) rc = put_batch(out, 0, 0, idx, B, T, inp, tgt, tmask, tmem, S, ds->d);
    }
    free(inp), free(tgt), free(idx), free(tmask), free(tmem);
    return rc;
}

static int write_dump(const char *path, const DataSet *ds, int B, int L, uint64_t n_batches, const Bytes *pay) {
    uint8_t h[64] = {0};
    uint32_t u[8] = {1, ds->tgt ? 1u : 0u, (uint32_t)B, (uint32_t)ds->T, (uint32_t)(ds->T / L),
                     ds->tgt ? (uint32_t)ds->K : 0u, ds->tgt ? (uint32_t)ds->d : 0u, 0};
    uint64_t q[3] = {n_batches, pay->n, dfm_checksum64(pay->buf, pay->n)};
    memcpy(h, DUMP_MAGIC, 8);
    memcpy(h + 8, u, sizeof u);
    memcpy(h + 40, q, sizeof q);
    dfm_atomic_file f = {0};
    int rc = dfm_atomic_open(&f, path);
    if (!rc) rc = dfm_atomic_write(&f, h, sizeof h);
    if (!rc && pay->n) rc = dfm_atomic_write(&f, pay->buf, pay->n);
    if (!rc) rc = dfm_atomic_commit(&f);
    else dfm_atomic_abort(&f);
    return rc;
}

int cmd_dump_batches(int argc, char **argv) {
    TrainOpts o;
    memset(&o, 0, sizeof o);
    int64_t rank = 0, world = 1, epoch = 0, steps = 0;
    char *split = NULL;
    dfm_opt opts[] = {
        {"data", DFM_OPT_STR, &o.data, NULL, "PATH", "tokens: llm.c .bin shard or a `dfm chunk` run folder", 0},
        {"targets", DFM_OPT_STR, &o.targets, NULL, "PATH", "target memory: a run folder or a targets file", 0},
        {"tokens-run", DFM_OPT_STR, &o.tokens_run, NULL, "DIR", "run the targets must belong to (default: --data when it is a run)", 0},
        {"out", DFM_OPT_STR, &o.out, NULL, "FILE", "dump file to write", 1},
        {"seq-len", DFM_OPT_INT, &o.seq_len, "128", "T", "tokens per training sequence", 0, .min = "1"},
        {"batch", DFM_OPT_INT, &o.batch, "4", "B", "sequences per micro-batch", 0, .min = "1"},
        {"chunk-len", DFM_OPT_INT, &o.chunk_len, "32", "L", "tokens per chunk (with --targets)", 0, .min = "1"},
        {"seed", DFM_OPT_INT, &o.seed, "1", "N", "shuffling seed (dfm-train train --seed)", 0},
        {"val-seqs", DFM_OPT_INT, &o.val_seqs, "0", "N", "held-out sequences at the end (0 = 5%, at least one batch)", 0},
        {"eval-batches", DFM_OPT_INT, &o.eval_batches, "0", "N", "heldout: at most N batches (0 = all)", 0},
        {"rank", DFM_OPT_INT, &rank, "0", "R", "data-parallel rank whose slice to write", 0, .min = "0"},
        {"world", DFM_OPT_INT, &world, "1", "W", "data-parallel ranks", 0, .min = "1"},
        {"epoch", DFM_OPT_INT, &epoch, "0", "E", "first epoch (the loader starts at its position 0)", 0, .min = "0"},
        {"steps", DFM_OPT_INT, &steps, "0", "N", "micro-batches to write (0 = one epoch of full steps)", 0, .min = "0"},
        {"split", DFM_OPT_STR, &split, "train", "S", "train (the shuffled loader) or heldout (eval's batches)", 0, .choices = "train|heldout"},
        {"objective", DFM_OPT_STR, &o.objective, "dfm", "OBJ", "dfm (--data, --targets), reconstruct (the reading set of the run --data, as dfm-train train builds it) or reconstruct-context (the in-context reading set of train --reconstruct-context: the run's sequences, each chunk's own slot as its memory)", 0, .choices = "dfm|reconstruct|reconstruct-context"},
        {"backbone", DFM_OPT_STR, &o.backbone, NULL, "DIR", "reconstruct: the backbone whose tokenizer.json encodes --reading-prompt", 0},
        {"reading-prompt", DFM_OPT_STR, &o.reading_prompt, "Text:", "TEXT", "reconstruct: the constant context before each chunk", 0},
        {"reading-slots", DFM_OPT_STR, &o.reading_slots, NULL, "FILE", "reconstruct and reconstruct-context: each chunk's own slots from this targets file (as in training)", 0},
        {"slots", DFM_OPT_INT, &o.slots, "0", "K", "reconstruct: memory slots (0 = 16)", 0, .min = "0"},
        {"prefetch", DFM_OPT_INT, &o.prefetch, "6", "N", "micro-batches read ahead by the loader threads", 1, .min = "2"},
        {"loader-threads", DFM_OPT_INT, &o.loader_threads, "1", "N", "threads reading batches", 1, .min = "1", .max = "64"},
        {0},
    };
    int rc = dfm_opts_parse("dump-batches", "--data TOKENS [--targets PATH] --out FILE",
                            "Write the micro-batches dfm-train's loader gives one rank (sequence indices, inputs, "
                            "next-token targets, target memory and masks, the loader position) to FILE, for checking "
                            "other loaders against it. The layout is in schemas/batch_dump.md.",
                            opts, argc, argv, NULL, NULL, NULL);
    if (rc == DFM_OPTS_HELP) return 0; /* the parser freed the options */
    DataSet ds;
    memset(&ds, 0, sizeof ds);
    Bytes pay = {0};
    if (!rc && (!o.data || !o.out)) rc = DFM_FAIL(DFM_EARG, "--data and --out are required");
    if (!rc && rank >= world) rc = DFM_FAIL(DFM_EARG, "--rank %lld is not below --world %lld. HINT: ranks are 0 to W-1",
                                             (long long)rank, (long long)world);
    int reading = !strcmp(o.objective, "reconstruct");
    if (!rc && reading && !o.backbone) rc = DFM_FAIL(DFM_EARG, "--objective reconstruct needs --backbone (its tokenizer.json)");
    int in_context = !strcmp(o.objective, "reconstruct-context");
    if (!rc && in_context && o.targets)
        rc = DFM_FAIL(DFM_EARG, "--objective reconstruct-context builds its targets from the run --data: leave out --targets");
    if (!rc && in_context)
        rc = data_open_reading_context(o.data, (int)o.seq_len, (int)o.chunk_len, o.slots > 0 ? (int)o.slots : 16,
                                       o.reading_slots, &ds);
    else if (!rc) rc = reading ? train_open_reading(&o, &ds) : data_open(o.data, (int)o.seq_len, &ds);
    reading |= in_context;
    int L = o.targets || reading ? (int)o.chunk_len : (int)o.seq_len;
    if (!rc && o.targets && !reading) rc = train_open_targets(&o, &ds);
    size_t nval = rc ? 0 : train_held_out(&o, &ds);
    int heldout = split && !strcmp(split, "heldout");
    if (!rc && !heldout && nval >= ds.n_seq)
        rc = DFM_FAIL(DFM_EARG, "%zu sequences leave nothing to train on after %zu held out. HINT: --val-seqs",
                      ds.n_seq, nval);
    if (nval > ds.n_seq) nval = ds.n_seq;
    size_t ntrain = ds.n_seq - nval;
    uint64_t nb = 0;
    if (!rc && heldout) {
        rc = dump_heldout(&ds, &o, L, ntrain, nval, &pay);
        nb = (uint64_t)(nval / o.batch);
        if (o.eval_batches > 0 && nb > (uint64_t)o.eval_batches) nb = (uint64_t)o.eval_batches;
    } else if (!rc) {
        nb = steps > 0 ? (uint64_t)steps : ntrain / ((size_t)o.batch * (size_t)world);
        if (!nb) rc = DFM_FAIL(DFM_EARG, "%zu training sequences make no step of %lld x %lld", ntrain,
                               (long long)world, (long long)o.batch);
        if (!rc) rc = dump_train(&ds, &o, L, (int)rank, (int)world, epoch, (int64_t)nb, ntrain, &pay);
    }
    if (!rc) rc = write_dump(o.out, &ds, (int)o.batch, L, nb, &pay);
    if (!rc) DFM_LOG_I("dump-batches: %llu batches of %lld x %d (%s split) to %s", (unsigned long long)nb,
                       (long long)o.batch, ds.T, heldout ? "heldout" : "train", o.out);
    free(pay.buf);
    data_close(&ds);
    dfm_opts_free(opts);
    return rc;
}
