/* audit_scale_report.c — the scale measurement in audit.json and audit.md, and its extrapolation from the
 * fits (audit_scale.h). */
#include "pipeline/audit/audit_scale.h"

#include "pipeline/audit/audit.h"

#include <math.h>
#include <string.h>

static const char *SIDE[DFM_AUDIT_SIDES] = {"chunk_level", "token_level", "chunk_level_ivfpq"};

void dfm_audit_scale_extrapolate(const dfm_audit_scale *s, double T, dfm_audit_extrap *e) {
    memset(e, 0, sizeof *e);
    e->tokens = T;
    const dfm_audit_size *big = &s->s[s->n - 1];
    for (int i = 0; i < DFM_AUDIT_SIDES; i++) {
        const dfm_audit_point *p = dfm_audit_side_point(big, i);
        e->keys[i] = i == 1 ? T : T * s->cfg.chunk_keys_per_token;
        e->queries[i] = i == 1 ? T : T * s->cfg.chunk_queries_per_token;
        /* a fit that falls with n is noise around a constant: held at the largest measurement */
        e->s_per_query[i] = s->fit_q[i].b < 0 ? p->query_cpu.med : dfm_audit_fit_eval(&s->fit_q[i], T);
        e->search_s[i] = e->queries[i] * e->s_per_query[i];
        /* an index is a fixed part (centroids, codebooks) plus bytes per key: linear from the two largest sizes, which a
         * power law whose exponent is pulled below 1 by the fixed part would understate */
        if (s->n >= 2) {
            const dfm_audit_point *q = dfm_audit_side_point(&s->s[s->n - 2], i);
            double slope = ((double)p->index_bytes - (double)q->index_bytes) / (double)(big->tokens - s->s[s->n - 2].tokens);
            e->index_bytes[i] = (double)p->index_bytes + slope * (T - (double)big->tokens);
            if (e->index_bytes[i] < 1) e->index_bytes[i] = 1;
        } else {
            e->index_bytes[i] = s->fit_bytes[i].b < 0 ? (double)p->index_bytes : dfm_audit_fit_eval(&s->fit_bytes[i], T);
        }
        e->build_s[i] = s->fit_build[i].b < 0 ? p->build_cpu.med : dfm_audit_fit_eval(&s->fit_build[i], T);
    }
}

static json_t *spread_json(const dfm_audit_spread *p) {
    return json_pack("{s:f, s:f, s:f, s:i}", "min", p->min, "median", p->med, "max", p->max, "n", p->n);
}

static json_t *point_json(const dfm_audit_point *p) {
    json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I}", "factory", p->factory, "index_choice", p->why, "keys",
                          (json_int_t)p->keys, "queries", (json_int_t)p->queries, "nlist", (json_int_t)p->nlist, "nprobe", (json_int_t)p->nprobe,
                          "train_keys", (json_int_t)p->train_n, "index_bytes", (json_int_t)p->index_bytes, "results", (json_int_t)p->results,
                          "recall_at_k", p->recall, "recall_queries", (json_int_t)p->recall_queries);
    if (o) {
        json_object_set_new(o, "build_s", spread_json(&p->build_s));
        json_object_set_new(o, "s_per_query", spread_json(&p->query_s));
        json_object_set_new(o, "build_cpu_s", spread_json(&p->build_cpu));
        json_object_set_new(o, "cpu_s_per_query", spread_json(&p->query_cpu));
    }
    return o;
}

static json_t *fit_json(const dfm_audit_fit *f) {
    return json_pack("{s:f, s:f, s:i, s:f, s:f, s:o}", "a", f->a, "b", f->b, "points", f->n, "rms_log10", f->rms_log10, "max_rel_error",
                     f->max_rel, "largest_predicted_rel_error", isnan(f->loo_rel) ? json_null() : json_real(f->loo_rel));
}

