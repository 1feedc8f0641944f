/* The trainer's fast CPU kernels against plain double-precision references, on shapes that reach the
 * paths the small gradient-check shapes do not: the SIMD primitives of trainer/kernels/vecmath.h (every tail
 * length, exp over its whole range), causal attention over several query-row blocks (T = 150: blocks of
 * 64, 64 and a partial 22, grouped-query heads; and the AVX-512 flash variant without T x T matrices, also
 * across thread counts), the LM head + CE over several row blocks with ignored
 * rows, and AdamW against the scalar PyTorch formula. Each check prints its worst error. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "trainer/kernels/adamw.h"
#include "trainer/kernels/attention_cpu.h"
#include "trainer/kernels/ops.h"
#include "trainer/kernels/rng.h"
#include "trainer/kernels/vecmath.h"
#include "tests/cuda/check_compare.h"

static float *randv(dfm_rng *r, size_t n, float scale) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = scale * (2.0f * rng_f32(r) - 1.0f);
    return x;
}

static double rel_err(const float *a, const double *b, size_t n) {
    double d = 0, na = 0, nb = 0;
    for (size_t i = 0; i < n; i++) {
        d += (a[i] - b[i]) * (a[i] - b[i]);
        na += (double)a[i] * a[i];
        nb += b[i] * b[i];
    }
    return sqrt(d) / fmax(fmax(sqrt(na), sqrt(nb)), 1e-30);
}

static void test_exp(void **state) {
    (void)state;
    double worst = 0;
    for (int i = 0; i <= 200000; i++) { /* [-87, 88] */
        float x = -87.0f + 175.0f * (float)i / 200000.0f, y = x;
        vm_exp_sum(&y, 1, 0.0f);
        double e = exp((double)x), rel = fabs(y - e) / e;
        if (rel > worst) worst = rel;
    }
    printf("  vm_exp on [-87, 88]: max rel err %.2e\n", worst);
    assert_true(worst < 3e-7);
    float lo[3] = {-100.0f, -1e30f, -INFINITY};
    assert_true(vm_exp_sum(lo, 3, 0.0f) == 0.0f);
    assert_true(lo[0] == 0.0f && lo[1] == 0.0f && lo[2] == 0.0f);
    float hi[2] = {88.5f, 1e30f}; /* above 88: exp(88), finite */
    vm_exp_sum(hi, 2, 0.0f);
    assert_true(isfinite(hi[0]) && fabs(hi[0] - exp(88.0)) < 3e-7 * exp(88.0) && hi[1] == hi[0]);
    /* every tail length: sums, max, dot, scale */
    dfm_rng r;
    rng_seed(&r, 7);
    for (size_t n = 1; n <= 50; n++) {
        float *x = randv(&r, n, 5.0f), *y = randv(&r, n, 1.0f), *z = malloc(n * sizeof(float));
        double mx = -INFINITY, dot = 0, sum = 0;
        for (size_t i = 0; i < n; i++) {
            mx = fmax(mx, x[i]);
            dot += (double)x[i] * y[i];
        }
        for (size_t i = 0; i < n; i++) sum += exp((double)(x[i] - (float)mx)); /* the argument as the kernel rounds it */
        assert_true(vm_max(x, n) == (float)mx);
        assert_true(fabs(vm_dot(x, y, n) - dot) <= 1e-5 * (1 + fabs(dot)) + 1e-5);
        memcpy(z, x, n * sizeof(float));
        float s = vm_exp_sum(z, n, (float)mx);
        assert_true(fabs(s - sum) <= 1e-6 * sum);
        for (size_t i = 0; i < n; i++) {
            double e = exp((double)(x[i] - (float)mx));
            assert_true(fabs(z[i] - e) <= 3e-7 * e);
        }
        vm_scale(z, n, 0.5f);
        for (size_t i = 0; i < n; i++) assert_true(fabs(z[i] - 0.5 * exp((double)(x[i] - (float)mx))) <= 3e-7);
        free(x), free(y), free(z);
    }
}

