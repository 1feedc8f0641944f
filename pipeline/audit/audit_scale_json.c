/* audit_scale_json.c — the "scale" object of audit.json: the measured sizes, the cost model with its validation,
 * and the extrapolations with their bands (audit_scale.h, schemas/audit.md). */
#include "pipeline/audit/audit_scale.h"

#include <math.h>
#include <string.h>

static const char *SIDE[DFM_AUDIT_SIDES] = {"chunk_level", "token_level", "chunk_level_ivfpq"};

/* a number, or null when it is not one (NAN: not measured, no model) */
static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *spread_json(const dfm_audit_spread *p) {
    return json_pack("{s:f, s:f, s:f, s:i}", "min", p->min, "median", p->med, "max", p->max, "n", p->n);
}

static json_t *point_json(const dfm_audit_point *p) {
    if (p->skipped) return json_pack("{s:b, s:I, s:s}", "skipped", 1, "keys", (json_int_t)p->keys, "why", p->why);
    json_t *o = json_pack("{s:b, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I}", "skipped", 0, "factory", p->factory, "index_choice",
                          p->why, "keys", (json_int_t)p->keys, "queries", (json_int_t)p->queries, "nlist", (json_int_t)p->nlist, "nprobe",
                          (json_int_t)p->nprobe, "train_keys", (json_int_t)p->train_n, "index_bytes", (json_int_t)p->index_bytes, "results",
                          (json_int_t)p->results, "recall_at_k", p->recall, "recall_queries", (json_int_t)p->recall_queries);
    if (o) {
        json_object_set_new(o, "layout_bytes", num(p->layout_bytes));
        json_object_set_new(o, "build_s", spread_json(&p->build_s));
        json_object_set_new(o, "s_per_query", spread_json(&p->query_s));
        json_object_set_new(o, "build_cpu_s", spread_json(&p->build_cpu));
        json_object_set_new(o, "cpu_s_per_query", spread_json(&p->query_cpu));
        json_object_set_new(o, "builds_timed", json_integer((json_int_t)p->build_passes));
        if (p->wide_nprobe) {
            json_object_set_new(o, "wide_nprobe", json_integer((json_int_t)p->wide_nprobe));
            json_object_set_new(o, "wide_cpu_s_per_query", spread_json(&p->wide_query_cpu));
        }
        json_object_set_new(o, "search_passes_timed", json_integer((json_int_t)p->search_passes));
    }
    return o;
}

static json_t *rates_json(const dfm_audit_rates *r, const char *r0, const char *r1, double err, int valid) {
    json_t *o = json_pack("{s:f, s:f, s:i, s:f}", r0, r->rate[0], r1, r->rate[1], "points", r->points, "max_rel_error", r->max_rel);
    if (o) {
        json_object_set_new(o, "largest_predicted_rel_error", num(err));
        json_object_set_new(o, "validated", valid < 0 ? json_null() : json_boolean(valid));
    }
    return o;
}

static json_t *model_json(const dfm_audit_side_model *m) {
    if (!m->ok) return json_pack("{s:b, s:i, s:s}", "ok", 0, "sizes", m->sizes, "why", m->why);
    json_t *o = json_pack("{s:b, s:s, s:i, s:f}", "ok", 1, "family", dfm_audit_family_name(m->family), "sizes", m->sizes,
                          "layout_max_rel_error", m->bytes_err);
    if (o) {
        json_object_set_new(o, "search", rates_json(&m->search, "fixed_s_per_query", "s_per_operation", m->search_err, m->search_valid));
        json_object_set_new(o, "build", rates_json(&m->build, "fixed_s", "s_per_operation", m->build_err, m->build_valid));
        json_object_set_new(o, "codes_share", num(m->codes_share));
        json_object_set_new(o, "operation_mix_check",
                            isnan(m->mix_err) ? json_null()
                                              : json_pack("{s:I, s:f, s:f, s:b}", "nprobe", (json_int_t)m->mix_nprobe, "codes_share", m->mix_codes_share,
                                                          "predicted_rel_error", m->mix_err, "validated", fabs(m->mix_err) <= DFM_AUDIT_VALID_MAX));
    }
    return o;
}

