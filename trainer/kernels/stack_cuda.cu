// stack_cuda.cu — decoder layers on the GPU: stack.c's layer_forward / layer_backward, op for op, on the
// kernels of ops_cuda.h (see stack_cuda.h). Host code only: it sequences kernels on ctx->stream.
#include "trainer/kernels/stack_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <string.h>

extern "C" {
#include "common/error.h"
}
#include "trainer/kernels/attention_cuda.h"
#include "common/cuda_check.h"

namespace {

struct LayerW {
    const float *ln1w, *wq, *wk, *wv, *qnorm, *knorm, *wo, *ln2w, *wgate, *wup, *wdown;
    const uint16_t *q16, *k16, *v16, *o16, *gate16, *up16, *down16;  // frozen bf16 matrices, or NULL
};

// Per-layer views into the [NL, ...] slabs (as stack.c's layer_w; pointers may be NULL: frozen, bf16).
LayerW layer_w(const StackConfig *c, const StackParams *p, const StackMats16 *w16, int l) {
    size_t C = c->hidden, nq = (size_t)c->n_heads * c->head_dim, nk = (size_t)c->n_kv_heads * c->head_dim,
           F = c->ffn, hd = c->head_dim;
    LayerW w;
    memset(&w, 0, sizeof w);
    auto at = [](const float *b, size_t off) { return b ? b + off : (const float *)NULL; };
    w.ln1w = at(p->ln1w, l * C);
    w.wq = at(p->wq, l * nq * C);
    w.wk = at(p->wk, l * nk * C);
    w.wv = at(p->wv, l * nk * C);
    w.qnorm = c->qk_norm ? at(p->qnorm, l * hd) : NULL;
    w.knorm = c->qk_norm ? at(p->knorm, l * hd) : NULL;
    w.wo = at(p->wo, l * C * nq);
    w.ln2w = at(p->ln2w, l * C);
    w.wgate = at(p->wgate, l * F * C);
    w.wup = at(p->wup, l * F * C);
    w.wdown = at(p->wdown, l * C * F);
    if (w16) {
        w.q16 = w16->wq + l * nq * C;
        w.k16 = w16->wk + l * nk * C;
        w.v16 = w16->wv + l * nk * C;
        w.o16 = w16->wo + l * C * nq;
        w.gate16 = w16->wgate + l * F * C;
        w.up16 = w16->wup + l * F * C;
        w.down16 = w16->wdown + l * C * F;
    }
    return w;
}

struct LayerA {
    float *ln1, *ln1_rstd, *q, *k, *v, *q_rstd, *k_rstd, *qr, *kr, *att, *atty, *res_mid, *ln2, *ln2_rstd, *hg, *hu,
        *hact;
};

LayerA layer_a(const StackConfig *c, const StackActs *a, int l, int B, int T, int flash) {
    size_t N = (size_t)B * T, C = c->hidden, nh = c->n_heads, nkv = c->n_kv_heads, nq = nh * c->head_dim,
           nk = nkv * c->head_dim, F = c->ffn;
    LayerA x;
    x.ln1 = a->ln1 + l * N * C;
    x.ln1_rstd = a->ln1_rstd + l * N;
    x.q = a->q + l * N * nq;
    x.k = a->k + l * N * nk;
    x.v = a->v + l * N * nk;
    x.q_rstd = c->qk_norm ? a->q_rstd + l * N * nh : NULL;
    x.k_rstd = c->qk_norm ? a->k_rstd + l * N * nkv : NULL;
    x.qr = a->qr + l * N * nq;
    x.kr = a->kr + l * N * nk;
    x.att = a->att + l * (size_t)B * nh * T * (flash ? 1 : T);  // flash: log-sum-exp [B, nh, T]
    x.atty = a->atty + l * N * nq;
    x.res_mid = a->res_mid + l * N * C;
    x.ln2 = a->ln2 + l * N * C;
    x.ln2_rstd = a->ln2_rstd + l * N;
    x.hg = a->hg + l * N * F;
    x.hu = a->hu + l * N * F;
    x.hact = a->hact + l * N * F;
    return x;
}

// out = inp @ W^T with W fp32 or frozen bf16
int lin_fwd(float *out, const float *inp, const float *w, const uint16_t *w16, int N, int C, int OC,
            OpsCudaContext *ctx) {
    return w16 ? matmul_forward_w16_cuda(out, inp, w16, NULL, N, C, OC, ctx)
               : matmul_forward_cuda(out, inp, w, NULL, N, C, OC, ctx);
}
int lin_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w, const uint16_t *w16, int N,
            int C, int OC, OpsCudaContext *ctx) {
    return w16 ? matmul_backward_w16_cuda(dinp, dout, w16, N, C, OC, ctx)
               : matmul_backward_cuda(dinp, dw, NULL, dout, inp, w, N, C, OC, ctx);
}

}  // namespace

