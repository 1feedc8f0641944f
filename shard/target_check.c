/* target_check.c — looking at and checking a run's target shards (see target_check.h). */
#include "shard/target_check.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/manifest.h"
#include "tokenizer/tokenizer.h"
#include "schemas/chunk_shard.h"
#include "shard/target_layout.h"
#include "shard/target_reader.h"
#include "shard/target_source.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t *ids;
    float *scores, *emb;
    dfm_trec t;
} rec_buf;

static int rec_buf_init(rec_buf *b, const dfm_target_info *inf) {
    b->ids = malloc(sizeof(int64_t) * inf->k);
    b->scores = malloc(sizeof(float) * inf->k);
    b->emb = malloc(sizeof(float) * inf->k * inf->d);
    b->t = (dfm_trec){.ids = b->ids, .scores = b->scores, .emb = b->emb};
    return b->ids && b->scores && b->emb ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "no memory");
}

static void rec_buf_free(rec_buf *b) {
    free(b->ids);
    free(b->scores);
    free(b->emb);
}

static char *chunk_text(const dfm_chunk_set *cs, const dfm_tokenizer *tok, uint64_t id) {
    const dfm_chunk_meta *meta;
    const uint32_t *toks;
    char *text = NULL;
    size_t len;
    if (!cs || !tok || dfm_chunk_set_get(cs, id, &meta, &toks) || dfm_tokenizer_decode(tok, toks, meta->n_valid, 0, &text, &len)) {
        dfm_error_clear();
        return NULL;
    }
    for (char *p = text; *p; p++)
        if (*p == '\n' || *p == '\t') *p = ' ';
    return text;
}

/* ---- inspect ---------------------------------------------------------------------------------- */
/* One record with the texts of its query chunk, the chunk before it and its valid neighbours (cs, tok
 * may be NULL: no texts; ns: the chunks the neighbour ids index, cs or a datastore run's). */
static void print_record(const dfm_target_info *inf, const dfm_trec *t, const dfm_chunk_set *cs, const dfm_chunk_set *ns,
                         const dfm_tokenizer *tok, int64_t nvals) {
    /* "slots" only when not the neighbours themselves: the default prints as before */
    printf("chunk %llu  K %u  d %u  dtype %s  store %s%s%s  flags%s%s%s  mask 0x%016llx (%d valid)\n", (unsigned long long)t->chunk_id,
           inf->k, inf->d, dfm_dtype_name(inf->dtype), inf->ids_only ? "ids" : "embeddings", inf->slots ? "  slots " : "",
           inf->slots ? dfm_trec_slots_name(inf->slots) : "",
           (t->flags & DFM_TREC_F_SEQ_START) ? " SEQ_START" : "", (t->flags & DFM_TREC_F_EMPTY) ? " EMPTY" : "",
           (t->flags & DFM_TREC_F_SHUFFLE) ? " SHUFFLE" : "", (unsigned long long)t->mask, __builtin_popcountll(t->mask));
    char *q = chunk_text(cs, tok, t->chunk_id);
    if (q) printf("query chunk text: %s\n", q);
    free(q);
    if (t->chunk_id > 0) {
        char *prev = chunk_text(cs, tok, t->chunk_id - 1);
        if (prev) printf("preceding chunk (the query's context): %s\n", prev);
        free(prev);
    }
    /* continuation slots: all of them, or the second half with slots both (schemas/target_record.h) */
    const uint32_t first_cont = inf->slots == DFM_TREC_SLOTS_CONTINUATION ? 0 : inf->slots == DFM_TREC_SLOTS_BOTH ? inf->k / 2 : inf->k;
    for (uint32_t i = 0; i < inf->k; i++) {
        int valid = (int)((t->mask >> i) & 1u), cont = i >= first_cont;
        printf("  %s %2u  %s  id %10lld  score %+.6f  emb [", cont ? "cont" : "rank", i - (cont ? first_cont : 0), valid ? "valid " : "masked",
               (long long)t->ids[i], t->scores[i]);
        for (int64_t j = 0; j < nvals && j < (int64_t)inf->d; j++) printf("%s%+.5f", j ? ", " : "", t->emb[(size_t)i * inf->d + j]);
        printf("%s]\n", nvals < (int64_t)inf->d ? ", ..." : "");
        if (valid) {
            char *nt = chunk_text(ns, tok, (uint64_t)t->ids[i]);
            if (nt && cont) printf("           continuation (chunk after neighbour %lld) text: %s\n", (long long)t->ids[i] - 1, nt);
            else if (nt) printf("           text: %s\n", nt);
            free(nt);
        }
    }
}

