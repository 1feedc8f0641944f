/* lm_slots.c — memory slots in the frozen LM's own space (see lm_slots.h). */
#include "trainer/data/lm_slots.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "shard/target_reader.h"

/* Which datastore chunk a slot group reads, per (chunk of ds, record slot): UINT64_MAX = empty. */
typedef struct {
    uint64_t *src;   /* [N * J] */
    uint64_t N;
    int J;           /* record slots taken (own mode: 1) */
} SlotSources;

static int gather_sources(const DataSet *ds, dfm_target_reader *tr, const DataSet *store, int L,
                          const LmSlotOptions *o, SlotSources *s) {
    s->N = ds->n_tokens / (size_t)L;
    uint64_t n_store = store->n_tokens / (size_t)L;
    const dfm_target_info *inf = tr ? dfm_target_reader_info(tr) : NULL;
    if (inf && inf->k > 64) return DFM_FAIL(DFM_EARG, "target records of %u slots (at most 64 read)", inf->k);
    s->J = !inf ? 1 : o->neighbours > 0 ? o->neighbours : (int)inf->k;
    if (inf && (uint32_t)s->J > inf->k)
        return DFM_FAIL(DFM_EARG, "--neighbours %d: the target records hold %u slots", s->J, inf->k);
    if (inf && s->N > inf->n_chunks)
        return DFM_FAIL(DFM_EMISMATCH, "the token run has %llu chunks, its target records %llu",
                        (unsigned long long)s->N, (unsigned long long)inf->n_chunks);
    s->src = malloc((size_t)s->N * s->J * sizeof(uint64_t));
    int64_t *ids = inf ? malloc(inf->k * sizeof(int64_t)) : NULL;
    float *scores = inf ? malloc(inf->k * sizeof(float)) : NULL;
    if (!s->src || (inf && (!ids || !scores))) {
        free(ids);
        free(scores);
        return DFM_FAIL(DFM_ENOMEM, "slot sources of %llu chunks", (unsigned long long)s->N);
    }
    int rc = DFM_OK;
    for (uint64_t c = 0; c < s->N && !rc; c++) {
        uint64_t *row = s->src + c * s->J;
        if (!inf) {
            row[0] = c;
            continue;
        }
        dfm_trec rec = {.ids = ids, .scores = scores, .emb = NULL};
        rc = dfm_target_reader_get(tr, c, &rec);
        if (rc) {
            dfm_error_prefix("while reading the target record of chunk %llu", (unsigned long long)c);
            break;
        }
        for (int j = 0; j < s->J; j++) {
            row[j] = UINT64_MAX;
            if (!((rec.mask >> j) & 1)) continue;
            if (ids[j] < 0 || (uint64_t)ids[j] >= n_store) {
                rc = DFM_FAIL(DFM_EFORMAT, "chunk %llu, slot %d names chunk %lld; the datastore holds %llu chunks. "
                              "HINT: --datastore must be the run the targets retrieved from",
                              (unsigned long long)c, j, (long long)ids[j], (unsigned long long)n_store);
                break;
            }
            row[j] = (uint64_t)ids[j];
        }
    }
    free(ids);
    free(scores);
    return rc;
}

/* The pooled, unit-norm states of one chunk from its rows of the backbone's output (x: [prefix + L, C]). */
static void pool_states(const float *x, const uint8_t *pad, int n_prefix, int L, int pool, int C, float *out,
                        uint8_t *valid) {
    int g_len = L / pool;
    for (int g = 0; g < pool; g++) {
        float *o = out + (size_t)g * C;
        memset(o, 0, (size_t)C * sizeof(float));
        int n = 0;
        for (int t = g * g_len; t < (g + 1) * g_len; t++) {
            if (pad && pad[t]) continue;
            const float *r = x + (size_t)(n_prefix + t) * C;
            for (int i = 0; i < C; i++) o[i] += r[i];
            n++;
        }
        double ss = 0;
        for (int i = 0; i < C; i++) ss += (double)o[i] * o[i];
        valid[g] = n > 0 && ss > 0;
        float inv = valid[g] ? (float)(1.0 / sqrt(ss)) : 0.0f;
        for (int i = 0; i < C; i++) o[i] *= inv;
    }
}