static void test_swiglu(void **state) {
    (void)state;
    dfm_rng r;
    rng_seed(&r, 8);
    size_t n = 16384 * 2 + 37; /* two blocks and a tail */
    float *g = randv(&r, n, 8.0f), *u = randv(&r, n, 2.0f), *dy = randv(&r, n, 1.0f), *o = malloc(n * 4);
    float *dg = calloc(n, 4), *du = calloc(n, 4);
    double *ro = malloc(n * 8), *rg = malloc(n * 8), *ru = malloc(n * 8);
    swiglu_forward(o, g, u, n);
    swiglu_backward(dg, du, dy, g, u, n);
    for (size_t i = 0; i < n; i++) {
        double s = 1.0 / (1.0 + exp(-(double)g[i]));
        ro[i] = g[i] * s * u[i];
        rg[i] = dy[i] * u[i] * s * (1.0 + g[i] * (1.0 - s));
        ru[i] = dy[i] * g[i] * s;
    }
    double e1 = rel_err(o, ro, n), e2 = rel_err(dg, rg, n), e3 = rel_err(du, ru, n);
    printf("  swiglu: out %.2e dgate %.2e dup %.2e\n", e1, e2, e3);
    assert_true(e1 < 1e-6 && e2 < 1e-6 && e3 < 1e-6);
    free(g), free(u), free(dy), free(o), free(dg), free(du), free(ro), free(rg), free(ru);
}

/* double reference of causal GQA attention: out, and for dout the gradients of sum(out * dout) */
static void attention_ref(double *out, double *dq, double *dk, double *dv, const float *q, const float *k,
                          const float *v, const float *dout, int B, int T, int nh, int nkv, int hd) {
    size_t qs = (size_t)nh * hd, ks = (size_t)nkv * hd;
    double scale = 1.0 / sqrt((double)hd), *p = malloc(T * sizeof(double)), *dp = malloc(T * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++) {
            int kh = h / (nh / nkv);
            for (int t = 0; t < T; t++) {
                const float *qr = q + ((size_t)b * T + t) * qs + h * hd;
                double mx = -INFINITY, sum = 0, pdp = 0;
                for (int u = 0; u <= t; u++) {
                    const float *kr = k + ((size_t)b * T + u) * ks + kh * hd;
                    double s = 0;
                    for (int i = 0; i < hd; i++) s += (double)qr[i] * kr[i];
                    p[u] = s * scale;
                    mx = fmax(mx, p[u]);
                }
                for (int u = 0; u <= t; u++) sum += (p[u] = exp(p[u] - mx));
                const float *dor = dout + ((size_t)b * T + t) * qs + h * hd;
                double *o = out + ((size_t)b * T + t) * qs + h * hd;
                for (int u = 0; u <= t; u++) {
                    p[u] /= sum;
                    const float *vr = v + ((size_t)b * T + u) * ks + kh * hd;
                    double *dvr = dv + ((size_t)b * T + u) * ks + kh * hd;
                    dp[u] = 0;
                    for (int i = 0; i < hd; i++) {
                        o[i] += p[u] * vr[i];
                        dvr[i] += p[u] * dor[i];
                        dp[u] += (double)dor[i] * vr[i];
                    }
                    pdp += p[u] * dp[u];
                }
                for (int u = 0; u <= t; u++) {
                    double ds = p[u] * (dp[u] - pdp) * scale;
                    const float *kr = k + ((size_t)b * T + u) * ks + kh * hd;
                    double *dkr = dk + ((size_t)b * T + u) * ks + kh * hd;
                    for (int i = 0; i < hd; i++) {
                        dq[((size_t)b * T + t) * qs + h * hd + i] += ds * kr[i];
                        dkr[i] += ds * qr[i];
                    }
                }
            }
        }
    free(p), free(dp);
}

