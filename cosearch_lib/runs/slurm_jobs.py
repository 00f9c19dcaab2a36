"""What every SLURM job of the workbook shares: the ``#SBATCH`` header from a profile's ``slurm``
section, the prelude that activates the environment, ``stoppable.sh`` (stop signals, requeue), the
retrieval-server job and the wait for it, the data-parallel ranks' environment, and ``sbatch``
itself (``runs.grid``'s arrays, ``runs.slurm_training``'s jobs)."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

from cosearch_lib.config import ProfileConfig


class SlurmSubmitError(RuntimeError):
    """sbatch is missing, refused a job, or printed no job id."""


def sbatch_header(job_name: str, cfg: ProfileConfig, *, time_limit: str, gres: str | None, log: str) -> list[str]:
    s = cfg.slurm
    lines = ["#!/usr/bin/env bash", f"#SBATCH --job-name={job_name}"]
    lines += [f"#SBATCH --partition={s.partition}"] if s.partition else []
    lines += [f"#SBATCH --account={s.account}"] if s.account else []
    lines += [f"#SBATCH --gres={gres}"] if gres else []
    lines += [f"#SBATCH --cpus-per-task={s.cpus_per_task}", f"#SBATCH --mem={s.mem}", f"#SBATCH --time={time_limit}",
              f"#SBATCH --output={log}", f"#SBATCH --error={log}"]
    lines += [f"#SBATCH {extra}" for extra in s.extra]
    return lines


SBATCH_PRELUDE = """set -euo pipefail
cd {root}
# the Makefile's .venv, or a conda env named in CONDA_ENV (environment.yml)
if [ -n "${{CONDA_ENV:-}}" ]; then source activate "$CONDA_ENV"; elif [ -x .venv/bin/cosearch ]; then source .venv/bin/activate; fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false"""


#: Sourced by the array tasks: runs the cell so that SLURM's stop signals reach it, requeues after SIGUSR1.
STOPPABLE_SH = "papermill_runs/slurm/stoppable.sh"


def sbatch_job_id(output: str) -> str:
    """The job id of ``sbatch --parsable`` output (``123`` or ``123;cluster``)."""
    first = output.strip().splitlines()[-1] if output.strip() else ""
    job = first.split(";")[0]
    if not job.isdigit():
        raise SlurmSubmitError(f"sbatch did not print a job id: {output!r}")
    return job


def run_sbatch(run: Callable[..., subprocess.CompletedProcess], cmd: list[str], env: Mapping[str, str] | None = None) -> str:
    """``sbatch --parsable`` output of ``cmd``; ``env``: variables added to this environment for it
    (the job gets them with ``--export=ALL``, values with commas and spaces intact)."""
    try:
        done = run(cmd, capture_output=True, text=True, check=False, **({"env": {**os.environ, **env}} if env else {}))
    except FileNotFoundError as err:
        raise SlurmSubmitError(f"{cmd[0]!r} not found: submit from a SLURM login node, or write the scripts only "
                           "(--dry-run)") from err
    if done.returncode != 0:
        raise SlurmSubmitError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


#: How long the training job waits for the retrieval server to answer (it may queue behind others).
RETRIEVER_WAIT_S = 3600

WAIT_FOR_SERVER = """# the retrieval server's URL, once its job has written it and it answers /health
URL_FILE={url_dir}/retriever-$COSEARCH_RETRIEVER_JOB.url
python - "$URL_FILE" {wait_s} "$COSEARCH_RETRIEVER_JOB" <<'PY'
import signal, subprocess, sys, time, urllib.request
from pathlib import Path
signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # a time-limit warning while waiting: stoppable.sh keeps it
url_file, deadline, job = Path(sys.argv[1]), time.monotonic() + float(sys.argv[2]), sys.argv[3]
while time.monotonic() < deadline:
    try:
        urllib.request.urlopen(url_file.read_text().strip() + "/health", timeout=10).read()
        sys.exit(0)
    except (OSError, ValueError):
        state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.strip()
        if state not in ("PENDING", "CONFIGURING", "RUNNING"):
            sys.exit(f"the retrieval server's job {{job}} has ended ({{state or 'gone'}}): submit again "
                     "(cosearch slurm train or cosearch grid --slurm start a new server; training resumes from its checkpoint)")
        time.sleep(5)
sys.exit(f"the retrieval server did not answer within {{sys.argv[2]}} s (URL file {{url_file}})")
PY
RETRIEVER_URL=$(cat "$URL_FILE")"""


#: The lines that make srun's tasks the ranks of one data-parallel job (``rl.data_parallel``).
RANK_ENVIRONMENT = (
    "# each rank's threads: its CPUs, as torchrun's one per rank (srun sets none, and torch would start one",
    "# per core of the node in every rank; paper_mini's rollouts took 399 s under srun, 244 s under torchrun)",
    'export OMP_NUM_THREADS="${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}"',
    "# env:// rendezvous of the ranks (rl.data_parallel): the first node, one port per job",
    'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
    "export MASTER_PORT=$(( 20000 + SLURM_JOB_ID % 20000 ))")


def retriever_script(cfg: ProfileConfig, profile_arg: str, folder: Path, root: str) -> list[str]:
    """The job that serves the profile's retriever over HTTP (``cosearch serve-retriever``) for the
    ranks of other jobs, writing its URL to ``folder/retriever-<job id>.url``."""
    s = cfg.slurm
    lines = sbatch_header(f"cosearch-{cfg.profile}-retriever", cfg, time_limit=s.retriever_time or s.time, gres=s.retriever_gres,
                          log=str(folder / "retriever-%j.log"))
    return lines + ["", SBATCH_PRELUDE.format(root=root),
                    "PORT=$(( 20000 + SLURM_JOB_ID % 20000 ))",
                    f"URL_FILE={shlex.quote(str(folder))}/retriever-$SLURM_JOB_ID.url",
                    'echo "http://$(hostname):$PORT" > "$URL_FILE.tmp" && mv "$URL_FILE.tmp" "$URL_FILE"',
                    f"exec cosearch serve-retriever --profile {profile_arg} --host 0.0.0.0 --port \"$PORT\""]
