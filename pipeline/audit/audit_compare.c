/* audit_compare.c — `dfm audit --compare RUN_A RUN_B`: two runs agree (see audit.h). */
#include "pipeline/audit/audit.h"

#include "common/error.h"
#include "common/manifest.h"
#include "shard/target_reader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* counts that do not depend on the number of ranks (those that do: shards, exchange bytes, ...) */
static const char *const CMP_COUNTS[][2] = {
    {"chunk", "documents"},        {"chunk", "tokens"},           {"chunk", "pad_tokens"},   {"chunk", "chunks"},
    {"chunk", "sequences"},        {"encode", "chunks"},          {"encode", "tokens"},      {"index", "vectors"},
    {"retrieve", "queries"},       {"retrieve", "no_query_rows"}, {"retrieve", "candidates_fetched"},
    {"retrieve", "excluded"},      {"retrieve", "items_kept"},    {"retrieve", "padded_slots"},
    {"targets", "records"},        {"targets", "empty_records"},  {"targets", "raw_bytes"},  {"targets", "stored_bytes"},
};

static double cfg_num(json_t *m, const char *stage, const char *key) {
    json_t *v = json_object_get(json_object_get(dfm_manifest_stage(m, stage), "config"), key);
    return json_is_number(v) ? json_number_value(v) : 0;
}

/* The counted figures of a run (dfm_audit_count on its manifest, k = 1024). */
static int counted_of(json_t *m, const char *run, dfm_audit_counted *c) {
    long long n[5] = {dfm_manifest_count(m, "chunk", "chunks"), dfm_manifest_count(m, "chunk", "tokens"),
                      dfm_manifest_count(m, "retrieve", "queries"), dfm_manifest_count(m, "retrieve", "items_kept"),
                      dfm_manifest_count(m, "retrieve", "candidates_fetched")};
    for (int i = 0; i < 5; i++)
        if (n[i] < 0) n[i] = 0;
    dfm_audit_counts_in in = {(uint32_t)cfg_num(m, "chunk", "chunk-len"), (uint32_t)cfg_num(m, "retrieve", "k"), 1024, (uint64_t)n[0],
                              (uint64_t)n[1], (uint64_t)n[2], (uint64_t)n[3], (uint64_t)n[4]};
    int rc = dfm_audit_count(&in, c);
    if (rc) dfm_error_prefix("%s", run);
    return rc;
}

/* The counted figures of both runs, printed side by side; differences appended to d. */
static int compare_counted(json_t *ma, json_t *mb, const char *ra, const char *rb, FILE *d, int *n_diff) {
    dfm_audit_counted ca, cb;
    DFM_TRY(counted_of(ma, ra, &ca));
    DFM_TRY(counted_of(mb, rb, &cb));
    const struct {
        const char *name;
        double a, b;
    } rows[] = {
        {"query saving per chunk", ca.query_saving_per_chunk, cb.query_saving_per_chunk},
        {"item saving per chunk", ca.item_saving_per_chunk, cb.item_saving_per_chunk},
        {"query saving as issued", ca.query_saving_run, cb.query_saving_run},
        {"item saving as kept", ca.item_saving_run, cb.item_saving_run},
        {"candidate saving as fetched", ca.candidate_saving_run, cb.candidate_saving_run},
        {"chunk-level queries", (double)ca.chunk_queries, (double)cb.chunk_queries},
        {"token-level queries", (double)ca.token_queries, (double)cb.token_queries},
        {"token-level items", (double)ca.token_items, (double)cb.token_items},
    };
    printf("compare: counted figures (k = 1024)          %-24s %-24s\n", "A", "B");
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        int same = rows[i].a == rows[i].b;
        printf("  %-42s %-24.17g %-24.17g %s\n", rows[i].name, rows[i].a, rows[i].b, same ? "identical" : "DIFFERENT");
        if (!same) {
            fprintf(d, "%scounted %s: %.17g vs %.17g", *n_diff ? "; " : "", rows[i].name, rows[i].a, rows[i].b);
            (*n_diff)++;
        }
    }
    return DFM_OK;
}

