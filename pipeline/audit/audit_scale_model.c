/* audit_scale_model.c — the cost model of the measured sizes: fitted, validated, and extrapolated from the index
 * each side would have at a larger size (audit_scale.h). */
#include "pipeline/audit/audit_scale.h"

#include "common/error.h"
#include "schemas/neighbor_shard.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

const dfm_audit_point *dfm_audit_side_point(const dfm_audit_size *z, int side) {
    return side == 1 ? &z->tok : side == 2 ? &z->chk_pq : &z->chk;
}

static uint32_t side_dim(const dfm_audit_scale *s, int side) { return side == 1 ? s->token_dim : s->chunk_dim; }
static uint32_t side_metric(const dfm_audit_scale *s, int side) { return side == 1 ? DFM_METRIC_L2 : s->cfg.chunk_metric; }
static double side_k(const dfm_audit_scale *s, int side) { return side == 1 ? s->cfg.k_token : s->cfg.k_chunk; }

/* the operations of a measured point as the model's columns: search per query {1, flops + codes}, build {1, train + add};
 * 0 when its family has no model */
static int point_ops(const dfm_audit_scale *s, int side, const dfm_audit_point *p, double xs[2], double xb[2], dfm_audit_family *fam) {
    dfm_audit_layout l;
    if (p->skipped || dfm_audit_layout_parse(p->factory, side_dim(s, side), side_metric(s, side), &l)) {
        dfm_error_clear();
        return 0;
    }
    dfm_audit_search_ops so;
    dfm_audit_build_ops bo;
    dfm_audit_search_ops_of(&l, (double)p->keys, (double)p->nprobe, side_k(s, side), &so);
    dfm_audit_build_ops_of(&l, (double)p->keys, (double)p->train_n, &bo);
    xs[0] = 1, xs[1] = so.flops + so.codes, xb[0] = 1, xb[1] = bo.train + bo.add;
    *fam = l.family;
    return 1;
}

/* the operation-mix check (DFM_AUDIT_WIDE_PROBES): the side's rates predict its largest size searched at more lists */
static void mix_check(const dfm_audit_scale *s, int side, dfm_audit_side_model *m) {
    const dfm_audit_point *p = dfm_audit_side_point(&s->s[s->n - 1], side);
    dfm_audit_layout l;
    if (p->skipped || !p->wide_nprobe || !(p->wide_query_cpu.med > 0) ||
        dfm_audit_layout_parse(p->factory, side_dim(s, side), side_metric(s, side), &l)) {
        dfm_error_clear();
        return;
    }
    dfm_audit_search_ops at, wide;
    dfm_audit_search_ops_of(&l, (double)p->keys, (double)p->nprobe, side_k(s, side), &at);
    dfm_audit_search_ops_of(&l, (double)p->keys, (double)p->wide_nprobe, side_k(s, side), &wide);
    const double x[2] = {1, wide.flops + wide.codes};
    m->mix_nprobe = p->wide_nprobe;
    m->mix_err = dfm_audit_rates_eval(&m->search, x) / p->wide_query_cpu.med - 1;
    m->mix_codes_share = wide.codes / (wide.flops + wide.codes);
    m->codes_share = at.codes / (at.flops + at.codes);
}

void dfm_audit_scale_model(dfm_audit_scale *s) {
    for (int side = 0; side < DFM_AUDIT_SIDES; side++) {
        dfm_audit_side_model *m = &s->model[side];
        memset(m, 0, sizeof *m);
        m->search_err = m->build_err = m->mix_err = m->mix_codes_share = m->codes_share = NAN;
        double xs[DFM_AUDIT_MAX_SIZES][2], xb[DFM_AUDIT_MAX_SIZES][2], ys[DFM_AUDIT_MAX_SIZES], yb[DFM_AUDIT_MAX_SIZES];
        const char *unmodelled = NULL;
        for (int i = 0; i < s->n; i++) {
            const dfm_audit_point *p = dfm_audit_side_point(&s->s[i], side);
            if (p->skipped) continue;
            if (!point_ops(s, side, p, xs[m->sizes], xb[m->sizes], &m->family)) {
                unmodelled = p->factory;
                continue;
            }
            ys[m->sizes] = p->query_cpu.med;
            yb[m->sizes] = p->build_cpu.med;
            double e = fabs(p->layout_bytes / (double)p->index_bytes - 1);
            if (!(e <= m->bytes_err)) m->bytes_err = e;
            m->sizes++;
        }
        if (m->sizes < 2) {
            if (unmodelled)
                snprintf(m->why, sizeof m->why, "the index %s has no cost model (audit_layout.h knows Flat, IVF-Flat and IVF-PQ)", unmodelled);
            else
                snprintf(m->why, sizeof m->why, "measured at %d size(s): too small for its family below that; two are needed to fit two rates",
                         m->sizes);
            continue;
        }
        if (dfm_audit_fit_rates((const double(*)[2])xs, ys, m->sizes, &m->search) ||
            dfm_audit_fit_rates((const double(*)[2])xb, yb, m->sizes, &m->build)) {
            snprintf(m->why, sizeof m->why, "%.290s", dfm_last_error());
            dfm_error_clear();
            continue;
        }
        m->ok = 1;
        m->search_valid = dfm_audit_validate((const double(*)[2])xs, ys, m->sizes, NULL, &m->search_err);
        mix_check(s, side, m);
        m->build_valid = dfm_audit_validate((const double(*)[2])xb, yb, m->sizes, NULL, &m->build_err);
    }
}

