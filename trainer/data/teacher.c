/* teacher.c — the in-context teacher's rows (see teacher.h). */
#include "trainer/data/teacher.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/error.h"
#include "common/log.h"
#include "schemas/target_record.h"
#include "shard/target_reader.h"
#include "trainer/kernels/ops.h"

uint64_t teacher_tokens_hash(const DataSet *ds, uint64_t n_seq) {
    size_t n = (size_t)n_seq * ds->T + 1;
    if (n > ds->n_tokens) n = ds->n_tokens;
    return XXH3_64bits(ds->tokens, n * sizeof(int));
}

/* log-sum-exp of logits lg [V] */
static double row_lse(const float *lg, int V) {
    float mx = lg[0];
    for (int v = 1; v < V; v++)
        if (lg[v] > mx) mx = lg[v];
    double sum = 0.0;
    for (int v = 0; v < V; v++) sum += exp((double)lg[v] - mx);
    return mx + log(sum);
}

/* Row r of logits lg [V]: its log-sum-exp, the top S ids by logit (ties: the smaller id first) with their
 * log-probabilities, largest first. */
static double row_top(const float *lg, int V, int S, uint32_t *ids, float *lp) {
    double lse = row_lse(lg, V);
    int n = 0; /* a sorted list, largest first, of the best n seen */
    for (int v = 0; v < V; v++) {
        float z = lg[v];
        if (n == S && !(z > lp[S - 1])) continue; /* ties keep the smaller id, seen first */
        int i = n < S ? n++ : S - 1;
        while (i > 0 && z > lp[i - 1]) {
            lp[i] = lp[i - 1], ids[i] = ids[i - 1];
            i--;
        }
        lp[i] = z, ids[i] = (uint32_t)v;
    }
    for (int i = 0; i < S; i++) lp[i] = (float)((double)lp[i] - lse);
    return lse;
}

/* The valid slots of rec to paste, in rank order, as chunk ids (both: neighbour then continuation). */
static int paste_ids(const dfm_trec *rec, uint32_t k, int slots, int P, uint64_t *out) {
    int n = 0;
    if (slots == DFM_TREC_SLOTS_BOTH) {
        uint32_t J = k / 2;
        for (uint32_t j = 0; j < J && n / 2 < P; j++) {
            if (!((rec->mask >> j) & 1)) continue;
            out[n++] = (uint64_t)rec->ids[j];
            if ((rec->mask >> (J + j)) & 1) out[n++] = (uint64_t)rec->ids[J + j];
        }
        return n;
    }
    for (uint32_t j = 0; j < k && n < P; j++)
        if ((rec->mask >> j) & 1) out[n++] = (uint64_t)rec->ids[j];
    return n;
}

