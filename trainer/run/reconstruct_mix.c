/* reconstruct_mix.c — the reading objective interleaved with DFM training (reconstruct_mix.h). */
#include "trainer/run/reconstruct_mix.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "trainer/data/reading.h"
#include "trainer/data/vocab_map.h"
#include "trainer/run/margin.h"

/* the reading stream's seed: another stream than the DFM loader's of the same --seed */
#define RECON_SEED_SALT 0x52454144494e4721ull /* "READING!" */

int recon_mix_open(ReconMix *r, const TrainOpts *o, const DfmModel *m, size_t dfm_ntrain, int use_cache) {
    memset(r, 0, sizeof *r);
    int L = m->dc.chunk_len, T = (int)o->seq_len, K = m->dc.n_slots, ctx = o->reconstruct_context != 0;
    int Tr = ctx ? T : 2 * L; /* in context: the DFM sequences themselves; else a prompt chunk and the chunk */
    if (T < Tr)
        return DFM_FAIL(DFM_EARG, "--reconstruct-weight: a reading sequence is 2 chunks (%d tokens), longer than "
                        "--seq-len %d. HINT: --seq-len %d or more", 2 * L, T, 2 * L);
    long Rmax = (long)o->batch * T / Tr, R = o->reconstruct_batch > 0 ? (long)o->reconstruct_batch : Rmax;
    if (!model_batch_fits(m, (int)R, Tr))
        return DFM_FAIL(DFM_EARG, "--reconstruct-batch %ld: %ld x %d tokens exceed the DFM micro-batch's %lld x %d, "
                        "which sizes the activations. HINT: --reconstruct-batch %ld or less", R, R, Tr,
                        (long long)o->batch, T, Rmax);
    r->B = (int)R, r->T = Tr, r->weight = (float)o->reconstruct_weight;
    r->shuffled = o->reconstruct_memory && !strcmp(o->reconstruct_memory, "shuffled");
    r->zero = o->memory_ablation && !strcmp(o->memory_ablation, "zero");
    if (r->shuffled && R < 2)
        return DFM_FAIL(DFM_EARG, "--reconstruct-memory shuffled: each reading sequence reads another's memory of its "
                        "micro-batch, which holds %ld. HINT: --reconstruct-batch 2 or more", R);
    if (o->memory_ablation && !strcmp(o->memory_ablation, "random"))
        return DFM_FAIL(DFM_EARG, "--memory-ablation random gives each DFM chunk a fixed random code; the reading pass of "
                        "--reconstruct-weight has none. HINT: --memory-ablation zero (every slot 0, the reading pass's "
                        "too), or --reconstruct-memory shuffled");
    int rc;
    if (ctx) {
        rc = data_open_reading_context(o->data, T, L, K, o->reading_slots, &r->ds);
        r->ntrain = dfm_ntrain; /* the same sequences: the same split */
    } else {
        int *ids = NULL, n = 0;
        uint64_t split = (uint64_t)dfm_ntrain * (uint64_t)(T / L);
        rc = train_encode_prompt(o->backbone, "--reading-prompt", o->reading_prompt, L, &ids, &n);
        if (!rc) rc = data_open_reading(o->data, L, K, ids, n, o->reading_slots, split, &r->ntrain, &r->ds);
        free(ids);
    }
    if (rc) return dfm_error_prefix("--reconstruct-weight reads the chunks of the run --data and their own slots");
    if ((rc = vocab_map_apply_backbone(o->backbone, &r->ds))) return rc;
    if (r->ds.d != m->dc.d_mem)
        return DFM_FAIL(DFM_EMISMATCH, "--reconstruct-weight: the chunks' own slots are %d-dimensional, the DFM "
                        "targets %d. HINT: --reading-slots FILE of the targets' space (`dfm-train slots --own`), or "
                        "the encode stage's embeddings (no --reading-slots) with targets of its space", r->ds.d,
                        m->dc.d_mem);
    if ((uint32_t)m->bc.vocab_size <= r->ds.max_token)
        return DFM_FAIL(DFM_EMISMATCH, "--reconstruct-weight: token id %u of the reading set is outside the backbone's "
                        "vocabulary of %d", r->ds.max_token, m->bc.vocab_size);
    r->nval = r->ds.n_seq - r->ntrain;
    if (r->ntrain < 1)
        return DFM_FAIL(DFM_EARG, "--reconstruct-weight: no chunk of the %zu training sequences holds a token",
                        dfm_ntrain);
    DFM_TRY(loader_init(&r->ld, 0, r->ntrain, (uint64_t)o->seed ^ RECON_SEED_SALT, 1));
    size_t S = (size_t)r->B * (size_t)(r->T / L) * (size_t)K;
    r->inp = malloc((size_t)r->B * r->T * sizeof(int));
    r->tgt = malloc((size_t)r->B * r->T * sizeof(int));
    r->tmem = malloc(S * (size_t)m->dc.d_mem * sizeof(float));
    r->tmask = malloc(S);
    r->idx = malloc((size_t)r->B * sizeof(size_t));
    if (!r->inp || !r->tgt || !r->tmem || !r->tmask || !r->idx) return DFM_FAIL(DFM_ENOMEM, "the reading batch");
    if (r->shuffled && (!(r->smem = malloc(S * (size_t)m->dc.d_mem * sizeof(float))) || !(r->smask = malloc(S))))
        return DFM_FAIL(DFM_ENOMEM, "the reading batch's partner memory");
    if (use_cache) {
        DFM_TRY(frozen_cache_create(&r->fc, m, r->ntrain, r->B, r->T));
        r->use_fc = 1;
    }
    if (ctx)
        DFM_LOG_I("--reconstruct-weight %g --reconstruct-context: each micro-batch also runs %d training sequences with "
                  "every chunk's own slot as its memory (%zu sequences; %zu held out, evaluated)%s", o->reconstruct_weight,
                  r->B, r->ntrain, r->nval, use_cache ? "; their frozen layers cached too" : "");
    else
        DFM_LOG_I("--reconstruct-weight %g: each micro-batch also regenerates %d chunks from their own slot (%zu chunks "
                  "of the training sequences; %zu of the held-out ones evaluated)%s", o->reconstruct_weight, r->B,
                  r->ntrain, r->nval, use_cache ? "; their frozen layers cached too" : "");
    if (r->shuffled)
        DFM_LOG_I("--reconstruct-memory shuffled: each reading sequence reads another's slots (the control of reading)");
    if (r->zero) DFM_LOG_I("--memory-ablation zero: the reading pass's slots are 0 too");
    return DFM_OK;
}

