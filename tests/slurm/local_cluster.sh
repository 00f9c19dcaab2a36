#!/usr/bin/env bash
# make test-slurm: submit a grid to a real SLURM scheduler and check what comes back.
#
# Brings up a one-node SLURM cluster on this machine from Debian's packages (munge, MariaDB,
# slurmdbd for `sacct`, slurmctld, slurmd; all on localhost, no systemd needed), submits the grid
# tests/slurm/ci_grid.yaml on the `ci` profile with `cosearch grid --slurm` (an array job, one task
# per cell, and an aggregation job that waits for it with --dependency=afterok), waits, prints the
# tasks' states from `sacct`, and checks that every cell and the aggregation left their executed
# notebooks and ok run records. Needs root and apt (installs the packages when they are missing).
#
# Then a second grid (tests/slurm/ci_requeue_grid.yaml: one notebook-03 cell) is sent SIGUSR1 while it
# trains (`scancel --signal=USR1 --batch`, what --signal does before a time limit): the task must
# checkpoint, exit 75, requeue itself, and the requeued run must finish from that checkpoint.
#
# Last, data-parallel training as a cluster runs it: `cosearch slurm train` submits a retrieval-server
# job and, after it, a 2-task srun job (one node, gloo) of the ci training (2 questions per step);
# its step records and adapters must equal those of one process (`cosearch train`). The node declares
# twice its cores (SlurmdParameters=config_overrides) so that the mostly idle server and the two
# ranks are scheduled at once.
#
# The `timelimit` part (not in the default run: ~45 min alone): `cosearch slurm train --force` of a ci
# variant whose step outlasts its 6-minute time limit. Each job gets through one stage, is stopped at
# the stage boundary by the plan's warning (or requeued at TIMEOUT), requeues, and the run ends with
# records and adapters identical to one uninterrupted process (issue 50).
#
# The `paper` part (not in the default run: ~15 min, and it needs `make install-vllm`): the paper
# profile's miniature as the cluster path writes it, `cosearch slurm train --profile paper_mini
# --nodes 1 --gpus-per-node 2`. The node declares 2 GPUs on two stand-in device files (no driver,
# no CUDA): the jobs ask for `--gres=gpu:2` as on a GPU cluster and get the CPU, where paper_mini's
# vLLM engines run. The data is the world exported in the paper's formats
# and fetched through the hub stand-in, as in `make test-paper`; a profile extending paper_mini
# gives the jobs this machine's CPUs and memory (the slurm section's only change).
#
#   tests/slurm/local_cluster.sh            # the whole test (what `make test-slurm` runs)
#   tests/slurm/local_cluster.sh --parts data-parallel    # some of: grid, requeue, data-parallel, timelimit, paper
#   tests/slurm/local_cluster.sh --stop     # stop the daemons it started
#
# Runs go to $COSEARCH_RUNS (default: a fresh folder under /tmp), so the repository is not touched.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="$ROOT/.venv/bin"
HOST="$(hostname -s)"
GRID="$ROOT/tests/slurm/ci_grid.yaml"
PROFILE=ci
TIMEOUT_S="${TIMEOUT_S:-1800}"

stop() {
  pkill -x slurmd 2>/dev/null || true
  pkill -x slurmctld 2>/dev/null || true
  pkill -x slurmdbd 2>/dev/null || true
  sleep 1
}
if [ "${1:-}" = "--stop" ]; then stop; exit 0; fi
PARTS="grid,requeue,data-parallel"
if [ "${1:-}" = "--parts" ]; then
  PARTS="${2:?--parts takes a comma-separated list of grid, requeue, data-parallel, timelimit, paper}"
  for part in ${PARTS//,/ }; do
    case "$part" in grid|requeue|data-parallel|timelimit|paper) ;; *) echo "unknown part '$part': grid, requeue, data-parallel, timelimit, paper"; exit 2 ;; esac
  done
fi
want() { [[ ",$PARTS," == *",$1,"* ]]; }

