/* fault.h — named fault-injection points for the crash-and-resume tests.
 *
 * A stage calls dfm_fault_point("encode:block-written") at places where a crash must be survivable.
 * When the environment has DFM_FAULT=<that name> (and DFM_FAULT_RANK unset or equal to this rank),
 * the process kills itself with SIGKILL right there — the same as a node dying — so tests can check
 * that a re-run resumes without duplicating or dropping records. With DFM_FAULT_SIGNAL=TERM (or USR1)
 * the process sends itself that signal there instead and goes on, so tests can place a clean stop
 * (common/stop.h) at a known point. DFM_FAULT_SIGNAL=STOP stops the process there (SIGSTOP) until the test,
 * having changed a file under it (a truncated input), sends SIGCONT. Costs one getenv when unset.
 *
 * DFM_FAULT_DELAY_MS=N makes every dfm_fault_delay() (one per training step) sleep N ms: a test that must act
 * on a running job (a requeue, a cancel after a checkpoint) holds it open for as long as it needs, on a loaded
 * machine too, without changing a byte of what the job computes.
 *
 * DFM_FAULT_ENOSPC=TEXT makes every atomic write (common/fsutil.h) to a path containing TEXT fail as on
 * a full disk (ENOSPC), for tests where a real small file system cannot be mounted.
 */
#ifndef DFM_FAULT_H
#define DFM_FAULT_H

/* rank: this process's MPI rank (for DFM_FAULT_RANK), or -1 to ask MPI. */
void dfm_fault_point(const char *name, int rank);
/* Sleep DFM_FAULT_DELAY_MS milliseconds (read once); nothing when unset. */
void dfm_fault_delay(void);

#endif
