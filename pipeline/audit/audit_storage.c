/* audit_storage.c — the storage of target memory per slot layout (audit_storage.h). */
#include "pipeline/audit/audit_storage.h"

#include "pipeline/audit/audit.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static void row(dfm_audit_storage *s, const char *what, uint32_t M, uint32_t w) {
    dfm_audit_storage_row *r = &s->row[s->n++];
    snprintf(r->what, sizeof r->what, "%s", what);
    r->per_neighbour = M;
    r->width = w;
    double ids = 8.0 + 12.0 * s->K, values = (double)M * w * s->value_bytes;
    r->in_records = ids + s->K * values;
    r->with_table = ids + values;
}

void dfm_audit_storage_of(uint32_t K, uint32_t L, uint32_t enc_dim, uint32_t lm_width, uint32_t value_bytes, int stores_embeddings,
                          uint64_t records, uint64_t raw_bytes, uint64_t stored_bytes, dfm_audit_storage *s) {
    memset(s, 0, sizeof *s);
    s->K = K, s->L = L, s->value_bytes = value_bytes, s->stores_embeddings = stores_embeddings;
    row(s, "the run's encoder embedding, one a neighbour", 1, enc_dim);
    if (lm_width) {
        row(s, "LM states pooled to one a neighbour", 1, lm_width);
        if (L % 4 == 0 && L > 4) row(s, "LM states pooled to four a neighbour", 4, lm_width);
        row(s, "LM states, one a token of each neighbour", L, lm_width);
    }
    s->raw_matches = -1;
    if (records && raw_bytes) {
        s->raw_per_record = (double)raw_bytes / (double)records;
        s->stored_per_record = (double)stored_bytes / (double)records;
        double want = stores_embeddings ? s->row[0].in_records : 8.0 + 12.0 * K; /* ids only: mask, ids, scores */
        s->raw_matches = fabs(s->raw_per_record - want) < 0.5;
    }
}

json_t *dfm_audit_storage_json(const dfm_audit_storage *s, const double *chunks, const char *const *names, int n) {
    json_t *o = json_pack("{s:I, s:I, s:I, s:b}", "k", (json_int_t)s->K, "chunk_len", (json_int_t)s->L, "value_bytes",
                          (json_int_t)s->value_bytes, "run_stores_embeddings", s->stores_embeddings);
    json_t *rows = json_array();
    if (!o || !rows) {
        json_decref(o);
        json_decref(rows);
        return NULL;
    }
    for (int i = 0; i < s->n; i++) {
        const dfm_audit_storage_row *r = &s->row[i];
        json_t *rj = json_pack("{s:s, s:I, s:I, s:I, s:f, s:f}", "slots_hold", r->what, "per_neighbour", (json_int_t)r->per_neighbour,
                               "width", (json_int_t)r->width, "slots_per_chunk", (json_int_t)((uint64_t)r->per_neighbour * s->K),
                               "bytes_per_chunk_in_records", r->in_records, "bytes_per_chunk_with_table", r->with_table);
        json_t *at = json_object();
        for (int j = 0; rj && at && j < n; j++)
            json_object_set_new(at, names[j], json_pack("{s:f, s:f, s:f}", "chunks", chunks[j], "bytes_in_records", chunks[j] * r->in_records,
                                                        "bytes_with_table", chunks[j] * r->with_table));
        if (rj) json_object_set_new(rj, "at", at ? at : json_null());
        else json_decref(at);
        json_array_append_new(rows, rj ? rj : json_null());
    }
    json_object_set_new(o, "layouts", rows);
    json_object_set_new(o, "run_raw_bytes_per_record", s->raw_per_record > 0 ? json_real(s->raw_per_record) : json_null());
    json_object_set_new(o, "run_stored_bytes_per_record", s->stored_per_record > 0 ? json_real(s->stored_per_record) : json_null());
    json_object_set_new(o, "run_raw_matches_layout", s->raw_matches < 0 ? json_null() : json_boolean(s->raw_matches));
    return o;
}

void dfm_audit_storage_md(FILE *mf, const dfm_audit_storage *s, const double *chunks, const char *const *names, int n) {
    char b[4][32];
    fprintf(mf, "\n## Target memory: what it costs to store\n\n"
                "A target record holds a mask, K = %u ids and scores, and the values of its slots, or, with `--store ids`, the ids "
                "alone and a table of one row per datastore chunk. Bytes per chunk, uncompressed, %u bytes a value (the run's dtype); "
                "a layout of M slots a neighbour of width w costs 8 + 12·K + K·M·w·b in every record, or 8 + 12·K + M·w·b with a table. "
                "The LM-state layouts are the frozen LM's residual stream after a layer (`dfm-train slots`).\n\n",
            s->K, s->value_bytes);
    fprintf(mf, "| slots hold | slots a chunk | per chunk, in every record | per chunk, ids + table |");
    for (int j = 0; j < n; j++) fprintf(mf, " %s (%s chunks), with table |", names[j], dfm_audit_human(chunks[j], b[0], 32));
    fprintf(mf, "\n|---|---:|---:|---:|");
    for (int j = 0; j < n; j++) fprintf(mf, "---:|");
    fprintf(mf, "\n");
    for (int i = 0; i < s->n; i++) {
        const dfm_audit_storage_row *r = &s->row[i];
        fprintf(mf, "| %s (%u × %u) | %u | %s | %s |", r->what, r->per_neighbour, r->width, r->per_neighbour * s->K,
                dfm_audit_bytes(r->in_records, b[0], 32), dfm_audit_bytes(r->with_table, b[1], 32));
        for (int j = 0; j < n; j++) fprintf(mf, " %s |", dfm_audit_bytes(chunks[j] * r->with_table, b[2], 32));
        fprintf(mf, "\n");
    }
    if (s->raw_per_record > 0)
        fprintf(mf, "\nThe run's records (%s): %s a record raw, %s stored after zstd; %s.\n",
                s->stores_embeddings ? "`--store embeddings`" : "`--store ids`", dfm_audit_bytes(s->raw_per_record, b[0], 32),
                dfm_audit_bytes(s->stored_per_record, b[1], 32),
                s->raw_matches > 0 ? (s->stores_embeddings ? "the raw bytes equal the first row's arithmetic exactly"
                                                           : "the raw bytes are the mask, ids and scores exactly; the values are in the shards' tables")
                                   : "**the raw bytes differ from the arithmetic**");
}