json_t *dfm_audit_scale_json(const dfm_audit_scale *s, const double *targets, const char *const *names, int n) {
    const dfm_audit_scale_cfg *c = &s->cfg;
    json_t *J = json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:i, s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:[f,f,f], s:[f,f,f]}",
                          "token_keys", c->token_keys, "token_keys_are", s->token_keys_desc, "text_keys", (json_int_t)s->text_keys,
                          "run_chunk_embeddings", (json_int_t)s->run_chunks, "text_agrees_with_run_tokens", (json_int_t)s->text_agree,
                          "text_differs_at", (json_int_t)s->text_differs_at, "repeats", c->repeats, "build_repeats", c->build_repeats, "queries_per_size", (json_int_t)c->queries,
                          "recall_queries", (json_int_t)c->recall_queries, "token_k", (json_int_t)c->k_token, "chunk_k", (json_int_t)c->k_chunk,
                          "token_nprobe", (json_int_t)c->token_nprobe, "chunk_nprobe", (json_int_t)c->chunk_nprobe, "wall_s", s->wall_s,
                          "chunk_keys_per_token", c->chunk_keys_per_token, "load_average_before", s->load_before[0], s->load_before[1],
                          s->load_before[2], "load_average_after", s->load_after[0], s->load_after[1], s->load_after[2]);
    if (!J) return NULL;
    json_object_set_new(J, "chunk_queries_per_token", json_real(c->chunk_queries_per_token));
    json_t *sizes = json_array();
    for (int i = 0; i < s->n; i++) {
        json_t *z = json_pack("{s:I, s:I}", "tokens", (json_int_t)s->s[i].tokens, "chunk_real_keys", (json_int_t)s->s[i].chunk_real_keys);
        json_object_set_new(z, "chunk_level", point_json(&s->s[i].chk));
        json_object_set_new(z, "token_level", point_json(&s->s[i].tok));
        json_object_set_new(z, "chunk_level_ivfpq", point_json(&s->s[i].chk_pq));
        json_array_append_new(sizes, z);
    }
    json_object_set_new(J, "sizes", sizes);
    json_t *fits = json_object();
    for (int i = 0; i < DFM_AUDIT_SIDES; i++)
        json_object_set_new(fits, SIDE[i], json_pack("{s:o, s:o, s:o}", "s_per_query", fit_json(&s->fit_q[i]), "index_bytes",
                                                     fit_json(&s->fit_bytes[i]), "build_s", fit_json(&s->fit_build[i])));
    json_object_set_new(J, "fits", fits);
    json_t *ex = json_array();
    for (int t = 0; t < n; t++) {
        dfm_audit_extrap e;
        dfm_audit_scale_extrapolate(s, targets[t], &e);
        json_t *o = json_pack("{s:s, s:f, s:f}", "name", names[t], "tokens", e.tokens, "beyond_largest_measured",
                              e.tokens / (double)s->s[s->n - 1].tokens);
        for (int i = 0; i < DFM_AUDIT_SIDES; i++)
            json_object_set_new(o, SIDE[i], json_pack("{s:f, s:f, s:f, s:f, s:f, s:f}", "keys", e.keys[i], "queries", e.queries[i], "s_per_query",
                                                      e.s_per_query[i], "search_s", e.search_s[i], "index_bytes", e.index_bytes[i], "build_s",
                                                      e.build_s[i]));
        json_object_set_new(o, "savings", json_pack("{s:f, s:f, s:f}", "search_s", 1 - e.search_s[0] / e.search_s[1], "index_bytes",
                                                    1 - e.index_bytes[0] / e.index_bytes[1], "build_s", 1 - e.build_s[0] / e.build_s[1]));
        json_object_set_new(o, "savings_ivfpq", json_pack("{s:f, s:f, s:f}", "search_s", 1 - e.search_s[2] / e.search_s[1], "index_bytes",
                                                          1 - e.index_bytes[2] / e.index_bytes[1], "build_s", 1 - e.build_s[2] / e.build_s[1]));
        json_array_append_new(ex, o);
    }
    json_object_set_new(J, "extrapolated", ex);
    return J;
}

/* ---- audit.md ------------------------------------------------------------------------------------ */

