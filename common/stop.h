/* stop.h — a clean stop on SIGTERM and SIGUSR1: preemption, a job's time limit, scancel, scontrol requeue.
 *
 * dfm_stop_install() (in main, before any work) turns both signals from "die now" into a request: the
 * handler only records the first signal. Long loops poll dfm_stop_check() at a point where stopping
 * leaves nothing half-written (a finished block; or an abandoned one whose temporary file is removed)
 * and, when a stop was asked for, return DFM_ESTOPPED up to main, which prints the message and exits
 * with DFM_EXIT_STOPPED. dfm_mpi_agree() passes a stop on: the other ranks get DFM_ESTOPPED too, so
 * every rank exits with the same status. The run lock goes with the process (common/runlock.h).
 *
 * A second signal changes nothing (Slurm and srun may both deliver SIGTERM); SIGKILL still kills, and
 * every stage survives that as well (files are renamed when complete).
 */
#ifndef DFM_STOP_H
#define DFM_STOP_H

/* The exit status of a program that stopped on request after saving its work: 75 (EX_TEMPFAIL, "try
 * again"). jobs/dfm-train.sbatch requeues the job on it. */
#define DFM_EXIT_STOPPED 75

/* Catch SIGTERM and SIGUSR1 (SA_RESTART: no system call fails with EINTR). Idempotent. */
void dfm_stop_install(void);

/* The first signal received since dfm_stop_install (SIGTERM or SIGUSR1), else 0. Async-signal-safe
 * to read from any thread. */
int dfm_stop_signal(void);

/* DFM_OK when no stop was asked for; else DFM_ESTOPPED with the message "stopped by SIGNAME <where>.
 * HINT: run the same command again to resume". where is a printf format naming the point and what is
 * kept, e.g. "before block %llu (the finished blocks are kept)". */
int dfm_stop_check(const char *where_fmt, ...) __attribute__((format(printf, 1, 2)));

/* For tests: forget a received signal. */
void dfm_stop_reset(void);

#endif
