// attention_cuda_check.cu — the flash attention kernels (trainer/kernels/attention_cuda.h) against the CPU reference
// attention_forward / attention_backward of trainer/kernels/ops.c.
//
// A separate program, built with -DDFM_ATTN_CUDA_CHECK_MAIN (without it this file compiles to nothing, so
// the Makefile's trainer/*/*.cu glob can include it in dfm-train). Also run on the CPU through the host
// emulation of CUDA (tests/py/cuda/test_train_attention_emu.py), hence the small sizes.
// For several shapes (partial tiles, T crossing tile boundaries, nkv = nh, nh/2, nh/4, head sizes 16..128
// including ones the kernels pad): random q, k, v, dout (fixed seed); the CPU forward and backward (from
// random gradient buffers: checks +=); the flash forward, then the flash backward from the flash forward's
// out and lse into the same random buffers. Per tensor (out, lse, dq, dk, dv):
//   max_abs = max |gpu - cpu|,  rel = max_abs / max |cpu|   bounded by 1e-5 (fp32).
// lse's reference is computed here in double. Guard words after every output must stay untouched. Then
// determinism: the forward and the backward twice give identical bits; and the argument checks.
// Prints one line per check and "RESULT: PASS|FAIL"; exit 0 pass, 1 a check failed, 2 a CUDA error or
// no CUDA device.
#ifdef DFM_ATTN_CUDA_CHECK_MAIN

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

extern "C" {
#include "common/error.h"
#include "trainer/kernels/ops.h"
}
#include "trainer/kernels/attention_cuda.h"
#define CHECK_SEED 0x2545F4914F6CDD1Dull
#include "tests/cuda/check_common.h"

#define TOL_FP32 1e-5
#define GUARD 64                 // floats after each device output that no kernel may touch
#define GUARD_VAL 123456.75f

static int g_fail = 0, g_checks = 0;
static double g_worst = 0.0;
static std::vector<void *> g_dev;


static std::vector<float> hrand(size_t n, float scale) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = frand() * scale;
    return v;
}
// device buffer of n floats (+ GUARD guard floats), a copy of src (NULL: zeros); complete on return
static float *dnew(const float *src, size_t n) {
    float *d = NULL;
    if (cudaMalloc(&d, (n + GUARD) * sizeof(float)) != cudaSuccess) {
        fprintf(stderr, "attention_cuda_check: cudaMalloc(%zu floats) failed\n", n + GUARD);
        exit(2);
    }
    g_dev.push_back(d);
    std::vector<float> h;
    if (src) h.assign(src, src + n);
    else h.assign(n, 0.0f);
    h.resize(n + GUARD, GUARD_VAL);
    cudaError_t e = cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "attention_cuda_check: upload failed: %s\n", cudaGetErrorString(e));
        exit(2);
    }
    return d;
}
static void release_all(void) {
    for (void *p : g_dev) cudaFree(p);
    g_dev.clear();
}
static void record(const char *name, int ok, const char *what) {
    g_checks++;
    if (!ok) g_fail++;
    printf("%s %-40s %s\n", ok ? "PASS" : "FAIL", name, what);
}
// device tensor (n floats + guard) vs the CPU result
static int cmp(const char *name, const float *cpu, const float *dgpu, size_t n) {
    std::vector<float> g(n + GUARD);
    CT(cudaDeviceSynchronize());
    CT(cudaMemcpy(g.data(), dgpu, g.size() * sizeof(float), cudaMemcpyDeviceToHost));
    check_diff d = check_compare(g.data(), cpu, n);  // rel INFINITY if a value is not finite
    double rel = d.nonfinite ? d.rel : d.max_abs / (d.max_ref > 1e-30 ? d.max_ref : 1e-30);
    int guard_ok = 1;
    for (size_t i = n; i < n + GUARD; i++) guard_ok &= g[i] == GUARD_VAL;
    int ok = rel <= TOL_FP32 && guard_ok;
    if (!(rel <= g_worst)) g_worst = rel;
    char line[200];
    snprintf(line, sizeof line, "n=%-7zu max_abs=%.3e rel=%.3e tol=%.0e%s%s", n, d.max_abs, rel, TOL_FP32,
             guard_ok ? "" : "  WRITE PAST THE END", d.nonfinite ? "  VALUES NOT FINITE" : "");
    record(name, ok, line);
    return DFM_OK;
}

struct Shape {
    int B, T, nh, nkv, hd;
};

