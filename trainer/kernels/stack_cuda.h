/* stack_cuda.h — the decoder-layer stack of trainer/kernels/stack.h on NVIDIA GPUs.
 *
 * The same StackConfig / StackParams / StackActs / StackScratch structs as the CPU stack, with every
 * pointer on the device, carved by the same layout (model_carve_*), and the same layer math as
 * stack_layer_forward / stack_layer_backward, op for op, on the kernels of trainer/kernels/ops_cuda.h.
 * Two additions, both off in the CPU twin:
 *   - w16: the layer matrices (q, k, v, o, gate, up, down) of a FROZEN stack held in bf16
 *     (StackMats16, slabs laid out like StackParams's); then p's matrix pointers are unused (may be
 *     NULL) and only its norm weights are read. No weight gradients exist for such a stack (g NULL).
 *   - flash: attention through trainer/kernels/attention_cuda.h (no [T, T] matrix): StackActs.att holds the
 *     log-sum-exp [NL, B, nh, T] and StackScratch.datt [B, nh, T] (model_carve_acts(..., flash = 1)).
 * Every function returns DFM_OK or DFM_ECUDA (with the failing call and file:line) and never exits.
 */
#ifndef DFM_TRAINER_STACK_CUDA_H
#define DFM_TRAINER_STACK_CUDA_H

#include <stdint.h>

#include "trainer/kernels/ops_cuda.h"
#include "trainer/kernels/stack.h"

#ifdef __cplusplus
extern "C" {
#endif

/* bf16 copies (raw bits) of a stack's 7 matrices, [NL, ...] slabs as in StackParams. */
typedef struct {
    uint16_t *wq, *wk, *wv, *wo, *wgate, *wup, *wdown;
} StackMats16;

/* Layer l forward (as stack_layer_forward). w16 NULL: fp32 matrices from p. */
int stack_layer_forward_cuda(const StackConfig *c, const StackParams *p, const StackMats16 *w16, StackActs *a, int l,
                             float *out, const float *inp, float *tmp, int B, int T, const float *cos_t,
                             const float *sin_t, int flash, OpsCudaContext *ctx);
/* Layer l backward (as stack_layer_backward): din += d(loss)/d(inp); g NULL for a frozen stack. */
int stack_layer_backward_cuda(const StackConfig *c, const StackParams *p, const StackMats16 *w16, StackParams *g,
                              const StackActs *a, StackScratch *s, int l, float *din, const float *dout,
                              const float *inp, int B, int T, const float *cos_t, const float *sin_t, int flash,
                              OpsCudaContext *ctx);

#ifdef __cplusplus
}
#endif

#endif
