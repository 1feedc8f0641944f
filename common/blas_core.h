/* blas_core.h — make OpenBLAS use the SIMD kernels the CPU has.
 *
 * Debian's OpenBLAS (0.3.21, built with DYNAMIC_ARCH) picks its kernels from the CPU model number when
 * the library loads. A model it does not know (Emerald Rapids, family 6 model 207, on the machines dfm
 * was measured on) makes it fall back to "Prescott", the SSE3 kernels: SGEMM then runs 5x slower than
 * with the AVX-512 kernels the same CPU executes (7 vs 35-40 GFLOP/s at one thread, measured with
 * bench/encoder/sgemm_peak.c). OpenBLAS reads OPENBLAS_CORETYPE only at load time, so the fix is an environment
 * variable and a re-exec, done by the program's main before anything else runs.
 */
#ifndef DFM_COMMON_BLAS_CORE_H
#define DFM_COMMON_BLAS_CORE_H

/* When OPENBLAS_CORETYPE is unset and OpenBLAS chose a generic fallback core although the CPU (and the
 * OS) support AVX-512 (F, BW, DQ, VL) or AVX2 + FMA, set OPENBLAS_CORETYPE to SkylakeX or Haswell and
 * return 1: the caller re-executes itself so that OpenBLAS loads again with it. Returns 0 otherwise
 * (nothing changed: the user's choice, a known core, or a CPU without those extensions). */
int dfm_blas_core_env(void);

/* Execute this program again with the same argv (after dfm_blas_core_env or another load-time setting
 * asked for it). The real path of the executable is run, not /proc/self/exe, so that the process keeps
 * its name (comm: "dfm", not "exe") for pgrep, top, killall and Slurm's process view. Returns only when
 * exec fails; the caller then goes on as it is. */
void dfm_reexec_self(char **argv);

/* The kernel set OpenBLAS uses now (e.g. "SkylakeX"), for logs. */
const char *dfm_blas_core_name(void);

#endif