extern "C" int stack_layer_forward_cuda(const StackConfig *c, const StackParams *p, const StackMats16 *w16,
                                        StackActs *acts, int l, float *out, const float *inp, float *tmp, int B,
                                        int T, const float *cos_t, const float *sin_t, int flash,
                                        OpsCudaContext *ctx) {
    int N = B * T, C = c->hidden, nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim, F = c->ffn;
    int nq = nh * hd, nk = nkv * hd;
    cudaStream_t st = ctx->stream;
    LayerW w = layer_w(c, p, w16, l);
    LayerA a = layer_a(c, acts, l, B, T, flash);

    DFM_TRY(rmsnorm_forward_cuda(a.ln1, a.ln1_rstd, inp, w.ln1w, N, C, c->eps, st));
    DFM_TRY(lin_fwd(a.q, a.ln1, w.wq, w.q16, N, C, nq, ctx));
    DFM_TRY(lin_fwd(a.k, a.ln1, w.wk, w.k16, N, C, nk, ctx));
    DFM_TRY(lin_fwd(a.v, a.ln1, w.wv, w.v16, N, C, nk, ctx));
    if (c->qk_norm) {
        DFM_TRY(rmsnorm_forward_cuda(a.qr, a.q_rstd, a.q, w.qnorm, N * nh, hd, c->eps, st));
        DFM_TRY(rmsnorm_forward_cuda(a.kr, a.k_rstd, a.k, w.knorm, N * nkv, hd, c->eps, st));
        DFM_TRY(rope_forward_cuda(a.qr, a.qr, cos_t, sin_t, B, T, nh, hd, st));
        DFM_TRY(rope_forward_cuda(a.kr, a.kr, cos_t, sin_t, B, T, nkv, hd, st));
    } else {
        DFM_TRY(rope_forward_cuda(a.qr, a.q, cos_t, sin_t, B, T, nh, hd, st));
        DFM_TRY(rope_forward_cuda(a.kr, a.k, cos_t, sin_t, B, T, nkv, hd, st));
    }
    if (flash) DFM_TRY(attention_flash_forward_cuda(a.atty, a.att, a.qr, a.kr, a.v, B, T, nh, nkv, hd, st));
    else DFM_TRY(attention_forward_cuda(a.atty, a.att, a.qr, a.kr, a.v, B, T, nh, nkv, hd, ctx));
    DFM_TRY(lin_fwd(tmp, a.atty, w.wo, w.o16, N, nq, C, ctx));
    DFM_TRY(vec_add_cuda(a.res_mid, inp, tmp, (size_t)N * C, st));

    DFM_TRY(rmsnorm_forward_cuda(a.ln2, a.ln2_rstd, a.res_mid, w.ln2w, N, C, c->eps, st));
    DFM_TRY(lin_fwd(a.hg, a.ln2, w.wgate, w.gate16, N, C, F, ctx));
    DFM_TRY(lin_fwd(a.hu, a.ln2, w.wup, w.up16, N, C, F, ctx));
    DFM_TRY(swiglu_forward_cuda(a.hact, a.hg, a.hu, (size_t)N * F, st));
    DFM_TRY(lin_fwd(tmp, a.hact, w.wdown, w.down16, N, F, C, ctx));
    return vec_add_cuda(out, a.res_mid, tmp, (size_t)N * C, st);
}

