# jobs/job_lib.sh — what the Slurm job scripts share (sourced by dfm-stage.sbatch and dfm-train.sbatch from
# DFM_JOBS_DIR, which jobs/submit.sh and jobs/submit_train.sh set: sbatch runs a copy of the job script, so
# the script cannot find its own folder). The script defines say MESSAGE and the variables each function
# names.

# dfm_wait_old_steps: a requeued job keeps its job id, and its steps get the old step ids again (JOB.0).
# A step launched while the previous incarnation's step is still being torn down on a node fails to launch
# ("StepId=J.0 aborted before step completely launched"). Slurm holds a requeued job back for a while, but a
# restart can come sooner (an admin's StartTime=now, a preemption requeue): so this waits, up to
# DFM_OLD_STEP_WAIT seconds (120), until no numbered step of this job is known to the controller or runs on
# this node. Needs SLURM_JOB_ID.
dfm_wait_old_steps() {
  local t=0 limit=${DFM_OLD_STEP_WAIT:-120}
  while squeue -h -s -j "$SLURM_JOB_ID" -o %i 2>/dev/null | grep -qE "^${SLURM_JOB_ID}\.[0-9]+$" ||
        pgrep -f "slurmstepd: \[${SLURM_JOB_ID}\.[0-9]+\]" >/dev/null 2>&1; do
    [ "$t" = 0 ] && say "a step of this job's previous run is still ending: waiting for it before launching"
    [ "$t" -ge "$limit" ] && { say "the previous run's step is still there after ${limit} s: launching anyway"; return 0; }
    sleep 1; t=$((t + 1))
  done
  return 0
}

# dfm_launch_until_done LAUNCH DONE AGAIN WHAT: runs LAUNCH (a function that runs srun and sets rc to its
# status). A step that fails to launch can leave srun with status 0 (Slurm 22.05: "task 0 launch failed:
# Unspecified error", then exit 0), so status 0 counts only when DONE (a function) says the work is done.
# Otherwise the launch is tried again, DFM_LAUNCH_TRIES times in all (3), after the old step has gone and
# AGAIN (a function, e.g. finding the newest checkpoint) has run; no new try once got_signal is 1. Returns 0
# with rc set (srun's status, for the caller to judge), or 1 when srun said 0 every time and the work is
# not done: the caller must fail the job, never call it done. WHAT names the work in messages.
dfm_launch_until_done() {
  local launch=$1 done=$2 again=$3 what=$4 tries=${DFM_LAUNCH_TRIES:-3} try
  for try in $(seq 1 "$tries"); do
    "$launch"
    [ "$rc" = 0 ] && ! "$done" || return 0
    say "srun exited 0 but $what is not done: the step did not run (see srun's messages above); launch $try of $tries"
    [ "$try" = "$tries" ] || [ "${got_signal:-0}" = 1 ] && return 1
    sleep 5
    dfm_wait_old_steps
    "$again"
  done
  return 1
}
