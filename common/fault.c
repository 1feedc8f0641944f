#include "common/fault.h"

#include "common/log.h"

#include <mpi.h>

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void dfm_fault_point(const char *name, int rank) {
    const char *want = getenv("DFM_FAULT");
    if (!want || strcmp(want, name) != 0) return;
    if (rank < 0) { /* caller does not know: ask MPI */
        int inited = 0;
        MPI_Initialized(&inited);
        rank = 0;
        if (inited) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    }
    const char *r = getenv("DFM_FAULT_RANK");
    if (r && atoi(r) != rank) return;
    const char *sig = getenv("DFM_FAULT_SIGNAL");
    if (sig && *sig) { /* a stop request, not a death: the stage goes on to its next stop check */
        if (!strcmp(sig, "STOP")) { /* the test does something to the files, then sends SIGCONT */
            DFM_LOG_W("fault injection: SIGSTOP to rank %d at '%s' (DFM_FAULT_SIGNAL)", rank, name);
            raise(SIGSTOP);
            return;
        }
        int s = !strcmp(sig, "USR1") || !strcmp(sig, "SIGUSR1") ? SIGUSR1 : SIGTERM;
        DFM_LOG_W("fault injection: %s to rank %d at '%s' (DFM_FAULT_SIGNAL)", s == SIGUSR1 ? "SIGUSR1" : "SIGTERM", rank, name);
        raise(s);
        return;
    }
    DFM_LOG_W("fault injection: killing rank %d at '%s' (DFM_FAULT)", rank, name);
    kill(getpid(), SIGKILL);
}

void dfm_fault_delay(void) {
    static long ms = -1;
    if (ms < 0) {
        const char *v = getenv("DFM_FAULT_DELAY_MS");
        ms = v && *v ? atol(v) : 0;
        if (ms < 0) ms = 0;
    }
    if (!ms) return;
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && (ts.tv_sec > 0 || ts.tv_nsec > 0)) { /* a signal: sleep the rest */
    }
}
