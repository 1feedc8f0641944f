/* train_loop.c — the training loop (see train_loop.h); the held-out evaluation is evaluate.c. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/fault.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/mpiutil.h"
#include "common/stop.h"
#include "trainer/kernels/adamw.h"
#include "trainer/model/checkpoint.h"
#include "trainer/model/flops.h"
#include "trainer/data/frozen_cache.h"
#include "trainer/model/model_config.h"
#include "trainer/kernels/rng.h"
#include "trainer/run/margin.h"
#include "trainer/run/reconstruct_mix.h"
#include "trainer/data/teacher.h"
#include "trainer/run/model_setup.h"
#include "trainer/run/evaluate.h"
#include "trainer/run/train_loop.h"

/* ---- the training loop ---------------------------------------------------------------------------------- */
/* Data parallel over MPI ranks: every rank draws the same global order; micro-batch a of a step takes
 * sequences [(a*W + r)*B, (a*W + r + 1)*B) of the step's accum*W*B for rank r of W. Gradients are
 * summed (engine_allreduce_grads: a fixed order for a fixed rank count) and divided by W, so a run on W
 * ranks with batch B equals a single-rank run with batch W*B up to the summation order.
 * A loader thread (prefetch.h) reads batches ahead; the next micro-batch's copy to the device is started
 * before the current one's backward, so it overlaps compute. "stall" in the log is the fraction of the
 * step spent waiting for data. */

/* One training run's state. */
typedef struct {
    DfmModel *m;
    DataSet *ds;
    const TrainOpts *o;
    dfm_mpi mp;
    EngineOptions eo;
    Engine *en;
    Loader ld;
    Prefetcher *pf;
    PrefetchBatch *cur; /* staged on the device for the next forward, or NULL */
    FILE *logf;         /* rank 0's JSONL log, or NULL */
    AdamWConfig ac;
    int B, T, L, use_t;
    size_t ntrain, nval, np;
    long step0;
    uint64_t done_epoch, done_pos; /* loader position after the last consumed batch */
    double fpt, peak;              /* model FLOPs per token; peak FLOP/s of one rank (0 = unknown) */
    uint8_t *mix;                  /* [B*NC] teacher-forcing draws of a micro-batch (--fusion-memory mixed) */
    FrozenCache fc;                /* --cache-frozen */
    int use_fc, fc_hit;
    int zero_memory;               /* --memory-ablation zero */
    int random_memory;             /* --memory-ablation random */
    TeacherSoft teacher;           /* --teacher: its rows, and a micro-batch's soft targets */
    int use_teacher;
    CeSoft soft;
    int *soft_ids;
    float *soft_p, *soft_w;
    uint8_t *soft_has;
    MarginConfig margin;           /* --margin-weight, --margin */
    float *shuf_mem;               /* the margin's partner memory of a micro-batch */
    uint8_t *shuf_mask;
    ReconMix recon;                /* --reconstruct-weight */
    int use_recon;
} Trainer;

/* One optimizer step's figures. */
typedef struct {
    double loss, ce, mse, grad_norm, stall;
    double ce_shuf, margin_active; /* --margin-weight: CE with the partner's memory; share of active hinges */
    double kl;                     /* --teacher: mean KL(teacher || model) over the rows it covers */
    double rec_ce;                 /* --reconstruct-weight: the reading micro-batches' mean CE */
    int stop; /* a rank received SIGTERM or SIGUSR1 before this step's gradient exchange: every rank stops after it */
} StepStats;

static json_t *run_config(const DfmModel *m, const TrainOpts *o) {
    return json_pack("{s:o, s:o, s:o, s:o}", "backbone", backbone_config_to_hf(&m->bc), "dfm",
                     dfm_config_to_json(&m->dc), "train", train_opts_json(o), "backbone_hash",
                     m->dc.enabled ? setup_backbone_hash(m) : json_string("trained"));
}

/* peak FLOP/s for MFU: --peak-tflops, else the H100/H200 SXM dense figures on a GPU; 0 on the CPU */
static double peak_flops(const TrainOpts *o, const EngineOptions *eo) {
    if (o->peak_tflops > 0) return o->peak_tflops * 1e12;
    if (!eo->cuda) return 0.0;
    return eo->bf16 ? 989.4e12 : 66.9e12;
}

/* --resume: parameters, AdamW moments and the loader position from the checkpoint, which must have been
 * written with the same configuration and backbone. */
