#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static int g_level = DFM_LOG_INFO;
static int g_rank = 0, g_size = 1;
static double g_t0 = -1;

double dfm_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void dfm_log_init(int level) {
    if (g_t0 < 0) g_t0 = dfm_now();
    if (level >= 0) {
        g_level = level;
        return;
    }
    const char *e = getenv("DFM_LOG_LEVEL");
    if (!e) return;
    if (!strcasecmp(e, "error")) g_level = DFM_LOG_ERROR;
    else if (!strcasecmp(e, "warn")) g_level = DFM_LOG_WARN;
    else if (!strcasecmp(e, "info")) g_level = DFM_LOG_INFO;
    else if (!strcasecmp(e, "debug")) g_level = DFM_LOG_DEBUG;
}

void dfm_log_set_rank(int rank, int size) {
    g_rank = rank;
    g_size = size;
}

int dfm_log_level(void) { return g_level; }

double dfm_log_elapsed(void) {
    if (g_t0 < 0) g_t0 = dfm_now();
    return dfm_now() - g_t0;
}

void dfm_log(int level, const char *fmt, ...) {
    static const char *names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    if (level > g_level) return;
    char line[4096];
    int n = snprintf(line, sizeof line, "[dfm r%d/%d %.2fs %s] ", g_rank, g_size, dfm_log_elapsed(),
                     names[level < 0 ? 0 : level > 3 ? 3 : level]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    n += m < 0 ? 0 : m;
    if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}
