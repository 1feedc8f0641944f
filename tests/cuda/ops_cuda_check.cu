// ops_cuda_check.cu — every CUDA kernel of trainer/kernels/ops_cuda.h against its CPU twin in trainer/kernels/ops.c.
//
// A separate program, built by tests/gpu/gpu_check_trainer.sh with -DDFM_OPS_CUDA_CHECK_MAIN (without
// it this file compiles to nothing, so the Makefile's trainer/*/*.cu glob can include it in dfm-train).
// Random inputs (fixed seed), the same inputs to both sides; a backward starts from the CPU forward's
// saved tensors and from random gradient buffers (checking the += convention). For each output:
//   max_abs = max |gpu - cpu|,  rel = max_abs / max |cpu|   (a norm-wise relative error)
// bounded by 1e-5 for fp32 kernels and GEMMs and 2e-2 for bf16 GEMMs; scalars (losses, norms) use
// |gpu - cpu| / |cpu|. Then a determinism check: the same GPU calls twice give identical bits.
// Prints one line per tensor and "RESULT: PASS|FAIL"; exit 0 pass, 1 a bound failed, 2 a CUDA error.
#ifdef DFM_OPS_CUDA_CHECK_MAIN

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

extern "C" {
#include "common/error.h"
#include "trainer/kernels/adamw.h"
#include "trainer/kernels/ops.h"
}
#include "trainer/kernels/ops_cuda.h"
#include "tests/cuda/check_common.h"

#define TOL_FP32 1e-5
#define TOL_BF16 2e-2

static int g_fail = 0, g_checks = 0;
static double g_worst_fp32 = 0.0, g_worst_bf16 = 0.0;
static std::vector<void *> g_dev, g_host;

// a CUDA-side call that returns a dfm code: report and propagate

static float *hnew(size_t n) {
    float *p = (float *)calloc(n ? n : 1, sizeof(float));
    if (!p) {
        fprintf(stderr, "ops_cuda_check: out of host memory\n");
        exit(2);
    }
    g_host.push_back(p);
    return p;
}
static float *hrand(size_t n, float scale) {
    float *p = hnew(n);
    for (size_t i = 0; i < n; i++) p[i] = frand() * scale;
    return p;
}
// device copy of n elements of `bytes_each` (NULL src: zeroed)
static void *dnew_bytes(const void *src, size_t bytes) {
    void *d = NULL;
    if (cudaMalloc(&d, bytes ? bytes : 4) != cudaSuccess) {
        fprintf(stderr, "ops_cuda_check: cudaMalloc(%zu) failed\n", bytes);
        exit(2);
    }
    g_dev.push_back(d);
    cudaError_t e = src ? cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice) : cudaMemset(d, 0, bytes ? bytes : 4);
    // the kernels run on a non-blocking stream: make every copy complete before the next launch
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "ops_cuda_check: uploading %zu bytes failed: %s\n", bytes, cudaGetErrorString(e));
        exit(2);
    }
    return d;
}
// host -> device into an existing buffer, complete before returning (see dnew_bytes)
static cudaError_t h2d(void *dst, const void *src, size_t bytes) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    return e;
}
static float *dnew(const float *src, size_t n) { return (float *)dnew_bytes(src, n * sizeof(float)); }
static void release_all(void) {
    for (void *p : g_dev) cudaFree(p);
    for (void *p : g_host) free(p);
    g_dev.clear();
    g_host.clear();
}

// rel is INFINITY when a value is not finite (check_compare.h): then it fails every bound
static void record(const char *name, double max_abs, double rel, double tol, size_t n, size_t nonfinite) {
    int ok = rel <= tol;
    g_checks++;
    if (!ok) g_fail++;
    double &worst = tol >= TOL_BF16 ? g_worst_bf16 : g_worst_fp32;
    if (!(rel <= worst)) worst = rel;
    printf("%s %-34s n=%-8zu max_abs=%.3e rel=%.3e tol=%.0e", ok ? "PASS" : "FAIL", name, n, max_abs, rel, tol);
    if (nonfinite) printf("  %zu VALUES NOT FINITE", nonfinite);
    printf("\n");
}
// compare a device tensor with the CPU result
static int cmp(const char *name, const float *cpu, const float *dgpu, size_t n, double tol) {
    std::vector<float> g(n ? n : 1);
    CT(cudaDeviceSynchronize());
    CT(cudaMemcpy(g.data(), dgpu, n * sizeof(float), cudaMemcpyDeviceToHost));
    check_diff d = check_compare(g.data(), cpu, n);
    record(name, d.max_abs, d.nonfinite ? d.rel : d.max_abs / (d.max_ref > 1e-30 ? d.max_ref : 1e-30), tol, n,
           d.nonfinite);
    return DFM_OK;
}
static void cmp_scalar(const char *name, double cpu, double gpu, double tol) {
    record(name, fabs(gpu - cpu), check_scalar_rel(gpu, cpu, 1e-30), tol, 1, !isfinite(gpu) + !isfinite(cpu));
}

// ---- sizes ----
enum { B = 2, T = 64, NH = 4, NKV = 2, HD = 32, C = NH * HD, F = 256, N = B * T, L = 16, K = 8, DM = 48, HID = 96 };

static int check_matmul(OpsCudaContext *ctx, int bf16, double tol) {
    const char *tag = bf16 ? "bf16" : "fp32";
    char nm[64];
    ctx->bf16 = bf16;
    int OC = F;
    float *inp = hrand((size_t)N * C, 1.0f), *w = hrand((size_t)OC * C, 0.1f), *bias = hrand(OC, 0.1f);
    float *out = hnew((size_t)N * OC);
    matmul_forward(out, inp, w, bias, N, C, OC);
    float *d_inp = dnew(inp, (size_t)N * C), *d_w = dnew(w, (size_t)OC * C), *d_b = dnew(bias, OC);
    float *d_out = dnew(NULL, (size_t)N * OC);
    GT(matmul_forward_cuda(d_out, d_inp, d_w, d_b, N, C, OC, ctx));
    snprintf(nm, sizeof nm, "matmul_forward[%s]", tag);
    GT(cmp(nm, out, d_out, (size_t)N * OC, tol));
    matmul_forward_acc(out, inp, w, N, C, OC); /* a second path into the same output: out += inp @ w^T */
    GT(matmul_forward_acc_cuda(d_out, d_inp, d_w, N, C, OC, ctx));
    snprintf(nm, sizeof nm, "matmul_forward_acc[%s]", tag);
    GT(cmp(nm, out, d_out, (size_t)N * OC, tol));

    float *dout = hrand((size_t)N * OC, 1.0f), *dinp = hrand((size_t)N * C, 0.1f), *dw = hrand((size_t)OC * C, 0.1f),
          *db = hrand(OC, 0.1f);
    float *d_dout = dnew(dout, (size_t)N * OC), *d_dinp = dnew(dinp, (size_t)N * C), *d_dw = dnew(dw, (size_t)OC * C),
          *d_db = dnew(db, OC);
    matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC);
    GT(matmul_backward_cuda(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, N, C, OC, ctx));
    snprintf(nm, sizeof nm, "matmul_backward.dinp[%s]", tag);
    GT(cmp(nm, dinp, d_dinp, (size_t)N * C, tol));
    snprintf(nm, sizeof nm, "matmul_backward.dweight[%s]", tag);
    GT(cmp(nm, dw, d_dw, (size_t)OC * C, tol));
    GT(cmp("matmul_backward.dbias", db, d_db, OC, TOL_FP32));
    ctx->bf16 = 0;
    return DFM_OK;
}

