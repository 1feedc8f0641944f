/* dot_peak.c — issue rate of the three multiply-add instructions the CPU encoder's precisions use, one core:
 * vfmadd231ps zmm (fp32: 16 multiply-adds), vdpbf16ps zmm (bf16: 32), vpdpbusd zmm (int8: 64), each over 16
 * independent accumulators (no latency chain), best of 5 passes. Why --precision bf16 is slower than fp32 on
 * CPUs where vdpbf16ps issues below the FMA rate (bench/results/report-encoder.md, the encoder in bf16 and int8).
 *
 *   dot_peak            prints one line per instruction: ns per instruction, multiply-adds per ns
 *
 * Refuses (exit 1) on a CPU without avx512_bf16 and avx512_vnni. Built by `make bench-programs`
 * (build/bench/dot_peak). */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define ITERS 20000000L
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }

/* the three loops keep all 16 accumulators in registers; the sums are printed so nothing is elided */
__attribute__((target("avx512f,avx512bf16,avx512vnni,avx512bw"), noinline)) static double fma_loop(float *sink) {
    __m512 a[16], b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-9f);
    for (int i = 0; i < 16; i++) a[i] = _mm512_set1_ps((float)i);
    double t = now();
    for (long i = 0; i < ITERS; i++)
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) a[j] = _mm512_fmadd_ps(a[j], b, c);
    t = now() - t;
    for (int i = 0; i < 16; i++) *sink += a[i][0];
    return t;
}
__attribute__((target("avx512f,avx512bf16,avx512vnni,avx512bw"), noinline)) static double bf16_loop(float *sink) {
    __m512 a[16];
    __m512bh b = (__m512bh)_mm512_set1_epi32(0x3f803f80), c = b;
    for (int i = 0; i < 16; i++) a[i] = _mm512_set1_ps((float)i);
    double t = now();
    for (long i = 0; i < ITERS; i++)
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) a[j] = _mm512_dpbf16_ps(a[j], b, c);
    t = now() - t;
    for (int i = 0; i < 16; i++) *sink += a[i][0];
    return t;
}
__attribute__((target("avx512f,avx512bf16,avx512vnni,avx512bw"), noinline)) static double int8_loop(float *sink) {
    __m512i a[16], b = _mm512_set1_epi32(0x01010101), c = _mm512_set1_epi32(0x02020202);
    for (int i = 0; i < 16; i++) a[i] = _mm512_set1_epi32(i);
    double t = now();
    for (long i = 0; i < ITERS; i++)
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) a[j] = _mm512_dpbusd_epi32(a[j], b, c);
    t = now() - t;
    for (int i = 0; i < 16; i++) *sink += (float)_mm512_cvtsi512_si32(a[i]);
    return t;
}

int main(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16") || !__builtin_cpu_supports("avx512vnni")) {
        fprintf(stderr, "dot_peak: this CPU lacks avx512_bf16 or avx512_vnni\n");
        return 1;
    }
    struct { const char *name; int macs; double (*fn)(float *); } k[] = {
        {"vfmadd231ps zmm (fp32)", 16, fma_loop}, {"vdpbf16ps zmm (bf16)", 32, bf16_loop}, {"vpdpbusd zmm (int8)", 64, int8_loop}};
    float sink = 0;
    for (int i = 0; i < 3; i++) {
        double best = 1e30;
        for (int r = 0; r < 5; r++) {
            double t = k[i].fn(&sink);
            best = t < best ? t : best;
        }
        double ns = best / (ITERS * 16.0) * 1e9;
        printf("%-24s %.3f ns per instruction, %.1f multiply-adds per ns\n", k[i].name, ns, k[i].macs / ns);
    }
    fprintf(stderr, "(checksum %g)\n", sink);
    return 0;
}
