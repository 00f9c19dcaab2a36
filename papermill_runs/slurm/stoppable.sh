# shellcheck shell=bash
# Sourced by the SLURM job scripts (run_notebooks.sbatch, the grid array tasks `cosearch grid --slurm`
# writes). run_stoppable JOB COMMAND [ARGS...] runs COMMAND in the background so the batch shell can
# pass signals on: SIGUSR1 (#SBATCH --signal=B:USR1@<s>, before the time limit) and SIGTERM
# (preemption, scancel) reach cosearch, which finishes its training step, writes a checkpoint and
# exits 75. After SIGUSR1 the job JOB is requeued and resumes from that checkpoint; after SIGTERM it
# is not (SLURM requeues a preempted --requeue job itself; a cancelled one stays cancelled).
# Returns COMMAND's exit status.
run_stoppable() {
  local target="$1"
  shift
  "$@" &
  local child=$! status=0
  requeue=0
  trap 'trapped=1; requeue=1; kill -USR1 "$child" 2>/dev/null || true' USR1
  trap 'trapped=1; kill -TERM "$child" 2>/dev/null || true' TERM
  while :; do  # a trapped signal cuts `wait` short (status > 128): wait again for the real exit status
    trapped=0
    wait "$child" && status=0 || status=$?
    if [ "$trapped" -eq 0 ] || [ "$status" -le 128 ]; then break; fi
  done
  if [ "$status" -eq 75 ] && [ "$requeue" -eq 1 ]; then
    echo "[cosearch] stopped before the time limit: requeueing job $target"
    scontrol requeue "$target"
  fi
  return "$status"
}