static int check_embedding_norms(cudaStream_t st) {
    const int V = 50;
    std::vector<int> tok(N);
    for (int i = 0; i < N; i++) tok[i] = (int)((frand() + 1.0f) * 0.5f * V) % V;  // repeats on purpose
    int *d_tok = (int *)dnew_bytes(tok.data(), N * sizeof(int));
    float *wte = hrand((size_t)V * C, 1.0f), *out = hnew((size_t)N * C);
    float *d_wte = dnew(wte, (size_t)V * C), *d_out = dnew(NULL, (size_t)N * C);
    embedding_forward(out, tok.data(), wte, N, C);
    GT(embedding_forward_cuda(d_out, d_tok, d_wte, N, C, st));
    GT(cmp("embedding_forward", out, d_out, (size_t)N * C, TOL_FP32));
    float *dout = hrand((size_t)N * C, 1.0f), *dwte = hrand((size_t)V * C, 0.1f);
    float *d_dout = dnew(dout, (size_t)N * C), *d_dwte = dnew(dwte, (size_t)V * C);
    embedding_backward(dwte, dout, tok.data(), N, C);
    GT(embedding_backward_cuda(d_dwte, d_dout, d_tok, N, C, st));
    GT(cmp("embedding_backward", dwte, d_dwte, (size_t)V * C, TOL_FP32));

    // RMSNorm
    float *x = hrand((size_t)N * C, 2.0f), *wt = hrand(C, 1.0f), *rstd = hnew(N), *y = hnew((size_t)N * C);
    float *d_x = dnew(x, (size_t)N * C), *d_wt = dnew(wt, C), *d_rstd = dnew(NULL, N), *d_y = dnew(NULL, (size_t)N * C);
    rmsnorm_forward(y, rstd, x, wt, N, C, 1e-6f);
    GT(rmsnorm_forward_cuda(d_y, d_rstd, d_x, d_wt, N, C, 1e-6f, st));
    GT(cmp("rmsnorm_forward.out", y, d_y, (size_t)N * C, TOL_FP32));
    GT(cmp("rmsnorm_forward.rstd", rstd, d_rstd, N, TOL_FP32));
    float *dy = hrand((size_t)N * C, 1.0f), *dx = hrand((size_t)N * C, 0.1f), *dwt = hrand(C, 0.1f);
    float *d_dy = dnew(dy, (size_t)N * C), *d_dx = dnew(dx, (size_t)N * C), *d_dwt = dnew(dwt, C);
    CT(h2d(d_rstd, rstd, N * sizeof(float)));
    rmsnorm_backward(dx, dwt, dy, x, wt, rstd, N, C);
    GT(rmsnorm_backward_cuda(d_dx, d_dwt, d_dy, d_x, d_wt, d_rstd, N, C, st));
    GT(cmp("rmsnorm_backward.dinp", dx, d_dx, (size_t)N * C, TOL_FP32));
    GT(cmp("rmsnorm_backward.dweight", dwt, d_dwt, C, TOL_FP32));

    // LayerNorm over d (the projector's)
    const int R = 3 * N, D = DM;
    float *lx = hrand((size_t)R * D, 2.0f), *lw = hrand(D, 1.0f), *lb = hrand(D, 0.5f);
    float *ly = hnew((size_t)R * D), *lm = hnew(R), *lr = hnew(R);
    float *d_lx = dnew(lx, (size_t)R * D), *d_lw = dnew(lw, D), *d_lb = dnew(lb, D), *d_ly = dnew(NULL, (size_t)R * D),
          *d_lm = dnew(NULL, R), *d_lr = dnew(NULL, R);
    for (int i = 0; i < R; i++) lx[(size_t)i * D] += 3.0f;  // a non-zero mean
    CT(h2d(d_lx, lx, (size_t)R * D * sizeof(float)));
    layernorm_forward(ly, lm, lr, lx, lw, lb, R, D, 1e-5f);
    GT(layernorm_forward_cuda(d_ly, d_lm, d_lr, d_lx, d_lw, d_lb, R, D, 1e-5f, st));
    GT(cmp("layernorm_forward.out", ly, d_ly, (size_t)R * D, TOL_FP32));
    GT(cmp("layernorm_forward.mean", lm, d_lm, R, TOL_FP32));
    GT(cmp("layernorm_forward.rstd", lr, d_lr, R, TOL_FP32));
    float *ldy = hrand((size_t)R * D, 1.0f), *ldx = hrand((size_t)R * D, 0.1f), *ldw = hrand(D, 0.1f),
          *ldb = hrand(D, 0.1f);
    float *d_ldy = dnew(ldy, (size_t)R * D), *d_ldx = dnew(ldx, (size_t)R * D), *d_ldw = dnew(ldw, D),
          *d_ldb = dnew(ldb, D);
    CT(h2d(d_lm, lm, R * sizeof(float)));
    CT(h2d(d_lr, lr, R * sizeof(float)));
    layernorm_backward(ldx, ldw, ldb, ldy, lx, lw, lm, lr, R, D);
    GT(layernorm_backward_cuda(d_ldx, d_ldw, d_ldb, d_ldy, d_lx, d_lw, d_lm, d_lr, R, D, st));
    GT(cmp("layernorm_backward.dinp", ldx, d_ldx, (size_t)R * D, TOL_FP32));
    GT(cmp("layernorm_backward.dweight", ldw, d_ldw, D, TOL_FP32));
    GT(cmp("layernorm_backward.dbias", ldb, d_ldb, D, TOL_FP32));
    return DFM_OK;
}

