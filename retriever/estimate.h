/* estimate.h — `dfm estimate`: memory per rank, disk and a rough time per stage before the jobs run. */
#ifndef DFM_RETRIEVER_ESTIMATE_H
#define DFM_RETRIEVER_ESTIMATE_H

#include <stdint.h>

typedef struct {
    int64_t ranks;       /* ranks the stages will run on */
    int64_t tokens;      /* corpus size in LM tokens (0: from the manifest or the inputs) */
    int64_t chunk_len;   /* tokens per chunk (used with tokens) */
    const char *factory; /* index factory string or "auto" */
    int64_t mem;         /* index memory budget per rank, bytes */
    int64_t train;       /* index training points (0: default) */
    int64_t k;           /* neighbours per chunk */
    int64_t qblock;      /* queries per rank per round */
    int64_t dim;         /* embedding dimension (0: from the manifest, else 384) */
    const char *tdtype;  /* dtype of target embeddings: fp32, fp16 or bf16 */
} dfm_estimate_config;

/* Print the estimate for arg: a run folder (sizes from its manifest) or a dfm build config (.json;
 * sizes from its inputs' bytes or cfg->tokens). Times use the run's measured rates where a stage has
 * run, else the defaults of BENCHMARKS.md. DFM_ESTATE without a size to start from. */
int dfm_estimate_run(const dfm_estimate_config *cfg, const char *arg);

#endif