int dfm_target_inspect(const char *run, uint64_t chunk, int64_t nvals, const char *tokenizer) {
    dfm_target_reader *r = NULL;
    dfm_chunk_set *cs = NULL, *ds = NULL;
    dfm_tokenizer *tok = NULL;
    json_t *man = NULL;
    rec_buf b = {0};
    dfm_target_open_opts oo = {.prefetch = -1};
    int rc = dfm_target_reader_open(run, &oo, &r);
    if (!rc) rc = rec_buf_init(&b, dfm_target_reader_info(r));
    if (!rc) rc = dfm_target_reader_get(r, chunk, &b.t);
    if (!rc) {
        /* texts are a bonus: a run without chunks (synthetic) or whose tokenizer is gone prints none. But a
         * tokenizer asked for must load, and the chunk shards of a run that has them must be whole. */
        if (dfm_manifest_load(run, 0, &man) == DFM_OK && dfm_manifest_stage(man, "chunk")) {
            const char *tp = tokenizer ? tokenizer
                                       : json_string_value(json_object_get(json_object_get(dfm_manifest_stage(man, "chunk"), "tokenizer"), "path"));
            int trc = tp ? dfm_tokenizer_load(tp, &tok) : DFM_ENOTFOUND;
            if (trc && tokenizer) rc = trc;
            else if (!trc) rc = dfm_chunk_set_open(run, &cs);
            /* a query-only run's neighbours are chunks of its datastore run */
            const char *dsr = json_string_value(
                json_object_get(json_object_get(dfm_manifest_stage(man, "retrieve"), "datastore"), "run"));
            if (!rc && !trc && dsr) rc = dfm_chunk_set_open(dsr, &ds);
            if (rc) rc = dfm_error_prefix("inspect %s: the texts of chunk %llu", run, (unsigned long long)chunk);
        }
        if (!rc) {
            dfm_error_clear();
            print_record(dfm_target_reader_info(r), &b.t, cs, ds ? ds : cs, tok, nvals);
        }
    }
    rec_buf_free(&b);
    dfm_target_reader_close(r);
    dfm_chunk_set_close(cs);
    dfm_chunk_set_close(ds);
    dfm_tokenizer_free(tok);
    json_decref(man);
    return rc;
}

/* Rebuild a sample of records from the run's stored neighbours (RUN/retrieve) and embeddings
 * (RUN/encode), exactly as write-targets does, and compare them with the stored ones decoded. */
