/* mpiutil.h — MPI set-up and the collective error rule.
 *
 * Every stage is an MPI program; run without mpirun it is a single rank (MPI singleton).
 * The rule that keeps ranks from hanging when one fails: after each phase that can fail locally,
 * all ranks call dfm_mpi_agree(rc); it returns DFM_OK only if every rank succeeded, otherwise
 * the failing rank keeps its own code and message and the others get DFM_EMPI naming the lowest
 * failing rank, or DFM_ESTOPPED when a rank stopped on a signal (common/stop.h).
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

/* This rank's rank among the ranks of its node (those that share memory: MPI_COMM_TYPE_SHARED); 0 when
 * the split fails. Collective: every rank calls it. */
int dfm_mpi_local_rank(const dfm_mpi *m);

/* The GPU a rank uses, of the n_visible its process sees (CUDA_VISIBLE_DEVICES as mpirun or Slurm set
 * it): requested when >= 0 (a --gpu N flag; the caller checks that it exists); else the node-local rank
 * mod n_visible, so that the ranks of a node that all see its G GPUs (mpirun, Slurm's --gres=gpu:G or
 * --gpus-per-node G) spread over them instead of all taking GPU 0, and a rank that sees one GPU
 * (--gpus-per-task 1) takes it; -1 (the CPU) when none is visible. Pure: tests/unit/test_common.c. */
int dfm_gpu_for_rank(int local_rank, int n_visible, int requested);

#endif
