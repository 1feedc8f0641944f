#include "common/stop.h"

#include "common/error.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static volatile sig_atomic_t g_signal;

static void on_signal(int sig) {
    if (!g_signal) g_signal = sig;
}

void dfm_stop_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
}

int dfm_stop_signal(void) { return (int)g_signal; }

void dfm_stop_reset(void) { g_signal = 0; }

int dfm_stop_check(const char *where_fmt, ...) {
    int sig = (int)g_signal;
    if (!sig) return DFM_OK;
    char where[256];
    va_list ap;
    va_start(ap, where_fmt);
    vsnprintf(where, sizeof where, where_fmt, ap);
    va_end(ap);
    return DFM_FAIL(DFM_ESTOPPED, "stopped by %s %s. HINT: run the same command again to resume", sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : "a signal", where);
}
