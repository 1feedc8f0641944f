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
 * depend on the chunk it is computed in (still never on the thread count). DFM_ENCODER_ISA=avx2 forces the AVX2 kernel (tests).
 *
 * Lower precisions (dfm encode --precision; AVX-512 only, refused elsewhere):
 *   bf16  weights packed as bf16 pairs ([n / 32][k / 2][32][2]), each tile's input rows rounded to bf16
 *         (round to nearest even), vdpbf16ps (avx512_bf16) multiplying pairs and accumulating in fp32;
 *   int8  weights symmetric per output channel (scale max|w| / 127, s8, packed [n / 32][k / 4][32][4]),
 *         each input row quantised on the fly to u8 with its own scale and zero point (min and max of the
 *         row, zero exactly representable: ONNX Runtime's DynamicQuantizeLinear, per row instead of per
 *         tensor), vpdpbusd (avx512_vnni) accumulating u8 x s8 products exactly in int32; the output is
 *         (acc - zp * colsum) * row scale * channel scale + bias, in fp32.
 * Bias, GELU and everything outside the linear layers stay fp32. Both keep the determinism above: the
 * bf16 dot products run in a fixed order, the int8 ones are exact. */
#ifndef DFM_BERT_GEMM_H
#define DFM_BERT_GEMM_H

#include <stddef.h>
#include <stdint.h>

enum { BERT_ISA_BLAS = 0, BERT_ISA_AVX2 = 1, BERT_ISA_AVX512 = 2 };
/* the multiply precision of a packed weight (the encoder's DFM_COMPUTE_F32 / _BF16 / _INT8) */
enum { BERT_PREC_F32 = 0, BERT_PREC_BF16 = 2, BERT_PREC_INT8 = 3 };

/* A weight matrix W[n, k] ready for bert_gemm. */
typedef struct {
    int n, k;
    int kp;         /* k rounded up to the precision's group (1 fp32, 2 bf16, 4 int8); the padding is zero */
    int isa;        /* BERT_ISA_* the panels are laid out for */
    int prec;       /* BERT_PREC_* */
    const float *w; /* the unpacked weights (borrowed; used by the BLAS path) */
    void *panels;   /* fp32 [ceil(n / NR)][k][NR], bf16 [..][kp / 2][NR][2], s8 [..][kp / 4][NR][4]; 64-byte
                     * aligned; NULL on the BLAS path */
    float *wscale;  /* int8: per output channel scale, [ceil(n / NR) * NR] (0 in the padding) */
    int32_t *colsum; /* int8: sum over k of each channel's s8 weights, same length */
} bert_gemm_w;

/* The kernel this CPU runs: DFM_ENCODER_ISA (blas | avx2 | avx512) if set and supported, else the widest
 * of AVX-512F, AVX2+FMA, BLAS. */
int bert_gemm_isa(void);
/* "avx512" / "avx2" / "blas" */
const char *bert_gemm_isa_name(int isa);
/* DFM_OK if this CPU (and isa) runs prec, else DFM_EUNSUPPORTED naming the missing instruction set (bf16:
 * AVX-512 with avx512_bf16; int8: AVX-512 with avx512_vnni and avx512bw) and a HINT. Checked at run time
 * (cpuid), so one binary runs everywhere and refuses rather than computing anything else. */
int bert_gemm_prec_check(int isa, int prec);

/* Pack w[n, k] (borrowed: it must outlive p) for isa and prec (checked with bert_gemm_prec_check).
 * DFM_ENOMEM, DFM_EUNSUPPORTED. */
int bert_gemm_pack(bert_gemm_w *p, const float *w, int n, int k, int isa, int prec);
/* Bytes of scratch bert_gemm needs for up to m rows of k inputs in prec (0 for fp32). */
size_t bert_gemm_scratch_bytes(int m, int k, int prec);
/* Free the panels; a zeroed or already freed p is a no-op. */
void bert_gemm_free(bert_gemm_w *p);

enum { BERT_ACT_NONE = 0, BERT_ACT_GELU = 1 };

/* out[m, p->n] = act(inp[m, p->k] · W^T + bias), single-threaded (rows stride p->k and p->n); act
 * BERT_ACT_GELU applies the erf GELU (bert.h's dfm_erf_approx) to each output while it is in registers. */
/* scratch: bert_gemm_scratch_bytes(m, p->k, p->prec) bytes, 64-byte aligned (the rounded or quantised input
 * rows; NULL for fp32). */
void bert_gemm(float *out, const float *inp, int m, const bert_gemm_w *p, const float *bias, int act, void *scratch);

#endif
