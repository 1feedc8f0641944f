/* audit_scale_report.c — the "Measured at scale" section of audit.md: the sizes measured, the cost model with its
 * validation, and the extrapolations with their bands, in words that cannot contradict themselves (audit_scale.h). */
#include "pipeline/audit/audit_scale.h"

#include "pipeline/audit/audit.h"

#include <math.h>
#include <string.h>

static const char *NAME[DFM_AUDIT_SIDES] = {"chunk, run's index", "token", "chunk, IVF-PQ"};

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
/* a saving in words, "—" when a side has no figure */
static const char *saving(double chunk, double token, char *b) {
    if (!(chunk > 0) || !(token > 0)) snprintf(b, 48, "—");
    else dfm_audit_saving_words(1 - chunk / token, 3, "less", b, 48);
    return b;
}

/* a model figure with its band: "527 days (69 days – 11 years)"; "—" without a model */
static const char *banded(double v, double band, int is_bytes, char *b) {
    char x[32], lo[32], hi[32];
    if (!isfinite(v)) snprintf(b, 112, "—");
    else if (is_bytes) snprintf(b, 112, "%s", dfm_audit_bytes(v, x, 32));
    else snprintf(b, 112, "%s (%s – %s)", dfm_audit_secs(v, x, 32), dfm_audit_secs(v / band, lo, 32), dfm_audit_secs(v * band, hi, 32));
    return b;
}

static const char *verdict(int valid) { return valid > 0 ? "within 25 %" : valid == 0 ? "**outside 25 %: not validated**" : "not done (fewer than 3 sizes)"; }

static void md_model_rows(FILE *mf, const dfm_audit_scale *s) {
    fprintf(mf, "\n### The cost model, and its validation\n\n"
                "Index bytes are the index's layout (codes, ids, centroids, PQ codebooks, list sizes: `pipeline/audit/audit_layout.h`), "
                "exact arithmetic over FAISS's serialisation. Search CPU seconds per query = a fixed cost + r · operations, where the "
                "operations are counted from the layout (coarse distances to the lists' centroids, the codes scanned in nprobe lists of "
                "n/nlist, the PQ distance tables, full-vector distances for Flat, the k-selection); build CPU seconds = a fixed cost + r · "
                "(k-means flops on the training keys + flops of assigning and encoding every key). The fixed cost and the rate of each are "
                "fitted by non-negative least squares on the measured sizes. *Validation*: the rates fitted on the smaller sizes alone predict "
                "the largest measured size; the error is printed, and a model is called validated within %.0f %%.\n\n"
                "| side | family | sizes | layout vs serialised bytes | search: fixed s per query; s per operation | search: largest predicted | "
                "build: fixed s; s per operation | build: largest predicted |\n|---|---|---:|---:|---:|---:|---:|---:|\n",
            100 * DFM_AUDIT_VALID_MAX);
    static const int order[DFM_AUDIT_SIDES] = {1, 0, 2};
    for (int o = 0; o < DFM_AUDIT_SIDES; o++) {
        const dfm_audit_side_model *m = &s->model[order[o]];
        if (!m->ok) {
            fprintf(mf, "| %s | — | %d | — | no model: %s | | | |\n", NAME[order[o]], m->sizes, m->why);
            continue;
        }
        fprintf(mf, "| %s | %s | %d | max %.2g %% off | %.3g; %.3g | %+.1f %%, %s | %.3g; %.3g | %+.1f %%, %s |\n", NAME[order[o]],
                dfm_audit_family_name(m->family), m->sizes, 100 * m->bytes_err, m->search.rate[0], m->search.rate[1], 100 * m->search_err,
                verdict(m->search_valid), m->build.rate[0], m->build.rate[1], 100 * m->build_err, verdict(m->build_valid));
    }
    /* the operation-mix check: one rate for flops and look-ups alike holds only if the mix does not matter */
    int any = 0;
    for (int o = 0; o < DFM_AUDIT_SIDES; o++) any |= !isnan(s->model[order[o]].mix_err);
    if (!any) return;
    fprintf(mf, "\n*The operation mix.* One rate prices a flop and a code look-up alike. At the largest size each IVF side is also "
                "searched visiting %d× the lists, which multiplies the codes scanned and the per-list tables and leaves the coarse "
                "distances as they were: the mix of operations moves (the table below gives the look-ups' share there; the extrapolation "
                "table, at each corpus size), and the rates fitted at the run's nprobe must predict that search too.\n\n"
                "| side | look-ups' share at nprobe | at %d× nprobe | predicted there |\n|---|---:|---:|---:|\n",
            DFM_AUDIT_WIDE_PROBES, DFM_AUDIT_WIDE_PROBES);
    for (int o = 0; o < DFM_AUDIT_SIDES; o++) {
        const dfm_audit_side_model *m = &s->model[order[o]];
        if (isnan(m->mix_err)) continue;
        fprintf(mf, "| %s | %.0f %% | %.0f %% (nprobe %lld) | %+.1f %%, %s |\n", NAME[order[o]], 100 * m->codes_share, 100 * m->mix_codes_share,
                (long long)m->mix_nprobe, 100 * m->mix_err, verdict(fabs(m->mix_err) <= DFM_AUDIT_VALID_MAX));
    }
}