static int trainer_resume(Trainer *t) {
    const TrainOpts *o = t->o;
    CkptInfo ci;
    json_t *saved = NULL;
    float *hp, *h1, *h2;
    engine_host_state(t->en, &hp, &h1, &h2);
    DFM_TRY(ckpt_load(o->resume, &ci, &saved, hp, h1, h2, t->np));
    json_t *now = run_config(t->m, o);
    const char *parts[4] = {"backbone", "dfm", "train", "backbone_hash"};
    int rc = DFM_OK;
    for (int i = 0; i < 4 && !rc; i++)
        if (!json_equal(json_object_get(saved, parts[i]), json_object_get(now, parts[i])))
            rc = DFM_FAIL(DFM_EMISMATCH, "%s was written with another %s configuration. HINT: resume with the "
                          "same flags and backbone as the run that wrote it", o->resume, parts[i]);
    json_decref(saved);
    json_decref(now);
    if (rc) return rc;
    if ((int)ci.mode != t->m->dc.enabled)
        return DFM_FAIL(DFM_EMISMATCH, "%s is a %s checkpoint", o->resume, ci.mode ? "DFM" : "pretraining");
    DFM_TRY(engine_load_state(t->en));
    t->step0 = (long)ci.step;
    loader_seek(&t->ld, ci.epoch, ci.pos);
    t->done_epoch = ci.epoch, t->done_pos = ci.pos;
    DFM_LOG_I("resumed from %s at step %ld (epoch %llu, position %llu)", o->resume, t->step0,
              (unsigned long long)ci.epoch, (unsigned long long)ci.pos);
    return DFM_OK;
}

/* --memory-ablation random: every valid target slot of the batch replaced by a random direction of the same norm,
 * a pure function of (--seed, chunk id, slot): the same chunk gets the same vector in every epoch and on any rank
 * split. The targets then carry no information about the text, only a fixed code per chunk. */
static void random_memory(Trainer *t, PrefetchBatch *b) {
    int NC = t->T / t->L, K = t->m->dc.n_slots, d = t->m->dc.d_mem;
    for (int i = 0; i < t->B; i++)
        for (int c = 0; c < NC; c++)
            for (int j = 0; j < K; j++) {
                size_t s = ((size_t)i * NC + c) * K + j;
                if (!b->tmask[s]) continue;
                float *v = b->tmem + s * d;
                double norm = 0.0, rn = 0.0;
                for (int e = 0; e < d; e++) norm += (double)v[e] * v[e];
                dfm_rng r;
                rng_seed(&r, ((uint64_t)t->o->seed << 40) ^ (((uint64_t)b->idx[i] * NC + c) * 4099u + (uint64_t)j));
                rng_normal(&r, v, (size_t)d, 1.0f);
                for (int e = 0; e < d; e++) rn += (double)v[e] * v[e];
                float sc = rn > 0.0 ? (float)sqrt(norm / rn) : 0.0f;
                for (int e = 0; e < d; e++) v[e] *= sc;
            }
}

/* Stage the next prefetched micro-batch on the device; its wait for data is added to *stall. */
static int stage_next(Trainer *t, double *stall) {
    double waited = 0.0;
    PrefetchBatch *nxt = NULL;
    int rc = prefetch_next(t->pf, &nxt, &waited);
    *stall += waited;
    if (!rc && t->zero_memory && nxt->tmem) /* --memory-ablation zero: no content, the same everything else */
        memset(nxt->tmem, 0, (size_t)t->B * (t->T / t->L) * t->m->dc.n_slots * t->m->dc.d_mem * sizeof(float));
    if (!rc && t->random_memory && nxt->tmem) random_memory(t, nxt);
    if (!rc) rc = engine_stage(t->en, nxt->inputs, nxt->targets, nxt->tmem, nxt->tmask, t->B, t->T);
    t->cur = nxt;
    return rc;
}

/* The memory this step's forward of the staged batch t->cur fuses (--fusion-memory). mixed:P: each chunk
 * its target with probability P (falling linearly to 0 at the last step with :decay), drawn from (--seed,
 * step, sequence index, chunk) alone: resumed runs and any rank split draw the same. */