int teacher_build(DfmModel *m, const DataSet *ds, dfm_target_reader *tr, const DataSet *store, int L,
                  const TeacherBuildOptions *o, uint64_t backbone_hash, const char *out, TeacherStats *st) {
    const dfm_target_info *inf = dfm_target_reader_info(tr);
    int T = ds->T, NC = T / L, P = o->paste, S = o->top, V = m->bc.vocab_size, C = m->bc.dec.hidden;
    uint64_t n_seq = o->max_seq > 0 && (uint64_t)o->max_seq < ds->n_seq ? (uint64_t)o->max_seq : ds->n_seq;
    memset(st, 0, sizeof *st);
    if (T % L) return DFM_FAIL(DFM_EARG, "sequence length %d is not a multiple of the chunk length %d", T, L);
    if ((uint64_t)ds->n_seq * NC > inf->n_chunks)
        return DFM_FAIL(DFM_EMISMATCH, "the token run has %zu sequences of %d chunks, its targets %llu records. HINT: "
                        "--targets must be the targets of --data", ds->n_seq, NC, (unsigned long long)inf->n_chunks);
    int max_paste = (inf->slots == DFM_TREC_SLOTS_BOTH ? 2 : 1) * P;
    int maxlen = max_paste * L + T;
    if (maxlen > m->maxT) return DFM_FAIL(DFM_EARG, "the teacher model holds %d tokens, %d needed", m->maxT, maxlen);
    int *in = malloc(sizeof(int) * T), *tg = malloc(sizeof(int) * T), *seq = malloc(sizeof(int) * maxlen);
    float *lg = malloc(sizeof(float) * (size_t)L * V), *lp = malloc(sizeof(float) * (size_t)T * S);
    uint32_t *ids = malloc(sizeof(uint32_t) * (size_t)T * S);
    dfm_teacher_row_tail *tail = calloc((size_t)T, sizeof *tail);
    int64_t rid[64];
    float rsc[64];
    uint64_t chunks[2 * DFM_TEACHER_MAX_PASTE];
    dfm_teacher_writer *w = NULL;
    int rc = DFM_OK;
    if (!in || !tg || !seq || !lg || !lp || !ids || !tail) {
        rc = DFM_FAIL(DFM_ENOMEM, "no memory for the teacher's rows");
        goto done;
    }
    if ((rc = dfm_teacher_writer_open(out, (uint32_t)S, &w))) goto done;
    double t0 = dfm_now();
    for (uint64_t s = 0; s < n_seq && !rc; s++) {
        size_t idx = (size_t)s;
        if ((rc = data_batch_from(ds, NULL, &idx, 1, L, in, tg, NULL, NULL))) break;
        memset(ids, 0, sizeof(uint32_t) * (size_t)T * S);
        memset(lp, 0, sizeof(float) * (size_t)T * S);
        memset(tail, 0, sizeof *tail * (size_t)T);
        /* the LM alone over the window */
        model_backbone_forward(m, in, 1, T);
        st->forward_tokens += (uint64_t)T;
        for (int r0 = 0; r0 < T; r0 += L) {
            matmul_forward(lg, m->lnf_out + (size_t)r0 * C, m->bb.lm_head, NULL, L, C, V);
            for (int r = r0; r < r0 + L; r++) {
                if (tg[r] < 0) continue;
                const float *z = lg + (size_t)(r - r0) * V;
                double l = (double)z[tg[r]] - row_lse(z, V);
                tail[r].lp_alone = (float)(l < 0.0 ? l : 0.0);
                tail[r].flags = DFM_TEACHER_F_TARGET;
            }
        }
        /* the teacher per chunk c >= 1: its pasted slots, then the window up to the chunk's last input row */
        for (int c = 1; c < NC && !rc; c++) {
            uint64_t chunk = s * (uint64_t)NC + (uint64_t)c;
            dfm_trec rec = {.ids = rid, .scores = rsc, .emb = NULL};
            if ((rc = dfm_target_reader_get(tr, chunk, &rec))) break;
            int np = paste_ids(&rec, inf->k, inf->slots, P, chunks), len = 0;
            for (int j = np - 1; j >= 0; j--) { /* the best-ranked nearest the context */
                uint64_t at = chunks[j] * (uint64_t)L;
                if (at + (uint64_t)L > store->n_tokens) {
                    rc = DFM_FAIL(DFM_ERANGE, "sequence %llu chunk %d: neighbour chunk %llu lies outside the datastore's "
                                  "%zu tokens. HINT: --datastore must be the run the targets retrieved from",
                                  (unsigned long long)s, c, (unsigned long long)chunks[j], store->n_tokens);
                    break;
                }
                for (int t = 0; t < L; t++)
                    if (!(store->pad && store->pad[at + t])) seq[len++] = store->tokens[at + t];
            }
            if (rc) break;
            if (np == 0) continue; /* no valid slot: no teacher for this chunk */
            int first = c * L - 1, plen = len; /* rows first .. first + L - 1 of the window */
            memcpy(seq + len, in, sizeof(int) * (size_t)(first + L));
            len += first + L;
            model_backbone_forward(m, seq, 1, len);
            st->forward_tokens += (uint64_t)len;
            st->pasted_tokens += (uint64_t)plen;
            matmul_forward(lg, m->lnf_out + (size_t)(plen + first) * C, m->bb.lm_head, NULL, L, C, V);
            for (int i = 0; i < L; i++) {
                int r = first + i;
                if (tg[r] < 0) continue;
                const float *z = lg + (size_t)i * V;
                double lse = row_top(z, V, S, ids + (size_t)r * S, lp + (size_t)r * S);
                double l = (double)z[tg[r]] - lse;
                tail[r].lp_teacher = (float)(l < 0.0 ? l : 0.0);
                tail[r].flags |= DFM_TEACHER_F_TEACHER;
                st->rows_teacher++;
                st->lp_teacher += tail[r].lp_teacher;
                st->lp_alone += tail[r].lp_alone;
            }
        }
        if (!rc) rc = dfm_teacher_writer_add(w, ids, lp, tail, (size_t)T);
        if (!rc && (s % 16 == 15 || s + 1 == n_seq))
            DFM_LOG_I("teacher: %llu / %llu sequences, %.1f s; teacher %.4f, alone %.4f nats per token so far",
                      (unsigned long long)(s + 1), (unsigned long long)n_seq, dfm_now() - t0,
                      st->rows_teacher ? -st->lp_teacher / (double)st->rows_teacher : 0.0,
                      st->rows_teacher ? -st->lp_alone / (double)st->rows_teacher : 0.0);
    }
    if (!rc) {
        dfm_teacher_header h;
        memset(&h, 0, sizeof h);
        h.n_seq = n_seq;
        h.seq_len = (uint32_t)T;
        h.chunk_len = (uint32_t)L;
        h.paste = (uint32_t)P;
        h.vocab = (uint32_t)V;
        h.slots = (uint32_t)inf->slots;
        h.backbone_hash = backbone_hash;
        h.tokens_hash = teacher_tokens_hash(ds, n_seq);
        size_t gl = strlen(ds->tokens_generation);
        h.tokens_generation_len = (uint32_t)(gl < sizeof h.tokens_generation ? gl : sizeof h.tokens_generation);
        memcpy(h.tokens_generation, ds->tokens_generation, h.tokens_generation_len);
        rc = dfm_teacher_writer_close(w, &h);
        w = NULL;
    }
done:
    dfm_teacher_writer_abort(w);
    free(in), free(tg), free(seq), free(lg), free(lp), free(ids), free(tail);
    return rc;
}