static void attention_blocks_case(int hd) {
    int B = 2, T = 150, nh = 4, nkv = 2;
    size_t nq = (size_t)B * T * nh * hd, nk = (size_t)B * T * nkv * hd, na = (size_t)B * nh * T * T;
    dfm_rng r;
    rng_seed(&r, 9);
    float *q = randv(&r, nq, 1.0f), *k = randv(&r, nk, 1.0f), *v = randv(&r, nk, 1.0f), *dout = randv(&r, nq, 1.0f);
    float *out = malloc(nq * 4), *att = malloc(na * 4), *datt = malloc(na * 4);
    float *dq = calloc(nq, 4), *dk = calloc(nk, 4), *dv = calloc(nk, 4);
    double *ro = calloc(nq, 8), *rq = calloc(nq, 8), *rk = calloc(nk, 8), *rv = calloc(nk, 8);
    for (size_t i = 0; i < na; i++) att[i] = NAN; /* every entry must be written: zero above the diagonal */
    attention_forward(out, att, q, k, v, B, T, nh, nkv, hd);
    attention_backward(dq, dk, dv, datt, dout, att, q, k, v, B, T, nh, nkv, hd);
    attention_ref(ro, rq, rk, rv, q, k, v, dout, B, T, nh, nkv, hd);
    for (int bh = 0; bh < B * nh; bh++)
        for (int t = 0; t < T; t++) {
            double s = 0;
            for (int u = 0; u < T; u++) {
                float a = att[((size_t)bh * T + t) * T + u];
                assert_true(u <= t ? a >= 0.0f : a == 0.0f);
                s += a;
            }
            assert_true(fabs(s - 1.0) < 1e-5);
        }
    double e1 = rel_err(out, ro, nq), e2 = rel_err(dq, rq, nq), e3 = rel_err(dk, rk, nk), e4 = rel_err(dv, rv, nk);
    printf("  attention T=%d hd=%d: out %.2e dq %.2e dk %.2e dv %.2e\n", T, hd, e1, e2, e3, e4);
    assert_true(e1 < 1e-5 && e2 < 1e-5 && e3 < 1e-5 && e4 < 1e-5);
    free(q), free(k), free(v), free(dout), free(out), free(att), free(datt), free(dq), free(dk), free(dv);
    free(ro), free(rq), free(rk), free(rv);
}

/* The flash CPU attention (no T x T matrices) against the double reference, with a tail block (T = 150) and
 * GQA, for hd 16 and 32; dq, dk, dv accumulate onto what they held; 1 and 2 threads give the same bits. */
static void test_attention_blocks(void **state) {
    (void)state;
    for (int hd = 16; hd <= 24; hd += 8) /* a head size the flash kernels take, and one they do not */
        attention_blocks_case(hd);
}

static void test_attention_flash(void **state) {
    (void)state;
    if (!attention_flash_cpu_supported(16)) { /* no AVX-512F: only the refusal can be checked here */
        printf("  attention flash: this CPU has no AVX-512F; checked that it is refused\n");
        assert_false(__builtin_cpu_supports("avx512f"));
        return;
    }
    assert_false(attention_flash_cpu_supported(24)); /* head sizes not a multiple of 16 take the other path */
    for (int hd = 16; hd <= 32; hd += 16) {
        int B = 2, T = 150, nh = 4, nkv = 2;
        size_t nq = (size_t)B * T * nh * hd, nk = (size_t)B * T * nkv * hd;
        dfm_rng r;
        rng_seed(&r, 11);
        float *q = randv(&r, nq, 1.0f), *k = randv(&r, nk, 1.0f), *v = randv(&r, nk, 1.0f), *dout = randv(&r, nq, 1.0f);
        float *lse = malloc((size_t)B * nh * T * 4), *out[2], *dq[2], *dk[2], *dv[2];
        AttnFlashScratch fs = {NULL, attention_flash_scratch_floats(T, hd), 2};
        fs.buf = malloc(fs.per_thread * fs.threads * sizeof(float));
        for (int th = 0; th < 2; th++) {
            omp_set_num_threads(th + 1);
            out[th] = malloc(nq * 4), dq[th] = calloc(nq, 4), dk[th] = calloc(nk, 4), dv[th] = calloc(nk, 4);
            for (size_t i = 0; i < nq; i++) out[th][i] = NAN; /* every output entry must be written */
            dk[th][0] = 1.0f; /* accumulates: the reference adds the same 1 */
            attention_flash_forward(out[th], lse, q, k, v, B, T, nh, nkv, hd, &fs);
            attention_flash_backward(dq[th], dk[th], dv[th], dout, lse, q, k, v, B, T, nh, nkv, hd, &fs);
        }
        omp_set_num_threads(1);
        double *ro = calloc(nq, 8), *rq = calloc(nq, 8), *rk = calloc(nk, 8), *rv = calloc(nk, 8);
        attention_ref(ro, rq, rk, rv, q, k, v, dout, B, T, nh, nkv, hd);
        rk[0] += 1.0;
        double e1 = rel_err(out[0], ro, nq), e2 = rel_err(dq[0], rq, nq), e3 = rel_err(dk[0], rk, nk),
               e4 = rel_err(dv[0], rv, nk);
        printf("  attention flash T=%d hd=%d: out %.2e dq %.2e dk %.2e dv %.2e\n", T, hd, e1, e2, e3, e4);
        assert_true(e1 < 1e-5 && e2 < 1e-5 && e3 < 1e-5 && e4 < 1e-5);
        assert_memory_equal(out[0], out[1], nq * 4);
        assert_memory_equal(dq[0], dq[1], nq * 4);
        assert_memory_equal(dk[0], dk[1], nk * 4);
        assert_memory_equal(dv[0], dv[1], nk * 4);
        for (int th = 0; th < 2; th++) free(out[th]), free(dq[th]), free(dk[th]), free(dv[th]);
        free(q), free(k), free(v), free(dout), free(lse), free(fs.buf), free(ro), free(rq), free(rk), free(rv);
    }
}