static int train_memory_mode(Trainer *t, long step) {
    const DfmConfig *dc = &t->m->dc;
    if (dc->fusion_memory == FUSION_MEM_PREDICTED) return MEM_PREDICTED;
    if (dc->fusion_memory == FUSION_MEM_TARGET) return MEM_TARGET;
    double p = dc->tf_prob * (dc->tf_decay ? 1.0 - (double)step / (double)t->o->steps : 1.0);
    int NC = t->T / t->L;
    model_memory_mix_draw(t->mix, t->cur->idx, t->B, NC, p, (uint64_t)t->o->seed * 0x9E3779B97F4A7C15ull + (uint64_t)step);
    model_set_memory_mix(t->m, t->mix, t->B * NC);
    return MEM_MIXED;
}

/* The margin's passes (margin.h) over the staged batch t->cur: the frozen cache before and after each */
static void margin_before(void *p, int pass) {
    Trainer *t = p;
    (void)pass;
    t->fc_hit = t->use_fc && frozen_cache_use(&t->fc, t->m, t->cur->idx, t->B);
}
static void margin_after(void *p, int pass) {
    Trainer *t = p;
    (void)pass;
    if (t->use_fc && !t->fc_hit) frozen_cache_store(&t->fc, t->m, t->cur->idx, t->B);
}

static int margin_micro(Trainer *t, int mode, float scale, StepStats *s) {
    const PrefetchBatch *c = t->cur;
    MarginBatch mb = {c->inputs, c->targets, c->tmem, c->tmask, t->shuf_mem, t->shuf_mask, t->B, t->T};
    MarginHooks hk = {margin_before, margin_after, t};
    MarginResult r;
    DFM_TRY(margin_step(t->en, t->m, &t->margin, &mb, mode, scale, (float)t->o->mse_weight, &hk, &r));
    s->loss += r.loss * scale;
    s->ce += r.ce_own * scale;
    s->mse += r.mse * scale;
    s->ce_shuf += r.ce_shuf * scale;
    s->margin_active += r.active * scale;
    return DFM_OK;
}

/* Forward and backward of --accum micro-batches, gradients summed over the ranks; the mean losses into s.
 * more_after: a batch follows this step without an evaluation between (then the last micro-batch's
 * backward overlaps the next one's copy). */
static int accumulate(Trainer *t, long step, int more_after, StepStats *s) {
    const TrainOpts *o = t->o;
    DfmModel *m = t->m;
    int rc = engine_zero_grad(t->en);
    for (int a = 0; a < o->accum && !rc; a++) {
        if (!t->cur) { /* first micro-batch of the run (later ones were staged during the previous backward) */
            if ((rc = stage_next(t, &s->stall))) break;
        }
        int mode = m->dc.enabled ? train_memory_mode(t, step) : MEM_NONE;
        int more = a + 1 < o->accum || more_after;
        /* the margin's passes and the reading pass forward batches of their own: the next batch is staged after
         * them (no overlap); else during this backward. (Never across an evaluation: its forwards would consume
         * the staged batch first.) */
        int stage_late = t->margin.weight > 0 || t->use_recon;
        if (t->margin.weight > 0) {
            rc = margin_micro(t, mode, 1.0f / (float)o->accum, s);
            t->done_epoch = t->cur->epoch, t->done_pos = t->cur->pos;
            prefetch_release(t->pf, t->cur);
            t->cur = NULL;
        } else {
            int cached = t->use_fc && frozen_cache_use(&t->fc, m, t->cur->idx, t->B);
            if (t->use_teacher) { /* the batch's soft targets, for this forward only */
                teacher_soft_fill(&t->teacher, t->cur->idx, t->B, t->soft_ids, t->soft_p, t->soft_has, t->soft_w);
                model_set_soft_targets(m, &t->soft);
            }
            rc = engine_forward(t->en, NULL, NULL, NULL, NULL, t->B, t->T, mode, 1, 1.0f / (float)o->accum);
            if (!rc && t->use_fc && !cached) frozen_cache_store(&t->fc, m, t->cur->idx, t->B);
            t->done_epoch = t->cur->epoch, t->done_pos = t->cur->pos;
            prefetch_release(t->pf, t->cur); /* consumed: its buffers are on the device (or used) */
            t->cur = NULL;
            if (!rc && more && !stage_late) rc = stage_next(t, &s->stall); /* overlaps this backward */
            if (!rc) rc = engine_backward(t->en);
            s->loss += m->loss / o->accum;
            s->ce += m->ce / o->accum;
            s->mse += m->mse / o->accum;
            if (t->use_teacher) s->kl += m->kl / o->accum;
        }
        if (!rc && t->use_recon) {
            double rce = 0.0;
            rc = recon_mix_micro(&t->recon, t->en, m, step, a, (int)o->accum, &t->mp, (float)o->mse_weight, &rce);
            s->rec_ce += rce / o->accum;
            s->loss += t->recon.weight * rce / o->accum;
        }
        if (!rc && more && stage_late) rc = stage_next(t, &s->stall);
    }
    DFM_TRY(dfm_mpi_agree(&t->mp, rc));
    int W = t->mp.size;
    s->stop = dfm_stop_signal() != 0;
    if (W > 1) { /* the stop flag rides on the losses' sum: every rank sees the same decision, at no extra cost */
        double parts[8] = {s->loss, s->ce, s->mse, (double)s->stop, s->ce_shuf, s->margin_active, s->kl, s->rec_ce};
        DFM_TRY(engine_allreduce_grads(t->en, &t->mp));
        DFM_TRY(DFM_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, parts, 8, MPI_DOUBLE, MPI_SUM, t->mp.comm)));
        s->loss = parts[0] / W;
        s->ce = parts[1] / W;
        s->mse = parts[2] / W;
        s->stop = parts[3] > 0;
        s->ce_shuf = parts[4] / W;
        s->margin_active = parts[5] / W;
        s->kl = parts[6] / W;
        s->rec_ce = parts[7] / W;
    }
    return DFM_OK;
}

