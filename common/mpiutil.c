#include "common/mpiutil.h"

#include "common/error.h"
#include "common/log.h"

int dfm_mpi_check_at(int mpi_rc, const char *what, const char *file, int line) {
    if (mpi_rc == MPI_SUCCESS) return DFM_OK;
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(mpi_rc, s, &n);
    return dfm_fail_at(file, line, DFM_EMPI, "%s failed: %s", what, s);
}

int dfm_mpi_init(int *argc, char ***argv, dfm_mpi *m) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided = 0;
        DFM_TRY(DFM_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided)));
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    m->comm = MPI_COMM_WORLD;
    MPI_Comm_rank(m->comm, &m->rank);
    MPI_Comm_size(m->comm, &m->size);
    dfm_log_set_rank(m->rank, m->size);
    return DFM_OK;
}

static int g_hold;

void dfm_mpi_hold(int hold) { g_hold = hold; }

void dfm_mpi_finalize(void) {
    if (g_hold) return; /* a driver (dfm build) runs several stages in one MPI session */
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (inited && !fin) MPI_Finalize();
}

int dfm_mpi_agree(const dfm_mpi *m, int rc) {
    /* lowest failing rank, or size if none; and the lowest rank that stopped on a signal */
    int mine[2] = {rc ? m->rank : m->size, rc == DFM_ESTOPPED ? m->rank : m->size}, lowest[2] = {m->size, m->size};
    int mrc = MPI_Allreduce(mine, lowest, 2, MPI_INT, MPI_MIN, m->comm);
    if (mrc != MPI_SUCCESS) return rc ? rc : DFM_MPI_CHECK(mrc);
    if (lowest[0] == m->size) return DFM_OK;
    if (rc) return rc;
    if (lowest[1] < m->size) /* a stop, not a failure: every rank exits as stopped (common/stop.h) */
        return DFM_FAIL(DFM_ESTOPPED, "rank %d was stopped by a signal (its message says what is kept); this rank stops "
                        "too. HINT: run the same command again to resume", lowest[1]);
    return DFM_FAIL(DFM_EMPI, "rank %d failed (its message is above); this rank stops too", lowest[0]);
}

int dfm_mpi_exscan_u64(const dfm_mpi *m, uint64_t mine, uint64_t *before, uint64_t *total) {
    uint64_t b = 0, t = 0;
    DFM_TRY(DFM_MPI_CHECK(MPI_Exscan(&mine, &b, 1, MPI_UINT64_T, MPI_SUM, m->comm)));
    if (m->rank == 0) b = 0; /* MPI_Exscan leaves rank 0's buffer undefined */
    DFM_TRY(DFM_MPI_CHECK(MPI_Allreduce(&mine, &t, 1, MPI_UINT64_T, MPI_SUM, m->comm)));
    if (before) *before = b;
    if (total) *total = t;
    return DFM_OK;
}

int dfm_mpi_local_rank(const dfm_mpi *m) {
    MPI_Comm node;
    int r = 0;
    if (MPI_Comm_split_type(m->comm, MPI_COMM_TYPE_SHARED, m->rank, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        MPI_Comm_rank(node, &r);
        MPI_Comm_free(&node);
    }
    return r;
}

int dfm_gpu_for_rank(int local_rank, int n_visible, int requested) {
    if (requested >= 0) return requested;
    if (n_visible <= 0) return -1;
    return (local_rank > 0 ? local_rank : 0) % n_visible;
}
