/* dfm-train — the DFM trainer (CPU fp32 reference; CUDA engine with --device cuda): pretrain a small
 * backbone, train the DFM memory modules on top of a frozen one, evaluate, generate. 'dfm-train COMMAND
 * --help' for each. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/blas_core.h"
#include "common/error.h"
#include "common/opts.h"
#include "common/log.h"
#include "common/mpiutil.h"
#include "common/stop.h"
#include "trainer/cmd/commands.h"

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
} command;

static const command commands[] = {
    {"import-gguf", cmd_import_gguf, "convert a GGUF model (llama.cpp) into a Hugging Face folder with its tokenizer.json"},
    {"pretrain", cmd_pretrain, "train a small Llama/Qwen3 decoder on token data, save a Hugging Face folder"},
    {"train", cmd_train, "train predictor + projector + fusion on a frozen backbone with target memory"},
    {"eval", cmd_eval, "held-out CE with predicted / no / target memory, MSE and cosine of the slots"},
    {"generate", cmd_generate, "greedy decoding with memory predicted from the prompt and held fixed"},
    {"hidden", cmd_hidden, "write a frozen backbone's hidden states over a token stream: token-level datastore keys"},
    {"teacher", cmd_teacher, "the in-context teacher: the frozen LM with the neighbours' text pasted, its top log-probs per row for train --teacher"},
    {"slots", cmd_slots, "memory slots in the frozen LM's own space: each neighbour's hidden states, token by token or pooled, as a targets file"},
    {"synth", cmd_synth, "write a synthetic token shard + targets file with informative memory (tests, demos)"},
    {"dump-batches", cmd_dump_batches, "write the micro-batches the loader gives one rank (checks of other loaders)"},
    {"debug-state", cmd_debug_state, "write a tiny model's forward/backward state for the PyTorch parity test"},
};

static void usage(FILE *out) {
    fprintf(out, "dfm-train — Deep Fusion Memory trainer (CPU fp32 reference; CUDA engine with --device cuda)\n\nusage: dfm-train COMMAND [options]\n\n"
                 "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-12s %s\n", commands[i].name, commands[i].summary);
}

int main(int argc, char **argv) {
    /* OpenMP threads that spin after a parallel region starve OpenBLAS's own threads (two pools on the
     * same cores): passive waiting made a 2-thread training step 4x faster on a shared 2-core machine.
     * libgomp reads the policy when it loads, so set it and re-exec once unless the user chose one.
     * OpenBLAS likewise picks its kernels at load time: on a CPU model it does not know it falls back
     * to SSE3 ones (5x slower SGEMM), which dfm_blas_core_env corrects (common/blas_core.h). */
    int reexec = dfm_blas_core_env();
    if (!getenv("OMP_WAIT_POLICY")) {
        setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
        reexec = 1;
    }
    if (reexec) dfm_reexec_self(argv); /* returns only on failure: then run as we are */
    dfm_log_init(-1);
    /* a file-size limit must surface as a write error naming the file (DFM_ENOSPACE), not kill us */
    signal(SIGXFSZ, SIG_IGN);
    dfm_opts_set_program("dfm-train");
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(argv[1], commands[i].name)) continue;
        /* training stops cleanly on SIGTERM / SIGUSR1 at the next step, with a checkpoint (common/stop.h) */
        if (!strcmp(argv[1], "pretrain") || !strcmp(argv[1], "train")) dfm_stop_install();
        int rc = commands[i].fn(argc - 1, argv + 1);
        /* print before MPI_Finalize, so a failed rank's message is out before the job is torn down */
        if (rc < 0) {
            fprintf(stderr, "dfm-train %s: %s: %s\n", argv[1], rc == DFM_ESTOPPED ? "stopped" : "error",
                    dfm_last_error()[0] ? dfm_last_error() : dfm_strerror(rc));
            fflush(stderr);
        }
        dfm_mpi_finalize();
        return rc == DFM_ESTOPPED ? DFM_EXIT_STOPPED : rc < 0 ? 1 : rc;
    }
    fprintf(stderr, "dfm-train: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