static int rebuild_sample(dfm_target_reader *r, const char *run, double fraction, uint64_t seed, uint64_t *checked) {
    const dfm_target_info *inf = dfm_target_reader_info(r);
    dfm_mpi solo = {.rank = 0, .size = 1, .comm = MPI_COMM_NULL};
    dfm_target_real *real = NULL;
    dfm_target_source src;
    dfm_target_synth syn = {0};
    json_t *man = NULL;
    DFM_TRY(dfm_manifest_load(run, 0, &man));
    json_t *sc_cfg = json_object_get(dfm_manifest_stage(man, "synthetic"), "config");
    int rc = DFM_OK;
    if (sc_cfg) { /* a synthetic run: its data comes from the generator */
        syn = (dfm_target_synth){.n_chunks = (uint64_t)json_integer_value(json_object_get(sc_cfg, "n_chunks")),
                                 .k = (uint32_t)json_integer_value(json_object_get(sc_cfg, "k")),
                                 .d = (uint32_t)json_integer_value(json_object_get(sc_cfg, "d")),
                                 .seq_chunks = (uint32_t)json_integer_value(json_object_get(sc_cfg, "seq_chunks")),
                                 .seed = (uint64_t)json_integer_value(json_object_get(sc_cfg, "seed"))};
        dfm_target_synth_source(&syn, 0, 1, &src);
    } else {
        rc = dfm_target_real_open(&solo, run, &real, &src);
    }
    json_decref(man);
    DFM_TRY(rc);
    if (src.n_chunks != inf->n_chunks || dfm_target_slot_count(src.k, inf->slots) != inf->k || src.d != inf->d)
        rc = DFM_FAIL(DFM_EMISMATCH, "%s: the retrieve/encode stages have %llu chunks, K %u, d %u; the targets %llu, %u slots (%s), d %u", run,
                      (unsigned long long)src.n_chunks, src.k, src.d, (unsigned long long)inf->n_chunks, inf->k,
                      dfm_trec_slots_name(inf->slots), inf->d);
    dfm_trec_params p = {.k = inf->k, .d = inf->d, .dtype = inf->dtype, .level = 1, .slots = inf->slots};
    dfm_trec_codec *c = NULL;
    if (!rc) rc = dfm_trec_codec_create(&p, &c);
    size_t kd = (size_t)inf->k * inf->d, cap = dfm_trec_max_bytes(inf->k, inf->d, inf->dtype, 0);
    int64_t ids[64], ids_a[64], ids_b[64];
    float sc[64], sc_a[64], sc_b[64], *rows = malloc(sizeof(float) * kd), *emb_a = malloc(sizeof(float) * kd),
                                      *emb_b = malloc(sizeof(float) * kd);
    uint8_t *rec = malloc(cap);
    if (!rc && (!rows || !emb_a || !emb_b || !rec)) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1, thresh = (uint64_t)(fraction * 18446744073709551615.0);
    for (uint64_t id = 0; !rc && id < inf->n_chunks; id++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        if (fraction < 1 && x > thresh) continue;
        uint64_t mask;
        uint8_t seq;
        rc = dfm_target_slot_neighbors(&src, inf->slots, id, 1, ids, sc, &mask, &seq);
        for (uint32_t i = 0; !rc && i < inf->k; i++) {
            if (!((mask >> i) & 1u)) continue;
            uint64_t nid = (uint64_t)ids[i];
            rc = src.rows(src.ctx, &nid, 1, rows + (size_t)i * inf->d);
        }
        size_t n;
        dfm_trec want = {.chunk_id = id, .flags = seq ? DFM_TREC_F_SEQ_START : 0, .mask = mask, .ids = ids, .scores = sc, .emb = rows};
        dfm_trec a = {.ids = ids_a, .scores = sc_a, .emb = emb_a}, b = {.ids = ids_b, .scores = sc_b, .emb = emb_b};
        if (!rc) rc = dfm_trec_encode(c, &want, rec, cap, &n);
        if (!rc) rc = dfm_trec_decode(c, rec, n, &a, NULL, NULL);
        if (!rc) rc = dfm_target_reader_get(r, id, &b);
        if (!rc && (a.mask != b.mask || (a.flags & DFM_TREC_F_SEQ_START) != (b.flags & DFM_TREC_F_SEQ_START) ||
                    memcmp(ids_a, ids_b, 8 * inf->k) || memcmp(sc_a, sc_b, 4 * inf->k) || memcmp(emb_a, emb_b, sizeof(float) * kd)))
            rc = DFM_FAIL(DFM_EMISMATCH, "shard %05llu key %016llx (chunk %llu): the stored record differs from the one rebuilt from "
                          "%s/retrieve and %s/encode. HINT: the upstream stages changed after write-targets, or a bug; re-run 'dfm write-targets --force'",
                          (unsigned long long)(id / inf->span), (unsigned long long)id, (unsigned long long)id, run, run);
        if (!rc) (*checked)++;
    }
    free(rows);
    free(emb_a);
    free(emb_b);
    free(rec);
    dfm_trec_codec_free(c);
    dfm_target_real_close(real);
    return rc;
}