static int check_rope_attention(OpsCudaContext *ctx) {
    cudaStream_t st = ctx->stream;
    int half = HD / 2;
    float *cs = hnew((size_t)T * half), *sn = hnew((size_t)T * half);
    float *d_cs = dnew(NULL, (size_t)T * half), *d_sn = dnew(NULL, (size_t)T * half);
    rope_tables(cs, sn, T, HD, 1000000.0f);
    GT(rope_tables_cuda(d_cs, d_sn, T, HD, 1000000.0f, st));
    GT(cmp("rope_tables.cos", cs, d_cs, (size_t)T * half, TOL_FP32));
    GT(cmp("rope_tables.sin", sn, d_sn, (size_t)T * half, TOL_FP32));
    CT(h2d(d_cs, cs, (size_t)T * half * sizeof(float)));
    CT(h2d(d_sn, sn, (size_t)T * half * sizeof(float)));
    size_t nq = (size_t)N * C, nk = (size_t)N * NKV * HD;
    float *x = hrand(nq, 1.0f), *y = hnew(nq), *d_x = dnew(x, nq), *d_y = dnew(NULL, nq);
    rope_forward(y, x, cs, sn, B, T, NH, HD);
    GT(rope_forward_cuda(d_y, d_x, d_cs, d_sn, B, T, NH, HD, st));
    GT(cmp("rope_forward", y, d_y, nq, TOL_FP32));
    float *dx = hrand(nq, 0.1f), *d_dx = dnew(dx, nq);
    rope_backward(dx, x, cs, sn, B, T, NH, HD);  // x as the upstream gradient
    GT(rope_backward_cuda(d_dx, d_x, d_cs, d_sn, B, T, NH, HD, st));
    GT(cmp("rope_backward", dx, d_dx, nq, TOL_FP32));

    size_t na = (size_t)B * NH * T * T;
    float *q = hrand(nq, 1.0f), *k = hrand(nk, 1.0f), *v = hrand(nk, 1.0f), *att = hnew(na), *out = hnew(nq);
    float *d_q = dnew(q, nq), *d_k = dnew(k, nk), *d_v = dnew(v, nk), *d_att = dnew(NULL, na), *d_out = dnew(NULL, nq);
    attention_forward(out, att, q, k, v, B, T, NH, NKV, HD);
    GT(attention_forward_cuda(d_out, d_att, d_q, d_k, d_v, B, T, NH, NKV, HD, ctx));
    GT(cmp("attention_forward.att", att, d_att, na, TOL_FP32));
    GT(cmp("attention_forward.out", out, d_out, nq, TOL_FP32));
    ctx->bf16 = 1;  // the same with bf16 GEMM operands (into a fresh output: the fp32 one is compared below)
    float *d_att16 = dnew(NULL, na), *d_out16 = dnew(NULL, nq);
    GT(attention_forward_cuda(d_out16, d_att16, d_q, d_k, d_v, B, T, NH, NKV, HD, ctx));
    ctx->bf16 = 0;
    GT(cmp("attention_forward.att[bf16]", att, d_att16, na, TOL_BF16));
    GT(cmp("attention_forward.out[bf16]", out, d_out16, nq, TOL_BF16));
    float *dout = hrand(nq, 1.0f), *dq = hrand(nq, 0.1f), *dk = hrand(nk, 0.1f), *dv = hrand(nk, 0.1f),
          *datt = hnew(na);
    float *d_dout = dnew(dout, nq), *d_dq = dnew(dq, nq), *d_dk = dnew(dk, nk), *d_dv = dnew(dv, nk),
          *d_datt = dnew(NULL, na);
    CT(h2d(d_att, att, na * sizeof(float)));
    attention_backward(dq, dk, dv, datt, dout, att, q, k, v, B, T, NH, NKV, HD);
    GT(attention_backward_cuda(d_dq, d_dk, d_dv, d_datt, d_dout, d_att, d_q, d_k, d_v, B, T, NH, NKV, HD, ctx));
    GT(cmp("attention_backward.dq", dq, d_dq, nq, TOL_FP32));
    GT(cmp("attention_backward.dk", dk, d_dk, nk, TOL_FP32));
    GT(cmp("attention_backward.dv", dv, d_dv, nk, TOL_FP32));
    return DFM_OK;
}

static int check_elementwise(cudaStream_t st) {
    size_t n = (size_t)N * F;
    float *g = hrand(n, 4.0f), *u = hrand(n, 2.0f), *o = hnew(n);
    float *d_g = dnew(g, n), *d_u = dnew(u, n), *d_o = dnew(NULL, n);
    swiglu_forward(o, g, u, n);
    GT(swiglu_forward_cuda(d_o, d_g, d_u, n, st));
    GT(cmp("swiglu_forward", o, d_o, n, TOL_FP32));
    float *dout = hrand(n, 1.0f), *dg = hrand(n, 0.1f), *du = hrand(n, 0.1f);
    float *d_dout = dnew(dout, n), *d_dg = dnew(dg, n), *d_du = dnew(du, n);
    swiglu_backward(dg, du, dout, g, u, n);
    GT(swiglu_backward_cuda(d_dg, d_du, d_dout, d_g, d_u, n, st));
    GT(cmp("swiglu_backward.dgate", dg, d_dg, n, TOL_FP32));
    GT(cmp("swiglu_backward.dup", du, d_du, n, TOL_FP32));
    gelu_forward(o, g, n);
    GT(gelu_forward_cuda(d_o, d_g, n, st));
    GT(cmp("gelu_forward", o, d_o, n, TOL_FP32));
    float *dx = hrand(n, 0.1f), *d_dx = dnew(dx, n);
    gelu_backward(dx, dout, g, n);
    GT(gelu_backward_cuda(d_dx, d_dout, d_g, n, st));
    GT(cmp("gelu_backward", dx, d_dx, n, TOL_FP32));
    return DFM_OK;
}