static const char *share(double v, char *b) {
    if (isnan(v)) snprintf(b, 112, "—");
    else snprintf(b, 112, "%.0f %%", 100 * v);
    return b;
}

/* why a chunk-level figure exceeds the token level's: fewer items, each dearer */
static void why_more(FILE *mf, const char *what, const char *items, double nc, double nt, double per_c, double per_t, const char *unit,
                     const char *fc, const char *ft) {
    fprintf(mf, "- *%s is more* at chunk level: it has %.3g× fewer %s than the token level, but each costs %.3g× as much (%.3g against %.3g %s; "
                "`%s` against `%s`).\n",
            what, nt / nc, items, per_c / per_t, per_c, per_t, unit, fc, ft);
}

static void md_extrapolated(FILE *mf, const dfm_audit_scale *s, const double *targets, const char *const *names, int n) {
    char nm[160], h[32], v1[112], v2[112], v3[112], w1[48], w2[48];
    uint64_t big = s->s[s->n - 1].tokens;
    fprintf(mf, "\n### Extrapolated from the cost model\n\n"
                "At each corpus size every side gets the index it would have there (token level and *chunk, IVF-PQ*: the IVF-PQ "
                "rule; *run's index*: `dfm index`'s choice on one rank with its default --index-memory), its bytes from the layout, "
                "and its times from its operation counts times the rates of a side measured in the same family. Times are given with "
                "their band: the one-step (×%.0f) validation error, but at least %.0f %% (what a validated model is trusted to), "
                "compounded per step beyond the largest measured size; 100 %% a step where no validation could be done (fewer than "
                "three sizes) or the rates were carried to a family nobody measured. "
                "Beyond %.0f× the largest measured size (%s tokens) the figures are a model only, never a measurement.\n\n"
                "| corpus | | token level | chunk, run's index | saving | chunk, IVF-PQ | saving (like for like) |\n"
                "|---|---|---:|---:|---:|---:|---:|\n",
            s->n >= 2 ? (double)big / (double)s->s[s->n - 2].tokens : 4.0, 100 * DFM_AUDIT_BAND_FLOOR, DFM_AUDIT_DEFENSIBLE,
            dfm_audit_human((double)big, h, sizeof h));
    for (int t = 0; t < n; t++) {
        dfm_audit_extrap e;
        dfm_audit_scale_extrapolate(s, targets[t], &e);
        snprintf(nm, sizeof nm, "%s (%s tokens, %.3g× the largest measured%s)", names[t], dfm_audit_human(e.tokens, h, sizeof h), e.beyond,
                 e.beyond > DFM_AUDIT_DEFENSIBLE ? ": **model only**" : "");
        fprintf(mf, "| %s | index | `%s` | `%s` | | `%s` | |\n", nm, e.factory[1][0] ? e.factory[1] : "—", e.factory[0][0] ? e.factory[0] : "—",
                e.factory[2][0] ? e.factory[2] : "— (too few keys for IVF-PQ)");
        fprintf(mf, "| | index size (layout) | %s | %s | %s | %s | %s |\n", banded(e.index_bytes[1], 1, 1, v1), banded(e.index_bytes[0], 1, 1, v2),
                saving(e.index_bytes[0], e.index_bytes[1], w1), banded(e.index_bytes[2], 1, 1, v3), saving(e.index_bytes[2], e.index_bytes[1], w2));
        fprintf(mf, "| | search, all queries, CPU | %s | %s | %s | %s | %s |\n", banded(e.search_s[1], e.search_band[1], 0, v1),
                banded(e.search_s[0], e.search_band[0], 0, v2), saving(e.search_s[0], e.search_s[1], w1), banded(e.search_s[2], e.search_band[2], 0, v3),
                saving(e.search_s[2], e.search_s[1], w2));
        fprintf(mf, "| | build, CPU | %s | %s | %s | %s | %s |\n", banded(e.build_s[1], e.build_band[1], 0, v1), banded(e.build_s[0], e.build_band[0], 0, v2),
                saving(e.build_s[0], e.build_s[1], w1), banded(e.build_s[2], e.build_band[2], 0, v3), saving(e.build_s[2], e.build_s[1], w2));
        fprintf(mf, "| | look-ups' share of a query's operations | %s | %s | | %s | |\n", share(e.codes_share[1], v1), share(e.codes_share[0], v2),
                share(e.codes_share[2], v3));
    }
    fprintf(mf, "\n");
    for (int t = 0; t < n; t++) {
        dfm_audit_extrap e;
        dfm_audit_scale_extrapolate(s, targets[t], &e);
        for (int c = 0; c <= 2; c += 2) {
            if (!e.ok[c] || !e.ok[1]) continue;
            if (e.carried[c])
                fprintf(mf, "- %s, *%s*: no side was measured in `%s`'s family; the rates of the %s side's `%s` were carried over, not "
                            "validated for it (band: 100 %% a step).\n",
                        names[t], NAME[c], e.factory[c], NAME[e.rates_side[c]], s->s[s->n - 1].chk.factory);
            else if (e.rates_side[c] != c)
                fprintf(mf, "- %s, *%s*: `%s` was not measured on this side; priced with the rates the %s side measured in the same family.\n",
                        names[t], NAME[c], e.factory[c], NAME[e.rates_side[c]]);
            if (e.index_bytes[c] > e.index_bytes[1])
                why_more(mf, "Index size", "keys", e.keys[c], e.keys[1], e.index_bytes[c] / e.keys[c], e.index_bytes[1] / e.keys[1], "bytes a key",
                         e.factory[c], e.factory[1]);
            if (e.search_s[c] > e.search_s[1])
                why_more(mf, "Search time", "queries", e.queries[c], e.queries[1], e.s_per_query[c], e.s_per_query[1], "s a query", e.factory[c],
                         e.factory[1]);
            if (e.build_s[c] > e.build_s[1])
                why_more(mf, "Build time", "keys", e.keys[c], e.keys[1], e.build_s[c] / e.keys[c], e.build_s[1] / e.keys[1], "s a key",
                         e.factory[c], e.factory[1]);
        }
    }
    fprintf(mf, "\nThe token-level figures leave out the decoder's forward pass over the whole corpus that computes its keys.\n\n");
}