static json_t *extrap_side_json(const dfm_audit_extrap *e, int i) {
    json_t *o = json_pack("{s:f, s:f}", "keys", e->keys[i], "queries", e->queries[i]);
    if (!o) return NULL;
    json_object_set_new(o, "factory", e->factory[i][0] ? json_string(e->factory[i]) : json_null());
    json_object_set_new(o, "index_bytes", num(e->index_bytes[i]));
    json_object_set_new(o, "s_per_query", num(e->s_per_query[i]));
    json_object_set_new(o, "codes_share", num(e->codes_share[i]));
    json_object_set_new(o, "search_s", num(e->search_s[i]));
    json_object_set_new(o, "search_s_low", num(e->search_s[i] / e->search_band[i]));
    json_object_set_new(o, "search_s_high", num(e->search_s[i] * e->search_band[i]));
    json_object_set_new(o, "build_s", num(e->build_s[i]));
    json_object_set_new(o, "build_s_low", num(e->build_s[i] / e->build_band[i]));
    json_object_set_new(o, "build_s_high", num(e->build_s[i] * e->build_band[i]));
    json_object_set_new(o, "rates_from", e->ok[i] ? json_string(SIDE[e->rates_side[i]]) : json_null());
    json_object_set_new(o, "rates_carried_to_an_unmeasured_family", json_boolean(e->ok[i] && e->carried[i]));
    return o;
}

static json_t *savings_json(const dfm_audit_extrap *e, int c) {
    return json_pack("{s:o, s:o, s:o}", "search_s", num(1 - e->search_s[c] / e->search_s[1]), "index_bytes",
                     num(1 - e->index_bytes[c] / e->index_bytes[1]), "build_s", num(1 - e->build_s[c] / e->build_s[1]));
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
    json_object_set_new(J, "token_key_dim", json_integer(s->token_dim));
    json_object_set_new(J, "chunk_key_dim", json_integer(s->chunk_dim));
    json_t *sizes = json_array();
    for (int i = 0; i < s->n; i++) {
        json_t *z = json_pack("{s:I, s:I}", "tokens", (json_int_t)s->s[i].tokens, "chunk_real_keys", (json_int_t)s->s[i].chunk_real_keys);
        for (int side = 0; side < DFM_AUDIT_SIDES; side++) json_object_set_new(z, SIDE[side], point_json(dfm_audit_side_point(&s->s[i], side)));
        json_array_append_new(sizes, z);
    }
    json_object_set_new(J, "sizes", sizes);
    json_t *model = json_pack("{s:f, s:f}", "valid_max_rel_error", DFM_AUDIT_VALID_MAX, "defensible_factor", DFM_AUDIT_DEFENSIBLE);
    for (int i = 0; i < DFM_AUDIT_SIDES; i++) json_object_set_new(model, SIDE[i], model_json(&s->model[i]));
    json_object_set_new(J, "model", model);
    json_t *ex = json_array();
    for (int t = 0; t < n; t++) {
        dfm_audit_extrap e;
        dfm_audit_scale_extrapolate(s, targets[t], &e);
        json_t *o = json_pack("{s:s, s:f, s:f, s:b}", "name", names[t], "tokens", e.tokens, "beyond_largest_measured", e.beyond,
                              "model_only", e.beyond > DFM_AUDIT_DEFENSIBLE);
        for (int i = 0; i < DFM_AUDIT_SIDES; i++) json_object_set_new(o, SIDE[i], extrap_side_json(&e, i));
        json_object_set_new(o, "savings", savings_json(&e, 0));
        json_object_set_new(o, "savings_ivfpq", savings_json(&e, 2));
        json_array_append_new(ex, o);
    }
    json_object_set_new(J, "extrapolated", ex);
    return J;
}