static void test_lmhead_ce(void **state) {
    (void)state;
    int N = 2 * CE_ROWS_BLOCK + 19, C = 24, V = 333;
    dfm_rng r;
    rng_seed(&r, 10);
    float *x = randv(&r, (size_t)N * C, 1.0f), *w = randv(&r, (size_t)V * C, 1.0f);
    float *dx = calloc((size_t)N * C, 4), *dw = calloc((size_t)V * C, 4), *losses = malloc(N * 4);
    float *scratch = malloc((size_t)CE_ROWS_BLOCK * V * 4);
    int *tg = malloc(N * sizeof(int));
    for (int i = 0; i < N; i++) tg[i] = i % 7 == 3 ? -1 : (int)(rng_u32(&r) % V);
    /* every 4th row's target is its argmax (top1 = 1 there; elsewhere almost always 0) */
    for (int n = 0; n < N; n += 4) {
        if (tg[n] < 0) continue;
        double best = -INFINITY;
        for (int v = 0; v < V; v++) {
            double s = 0;
            for (int c = 0; c < C; c++) s += (double)x[(size_t)n * C + c] * w[(size_t)v * C + c];
            if (s > best) best = s, tg[n] = v;
        }
    }
    float dloss = 0.01f, *top1 = malloc(N * 4);
    double tot = lmhead_ce_forward_backward(losses, top1, dx, dw, x, w, tg, N, C, V, dloss, scratch);
    double *rx = calloc((size_t)N * C, 8), *rw = calloc((size_t)V * C, 8), *lg = malloc(V * 8), rt = 0, lerr = 0;
    int top1_wrong = 0, top1_set = 0;
    for (int n = 0; n < N; n++) {
        if (tg[n] < 0) {
            assert_true(losses[n] == 0.0f && top1[n] == 0.0f);
            continue;
        }
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++) {
            double s = 0;
            for (int c = 0; c < C; c++) s += (double)x[(size_t)n * C + c] * w[(size_t)v * C + c];
            lg[v] = s;
            mx = fmax(mx, s);
        }
        top1_wrong += top1[n] != (lg[tg[n]] >= mx ? 1.0f : 0.0f);
        top1_set += top1[n] == 1.0f;
        for (int v = 0; v < V; v++) sum += exp(lg[v] - mx);
        double loss = log(sum) + mx - lg[tg[n]];
        rt += loss;
        lerr = check_max(lerr, fabs(losses[n] - loss) / loss);
        for (int v = 0; v < V; v++) {
            double g = dloss * (exp(lg[v] - mx) / sum - (v == tg[n]));
            for (int c = 0; c < C; c++) {
                rx[(size_t)n * C + c] += g * w[(size_t)v * C + c];
                rw[(size_t)v * C + c] += g * x[(size_t)n * C + c];
            }
        }
    }
    double e1 = rel_err(dx, rx, (size_t)N * C), e2 = rel_err(dw, rw, (size_t)V * C);
    printf("  lmhead+CE N=%d: loss rel %.2e total rel %.2e dx %.2e dweight %.2e; top-1 flags: %d set, %d wrong\n", N,
           lerr, fabs(tot - rt) / rt, e1, e2, top1_set, top1_wrong);
    assert_true(lerr < 1e-5 && fabs(tot - rt) / rt < 1e-6 && e1 < 1e-5 && e2 < 1e-5);
    assert_true(top1_wrong == 0 && top1_set >= N / 5);
    free(x), free(w), free(dx), free(dw), free(losses), free(scratch), free(tg), free(rx), free(rw), free(lg), free(top1);
}

