/* evaluate.c — held-out evaluation of a DFM or pretraining model: every memory mode, the shuffled controls,
 * CE by position, and their log lines and JSON (see evaluate.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "trainer/run/evaluate.h"

void eval_result_free(EvalResult *r) {
    for (int i = 0; i < EVAL_NMODES; i++) free(r->pos[i]), free(r->batch[i]), r->pos[i] = r->batch[i] = NULL;
}

/* batch i's mean CE of a mode: what its forward added to the running sum (ce_before: the sum before it) */
static void note_batch(EvalResult *r, int mode, long i, double ce_before, const double *ce) {
    if (r->batch[mode]) r->batch[mode][i] = *ce - ce_before;
}

/* one forward of the held-out batch; its CE into *ce, per position into pos[2L] (sums, counts), top-1 hits and
 * positions into acc[2] */
static int eval_forward(Engine *en, DfmModel *m, const int *inp, const int *tgt, const float *tmem,
                        const uint8_t *tmask, int B, int T, int mode, float *rows, double *pos, double *ce,
                        double *acc) {
    DFM_TRY(engine_forward(en, inp, tgt, tmem, tmask, B, T, mode, 0, 1.0f));
    *ce += m->ce;
    if (!m->dc.enabled) return DFM_OK;
    int L = m->dc.chunk_len;
    long cnt[L];
    memset(cnt, 0, sizeof cnt);
    DFM_TRY(engine_row_losses(en, rows));
    model_ce_by_position(rows, tgt, B, T, L, pos, cnt);
    for (int j = 0; j < L; j++) pos[L + j] += (double)cnt[j];
    DFM_TRY(engine_row_top1(en, rows));
    for (int i = 0; i < B * T; i++)
        if (tgt[i] >= 0) acc[0] += rows[i], acc[1] += 1.0;
    return DFM_OK;
}

int train_eval_modes(const TrainOpts *o) {
    return o->memory_control && !strcmp(o->memory_control, "none") ? EVAL_MODE_ALL & ~EVAL_MODE_SHUFFLE : EVAL_MODE_ALL;
}

/* The held-out sequences' own buffers for one batch. */
typedef struct {
    int *inp, *tgt;
    float *tmem, *rows;
    uint8_t *tmask;
    size_t *idx;
} EvalBatch;

static int eval_read(DataSet *ds, Prefetcher *pf, const size_t *idx, int B, int L, EvalBatch *b) {
    return pf ? prefetch_data_batch(pf, idx, B, L, b->inp, b->tgt, b->tmem, b->tmask)
              : data_batch(ds, idx, B, L, b->inp, b->tgt, b->tmem, b->tmask);
}

/* The shuffled controls (see evaluate.h): sequence i fuses the memory of its partner (i + n/2) mod n, the
 * predicted slots kept from the main pass (pred_store) or the partner's targets, as target-mode forwards. */
static int eval_controls(Engine *en, DfmModel *m, DataSet *ds, Prefetcher *pf, size_t first, int B, long nb,
                         const float *pred_store, int use_t, EvalBatch *b, EvalBatch *p, EvalResult *r) {
    int T = ds->T, L = m->dc.chunk_len, NC = T / L, K = m->dc.n_slots, d = m->dc.d_mem;
    size_t n = (size_t)nb * B, per = (size_t)NC * K;
    int rc = DFM_OK;
    for (long i = 0; i < nb && !rc; i++) {
        for (int k = 0; k < B; k++) b->idx[k] = first + (size_t)i * B + k;
        rc = eval_read(ds, pf, b->idx, B, L, b);
        if (rc) break;
        /* another sequence's predicted memory, with the predicted mode's slot mask (chunk 0 only when fused) */
        for (int k = 0; k < B; k++) {
            size_t partner = ((size_t)i * B + k + n / 2) % n;
            memcpy(p->tmem + (size_t)k * per * d, pred_store + partner * per * d, per * d * sizeof(float));
            for (int c = 0; c < NC; c++)
                memset(p->tmask + ((size_t)k * NC + c) * K, c > 0 || m->dc.fuse_first_chunk, (size_t)K);
        }
        double before = r->ce_pred_shuf;
        rc = eval_forward(en, m, b->inp, b->tgt, p->tmem, p->tmask, B, T, MEM_TARGET, b->rows, r->pos[EVAL_PRED_SHUF],
                          &r->ce_pred_shuf, r->acc_n[EVAL_PRED_SHUF]);
        note_batch(r, EVAL_PRED_SHUF, i, before, &r->ce_pred_shuf);
        if (rc || !use_t) continue;
        /* another sequence's target memory and mask */
        for (int k = 0; k < B; k++) p->idx[k] = first + ((size_t)i * B + k + n / 2) % n;
        rc = eval_read(ds, pf, p->idx, B, L, p);
        before = r->ce_target_shuf;
        if (!rc)
            rc = eval_forward(en, m, b->inp, b->tgt, p->tmem, p->tmask, B, T, MEM_TARGET, b->rows,
                              r->pos[EVAL_TARGET_SHUF], &r->ce_target_shuf, r->acc_n[EVAL_TARGET_SHUF]);
        note_batch(r, EVAL_TARGET_SHUF, i, before, &r->ce_target_shuf);
    }
    return rc;
}

