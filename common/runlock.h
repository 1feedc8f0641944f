/* runlock.h — one writer per run directory.
 *
 * A writing stage (every stage's begin, `dfm build` before its first stage, and `dfm audit`) takes an exclusive
 * flock(2) on RUN/.lock on rank 0 and holds it for the rest of the process: the lock goes when the
 * process exits or dies, so a killed writer never leaves a lock that blocks the next one. The file
 * also names its holder ("host H pid P command C since T", then "(Slurm job J, node N)" in a Slurm
 * job) for the refusal message of a second writer; that text is informative only, and a holder line
 * left behind by a dead process is simply overwritten by the next writer that gets the flock.
 *
 * Readers (verify, inspect, the C and Python readers, dfm-train) take no lock: they read only
 * stages the manifest records as complete, and a stage is "running" while its writer holds the lock.
 *
 * Where flock works (schemas/manifest.md): local file systems; NFSv4 (Linux maps flock onto a POSIX
 * byte-range lock, held across clients); Lustre only when mounted with -o flock (with -o localflock
 * the lock is per node, without either option flock fails). Where it fails, the writer is refused
 * with that hint; DFM_NO_RUN_LOCK=1 runs without the lock (then one writer is the user's business).
 */
#ifndef DFM_RUNLOCK_H
#define DFM_RUNLOCK_H

#include <stddef.h>

/* Take the run lock of run_dir (created if missing) for the rest of the process. Taking it again
 * in the same process (e.g. `dfm build` then each stage) is a no-op. Returns DFM_OK; DFM_ESTATE when
 * another process holds it, naming the holder; DFM_EIO when the file cannot be made or the file
 * system refuses flock, with the hint. Call on the writing rank (rank 0) only. */
int dfm_runlock_take(const char *run_dir);

/* For readers, which never take the lock: 1 and the holder line ("host H pid P command C since T ...",
 * without its newline) in buf when RUN/.lock names a writer, else 0. The line of a writer that died
 * stays until the next writer: a hint for messages, not a proof that a writer runs. */
int dfm_runlock_holder(const char *run_dir, char *buf, size_t n);

/* 1 if this process holds the lock of run_dir, else 0. */
int dfm_runlock_held(const char *run_dir);

#endif