/* Soft targets (CeSoft: distillation and gain-weighted CE) against a double-precision reference of the loss
 * w_r·CE_r + λ·KL(p_r ‖ softmax_r) and its gradient; with soft NULL, λ = 0 and unit weights the function is
 * the plain one bit for bit. Rows: ignored ones, rows without a teacher, and teacher ids beyond the first block. */
static void test_lmhead_ce_soft(void **state) {
    (void)state;
    int N = CE_ROWS_BLOCK + 37, C = 16, V = 211, S = 5;
    float lam = 0.7f, dloss = 0.02f;
    dfm_rng r;
    rng_seed(&r, 12);
    float *x = randv(&r, (size_t)N * C, 1.0f), *w = randv(&r, (size_t)V * C, 1.0f);
    float *scratch = malloc((size_t)CE_ROWS_BLOCK * V * 4), *losses = malloc(N * 4), *rw = malloc(N * 4);
    float *p = malloc((size_t)N * S * 4);
    int *tg = malloc(N * sizeof(int)), *ids = malloc((size_t)N * S * sizeof(int));
    uint8_t *has = malloc(N);
    for (int n = 0; n < N; n++) {
        tg[n] = n % 11 == 5 ? -1 : (int)(rng_u32(&r) % V);
        has[n] = n % 3 != 0;
        rw[n] = 0.25f + rng_f32(&r);
        double z = 0;
        for (int i = 0; i < S; i++) { /* distinct ids */
            ids[n * S + i] = (int)((rng_u32(&r) % (V / S)) + (unsigned)i * (V / S));
            p[n * S + i] = 0.05f + rng_f32(&r);
            z += p[n * S + i];
        }
        double mass = n % 4 == 1 ? 1.0 : 0.5 + 0.45 * rng_f32(&r); /* some rows all mass on the ids, most with a tail */
        for (int i = 0; i < S; i++) p[n * S + i] = (float)(mass * p[n * S + i] / z);
    }
    float *dx = calloc((size_t)N * C, 4), *dw = calloc((size_t)V * C, 4);
    CeSoft soft = {.ids = ids, .p = p, .has = has, .row_w = rw, .S = S, .weight = lam};
    double tot = lmhead_ce_soft_forward_backward(losses, NULL, dx, dw, x, w, tg, N, C, V, dloss, scratch, &soft);
    double *rx = calloc((size_t)N * C, 8), *rdw = calloc((size_t)V * C, 8), *lg = malloc(V * 8), *g = malloc(V * 8);
    double rt = 0, rkl = 0, rwce = 0;
    long rn = 0;
    for (int n = 0; n < N; n++) {
        if (tg[n] < 0) continue;
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++) {
            double s = 0;
            for (int c = 0; c < C; c++) s += (double)x[(size_t)n * C + c] * w[(size_t)v * C + c];
            lg[v] = s;
            if (s > mx) mx = s;
        }
        for (int v = 0; v < V; v++) sum += exp(lg[v] - mx);
        double lse = log(sum) + mx, ce = lse - lg[tg[n]];
        rt += ce, rwce += rw[n] * ce;
        double l = has[n] ? lam : 0.0;
        for (int v = 0; v < V; v++) g[v] = (rw[n] + l) * exp(lg[v] - lse);
        g[tg[n]] -= rw[n];
        if (has[n]) { /* KL with the tail bucket: its gradient by the formula of ops.h, written out independently */
            rn++;
            double ps = 0, qs = 0;
            for (int i = 0; i < S; i++) {
                rkl += p[n * S + i] * (log(p[n * S + i]) - (lg[ids[n * S + i]] - lse));
                ps += p[n * S + i], qs += exp(lg[ids[n * S + i]] - lse);
            }
            double pr = 1 - ps > 0 ? 1 - ps : 0, qr = 1 - qs;
            if (pr > 0) rkl += pr * (log(pr) - log(qr));
            uint8_t *in_s = calloc(V, 1);
            for (int i = 0; i < S; i++) in_s[ids[n * S + i]] = 1;
            for (int v = 0; v < V; v++) /* λ·(q − p) on the ids, λ·q·(1 − p_rest/q_rest) elsewhere; w·q added above */
                g[v] += in_s[v] ? 0 : -lam * exp(lg[v] - lse) * (pr / qr);
            for (int i = 0; i < S; i++) g[ids[n * S + i]] -= lam * p[n * S + i];
            free(in_s);
        }
        for (int v = 0; v < V; v++)
            for (int c = 0; c < C; c++) {
                rx[(size_t)n * C + c] += dloss * g[v] * w[(size_t)v * C + c];
                rdw[(size_t)v * C + c] += dloss * g[v] * x[(size_t)n * C + c];
            }
    }
    double e1 = rel_err(dx, rx, (size_t)N * C), e2 = rel_err(dw, rdw, (size_t)V * C);
    printf("  lmhead+CE soft N=%d S=%d: CE total rel %.2e, weighted CE rel %.2e, KL %.6f vs %.6f over %ld/%ld rows, dx %.2e "
           "dweight %.2e\n", N, S, fabs(tot - rt) / rt, fabs(soft.wce_sum - rwce) / rwce, soft.kl_sum, rkl, soft.n_teacher, rn,
           e1, e2);
    assert_true(fabs(tot - rt) / rt < 1e-6 && fabs(soft.wce_sum - rwce) / rwce < 1e-6);
    assert_true(soft.n_teacher == rn && fabs(soft.kl_sum - rkl) < 1e-5 * (1 + fabs(rkl)) && rkl > 0);
    assert_true(e1 < 1e-5 && e2 < 1e-5);
    /* λ = 0 and unit weights: the plain kernel's gradient and loss, bit for bit */
    float *dx0 = calloc((size_t)N * C, 4), *dx1 = calloc((size_t)N * C, 4), *l0 = malloc(N * 4);
    for (int n = 0; n < N; n++) rw[n] = 1.0f;
    soft.weight = 0.0f;
    double t0 = lmhead_ce_forward_backward(l0, NULL, dx0, NULL, x, w, tg, N, C, V, dloss, scratch);
    double t1 = lmhead_ce_soft_forward_backward(losses, NULL, dx1, NULL, x, w, tg, N, C, V, dloss, scratch, &soft);
    assert_true(t0 == t1);
    assert_memory_equal(dx0, dx1, (size_t)N * C * 4);
    assert_memory_equal(l0, losses, (size_t)N * 4);
    free(x), free(w), free(scratch), free(losses), free(rw), free(p), free(tg), free(ids), free(has), free(dx), free(dw);
    free(rx), free(rdw), free(lg), free(g), free(dx0), free(dx1), free(l0);
}

