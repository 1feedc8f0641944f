/* run_verify.c — `dfm verify`: every stage's files of a run (see run_verify.h). */
#include "shard/run_verify.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/manifest.h"
#include "retriever/index.h"
#include "schemas/chunk_shard.h"
#include "schemas/embedding_shard.h"
#include "schemas/neighbor_shard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const stage_names[] = {"chunk", "encode", "index", "retrieve", "targets"};
enum { N_STAGES = sizeof stage_names / sizeof stage_names[0] };

int dfm_verify_stages_parse(const char *list, unsigned *mask) {
    *mask = 0;
    const char *p = list;
    while (p && *p) {
        size_t n = strcspn(p, ",");
        unsigned bit = 0;
        if (n == 3 && !strncmp(p, "all", 3)) bit = DFM_VERIFY_ALL;
        for (int s = 0; s < N_STAGES; s++)
            if (strlen(stage_names[s]) == n && !strncmp(p, stage_names[s], n)) bit = 1u << s;
        if (!bit)
            return DFM_FAIL(DFM_EARG, "--stages: unknown stage '%.*s'. HINT: a comma-separated list of chunk, encode, index, retrieve, "
                            "targets, or all", (int)n, p);
        *mask |= bit;
        p += n + (p[n] == ',');
    }
    return *mask ? DFM_OK : DFM_FAIL(DFM_EARG, "--stages: empty list. HINT: e.g. --stages chunk,encode or --stages all");
}

/* The chunk count of the run (the chunk stage's), or -1 when the run has no chunk stage. */
static long long run_chunks(json_t *man) { return dfm_manifest_count(man, "chunk", "chunks"); }

static int count_matches(const char *run, const char *stage, const char *what, long long want, uint64_t have) {
    if (want < 0 || (uint64_t)want == have) return DFM_OK;
    return DFM_FAIL(DFM_EMISMATCH, "%s: the %s stage's files hold %llu %s; the manifest counts %lld. HINT: the run directory was modified; "
                    "re-run 'dfm %s --force'", run, stage, (unsigned long long)have, what, want, dfm_stage_command(stage));
}

static int verify_chunk(const char *run, json_t *man) {
    dfm_chunk_set *cs = NULL;
    int rc = dfm_chunk_set_open(run, &cs);
    if (!rc) rc = count_matches(run, "chunk", "chunks", run_chunks(man), cs->n_chunks);
    if (!rc) printf("verify: chunk: %d shards, %llu chunks: headers, payload checksums, token ids and tiling OK\n", cs->n_shards,
                    (unsigned long long)cs->n_chunks);
    dfm_chunk_set_close(cs);
    return rc;
}

static int verify_encode(const char *run, json_t *man) {
    dfm_emb_set *es = NULL;
    int rc = dfm_emb_set_open(run, &es);
    if (!rc) rc = count_matches(run, "encode", "rows", dfm_manifest_count(man, "encode", "chunks"), es->n_rows);
    if (!rc) printf("verify: encode: %d blocks, %llu rows of dim %u (%s): headers, payload checksums and tiling OK\n", es->n_shards,
                    (unsigned long long)es->n_rows, es->dim, dfm_emb_dtype_name(es->dtype));
    dfm_emb_set_close(es);
    return rc;
}

