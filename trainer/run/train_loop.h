/* train_loop.h — dfm-train's training loop, written once against engine.h (CPU or CUDA) and data parallel
 * over MPI ranks; it evaluates through evaluate.h. */
#ifndef DFM_TRAINER_TRAIN_LOOP_H
#define DFM_TRAINER_TRAIN_LOOP_H

#include "trainer/data/data.h"
#include "trainer/model/model.h"
#include "trainer/run/train_opts.h"

/* Trains m's trainable parameters (the DFM modules, or the whole backbone of a pretraining model) on
 * ds for --steps optimizer steps, holding out the last train_held_out() sequences, evaluating every
 * --eval-every steps and at the end, and writing checkpoints to --out (--ckpt-every, and
 * ckpt_final.bin unless --no-ckpt) and the JSONL log. --resume continues bit-identically. On return
 * m holds the final parameters on the host; *rank is this process's MPI rank (only rank 0 writes). */
int train_loop(DfmModel *m, DataSet *ds, const TrainOpts *o, int *rank);

#endif