int dfm_audit_compare(const char *ra, const char *rb) {
    json_t *ma = NULL, *mb = NULL;
    dfm_target_reader *ta = NULL, *tb = NULL;
    char *diff = NULL;
    size_t diff_n = 0;
    int n_diff = 0;
    int rc = dfm_manifest_load(ra, 0, &ma);
    if (!rc) rc = dfm_manifest_load(rb, 0, &mb);
    if (rc) goto done;
    FILE *d = open_memstream(&diff, &diff_n);
    if (!d) {
        rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        goto done;
    }
    for (size_t i = 0; i < sizeof CMP_COUNTS / sizeof CMP_COUNTS[0]; i++) {
        long long va = dfm_manifest_count(ma, CMP_COUNTS[i][0], CMP_COUNTS[i][1]);
        long long vb = dfm_manifest_count(mb, CMP_COUNTS[i][0], CMP_COUNTS[i][1]);
        if (va != vb) {
            fprintf(d, "%s%s.counts.%s: %lld vs %lld", n_diff ? "; " : "", CMP_COUNTS[i][0], CMP_COUNTS[i][1], va, vb);
            n_diff++;
        }
    }
    if ((rc = compare_counted(ma, mb, ra, rb, d, &n_diff))) {
        fclose(d);
        goto done;
    }
    char ha[33], hb[33];
    if (!dfm_audit_config_hash(ma, ha) && !dfm_audit_config_hash(mb, hb) && strcmp(ha, hb))
        printf("compare: configs differ (config hash %s vs %s)\n", ha, hb);
    uint64_t compared = 0;
    if (!n_diff) {
        int ca = dfm_manifest_require_complete(ma, "targets", ra), cb = dfm_manifest_require_complete(mb, "targets", rb);
        dfm_error_clear();
        if (ca != cb) {
            fprintf(d, "targets complete in %s but not in %s", ca ? rb : ra, ca ? ra : rb);
            n_diff++;
        } else if (!ca) {
            /* every record, byte for byte (the encoding is deterministic: same record, same bytes) */
            if ((rc = dfm_target_reader_open(ra, NULL, &ta)) || (rc = dfm_target_reader_open(rb, NULL, &tb))) {
                fclose(d);
                goto done;
            }
            const dfm_target_info *ia = dfm_target_reader_info(ta), *ib = dfm_target_reader_info(tb);
            if (ia->n_chunks != ib->n_chunks || ia->k != ib->k || ia->d != ib->d || ia->dtype != ib->dtype) {
                fprintf(d, "target shape: %llu records, K %u, d %u, dtype %d vs %llu, %u, %u, %d", (unsigned long long)ia->n_chunks, ia->k,
                        ia->d, ia->dtype, (unsigned long long)ib->n_chunks, ib->k, ib->d, ib->dtype);
                n_diff++;
            }
            for (uint64_t c = 0; !n_diff && c < ia->n_chunks; c++) {
                const void *pa, *pb;
                size_t na, nb;
                if ((rc = dfm_target_reader_raw(ta, c, &pa, &na))) {
                    fclose(d);
                    goto done;
                }
                /* pa stays valid until the next call on ta; tb is a different reader */
                if ((rc = dfm_target_reader_raw(tb, c, &pb, &nb))) {
                    fclose(d);
                    goto done;
                }
                if (na != nb || memcmp(pa, pb, na)) {
                    fprintf(d, "target record of chunk %llu differs (%zu vs %zu bytes)", (unsigned long long)c, na, nb);
                    n_diff++;
                }
                compared++;
            }
        }
    }
    fclose(d);
    if (n_diff) {
        rc = DFM_FAIL(DFM_EMISMATCH, "%s and %s differ: %s", ra, rb, diff);
        goto done;
    }
    printf("compare: OK %s and %s: %zu counts equal, counted figures identical, %llu target records identical\n", ra, rb,
           sizeof CMP_COUNTS / sizeof CMP_COUNTS[0],
           (unsigned long long)compared);
done:
    dfm_target_reader_close(ta);
    dfm_target_reader_close(tb);
    free(diff);
    json_decref(ma);
    json_decref(mb);
    return rc;
}