void dfm_audit_scale_md(FILE *mf, const dfm_audit_scale *s, const char *cpu, int threads, const double *targets, const char *const *names,
                        int n) {
    const dfm_audit_scale_cfg *c = &s->cfg;
    char b1[96], b2[96], b3[96], b4[96], b5[96];
    uint64_t big = s->s[s->n - 1].tokens;
    fprintf(mf, "## Measured at scale\n\n");
    fprintf(mf, "Both datastores over the first n tokens of the same text, n from %llu to %llu (×4 apart), built and searched one "
                "after the other in one run of `dfm audit --measure-tokens %llu`, on %s with %d OpenMP thread(s) for both sides; "
                "load average %.2f / %.2f / %.2f (1/5/15 min) before and %.2f / %.2f / %.2f after; %s in all. Each build is repeated %d "
                "time(s) and each pass over the queries %d times: figures are min / median / max. Times are given as process CPU seconds "
                "(the work done: with one thread it equals the wall time on an idle machine) and as wall seconds (which include waiting "
                "for other processes on a loaded machine); the cost model uses the CPU medians.\n\n",
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
                "for like, the same keys in the token level's family and rule (IVF-PQ, lists ~√keys, nprobe as the token level): "
                "*chunk, IVF-PQ* — not measured at a size with fewer than 1000 chunk keys, too few to train it (no Flat index is "
                "labelled IVF-PQ).\n",
            (unsigned long long)s->run_chunks, c->chunk_keys_per_token, c->chunk_queries_per_token, c->chunk_index, c->k_chunk,
            (long long)c->chunk_nprobe);
    fprintf(mf, "- Queries: %llu per size and side in one batch, drawn evenly over the datastore (repeated in order when it holds fewer keys: "
                "a search's cost per query depends on how many one call holds); recall@k is the share "
                "of the exact top-k (Flat search) that the index returns, over %llu of them.\n\n",
            (unsigned long long)c->queries, (unsigned long long)c->recall_queries);
    fprintf(mf, "| tokens | side | keys (real) | index | build, CPU s (min / med / max) | build, wall s (med) | per query, CPU ms (min / med / max) "
                "| per query, wall ms (med) | index size (layout) | recall@k |\n|---:|---|---:|---|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < s->n; i++) {
        const dfm_audit_size *z = &s->s[i];
        static const int order[DFM_AUDIT_SIDES] = {1, 0, 2};
        for (int o = 0; o < DFM_AUDIT_SIDES; o++) {
            int side = order[o];
            const dfm_audit_point *p = dfm_audit_side_point(z, side);
            char keys[64];
            if (side == 1) snprintf(keys, sizeof keys, "%llu", (unsigned long long)p->keys);
            else snprintf(keys, sizeof keys, "%llu (%llu)", (unsigned long long)p->keys, (unsigned long long)z->chunk_real_keys);
            const char *tok = side == 1 ? dfm_audit_human((double)z->tokens, b4, 32) : "";
            if (p->skipped) {
                fprintf(mf, "| %s | %s | %s | not measured: %s | | | | | | |\n", tok, NAME[side], keys, p->why);
                continue;
            }
            char idx[300];
            snprintf(idx, sizeof idx, "`%s`", p->factory);
            if (p->nlist) snprintf(idx + strlen(idx), sizeof idx - strlen(idx), " nprobe %lld", (long long)p->nprobe);
            snprintf(b5, sizeof b5, "%s", bytes((double)p->index_bytes, b3));
            if (isfinite(p->layout_bytes)) snprintf(b5 + strlen(b5), sizeof b5 - strlen(b5), " (%s)", p->layout_bytes == (double)p->index_bytes ? "exact" : "differs");
            fprintf(mf, "| %s | %s | %s | %s | %s | %.3g | %s | %.3g | %s | %.3f |\n", tok, NAME[side], keys, idx, spread_s(&p->build_cpu, b1),
                    p->build_s.med, spread_ms(&p->query_cpu, b2), p->query_s.med * 1e3, b5, p->recall);
        }
    }
    fprintf(mf, "\nAt each size, for all queries of that text (token level: one per token; chunk level: the run's rate), CPU seconds:\n\n"
                "| tokens | search, token | search, chunk (run's index) | saving | search, chunk (IVF-PQ) | saving | index, token | index, chunk (run's) | saving | index, chunk (IVF-PQ) | saving |\n"
                "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < s->n; i++) {
        const dfm_audit_size *z = &s->s[i];
        double qc = (double)z->tokens * c->chunk_queries_per_token, qt = (double)z->tokens;
        double sc = qc * z->chk.query_cpu.med, st = qt * z->tok.query_cpu.med, sp = z->chk_pq.skipped ? NAN : qc * z->chk_pq.query_cpu.med;
        double bc = (double)z->chk.index_bytes, bt = (double)z->tok.index_bytes, bp = z->chk_pq.skipped ? NAN : (double)z->chk_pq.index_bytes;
        char e1[32], e2[32], e3[32], f1[32], f2[32], f3[32], w[4][48];
        fprintf(mf, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", dfm_audit_human((double)z->tokens, b4, 32), secs(st, e1), secs(sc, e2),
                saving(sc, st, w[0]), isfinite(sp) ? secs(sp, e3) : "not measured", saving(sp, st, w[1]), bytes(bt, f1), bytes(bc, f2),
                saving(bc, bt, w[2]), isfinite(bp) ? bytes(bp, f3) : "not measured", saving(bp, bt, w[3]));
    }
    md_model_rows(mf, s);
    md_extrapolated(mf, s, targets, names, n);
}