extern "C" int stack_layer_backward_cuda(const StackConfig *c, const StackParams *p, const StackMats16 *w16,
                                         StackParams *gp, const StackActs *acts, StackScratch *s, int l, float *din,
                                         const float *dout, const float *inp, int B, int T, const float *cos_t,
                                         const float *sin_t, int flash, OpsCudaContext *ctx) {
    int N = B * T, C = c->hidden, nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim, F = c->ffn;
    int nq = nh * hd, nk = nkv * hd;
    size_t NC_ = (size_t)N * C;
    cudaStream_t st = ctx->stream;
    if (w16 && gp) return DFM_FAIL(DFM_EARG, "a stack held in bf16 is frozen: it has no weight gradients");
    LayerW w = layer_w(c, p, w16, l);
    LayerW g;
    if (gp) g = layer_w(c, gp, NULL, l);
    else memset(&g, 0, sizeof g);
    LayerA a = layer_a(c, acts, l, B, T, flash);
    float *dwn = (float *)g.wdown, *dwg = (float *)g.wgate, *dwu = (float *)g.wup, *dwo = (float *)g.wo,
          *dwq = (float *)g.wq, *dwk = (float *)g.wk, *dwv = (float *)g.wv;

    /* MLP branch */
    CUDA_CHECK(cudaMemcpyAsync(s->d_res_mid, dout, NC_ * sizeof(float), cudaMemcpyDeviceToDevice, st));
    DFM_TRY(vec_zero_cuda(s->d_hact, (size_t)N * F, st));
    DFM_TRY(lin_bwd(s->d_hact, dwn, dout, a.hact, w.wdown, w.down16, N, F, C, ctx));
    DFM_TRY(vec_zero_cuda(s->d_hg, (size_t)N * F, st));
    DFM_TRY(vec_zero_cuda(s->d_hu, (size_t)N * F, st));
    DFM_TRY(swiglu_backward_cuda(s->d_hg, s->d_hu, s->d_hact, a.hg, a.hu, (size_t)N * F, st));
    DFM_TRY(vec_zero_cuda(s->d_ln, NC_, st));
    DFM_TRY(lin_bwd(s->d_ln, dwg, s->d_hg, a.ln2, w.wgate, w.gate16, N, C, F, ctx));
    DFM_TRY(lin_bwd(s->d_ln, dwu, s->d_hu, a.ln2, w.wup, w.up16, N, C, F, ctx));
    DFM_TRY(rmsnorm_backward_cuda(s->d_res_mid, (float *)g.ln2w, s->d_ln, a.res_mid, w.ln2w, a.ln2_rstd, N, C, st));

    /* attention branch */
    DFM_TRY(vec_add_cuda(din, din, s->d_res_mid, NC_, st));
    DFM_TRY(vec_zero_cuda(s->d_atty, (size_t)N * nq, st));
    DFM_TRY(lin_bwd(s->d_atty, dwo, s->d_res_mid, a.atty, w.wo, w.o16, N, nq, C, ctx));
    DFM_TRY(vec_zero_cuda(s->d_qr, (size_t)N * nq, st));
    DFM_TRY(vec_zero_cuda(s->d_kr, (size_t)N * nk, st));
    DFM_TRY(vec_zero_cuda(s->d_v, (size_t)N * nk, st));
    if (flash)
        DFM_TRY(attention_flash_backward_cuda(s->d_qr, s->d_kr, s->d_v, s->datt, s->d_atty, a.atty, a.att, a.qr, a.kr,
                                              a.v, B, T, nh, nkv, hd, st));
    else
        DFM_TRY(attention_backward_cuda(s->d_qr, s->d_kr, s->d_v, s->datt, s->d_atty, a.att, a.qr, a.kr, a.v, B, T,
                                        nh, nkv, hd, ctx));
    DFM_TRY(vec_zero_cuda(s->d_qn, (size_t)N * nq, st));
    DFM_TRY(vec_zero_cuda(s->d_kn, (size_t)N * nk, st));
    DFM_TRY(rope_backward_cuda(s->d_qn, s->d_qr, cos_t, sin_t, B, T, nh, hd, st));
    DFM_TRY(rope_backward_cuda(s->d_kn, s->d_kr, cos_t, sin_t, B, T, nkv, hd, st));
    float *dq = s->d_qn, *dk = s->d_kn;
    if (c->qk_norm) { /* reuse d_qr / d_kr for the gradients w.r.t. the raw projections */
        DFM_TRY(vec_zero_cuda(s->d_qr, (size_t)N * nq, st));
        DFM_TRY(vec_zero_cuda(s->d_kr, (size_t)N * nk, st));
        DFM_TRY(rmsnorm_backward_cuda(s->d_qr, (float *)g.qnorm, s->d_qn, a.q, w.qnorm, a.q_rstd, N * nh, hd, st));
        DFM_TRY(rmsnorm_backward_cuda(s->d_kr, (float *)g.knorm, s->d_kn, a.k, w.knorm, a.k_rstd, N * nkv, hd, st));
        dq = s->d_qr;
        dk = s->d_kr;
    }
    DFM_TRY(vec_zero_cuda(s->d_ln, NC_, st));
    DFM_TRY(lin_bwd(s->d_ln, dwq, dq, a.ln1, w.wq, w.q16, N, C, nq, ctx));
    DFM_TRY(lin_bwd(s->d_ln, dwk, dk, a.ln1, w.wk, w.k16, N, C, nk, ctx));
    DFM_TRY(lin_bwd(s->d_ln, dwv, s->d_v, a.ln1, w.wv, w.v16, N, C, nk, ctx));
    return rmsnorm_backward_cuda(din, (float *)g.ln1w, s->d_ln, inp, w.ln1w, a.ln1_rstd, N, C, st);
}