/* the side whose rates price `fam`: this side when measured in it, else the token level, else any side measured in it;
 * else this side's own rates carried over (*carried = 1); -1 when no side has a model */
static int rates_for(const dfm_audit_scale *s, int side, dfm_audit_family fam, int *carried) {
    *carried = 0;
    static const int order[DFM_AUDIT_SIDES] = {1, 0, 2};
    if (s->model[side].ok && s->model[side].family == fam) return side;
    for (int j = 0; j < DFM_AUDIT_SIDES; j++)
        if (s->model[order[j]].ok && s->model[order[j]].family == fam) return order[j];
    *carried = 1;
    return s->model[side].ok ? side : -1;
}

void dfm_audit_scale_extrapolate(const dfm_audit_scale *s, double T, dfm_audit_extrap *e) {
    memset(e, 0, sizeof *e);
    e->tokens = T;
    double big = (double)s->s[s->n - 1].tokens, step = s->n >= 2 ? big / (double)s->s[s->n - 2].tokens : 4;
    e->beyond = T / big;
    for (int i = 0; i < DFM_AUDIT_SIDES; i++) {
        e->keys[i] = i == 1 ? T : T * s->cfg.chunk_keys_per_token;
        e->queries[i] = i == 1 ? T : T * s->cfg.chunk_queries_per_token;
        e->s_per_query[i] = e->search_s[i] = e->index_bytes[i] = e->build_s[i] = e->codes_share[i] = NAN;
        e->rates_side[i] = -1;
        uint64_t keys = (uint64_t)llround(e->keys[i]);
        dfm_audit_choice c;
        char why[600];
        dfm_audit_layout l;
        if (!keys || dfm_audit_choose(i == 0 ? s->cfg.chunk_index : "ivfpq", side_metric(s, i), side_dim(s, i), keys, &c, why, sizeof why) ||
            c.too_small || dfm_audit_layout_parse(c.factory, side_dim(s, i), c.metric, &l)) {
            dfm_error_clear();
            continue;
        }
        snprintf(e->factory[i], sizeof e->factory[i], "%s", c.factory);
        e->index_bytes[i] = dfm_audit_layout_bytes(&l, keys, l.nlist < keys ? l.nlist : keys);
        int src = rates_for(s, i, l.family, &e->carried[i]);
        if (src < 0) continue;
        const dfm_audit_side_model *m = &s->model[src];
        e->ok[i] = 1;
        e->rates_side[i] = src;
        int64_t np = i == 0 && s->cfg.chunk_nprobe > 0 ? s->cfg.chunk_nprobe : s->cfg.token_nprobe;
        dfm_audit_search_ops so;
        dfm_audit_build_ops bo;
        dfm_audit_search_ops_of(&l, (double)keys, (double)np, side_k(s, i), &so);
        dfm_audit_build_ops_of(&l, (double)keys, (double)c.train_n, &bo);
        const double xs[2] = {1, so.flops + so.codes}, xb[2] = {1, bo.train + bo.add};
        e->s_per_query[i] = dfm_audit_rates_eval(&m->search, xs);
        e->codes_share[i] = so.codes / (so.flops + so.codes);
        e->search_s[i] = e->queries[i] * e->s_per_query[i];
        e->build_s[i] = dfm_audit_rates_eval(&m->build, xb);
        /* rates carried to a family no side measured: not validated for it */
        e->search_band[i] = dfm_audit_band(e->carried[i] ? NAN : m->search_err, e->beyond, step);
        e->build_band[i] = dfm_audit_band(e->carried[i] ? NAN : m->build_err, e->beyond, step);
    }
}
