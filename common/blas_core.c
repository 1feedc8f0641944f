/* blas_core.c — OpenBLAS kernel choice on CPUs its dispatcher does not know (see blas_core.h). */
#include "common/blas_core.h"

#include <cblas.h>
#include <limits.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

/* the cores OpenBLAS 0.3.x falls back to for an unknown CPU model */
static int generic_core(const char *name) {
    static const char *const fallbacks[] = {"prescott", "core2", "nehalem", "katmai", "coppermine", "northwood",
                                            "banias", "unknown"};
    if (!name) return 0;
    for (size_t i = 0; i < sizeof fallbacks / sizeof fallbacks[0]; i++)
        if (!strcasecmp(name, fallbacks[i])) return 1;
    return 0;
}

int dfm_blas_core_env(void) {
    if (getenv("OPENBLAS_CORETYPE")) return 0; /* the user's choice */
    if (!generic_core(openblas_get_corename())) return 0;
    __builtin_cpu_init();
    const char *core = NULL; /* libgcc's checks include the OS's saved-state support (XGETBV) */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        core = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        core = "Haswell";
    if (!core) return 0;
    return setenv("OPENBLAS_CORETYPE", core, 1) == 0;
}

const char *dfm_blas_core_name(void) {
    const char *n = openblas_get_corename();
    return n ? n : "unknown";
}

void dfm_reexec_self(char **argv) {
    /* the kernel names a process after the file exec'd: "/proc/self/exe" would make every rank "exe" */
    char path[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    if (n > 0) {
        path[n] = 0;
        execv(path, argv); /* fails when the file was replaced since (" (deleted)"): then the link */
    }
    execv("/proc/self/exe", argv);
}
