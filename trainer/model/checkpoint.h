/* checkpoint.h — training checkpoints: everything a run needs to continue bit-identically.
 *
 * The file's layout (header, JSON, params, AdamW moments; XXH3-64 checksum) is schemas/checkpoint.md.
 * The trainable block is the DFM modules in DFM mode (the frozen backbone is reloaded from its folder) or
 * the whole backbone when pretraining.
 */
#ifndef DFM_TRAINER_CHECKPOINT_H
#define DFM_TRAINER_CHECKPOINT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t mode;
    uint64_t step, epoch, pos;
    size_t n_params;
} CkptInfo;

/* Write atomically. */
int ckpt_save(const char *path, const CkptInfo *info, json_t *config, const float *params, const float *m,
              const float *v);
/* Read and validate (magic, version, size, checksum). n_params must equal info->n_params of the file
 * (DFM_EMISMATCH otherwise). *config (may be NULL) receives the JSON (json_decref it). */
int ckpt_load(const char *path, CkptInfo *info, json_t **config, float *params, float *m, float *v,
              size_t n_params);
/* Only the header and config (to build the model before loading); the whole file is checked (size,
 * checksum) as by ckpt_load. */
int ckpt_peek(const char *path, CkptInfo *info, json_t **config);

/* The newest checkpoint in dir that opens whole (ckpt_peek) among ckpt_final.bin and ckpt_NNNNNN.bin of a step
 * below below_step (0: any): *path (malloc'd) and its *info; *path is NULL when there is none. For the
 * message of a failed save, which says what a resume still has. */
int ckpt_newest(const char *dir, uint64_t below_step, char **path, CkptInfo *info);

#endif
