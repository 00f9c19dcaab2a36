# shellcheck shell=bash
# Sourced by the SLURM job scripts (run_notebooks.sbatch, the grid array tasks `cosearch grid --slurm`
# writes, train.sbatch of `cosearch slurm train`). run_stoppable JOB COMMAND [ARGS...] runs COMMAND in
# the background so the batch shell can pass signals on: SIGUSR1 (#SBATCH --signal=B:USR1@<s>, before
# the time limit; <s> from the plan, `cosearch plan`) and SIGTERM (the time limit itself, preemption,
# scancel) reach cosearch, which stops at the next stage boundary of its training step (the rollouts
# saved, or the step's checkpoint written) and exits 75. The job JOB is requeued:
#   - after SIGUSR1, once cosearch has exited 75;
#   - after SIGTERM at the time limit (TIMEOUT: less than REQUEUE_AT_LIMIT_S seconds left, squeue %L)
#     at once, before SLURM's KillWait ends in SIGKILL: what the stage under way had not saved runs again;
#   - not after SIGTERM with time left: a preempted --requeue job is requeued by SLURM itself
#     (PreemptMode=REQUEUE), and a cancelled one stays cancelled.
# Returns COMMAND's exit status.
REQUEUE_AT_LIMIT_S="${REQUEUE_AT_LIMIT_S:-120}"
# A warning before run_stoppable starts its command (the warm start, the wait for the retrieval server: a
# time limit close to the warning) would kill the batch shell (SIGUSR1's default action). From here on it
# is remembered instead, and the next command starts with COSEARCH_STOP_REQUESTED set: it stops at its
# first boundary (cosearch_lib/stop_signals.py) and the job requeues with that progress kept.
early_stop=""
trap 'early_stop=SIGUSR1' USR1

_seconds_left() {  # squeue's time left of job $1 (%L: [D-]HH:MM:SS, MM:SS, UNLIMITED) in seconds; 999999 if unknown
  local left
  left=$(squeue -h -j "$1" -o %L 2>/dev/null | head -n 1)
  case "$left" in
    ''|UNLIMITED|NOT_SET|INVALID) echo 999999; return ;;
  esac
  echo "$left" | awk -F'[-:]' '{ n = NF; s = $n + 60 * $(n - 1); if (n >= 3) s += 3600 * $(n - 2); if (n >= 4) s += 86400 * $(n - 3); print s }'
}

run_stoppable() {
  local target="$1"
  shift
  requeue=0
  requeued=0
  if [ -n "$early_stop" ]; then
    echo "[cosearch] $early_stop came before the command started: it stops at its first boundary"
    COSEARCH_STOP_REQUESTED="$early_stop" "$@" &
    requeue=1
  else
    "$@" &
  fi
  local child=$! status=0
  trap 'trapped=1; requeue=1; early_stop=SIGUSR1; kill -USR1 "$child" 2>/dev/null || true' USR1
  trap 'trapped=1; kill -TERM "$child" 2>/dev/null || true
        if [ "$requeued" -eq 0 ] && [ "$(_seconds_left "$target")" -le "$REQUEUE_AT_LIMIT_S" ]; then
          echo "[cosearch] SIGTERM at the time limit: requeueing job $target"; requeued=1; scontrol requeue "$target" || true
        fi' TERM
  while :; do  # a trapped signal cuts `wait` short (status > 128): wait again for the real exit status
    trapped=0
    wait "$child" && status=0 || status=$?
    if [ "$trapped" -eq 0 ] || [ "$status" -le 128 ]; then break; fi
  done
  if [ "$status" -eq 75 ] && [ "$requeue" -eq 1 ] && [ "$requeued" -eq 0 ]; then
    echo "[cosearch] stopped before the time limit: requeueing job $target"
    scontrol requeue "$target"
  fi
  return "$status"
}