[ "$(id -u)" = 0 ] || { echo "test-slurm needs root (it starts the SLURM daemons)"; exit 2; }
[ -x "$BIN/cosearch" ] || { echo "no $BIN/cosearch: run 'make install' first"; exit 2; }
if ! command -v slurmctld >/dev/null || ! command -v slurmdbd >/dev/null || ! command -v mariadbd >/dev/null; then
  echo "[test-slurm] installing slurm-wlm, slurmdbd, munge, mariadb-server with apt ..."
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurm-wlm slurmdbd munge mariadb-server >/dev/null
fi

T0=$(date +%s)
CPUS=$(nproc)
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge /run/mysqld
chown munge:munge /run/munge 2>/dev/null || true
chown mysql:mysql /run/mysqld 2>/dev/null || true

# --- munge: authentication between the daemons and the commands
[ -s /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged
munge -n | unmunge >/dev/null

# --- MariaDB and slurmdbd: the accounting database `sacct` reads
if ! pgrep -x mariadbd >/dev/null; then
  [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql >/dev/null
  (mariadbd-safe --user=mysql >/dev/null 2>&1 &)
  for _ in $(seq 60); do mariadb -e "select 1" >/dev/null 2>&1 && break; sleep 1; done
fi
mariadb -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
cat > /etc/slurm/slurmdbd.conf <<EOF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
PidFile=/run/slurmdbd.pid
LogFile=/var/log/slurm/slurmdbd.log
EOF
chmod 600 /etc/slurm/slurmdbd.conf

cat > /etc/slurm/slurm.conf <<EOF
ClusterName=cosearch
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MpiDefault=none
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageTRES=gres/gpu
JobCompType=jobcomp/none
SlurmdParameters=config_overrides
GresTypes=gpu
NodeName=$HOST CPUs=$(( CPUS * 2 )) RealMemory=$MEM_MB Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF

# two GPUs that are not there: slurmd counts a GPU per device file (a count alone registers 0 and
# drains the node), so two character devices with NVIDIA's major number stand in for /dev/nvidia0-1,
# outside /dev; jobs that ask for --gres=gpu:N are scheduled, and run on the CPU
for i in 0 1; do [ -e "/run/cosearch-gpu$i" ] || mknod -m 666 "/run/cosearch-gpu$i" c 195 "$i"; done
printf 'AutoDetect=off\nNodeName=%s Name=gpu File=/run/cosearch-gpu[0-1]\n' "$HOST" > /etc/slurm/gres.conf

stop
slurmdbd
for _ in $(seq 30); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 1; done
sacctmgr -i add cluster cosearch >/dev/null 2>&1 || true
slurmctld -c
slurmd
for _ in $(seq 60); do sinfo -h -o %T 2>/dev/null | grep -q idle && break; sleep 1; done
sinfo
echo "[test-slurm] cluster up in $(( $(date +%s) - T0 )) s"

export COSEARCH_RUNS="${COSEARCH_RUNS:-$(mktemp -d /tmp/cosearch-slurm-XXXX)}"
cd "$ROOT"

# --- the grid: an array job, then the aggregation (afterok)
if want grid; then
T1=$(date +%s)
OUT=$("$BIN/cosearch" grid "$GRID" --profile "$PROFILE" --slurm)
echo "$OUT"
ARRAY=$(echo "$OUT" | "$BIN/python" -c "import json, sys; print(json.load(sys.stdin)['array_job'])")
AGG=$(echo "$OUT" | "$BIN/python" -c "import json, sys; print(json.load(sys.stdin)['aggregate_job'])")
while squeue -h -j "$ARRAY,$AGG" 2>/dev/null | grep -q .; do
  if squeue -h -j "$AGG" -o %r 2>/dev/null | grep -q DependencyNeverSatisfied; then
    echo "[test-slurm] a task failed, so the aggregation can never start: cancelled"; scancel "$AGG"; break
  fi
  if [ $(( $(date +%s) - T1 )) -gt "$TIMEOUT_S" ]; then echo "[test-slurm] timed out after $TIMEOUT_S s"; scancel "$ARRAY" "$AGG"; exit 1; fi
  sleep 5
done
WALL=$(( $(date +%s) - T1 ))
sleep 3  # slurmdbd receives the last records
echo "[test-slurm] the array's tasks and the aggregation job, from sacct:"
sacct -X -j "$ARRAY,$AGG" --format=JobID%-14,JobName%-28,State,ExitCode,Elapsed
STATES=$(sacct -X -n -P -j "$ARRAY,$AGG" --format=State | sort | uniq -c)

# --- what came back
"$BIN/python" - "$GRID" "$PROFILE" "$ARRAY" "$AGG" <<'PY'
import json, subprocess, sys
from pathlib import Path
from cosearch_lib.config import load_profile
from cosearch_lib.paths import select_notebooks
from cosearch_lib.records.grid_cells import cell_dir, cell_status, load_grid
from cosearch_lib.paths import run_dir

grid, profile, array, agg = load_grid(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
base = load_profile(profile)
states = subprocess.run(["sacct", "-X", "-n", "-P", "-j", f"{array},{agg}", "--format=JobID,State"],
                        capture_output=True, text=True, check=True).stdout.split()
jobs = dict(line.split("|") for line in states)
tasks = {k: v for k, v in jobs.items() if k.startswith(f"{array}_")}
problems = []
if len(tasks) != len(grid.cells) or set(tasks.values()) != {"COMPLETED"}:
    problems.append(f"array tasks: {tasks} (want {len(grid.cells)} COMPLETED)")
if jobs.get(agg) != "COMPLETED":
    problems.append(f"aggregation job {agg}: {jobs.get(agg)}")
for cell in grid.cells:
    folder = cell_dir(base, grid, cell)
    status = cell_status(base, grid, cell)
    books = [folder / b.name for b in select_notebooks(list(grid.notebooks))]
    if status != "done" or not all(b.exists() for b in books):
        problems.append(f"cell {cell.name}: status {status}, notebooks {[b.name for b in books if b.exists()]}")
    logs = sorted((run_dir(f"{base.profile}/{grid.name}") / "slurm").glob(f"cell-{grid.cells.index(cell)}-*.log"))
    if not logs:
        problems.append(f"cell {cell.name}: no task log")
for book in select_notebooks(list(grid.aggregate)):
    record = run_dir(base.profile) / f"{book.stem}.run.json"
    if not record.exists() or json.loads(record.read_text()).get("status") != "ok":
        problems.append(f"aggregation: no ok run record {record}")
print("\n".join(problems) if problems else f"[test-slurm] all {len(grid.cells)} cells done, aggregation done")
sys.exit(1 if problems else 0)
PY
echo "[test-slurm] states: $(echo $STATES); grid wall time ${WALL} s; total $(( $(date +%s) - T0 )) s; runs in $COSEARCH_RUNS"

fi

# --- a time-limit warning in the middle of training: checkpoint, requeue, resume
if want requeue; then
REQUEUE_GRID="$ROOT/tests/slurm/ci_requeue_grid.yaml"
T2=$(date +%s)
OUT=$("$BIN/cosearch" grid "$REQUEUE_GRID" --profile "$PROFILE" --slurm)
ARRAY=$(echo "$OUT" | "$BIN/python" -c "import json, sys; print(json.load(sys.stdin)['array_job'])")
CELL="$COSEARCH_RUNS/$PROFILE/slurm-requeue/cosearch"
FIRST="$CELL/training/cosearch/checkpoints/step_000001"
until [ -d "$FIRST" ]; do
  [ $(( $(date +%s) - T2 )) -gt "$TIMEOUT_S" ] && { echo "[test-slurm] no first checkpoint in $TIMEOUT_S s"; scancel "$ARRAY"; exit 1; }
  sleep 0.2
done
scancel --signal=USR1 --batch "${ARRAY}_0"
echo "[test-slurm] SIGUSR1 sent to task ${ARRAY}_0 after its first checkpoint"
while squeue -h -j "$ARRAY" 2>/dev/null | grep -q .; do
  [ $(( $(date +%s) - T2 )) -gt "$TIMEOUT_S" ] && { echo "[test-slurm] requeue test timed out"; scancel "$ARRAY"; exit 1; }
  sleep 3
done
sleep 3
sacct -j "$ARRAY" --duplicates -X --format=JobID%-14,JobName%-28,State,ExitCode,Elapsed
"$BIN/python" - "$CELL" "$ARRAY" <<'PY'
import subprocess, sys
from pathlib import Path
import pandas as pd
cell, array = Path(sys.argv[1]), sys.argv[2]
states = subprocess.run(["sacct", "-j", array, "--duplicates", "-X", "-n", "-P", "--format=State"],
                        capture_output=True, text=True, check=True).stdout.split()
steps = pd.read_csv(cell / "training" / "cosearch" / "steps.csv")
logs = "".join(p.read_text() for p in sorted((cell.parent / "slurm").glob("cell-0-*.log")))
problems = []
if "REQUEUED" not in states or states[-1] != "COMPLETED":
    problems.append(f"task states {states}: want a REQUEUED run, then COMPLETED")
if steps["step"].tolist() != [0, 1, 2, 3]:
    problems.append(f"steps.csv holds steps {steps['step'].tolist()}")
if "stopped on SIGUSR1" not in logs or "requeueing job" not in logs:
    problems.append("the task log does not show the stop and the requeue")
import json, re
book = json.loads((cell / "03_joint_grpo_training.ipynb").read_text())
printed = "".join("".join(o.get("text", "")) for c in book["cells"] for o in c.get("outputs", []))
resumed = re.search(r"resumed from checkpoint \S+step_(\d+): (\d+) of 4 steps done", printed)
if not resumed or int(resumed.group(2)) not in (1, 2, 3):
    problems.append(f"the requeued run did not resume from a checkpoint: {resumed and resumed.group(0)}")
print("\n".join(problems) if problems else
      f"[test-slurm] requeue: states {states}; {resumed.group(0)}; steps.csv holds steps {steps['step'].tolist()}")
sys.exit(1 if problems else 0)
PY
echo "[test-slurm] requeue test: $(( $(date +%s) - T2 )) s"

fi

# The reference a SLURM training run is checked against: profile $1 ($COSEARCH_RUNS/$1.yaml) trained in
# one process on $3 threads for method $2; a finished run (its train.run.json) is reused.
one_process_reference() {
  local t0; t0=$(date +%s)
  if [ -s "$COSEARCH_RUNS/$1/train.run.json" ]; then  # written when that training finished
    echo "[test-slurm] one-process reference: reusing the finished run in $COSEARCH_RUNS/$1"
  else
    OMP_NUM_THREADS=$3 "$BIN/cosearch" train --profile "$COSEARCH_RUNS/$1.yaml" --methods "$2" --quiet >/dev/null
    echo "[test-slurm] one-process reference: $(( $(date +%s) - t0 )) s"
  fi
}

# `cosearch slurm train` of profile file $2 (method $3, one CPU node, the rest of the arguments added)
# from an empty run directory, waited for up to twice the test's timeout; sets SERVER and TRAIN.
slurm_train_and_wait() {
  local what=$1 profile=$2 method=$3 t0 out; shift 3
  rm -rf "$COSEARCH_RUNS/$(basename "$profile" .yaml)"
  t0=$(date +%s)
  out=$("$BIN/cosearch" slurm train --profile "$profile" --methods "$method" --nodes 1 --gpus-per-node 0 --no-evaluate "$@")
  SERVER=$(echo "$out" | "$BIN/python" -c "import json, sys; print(json.load(sys.stdin)['retriever_job'])")
  TRAIN=$(echo "$out" | "$BIN/python" -c "import json, sys; print(json.load(sys.stdin)['train_job'])")
  while squeue -h -j "$TRAIN" 2>/dev/null | grep -q .; do
    [ $(( $(date +%s) - t0 )) -gt $(( 2 * TIMEOUT_S )) ] && { echo "[test-slurm] $what job timed out after $(( 2 * TIMEOUT_S )) s"; scancel "$TRAIN" "$SERVER"; exit 1; }
    sleep 3
  done
  sleep 3
}

# --- data-parallel training: a retrieval-server job, then 2 srun tasks (gloo), against one process
if want data-parallel; then
T3=$(date +%s)
DP="$COSEARCH_RUNS/ci_dp.yaml"
# the server outlives a training job that reaches its time-limit warning and requeues (as on a busy machine)
printf 'extends: ci\nprofile: ci_dp\ntraining:\n  questions_per_step: 2\nslurm:\n  cpus_per_task: 1\n  mem: 12G\n  retriever_time: "01:30:00"\n' > "$DP"
printf 'extends: %s\nprofile: ci_dp_one\n' "$DP" > "$COSEARCH_RUNS/ci_dp_one.yaml"
one_process_reference ci_dp_one cosearch 1
# the server and 2 srun tasks; twice the limit: a job that reaches ci's 30-min limit stops at its warning, requeues and resumes
slurm_train_and_wait data-parallel "$DP" cosearch --tasks-per-node 2
sacct -j "$SERVER,$TRAIN" --format=JobID%-14,JobName%-28,State,ExitCode,Elapsed,NTasks
PYTHONPATH="$ROOT" "$BIN/python" - "$COSEARCH_RUNS" "$SERVER" "$TRAIN" <<'PY'
import json, subprocess, sys
from pathlib import Path
import pandas as pd
from tests.test_data_parallel import _adapters, assert_same_adapters_close, assert_same_records, same_update, update_agreement
runs, server, train = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
states = dict(line.split("|") for line in subprocess.run(
    ["sacct", "-X", "-n", "-P", "-j", f"{server},{train}", "--format=JobID,State"],
    capture_output=True, text=True, check=True).stdout.splitlines())  # "CANCELLED by 0" has a space
one, two = runs / "ci_dp_one", runs / "ci_dp"
problems = []
if states.get(train) != "COMPLETED" or not states.get(server, "").startswith("CANCELLED"):
    problems.append(f"job states {states}: want the training COMPLETED and the server CANCELLED by it")
record = json.loads((two / "train.run.json").read_text()) if (two / "train.run.json").exists() else {}
if (record.get("world_size"), record.get("launcher")) != (2, "srun") or not record.get("retriever", "").startswith("http://"):
    problems.append(f"train.run.json: {record and {k: record[k] for k in ('world_size', 'launcher', 'retriever')}}")
if not problems:
    a, b = (pd.read_csv(r / "training" / "cosearch" / "steps.csv") for r in (one, two))
    assert_same_records(a.to_dict("records"), b.to_dict("records"))
    end_one, end_two = (_adapters(r / "training" / "cosearch") for r in (one, two))
    assert_same_adapters_close(end_one, end_two)
    # the GRPO update (end - warm start) of each role: it moved, and 2 ranks made the same one
    updates = {}
    warm = json.loads((two / "warmstart.run.json").read_text())["adapters"]
    for role, (moved, rel, _) in update_agreement(warm, end_one, end_two).items():
        updates[role] = f"{moved:.1%} of entries moved, relative difference {rel:.1e}"
        if not same_update(moved, rel):
            problems.append(f"{role} update: {updates[role]} (want most entries moved and a difference under 1e-2)")
print("\n".join(problems) if problems else
      f"[test-slurm] data parallel: 2 srun ranks through the retrieval server = one process ({len(a)} steps, "
      f"records equal, adapters to 1e-5; the update of {'; of '.join(f'{r}: {u}' for r, u in updates.items())})")
sys.exit(1 if problems else 0)
PY
echo "[test-slurm] data-parallel test: $(( $(date +%s) - T3 )) s"
fi
# --- a time limit shorter than one step: each job gets through a stage, stops at its boundary, requeues
if want timelimit; then
T7=$(date +%s)
TL="$COSEARCH_RUNS/ci_timelimit.yaml"
# ci with 8 questions x G = 4 per step and no validation: a step (~2.5 min rollout + ~4 min update, alone
# on 2 cores) outlasts the 6-minute limit, while each stage with the job's start (~1 min: the warm start
# from the cache, the server's URL, the models) fits in it. A stage must be longer than the start for
# such a limit to exist: at 4 questions (~70 s rollout, ~120 s update) under 3 minutes the update and
# the start overran the limit (docs/LOG.md, tenth session). The plan refuses such a job (the limit holds
# no step): --force submits it anyway, as a user would to try.
printf 'extends: ci\nprofile: ci_timelimit\ntraining:\n  questions_per_step: 8\n  eval_every: 0\nslurm:\n  time: "00:06:00"\n  max_requeues: 12\n  retriever_time: "02:00:00"\n' > "$TL"
printf 'extends: %s\nprofile: ci_timelimit_one\n' "$TL" > "$COSEARCH_RUNS/ci_timelimit_one.yaml"
one_process_reference ci_timelimit_one search_r1 2
"$BIN/cosearch" plan --profile "$TL" --nodes 1 --gpus-per-node 0 --methods search_r1 | tail -4 || true
slurm_train_and_wait time-limit "$TL" search_r1 --tasks-per-node 1 --force
sacct -j "$TRAIN" --duplicates -X --format=JobID%-14,JobName%-28,State,ExitCode,Start,End,Elapsed,Timelimit
PYTHONPATH="$ROOT" "$BIN/python" - "$COSEARCH_RUNS" "$TRAIN" <<'PY'
import subprocess, sys
from pathlib import Path
import pandas as pd
from tests.test_data_parallel import _adapters, assert_same_records
runs, train = Path(sys.argv[1]), sys.argv[2]
states = subprocess.run(["sacct", "-j", train, "--duplicates", "-X", "-n", "-P", "--format=State"],
                        capture_output=True, text=True, check=True).stdout.split()
one, cut = runs / "ci_timelimit_one", runs / "ci_timelimit"
logs = "".join(p.read_text() for p in sorted((cut / "slurm").glob("*.log")))
problems = []
if len(states) < 3 or states[-1] != "COMPLETED" or not set(states[:-1]) <= {"REQUEUED", "TIMEOUT", "PREEMPTED"}:
    problems.append(f"job states {states}: want several requeued runs, then COMPLETED")
if "after the rollout of step" not in logs:
    problems.append("no job log shows a stop at a stage boundary (after the rollout of a step)")
a, b = (pd.read_csv(r / "training" / "search_r1" / "steps.csv") for r in (one, cut))
if b["step"].tolist() != [0, 1]:
    problems.append(f"steps.csv holds steps {b['step'].tolist()}")
else:
    assert_same_records(a.to_dict("records"), b.to_dict("records"))
    end_one, end_cut = (_adapters(r / "training" / "search_r1") for r in (one, cut))
    differ = [name for name, t in end_one.items() if name not in end_cut or not bool((t == end_cut[name]).all())]
    if differ or set(end_cut) != set(end_one):
        problems.append(f"adapters differ from the uninterrupted run's: {differ[:3]} ({len(differ)} of {len(end_one)} tensors)")
print("\n".join(problems) if problems else
      f"[test-slurm] time limit 6 min < one step: {len(states) - 1} requeues ({', '.join(states)}); "
      f"steps.csv holds steps {b['step'].tolist()}, records and adapters identical to one uninterrupted process")
sys.exit(1 if problems else 0)
PY
echo "[test-slurm] time-limit test: $(( $(date +%s) - T7 )) s"
fi
# --- the paper profile's miniature as the cluster path writes it: cosearch slurm train, 2 "GPUs"
if want paper; then
T5=$(date +%s)
[ -x "$BIN/vllm" ] || "$BIN/python" -c "import vllm" 2>/dev/null || { echo "[test-slurm] the paper part needs vLLM: make install-vllm"; exit 2; }
HUB="$COSEARCH_RUNS/hub"
PYTHONPATH="$ROOT" "$BIN/python" - "$HUB" <<'PY'
import os, subprocess, sys
from pathlib import Path
from tests.hub_standin import HubStandin
hub = Path(sys.argv[1])
cosearch = str(Path(sys.executable).parent / "cosearch")
run = lambda *a, **env: subprocess.run([cosearch, *a], check=True, env={**os.environ, **env})
run("export-world", "--profile", "paper_mini", "--hub", str(hub), "--quiet")
with HubStandin(hub) as standin:
    run("download", "all", "--profile", "paper_mini", HF_ENDPOINT=standin.url)
run("prepare-relevance", "--profile", "paper_mini", "--quiet")
PY
PM="$COSEARCH_RUNS/paper_mini_slurm.yaml"
printf 'extends: paper_mini\nprofile: paper_mini_slurm\nslurm:\n  cpus_per_task: 1\n  mem: 10G\n  time: "02:00:00"\n  retriever_time: "03:00:00"\n' > "$PM"
rm -rf "$COSEARCH_RUNS/paper_mini_slurm"
T6=$(date +%s)
OUT=$("$BIN/cosearch" slurm train --profile "$PM" --methods cosearch --nodes 1 --gpus-per-node 2)
SERVER=$(echo "$OUT" | "$BIN/python" -c "import json, sys; print(json.load(sys.stdin)['retriever_job'])")
TRAIN=$(echo "$OUT" | "$BIN/python" -c "import json, sys; print(json.load(sys.stdin)['train_job'])")
EVAL=$(echo "$OUT" | "$BIN/python" -c "import json, sys; print(json.load(sys.stdin)['evaluate_job'])")
while squeue -h -j "$TRAIN,$EVAL" 2>/dev/null | grep -q .; do
  [ $(( $(date +%s) - T6 )) -gt $(( 2 * TIMEOUT_S )) ] && { echo "[test-slurm] paper jobs timed out after $(( 2 * TIMEOUT_S )) s"; scancel "$TRAIN" "$SERVER" "$EVAL"; exit 1; }
  sleep 5
done
sleep 3
sacct -j "$SERVER,$TRAIN,$EVAL" --format=JobID%-14,JobName%-34,State,ExitCode,Elapsed,NTasks,AllocTRES%-44
PYTHONPATH="$ROOT" "$BIN/python" - "$COSEARCH_RUNS" "$SERVER" "$TRAIN" "$EVAL" <<'PY'
import json, subprocess, sys
from pathlib import Path
import pandas as pd
runs, server, train, evaluate = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
states = dict(line.split("|") for line in subprocess.run(
    ["sacct", "-X", "-n", "-P", "-j", f"{server},{train},{evaluate}", "--format=JobID,State"],
    capture_output=True, text=True, check=True).stdout.splitlines())
tres = subprocess.run(["sacct", "-X", "-n", "-P", "-j", train, "--format=AllocTRES"], capture_output=True, text=True).stdout
out = runs / "paper_mini_slurm"
problems = []
if states.get(train) != "COMPLETED" or not states.get(server, "").startswith("CANCELLED"):
    problems.append(f"job states {states}: want the training COMPLETED and the server CANCELLED by it")
if states.get(evaluate) != "COMPLETED" or not (out / "03_joint_grpo_training.ipynb").is_file():
    problems.append(f"notebook 03's job {evaluate}: {states.get(evaluate)}, executed notebook missing or job failed")
if "gres/gpu=2" not in tres:
    problems.append(f"the training job's allocation names no 2 GPUs: {tres.strip()}")
for step in ("train", "evaluate"):
    record = json.loads((out / f"{step}.run.json").read_text()) if (out / f"{step}.run.json").exists() else {}
    if (record.get("world_size"), record.get("launcher")) != (2, "srun") or \
            (step == "train" and not str(record.get("retriever", "")).startswith("http://")):
        problems.append(f"{step}.run.json: {record and {k: record.get(k) for k in ('world_size', 'launcher', 'retriever')}}")
if not problems:
    steps = pd.read_csv(out / "training" / "cosearch" / "steps.csv")
    parts = sorted(p.name for p in (out / "evaluation").glob("*/part-*.parquet"))
    if steps["rollout/n_trajectories"].tolist() != [16] or not (steps["loss/agent_n_forwarded"] > 0).all():
        problems.append(f"steps.csv: {steps[['step', 'rollout/n_trajectories', 'loss/agent_n_forwarded']].to_dict('records')}")
    if {p.split("-")[1] for p in parts} != {"r0", "r1"}:
        problems.append(f"evaluation parts: {parts}")
print("\n".join(problems) if problems else
      f"[test-slurm] paper_mini: cosearch slurm train on 1 node x 2 GPUs (gres) -> 2 srun ranks through the retrieval "
      f"server, 1 step of {steps['rollout/n_trajectories'].iloc[0]} trajectories (G = 8), validation F1 {steps['val/f1'].iloc[0]:.3f}, "
      f"then cosearch evaluate on the same ranks: {len(parts)} parts from both; notebook 03's job read them")
sys.exit(1 if problems else 0)
PY
echo "[test-slurm] paper test: $(( $(date +%s) - T5 )) s"
fi
echo "[test-slurm] parts $PARTS passed in $(( $(date +%s) - T0 )) s"
