/* work.c — per-rank work records (see work.h). */
#include "retriever/work.h"

#include "common/error.h"
#include "common/log.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double clock_s(clockid_t id) {
    struct timespec ts;
    if (clock_gettime(id, &ts) != 0) return 0;
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double dfm_cpu_now(void) { return clock_s(CLOCK_PROCESS_CPUTIME_ID); }

void dfm_work_start(dfm_work *w) {
    memset(w, 0, sizeof *w);
    w->cpu0 = dfm_cpu_now();
    w->wall0 = dfm_now();
}

void dfm_work_mpi_begin(dfm_work *w) {
    if (!w) return;
    w->open_wall = dfm_now();
    w->open_cpu = clock_s(CLOCK_THREAD_CPUTIME_ID);
}

void dfm_work_mpi_end(dfm_work *w) {
    if (!w) return;
    w->mpi_s += dfm_now() - w->open_wall;
    w->mpi_cpu_s += clock_s(CLOCK_THREAD_CPUTIME_ID) - w->open_cpu;
}

int dfm_work_agree(dfm_work *w, const dfm_mpi *m, int rc) {
    dfm_work_mpi_begin(w);
    rc = dfm_mpi_agree(m, rc);
    dfm_work_mpi_end(w);
    dfm_work_ring(w, 2 * sizeof(int), m->size); /* dfm_mpi_agree: an allreduce of 2 ints */
    return rc;
}

void dfm_work_phase(dfm_work *w, int phase) {
    double now = dfm_cpu_now() - w->cpu0 - w->mpi_cpu_s;
    w->phase_cpu[phase] += now - w->mark;
    w->mark = now;
}

void dfm_work_ring(dfm_work *w, uint64_t bytes, int P) {
    if (w && P > 1) w->bytes_sent += 2 * bytes * (uint64_t)(P - 1) / (uint64_t)P;
}

/* the record's fields, in manifest order */
enum { F_COARSE, F_SCANNED, F_BF, F_EXACT, F_KM, F_KMF, F_QUERIES, F_SHARD, F_ADDED, F_TRAIN, F_BYTES, N_U64 };
static const char *const u64_names[N_U64] = {"coarse_distances", "codes_scanned", "bf_scanned",     "exact_scores",  "kmeans_distances", "kmeans_flops",
                                              "queries",          "shard_searches", "vectors_added", "train_points", "bytes_sent"};
enum { F_CPU, F_PHASE0, F_PHASE1, F_MPI, F_MPI_CPU, F_WALL, N_DBL };

typedef struct {
    uint64_t u[N_U64];
    double d[N_DBL];
} record;

static json_t *record_json(const record *r, int rank, const char *const *dbl_names) {
    json_t *o = json_object();
    if (rank >= 0) json_object_set_new(o, "rank", json_integer(rank));
    for (int i = 0; i < N_U64; i++) json_object_set_new(o, u64_names[i], json_integer((json_int_t)r->u[i]));
    for (int i = 0; i < N_DBL; i++) json_object_set_new(o, dbl_names[i], json_real(r->d[i]));
    return o;
}

int dfm_work_gather(const dfm_mpi *m, dfm_work *w, const char *phase0, const char *phase1, json_t **out) {
    *out = NULL;
    const char *const dbl_names[N_DBL] = {"cpu_s", phase0, phase1, "mpi_s", "mpi_cpu_s", "wall_s"};
    double wall = dfm_now() - w->wall0, cpu = dfm_cpu_now() - w->cpu0 - w->mpi_cpu_s;
    record me = {{w->coarse_distances, w->codes_scanned, w->bf_scanned, w->exact_scores, w->kmeans_distances, w->kmeans_flops, w->queries,
                  w->shard_searches, w->vectors_added, w->train_points, w->bytes_sent},
                 {cpu > 0 ? cpu : 0, w->phase_cpu[0], w->phase_cpu[1], w->mpi_s, w->mpi_cpu_s, wall}};
    record *all = m->rank == 0 ? calloc((size_t)m->size, sizeof *all) : NULL;
    int rc = m->rank == 0 && !all ? DFM_FAIL(DFM_ENOMEM, "no memory") : DFM_OK;
    if ((rc = dfm_mpi_agree(m, rc))) return rc;
    rc = DFM_MPI_CHECK(MPI_Gather(&me, sizeof me, MPI_BYTE, all, sizeof me, MPI_BYTE, 0, m->comm));
    if (!rc && m->rank == 0) {
        record tot = {{0}, {0}}, mx = {{0}, {0}};
        json_t *ranks = json_array();
        for (int r = 0; r < m->size; r++) {
            for (int i = 0; i < N_U64; i++) {
                tot.u[i] += all[r].u[i];
                if (all[r].u[i] > mx.u[i]) mx.u[i] = all[r].u[i];
            }
            for (int i = 0; i < N_DBL; i++) {
                tot.d[i] += all[r].d[i];
                if (all[r].d[i] > mx.d[i]) mx.d[i] = all[r].d[i];
            }
            json_array_append_new(ranks, record_json(&all[r], r, dbl_names));
        }
        *out = json_pack("{s:o, s:o, s:o}", "ranks", ranks, "total", record_json(&tot, -1, dbl_names), "max_rank", record_json(&mx, -1, dbl_names));
        if (!*out) rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    }
    free(all);
    return dfm_mpi_agree(m, rc);
}