static const char *secs(double s, char *b) { return dfm_audit_secs(s, b, 32); }
static const char *bytes(double v, char *b) { return dfm_audit_bytes(v, b, 32); }
/* "min / median / max" of seconds, one unit for the three */
static const char *spread_ms(const dfm_audit_spread *p, char *b) {
    snprintf(b, 96, "%.3g / %.3g / %.3g", p->min * 1e3, p->med * 1e3, p->max * 1e3);
    return b;
}
static const char *spread_s(const dfm_audit_spread *p, char *b) {
    snprintf(b, 96, "%.3g / %.3g / %.3g", p->min, p->med, p->max);
    return b;
}
static const char *pct_err(double r, char *b) {
    if (isnan(r)) snprintf(b, 32, "—");
    else snprintf(b, 32, "%+.0f %%", 100 * r);
    return b;
}

static void md_fit_row(FILE *mf, const char *what, const char *side, const dfm_audit_fit *f, const char *unit) {
    char e1[32];
    fprintf(mf, "| %s | %s | %.3g · n^%.3f %s%s | ±%.0f %% | %.0f %% | %s |\n", what, side, f->a, f->b, unit,
            f->b < 0 ? " (falls with n: noise; extrapolated as constant)" : "", 100 * (pow(10, f->rms_log10) - 1), 100 * f->max_rel, pct_err(f->loo_rel, e1));
}