static int batch_alloc(EvalBatch *b, int B, int T, size_t S, int d) {
    b->inp = malloc((size_t)B * T * sizeof(int));
    b->tgt = malloc((size_t)B * T * sizeof(int));
    b->rows = malloc((size_t)B * T * sizeof(float));
    b->tmem = malloc(S * d * sizeof(float));
    b->tmask = malloc(S ? S : 1);
    b->idx = malloc((size_t)B * sizeof(size_t));
    return b->inp && b->tgt && b->rows && b->tmem && b->tmask && b->idx ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "eval batch");
}

static void batch_free(EvalBatch *b) { free(b->inp), free(b->tgt), free(b->rows), free(b->tmem), free(b->tmask), free(b->idx); }

/* The predicted slots of every evaluated sequence, kept for the controls: refused beyond this many bytes. */
#define EVAL_PRED_STORE_MAX ((size_t)4 << 30)

int evaluate(Engine *en, DfmModel *m, DataSet *ds, Prefetcher *pf, size_t first, size_t count, int B,
             long max_batches, int modes, EvalResult *r) {
    memset(r, 0, sizeof *r);
    int T = ds->T, L = m->dc.enabled ? m->dc.chunk_len : T, NC = T / L, K = m->dc.n_slots, d = m->dc.d_mem;
    size_t S = m->dc.enabled ? (size_t)B * NC * K : 0;
    int use_t = m->dc.enabled && ds->tgt;
    EvalBatch b = {0}, p = {0};
    float *pred_store = NULL;
    int rc = batch_alloc(&b, B, T, S, d);
    int run[EVAL_NMODES] = {1, (modes & EVAL_MODE_NONE) != 0, (modes & EVAL_MODE_TARGET) && use_t};
    long nb = (long)(count / B);
    if (max_batches > 0 && nb > max_batches) nb = max_batches;
    if (!rc && nb < 1)
        rc = DFM_FAIL(DFM_EARG, "held-out split of %zu sequences is smaller than one batch of %d. HINT: --val-seqs",
                      count, B);
    size_t n = nb > 0 ? (size_t)nb * B : 0;
    r->shuffled = m->dc.enabled && (modes & EVAL_MODE_SHUFFLE) && n >= 2;
    if (!rc && r->shuffled) {
        run[EVAL_PRED_SHUF] = 1;
        run[EVAL_TARGET_SHUF] = run[EVAL_TARGET];
        size_t bytes = n * (size_t)NC * K * d * sizeof(float);
        if (bytes > EVAL_PRED_STORE_MAX)
            rc = DFM_FAIL(DFM_EARG, "the shuffled memory control keeps the predicted slots of all %zu held-out "
                          "sequences (%.1f GB). HINT: fewer --eval-batches, or --memory-control none", n, bytes / 1e9);
        else if (!(pred_store = malloc(bytes)))
            rc = DFM_FAIL(DFM_ENOMEM, "no memory for the predicted slots of %zu held-out sequences", n);
        if (!rc) rc = batch_alloc(&p, B, T, S, d);
    }
    r->L = L;
    for (int i = 0; i < EVAL_NMODES && m->dc.enabled && !rc; i++)
        if (run[i] && (!(r->pos[i] = calloc(2 * (size_t)L, sizeof(double))) ||
                       !(r->batch[i] = calloc(nb > 0 ? (size_t)nb : 1, sizeof(double)))))
            rc = DFM_FAIL(DFM_ENOMEM, "eval");
    for (long i = 0; i < nb && !rc; i++) {
        for (int k = 0; k < B; k++) b.idx[k] = first + (size_t)i * B + k;
        rc = eval_read(ds, pf, b.idx, B, L, &b);
        if (rc) break;
        if (!m->dc.enabled) {
            rc = eval_forward(en, m, b.inp, b.tgt, NULL, NULL, B, T, MEM_NONE, b.rows, NULL, &r->ce_none, NULL);
            continue;
        }
        float *tmem = use_t ? b.tmem : NULL;
        uint8_t *tmask = use_t ? b.tmask : NULL;
        double before = r->ce_pred;
        rc = eval_forward(en, m, b.inp, b.tgt, tmem, tmask, B, T, MEM_PREDICTED, b.rows, r->pos[EVAL_PRED], &r->ce_pred,
                          r->acc_n[EVAL_PRED]);
        note_batch(r, EVAL_PRED, i, before, &r->ce_pred);
        r->mse += m->mse;
        r->cos += m->cos;
        if (!rc && pred_store) rc = engine_pred_slots(en, pred_store + (size_t)i * B * NC * K * d);
        if (!rc && run[EVAL_NONE])
            rc = eval_forward(en, m, b.inp, b.tgt, NULL, NULL, B, T, MEM_NONE, b.rows, r->pos[EVAL_NONE], &r->ce_none,
                              r->acc_n[EVAL_NONE]);
        before = r->ce_target;
        if (!rc && run[EVAL_TARGET])
            rc = eval_forward(en, m, b.inp, b.tgt, tmem, tmask, B, T, MEM_TARGET, b.rows, r->pos[EVAL_TARGET],
                              &r->ce_target, r->acc_n[EVAL_TARGET]);
        note_batch(r, EVAL_TARGET, i, before, &r->ce_target);
    }
    if (!rc && r->shuffled) rc = eval_controls(en, m, ds, pf, first, B, nb, pred_store, run[EVAL_TARGET_SHUF], &b, &p, r);
    if (nb > 0) {
        double *sums[] = {&r->ce_pred, &r->ce_none, &r->ce_target, &r->ce_pred_shuf, &r->ce_target_shuf, &r->mse, &r->cos};
        for (size_t i = 0; i < sizeof sums / sizeof sums[0]; i++) *sums[i] /= nb;
    }
    for (int i = 0; i < EVAL_NMODES; i++) /* sums and counts -> means */
        for (int j = 0; r->pos[i] && j < L; j++)
            r->pos[i][j] = r->pos[i][L + j] > 0 ? r->pos[i][j] / r->pos[i][L + j] : NAN;
    for (int i = 0; i < EVAL_NMODES; i++)
        r->acc[i] = r->acc_n[i][1] > 0 ? r->acc_n[i][0] / r->acc_n[i][1] : NAN;
    r->n_batches = nb;
    if (!run[EVAL_TARGET_SHUF]) r->ce_target_shuf = NAN;
    if (!r->shuffled) r->ce_pred_shuf = r->ce_target_shuf = NAN;
    if (rc) eval_result_free(r);
    batch_free(&b);
    batch_free(&p);
    free(pred_store);
    return rc;
}