/* One optimizer step: accumulate, clip the gradient norm, AdamW at the scheduled learning rate. */
static int train_step(Trainer *t, long step, int more_after, StepStats *s) {
    const TrainOpts *o = t->o;
    memset(s, 0, sizeof *s);
    DFM_TRY(accumulate(t, step, more_after, s));
    DFM_TRY(engine_grad_norm(t->en, &s->grad_norm));
    double gn = s->grad_norm;
    if (!isfinite(gn)) return DFM_FAIL(DFM_ERANGE, "gradient norm is %f at step %ld. HINT: lower --lr", gn, step);
    if (o->clip > 0 && gn > o->clip) DFM_TRY(engine_grad_scale(t->en, (float)(o->clip / gn)));
    t->ac.lr = lr_schedule(step, o->warmup, o->steps, (float)o->lr, (float)o->min_lr_frac);
    return engine_adamw(t->en, &t->ac, step + 1);
}

/* The step's line in the log (rank 0) and in the JSONL log; dt: its seconds. */
static void log_step(const Trainer *t, long step, const StepStats *s, double dt) {
    const TrainOpts *o = t->o;
    int W = t->mp.size;
    double tps = (double)o->accum * W * t->B * t->T / dt;
    double mfu = t->peak > 0 ? tps * t->fpt / (W * t->peak) : NAN;
    char mfus[32] = "";
    char mfus_json[32] = "null";
    if (t->peak > 0) {
        snprintf(mfus, sizeof mfus, " | MFU %.1f%%", 100.0 * mfu);
        snprintf(mfus_json, sizeof mfus_json, "%.4f", mfu);
    }
    float lr = t->ac.lr;
    if (t->mp.rank) {
    } else if (t->m->dc.enabled)
        DFM_LOG_I("step %5ld/%lld | loss %.4f (ce %.4f mse %.4f) | lr %.2e | norm %.3f | %.0f tok/s%s | stall %.1f%% "
                  "| %.0f ms",
                  step + 1, (long long)o->steps, s->loss, s->ce, s->mse, lr, s->grad_norm, tps, mfus,
                  100.0 * s->stall / dt, dt * 1e3);
    else
        DFM_LOG_I("step %5ld/%lld | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s%s | stall %.1f%% | %.0f ms",
                  step + 1, (long long)o->steps, s->loss, lr, s->grad_norm, tps, mfus, 100.0 * s->stall / dt, dt * 1e3);
    if (!t->mp.rank && t->use_teacher)
        DFM_LOG_I("          teacher | KL(teacher || model) %.4f nats per covered row", s->kl);
    if (!t->mp.rank && t->use_recon)
        DFM_LOG_I("      reconstruct | CE %.4f of the step's reading micro-batches (in the loss x %g)", s->rec_ce,
                  t->recon.weight);
    if (!t->mp.rank && t->margin.weight > 0)
        DFM_LOG_I("           margin | ce own %.4f, partner's memory %.4f (%+.4f) | hinge active in %.0f%% of micro-batches",
                  s->ce, s->ce_shuf, s->ce_shuf - s->ce, 100.0 * s->margin_active);
    if (t->logf) {
        char margin_json[96] = "";
        if (t->margin.weight > 0)
            snprintf(margin_json, sizeof margin_json, ", \"ce_shuffled\": %.6f, \"margin_active\": %.4f", s->ce_shuf,
                     s->margin_active);
        if (t->use_teacher) snprintf(margin_json, sizeof margin_json, ", \"kl_teacher\": %.6f", s->kl);
        char recon_json[48] = "";
        if (t->use_recon) snprintf(recon_json, sizeof recon_json, ", \"rec_ce\": %.6f", s->rec_ce);
        fprintf(t->logf,
                "{\"step\": %ld, \"loss\": %.6f, \"ce\": %.6f, \"mse\": %.6f, \"lr\": %.6e, \"grad_norm\": %.6f, "
                "\"tok_per_s\": %.1f, \"ms\": %.1f, \"stall\": %.4f, \"mfu\": %s%s%s}\n",
                step + 1, s->loss, s->ce, s->mse, lr, s->grad_norm, tps, dt * 1e3, s->stall / dt, mfus_json, margin_json,
                recon_json);
        fflush(t->logf);
    }
}