static int verify_retrieve(const char *run, json_t *man) {
    dfm_nbr_set *ns = NULL;
    int rc = dfm_nbr_set_open(run, &ns);
    if (!rc) rc = count_matches(run, "retrieve", "rows (one per chunk)", run_chunks(man), ns->n_chunks);
    if (!rc && ns->n_blocks) { /* the blocks agree with each other (dfm_nbr_set_open); here with what the manifest says made them */
        json_t *st = dfm_manifest_stage(man, "retrieve");
        const char *ih = json_string_value(json_object_get(st, "index_hash")), *met = json_string_value(json_object_get(st, "metric"));
        const dfm_nbr_header *h = &ns->blocks[0]->hdr;
        const char *hm = h->metric == DFM_METRIC_IP ? "ip" : "l2";
        json_int_t mk = json_integer_value(json_object_get(st, "k"));
        char have[17];
        snprintf(have, sizeof have, "%016llx", (unsigned long long)h->index_hash);
        if (mk != (json_int_t)h->k || !met || strcmp(met, hm) || !ih || strcmp(ih, have))
            rc = DFM_FAIL(DFM_EMISMATCH, "%s: K %u, metric %s, index %s; %s/manifest.json's retrieve stage says K %lld, metric %s, "
                          "index %s (blocks of another retrieval). HINT: re-run 'dfm retrieve --force'", ns->blocks[0]->path, h->k, hm,
                          have, run, (long long)mk, met ? met : "(none)", ih ? ih : "(none)");
        json_t *ds = json_object_get(st, "datastore");
        json_int_t ds_chunks = ds ? json_integer_value(json_object_get(ds, "chunks")) : 0;
        if (!rc && (uint64_t)ds_chunks != h->n_ids)
            rc = DFM_FAIL(DFM_EMISMATCH, "%s: neighbour ids index %s (n_ids %llu); %s/manifest.json's retrieve stage says %s %lld chunks. "
                          "HINT: re-run 'dfm retrieve --force'", ns->blocks[0]->path, h->n_ids ? "a datastore run" : "this run",
                          (unsigned long long)h->n_ids, run, ds ? "a datastore of" : "this run's own", (long long)ds_chunks);
    }
    if (!rc) printf("verify: retrieve: %d blocks, %llu rows of K %u: headers, payload checksums, rows and tiling OK\n", ns->n_blocks,
                    (unsigned long long)ns->n_chunks, ns->k);
    dfm_nbr_set_close(ns);
    return rc;
}

/* One index shard: the file against its sidecar (dfm_index_load) and the sidecar against the manifest's entry. */
static int verify_index_shard(const char *run, json_t *o, size_t i, size_t n, uint32_t dim, int metric, uint64_t *next,
                              uint64_t *vectors) {
    const char *file = json_string_value(json_object_get(o, "file"));
    if (!file) return DFM_FAIL(DFM_EFORMAT, "%s/manifest.json: index output %zu has no \"file\"", run, i);
    char *path = dfm_path_join(run, file);
    if (!path) return DFM_FAIL(DFM_ENOMEM, "no memory");
    FaissIndex *idx = NULL;
    dfm_index_info info;
    int rc = dfm_index_load(path, dim, metric, &idx, &info);
    if (idx) faiss_Index_free(idx);
    const char *sum = json_string_value(json_object_get(o, "xxh128"));
    if (!rc && ((uint64_t)json_integer_value(json_object_get(o, "first_id")) != info.first_id ||
                (uint64_t)json_integer_value(json_object_get(o, "end_id")) != info.end_id ||
                (uint64_t)json_integer_value(json_object_get(o, "ntotal")) != info.ntotal ||
                (uint64_t)json_integer_value(json_object_get(o, "bytes")) != info.bytes || !sum || strcmp(sum, info.xxh128)))
        rc = DFM_FAIL(DFM_EMISMATCH, "index %s (ids [%llu, %llu), %llu vectors, %llu bytes, xxh128 %s) is not the file %s/manifest.json "
                      "lists. HINT: the run directory was modified; re-run 'dfm index --force'", path, (unsigned long long)info.first_id,
                      (unsigned long long)info.end_id, (unsigned long long)info.ntotal, (unsigned long long)info.bytes, info.xxh128, run);
    /* sharded by list (an IVF index): whole lists, ids from anywhere; by id: the shards tile the ids */
    if (!rc && info.by_list && (info.end_id < info.first_id || info.shard != (int)i || info.n_shards != (int)n))
        rc = DFM_FAIL(DFM_EMISMATCH, "index %s: shard %d of %d of whole lists; expected shard %zu of %zu (a shard of another build). "
                      "HINT: re-run 'dfm index --force'", path, info.shard, info.n_shards, i, n);
    else if (!rc && !info.by_list && (info.first_id != *next || info.end_id < info.first_id || info.shard != (int)i || info.n_shards != (int)n))
        rc = DFM_FAIL(DFM_EMISMATCH, "index %s: shard %d of %d with ids from %llu; expected shard %zu of %zu with ids from %llu (gap, "
                      "overlap or a shard of another build). HINT: re-run 'dfm index --force'", path, info.shard, info.n_shards,
                      (unsigned long long)info.first_id, i, n, (unsigned long long)*next);
    if (!rc && !info.by_list) *next = info.end_id;
    if (!rc) *vectors += info.ntotal;
    free(path);
    return rc;
}