static int check_fusion(cudaStream_t st) {
    const int NC = T / L, S = B * NC * K;
    std::vector<uint8_t> mask(S);
    for (int b = 0; b < B; b++)
        for (int c = 0; c < NC; c++)
            for (int j = 0; j < K; j++)  // chunk 0 empty (no memory), some padded slots elsewhere
                mask[((size_t)b * NC + c) * K + j] = c == 0 ? 0 : (frand() > -0.6f);
    uint8_t *d_mask = (uint8_t *)dnew_bytes(mask.data(), S);
    size_t nq = (size_t)N * C, nm = (size_t)S * C, np = (size_t)N * NH * K;
    float *q = hrand(nq, 1.0f), *km = hrand(nm, 1.0f), *vm = hrand(nm, 1.0f), *out = hnew(nq), *p = hnew(np);
    float *d_q = dnew(q, nq), *d_km = dnew(km, nm), *d_vm = dnew(vm, nm), *d_out = dnew(NULL, nq),
          *d_p = dnew(NULL, np);
    float *dout = hrand(nq, 1.0f), *d_dout = dnew(dout, nq);
    for (int shift : {0, 1}) {  // memory of the token's own chunk / of the chunk of the token it predicts
        char nmf[64], nmp[64], nmq[64], nmk[64], nmv[64];
        snprintf(nmp, sizeof nmp, "crossattn_forward.p (shift %d)", shift);
        snprintf(nmf, sizeof nmf, "crossattn_forward.out (shift %d)", shift);
        snprintf(nmq, sizeof nmq, "crossattn_backward.dq (shift %d)", shift);
        snprintf(nmk, sizeof nmk, "crossattn_backward.dkm (shift %d)", shift);
        snprintf(nmv, sizeof nmv, "crossattn_backward.dvm (shift %d)", shift);
        crossattn_forward(out, p, q, km, vm, mask.data(), B, T, L, shift, K, NH, HD);
        GT(crossattn_forward_cuda(d_out, d_p, d_q, d_km, d_vm, d_mask, B, T, L, shift, K, NH, HD, st));
        GT(cmp(nmp, p, d_p, np, TOL_FP32));
        GT(cmp(nmf, out, d_out, nq, TOL_FP32));
        float *dq = hrand(nq, 0.1f), *dkm = hrand(nm, 0.1f), *dvm = hrand(nm, 0.1f);
        float *d_dq = dnew(dq, nq), *d_dkm = dnew(dkm, nm), *d_dvm = dnew(dvm, nm);
        CT(h2d(d_p, p, np * sizeof(float)));
        crossattn_backward(dq, dkm, dvm, dout, p, q, km, vm, B, T, L, shift, K, NH, HD);
        GT(crossattn_backward_cuda(d_dq, d_dkm, d_dvm, d_dout, d_p, d_q, d_km, d_vm, B, T, L, shift, K, NH, HD, st));
        GT(cmp(nmq, dq, d_dq, nq, TOL_FP32));
        GT(cmp(nmk, dkm, d_dkm, nm, TOL_FP32));
        GT(cmp(nmv, dvm, d_dvm, nm, TOL_FP32));
    }

    for (int G : {(int)NH, (int)C}) {
        char nmb[64];
        float *gl = hrand((size_t)N * G, 3.0f), *h = hrand(nq, 1.0f), *o = hrand(nq, 1.0f), *y = hnew(nq),
              *g = hnew((size_t)N * G);
        float *d_gl = dnew(gl, (size_t)N * G), *d_h = dnew(h, nq), *d_o = dnew(o, nq), *d_y = dnew(NULL, nq),
              *d_g = dnew(NULL, (size_t)N * G);
        gate_forward(y, g, gl, h, o, N, C, G);
        GT(gate_forward_cuda(d_y, d_g, d_gl, d_h, d_o, N, C, G, st));
        snprintf(nmb, sizeof nmb, "gate_forward.out[G=%d]", G);
        GT(cmp(nmb, y, d_y, nq, TOL_FP32));
        snprintf(nmb, sizeof nmb, "gate_forward.g[G=%d]", G);
        GT(cmp(nmb, g, d_g, (size_t)N * G, TOL_FP32));
        float *dh = hrand(nq, 0.1f), *dgl = hrand((size_t)N * G, 0.1f), *ddo = hrand(nq, 0.1f);
        float *d_dh = dnew(dh, nq), *d_dgl = dnew(dgl, (size_t)N * G), *d_ddo = dnew(ddo, nq);
        CT(h2d(d_g, g, (size_t)N * G * sizeof(float)));
        gate_backward(dh, dgl, ddo, dout, g, o, N, C, G);
        GT(gate_backward_cuda(d_dh, d_dgl, d_ddo, d_dout, d_g, d_o, N, C, G, st));
        snprintf(nmb, sizeof nmb, "gate_backward.dh[G=%d]", G);
        GT(cmp(nmb, dh, d_dh, nq, TOL_FP32));
        snprintf(nmb, sizeof nmb, "gate_backward.dgl[G=%d]", G);
        GT(cmp(nmb, dgl, d_dgl, (size_t)N * G, TOL_FP32));
        snprintf(nmb, sizeof nmb, "gate_backward.do[G=%d]", G);
        GT(cmp(nmb, ddo, d_ddo, nq, TOL_FP32));
    }

    float *h = hrand(nq, 1.0f), *pool = hnew((size_t)B * NC * C);
    float *d_h = dnew(h, nq), *d_pool = dnew(NULL, (size_t)B * NC * C);
    for (int tail = L; tail >= 1; tail = tail > 1 ? 1 : 0) { /* the whole chunk, then its last token */
        char nmb[64];
        chunk_pool_forward(pool, h, B, T, L, tail, C);
        GT(chunk_pool_forward_cuda(d_pool, d_h, B, T, L, tail, C, st));
        snprintf(nmb, sizeof nmb, "chunk_pool_forward[tail=%d]", tail);
        GT(cmp(nmb, pool, d_pool, (size_t)B * NC * C, TOL_FP32));
    }
    return DFM_OK;
}