static void test_adamw(void **state) {
    (void)state;
    size_t n = (1 << 16) + 45; /* two blocks and a tail */
    dfm_rng r;
    rng_seed(&r, 11);
    float *p = randv(&r, n, 1.0f), *g = randv(&r, n, 1.0f), *m = randv(&r, n, 0.1f), *v = randv(&r, n, 0.1f);
    unsigned char *dec = malloc(n);
    for (size_t i = 0; i < n; i++) {
        v[i] = fabsf(v[i]);
        dec[i] = (unsigned char)(i % 3 == 0);
    }
    float *p0 = malloc(n * 4), *m0 = malloc(n * 4), *v0 = malloc(n * 4);
    memcpy(p0, p, n * 4), memcpy(m0, m, n * 4), memcpy(v0, v, n * 4);
    AdamWConfig c = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
    adamw_update(p, g, m, v, dec, n, &c, 5);
    float b1c = 1.0f - powf(c.beta1, 5.0f), b2c = 1.0f - powf(c.beta2, 5.0f);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) { /* the same float operations: bit-identical */
        float mi = m0[i] * c.beta1 + g[i] * (1.0f - c.beta1), vi = v0[i] * c.beta2 + g[i] * g[i] * (1.0f - c.beta2);
        float wd = dec[i] ? c.weight_decay : 0.0f;
        float pi = p0[i] - c.lr * ((mi / b1c) / (sqrtf(vi / b2c) + c.eps) + wd * p0[i]);
        bad += mi != m[i] || vi != v[i] || pi != p[i];
    }
    printf("  adamw: %zu of %zu elements differ from the scalar formula\n", bad, n);
    assert_int_equal(bad, 0);
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)g[i] * g[i];
    assert_true(fabs(grad_norm(g, n) - sqrt(s)) < 1e-9 * sqrt(s));
    free(p), free(g), free(m), free(v), free(dec), free(p0), free(m0), free(v0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exp),      cmocka_unit_test(test_swiglu), cmocka_unit_test(test_attention_blocks),
        cmocka_unit_test(test_attention_flash),
        cmocka_unit_test(test_lmhead_ce), cmocka_unit_test(test_lmhead_ce_soft), cmocka_unit_test(test_adamw),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
