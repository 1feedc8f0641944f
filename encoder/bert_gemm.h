/* bert_gemm.h — the CPU encoder's linear layers: out[m, n] = inp[m, k] · W[n, k]^T + bias[n], with W
 * packed once, at load, into column panels for an AVX-512 or AVX2 register-blocked kernel.
 *
 * Why not OpenBLAS: its dispatcher does not know every CPU model (on a virtualised Sapphire Rapids it
 * falls back to SSE3 "Prescott" kernels, 80% of the encoder's time), and every call re-packs the weights.
 * Here the weights are packed once into panels of NR columns ([n / NR][k][NR], zero-padded), and an
 * MR x NR block of the output is accumulated in registers over the whole k, broadcasting from MR input
 * rows in place (copying them into slivers cost more than it saved at these sizes).
 *
 * Determinism: every output element is bias + sum over k in increasing order, one fused multiply-add per
 * term, whatever m, the tile and the thread: a row's result depends only on that row (and on the kernel
 * the CPU selects), never on the batch it is in or on the number of threads.
 *
 * Without AVX2+FMA (or with DFM_ENCODER_ISA=blas) the same calls go to OpenBLAS's cblas_sgemm on the
 * unpacked weights, single-threaded per call; its blocking follows m, so there a row's last bits can
 * depend on the chunk it is computed in (still never on the thread count). DFM_ENCODER_ISA=avx2 forces the AVX2 kernel (tests). */
#ifndef DFM_BERT_GEMM_H
#define DFM_BERT_GEMM_H

#include <stddef.h>

enum { BERT_ISA_BLAS = 0, BERT_ISA_AVX2 = 1, BERT_ISA_AVX512 = 2 };

/* A weight matrix W[n, k] ready for bert_gemm. */
typedef struct {
    int n, k;
    int isa;        /* BERT_ISA_* the panels are laid out for */
    const float *w; /* the unpacked weights (borrowed; used by the BLAS path) */
    float *panels;  /* [ceil(n / NR)][k][NR], 64-byte aligned; NULL on the BLAS path */
} bert_gemm_w;

/* The kernel this CPU runs: DFM_ENCODER_ISA (blas | avx2 | avx512) if set and supported, else the widest
 * of AVX-512F, AVX2+FMA, BLAS. */
int bert_gemm_isa(void);
/* "avx512" / "avx2" / "blas" */
const char *bert_gemm_isa_name(int isa);

/* Pack w[n, k] (borrowed: it must outlive p) for isa. DFM_ENOMEM. */
int bert_gemm_pack(bert_gemm_w *p, const float *w, int n, int k, int isa);
/* Free the panels; a zeroed or already freed p is a no-op. */
void bert_gemm_free(bert_gemm_w *p);

enum { BERT_ACT_NONE = 0, BERT_ACT_GELU = 1 };

/* out[m, p->n] = act(inp[m, p->k] · W^T + bias), single-threaded (rows stride p->k and p->n); act
 * BERT_ACT_GELU applies the erf GELU (bert.h's dfm_erf_approx) to each output while it is in registers. */
void bert_gemm(float *out, const float *inp, int m, const bert_gemm_w *p, const float *bias, int act);

#endif