// CPU log-sum-exp of the scaled causal scores, in double: lse[(b*nh + h)*T + t]
static void lse_reference(float *lse, const float *q, const float *k, const Shape &s) {
    int grp = s.nh / s.nkv;
    size_t qs = (size_t)s.nh * s.hd, ks = (size_t)s.nkv * s.hd;
    double scale = 1.0 / sqrt((double)s.hd);
    std::vector<double> sc(s.T);
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.nh; h++)
            for (int t = 0; t < s.T; t++) {
                const float *qr = q + ((size_t)b * s.T + t) * qs + (size_t)h * s.hd;
                double mx = -INFINITY, sum = 0.0;
                for (int u = 0; u <= t; u++) {
                    const float *kr = k + ((size_t)b * s.T + u) * ks + (size_t)(h / grp) * s.hd;
                    double d = 0.0;
                    for (int i = 0; i < s.hd; i++) d += (double)qr[i] * kr[i];
                    sc[u] = d * scale;
                    if (sc[u] > mx) mx = sc[u];
                }
                for (int u = 0; u <= t; u++) sum += exp(sc[u] - mx);
                lse[((size_t)b * s.nh + h) * s.T + t] = (float)(mx + log(sum));
            }
}

static int check_shape(const Shape &s, cudaStream_t st) {
    char tag[64], nm[96];
    snprintf(tag, sizeof tag, "B%d T%d h%d/%d hd%d", s.B, s.T, s.nh, s.nkv, s.hd);
    size_t nq = (size_t)s.B * s.T * s.nh * s.hd, nk = (size_t)s.B * s.T * s.nkv * s.hd;
    size_t nl = (size_t)s.B * s.nh * s.T, na = nl * s.T;
    std::vector<float> q = hrand(nq, 1.5f), k = hrand(nk, 1.5f), v = hrand(nk, 1.0f), dout = hrand(nq, 1.0f);
    std::vector<float> dq = hrand(nq, 0.1f), dk = hrand(nk, 0.1f), dv = hrand(nk, 0.1f);
    std::vector<float> out(nq), att(na), datt(na), lse(nl);
    float *d_q = dnew(q.data(), nq), *d_k = dnew(k.data(), nk), *d_v = dnew(v.data(), nk);
    float *d_dout = dnew(dout.data(), nq), *d_dq = dnew(dq.data(), nq), *d_dk = dnew(dk.data(), nk),
          *d_dv = dnew(dv.data(), nk);
    float *d_out = dnew(NULL, nq), *d_lse = dnew(NULL, nl), *d_delta = dnew(NULL, nl);

    attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), s.B, s.T, s.nh, s.nkv, s.hd);
    lse_reference(lse.data(), q.data(), k.data(), s);
    GT(attention_flash_forward_cuda(d_out, d_lse, d_q, d_k, d_v, s.B, s.T, s.nh, s.nkv, s.hd, st));
    snprintf(nm, sizeof nm, "fwd.out [%s]", tag);
    GT(cmp(nm, out.data(), d_out, nq));
    snprintf(nm, sizeof nm, "fwd.lse [%s]", tag);
    GT(cmp(nm, lse.data(), d_lse, nl));

    attention_backward(dq.data(), dk.data(), dv.data(), datt.data(), dout.data(), att.data(), q.data(), k.data(),
                       v.data(), s.B, s.T, s.nh, s.nkv, s.hd);
    GT(attention_flash_backward_cuda(d_dq, d_dk, d_dv, d_delta, d_dout, d_out, d_lse, d_q, d_k, d_v, s.B, s.T, s.nh,
                                     s.nkv, s.hd, st));
    snprintf(nm, sizeof nm, "bwd.dq  [%s]", tag);
    GT(cmp(nm, dq.data(), d_dq, nq));
    snprintf(nm, sizeof nm, "bwd.dk  [%s]", tag);
    GT(cmp(nm, dk.data(), d_dk, nk));
    snprintf(nm, sizeof nm, "bwd.dv  [%s]", tag);
    GT(cmp(nm, dv.data(), d_dv, nk));
    release_all();
    return DFM_OK;
}