/* ---- audit.svg's growth panels ---------------------------------------------------------------------- */

void dfm_audit_scale_panels(const dfm_audit_scale *s, double x_hi, dfm_audit_panel panels[3], dfm_audit_range *r) {
    memset(panels, 0, 3 * sizeof *panels);
    panels[0] = (dfm_audit_panel){"search time, all queries", "CPU seconds (a query per token / per chunk)", {{0}}};
    panels[1] = (dfm_audit_panel){"build time (train + add)", "CPU seconds", {{0}}};
    panels[2] = (dfm_audit_panel){"index size", "bytes (layout arithmetic)", {{0}}};
    double lo = (double)s->s[0].tokens, big = (double)s->s[s->n - 1].tokens;
    if (!(x_hi > big)) x_hi = big * 10;
    *r = (dfm_audit_range){lo, big, big * DFM_AUDIT_DEFENSIBLE, x_hi};
    for (int side = 0; side < DFM_AUDIT_SIDES; side++) {
        double rate = side == 1 ? 1.0 : s->cfg.chunk_queries_per_token;
        for (int i = 0; i < s->n; i++) {
            const dfm_audit_point *pt = dfm_audit_side_point(&s->s[i], side);
            if (pt->skipped) continue;
            double n = (double)s->s[i].tokens;
            for (int p = 0; p < 3; p++) panels[p].side[side].x[panels[p].side[side].n] = n;
            panels[0].side[side].y[panels[0].side[side].n++] = n * rate * pt->query_cpu.med;
            panels[1].side[side].y[panels[1].side[side].n++] = pt->build_cpu.med;
            panels[2].side[side].y[panels[2].side[side].n++] = (double)pt->index_bytes;
        }
        /* the model: a quarter of the samples over the measured range, the rest beyond, log-spaced */
        const int in = DFM_AUDIT_CURVE / 4;
        for (int j = 0; j < DFM_AUDIT_CURVE; j++) {
            double x = j < in ? lo * pow(big / lo, (double)j / (in - 1)) : big * pow(x_hi / big, (double)(j - in + 1) / (DFM_AUDIT_CURVE - in));
            dfm_audit_extrap e;
            dfm_audit_scale_extrapolate(s, x, &e);
            if (!e.ok[side]) continue;
            const double v[3] = {e.search_s[side], e.build_s[side], e.index_bytes[side]}, band[3] = {e.search_band[side], e.build_band[side], 1};
            for (int p = 0; p < 3; p++) {
                dfm_audit_series *sr = &panels[p].side[side];
                if (!(v[p] > 0)) continue;
                sr->mx[sr->m] = x, sr->my[sr->m] = v[p], sr->lo[sr->m] = v[p] / band[p], sr->hi[sr->m] = v[p] * band[p];
                sr->m++;
            }
        }
    }
}
