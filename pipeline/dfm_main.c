/* dfm — one binary, one subcommand per pipeline step. See README.md for the reference. */
#include "common/blas_core.h"
#include "common/error.h"
#include "common/log.h"
#include "common/mpiutil.h"
#include "common/stop.h"
#include "common/version.h"

#include <signal.h>
#include <unistd.h>
#include <stdio.h>
#include <string.h>

#define DFM_COMMAND(name, fn, summary) int fn(int argc, char **argv);
#include "pipeline/commands.def"
#undef DFM_COMMAND

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
} command;

static const command commands[] = {
#define DFM_COMMAND(name, fn, summary) {#name, fn, summary},
#include "pipeline/commands.def"
#undef DFM_COMMAND
};

static void usage(FILE *out) {
    fprintf(out, "dfm %s — training targets for Deep Fusion Memory\n\nusage: dfm COMMAND [options]\n\ncommands:\n",
            DFM_VERSION);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-14s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n'dfm COMMAND --help' describes each one. Stages run under MPI: mpirun -np 4 dfm chunk ...\n");
}

int main(int argc, char **argv) {
    /* OpenBLAS (FAISS's search and training, the encoder's fallback GEMMs) may have fallen back to its SSE3
     * kernels on a CPU model it does not know: set OPENBLAS_CORETYPE and load it again (common/blas_core.h). */
    if (dfm_blas_core_env()) dfm_reexec_self(argv); /* returns only on failure: run as we are */
    dfm_log_init(-1);
    /* a file-size limit must surface as a write error naming the file (DFM_ENOSPACE), not kill us */
    signal(SIGXFSZ, SIG_IGN);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("dfm %s\n", DFM_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(argv[1], commands[i].name)) continue;
        /* the writing stages stop cleanly on SIGTERM / SIGUSR1 at their next block (common/stop.h); other
         * commands write nothing that a kill could leave half-done, and die as usual */
        static const char *const stoppable[] = {"chunk", "encode", "index", "retrieve", "write-targets", "build"};
        for (size_t j = 0; j < sizeof stoppable / sizeof stoppable[0]; j++)
            if (!strcmp(argv[1], stoppable[j])) dfm_stop_install();
        int rc = commands[i].fn(argc - 1, argv + 1);
        /* Print before MPI_Finalize: a rank that failed must have its message out before the others,
         * which only say "rank N failed", leave the finalize fence and let mpirun abort the job. */
        if (rc < 0) {
            fprintf(stderr, "dfm %s: %s: %s\n", argv[1], rc == DFM_ESTOPPED ? "stopped" : "error", dfm_last_error()[0] ? dfm_last_error() : dfm_strerror(rc));
            fflush(stderr);
        }
        dfm_mpi_finalize();
        return rc == DFM_ESTOPPED ? DFM_EXIT_STOPPED : rc < 0 ? 1 : rc;
    }
    fprintf(stderr, "dfm: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
