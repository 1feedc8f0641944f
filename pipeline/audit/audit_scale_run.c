/* audit_scale_run.c — both datastores over growing prefixes of the same text, measured one after the
 * other at each size, then the cost model (audit_scale.h). */
#include "pipeline/audit/audit_scale.h"

#include "common/error.h"
#include "common/log.h"
#include "pipeline/audit/audit.h"
#include "retriever/index.h"
#include "schemas/chunk_shard.h"
#include "schemas/embedding_shard.h"
#include "schemas/hidden_states.h"
#include "schemas/neighbor_shard.h"

#include <limits.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The hidden states' text against the run's: value i (the token after key i) equals the run's real token
 * i + 1, over the tokens both hold. */
static int text_check(const char *run, const dfm_hidden_file *hf, dfm_audit_scale *s) {
    dfm_chunk_set *set = NULL;
    DFM_TRY(dfm_chunk_set_open(run, &set));
    s->text_differs_at = -1;
    uint64_t r = 0; /* real tokens of the run seen so far */
    int rc = DFM_OK;
    for (uint64_t c = 0; c < set->n_chunks && s->text_differs_at < 0; c++) {
        const dfm_chunk_meta *meta;
        const uint32_t *tok;
        if ((rc = dfm_chunk_set_get(set, c, &meta, &tok))) break;
        for (uint32_t t = 0; t < meta->n_valid; t++, r++) {
            if (r == 0) continue;
            if (r - 1 >= hf->hdr.n_keys) goto done;
            uint32_t v = hf->values[r - 1];
            if (v == DFM_HIDDEN_NO_NEXT) continue; /* the key before padding has no next token */
            if (v != tok[t]) {
                s->text_differs_at = (int64_t)r;
                break;
            }
            s->text_agree = r + 1;
        }
    }
done:
    dfm_chunk_set_close(set);
    return rc;
}

/* the chunk-level keys of the largest size: the run's embeddings, then seeded random unit vectors */
static int chunk_keys(const char *run, uint64_t n, uint64_t seed, float **out, uint32_t *dim, uint64_t *run_rows) {
    dfm_emb_set *set = NULL;
    DFM_TRY(dfm_emb_set_open(run, &set));
    *dim = set->dim;
    *run_rows = set->n_rows;
    float *k = malloc(sizeof(float) * set->dim * (n ? n : 1));
    if (!k) {
        dfm_emb_set_close(set);
        return DFM_FAIL(DFM_ENOMEM, "audit: no memory for %llu chunk keys", (unsigned long long)n);
    }
    uint64_t real = n < set->n_rows ? n : set->n_rows;
    int rc = dfm_emb_set_rows_f32(set, 0, real, k);
    for (uint64_t i = real; !rc && i < n; i++) dfm_audit_key(seed ^ (0xc4u + i * 0x9E3779B97F4A7C15ull), set->dim, k + i * set->dim);
    dfm_emb_set_close(set);
    if (rc) free(k);
    else *out = k;
    return rc;
}

static void log_point(const char *side, const dfm_audit_point *p) {
    if (p->skipped) {
        DFM_LOG_I("audit:   %s %llu keys: not measured (%s)", side, (unsigned long long)p->keys, p->why);
        return;
    }
    DFM_LOG_I("audit:   %s %llu keys (%s, nprobe %lld): build %.3f s (CPU %.3f s), %.3g ms/query (CPU %.3g ms; medians of %d), %llu bytes, "
              "recall@k %.3f", side, (unsigned long long)p->keys, p->factory, (long long)p->nprobe, p->build_s.med, p->build_cpu.med,
              p->query_s.med * 1e3, p->query_cpu.med * 1e3, p->query_s.n,
              (unsigned long long)p->index_bytes, p->recall);
}

/* the timed queries of a datastore of n keys: `want` of them (every size times the same batch: a search's cost
 * per query depends on how many queries one call holds), drawn evenly over the keys, the draw repeated in order
 * when the datastore holds fewer keys than that */
static uint64_t queries_of(uint64_t n, uint64_t want, uint64_t seed, uint64_t *qidx) {
    uint64_t m = want < n ? want : n;
    dfm_sample_ids(n, m, seed, qidx);
    for (uint64_t q = m; q < want; q++) qidx[q] = qidx[q % m];
    return want;
}

