/* stack.c — Llama/Qwen3 decoder layers: forward and hand-written backward (see stack.h). */
#include "trainer/kernels/stack.h"

#include <cblas.h>
#include <string.h>

#include "trainer/kernels/ops.h"

/* out[N,OC] = res[N,OC] + inp[N,C] @ weight[OC,C]^T: the residual is the product's starting value (beta 1),
 * so the branch needs no buffer of its own and no separate pass to add it. */
static void matmul_residual(float *out, const float *res, const float *inp, const float *weight, int N, int C,
                            int OC) {
    if (out != res) memcpy(out, res, (size_t)N * OC * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, 1.0f, out, OC);
}

const char *const stack_tensor_names[STACK_NUM_TENSORS] = {
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight", "self_attn.o_proj.weight",
    "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
};

size_t carve_floats(float *base, float **ptrs[], const size_t sizes[], int n) {
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (base) *ptrs[i] = sizes[i] ? base + off : NULL;
        off += sizes[i];
    }
    return off;
}

void stack_param_sizes(const StackConfig *c, size_t s[STACK_NUM_TENSORS]) {
    size_t NL = c->n_layers, C = c->hidden, nq = (size_t)c->n_heads * c->head_dim,
           nk = (size_t)c->n_kv_heads * c->head_dim, F = c->ffn, hd = c->head_dim;
    s[0] = NL * C;
    s[1] = NL * nq * C;
    s[2] = NL * nk * C;
    s[3] = NL * nk * C;
    s[4] = c->qk_norm ? NL * hd : 0;
    s[5] = c->qk_norm ? NL * hd : 0;
    s[6] = NL * C * nq;
    s[7] = NL * C;
    s[8] = NL * F * C;
    s[9] = NL * F * C;
    s[10] = NL * C * F;
}

void stack_param_ptrs(StackParams *p, float **ptrs[STACK_NUM_TENSORS]) {
    float **v[STACK_NUM_TENSORS] = {&p->ln1w, &p->wq, &p->wk, &p->wv, &p->qnorm, &p->knorm,
                                    &p->wo, &p->ln2w, &p->wgate, &p->wup, &p->wdown};
    memcpy(ptrs, v, sizeof v);
}

void stack_act_sizes(const StackConfig *c, int B, int T, size_t s[STACK_NUM_ACTS]) {
    size_t NL = c->n_layers, N = (size_t)B * T, C = c->hidden, nh = c->n_heads, nkv = c->n_kv_heads,
           nq = nh * c->head_dim, nk = nkv * c->head_dim, F = c->ffn;
    size_t i = 0;
    s[i++] = NL * N * C;  /* ln1 */
    s[i++] = NL * N;      /* ln1_rstd */
    s[i++] = NL * N * nq; /* q */
    s[i++] = NL * N * nk; /* k */
    s[i++] = NL * N * nk; /* v */
    s[i++] = c->qk_norm ? NL * N * nh : 0;
    s[i++] = c->qk_norm ? NL * N * nkv : 0;
    s[i++] = NL * N * nq;                   /* qr */
    s[i++] = NL * N * nk;                   /* kr */
    s[i++] = NL * (size_t)B * nh * T * T;  /* att */
    s[i++] = NL * N * nq;                   /* atty */
    s[i++] = NL * N * C;                    /* res_mid */
    s[i++] = NL * N * C;                    /* ln2 */
    s[i++] = NL * N;                        /* ln2_rstd */
    s[i++] = NL * N * F;
    s[i++] = NL * N * F;
    s[i++] = NL * N * F;
}

void stack_act_ptrs(StackActs *a, float **ptrs[STACK_NUM_ACTS]) {
    float **v[STACK_NUM_ACTS] = {&a->ln1, &a->ln1_rstd, &a->q,    &a->k,       &a->v,   &a->q_rstd,
                                 &a->k_rstd, &a->qr,  &a->kr,   &a->att,     &a->atty, &a->res_mid,
                                 &a->ln2,  &a->ln2_rstd, &a->hg, &a->hu,    &a->hact};
    memcpy(ptrs, v, sizeof v);
}

void stack_scratch_sizes(const StackConfig *c, int B, int T, size_t s[STACK_NUM_SCRATCH]) {
    size_t N = (size_t)B * T, C = c->hidden, nq = (size_t)c->n_heads * c->head_dim,
           nk = (size_t)c->n_kv_heads * c->head_dim, F = c->ffn;
    size_t v[STACK_NUM_SCRATCH] = {N * C, N * C, N * F, N * F, N * F, N * nq, N * nq, N * nq,
                                   N * nk, N * nk, N * nk, (size_t)B * c->n_heads * T * T};
    memcpy(s, v, sizeof v);
}