static int check_losses(OpsCudaContext *ctx, int bf16, double tol) {
    const char *tag = bf16 ? "bf16" : "fp32";
    char nm[64];
    const int NR = 1100, CC = 64, V = 1000;  // NR > CE_ROWS_BLOCK_CUDA: two row blocks
    ctx->bf16 = bf16;
    std::vector<int> tgt(NR);
    for (int i = 0; i < NR; i++) tgt[i] = i % 17 == 5 ? -1 : (int)((frand() + 1.0f) * 0.5f * V) % V;
    float *x = hrand((size_t)NR * CC, 1.0f), *w = hrand((size_t)V * CC, 0.5f), *loss = hnew(NR);
    float *dx = hrand((size_t)NR * CC, 0.01f), *dw = hrand((size_t)V * CC, 0.01f);
    float *scratch = hnew((size_t)CE_ROWS_BLOCK * V);
    float dloss = 1.0f / NR;
    int *d_tgt = (int *)dnew_bytes(tgt.data(), NR * sizeof(int));
    float *d_x = dnew(x, (size_t)NR * CC), *d_w = dnew(w, (size_t)V * CC), *d_loss = dnew(NULL, NR),
          *d_dx = dnew(dx, (size_t)NR * CC), *d_dw = dnew(dw, (size_t)V * CC),
          *d_scratch = dnew(NULL, (size_t)CE_ROWS_BLOCK_CUDA * V);
    float *top1 = hnew(NR), *d_top1 = dnew(NULL, NR);
    double tot = lmhead_ce_forward_backward(loss, top1, dx, dw, x, w, tgt.data(), NR, CC, V, dloss, scratch), gtot = 0.0;
    GT(lmhead_ce_forward_backward_cuda(&gtot, d_loss, d_top1, d_dx, d_dw, d_x, d_w, d_tgt, NR, CC, V, dloss, d_scratch, ctx));
    if (!bf16) GT(cmp("lmhead_ce.top1[fp32]", top1, d_top1, NR, tol));  // (bf16 logits may reorder near-ties)
    snprintf(nm, sizeof nm, "lmhead_ce.total[%s]", tag);
    cmp_scalar(nm, tot, gtot, tol);
    snprintf(nm, sizeof nm, "lmhead_ce.losses[%s]", tag);
    GT(cmp(nm, loss, d_loss, NR, tol));
    snprintf(nm, sizeof nm, "lmhead_ce.dx[%s]", tag);
    GT(cmp(nm, dx, d_dx, (size_t)NR * CC, tol));
    snprintf(nm, sizeof nm, "lmhead_ce.dweight[%s]", tag);
    GT(cmp(nm, dw, d_dw, (size_t)V * CC, tol));
    ctx->bf16 = 0;
    if (bf16) return DFM_OK;

    const int S = B * (T / L) * K, D = DM;
    std::vector<uint8_t> mask(S);
    for (int s = 0; s < S; s++) mask[s] = s % 5 != 0;
    uint8_t *d_mask = (uint8_t *)dnew_bytes(mask.data(), S);
    float *pr = hrand((size_t)S * D, 1.0f), *tg = hrand((size_t)S * D, 1.0f), *dp = hrand((size_t)S * D, 0.1f);
    float *d_pr = dnew(pr, (size_t)S * D), *d_tg = dnew(tg, (size_t)S * D), *d_dp = dnew(dp, (size_t)S * D);
    double m = mse_forward_backward(dp, pr, tg, mask.data(), S, D, 0.5f), gm = 0.0;
    GT(mse_forward_backward_cuda(&gm, d_dp, d_pr, d_tg, d_mask, S, D, 0.5f, ctx));
    cmp_scalar("mse_forward_backward.loss", m, gm, TOL_FP32);
    GT(cmp("mse_forward_backward.dpred", dp, d_dp, (size_t)S * D, TOL_FP32));
    std::vector<uint8_t> none(S, 0);
    CT(h2d(d_mask, none.data(), S));
    GT(mse_forward_backward_cuda(&gm, NULL, d_pr, d_tg, d_mask, S, D, 0.5f, ctx));
    cmp_scalar("mse_forward_backward.no_valid_slot", 0.0, gm, 0.0);
    return DFM_OK;
}


