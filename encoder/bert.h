/* bert.h — internals of the encoder shared by bert_model.c (loading, tokenising, batching),
 * bert_cpu.c (the reference forward) and bert_cuda.cu (the same forward on the GPU).
 *
 * Activations are PACKED: a batch of B sequences of lengths len[b] is one [M, H] matrix of
 * M = sum(len) token rows, sequence b at rows off[b] .. off[b+1]-1. Per-token operations (GEMMs,
 * LayerNorm, GELU) run over M rows with no padding; attention runs per (sequence, head) over that
 * sequence's own rows only, which is exactly BERT's attention with a padding mask.
 */
#ifndef DFM_BERT_H
#define DFM_BERT_H

#include <stddef.h>
#include <stdint.h>

#include "encoder/encoder.h"
#include "encoder/wordpiece.h"

enum { DFM_POOL_MEAN = 0, DFM_POOL_CLS = 1, DFM_POOL_MAX = 2 };

typedef struct {
    int vocab, hidden, layers, heads, inter, max_pos, type_vocab;
    float ln_eps;
    int pooling;    /* DFM_POOL_* */
    int normalize;  /* modules.json had a Normalize module */
    int max_len;    /* tokens per text, [CLS]/[SEP] included */
    char arch[64];  /* "BertModel" */
} dfm_bert_config;

/* Weights in fp32, carved from one allocation (llm.c's ParameterTensors). Linear weights are
 * [out, in] row-major as in PyTorch; Q, K and V are concatenated into one [3H, H] matrix. */
typedef struct {
    float *wte;      /* [vocab, H] */
    float *wpe;      /* [max_pos, H] */
    float *wtt;      /* [type_vocab, H] */
    float *emb_ln_w, *emb_ln_b; /* [H] */
    struct bert_layer {
        float *qkv_w, *qkv_b;   /* [3H, H], [3H] */
        float *ao_w, *ao_b;     /* [H, H], [H] */
        float *ln1_w, *ln1_b;   /* [H] */
        float *fc_w, *fc_b;     /* [I, H], [I] */
        float *proj_w, *proj_b; /* [H, I], [H] */
        float *ln2_w, *ln2_b;   /* [H] */
    } *layer;
    float *mem;
    size_t n_floats;
} dfm_bert_weights;

/* One batch, packed. */
typedef struct {
    int n_seq;
    int n_tok;            /* M */
    const int32_t *ids;   /* [M] */
    const int *off;       /* [n_seq + 1] */
    int max_seq_len;      /* longest sequence in the batch */
} dfm_bert_batch;

typedef struct dfm_bert_cuda dfm_bert_cuda; /* device state (bert_cuda.cu) */

struct dfm_encoder {
    dfm_bert_config cfg;
    dfm_bert_weights w;
    dfm_wordpiece *wp;
    int device, compute;
    int batch;        /* texts per forward batch */
    int batch_tokens; /* and at most about this many tokens (a longer single text still runs) */
    uint64_t model_hash;
    dfm_encoder_stats stats;
    char desc[256];
    char *model_dir;
    struct bert_cpu *cpu; /* CPU state (bert_cpu.c): packed weights, per-thread work buffers */
    dfm_bert_cuda *cuda;
};

/* CPU (bert_cpu.c): pack the weights for the kernel this CPU runs (bert_gemm.h); free; the forward,
 * pooled, L2-normalised rows into out[n_seq * H]. */
int bert_cpu_init(dfm_encoder *enc);
void bert_cpu_free(dfm_encoder *enc);
int bert_forward_cpu(dfm_encoder *enc, const dfm_bert_batch *b, float *out);
/* "avx512" / "avx2" / "blas": the GEMM kernel the CPU forward runs */
const char *bert_cpu_kernel(const dfm_encoder *enc);

/* CUDA (bert_cuda.cu; stubs returning DFM_ECUDA when built without CUDA). */
int bert_cuda_init(dfm_encoder *enc);           /* upload weights, create handles */
void bert_cuda_free(dfm_encoder *enc);
int bert_forward_cuda(dfm_encoder *enc, const dfm_bert_batch *b, float *out);
int bert_cuda_device_count(void);

/* FLOPs of one batch (GEMMs + attention), for the stats. */
double bert_batch_flops(const dfm_bert_config *c, const dfm_bert_batch *b);

/* GELU with erf, in the float form used by both paths (max abs error vs erff-based ~1e-7). */
static inline float dfm_erf_approx(float x) {
    /* rational approximation on [-4, 4] (Eigen / XLA generic_fast_erf_float); +-1 beyond */
    x = x < -4.f ? -4.f : (x > 4.f ? 4.f : x);
    float x2 = x * x;
    float p = -2.72614225801306e-10f;
    p = p * x2 + 2.77068142495902e-08f;
    p = p * x2 + -2.10102402082508e-06f;
    p = p * x2 + -5.69250639462346e-05f;
    p = p * x2 + -7.34990630326855e-04f;
    p = p * x2 + -2.95459980854025e-03f;
    p = p * x2 + -1.60960333262415e-02f;
    p = p * x;
    float q = -1.45660718464996e-05f;
    q = q * x2 + -2.13374055278905e-04f;
    q = q * x2 + -1.68282697438203e-03f;
    q = q * x2 + -7.37332916720468e-03f;
    q = q * x2 + -1.42647390514189e-02f;
    return p / q;
}

#endif