void recon_mix_close(ReconMix *r) {
    data_close(&r->ds);
    loader_free(&r->ld);
    free(r->inp), free(r->tgt), free(r->tmem), free(r->tmask), free(r->idx), free(r->smem), free(r->smask);
    if (r->use_fc) {
        DFM_LOG_I("--reconstruct-weight with --cache-frozen: %zu reading batches took the cache, %zu computed it",
                  r->fc.hits, r->fc.misses);
        frozen_cache_free(&r->fc);
    }
    memset(r, 0, sizeof *r);
}

int recon_mix_micro(ReconMix *r, Engine *en, DfmModel *m, long step, int a, int accum, const dfm_mpi *mp,
                    float mse_weight, double *ce) {
    uint64_t g = (((uint64_t)step * (uint64_t)accum + (uint64_t)a) * (uint64_t)mp->size + (uint64_t)mp->rank) *
                 (uint64_t)r->B;
    loader_seek(&r->ld, g / r->ntrain, (size_t)(g % r->ntrain));
    loader_next(&r->ld, r->B, r->idx);
    DFM_TRY(data_batch(&r->ds, r->idx, r->B, m->dc.chunk_len, r->inp, r->tgt, r->tmem, r->tmask));
    size_t per_seq = (size_t)(r->T / m->dc.chunk_len) * (size_t)m->dc.n_slots;
    if (r->zero) memset(r->tmem, 0, (size_t)r->B * per_seq * (size_t)m->dc.d_mem * sizeof(float));
    float *mem = r->tmem;
    uint8_t *mask = r->tmask;
    if (r->shuffled) {
        margin_partner_memory(r->tmem, r->tmask, r->B, per_seq, m->dc.d_mem, r->smem, r->smask);
        mem = r->smem, mask = r->smask;
    }
    int cached = r->use_fc && frozen_cache_use(&r->fc, m, r->idx, r->B);
    engine_set_mse_weight(en, 0.0f);
    int rc = engine_forward(en, r->inp, r->tgt, mem, mask, r->B, r->T, MEM_TARGET, 1, r->weight / (float)accum);
    if (!rc && r->use_fc && !cached) frozen_cache_store(&r->fc, m, r->idx, r->B);
    if (!rc) rc = engine_backward(en);
    engine_set_mse_weight(en, mse_weight);
    *ce = m->ce;
    return rc;
}

int recon_mix_eval(ReconMix *r, Engine *en, DfmModel *m, long max_batches, int modes, EvalResult *e, int *ran) {
    *ran = 0;
    if (r->nval < 2) return DFM_OK;
    int B = r->nval < (size_t)r->B ? (int)r->nval : r->B;
    DFM_TRY(evaluate(en, m, &r->ds, NULL, r->ntrain, r->nval, B, max_batches, modes, e));
    *ran = 1;
    return DFM_OK;
}
