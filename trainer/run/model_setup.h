/* model_setup.h — a DfmModel from dfm-train's flags: the pretraining backbone's shape, the DFM modules
 * on a frozen Hugging Face backbone, and trained modules loaded back (checkpoint or safetensors). */
#ifndef DFM_TRAINER_MODEL_SETUP_H
#define DFM_TRAINER_MODEL_SETUP_H

#include <jansson.h>

#include "trainer/data/data.h"
#include "trainer/model/model.h"
#include "trainer/run/train_opts.h"

/* The decoder `dfm-train pretrain` trains: --arch, --layers, --hidden, --heads, --kv-heads, --head-dim,
 * --ffn, --untied, --seq-len; --vocab (default: ds's largest token id + 1, rounded up to 64).
 * DFM_EARG for an unknown --arch or a vocabulary that does not hold ds's tokens. */
int setup_pretrain_config(const TrainOpts *o, const DataSet *ds, BackboneConfig *bc);

/* A DFM model on the frozen backbone folder --backbone, for batches of B sequences of T tokens. The
 * slot shape is --slots / --d-mem, else K / d (the targets'; 0 = the defaults); with --modules, the
 * modules' stored DFM config wins. The backbone's weights are loaded, the modules initialised from
 * --seed; the shape is logged. */
int setup_dfm_model(const TrainOpts *o, int T, int B, int K, int d, DfmModel **out);

/* The frozen backbone alone (no DFM modules), for commands that only run it forward (`dfm-train hidden`, `slots`,
 * `teacher`): the folder's config into *bc (its max_seq set to T), a model for batches of B sequences of T tokens,
 * the weights loaded. The errors of hf_read_config, model_create and hf_load_backbone. */
int setup_frozen_backbone(const char *dir, int B, int T, BackboneConfig *bc, DfmModel **out);

/* The DFM config stored with trained modules (a checkpoint's "dfm" or a safetensors export's
 * "dfm_config"). DFM_EFORMAT without one, DFM_EMISMATCH for a pretraining checkpoint. */
int setup_modules_config(const char *path, DfmConfig *dc);

/* Trained modules into m from a checkpoint or a safetensors export; DFM_EMISMATCH when they were
 * trained on another backbone (its weights hash differs) or the checkpoint is a pretraining one. */
int setup_load_modules(DfmModel *m, const char *path);

/* --init-modules: trained modules into m as its starting point (a fresh optimizer follows), refused with
 * DFM_EMISMATCH naming the first field where their stored DFM config places or shapes them otherwise than m
 * (fusion layers, slots, dimensions, predictor, alignment: what their weights mean), or when they were
 * trained on another backbone. Training choices (teacher forcing, losses) may differ. */
int setup_init_modules(DfmModel *m, const char *path);

/* --centre-memory: m's memory centre (DfmConfig.mem_centre) = the mean valid target slot of the first
 * min(n_train, SETUP_CENTRE_SEQS) sequences of ds (read in order, B at a time, summed in double: the same for
 * any rank count and thread count). DFM_EARG without targets or with d_mem > DFM_MAX_CENTRE. */
#define SETUP_CENTRE_SEQS 4096
int setup_memory_centre(DfmModel *m, DataSet *ds, size_t n_train, int B);

/* XXH3-64 of the frozen backbone's weights as 16 hex digits (new reference), so DFM checkpoints refuse
 * another backbone of the same shape. */
json_t *setup_backbone_hash(const DfmModel *m);

#endif