/* ---- verify ----------------------------------------------------------------------------------- */
static int same_record(const dfm_target_info *inf, const dfm_trec *a, const dfm_trec *b) {
    const uint32_t keep = DFM_TREC_F_SEQ_START | DFM_TREC_F_EMPTY;
    return a->chunk_id == b->chunk_id && (a->flags & keep) == (b->flags & keep) && a->mask == b->mask &&
           !memcmp(a->ids, b->ids, sizeof(int64_t) * inf->k) && !memcmp(a->scores, b->scores, sizeof(float) * inf->k) &&
           !memcmp(a->emb, b->emb, sizeof(float) * inf->k * inf->d);
}

/* Every record of r in key order (and of rb, compared, when not NULL): counts of records, sequence
 * starts, empty records and padded slots. */
static int verify_walk(const char *run, const char *compare, dfm_target_reader *r, dfm_target_reader *rb, rec_buf *a_,
                       rec_buf *bb_, uint64_t *n_, uint64_t *seqs_, uint64_t *empty_, uint64_t *padded_) {
    const dfm_target_info *inf = dfm_target_reader_info(r);
    uint64_t n = 0, seqs = 0, empty = 0, padded = 0;
    int rc = DFM_OK;
    while (!rc) {
        int ra = dfm_target_reader_next(r, &a_->t);
        if (ra < 0) {
            rc = ra;
            break;
        }
        if (rb) {
            int rbb = dfm_target_reader_next(rb, &bb_->t);
            if (rbb < 0) {
                rc = rbb;
                break;
            }
            if (ra != rbb) {
                rc = DFM_FAIL(DFM_EMISMATCH, "%s and %s end at different records (%llu)", run, compare, (unsigned long long)n);
                break;
            }
            if (ra == DFM_OK && !same_record(inf, &a_->t, &bb_->t)) {
                rc = DFM_FAIL(DFM_EMISMATCH, "shard %05llu key %016llx (chunk %llu) differs between %s and %s",
                              (unsigned long long)(a_->t.chunk_id / inf->span), (unsigned long long)a_->t.chunk_id,
                              (unsigned long long)a_->t.chunk_id, run, compare);
                break;
            }
        }
        if (ra == DFM_TARGET_END) break;
        n++;
        if (a_->t.flags & DFM_TREC_F_SEQ_START) seqs++;
        if (a_->t.flags & DFM_TREC_F_EMPTY) empty++;
        else padded += inf->k - (uint64_t)__builtin_popcountll(a_->t.mask);
    }
    *n_ = n, *seqs_ = seqs, *empty_ = empty, *padded_ = padded;
    return rc;
}

