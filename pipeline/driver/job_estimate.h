/* job_estimate.h — `dfm estimate`: memory per rank, disk and time per stage before the jobs run, and which
 * target store (`--store embeddings` or `ids`) to use for the corpus. Index and retrieve are planned with the
 * cost model of retriever/estimate.h; chunk, encode and write-targets with growth fits (job_estimate.c). */
#ifndef DFM_PIPELINE_JOB_ESTIMATE_H
#define DFM_PIPELINE_JOB_ESTIMATE_H

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
    int64_t window;      /* dfm chunk --window-tokens (0: its default) */
    int64_t node_memory; /* memory of a training node, bytes, for the store advice (0: this machine's) */
    int64_t nprobe;      /* IVF lists searched per query (0: 16, an assumption: dfm retrieve tunes it) */
    int64_t margin;      /* dfm retrieve --margin */
    double visits;       /* ranks a query's IVF search visits, the slowest rank's share (its shard searches x P / queries),
                            as a run measured it; 0: the upper bound P (1 - (1 - 1/P)^nprobe) of lists placed at random */
    int64_t encode_gpus; /* > 0: encode on this many GPUs */
    double gpu_rate;     /* chunks per second per GPU (assumed until measured) */
    int json;            /* print one JSON object instead of the text */
} dfm_estimate_config;

/* Print the estimate for arg: a run folder (sizes from its manifest) or a dfm build config (.json;
 * sizes from its inputs' bytes or cfg->tokens).
 *
 * Per stage: memory per rank (the stage's bounded buffers and data structures plus the process's
 * measured base), disk, and time. Times are CPU-seconds of the slowest rank on one core of the
 * machine class the benchmarks measured. chunk and write-targets: t = a * n^b / P, n the stage's items
 * (tokens, chunks), P the ranks, scaled by (d / 64)^e (bench/retrieval/growth.sh, bench/results/report-retrieval.md "Cost growth");
 * encode: the CPU encoder's rate, or on GPUs an assumed rate; where the run's manifest has timed one of
 * these, its own time is scaled instead. index and retrieve: the slowest rank's work (k-means, coarse
 * distances, codes scanned, shard searches, rescorings: the counts retriever/work.h records) for the
 * job, times rates fitted on bench/retrieval/scaling.sh's measured ranks; where the run has a work record, the
 * model is calibrated by its slowest rank. The target-store advice compares the ids tables with
 * node_memory.
 * DFM_ESTATE without a size to start from. */
int dfm_estimate_run(const dfm_estimate_config *cfg, const char *arg);

#endif
