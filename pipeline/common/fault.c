#include "fault.h"

#include "log.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void dfm_fault_point(const char *name, int rank) {
    const char *want = getenv("DFM_FAULT");
    if (!want || strcmp(want, name) != 0) return;
    const char *r = getenv("DFM_FAULT_RANK");
    if (r && atoi(r) != rank) return;
    DFM_LOG_W("fault injection: killing rank %d at '%s' (DFM_FAULT)", rank, name);
    kill(getpid(), SIGKILL);
}