int dfm_audit_scale_run(const dfm_audit_scale_cfg *c, dfm_audit_scale *s) {
    memset(s, 0, sizeof *s);
    s->cfg = *c;
    if (c->sizes < 2 || c->sizes > DFM_AUDIT_MAX_SIZES)
        return DFM_FAIL(DFM_EARG, "audit: --measure-sizes %d outside 2..%d", c->sizes, DFM_AUDIT_MAX_SIZES);
    getloadavg(s->load_before, 3);
    /* Every buffer from a heap that keeps what is freed: glibc serves allocations above its mmap threshold (at most
     * 32 MiB) with fresh pages each time, so a build whose index outgrows it pays the kernel's page faults on every
     * repeat while the smaller sizes reuse warm memory. A Flat index of 31,252 keys (48 MB) then measured 85 % below
     * what the smaller sizes predicted; -5 % with this and the median run. What is timed is the index's own work at
     * every size. (glibc still trims more than 2 GiB free at the heap's top: an index past 2 GiB would fault again.) */
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, INT_MAX);
    double t_start = dfm_now();
    dfm_hidden_file *hf = NULL;
    float *rnd = NULL, *ck = NULL;
    uint64_t *qidx = NULL;
    const float *tk;
    uint32_t tdim;
    int rc = DFM_OK;
    int random = !strcmp(c->token_keys, "random");
    if (random) {
        tdim = c->random_dim;
        s->text_keys = c->max_tokens;
        rnd = malloc(sizeof(float) * tdim * c->max_tokens);
        if (!rnd) return DFM_FAIL(DFM_ENOMEM, "audit: no memory for %llu random keys of width %u (%.1f GiB). HINT: a smaller "
                                  "--token-key-dim or --measure-tokens", (unsigned long long)c->max_tokens, tdim,
                                  (double)tdim * 4 * c->max_tokens / 1073741824.0);
        for (uint64_t i = 0; i < c->max_tokens; i++) dfm_audit_key(c->seed + i * 0xD1B54A32D192ED03ull, tdim, rnd + i * tdim);
        tk = rnd;
        snprintf(s->token_keys_desc, sizeof s->token_keys_desc,
                 "RANDOM: seeded pseudo-random unit vectors of width %u (--token-keys random), not hidden states: they do not "
                 "cluster as a decoder's do, so IVF recall and cost differ from a real datastore's", tdim);
    } else {
        DFM_TRY(dfm_hidden_open(c->token_keys, &hf));
        tdim = hf->hdr.dim;
        s->text_keys = hf->hdr.n_keys;
        tk = hf->keys;
        snprintf(s->token_keys_desc, sizeof s->token_keys_desc,
                 "hidden states of a real decoder (%s: backbone weights hash %016llx, width %u, final-normed, forward passes of %u "
                 "tokens; %llu keys from %llu token positions, %llu input tokens outside its vocabulary run as id 0)",
                 c->token_keys, (unsigned long long)hf->hdr.backbone_hash, tdim, hf->hdr.seq_len, (unsigned long long)hf->hdr.n_keys,
                 (unsigned long long)hf->hdr.tokens_read, (unsigned long long)hf->hdr.unseen);
        if ((rc = text_check(c->run, hf, s))) goto done;
    }
    uint64_t N = c->max_tokens < s->text_keys ? c->max_tokens : s->text_keys;
    /* sizes 4x apart, ending at N; those under 1000 keys are dropped */
    for (int i = 0; i < c->sizes; i++) {
        uint64_t n = N;
        for (int j = i; j < c->sizes - 1; j++) n /= 4;
        if (n >= 1000) s->s[s->n++].tokens = n;
    }
    if (s->n < 2) {
        rc = DFM_FAIL(DFM_EARG, "audit: the text holds %llu token keys: fewer than two sizes of at least 1000. HINT: raise "
                      "--measure-tokens or give --token-keys a longer text", (unsigned long long)N);
        goto done;
    }
    uint64_t nc_max = (uint64_t)llround((double)N * c->chunk_keys_per_token);
    uint32_t cdim = 0;
    if ((rc = chunk_keys(c->run, nc_max ? nc_max : 1, c->seed, &ck, &cdim, &s->run_chunks))) goto done;
    uint64_t qcap = c->queries ? c->queries : 1;
    if (!(qidx = malloc(sizeof(uint64_t) * qcap))) {
        rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        goto done;
    }
    DFM_LOG_I("audit: measuring %d sizes up to %llu tokens (token keys: %.80s...)", s->n, (unsigned long long)N, s->token_keys_desc);
    for (int i = 0; i < s->n; i++) {
        dfm_audit_size *z = &s->s[i];
        uint64_t n = z->tokens;
        DFM_LOG_I("audit: size %d/%d: %llu tokens", i + 1, s->n, (unsigned long long)n);
        dfm_audit_point_opts to = {"ivfpq", DFM_METRIC_L2, tdim, c->k_token, c->token_nprobe, c->repeats, c->build_repeats, c->recall_queries, i == s->n - 1};
        uint64_t nq = queries_of(n, c->queries, c->seed, qidx);
        if ((rc = dfm_audit_measure_point(&to, tk, n, qidx, nq, &z->tok))) goto done;
        log_point("token level", &z->tok);
        uint64_t nc = (uint64_t)llround((double)n * c->chunk_keys_per_token);
        if (!nc) nc = 1;
        if (nc > nc_max) nc = nc_max;
        z->chunk_real_keys = nc < s->run_chunks ? nc : s->run_chunks;
        dfm_audit_point_opts co = {c->chunk_index, c->chunk_metric, cdim, c->k_chunk, c->chunk_nprobe, c->repeats, c->build_repeats, c->recall_queries, i == s->n - 1};
        uint64_t nqc = queries_of(nc, c->queries, c->seed ^ 0xc4u, qidx);
        if ((rc = dfm_audit_measure_point(&co, ck, nc, qidx, nqc, &z->chk))) goto done;
        log_point("chunk level", &z->chk);
        /* like for like: the same keys in the token level's index family and rule */
        dfm_audit_point_opts cq = {"ivfpq", c->chunk_metric, cdim, c->k_chunk, c->token_nprobe, c->repeats, c->build_repeats, c->recall_queries, i == s->n - 1};
        if ((rc = dfm_audit_measure_point(&cq, ck, nc, qidx, nqc, &z->chk_pq))) goto done;
        log_point("chunk level, IVF-PQ", &z->chk_pq);
    }
    s->token_dim = tdim;
    s->chunk_dim = cdim;
    if (!rc) dfm_audit_scale_model(s);
done:
    s->wall_s = dfm_now() - t_start;
    getloadavg(s->load_after, 3);
    mallopt(M_MMAP_MAX, 65536);                /* glibc's defaults again for what follows */
    mallopt(M_TRIM_THRESHOLD, 128 * 1024);
    dfm_hidden_close(hf);
    free(rnd);
    free(ck);
    free(qidx);
    return rc;
}