/* ---- the rows as soft targets ------------------------------------------------------------------ */
int teacher_soft_open(const char *path, const DataSet *ds, int L, int V, size_t ntrain, float gain_floor,
                      TeacherSoft *ts) {
    memset(ts, 0, sizeof *ts);
    DFM_TRY(dfm_teacher_open(path, &ts->f));
    const dfm_teacher_header *h = &ts->f->hdr;
    const char *hint = "HINT: write it again for this data with `dfm-train teacher`";
    int rc = DFM_OK;
    size_t gl = strlen(ds->tokens_generation);
    if (h->seq_len != (uint32_t)ds->T || h->chunk_len != (uint32_t)L)
        rc = DFM_FAIL(DFM_EMISMATCH, "%s holds sequences of %u tokens in chunks of %u; training reads %d in chunks of %d. %s",
                      path, h->seq_len, h->chunk_len, ds->T, L, hint);
    else if (h->n_seq != ds->n_seq)
        rc = DFM_FAIL(DFM_EMISMATCH, "%s holds %llu sequences; the data %zu. %s", path, (unsigned long long)h->n_seq,
                      ds->n_seq, hint);
    else if (h->vocab != (uint32_t)V)
        rc = DFM_FAIL(DFM_EMISMATCH, "%s was computed with a vocabulary of %u; the backbone has %d. %s", path, h->vocab, V, hint);
    else if (h->top > CE_MAX_SOFT)
        rc = DFM_FAIL(DFM_EARG, "%s keeps %u ids per row; training takes at most %d", path, h->top, CE_MAX_SOFT);
    else if (h->tokens_generation_len != (gl < 16 ? gl : 16) ||
             memcmp(h->tokens_generation, ds->tokens_generation, h->tokens_generation_len))
        rc = DFM_FAIL(DFM_EMISMATCH, "%s was computed from another build of the tokens (generation %.*s, the data's %s). %s",
                      path, (int)h->tokens_generation_len, h->tokens_generation, ds->tokens_generation, hint);
    else if (h->tokens_hash != teacher_tokens_hash(ds, h->n_seq))
        rc = DFM_FAIL(DFM_EMISMATCH, "%s was computed from other tokens (tokens_hash differs). %s", path, hint);
    if (rc) {
        teacher_soft_close(ts);
        return rc;
    }
    ts->S = (int)h->top;
    ts->T = ds->T;
    ts->gain_floor = gain_floor;
    ts->ce_weight = 1.0f;
    double g = 0.0;
    uint64_t n = 0;
    for (uint64_t i = 0; i < (uint64_t)ntrain * h->seq_len && i < h->n_seq * h->seq_len; i++) {
        dfm_teacher_row_tail t;
        dfm_teacher_row(ts->f, i, NULL, NULL, &t);
        if (!(t.flags & DFM_TEACHER_F_TARGET)) continue;
        if (t.flags & DFM_TEACHER_F_TEACHER && t.lp_teacher > t.lp_alone) g += (double)t.lp_teacher - t.lp_alone;
        n++;
    }
    ts->mean_gain = n ? g / (double)n : 0.0;
    if (gain_floor >= 0.0f && !(ts->mean_gain > 0.0)) {
        teacher_soft_close(ts);
        return DFM_FAIL(DFM_EARG, "%s: the teacher gains nothing on any training row, so --gain-weighting has no "
                        "weight to give. HINT: paste more neighbours (dfm-train teacher --paste)", path);
    }
    return DFM_OK;
}

void teacher_soft_close(TeacherSoft *ts) {
    dfm_teacher_close(ts->f);
    memset(ts, 0, sizeof *ts);
}

void teacher_soft_fill(const TeacherSoft *ts, const size_t *idx, int B, int *ids, float *p, uint8_t *has, float *row_w) {
    int T = ts->T, S = ts->S;
    uint32_t u[CE_MAX_SOFT];
    float lp[CE_MAX_SOFT];
    for (int b = 0; b < B; b++)
        for (int r = 0; r < T; r++) {
            size_t o = (size_t)b * T + r;
            dfm_teacher_row_tail t;
            dfm_teacher_row(ts->f, (uint64_t)idx[b] * T + r, u, lp, &t);
            has[o] = (t.flags & DFM_TEACHER_F_TEACHER) != 0;
            for (int i = 0; i < S; i++) { /* the teacher's own probabilities: the rest of 1 is its tail (ops.h) */
                ids[o * S + i] = (int)u[i];
                p[o * S + i] = has[o] ? (float)exp((double)lp[i]) : 0.0f;
            }
            float w = 1.0f;
            if (ts->gain_floor >= 0.0f) {
                double g = has[o] && t.lp_teacher > t.lp_alone ? (double)t.lp_teacher - t.lp_alone : 0.0;
                w = (float)(ts->gain_floor + (1.0 - ts->gain_floor) * g / ts->mean_gain);
            }
            row_w[o] = w * ts->ce_weight;
        }
}