void stack_scratch_ptrs(StackScratch *s, float **ptrs[STACK_NUM_SCRATCH]) {
    float **v[STACK_NUM_SCRATCH] = {&s->d_res_mid, &s->d_ln, &s->d_hact, &s->d_hg, &s->d_hu, &s->d_atty,
                                    &s->d_qr, &s->d_qn, &s->d_kr, &s->d_kn, &s->d_v, &s->datt};
    memcpy(ptrs, v, sizeof v);
}

/* Per-layer views into the [NL, ...] slabs. */
typedef struct {
    float *ln1w, *wq, *wk, *wv, *qnorm, *knorm, *wo, *ln2w, *wgate, *wup, *wdown;
} LayerW;

static LayerW layer_w(const StackConfig *c, const StackParams *p, int l) {
    size_t C = c->hidden, nq = (size_t)c->n_heads * c->head_dim, nk = (size_t)c->n_kv_heads * c->head_dim,
           F = c->ffn, hd = c->head_dim;
    LayerW w;
    w.ln1w = p->ln1w + l * C;
    w.wq = p->wq + l * nq * C;
    w.wk = p->wk + l * nk * C;
    w.wv = p->wv + l * nk * C;
    w.qnorm = c->qk_norm ? p->qnorm + l * hd : NULL;
    w.knorm = c->qk_norm ? p->knorm + l * hd : NULL;
    w.wo = p->wo + l * C * nq;
    w.ln2w = p->ln2w + l * C;
    w.wgate = p->wgate + l * F * C;
    w.wup = p->wup + l * F * C;
    w.wdown = p->wdown + l * C * F;
    return w;
}

typedef struct {
    float *ln1, *ln1_rstd, *q, *k, *v, *q_rstd, *k_rstd, *qr, *kr, *att, *atty, *res_mid, *ln2, *ln2_rstd, *hg,
        *hu, *hact;
} LayerA;

static LayerA layer_a(const StackConfig *c, const StackActs *a, int l, int B, int T, int flash) {
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
    x.att = a->att + l * (size_t)B * nh * T * (flash ? 1 : T); /* flash: log-sum-exp [B, nh, T] */
    x.atty = a->atty + l * N * nq;
    x.res_mid = a->res_mid + l * N * C;
    x.ln2 = a->ln2 + l * N * C;
    x.ln2_rstd = a->ln2_rstd + l * N;
    x.hg = a->hg + l * N * F;
    x.hu = a->hu + l * N * F;
    x.hact = a->hact + l * N * F;
    return x;
}

void stack_layer_forward(const StackConfig *c, const StackParams *p, StackActs *acts, int l, float *out,
                         const float *inp, int B, int T, const float *cos_t, const float *sin_t,
                         const AttnFlashScratch *fs) {
    int N = B * T, C = c->hidden, nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim, F = c->ffn;
    int nq = nh * hd, nk = nkv * hd;
    LayerW w = layer_w(c, p, l);
    LayerA a = layer_a(c, acts, l, B, T, fs != NULL);

    rmsnorm_forward(a.ln1, a.ln1_rstd, inp, w.ln1w, N, C, c->eps);
    matmul_forward(a.q, a.ln1, w.wq, NULL, N, C, nq);
    matmul_forward(a.k, a.ln1, w.wk, NULL, N, C, nk);
    matmul_forward(a.v, a.ln1, w.wv, NULL, N, C, nk);
    if (c->qk_norm) {
        rmsnorm_forward(a.qr, a.q_rstd, a.q, w.qnorm, N * nh, hd, c->eps);
        rmsnorm_forward(a.kr, a.k_rstd, a.k, w.knorm, N * nkv, hd, c->eps);
        rope_forward(a.qr, a.qr, cos_t, sin_t, B, T, nh, hd);
        rope_forward(a.kr, a.kr, cos_t, sin_t, B, T, nkv, hd);
    } else {
        rope_forward(a.qr, a.q, cos_t, sin_t, B, T, nh, hd);
        rope_forward(a.kr, a.k, cos_t, sin_t, B, T, nkv, hd);
    }
    if (fs) attention_flash_forward(a.atty, a.att, a.qr, a.kr, a.v, B, T, nh, nkv, hd, fs);
    else attention_forward(a.atty, a.att, a.qr, a.kr, a.v, B, T, nh, nkv, hd);
    matmul_residual(a.res_mid, inp, a.atty, w.wo, N, nq, C);

    rmsnorm_forward(a.ln2, a.ln2_rstd, a.res_mid, w.ln2w, N, C, c->eps);
    matmul_forward(a.hg, a.ln2, w.wgate, NULL, N, C, F);
    matmul_forward(a.hu, a.ln2, w.wup, NULL, N, C, F);
    swiglu_forward(a.hact, a.hg, a.hu, (size_t)N * F);
    matmul_residual(out, a.res_mid, a.hact, w.wdown, N, F, C);
}