/* a number rounded to 6 decimals, or null (JSON has no NaN) */
static json_t *num(double x) { return isfinite(x) ? json_real(round(x * 1e6) / 1e6) : json_null(); }

/* the standard error of the memory effect's mean over the batches (control minus own memory, batch by batch;
 * NaN with fewer than 2 batches or a mode that did not run) */
static double effect_se(const EvalResult *e, int own, int control) {
    long n = e->n_batches;
    if (!e->batch[own] || !e->batch[control] || n < 2) return NAN;
    double s = 0, s2 = 0;
    for (long i = 0; i < n; i++) {
        double x = e->batch[control][i] - e->batch[own][i];
        s += x, s2 += x * x;
    }
    return sqrt(fmax(0, (s2 - s * s / n) / (n - 1)) / n);
}

static json_t *effect_batches(const EvalResult *e, int own, int control) {
    json_t *a = json_array();
    for (long i = 0; i < e->n_batches; i++) json_array_append_new(a, num(e->batch[control][i] - e->batch[own][i]));
    return a;
}

static json_t *pos_json(const EvalResult *e, int i) {
    json_t *a = json_array();
    for (int j = 0; j < e->L; j++) json_array_append_new(a, num(e->pos[i][j]));
    return a;
}

json_t *eval_json(const DfmModel *m, const EvalResult *e, int has_t) {
    if (!m->dc.enabled) return json_pack("{s:o, s:I}", "ce", num(e->ce_none), "batches", (json_int_t)e->n_batches);
    json_t *j = json_pack("{s:o, s:o, s:o, s:o, s:o, s:I, s:b}", "ce_pred", num(e->ce_pred), "ce_none",
                          num(e->ce_none), "ce_target", has_t ? num(e->ce_target) : json_null(), "mse", num(e->mse),
                          "cos", num(e->cos), "batches", (json_int_t)e->n_batches, "trained_with_target",
                          m->dc.fusion_memory != FUSION_MEM_PREDICTED);
    if (e->shuffled) {
        json_object_set_new(j, "ce_pred_shuffled", num(e->ce_pred_shuf));
        json_object_set_new(j, "ce_target_shuffled", num(e->ce_target_shuf));
        json_object_set_new(j, "memory_effect_pred", num(e->ce_pred_shuf - e->ce_pred));
        json_object_set_new(j, "memory_effect_target", num(e->ce_target_shuf - e->ce_target));
        const char *names[2][2] = {{"memory_effect_pred_batches", "memory_effect_pred_se"},
                                   {"memory_effect_target_batches", "memory_effect_target_se"}};
        int modes[2][2] = {{EVAL_PRED, EVAL_PRED_SHUF}, {EVAL_TARGET, EVAL_TARGET_SHUF}};
        for (int k = 0; k < 2; k++) {
            if (!e->batch[modes[k][0]] || !e->batch[modes[k][1]]) continue;
            json_object_set_new(j, names[k][0], effect_batches(e, modes[k][0], modes[k][1]));
            json_object_set_new(j, names[k][1], num(effect_se(e, modes[k][0], modes[k][1])));
        }
    }
    const char *keys[EVAL_NMODES] = {"ce_pos_pred", "ce_pos_none", "ce_pos_target", "ce_pos_pred_shuffled",
                                     "ce_pos_target_shuffled"};
    const char *akeys[EVAL_NMODES] = {"acc_pred", "acc_none", "acc_target", "acc_pred_shuffled", "acc_target_shuffled"};
    for (int i = 0; i < EVAL_NMODES; i++) {
        if (e->pos[i]) json_object_set_new(j, keys[i], pos_json(e, i));
        if (isfinite(e->acc[i])) json_object_set_new(j, akeys[i], num(e->acc[i]));
    }
    return j;
}