void dfm_audit_scale_md(FILE *mf, const dfm_audit_scale *s, const char *cpu, int threads, const double *targets, const char *const *names,
                        int n) {
    const dfm_audit_scale_cfg *c = &s->cfg;
    char b1[96], b2[96], b3[96], b4[96];
    uint64_t big = s->s[s->n - 1].tokens;
    fprintf(mf, "## Measured at scale\n\n");
    fprintf(mf, "Both datastores over the first n tokens of the same text, n from %llu to %llu (×4 apart), built and searched one "
                "after the other in one run of `dfm audit --measure-tokens %llu`, on %s with %d OpenMP thread(s) for both sides; "
                "load average %.2f / %.2f / %.2f (1/5/15 min) before and %.2f / %.2f / %.2f after; %s in all. Each build is repeated %d "
                "time(s) and each pass over the queries %d times: figures are min / median / max. Times are given as process CPU seconds "
                "(the work done: with one thread it equals the wall time on an idle machine) and as wall seconds (which include waiting "
                "for other processes on a loaded machine); the fits and extrapolations use the CPU medians.\n\n",
            (unsigned long long)s->s[0].tokens, (unsigned long long)big, (unsigned long long)c->max_tokens, cpu, threads, s->load_before[0],
            s->load_before[1], s->load_before[2], s->load_after[0], s->load_after[1], s->load_after[2], secs(s->wall_s, b1), c->build_repeats, c->repeats);
    if (c->max_tokens > big * 4 / 3 + 1 || c->max_tokens > s->text_keys)
        fprintf(mf, "**The text holds %llu token keys, fewer than the %llu asked for**: the largest size is %llu.\n\n",
                (unsigned long long)s->text_keys, (unsigned long long)c->max_tokens, (unsigned long long)big);
    fprintf(mf, "- **Token-level keys**: %s. Index: IVF-PQ as kNN-LM and Memory Decoder use, scaled to each size (the lists "
                "and code size per row below), L2, k = %u, nprobe %lld (capped at the lists).\n",
            s->token_keys_desc, c->k_token, (long long)c->token_nprobe);
    if (strcmp(c->token_keys, "random")) {
        if (s->text_differs_at < 0)
            fprintf(mf, "- **Same text**: the hidden states' next-token values equal the run's own tokens over the first %llu tokens "
                        "(the run's whole corpus when that is all of it); beyond them the text continues past the run's corpus.\n",
                    (unsigned long long)s->text_agree);
        else
            fprintf(mf, "- **Not the same text**: the hidden states' next-token values differ from the run's tokens at token %lld "
                        "(after %llu agreeing).\n",
                    (long long)s->text_differs_at, (unsigned long long)s->text_agree);
    }
    fprintf(mf, "- **Chunk-level keys**: the run's encoder embeddings (%llu, one per chunk; %.5f keys and %.5f queries per token as in "
                "the run); where a size needs more chunks than the run holds, the rest are seeded random unit vectors (the *real* "
                "column). Index: the run's (`%s`, chosen for each size as `dfm index` would), k = K + margin = %u, nprobe %lld; and, like "
                "for like, the same keys in the token level's family and rule (IVF-PQ, lists ~√keys, 4 dims per code byte, nprobe as the "
                "token level): *chunk, IVF-PQ*.\n",
            (unsigned long long)s->run_chunks, c->chunk_keys_per_token, c->chunk_queries_per_token, c->chunk_index, c->k_chunk,
            (long long)c->chunk_nprobe);
    fprintf(mf, "- Queries: %llu per size and side (all keys when fewer), drawn evenly over the datastore; recall@k is the share "
                "of the exact top-k (Flat search) that the index returns, over %llu of them.\n\n",
            (unsigned long long)c->queries, (unsigned long long)c->recall_queries);
    fprintf(mf, "| tokens | side | keys (real) | index | build, CPU s (min / med / max) | build, wall s (med) | per query, CPU ms (min / med / max) "
                "| per query, wall ms (med) | index size | recall@k |\n|---:|---|---:|---|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < s->n; i++) {
        const dfm_audit_size *z = &s->s[i];
        static const int order[DFM_AUDIT_SIDES] = {1, 0, 2};
        for (int o = 0; o < DFM_AUDIT_SIDES; o++) {
            int side = order[o];
            const dfm_audit_point *p = dfm_audit_side_point(z, side);
            char keys[64];
            if (side == 1) snprintf(keys, sizeof keys, "%llu", (unsigned long long)p->keys);
            else snprintf(keys, sizeof keys, "%llu (%llu)", (unsigned long long)p->keys, (unsigned long long)z->chunk_real_keys);
            char idx[300];
            snprintf(idx, sizeof idx, "`%s`%s", p->factory, p->nlist ? "" : "");
            if (p->nlist) snprintf(idx + strlen(idx), sizeof idx - strlen(idx), " nprobe %lld", (long long)p->nprobe);
            fprintf(mf, "| %s | %s | %s | %s | %s | %.3g | %s | %.3g | %s | %.3f |\n", side == 1 ? dfm_audit_human((double)z->tokens, b4, 32) : "",
                    side == 1 ? "token" : side ? "chunk, IVF-PQ" : "chunk, run's index", keys, idx, spread_s(&p->build_cpu, b1), p->build_s.med, spread_ms(&p->query_cpu, b2),
                    p->query_s.med * 1e3, bytes((double)p->index_bytes, b3), p->recall);
        }
    }
    fprintf(mf, "\nAt each size, for all queries of that text (token level: one per token; chunk level: the run's rate), CPU seconds:\n\n"
                "| tokens | search, token | search, chunk (run's index) | saving | search, chunk (IVF-PQ) | saving | index, token | index, chunk (run's) | saving | index, chunk (IVF-PQ) | saving |\n"
                "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < s->n; i++) {
        const dfm_audit_size *z = &s->s[i];
        double qc = (double)z->tokens * c->chunk_queries_per_token, qt = (double)z->tokens;
        double sc = qc * z->chk.query_cpu.med, st = qt * z->tok.query_cpu.med, sp = qc * z->chk_pq.query_cpu.med;
        double bc = (double)z->chk.index_bytes, bt = (double)z->tok.index_bytes, bp = (double)z->chk_pq.index_bytes;
        char e1[32], e2[32], e3[32], f1[32], f2[32], f3[32];
        fprintf(mf, "| %s | %s | %s | %.3f %% | %s | %.3f %% | %s | %s | %.3f %% | %s | %.3f %% |\n", dfm_audit_human((double)z->tokens, b4, 32),
                secs(st, e1), secs(sc, e2), 100 * (1 - sc / st), secs(sp, e3), 100 * (1 - sp / st), bytes(bt, f1), bytes(bc, f2), 100 * (1 - bc / bt),
                bytes(bp, f3), 100 * (1 - bp / bt));
    }
    fprintf(mf, "\n### Growth fits\n\nEach quantity fitted as a·n^b by least squares on log-log axes over the %d sizes (n in tokens). "
                "*Fit error* is the RMS residual as a factor; *worst point* the largest deviation of the fit from a measurement; "
                "*largest predicted* fits the smaller sizes only and predicts the largest measurement: an honest test of "
                "extrapolating one step (×4).\n\n"
                "| quantity | side | fit | fit error | worst point | largest predicted |\n|---|---|---|---:|---:|---:|\n",
            s->n);
    md_fit_row(mf, "CPU seconds per query (median)", "token", &s->fit_q[1], "s");
    md_fit_row(mf, "CPU seconds per query (median)", "chunk, run's index", &s->fit_q[0], "s");
    md_fit_row(mf, "CPU seconds per query (median)", "chunk, IVF-PQ", &s->fit_q[2], "s");
    md_fit_row(mf, "index bytes", "token", &s->fit_bytes[1], "B");
    md_fit_row(mf, "index bytes", "chunk, run's index", &s->fit_bytes[0], "B");
    md_fit_row(mf, "index bytes", "chunk, IVF-PQ", &s->fit_bytes[2], "B");
    md_fit_row(mf, "build CPU seconds (median)", "token", &s->fit_build[1], "s");
    md_fit_row(mf, "build CPU seconds (median)", "chunk, run's index", &s->fit_build[0], "s");
    md_fit_row(mf, "build CPU seconds (median)", "chunk, IVF-PQ", &s->fit_build[2], "s");
    fprintf(mf, "\n### Extrapolated from the fits\n\nTimes from the power-law fits; index sizes linearly from the two largest "
                "sizes (an index is a fixed part, centroids and codebooks, plus bytes per key: where the fixed part still weighs, the "
                "power law's exponent falls below 1 and would understate a large index). The savings compare each chunk-level column with the token level. *Run's index* "
                "is the family the run used, carried on as if kept at any size; *IVF-PQ* is the chunk-level keys in the token level's "
                "own family and rule: like for like.\n\n"
                "| corpus | | token level | chunk, run's index | saving | chunk, IVF-PQ | saving |\n|---|---|---:|---:|---:|---:|---:|\n");
    for (int t = 0; t < n; t++) {
        dfm_audit_extrap e;
        dfm_audit_scale_extrapolate(s, targets[t], &e);
        char nm[96], c1[32], c2[32], c3[32];
        snprintf(nm, sizeof nm, "%s (%s tokens, %.3g× the largest measured)", names[t], dfm_audit_human(e.tokens, b4, 32), e.tokens / (double)big);
        fprintf(mf, "| %s | per query | %s | %s | | %s | |\n", nm, secs(e.s_per_query[1], c1), secs(e.s_per_query[0], c2), secs(e.s_per_query[2], c3));
        fprintf(mf, "| | search, all queries | %s | %s | %.3f %% | %s | %.3f %% |\n", secs(e.search_s[1], c1), secs(e.search_s[0], c2),
                100 * (1 - e.search_s[0] / e.search_s[1]), secs(e.search_s[2], c3), 100 * (1 - e.search_s[2] / e.search_s[1]));
        fprintf(mf, "| | index size | %s | %s | %.3f %% | %s | %.3f %% |\n", bytes(e.index_bytes[1], c1), bytes(e.index_bytes[0], c2),
                100 * (1 - e.index_bytes[0] / e.index_bytes[1]), bytes(e.index_bytes[2], c3), 100 * (1 - e.index_bytes[2] / e.index_bytes[1]));
        fprintf(mf, "| | build | %s | %s | %.3f %% | %s | %.3f %% |\n", secs(e.build_s[1], c1), secs(e.build_s[0], c2),
                100 * (1 - e.build_s[0] / e.build_s[1]), secs(e.build_s[2], c3), 100 * (1 - e.build_s[2] / e.build_s[1]));
        (void)b1, (void)b2, (void)b3;
    }
    fprintf(mf, "\nHow far to trust this: the fit errors above hold over the measured range; beyond it they grow with the "
                "extrapolation factor (the *largest predicted* column is the error of a single ×4 step). The index families change "
                "with size in practice (a chunk-level Flat index becomes IVF past %llu vectors, which flattens its per-query cost; "
                "the token-level lists grow as √n here), so extrapolating a single power law over decades is an order-of-magnitude "
                "estimate, not a measurement. The token-level figures also leave out the decoder's forward pass over the whole corpus "
                "that computes the keys.\n\n",
            DFM_INDEX_FLAT_MAX);
}
