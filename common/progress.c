#include "common/progress.h"

#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TAG_PROGRESS 7101

struct dfm_progress {
    dfm_mpi m;
    MPI_Comm comm; /* private duplicate: progress messages never mix with the stage's own */
    char stage[32], unit[24];
    uint64_t total, done_local, *done_by_rank;
    double t0, last_send, last_print, interval;
    int tty, enabled;
    uint64_t send_buf;
    MPI_Request req;
};

static void human(double v, char *out, size_t n) {
    if (v >= 1e9) snprintf(out, n, "%.2fG", v / 1e9);
    else if (v >= 1e6) snprintf(out, n, "%.2fM", v / 1e6);
    else if (v >= 1e4) snprintf(out, n, "%.1fk", v / 1e3);
    else snprintf(out, n, "%.0f", v);
}

static void print_line(dfm_progress *p, int final) {
    uint64_t done = 0;
    for (int r = 0; r < p->m.size; r++) done += p->done_by_rank[r];
    if (p->total && done > p->total) done = p->total; /* a rank may read a little past its share (the line it finishes) */
    double dt = dfm_now() - p->t0, rate = dt > 0 ? (double)done / dt : 0;
    char d[16], t[16], rt[16], eta[32] = "";
    human((double)done, d, sizeof d);
    human((double)p->total, t, sizeof t);
    human(rate, rt, sizeof rt);
    if (!final && p->total && rate > 0 && done < p->total) snprintf(eta, sizeof eta, " ETA %.0fs", (double)(p->total - done) / rate);
    if (final) snprintf(eta, sizeof eta, " in %.1fs", dt);
    char line[200];
    int n = snprintf(line, sizeof line, "[%s] %s%s%s %s", p->stage, d, p->total ? "/" : "", p->total ? t : "", p->unit);
    if (p->total) n += snprintf(line + n, sizeof line - (size_t)n, " (%.1f%%)", 100.0 * (double)done / (double)p->total);
    snprintf(line + n, sizeof line - (size_t)n, " %s/s%s", rt, eta);
    if (p->tty) fprintf(stderr, "\r%-79s%s", line, final ? "\n" : "");
    else fprintf(stderr, "%s\n", line);
    fflush(stderr);
}

int dfm_progress_begin(const dfm_mpi *m, const char *stage, const char *unit, uint64_t total_local, dfm_progress **out) {
    *out = NULL;
    dfm_progress *p = calloc(1, sizeof *p);
    if (!p) return -2;
    p->m = *m;
    snprintf(p->stage, sizeof p->stage, "%s", stage);
    snprintf(p->unit, sizeof p->unit, "%s", unit);
    const char *en = getenv("DFM_PROGRESS");
    p->enabled = !(en && !strcmp(en, "0"));
    const char *iv = getenv("DFM_PROGRESS_INTERVAL");
    p->interval = iv ? atof(iv) : 30.0;
    p->tty = isatty(STDERR_FILENO);
    MPI_Comm_dup(m->comm, &p->comm);
    MPI_Allreduce(&total_local, &p->total, 1, MPI_UINT64_T, MPI_SUM, p->comm);
    p->done_by_rank = calloc((size_t)m->size, sizeof(uint64_t));
    p->req = MPI_REQUEST_NULL;
    p->t0 = p->last_send = p->last_print = dfm_now();
    *out = p;
    return 0;
}

static void drain(dfm_progress *p) {
    int flag = 1;
    while (flag) {
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, TAG_PROGRESS, p->comm, &flag, &st);
        if (!flag) break;
        uint64_t v;
        MPI_Recv(&v, 1, MPI_UINT64_T, st.MPI_SOURCE, TAG_PROGRESS, p->comm, MPI_STATUS_IGNORE);
        if (v > p->done_by_rank[st.MPI_SOURCE]) p->done_by_rank[st.MPI_SOURCE] = v;
    }
}

void dfm_progress_update(dfm_progress *p, uint64_t done_local) {
    if (!p) return;
    p->done_local = done_local;
    double now = dfm_now();
    if (p->m.rank != 0) {
        int idle = 1;
        if (p->req != MPI_REQUEST_NULL) MPI_Test(&p->req, &idle, MPI_STATUS_IGNORE);
        if (idle && now - p->last_send >= 0.25) {
            p->send_buf = done_local;
            MPI_Isend(&p->send_buf, 1, MPI_UINT64_T, 0, TAG_PROGRESS, p->comm, &p->req);
            p->last_send = now;
        }
        return;
    }
    p->done_by_rank[0] = done_local;
    drain(p);
    double every = p->tty ? 0.5 : p->interval;
    if (p->enabled && now - p->last_print >= every) {
        print_line(p, 0);
        p->last_print = now;
    }
}

void dfm_progress_end(dfm_progress *p) {
    if (!p) return;
    if (p->req != MPI_REQUEST_NULL) MPI_Wait(&p->req, MPI_STATUS_IGNORE);
    /* every rank's final count reaches rank 0 through a gather, after which stray updates are drained */
    MPI_Gather(&p->done_local, 1, MPI_UINT64_T, p->done_by_rank, 1, MPI_UINT64_T, 0, p->comm);
    MPI_Barrier(p->comm);
    if (p->m.rank == 0) {
        uint64_t final[1024];
        int n = p->m.size < 1024 ? p->m.size : 1024;
        memcpy(final, p->done_by_rank, (size_t)n * sizeof(uint64_t));
        drain(p);
        memcpy(p->done_by_rank, final, (size_t)n * sizeof(uint64_t));
        if (p->enabled) print_line(p, 1);
    }
    MPI_Barrier(p->comm);
    MPI_Comm_free(&p->comm);
    free(p->done_by_rank);
    free(p);
}