// ---- frozen weights held in bf16 (the *_w16_cuda variants) ----
static uint16_t bf16_bits(float f) {  // round to nearest even, as __float2bfloat16
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static float bf16_value(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static float *rounded(const float *x, size_t n) {  // x rounded to bf16 values
    float *r = hnew(n);
    for (size_t i = 0; i < n; i++) r[i] = bf16_value(bf16_bits(x[i]));
    return r;
}
// the GPU rounds both GEMM operands to bf16 and accumulates in fp32: the CPU on rounded operands is the
// reference, up to summation order (fp32 bound); the fused CE also rounds its logit gradients (bf16 bound)
static int check_frozen_bf16(OpsCudaContext *ctx, cudaStream_t st) {
    int OC = F;
    float *w = hrand((size_t)OC * C, 0.1f), *inp = hrand((size_t)N * C, 1.0f), *bias = hrand(OC, 0.1f);
    float *d_w = dnew(w, (size_t)OC * C), *d_inp = dnew(inp, (size_t)N * C), *d_b = dnew(bias, OC);
    uint16_t *d_w16 = (uint16_t *)dnew_bytes(NULL, (size_t)OC * C * 2);
    GT(to_bf16_cuda(d_w16, d_w, (size_t)OC * C, st));
    std::vector<uint16_t> got((size_t)OC * C);
    CT(cudaDeviceSynchronize());
    CT(cudaMemcpy(got.data(), d_w16, got.size() * 2, cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (size_t i = 0; i < got.size(); i++) wrong += got[i] != bf16_bits(w[i]);
    record("to_bf16 (bits differing)", (double)wrong, (double)wrong, 0.0, got.size(), 0);
    float *wr = rounded(w, (size_t)OC * C), *ir = rounded(inp, (size_t)N * C);
    float *out = hnew((size_t)N * OC), *d_out = dnew(NULL, (size_t)N * OC);
    matmul_forward(out, ir, wr, bias, N, C, OC);
    GT(matmul_forward_w16_cuda(d_out, d_inp, d_w16, d_b, N, C, OC, ctx));
    GT(cmp("matmul_forward_w16", out, d_out, (size_t)N * OC, TOL_FP32));
    float *dout = hrand((size_t)N * OC, 1.0f), *dinp = hrand((size_t)N * C, 0.1f);
    float *d_dout = dnew(dout, (size_t)N * OC), *d_dinp = dnew(dinp, (size_t)N * C);
    matmul_backward(dinp, NULL, NULL, rounded(dout, (size_t)N * OC), ir, wr, N, C, OC);
    GT(matmul_backward_w16_cuda(d_dinp, d_dout, d_w16, N, C, OC, ctx));
    GT(cmp("matmul_backward_w16.dinp", dinp, d_dinp, (size_t)N * C, TOL_FP32));

    const int V = 300;
    std::vector<int> tok(N), tgt(N);
    for (int i = 0; i < N; i++) tok[i] = (int)((frand() + 1.0f) * 0.5f * V) % V, tgt[i] = i % 13 == 3 ? -1 : tok[(i + 1) % N];
    float *wte = hrand((size_t)V * C, 0.5f), *d_wte = dnew(wte, (size_t)V * C);
    uint16_t *d_wte16 = (uint16_t *)dnew_bytes(NULL, (size_t)V * C * 2);
    GT(to_bf16_cuda(d_wte16, d_wte, (size_t)V * C, st));
    float *wter = rounded(wte, (size_t)V * C), *emb = hnew((size_t)N * C), *d_emb = dnew(NULL, (size_t)N * C);
    int *d_tok = (int *)dnew_bytes(tok.data(), N * sizeof(int)), *d_tgt = (int *)dnew_bytes(tgt.data(), N * sizeof(int));
    embedding_forward(emb, tok.data(), wter, N, C);
    GT(embedding_forward_w16_cuda(d_emb, d_tok, d_wte16, N, C, st));
    GT(cmp("embedding_forward_w16", emb, d_emb, (size_t)N * C, 0.0));
    float *x = hrand((size_t)N * C, 1.0f), *dx = hrand((size_t)N * C, 0.01f), *loss = hnew(N);
    float *scratch = hnew((size_t)CE_ROWS_BLOCK * V);
    float *d_x = dnew(x, (size_t)N * C), *d_dx = dnew(dx, (size_t)N * C), *d_loss = dnew(NULL, N),
          *d_scr = dnew(NULL, (size_t)CE_ROWS_BLOCK_CUDA * V);
    double tot = lmhead_ce_forward_backward(loss, NULL, dx, NULL, rounded(x, (size_t)N * C), wter, tgt.data(), N, C, V,
                                            1.0f / N, scratch), gtot = 0.0;
    GT(lmhead_ce_forward_backward_w16_cuda(&gtot, d_loss, NULL, d_dx, d_x, d_wte16, d_tgt, N, C, V, 1.0f / N, d_scr, ctx));
    cmp_scalar("lmhead_ce_w16.total", tot, gtot, TOL_FP32);
    GT(cmp("lmhead_ce_w16.losses", loss, d_loss, N, TOL_FP32));
    GT(cmp("lmhead_ce_w16.dx", dx, d_dx, (size_t)N * C, TOL_BF16));
    return DFM_OK;
}

// ---- soft targets (CeSoft: dfm-train train --teacher) ----
// lmhead_ce_soft_forward_backward_cuda and its w16 twin against the CPU function, on rows that are ignored (target
// -1; some with a teacher, which must not count), rows without a teacher, zero probabilities, teacher ids that hold
// the target, a tail bucket (sum p < 1) on most rows and none on every fourth, row weights off 1, and more rows
// than one CE block; then, with weight 0 and no row weights, the soft kernel must give the plain kernel's bits (as
// the CPU function does)
static int check_soft(OpsCudaContext *ctx, cudaStream_t st) {
    const int NR = CE_ROWS_BLOCK_CUDA + 76, CC = 48, V = 400, S = 12, band = V / S;
    const float lam = 0.7f, dloss = 1.0f / NR;
    std::vector<int> tgt(NR), ids((size_t)NR * S);
    std::vector<uint8_t> has(NR);
    float *p = hnew((size_t)NR * S), *rw = hnew(NR);
    for (int r = 0; r < NR; r++) {
        tgt[r] = r % 17 == 5 ? -1 : (int)((frand() + 1.0f) * 0.5f * V) % V;
        has[r] = r % 3 != 0;
        rw[r] = 0.75f + 0.5f * frand();
        double z = 0.0;
        for (int i = 0; i < S; i++) {  // distinct: one id in each band of V / S ids
            ids[(size_t)r * S + i] = i * band + (int)((frand() + 1.0f) * 0.5f * band) % band;
            p[(size_t)r * S + i] = r % 5 == 0 && i == S - 1 ? 0.0f : 1.05f + frand();
            z += p[(size_t)r * S + i];
        }
        if (r % 7 == 1 && tgt[r] >= 0 && tgt[r] / band < S) ids[(size_t)r * S + tgt[r] / band] = tgt[r];
        // the teacher's own probabilities: all the mass on the ids on some rows, a tail (the rest of 1) on most
        double mass = r % 4 == 1 ? 1.0 : 0.5 + 0.45 * (frand() + 1.0f) * 0.5f;
        for (int i = 0; i < S; i++) p[(size_t)r * S + i] = (float)(mass * p[(size_t)r * S + i] / z);
    }
    int tails = 0;  // rows whose KL counts and has a tail bucket
    for (int r = 0; r < NR; r++) {
        double ps = 0.0;
        for (int i = 0; i < S; i++) ps += p[(size_t)r * S + i];
        tails += has[r] && tgt[r] >= 0 && ps < 1.0 - 1e-6;
    }
    int *d_tgt = (int *)dnew_bytes(tgt.data(), NR * sizeof(int)), *d_ids = (int *)dnew_bytes(ids.data(), ids.size() * sizeof(int));
    uint8_t *d_has = (uint8_t *)dnew_bytes(has.data(), NR);
    float *d_p = dnew(p, (size_t)NR * S), *d_rw = dnew(rw, NR);
    float *x = hrand((size_t)NR * CC, 1.0f), *w = hrand((size_t)V * CC, 0.5f), *scratch = hnew((size_t)CE_ROWS_BLOCK * V);
    float *d_x = dnew(x, (size_t)NR * CC), *d_w = dnew(w, (size_t)V * CC), *d_scr = dnew(NULL, (size_t)CE_ROWS_BLOCK_CUDA * V);
    for (int w16 = 0; w16 < 2; w16++) {
        const char *tag = w16 ? "w16" : "fp32";
        char nm[64];
        float *loss = hnew(NR), *top1 = hnew(NR), *dx = hrand((size_t)NR * CC, 0.01f), *dw = hrand((size_t)V * CC, 0.01f);
        float *d_loss = dnew(NULL, NR), *d_top1 = dnew(NULL, NR), *d_dx = dnew(dx, (size_t)NR * CC),
              *d_dw = dnew(dw, (size_t)V * CC);
        CeSoft cs = {ids.data(), p, has.data(), rw, S, lam, 0.0, 0.0, 0}, gs = {d_ids, d_p, d_has, d_rw, S, lam, 0.0, 0.0, 0};
        double tot, gtot = 0.0;
        if (!w16) {
            tot = lmhead_ce_soft_forward_backward(loss, top1, dx, dw, x, w, tgt.data(), NR, CC, V, dloss, scratch, &cs);
            GT(lmhead_ce_soft_forward_backward_cuda(&gtot, d_loss, d_top1, d_dx, d_dw, d_x, d_w, d_tgt, NR, CC, V, dloss,
                                                    d_scr, &gs, ctx));
            GT(cmp("lmhead_ce_soft.top1[fp32]", top1, d_top1, NR, TOL_FP32));
            GT(cmp("lmhead_ce_soft.dweight[fp32]", dw, d_dw, (size_t)V * CC, TOL_FP32));
        } else {  // the CPU on bf16-rounded operands (check_frozen_bf16)
            uint16_t *d_w16 = (uint16_t *)dnew_bytes(NULL, (size_t)V * CC * 2);
            GT(to_bf16_cuda(d_w16, d_w, (size_t)V * CC, st));
            tot = lmhead_ce_soft_forward_backward(loss, NULL, dx, NULL, rounded(x, (size_t)NR * CC),
                                                  rounded(w, (size_t)V * CC), tgt.data(), NR, CC, V, dloss, scratch, &cs);
            GT(lmhead_ce_soft_forward_backward_w16_cuda(&gtot, d_loss, NULL, d_dx, d_x, d_w16, d_tgt, NR, CC, V, dloss,
                                                        d_scr, &gs, ctx));
        }
        snprintf(nm, sizeof nm, "lmhead_ce_soft.total[%s]", tag);
        cmp_scalar(nm, tot, gtot, TOL_FP32);
        snprintf(nm, sizeof nm, "lmhead_ce_soft.losses[%s]", tag);
        GT(cmp(nm, loss, d_loss, NR, TOL_FP32));
        snprintf(nm, sizeof nm, "lmhead_ce_soft.dx[%s]", tag);
        GT(cmp(nm, dx, d_dx, (size_t)NR * CC, w16 ? TOL_BF16 : TOL_FP32));
        snprintf(nm, sizeof nm, "lmhead_ce_soft.kl_sum[%s]", tag);
        cmp_scalar(nm, cs.kl_sum, gs.kl_sum, TOL_FP32);
        snprintf(nm, sizeof nm, "lmhead_ce_soft.wce_sum[%s]", tag);
        cmp_scalar(nm, cs.wce_sum, gs.wce_sum, TOL_FP32);
        snprintf(nm, sizeof nm, "lmhead_ce_soft.n_teacher[%s]", tag);
        cmp_scalar(nm, (double)cs.n_teacher, (double)gs.n_teacher, 0.0);
        printf("     %-34s cpu KL %.6f, w*CE %.6f over %ld rows with a teacher (%d with a tail); gpu %.6f, %.6f, %ld\n",
               "", cs.kl_sum, cs.wce_sum, cs.n_teacher, tails, gs.kl_sum, gs.wce_sum, gs.n_teacher);
    }
    // weight 0, no row weights: the plain kernel's bits (losses, dx, dweight, total)
    float *d_l0 = dnew(NULL, NR), *d_l1 = dnew(NULL, NR), *d_dx0 = dnew(NULL, (size_t)NR * CC),
          *d_dx1 = dnew(NULL, (size_t)NR * CC), *d_dw0 = dnew(NULL, (size_t)V * CC), *d_dw1 = dnew(NULL, (size_t)V * CC);
    CeSoft g0 = {d_ids, d_p, d_has, NULL, S, 0.0f, 0.0, 0.0, 0};
    double t0 = 0.0, t1 = 0.0;
    GT(lmhead_ce_forward_backward_cuda(&t0, d_l0, NULL, d_dx0, d_dw0, d_x, d_w, d_tgt, NR, CC, V, dloss, d_scr, ctx));
    GT(lmhead_ce_soft_forward_backward_cuda(&t1, d_l1, NULL, d_dx1, d_dw1, d_x, d_w, d_tgt, NR, CC, V, dloss, d_scr, &g0,
                                            ctx));
    std::vector<float> a((size_t)NR + 2 * ((size_t)NR * CC) + (size_t)V * CC), b(a.size());
    const float *srcs[2][3] = {{d_l0, d_dx0, d_dw0}, {d_l1, d_dx1, d_dw1}};
    size_t ns[3] = {(size_t)NR, (size_t)NR * CC, (size_t)V * CC};
    CT(cudaDeviceSynchronize());
    for (int k = 0; k < 2; k++) {
        size_t off = 0;
        for (int j = 0; j < 3; off += ns[j], j++)
            CT(cudaMemcpy((k ? b : a).data() + off, srcs[k][j], ns[j] * 4, cudaMemcpyDeviceToHost));
    }
    int same = t0 == t1 && !memcmp(a.data(), b.data(), a.size() * sizeof(float)) && g0.n_teacher > 0;
    g_checks++;
    if (!same) g_fail++;
    printf("%s %-34s weight 0, unit row weights: the plain kernel's %s\n", same ? "PASS" : "FAIL",
           "lmhead_ce_soft == plain (bits)", same ? "bits (loss, losses, dx, dweight)" : "RESULTS DIFFER");
    return DFM_OK;
}

static int check_optimizer(OpsCudaContext *ctx) {
    const size_t n = 100003;
    float *p = hrand(n, 1.0f), *g = hrand(n, 0.1f), *m = hrand(n, 0.01f), *v = hnew(n);
    for (size_t i = 0; i < n; i++) v[i] = fabsf(frand()) * 1e-4f;
    std::vector<unsigned char> decay(n);
    for (size_t i = 0; i < n; i++) decay[i] = (i / 1000) % 2;
    float *d_p = dnew(p, n), *d_g = dnew(g, n), *d_m = dnew(m, n), *d_v = dnew(v, n);
    unsigned char *d_decay = (unsigned char *)dnew_bytes(decay.data(), n);
    AdamWConfig c = {3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};
    for (long t = 1; t <= 3; t++) {
        adamw_update(p, g, m, v, decay.data(), n, &c, t);
        GT(adamw_update_cuda(d_p, d_g, d_m, d_v, d_decay, n, &c, t, ctx->stream));
    }
    GT(cmp("adamw_update.params", p, d_p, n, TOL_FP32));
    GT(cmp("adamw_update.m", m, d_m, n, TOL_FP32));
    GT(cmp("adamw_update.v", v, d_v, n, TOL_FP32));
    double gn = grad_norm(g, n), ggn = 0.0;
    GT(grad_norm_cuda(&ggn, d_g, n, ctx));
    cmp_scalar("grad_norm", gn, ggn, 1e-10);
    grad_scale(g, n, 0.37f);
    GT(grad_scale_cuda(d_g, n, 0.37f, ctx->stream));
    GT(cmp("grad_scale", g, d_g, n, TOL_FP32));
    float *sum = hnew(n), *d_sum = dnew(NULL, n);
    vec_add(sum, p, g, n);
    GT(vec_add_cuda(d_sum, d_p, d_g, n, ctx->stream));
    GT(cmp("vec_add", sum, d_sum, n, 1e-6));
    GT(vec_zero_cuda(d_sum, n, ctx->stream));
    vec_zero(sum, n);
    GT(cmp("vec_zero", sum, d_sum, n, 0.0));
    return DFM_OK;
}

// the same GPU calls twice (attention backward and the fused CE with bf16 GEMMs) must give equal bits
static int check_determinism(OpsCudaContext *ctx) {
    size_t nq = (size_t)N * C, nk = (size_t)N * NKV * HD, na = (size_t)B * NH * T * T;
    const int V = 1000;
    float *q = hrand(nq, 1.0f), *k = hrand(nk, 1.0f), *v = hrand(nk, 1.0f), *dout = hrand(nq, 1.0f),
          *w = hrand((size_t)V * C, 0.5f);
    std::vector<int> tgt(N);
    for (int i = 0; i < N; i++) tgt[i] = (i * 37) % V;
    float *d_q = dnew(q, nq), *d_k = dnew(k, nk), *d_v = dnew(v, nk), *d_dout = dnew(dout, nq),
          *d_w = dnew(w, (size_t)V * C);
    float *d_att = dnew(NULL, na), *d_datt = dnew(NULL, na), *d_out = dnew(NULL, nq),
          *d_scr = dnew(NULL, (size_t)CE_ROWS_BLOCK_CUDA * V);
    int *d_tgt = (int *)dnew_bytes(tgt.data(), N * sizeof(int));
    std::vector<float> first, now;
    double tot[2] = {0, 0};
    ctx->bf16 = 1;
    for (int rep = 0; rep < 2; rep++) {
        float *d_dq = dnew(NULL, nq), *d_dk = dnew(NULL, nk), *d_dv = dnew(NULL, nk), *d_dw = dnew(NULL, (size_t)V * C);
        GT(attention_forward_cuda(d_out, d_att, d_q, d_k, d_v, B, T, NH, NKV, HD, ctx));
        GT(attention_backward_cuda(d_dq, d_dk, d_dv, d_datt, d_dout, d_att, d_q, d_k, d_v, B, T, NH, NKV, HD, ctx));
        GT(lmhead_ce_forward_backward_cuda(&tot[rep], NULL, NULL, d_dq, d_dw, d_out, d_w, d_tgt, N, C, V, 1.0f / N, d_scr,
                                           ctx));
        CT(cudaDeviceSynchronize());
        std::vector<float> &dst = rep == 0 ? first : now;
        dst.resize(nq + nk + nk + (size_t)V * C);
        CT(cudaMemcpy(dst.data(), d_dq, nq * 4, cudaMemcpyDeviceToHost));
        CT(cudaMemcpy(dst.data() + nq, d_dk, nk * 4, cudaMemcpyDeviceToHost));
        CT(cudaMemcpy(dst.data() + nq + nk, d_dv, nk * 4, cudaMemcpyDeviceToHost));
        CT(cudaMemcpy(dst.data() + nq + 2 * nk, d_dw, (size_t)V * C * 4, cudaMemcpyDeviceToHost));
    }
    ctx->bf16 = 0;
    int same = tot[0] == tot[1] && memcmp(first.data(), now.data(), first.size() * sizeof(float)) == 0;
    g_checks++;
    if (!same) g_fail++;
    printf("%s %-34s two runs of attention fwd/bwd + bf16 fused CE give %s\n", same ? "PASS" : "FAIL",
           "determinism", same ? "identical bits" : "DIFFERENT results");
    return DFM_OK;
}

int main(void) {
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        fprintf(stderr, "ops_cuda_check: no CUDA device (%s). HINT: run on a GPU machine\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 2;
    }
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    printf("ops_cuda_check: %s (sm_%d%d); sizes B=%d T=%d heads=%d/%d hd=%d C=%d; tolerances fp32 %.0e, bf16 %.0e "
           "(rel = max|gpu-cpu| / max|cpu|)\n",
           prop.name, prop.major, prop.minor, B, T, NH, NKV, HD, C, TOL_FP32, TOL_BF16);
    OpsCudaContext ctx;
    if (ops_cuda_init(&ctx, 0, 0)) {
        fprintf(stderr, "ops_cuda_check: %s\n", dfm_last_error());
        return 2;
    }
    int rc = 0;
    // every kernel here runs on ctx.stream; the checker syncs the device before each comparison.
    // OPS_CHECK_ONLY=NAME[,NAME...]: only these groups (the mutants of tests/py/cuda/test_cuda_emu_strict.py)
    const char *only = getenv("OPS_CHECK_ONLY");
    auto want = [only](const char *group) {
        if (!only || !*only) return true;
        size_t n = strlen(group);
        for (const char *p = strstr(only, group); p; p = strstr(p + 1, group))
            if ((p == only || p[-1] == ',') && (p[n] == 0 || p[n] == ',')) return true;
        return false;
    };
    if (!rc && want("matmul")) rc = check_matmul(&ctx, 0, TOL_FP32);
    if (!rc && want("matmul")) rc = check_matmul(&ctx, 1, TOL_BF16);
    if (!rc && want("norms")) rc = check_embedding_norms(ctx.stream);
    if (!rc && want("attention")) rc = check_rope_attention(&ctx);
    if (!rc && want("elementwise")) rc = check_elementwise(ctx.stream);
    if (!rc && want("fusion")) rc = check_fusion(ctx.stream);
    if (!rc && want("losses")) rc = check_losses(&ctx, 0, TOL_FP32);
    if (!rc && want("losses")) rc = check_losses(&ctx, 1, TOL_BF16);
    if (!rc && want("frozen")) rc = check_frozen_bf16(&ctx, ctx.stream);
    if (!rc && want("soft")) rc = check_soft(&ctx, ctx.stream);
    if (!rc && want("optimizer")) rc = check_optimizer(&ctx);
    if (!rc && want("determinism")) rc = check_determinism(&ctx);
    if (!rc && g_checks == 0) {
        fprintf(stderr, "ops_cuda_check: OPS_CHECK_ONLY=%s selects no group (matmul norms attention elementwise "
                "fusion losses frozen soft optimizer determinism)\n", only);
        rc = DFM_EARG;
    }
    if (!rc) {
        cudaError_t se = cudaDeviceSynchronize();
        if (se != cudaSuccess) {
            fprintf(stderr, "ops_cuda_check: a kernel failed: %s\n", cudaGetErrorString(se));
            rc = DFM_ECUDA;
        }
    }
    release_all();
    ops_cuda_free(&ctx);
    if (rc) {
        printf("RESULT: ERROR (a CUDA call failed after %d checks; see stderr)\n", g_checks);
        return 2;
    }
    printf("worst rel error: fp32 %.3e (bound %.0e), bf16 %.3e (bound %.0e)\n", g_worst_fp32, TOL_FP32, g_worst_bf16,
           TOL_BF16);
    printf("RESULT: %s (%d checks, %d failed)\n", g_fail ? "FAIL" : "PASS", g_checks, g_fail);
    return g_fail ? 1 : 0;
}

#endif  // DFM_OPS_CUDA_CHECK_MAIN