/* The counts against the manifest's "targets" stage, and each shard's records checksum against its outputs. */
static int verify_manifest(const char *run, const dfm_target_info *inf, uint64_t n, uint64_t seqs, uint64_t empty,
                           uint64_t padded) {
    json_t *man = NULL;
    int rc = dfm_manifest_load(run, 0, &man);
    if (!rc) {
        json_t *st = dfm_manifest_stage(man, "targets");
        long long mrec = dfm_manifest_count(man, "targets", "records");
        if (n != inf->n_chunks || (long long)n != mrec)
            rc = DFM_FAIL(DFM_EFORMAT, "%s: read %llu records; the run has %llu chunks and the manifest counts %lld", run,
                          (unsigned long long)n, (unsigned long long)inf->n_chunks, mrec);
        else if (dfm_manifest_count(man, "targets", "seq_starts") != (long long)seqs ||
                 dfm_manifest_count(man, "targets", "empty_records") != (long long)empty ||
                 dfm_manifest_count(man, "targets", "padded_slots") != (long long)padded)
            rc = DFM_FAIL(DFM_EFORMAT, "%s: records hold %llu sequence starts, %llu empty records, %llu padded slots; the manifest says %lld, %lld, %lld",
                          run, (unsigned long long)seqs, (unsigned long long)empty, (unsigned long long)padded,
                          dfm_manifest_count(man, "targets", "seq_starts"), dfm_manifest_count(man, "targets", "empty_records"),
                          dfm_manifest_count(man, "targets", "padded_slots"));
        json_t *outs = json_object_get(st, "outputs");
        for (uint32_t s = 0; !rc && s < inf->n_shards; s++) {
            json_t *o = json_array_get(outs, s);
            char *dir = dfm_target_shard_dir(run, s, 0);
            dfm_target_shard_meta mt;
            rc = dir ? dfm_target_meta_read(dir, &mt) : DFM_FAIL(DFM_ENOMEM, "no memory");
            char sum[17];
            snprintf(sum, sizeof sum, "%016llx", (unsigned long long)mt.records_checksum);
            const char *ms = json_string_value(json_object_get(o, "records_checksum"));
            if (!rc && (!ms || strcmp(ms, sum) != 0))
                rc = DFM_FAIL(DFM_EMISMATCH, "shard %s: records checksum %s, the manifest lists %s", dir, sum, ms ? ms : "(none)");
            free(dir);
        }
    }
    json_decref(man);
    return rc;
}

int dfm_target_verify(const char *run, const dfm_target_verify_config *cfg) {
    dfm_target_reader *r = NULL, *rb = NULL;
    rec_buf a = {0}, bb = {0};
    uint64_t n = 0, seqs = 0, empty = 0, padded = 0;
    dfm_target_open_opts oo = {.tokens_run = cfg->tokens_run};
    int rc = dfm_target_reader_open(run, &oo, &r);
    if (!rc && cfg->compare) rc = dfm_target_reader_open(cfg->compare, NULL, &rb);
    const dfm_target_info *inf = r ? dfm_target_reader_info(r) : NULL;
    if (!rc && rb) {
        const dfm_target_info *ib = dfm_target_reader_info(rb);
        if (ib->n_chunks != inf->n_chunks || ib->k != inf->k || ib->d != inf->d || ib->dtype != inf->dtype)
            rc = DFM_FAIL(DFM_EMISMATCH, "%s has %llu chunks, K %u, d %u, %s; %s has %llu, K %u, d %u, %s", run,
                          (unsigned long long)inf->n_chunks, inf->k, inf->d, dfm_dtype_name(inf->dtype), cfg->compare,
                          (unsigned long long)ib->n_chunks, ib->k, ib->d, dfm_dtype_name(ib->dtype));
    }
    if (!rc) rc = rec_buf_init(&a, inf);
    if (!rc && rb) rc = rec_buf_init(&bb, inf);
    if (!rc) rc = verify_walk(run, cfg->compare, r, rb, &a, &bb, &n, &seqs, &empty, &padded);
    if (!rc) rc = verify_manifest(run, inf, n, seqs, empty, padded);
    uint64_t rechecked = 0;
    if (!rc && cfg->recompute_records > 0) rc = rebuild_sample(r, run, cfg->recompute_records, (uint64_t)cfg->seed, &rechecked);
    if (!rc && cfg->recompute_records > 0) printf("verify: %llu records rebuilt from the run's neighbours and embeddings: identical\n", (unsigned long long)rechecked);
    if (!rc)
        printf("verify: OK %s: %llu records in %u shards (%llu sequence starts, %llu empty, %llu padded slots), %s\n", run,
               (unsigned long long)n, inf->n_shards, (unsigned long long)seqs, (unsigned long long)empty, (unsigned long long)padded,
               rb ? "identical to the compared run" : "checksums and keys in order");
    rec_buf_free(&a);
    rec_buf_free(&bb);
    dfm_target_reader_close(r);
    dfm_target_reader_close(rb);
    return rc;
}
