"""``cosearch slurm train``: the SLURM jobs of a data-parallel training run, and their dependencies.

Three job scripts, written to ``papermill_runs/<profile>/slurm/`` and submitted in order:

1. ``retriever.sbatch``: one task serving the profile's retriever over HTTP (``cosearch
   serve-retriever``, Search-R1's protocol). It writes its URL to ``retriever-<job id>.url`` and
   serves until the training job cancels it. All ranks search through this one server, so no
   rank loads the index.
2. ``train.sbatch`` (``--dependency=after:<retriever>``: it starts once the server job runs):
   ``--nodes`` x ``--ntasks-per-node`` tasks, one per GPU. The script first builds, in one task,
   what the ranks share and the cache keeps (``cosearch warm-start``: world, index, warm start,
   the Fixed Ranker), so that no rank waits at a collective for an hour-long warm start. It waits
   until the server answers ``/health`` (and fails at once, naming the job, if the server's job has
   ended), then runs ``srun --kill-on-bad-exit=1 cosearch train ... --resume``: every
   task is one rank (``rl.data_parallel``: env:// rendezvous on the first node), and a task that
   dies ends the step, naming the rank. ``--resume`` makes a requeued or resubmitted job continue
   from the newest checkpoint. SIGUSR1 before the time limit reaches every rank through srun; the
   ranks stop together after the step, checkpoint, and the job requeues itself. Then ``srun
   cosearch evaluate``: the evaluations of notebooks 03 and 02, sharded over the same ranks and
   server, in parts that a requeued job resumes (``runs.launched_evaluation``).
3. ``evaluate.sbatch`` (``--dependency=afterok:<train>``): notebooks 02 and 03 (``resume=true``) on
   one GPU. They find the methods trained and evaluated and go on to their tables and figures.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cosearch_lib.atomic_io import atomic_path, write_json
from cosearch_lib.config import ConfigError, load_profile
from cosearch_lib.config.methods import method_spec
from cosearch_lib.experiment.preflight import check_inputs
from cosearch_lib.paths import project_relative, project_root, run_dir
from cosearch_lib.planning.job_plan import JobPlan, enforce, gpus_in_gres, plan_job
from cosearch_lib.runs.slurm_jobs import (
    RANK_ENVIRONMENT,
    RETRIEVER_WAIT_S,
    SBATCH_PRELUDE,
    STOPPABLE_SH,
    WAIT_FOR_SERVER,
    retriever_script,
    run_sbatch,
    sbatch_header,
    sbatch_job_id,
)
from cosearch_lib.stop_signals import EXIT_STOPPED


def training_plan(profile: str | Path, methods: Sequence[str], *, nodes: int = 1, gpus_per_node: int = 1,
                  tasks_per_node: int | None = None, steps: int | None = None) -> JobPlan:
    """The plan (``planning.job_plan``) of training ``methods`` on this job shape: what the scripts
    take their stop warning from, and what :func:`submit_training` refuses on."""
    cfg = load_profile(profile)
    for method in methods:
        method_spec(method)
    tasks = tasks_per_node if tasks_per_node is not None else max(gpus_per_node, 1)
    if nodes < 1 or tasks < 1 or gpus_per_node < 0:
        raise ConfigError(f"need nodes >= 1, tasks per node >= 1, GPUs per node >= 0; got {nodes}, {tasks}, {gpus_per_node}")
    if gpus_per_node and tasks != gpus_per_node:
        raise ConfigError(f"one rank per GPU: tasks per node ({tasks}) must equal GPUs per node ({gpus_per_node})")
    return plan_job(cfg, nodes=nodes, gpus_per_node=gpus_per_node, ranks_per_node=tasks, methods=tuple(methods), steps=steps)


def slurm_training_scripts(profile: str | Path, methods: Sequence[str], *, nodes: int = 1, gpus_per_node: int = 1,
                           tasks_per_node: int | None = None, steps: int | None = None,
                           plan: JobPlan | None = None) -> dict[str, str]:
    """The three job scripts (``retriever``, ``train``, ``evaluate``) of training ``methods`` on
    ``nodes`` x ``tasks_per_node`` ranks (default: one per GPU; ``gpus_per_node=0``: CPU ranks, gloo).
    Resource lines come from the profile's ``slurm`` section; the stop warning from ``plan``
    (:func:`training_plan`): ``slurm.signal_lead_s``, or when that is null the part of a step a stop
    cannot cut, as the plan measures it."""
    cfg = load_profile(profile)
    plan = plan or training_plan(profile, methods, nodes=nodes, gpus_per_node=gpus_per_node,
                                 tasks_per_node=tasks_per_node, steps=steps)
    tasks = plan.ranks // nodes
    folder = run_dir(cfg.profile) / "slurm"
    root = shlex.quote(str(project_root()))
    profile_arg = shlex.quote(str(profile))
    prelude = SBATCH_PRELUDE.format(root=root)
    s = cfg.slurm

    retriever = retriever_script(cfg, profile_arg, folder, root)

    gres = f"gpu:{gpus_per_node}" if gpus_per_node else None
    train = sbatch_header(f"cosearch-{cfg.profile}-train", cfg, time_limit=s.time, gres=gres,
                          log=str(folder / "train-%j.log"))
    train += [f"#SBATCH --nodes={nodes}", f"#SBATCH --ntasks-per-node={tasks}"]
    train += ["#SBATCH --requeue", "#SBATCH --open-mode=append"] if s.requeue else []
    lead = round(plan.signal_lead_s)
    train += [f"#SBATCH --signal=B:USR1@{lead}"] if lead else []  # slurm.signal_lead_s, or the plan's (training_plan)
    train_cmd = ["srun", "--kill-on-bad-exit=1", "cosearch", "train", "--profile", profile_arg,
                 "--methods", ",".join(methods), "--retriever-url", '"$RETRIEVER_URL"', "--resume", "--quiet"]
    train_cmd += ["--steps", str(steps)] if steps else []
    eval_job_cmd = ["srun", "--kill-on-bad-exit=1", "cosearch", "evaluate", "--profile", profile_arg,
                    "--methods", ",".join(methods), "--retriever-url", '"$RETRIEVER_URL"', "--quiet"]
    train += ["", prelude,
              f"source {STOPPABLE_SH}  # run_stoppable: SIGUSR1/SIGTERM -> every rank checkpoints, exit {EXIT_STOPPED}, requeue",
              ": \"${COSEARCH_RETRIEVER_JOB:?submit with cosearch slurm train, or export COSEARCH_RETRIEVER_JOB}\"",
              "# whatever ends this script but a requeue (a stop, exit 75, or SIGTERM at the time limit) ends the server too",
              f'stop_server() {{ status=$?; [ "$status" -eq {EXIT_STOPPED} ] || [ "${{requeued:-0}}" -eq 1 ] || scancel "$COSEARCH_RETRIEVER_JOB"; }}',
              "trap stop_server EXIT",
              "# what every rank reads from the cache, built once, in one task (world, index, warm start, Fixed Ranker)",
              f"srun --nodes=1 --ntasks=1 cosearch warm-start --profile {profile_arg} --quiet",
              *RANK_ENVIRONMENT,
              WAIT_FOR_SERVER.format(url_dir=shlex.quote(str(folder)), wait_s=RETRIEVER_WAIT_S),
              f'run_stoppable "$SLURM_JOB_ID" {" ".join(train_cmd)}',
              "# the evaluations notebooks 03 and 02 read (02: the oracle gap, its methods with the warm-started",
              "# policies), sharded over the same ranks and server, in parts that resume",
              f'run_stoppable "$SLURM_JOB_ID" {" ".join(eval_job_cmd)}']

    evaluate = sbatch_header(f"cosearch-{cfg.profile}-evaluate", cfg, time_limit=s.aggregate_time, gres=s.gres,
                             log=str(folder / "evaluate-%j.log"))
    eval_cmd = f"cosearch run --profile {profile_arg} --notebooks 03 -p resume=true -p methods={','.join(methods)} --quiet"
    eval_cmd += f" -p steps={steps}" if steps else ""
    # the notebooks read the parts the training job's ranks wrote (notebook 02's own methods: no -p methods)
    evaluate += ["", prelude, f"cosearch run --profile {profile_arg} --notebooks 02 --quiet", eval_cmd]
    return {name: "\n".join(lines) + "\n" for name, lines in
            (("retriever", retriever), ("train", train), ("evaluate", evaluate))}


def submit_training(profile: str | Path, methods: Sequence[str], *, nodes: int = 1, gpus_per_node: int = 1,
                    tasks_per_node: int | None = None, steps: int | None = None, evaluate: bool = True,
                    sbatch: str = "sbatch", submit: bool = True, force: bool = False,
                    run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> dict[str, Any]:
    """Plan the job (:func:`training_plan`) and refuse, before anything is written, what cannot fit
    or finish (``planning.job_plan.PlanRefused``; ``force`` goes on anyway); then write the scripts of
    :func:`slurm_training_scripts` and (``submit``) submit the retriever job, the training job after
    it (``--dependency=after``, with the server's job id in its environment) and, with ``evaluate``,
    notebook 03's job once training ended well (``afterok``). Returns the script paths, the
    commands, the job ids and the plan's step seconds and stop warning."""
    cfg = load_profile(profile)
    plan = enforce(training_plan(profile, methods, nodes=nodes, gpus_per_node=gpus_per_node, tasks_per_node=tasks_per_node,
                                 steps=steps), "cosearch slurm train", force=force)
    ranks = plan.ranks
    preflight = check_inputs(cfg, world_size=ranks, gpus=gpus_per_node > 0)  # before the queue: data, models, index, engine, launch
    texts = slurm_training_scripts(profile, methods, nodes=nodes, gpus_per_node=gpus_per_node,
                                   tasks_per_node=tasks_per_node, steps=steps, plan=plan)
    folder = run_dir(cfg.profile) / "slurm"
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, text in texts.items():
        paths[name] = folder / f"{name}.sbatch"
        with atomic_path(paths[name]) as tmp:
            tmp.write_text(text)
        paths[name].chmod(0o755)
    out: dict[str, Any] = {"scripts": {k: project_relative(v) for k, v in paths.items()}, "ranks": ranks,
                           "checked": list(preflight.checked), "not_checked_here": list(preflight.skipped),
                           "plan": {"step_s": {m: round(v, 1) for m, v in plan.step_s.items()},
                                    "signal_lead_s": round(plan.signal_lead_s), "refused_but_forced": [str(r) for r in plan.refusals]}}
    retriever_cmd = [sbatch, "--parsable", str(paths["retriever"])]
    if not submit:
        out["commands"] = [retriever_cmd,
                           [sbatch, "--parsable", "--dependency=after:<retriever job>",
                            "--export=ALL,COSEARCH_RETRIEVER_JOB=<retriever job>", str(paths["train"])]]
        if evaluate:
            out["commands"].append([sbatch, "--parsable", "--dependency=afterok:<train job>", str(paths["evaluate"])])
        return out
    retriever_job = _submit(run, retriever_cmd)
    train_cmd = [sbatch, "--parsable", f"--dependency=after:{retriever_job}",
                 f"--export=ALL,COSEARCH_RETRIEVER_JOB={retriever_job}", str(paths["train"])]
    out.update(retriever_job=retriever_job, train_job=_submit(run, train_cmd), commands=[retriever_cmd, train_cmd])
    if evaluate:
        eval_cmd = [sbatch, "--parsable", f"--dependency=afterok:{out['train_job']}", str(paths["evaluate"])]
        out["evaluate_job"] = _submit(run, eval_cmd)
        out["commands"].append(eval_cmd)
    write_json(out, folder / "submitted.json")
    return out


def _submit(run: Callable[..., subprocess.CompletedProcess], cmd: list[str]) -> str:
    return sbatch_job_id(run_sbatch(run, cmd))


#: The job script ``cosearch slurm notebooks`` submits (its #SBATCH lines are defaults the command overrides).
RUN_NOTEBOOKS_SBATCH = "papermill_runs/slurm/run_notebooks.sbatch"


def submit_notebooks(profile: str | Path, notebooks: Sequence[str] = (), *, params: Sequence[str] = (),
                     sbatch: str = "sbatch", submit: bool = True, force: bool = False,
                     run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> dict[str, Any]:
    """``run_notebooks.sbatch``'s submit helper: plan the notebooks' training as that job runs it (one
    node, ``slurm.gres``'s GPUs, the methods of the profile's notebook 03) and refuse what cannot fit
    or finish (``force``: submit anyway); then ``sbatch`` the script with the profile's time limit,
    resources and the plan's stop warning on the command line (they override its #SBATCH lines), and
    ``PROFILE``, ``NOTEBOOKS``, ``PARAMS`` (``-p name=value`` each) in its environment (``--export=ALL``).
    Returns the command, that environment and the job id."""
    cfg = load_profile(profile)
    methods = [m.strip() for m in str(cfg.notebooks.get("03", {}).get("methods", "cosearch")).split(",") if m.strip()]
    gpus = gpus_in_gres(cfg.slurm.gres)
    plan = enforce(training_plan(profile, methods, gpus_per_node=gpus), "cosearch slurm notebooks", force=force)
    s = cfg.slurm
    env = {"PROFILE": str(profile), "NOTEBOOKS": " ".join(notebooks), "PARAMS": " ".join(f"-p {shlex.quote(p)}" for p in params)}
    cmd = [sbatch, "--parsable", f"--time={s.time}", f"--mem={s.mem}", f"--cpus-per-task={s.cpus_per_task}"]
    cmd += [f"--gres={s.gres}"] if s.gres else []
    cmd += [f"--partition={s.partition}"] if s.partition else []
    cmd += [f"--account={s.account}"] if s.account else []
    cmd += [f"--signal=B:USR1@{round(plan.signal_lead_s)}"] if plan.signal_lead_s else []
    cmd += ["--export=ALL", str(project_root() / RUN_NOTEBOOKS_SBATCH)]
    out: dict[str, Any] = {"command": cmd, "environment": env, "plan": {"step_s": {m: round(v, 1) for m, v in plan.step_s.items()},
                                                    "signal_lead_s": round(plan.signal_lead_s),
                                                    "refused_but_forced": [str(r) for r in plan.refusals]}}
    if submit:
        out["job"] = sbatch_job_id(run_sbatch(run, cmd, env))
    return out