/* Parameters back to the host (every rank: the final export reads them) and, on rank 0 unless
 * --no-ckpt, OUT/ckpt_STEP.bin or OUT/ckpt_final.bin. The outcome is agreed over the ranks. */
static int save_checkpoint(Trainer *t, long step, int last) {
    float *hp, *h1, *h2;
    DFM_TRY(engine_sync_host(t->en, &hp, &h1, &h2));
    if (t->mp.rank != 0 || t->o->no_ckpt) return dfm_mpi_agree(&t->mp, DFM_OK);
    CkptInfo ci = {.mode = (uint32_t)t->m->dc.enabled, .step = (uint64_t)step + 1, .epoch = t->done_epoch,
                   .pos = t->done_pos, .n_params = t->np};
    char name[64];
    snprintf(name, sizeof name, last ? "ckpt_final.bin" : "ckpt_%06ld.bin", step + 1);
    char *cp = dfm_path_join(t->o->out, name);
    json_t *cfg = run_config(t->m, t->o);
    int rc = ckpt_save(cp, &ci, cfg, hp, h1, h2);
    json_decref(cfg);
    if (!rc) DFM_LOG_I("checkpoint %s", cp);
    if (rc) { /* (a full disk): say what a resume still has; the temporary was removed, nothing else touched */
        char cause[1536];
        snprintf(cause, sizeof cause, "%s", dfm_last_error());
        char *prev = NULL;
        CkptInfo pi;
        ckpt_newest(t->o->out, ci.step, &prev, &pi);
        if (prev)
            rc = DFM_FAIL(rc, "checkpoint %s of step %llu was not written (%s); the previous one, %s of step %llu, is "
                          "intact (checksum checked). HINT: free space, then run the same command with --resume %s",
                          cp, (unsigned long long)ci.step, cause, prev, (unsigned long long)pi.step, prev);
        else
            rc = DFM_FAIL(rc, "checkpoint %s of step %llu was not written (%s), and %s holds no earlier one: a re-run "
                          "starts from step 0. HINT: free space, or --out on a larger disk", cp,
                          (unsigned long long)ci.step, cause, t->o->out);
        free(prev);
    }
    free(cp);
    return dfm_mpi_agree(&t->mp, rc);
}

/* SIGTERM or SIGUSR1 reached a rank (common/stop.h): after step `step` every rank stops here, with a
 * checkpoint a resume continues from bit-identically; DFM_ESTOPPED, which main turns into
 * DFM_EXIT_STOPPED (jobs/dfm-train.sbatch requeues on it). */
static int stop_after(Trainer *t, long step) {
    int sig = dfm_stop_signal();
    const char *why = sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : "another rank's signal";
    if (t->o->no_ckpt)
        return DFM_FAIL(DFM_ESTOPPED, "stopped by %s after step %ld of %lld; --no-ckpt: no checkpoint written, the "
                        "steps are lost", why, step + 1, (long long)t->o->steps);
    DFM_TRY(save_checkpoint(t, step, 0));
    char name[64];
    snprintf(name, sizeof name, "ckpt_%06ld.bin", step + 1);
    char *cp = dfm_path_join(t->o->out, name);
    int rc = DFM_FAIL(DFM_ESTOPPED, "stopped by %s after step %ld of %lld, checkpoint %s written. HINT: run the same "
                      "command with --resume %s to go on (jobs/dfm-train.sbatch requeues and does)", why, step + 1,
                      (long long)t->o->steps, cp ? cp : name, cp ? cp : name);
    free(cp);
    return rc;
}

