/* mpiutil.h — MPI set-up and the collective error rule.
 *
 * Every stage is an MPI program; run without mpirun it is a single rank (MPI singleton).
 * The rule that keeps ranks from hanging when one fails: after each phase that can fail locally,
 * all ranks call dfm_mpi_agree(rc); it returns DFM_OK only if every rank succeeded, otherwise
 * the failing rank keeps its own code and message and the others get DFM_EMPI naming the lowest
 * failing rank.
 */
#ifndef DFM_MPIUTIL_H
#define DFM_MPIUTIL_H

#include <mpi.h>
#include <stdint.h>

typedef struct {
    int rank, size;
    MPI_Comm comm;
} dfm_mpi;

/* MPI_Init (if not yet initialised), errors returned rather than aborting, log rank prefix set. */
int dfm_mpi_init(int *argc, char ***argv, dfm_mpi *m);
/* MPI_Finalize, unless a driver holds MPI open (see dfm_mpi_hold). Stages call it when done. */
void dfm_mpi_finalize(void);
/* hold = 1: dfm_mpi_finalize() does nothing until hold = 0 (dfm build chains stages in one process). */
void dfm_mpi_hold(int hold);

/* Collective: combine every rank's rc (see above). */
int dfm_mpi_agree(const dfm_mpi *m, int rc);

/* Check an MPI return code; on failure record DFM_EMPI with the MPI error string. */
int dfm_mpi_check_at(int mpi_rc, const char *what, const char *file, int line);
#define DFM_MPI_CHECK(call) dfm_mpi_check_at((call), #call, __FILE__, __LINE__)

/* Exclusive prefix sum and total of a uint64 over ranks (collective). */
int dfm_mpi_exscan_u64(const dfm_mpi *m, uint64_t mine, uint64_t *before, uint64_t *total);

#endif