void eval_print(FILE *logf, long step, const DfmModel *m, const EvalResult *e, int has_t) {
    if (m->dc.enabled) {
        char tbuf[160] = "n/a (no targets)";
        if (has_t)
            snprintf(tbuf, sizeof tbuf, "%.4f (%s)", e->ce_target,
                     m->dc.fusion_memory != FUSION_MEM_PREDICTED
                         ? "trained with it: retrieval at inference, a RETRO-like bound"
                         : "trained on predicted memory only: out of distribution, no bound");
        DFM_LOG_I("eval step %ld (%ld batches): CE fusion off %.4f | predicted memory (DFM at inference, no "
                  "retrieval) %.4f | target memory through this model %s | MSE %.4f | cosine %.4f",
                  step, e->n_batches, e->ce_none, e->ce_pred, tbuf, e->mse, e->cos);
        if (e->shuffled) {
            char t2[128] = "", se_p[48] = "", se_t[48] = "";
            double sp = effect_se(e, EVAL_PRED, EVAL_PRED_SHUF), st = effect_se(e, EVAL_TARGET, EVAL_TARGET_SHUF);
            if (isfinite(sp)) snprintf(se_p, sizeof se_p, " +- %.4f", sp);
            if (isfinite(st)) snprintf(se_t, sizeof se_t, " +- %.4f", st);
            if (has_t)
                snprintf(t2, sizeof t2, "; target memory %.4f, memory effect %+.4f%s", e->ce_target_shuf,
                         e->ce_target_shuf - e->ce_target, se_t);
            DFM_LOG_I("eval step %ld: control, the same modules with another held-out sequence's memory: predicted "
                      "memory %.4f, memory effect %+.4f%s nats%s (+- the standard error over the %ld batches; fusion "
                      "off minus predicted, %+.4f, also counts the modules' added capacity)", step, e->ce_pred_shuf,
                      e->ce_pred_shuf - e->ce_pred, se_p, t2, e->n_batches, e->ce_none - e->ce_pred);
        }
        const char *names[EVAL_NMODES] = {"predicted", "fusion off", "target", "predicted, shuffled",
                                          "target, shuffled"};
        char accs[512];
        int na = snprintf(accs, sizeof accs, "eval step %ld: top-1 token accuracy:", step);
        for (int i = 0; i < EVAL_NMODES && na < (int)sizeof accs - 48; i++)
            if (isfinite(e->acc[i])) na += snprintf(accs + na, sizeof accs - na, " %s %.2f%%,", names[i], 100.0 * e->acc[i]);
        accs[na - 1] = '\0';
        DFM_LOG_I("%s", accs);
        for (int i = 0; i < EVAL_NMODES; i++) {
            if (!e->pos[i]) continue;
            char line[4096];
            int n = snprintf(line, sizeof line, "eval step %ld: CE by position in the chunk (0 = its first token), "
                             "%s:", step, names[i]);
            for (int j = 0; j < e->L && n < (int)sizeof line - 16; j++)
                n += snprintf(line + n, sizeof line - n, " %.3f", e->pos[i][j]);
            DFM_LOG_I("%s", line);
        }
    } else {
        DFM_LOG_I("eval step %ld (%ld batches): CE %.4f (ppl %.2f)", step, e->n_batches, e->ce_none, exp(e->ce_none));
    }
    if (logf) {
        json_t *j = json_pack("{s:I, s:o}", "step", (json_int_t)step, "eval", eval_json(m, e, has_t));
        char *txt = json_dumps(j, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
        if (txt) fprintf(logf, "%s\n", txt);
        free(txt);
        json_decref(j);
        fflush(logf);
    }
}