int lm_slots_build(DfmModel *m, const DataSet *ds, dfm_target_reader *tr, const DataSet *store, int L,
                   const int *prefix, int n_prefix, const LmSlotOptions *o, const char *out, LmSlotStats *st) {
    memset(st, 0, sizeof *st);
    const BackboneConfig *bc = &m->bc;
    int C = bc->dec.hidden, pool = o->pool, B = o->batch, Tp = n_prefix + L;
    if (o->layer < 1 || o->layer > bc->dec.n_layers)
        return DFM_FAIL(DFM_EARG, "--layer %d: the backbone has %d decoder blocks (1 to %d)", o->layer,
                        bc->dec.n_layers, bc->dec.n_layers);
    if (pool < 1 || L % pool)
        return DFM_FAIL(DFM_EARG, "--pool %d: it must divide the chunk length %d (%d: one slot per token)", pool, L, L);
    if (B < 1 || B > m->maxB || Tp > m->maxT)
        return DFM_FAIL(DFM_EARG, "lm_slots: the model holds %d x %d tokens, %d x %d asked", m->maxB, m->maxT, B, Tp);
    SlotSources s = {0};
    int rc = gather_sources(ds, tr, store, L, o, &s);
    uint64_t n_store = store->n_tokens / (size_t)L;
    /* the distinct datastore chunks used, numbered in chunk order */
    uint64_t *slot_of = NULL, *order = NULL, n_used = 0;
    if (!rc) {
        slot_of = malloc((size_t)n_store * sizeof(uint64_t));
        if (!slot_of) rc = DFM_FAIL(DFM_ENOMEM, "datastore map of %llu chunks", (unsigned long long)n_store);
    }
    if (!rc) {
        for (uint64_t j = 0; j < n_store; j++) slot_of[j] = UINT64_MAX;
        for (size_t i = 0; i < (size_t)s.N * s.J; i++)
            if (s.src[i] != UINT64_MAX) slot_of[s.src[i]] = 0;
        for (uint64_t j = 0; j < n_store; j++)
            if (slot_of[j] == 0) slot_of[j] = n_used++;
        order = malloc((size_t)(n_used ? n_used : 1) * sizeof(uint64_t));
        if (!order) rc = DFM_FAIL(DFM_ENOMEM, "datastore order");
        for (uint64_t j = 0; !rc && j < n_store; j++)
            if (slot_of[j] != UINT64_MAX) order[slot_of[j]] = j;
    }
    float *states = NULL;
    uint8_t *svalid = NULL;
    int *inputs = NULL;
    if (!rc) {
        states = malloc((size_t)(n_used ? n_used : 1) * pool * C * sizeof(float));
        svalid = malloc((size_t)(n_used ? n_used : 1) * pool);
        inputs = malloc((size_t)B * Tp * sizeof(int));
        if (!states || !svalid || !inputs)
            rc = DFM_FAIL(DFM_ENOMEM, "states of %llu chunks x %d slots x %d", (unsigned long long)n_used, pool, C);
    }
    for (uint64_t u0 = 0; !rc && u0 < n_used; u0 += (uint64_t)B) {
        int nb = (int)(n_used - u0 < (uint64_t)B ? n_used - u0 : (uint64_t)B);
        for (int b = 0; b < nb && !rc; b++) {
            uint64_t j = order[u0 + b];
            int *in = inputs + (size_t)b * Tp;
            memcpy(in, prefix, (size_t)n_prefix * sizeof(int));
            for (int t = 0; t < L; t++) {
                int id = store->tokens[j * L + t];
                if (id < 0 || id >= bc->vocab_size) {
                    rc = DFM_FAIL(DFM_EFORMAT, "datastore chunk %llu holds token id %d; the backbone has %d",
                                  (unsigned long long)j, id, bc->vocab_size);
                    break;
                }
                in[n_prefix + t] = id;
            }
        }
        if (rc) break;
        const float *x = model_backbone_states(m, inputs, nb, Tp, o->layer);
        for (int b = 0; b < nb; b++) {
            uint64_t j = order[u0 + b];
            pool_states(x + (size_t)b * Tp * C, store->pad ? store->pad + j * L : NULL, n_prefix, L, pool, C,
                        states + (size_t)(u0 + b) * pool * C, svalid + (size_t)(u0 + b) * pool);
        }
    }
    /* the file's table: N chunks x J*pool slots */
    int K = s.J * pool;
    uint8_t *mask = NULL;
    float *emb = NULL;
    if (!rc) {
        mask = calloc((size_t)s.N * K, 1);
        emb = calloc((size_t)s.N * K * C, sizeof(float));
        if (!mask || !emb)
            rc = DFM_FAIL(DFM_ENOMEM, "LM-state slots: %llu chunks x %d slots x %d floats", (unsigned long long)s.N, K, C);
    }
    for (uint64_t c = 0; !rc && c < s.N; c++)
        for (int jj = 0; jj < s.J; jj++) {
            uint64_t j = s.src[c * s.J + jj];
            if (j == UINT64_MAX) continue;
            uint64_t u = slot_of[j];
            size_t at = (size_t)c * K + (size_t)jj * pool;
            memcpy(mask + at, svalid + u * pool, (size_t)pool);
            memcpy(emb + at * C, states + u * pool * C, (size_t)pool * C * sizeof(float));
            for (int g = 0; g < pool; g++) st->slots_valid += svalid[u * pool + g];
        }
    if (!rc) rc = targets_file_write(out, (uint32_t)K, (uint32_t)C, (uint32_t)L, s.N, mask, emb);
    if (!rc) {
        st->chunks_out = s.N;
        st->states_chunks = n_used;
        st->k_out = K;
        st->d_out = C;
    }
    free(mask);
    free(emb);
    free(inputs);
    free(states);
    free(svalid);
    free(order);
    free(slot_of);
    free(s.src);
    return rc;
}