/* --reconstruct-weight: the held-out chunks' reconstruction, own slot against shuffled slot and fusion off, logged
 * and written as {"step", "reconstruct": eval_json} */
static int eval_reading(Trainer *t, long step) {
    EvalResult e;
    int ran = 0;
    DFM_TRY(recon_mix_eval(&t->recon, t->en, t->m, t->o->eval_batches, train_eval_modes(t->o), &e, &ran));
    if (!ran) {
        DFM_LOG_I("eval step %ld: reconstruction not evaluated: fewer than 2 chunks of the held-out sequences", step);
        return DFM_OK;
    }
    DFM_LOG_I("eval step %ld: reconstruction of %ld batches of held-out chunks: CE own slot %.4f, shuffled slot %.4f "
              "(%+.4f), fusion off %.4f; top-1 %.2f%% against %.2f%%", step, e.n_batches, e.ce_target,
              e.ce_target_shuf, e.ce_target_shuf - e.ce_target, e.ce_none, 100.0 * e.acc[EVAL_TARGET],
              100.0 * e.acc[EVAL_TARGET_SHUF]);
    if (t->logf) {
        json_t *j = json_pack("{s:I, s:o}", "step", (json_int_t)step, "reconstruct", eval_json(t->m, &e, 1));
        char *txt = json_dumps(j, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
        if (txt) fprintf(t->logf, "%s\n", txt);
        free(txt);
        json_decref(j);
        fflush(t->logf);
    }
    eval_result_free(&e);
    return DFM_OK;
}

/* The steps from t->step0 to --steps, with evaluations and checkpoints. */
static int run_steps(Trainer *t) {
    const TrainOpts *o = t->o;
    int rc = DFM_OK;
    for (long step = t->step0; step < o->steps && !rc; step++) {
        dfm_fault_delay(); /* tests only (common/fault.h): hold a job open; outside the step's time */
        double t0 = dfm_now();
        int last = step + 1 == o->steps;
        int eval_now = (o->eval_every > 0 && (step + 1) % o->eval_every == 0) || last;
        StepStats s;
        if ((rc = train_step(t, step, !last && !eval_now, &s))) break;
        log_step(t, step, &s, dfm_now() - t0);
        if (s.stop && !last) { /* (an evaluation due at this step is not made: a stop must be quick) */
            rc = stop_after(t, step);
            break;
        }
        if (eval_now) {
            EvalResult e;
            rc = evaluate(t->en, t->m, t->ds, t->pf, t->ntrain, t->nval, t->B, o->eval_batches, train_eval_modes(o), &e);
            if (rc) break;
            eval_print(t->logf, step + 1, t->m, &e, t->use_t);
            eval_result_free(&e);
            if (t->use_recon && (rc = eval_reading(t, step + 1))) break;
        }
        if (last || (!o->no_ckpt && o->ckpt_every > 0 && (step + 1) % o->ckpt_every == 0))
            rc = save_checkpoint(t, step, last);
    }
    return rc;
}

/* --teacher: the file checked against the data, and the buffers of a micro-batch's soft targets (host memory,
 * on either device: the CUDA model copies them up in its forward) */
static int trainer_open_teacher(Trainer *t) {
    const TrainOpts *o = t->o;
    if (!t->m->dc.enabled || !t->use_t || t->margin.weight > 0)
        return DFM_FAIL(DFM_EARG, "--teacher trains the DFM modules with --targets, without --margin-weight "
                        "(each needs its own passes). HINT: drop --margin-weight");
    DFM_TRY(teacher_soft_open(o->teacher, t->ds, t->L, t->m->bc.vocab_size, t->ntrain, (float)o->gain_weighting,
                              &t->teacher));
    t->teacher.ce_weight = (float)o->ce_weight;
    size_t rows = (size_t)t->B * t->T, S = (size_t)t->teacher.S;
    t->soft_ids = malloc(rows * S * sizeof(int));
    t->soft_p = malloc(rows * S * sizeof(float));
    t->soft_w = malloc(rows * sizeof(float));
    t->soft_has = malloc(rows);
    if (!t->soft_ids || !t->soft_p || !t->soft_w || !t->soft_has) return DFM_FAIL(DFM_ENOMEM, "the teacher's soft targets");
    t->soft = (CeSoft){.ids = t->soft_ids, .p = t->soft_p, .has = t->soft_has, .row_w = t->soft_w, .S = (int)S,
                       .weight = (float)o->distill_weight};
    t->use_teacher = 1;
    DFM_LOG_I("--teacher %s: top %d of the teacher pasting %u slots; KL weight %g%s", o->teacher, (int)S,
              t->teacher.f->hdr.paste, o->distill_weight, o->gain_weighting >= 0 ? "; CE weighted by the teacher's gain" : "");
    if (o->gain_weighting >= 0)
        DFM_LOG_I("--gain-weighting %g: row weight %g + %g * gain / %.4f (the mean gain per training row)", o->gain_weighting,
                  o->gain_weighting, 1.0 - o->gain_weighting, t->teacher.mean_gain);
    return DFM_OK;
}

/* Loader (and --resume), the prefetching threads, the log file; then the steps. */
static int trainer_run(Trainer *t) {
    const TrainOpts *o = t->o;
    DfmModel *m = t->m;
    model_trainable_params(m, &t->np);
    if (m->dc.enabled && !(t->mix = calloc((size_t)t->B * (t->T / t->L), 1)))
        return DFM_FAIL(DFM_ENOMEM, "teacher-forcing draws");
    t->zero_memory = o->memory_ablation && !strcmp(o->memory_ablation, "zero");
    t->random_memory = o->memory_ablation && !strcmp(o->memory_ablation, "random");
    if (t->zero_memory || t->random_memory) {
        if (!t->use_t)
            return DFM_FAIL(DFM_EARG, "--memory-ablation %s replaces the target memory of DFM training: give --targets",
                            o->memory_ablation);
        if (t->zero_memory)
            DFM_LOG_I("--memory-ablation zero: every training batch's target slots are 0 (the matched-capacity control)");
        else
            DFM_LOG_I("--memory-ablation random: every valid target slot is a fixed random direction of its norm per "
                      "(chunk, slot): the value of the real targets is predicted-memory CE against this run's");
    }
    if (o->margin_weight > 0) {
        if (!m->dc.enabled || !t->use_t || m->dc.fusion_memory == FUSION_MEM_PREDICTED || t->B < 2)
            return DFM_FAIL(DFM_EARG, "--margin-weight compares each sequence's target memory with another's: it "
                            "needs DFM training with --targets, --fusion-memory target or mixed:P, and --batch 2 or more");
        size_t S = (size_t)t->B * (t->T / t->L) * m->dc.n_slots;
        t->margin = (MarginConfig){(float)o->margin_weight, (float)o->margin};
        t->shuf_mem = malloc(S * m->dc.d_mem * sizeof(float));
        t->shuf_mask = malloc(S);
        if (!t->shuf_mem || !t->shuf_mask) return DFM_FAIL(DFM_ENOMEM, "the margin's partner memory");
        DFM_LOG_I("--margin-weight %g --margin %g: each micro-batch also runs with its partner's target memory",
                  o->margin_weight, o->margin);
    }
    if (o->teacher) DFM_TRY(trainer_open_teacher(t));
    if (o->reconstruct_weight > 0) {
        if (!m->dc.enabled)
            return DFM_FAIL(DFM_EARG, "--reconstruct-weight trains the DFM modules to read their memory: pretraining has none");
        DFM_TRY(recon_mix_open(&t->recon, o, m, t->ntrain, o->cache_frozen && !t->eo.cuda));
        t->use_recon = 1;
    }
    DFM_TRY(loader_init(&t->ld, 0, t->ntrain, (uint64_t)o->seed, 1));
    if (o->cache_frozen) {
        if (t->eo.cuda)
            return DFM_FAIL(DFM_EARG, "--cache-frozen keeps the frozen layers' outputs in host memory for the CPU "
                            "engine. HINT: drop it with --device cuda");
        DFM_TRY(frozen_cache_create(&t->fc, m, t->ntrain, t->B, t->T));
        t->use_fc = 1;
        DFM_LOG_I("--cache-frozen: layers 0..%d and the predictor's input kept per training sequence (up to %.2f GB); "
                  "later epochs start at layer %d", m->dc.fusion_layers[0], t->fc.map_bytes / 1e9,
                  m->dc.fusion_layers[0]);
    }
    if (o->resume) DFM_TRY(trainer_resume(t));
    PrefetchAllocator pa = engine_host_allocator(t->en);
    int lt = o->loader_threads > 0 ? (int)o->loader_threads : (t->eo.cuda ? 4 : 1);
    DFM_TRY(prefetch_start(&t->pf, t->ds, &t->ld, t->B, t->L, t->use_t, t->mp.rank, t->mp.size, (int)o->prefetch, lt,
                           pa.alloc ? &pa : NULL));
    char *logpath = o->log ? strdup(o->log) : dfm_path_join(o->out, "log.jsonl");
    t->logf = t->mp.rank ? NULL : fopen(logpath, o->resume ? "a" : "w");
    if (!t->logf && !t->mp.rank) DFM_LOG_W("cannot write the log %s; going on without it", logpath);
    free(logpath);
    t->ac = (AdamWConfig){.lr = (float)o->lr, .beta1 = 0.9f, .beta2 = (float)o->beta2, .eps = 1e-8f,
                          .weight_decay = (float)o->wd};
    t->fpt = model_train_flops_per_token(m, t->T);
    t->peak = peak_flops(o, &t->eo);
    DFM_LOG_I("training %zu parameters (%s), %lld steps of %lld x %d x %d tokens on %d rank(s); %.7g GFLOP per token",
              t->np, m->dc.enabled ? "DFM modules; backbone frozen" : "backbone", (long long)o->steps,
              (long long)o->accum, t->B, t->T, t->mp.size, t->fpt / 1e9);
    return run_steps(t);
}

int train_loop(DfmModel *m, DataSet *ds, const TrainOpts *o, int *rank) {
    Trainer t;
    memset(&t, 0, sizeof t);
    t.m = m, t.ds = ds, t.o = o;
    DFM_TRY(dfm_mpi_init(NULL, NULL, &t.mp));
    *rank = t.mp.rank;
    t.B = (int)o->batch, t.T = (int)o->seq_len, t.L = m->dc.enabled ? m->dc.chunk_len : t.T;
    t.use_t = m->dc.enabled && ds->tgt;
    if (m->dc.enabled && m->dc.fusion_memory != FUSION_MEM_PREDICTED && !t.use_t) {
        if (strcmp(o->fusion_memory, TRAIN_FUSION_MEMORY_DEFAULT))
            return DFM_FAIL(DFM_EARG, "--fusion-memory %s trains on the target memory. HINT: --targets, or "
                            "--fusion-memory predicted", o->fusion_memory);
        DFM_LOG_I("no --targets: fusion trains on predicted memory (the default %s needs target memory)",
                  TRAIN_FUSION_MEMORY_DEFAULT);
        m->dc.fusion_memory = FUSION_MEM_PREDICTED;
    }

    t.nval = train_held_out(o, ds);
    if (t.nval >= ds->n_seq) return DFM_FAIL(DFM_EARG, "%zu sequences leave nothing to train on after %zu held out. "
                                             "HINT: --val-seqs or more data", ds->n_seq, t.nval);
    t.ntrain = ds->n_seq - t.nval;
    DFM_LOG_I("split: %zu training sequences, %zu held out (the last ones)", t.ntrain, t.nval);
    DFM_TRY(train_engine_options(o, &t.eo));
    int rc = dfm_mpi_agree(&t.mp, engine_create(m, &t.eo, &t.mp, &t.en));
    if (!rc) {
        DFM_LOG_I("engine: %s", engine_describe(t.en));
        rc = trainer_run(&t);
    }
    if (t.logf) fclose(t.logf);
    engine_free(t.en); /* first: it waits for the device, which may still read a staged pinned buffer */
    prefetch_stop(t.pf);
    loader_free(&t.ld);
    free(t.mix);
    free(t.shuf_mem);
    free(t.shuf_mask);
    if (t.use_teacher) teacher_soft_close(&t.teacher);
    if (t.use_recon) recon_mix_close(&t.recon);
    free(t.soft_ids), free(t.soft_p), free(t.soft_w), free(t.soft_has);
    if (t.use_fc)
        DFM_LOG_I("--cache-frozen: %zu batches started at layer %d, %zu computed it", t.fc.hits, m->dc.fusion_layers[0],
                  t.fc.misses);
    frozen_cache_free(&t.fc);
    return rc;
}