static int verify_index(const char *run, json_t *man) {
    json_t *st = dfm_manifest_stage(man, "index"), *outs = json_object_get(st, "outputs"), *o;
    const char *met = json_string_value(json_object_get(st, "metric"));
    json_int_t dim = json_integer_value(json_object_get(st, "dim"));
    size_t n = json_array_size(outs), i;
    if (!n || !met || (strcmp(met, "ip") && strcmp(met, "l2")) || dim <= 0 || dim > UINT32_MAX)
        return DFM_FAIL(DFM_EFORMAT, "%s/manifest.json: the index stage needs \"outputs\", \"metric\" (ip or l2) and a positive \"dim\". "
                        "HINT: re-run 'dfm index --force'", run);
    int metric = strcmp(met, "ip") ? DFM_METRIC_L2 : DFM_METRIC_IP;
    uint64_t next = 0, vectors = 0;
    int rc = DFM_OK;
    json_array_foreach(outs, i, o) {
        if ((rc = verify_index_shard(run, o, i, n, (uint32_t)dim, metric, &next, &vectors))) return rc;
    }
    if (strcmp(json_string_value(json_object_get(st, "sharding")) ?: "ids", "lists"))
        DFM_TRY(count_matches(run, "index", "ids (the end of the last shard's range)", run_chunks(man), next));
    DFM_TRY(count_matches(run, "index", "vectors", dfm_manifest_count(man, "index", "vectors"), vectors));
    printf("verify: index: %zu shards, %llu vectors of dim %lld (%s): sizes, hashes, FAISS loads and id ranges OK\n", n,
           (unsigned long long)vectors, (long long)dim, met);
    return DFM_OK;
}

int dfm_run_verify(const char *run, unsigned mask, const dfm_target_verify_config *cfg) {
    json_t *man = NULL;
    DFM_TRY(dfm_manifest_load(run, 0, &man));
    int rc = DFM_OK, checked = 0;
    for (int s = 0; !rc && s < N_STAGES; s++) {
        if (!(mask & (1u << s))) continue;
        const char *name = stage_names[s];
        if (!dfm_manifest_stage(man, name)) {
            if (mask != DFM_VERIFY_ALL || (1u << s) == DFM_VERIFY_TARGETS)
                rc = DFM_FAIL(DFM_ESTATE, "%s has no '%s' stage to verify. HINT: run 'dfm %s' first, or leave it out of --stages", run,
                              name, dfm_stage_command(name));
            else
                printf("verify: %s: not in this run, skipped\n", name);
            continue;
        }
        rc = dfm_manifest_require_complete(man, name, run);
        if (!rc) {
            switch (1u << s) {
            case DFM_VERIFY_CHUNK: rc = verify_chunk(run, man); break;
            case DFM_VERIFY_ENCODE: rc = verify_encode(run, man); break;
            case DFM_VERIFY_INDEX: rc = verify_index(run, man); break;
            case DFM_VERIFY_RETRIEVE: rc = verify_retrieve(run, man); break;
            default: rc = dfm_target_verify(run, cfg); break;
            }
        }
        if (rc) rc = dfm_error_prefix("the %s stage of %s", name, run);
        checked++;
    }
    if (!rc && !checked)
        rc = DFM_FAIL(DFM_ESTATE, "%s: none of the stages asked for is in the run; nothing was verified. HINT: build the run first", run);
    json_decref(man);
    return rc;
}