void stack_layer_backward(const StackConfig *c, const StackParams *p, StackParams *gp, const StackActs *acts,
                          StackScratch *s, int l, float *din, const float *dout, const float *inp, int B, int T,
                          const float *cos_t, const float *sin_t, const AttnFlashScratch *fs) {
    int N = B * T, C = c->hidden, nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim, F = c->ffn;
    int nq = nh * hd, nk = nkv * hd;
    size_t NC_ = (size_t)N * C;
    LayerW w = layer_w(c, p, l);
    LayerW g;
    if (gp) g = layer_w(c, gp, l);
    else memset(&g, 0, sizeof g);
    LayerA a = layer_a(c, acts, l, B, T, fs != NULL);

    /* MLP branch */
    memcpy(s->d_res_mid, dout, NC_ * sizeof(float));
    vec_zero(s->d_hact, (size_t)N * F);
    matmul_backward(s->d_hact, g.wdown, NULL, dout, a.hact, w.wdown, N, F, C);
    vec_zero(s->d_hg, (size_t)N * F);
    vec_zero(s->d_hu, (size_t)N * F);
    swiglu_backward(s->d_hg, s->d_hu, s->d_hact, a.hg, a.hu, (size_t)N * F);
    vec_zero(s->d_ln, NC_);
    matmul_backward(s->d_ln, g.wgate, NULL, s->d_hg, a.ln2, w.wgate, N, C, F);
    matmul_backward(s->d_ln, g.wup, NULL, s->d_hu, a.ln2, w.wup, N, C, F);
    rmsnorm_backward(s->d_res_mid, g.ln2w, s->d_ln, a.res_mid, w.ln2w, a.ln2_rstd, N, C);

    /* attention branch */
    for (size_t i = 0; i < NC_; i++) din[i] += s->d_res_mid[i];
    vec_zero(s->d_atty, (size_t)N * nq);
    matmul_backward(s->d_atty, g.wo, NULL, s->d_res_mid, a.atty, w.wo, N, nq, C);
    vec_zero(s->d_qr, (size_t)N * nq);
    vec_zero(s->d_kr, (size_t)N * nk);
    vec_zero(s->d_v, (size_t)N * nk);
    if (fs) attention_flash_backward(s->d_qr, s->d_kr, s->d_v, s->d_atty, a.att, a.qr, a.kr, a.v, B, T, nh, nkv, hd, fs);
    else attention_backward(s->d_qr, s->d_kr, s->d_v, s->datt, s->d_atty, a.att, a.qr, a.kr, a.v, B, T, nh, nkv, hd);
    vec_zero(s->d_qn, (size_t)N * nq);
    vec_zero(s->d_kn, (size_t)N * nk);
    rope_backward(s->d_qn, s->d_qr, cos_t, sin_t, B, T, nh, hd);
    rope_backward(s->d_kn, s->d_kr, cos_t, sin_t, B, T, nkv, hd);
    float *dq = s->d_qn, *dk = s->d_kn;
    if (c->qk_norm) { /* reuse d_qr / d_kr for the gradients w.r.t. the raw projections */
        vec_zero(s->d_qr, (size_t)N * nq);
        vec_zero(s->d_kr, (size_t)N * nk);
        rmsnorm_backward(s->d_qr, g.qnorm, s->d_qn, a.q, w.qnorm, a.q_rstd, N * nh, hd);
        rmsnorm_backward(s->d_kr, g.knorm, s->d_kn, a.k, w.knorm, a.k_rstd, N * nkv, hd);
        dq = s->d_qr;
        dk = s->d_kr;
    }
    vec_zero(s->d_ln, NC_);
    matmul_backward(s->d_ln, g.wq, NULL, dq, a.ln1, w.wq, N, C, nq);
    matmul_backward(s->d_ln, g.wk, NULL, dk, a.ln1, w.wk, N, C, nk);
    matmul_backward(s->d_ln, g.wv, NULL, s->d_v, a.ln1, w.wv, N, C, nk);
    rmsnorm_backward(din, g.ln1w, s->d_ln, inp, w.ln1w, a.ln1_rstd, N, C);
}