// forward and backward twice from the same inputs into zeroed buffers: identical bits
static int check_determinism(const Shape &s, cudaStream_t st) {
    size_t nq = (size_t)s.B * s.T * s.nh * s.hd, nk = (size_t)s.B * s.T * s.nkv * s.hd, nl = (size_t)s.B * s.nh * s.T;
    std::vector<float> q = hrand(nq, 1.5f), k = hrand(nk, 1.5f), v = hrand(nk, 1.0f), dout = hrand(nq, 1.0f);
    float *d_q = dnew(q.data(), nq), *d_k = dnew(k.data(), nk), *d_v = dnew(v.data(), nk),
          *d_dout = dnew(dout.data(), nq);
    std::vector<float> run[2];
    for (int rep = 0; rep < 2; rep++) {
        float *d_out = dnew(NULL, nq), *d_lse = dnew(NULL, nl), *d_delta = dnew(NULL, nl), *d_dq = dnew(NULL, nq),
              *d_dk = dnew(NULL, nk), *d_dv = dnew(NULL, nk);
        GT(attention_flash_forward_cuda(d_out, d_lse, d_q, d_k, d_v, s.B, s.T, s.nh, s.nkv, s.hd, st));
        GT(attention_flash_backward_cuda(d_dq, d_dk, d_dv, d_delta, d_dout, d_out, d_lse, d_q, d_k, d_v, s.B, s.T,
                                         s.nh, s.nkv, s.hd, st));
        CT(cudaDeviceSynchronize());
        std::vector<float> &r = run[rep];
        r.resize(2 * nq + nl + nq + 2 * nk);
        float *p = r.data();
        CT(cudaMemcpy(p, d_out, nq * 4, cudaMemcpyDeviceToHost));
        CT(cudaMemcpy(p + nq, d_lse, nl * 4, cudaMemcpyDeviceToHost));
        CT(cudaMemcpy(p + nq + nl, d_dq, nq * 4, cudaMemcpyDeviceToHost));
        CT(cudaMemcpy(p + 2 * nq + nl, d_dk, nk * 4, cudaMemcpyDeviceToHost));
        CT(cudaMemcpy(p + 2 * nq + nl + nk, d_dv, nk * 4, cudaMemcpyDeviceToHost));
    }
    int same = memcmp(run[0].data(), run[1].data(), run[0].size() * sizeof(float)) == 0;
    char nm[96];
    snprintf(nm, sizeof nm, "determinism [B%d T%d h%d/%d hd%d]", s.B, s.T, s.nh, s.nkv, s.hd);
    record(nm, same, same ? "two runs of forward + backward give identical bits" : "DIFFERENT bits in two runs");
    release_all();
    return DFM_OK;
}

// unsupported sizes are refused with DFM_EARG before any launch
static void check_args(cudaStream_t st) {
    int ok = attention_flash_supported(64, 128) && attention_flash_supported(1, 1) &&
             !attention_flash_supported(64, 129) && !attention_flash_supported(0, 64) &&
             !attention_flash_supported(64, 0);
    record("attention_flash_supported", ok, "hd 1..128 and T >= 1 only");
    float *x = NULL;
    int r1 = attention_flash_forward_cuda(x, x, x, x, x, 1, 8, 4, 3, 16, st);    // nh % nkv != 0
    int r2 = attention_flash_forward_cuda(x, x, x, x, x, 1, 8, 4, 2, 160, st);   // hd > 128
    int r3 = attention_flash_backward_cuda(x, x, x, x, x, x, x, x, x, x, 1, 8, 4, 2, 160, st);
    int r4 = attention_flash_forward_cuda(x, x, x, x, x, 0, 8, 4, 2, 16, st);    // B = 0: nothing to do
    record("argument checks", r1 == DFM_EARG && r2 == DFM_EARG && r3 == DFM_EARG && r4 == DFM_OK,
           "bad sizes give DFM_EARG, B = 0 is a no-op");
    dfm_error_clear();
}

int main(void) {
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        fprintf(stderr, "attention_cuda_check: no CUDA device (%s). HINT: run on a GPU machine\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 2;
    }
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    printf("attention_cuda_check: %s (sm_%d%d); flash attention vs trainer/kernels/ops.c, tolerance %.0e "
           "(rel = max|gpu-cpu| / max|cpu|)\n",
           prop.name, prop.major, prop.minor, TOL_FP32);
    cudaStream_t st;
    if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) {
        fprintf(stderr, "attention_cuda_check: cudaStreamCreateWithFlags failed\n");
        return 2;
    }
    // hd 16, 24, 40 pad to the 32 / 64 kernels; T 70 = 64 + 6 and 130 = 2*64 + 2 (query tiles of 64, key
    // tiles of 32, Q/dO tiles of 32 in dk/dv), 45 with hd 128 (tiles of 32); nkv = nh, nh/2, nh/4; T = 1
    const Shape shapes[] = {
        {2, 70, 4, 2, 32}, {2, 70, 4, 4, 16}, {2, 70, 4, 2, 64},  {1, 130, 4, 1, 64},
        {1, 45, 2, 1, 128}, {1, 33, 4, 1, 40}, {2, 97, 6, 3, 24}, {1, 1, 2, 1, 8},
    };
    int rc = 0;
    for (const Shape &s : shapes)
        if (!rc) rc = check_shape(s, st);
    if (!rc) rc = check_determinism(shapes[0], st);
    if (!rc) check_args(st);
    if (!rc) {
        cudaError_t se = cudaDeviceSynchronize();
        if (se != cudaSuccess) {
            fprintf(stderr, "attention_cuda_check: a kernel failed: %s\n", cudaGetErrorString(se));
            rc = DFM_ECUDA;
        }
    }
    release_all();
    cudaStreamDestroy(st);
    if (rc) {
        printf("RESULT: ERROR (a CUDA call failed after %d checks; see stderr)\n", g_checks);
        return 2;
    }
    printf("worst rel error: %.3e (bound %.0e)\n", g_worst, TOL_FP32);
    printf("RESULT: %s (%d checks, %d failed)\n", g_fail ? "FAIL" : "PASS", g_checks, g_fail);
    return g_fail ? 1 : 0;
}

#endif  // DFM_ATTN_CUDA_CHECK_MAIN
