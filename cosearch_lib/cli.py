"""The ``cosearch`` command.

    cosearch run --profile demo [--notebooks 01 02] [-p name=value ...]
                                                        execute notebooks with papermill (and the
                                                        profile's reduced grid before notebook 04)
    cosearch warm-start --profile demo                  train (or load) the warm-start adapters
    cosearch build-world --profile demo                 generate the embedded world
    cosearch build-index --profile demo                 world/corpus -> store -> FAISS index (torchrun/srun: sharded)
    cosearch serve-retriever --profile demo [--port N]  Search-R1-compatible HTTP retrieval server
    cosearch download {cosearch-data,wiki18-corpus,wiki18-index,models,all} --profile P  (or --dest DIR)
    cosearch export-world --profile paper_mini --hub DIR  the world as the paper's artefacts, in the hub's layout
    cosearch evaluate --profile paper --methods M,...   notebooks 03's and 02's evaluations as a job (torchrun/srun: sharded, resumable)
    cosearch plan --profile paper --nodes 2 --gpus-per-node 8   memory, time, GPU-hours and refusals before the queue
    cosearch prepare-relevance --profile paper          the Fixed Ranker's relevance data (training queries, top-N, labels)
    cosearch check --profile paper [--ranks N]          the profile's inputs, checked before any GPU work
    cosearch models                                     the model registry and what is installed
    cosearch profiles                                   the available profiles
    cosearch compare-runs BEFORE AFTER                  are two runs' record tables identical?
    cosearch docs [--check]                             regenerate docs/METRICS.md and docs/RESULTS.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from cosearch_lib.config import ConfigError, available_profiles, load_profile
from cosearch_lib.runs.slurm_commands import add_slurm_commands

# Each command imports its modules when it runs, so `cosearch --help` and `cosearch profiles` answer
# at once instead of loading torch, transformers and papermill first. This is the one module that
# does so on purpose: nothing imports the CLI, so these imports cannot hide a cycle.


def _cmd_run(args: argparse.Namespace) -> int:
    from cosearch_lib.runs.grid import run_workbook
    from cosearch_lib.runs.papermill_runner import parse_parameter

    params = dict(parse_parameter(p) for p in args.param or [])
    if args.seed is not None:
        params["seed"] = args.seed
    run_workbook(args.profile, args.notebooks, parameters=params, progress=not args.quiet, cell_timeout=args.cell_timeout)
    return 0


def _cmd_grid(args: argparse.Namespace) -> int:
    from cosearch_lib.records.grid_cells import grid_status, load_grid
    from cosearch_lib.runs.grid import run_grid, submit_slurm

    grid = load_grid(args.grid)
    if args.status:
        print(grid_status(args.profile, grid).to_string(index=False))
        return 0
    if args.slurm:
        out = submit_slurm(args.profile, grid, submit=not args.dry_run, force=args.force)
        print(json.dumps(out, indent=2))
        return 0
    cells = [args.cell] if args.cell is not None else args.cells
    table = run_grid(args.profile, grid, cells, progress=not args.quiet)
    print(table.drop(columns="error").to_string(index=False))
    failed = table[table["error"].notna()]
    for row in failed.itertuples():
        print(f"cell {row.cell} failed: {row.error}")
    return 1 if len(failed) else 0


def _cmd_warm_start(args: argparse.Namespace) -> int:
    from cosearch_lib.runs.papermill_runner import run_warm_start

    rec = run_warm_start(load_profile(args.profile), progress=not args.quiet)
    print(json.dumps({k: v for k, v in rec.items() if k != "environment"}, indent=2))
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from cosearch_lib.runs.launched_training import run_training
    from cosearch_lib.stop_signals import EXIT_STOPPED, StopRequested

    cfg = load_profile(args.profile, seed=args.seed)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    try:
        rec = run_training(cfg, methods, steps=args.steps, resume=args.resume, retriever_url=args.retriever_url,
                           progress=not args.quiet, profile_arg=args.profile)
    except StopRequested as stop:  # every rank stops after the same step, rank 0 checkpointed: resumable
        print(f"cosearch train: {stop}; the same command with --resume continues (exit {EXIT_STOPPED})",
              file=sys.stderr, flush=True)
        return EXIT_STOPPED
    if rec is not None:  # rank 0
        print(json.dumps({k: v for k, v in rec.items() if k != "environment"}, indent=2))
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from cosearch_lib.runs.launched_evaluation import run_evaluation_job
    from cosearch_lib.stop_signals import EXIT_STOPPED, StopRequested

    cfg = load_profile(args.profile, seed=args.seed)
    if args.retriever_url:
        cfg.retrieval.server_url = args.retriever_url
    notebooks = list(dict.fromkeys(args.notebooks))
    if "03" not in notebooks and (args.methods is not None or args.no_ceiling):
        raise ConfigError("--methods and --no-ceiling are notebook 03's: notebook 02 takes its methods from its "
                          "parameters and the profile's notebooks: {\"02\": ...} entry (so that the notebook reads the "
                          "parts); drop them, or add 03 to --notebooks")
    methods = [m.strip() for m in (args.methods or "cosearch").split(",") if m.strip()]
    try:
        records = run_evaluation_job(cfg, notebooks, methods, ceiling=not args.no_ceiling, progress=not args.quiet,
                                     profile_arg=args.profile)
    except StopRequested as stop:  # the parts written so far stay: the same command continues
        print(f"cosearch evaluate: stopped on {stop.signal_name} after {stop.step} part(s) of this rank; the same "
              f"command continues (exit {EXIT_STOPPED})", file=sys.stderr, flush=True)
        return EXIT_STOPPED
    if records is not None:  # rank 0
        print(json.dumps(records, indent=2))
    return 0


def _cmd_build_starts(args: argparse.Namespace) -> int:
    from cosearch_lib.experiment import method_starts, search_backend

    cfg = load_profile(args.profile, seed=args.seed)
    if args.retriever_url:
        cfg.retrieval.server_url = args.retriever_url
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    retriever = search_backend(cfg, progress=not args.quiet)
    for method in methods:
        starts = method_starts(cfg, retriever, method, progress=not args.quiet)
        print(json.dumps({"method": method, "starts": {k: str(v) for k, v in starts.items()}}))
    return 0


def _cmd_slurm_train(args: argparse.Namespace) -> int:
    from cosearch_lib.runs.slurm_training import submit_training

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    print(json.dumps(submit_training(args.profile, methods, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                                     tasks_per_node=args.tasks_per_node, steps=args.steps, evaluate=not args.no_evaluate,
                                     submit=not args.dry_run, force=args.force), indent=2))
    return 0


def _cmd_slurm_notebooks(args: argparse.Namespace) -> int:
    from cosearch_lib.runs.slurm_training import submit_notebooks

    print(json.dumps(submit_notebooks(args.profile, args.notebooks or (), params=args.param or (), submit=not args.dry_run,
                                      force=args.force), indent=2))
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from cosearch_lib.config import load_profile
    from cosearch_lib.planning.job_plan import plan_job
    from cosearch_lib.planning.plan_report import format_plan
    from cosearch_lib.planning.step_work import Behaviour

    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip()) if args.methods else None
    plan = plan_job(load_profile(args.profile), nodes=args.nodes, gpus_per_node=args.gpus_per_node, gpu=args.gpu,
                    methods=methods, behaviour=Behaviour(searches=args.searches))
    print(format_plan(plan))
    return 1 if plan.refusals else 0


def _cmd_compare_runs(args: argparse.Namespace) -> int:
    from cosearch_lib.records.compare import compare_tables

    report = compare_tables(args.first, args.second, only=args.only)
    if report.empty:
        raise FileNotFoundError(f"no CSV or parquet tables under {args.first} or {args.second}")
    print(report.to_string(index=False, max_colwidth=120))
    same = (report["status"] == "identical").all()
    print(f"{(report['status'] == 'identical').sum()} of {len(report)} tables identical")
    return 0 if same else 1


def _cmd_docs(args: argparse.Namespace) -> int:
    from cosearch_lib.records.docs import copy_run_records, write_generated_docs

    if args.results_from:
        print(f"copied run records to {copy_run_records(args.results_from)}")
    stale = write_generated_docs(check=args.check)
    for path in stale:
        print(f"{'out of date' if args.check else 'wrote'}: {path}")
    return 1 if (args.check and stale) else 0


def _cmd_build_world(args: argparse.Namespace) -> int:
    from cosearch_lib.retrieval.artifacts import prepare_world

    paths = prepare_world(load_profile(args.profile), force=args.force)
    print(json.dumps({"root": str(paths.root), "corpus": str(paths.corpus), "qa": {k: str(v) for k, v in paths.qa.items()}}, indent=2))
    return 0


def _cmd_build_index(args: argparse.Namespace) -> int:
    from cosearch_lib.experiment import resolve_profile
    from cosearch_lib.retrieval.artifacts import prepare_corpus, prepare_index
    from cosearch_lib.retrieval.encoder import TextEncoder
    from cosearch_lib.rl.data_parallel import DataParallel

    cfg = resolve_profile(args.profile)
    dp = DataParallel.from_environment()  # under torchrun or srun: the ranks share the encoding
    if dp.is_main:
        prepare_corpus(cfg, progress=not args.quiet)  # the store, built once
    dp.barrier()
    store, paths = prepare_corpus(cfg, progress=False)
    encoder = TextEncoder(cfg.retrieval.encoder)
    index = prepare_index(cfg, encoder, store, paths, progress=not args.quiet, rank=dp.rank, world=dp.world_size,
                          barrier=dp.barrier)
    if dp.is_main:
        print(json.dumps({"index": str(paths.index), "passages": int(index.ntotal), "processes": dp.world_size}, indent=2))
    dp.close()
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from cosearch_lib.experiment import build_retriever
    from cosearch_lib.retrieval.http_server import run_server

    cfg = load_profile(args.profile)
    if args.corpus:
        cfg.data.corpus_path = args.corpus
    if args.index:
        cfg.data.index_path = args.index
    if args.encoder:
        cfg.retrieval.encoder.model = args.encoder
    server_cfg = dataclasses.replace(cfg.server, **{k: v for k, v in {"host": args.host, "port": args.port}.items() if v is not None})
    run_server(build_retriever(cfg), server_cfg)
    return 0


def _cmd_download(args: argparse.Namespace) -> int:
    from cosearch_lib.data import downloads as data

    if (args.dest is None) == (args.profile is None):
        raise ValueError("cosearch download: give --profile P (write where P reads each file) or --dest DIR")
    if args.what in ("models", "all") and args.profile is None:
        raise ValueError(f"cosearch download {args.what}: needs --profile (the models are the profile's)")
    if args.profile is None:
        fn = {"cosearch-data": data.download_cosearch_data, "wiki18-corpus": data.download_wiki18_corpus,
              "wiki18-index": data.download_wiki18_e5_index}[args.what]
        print(fn(args.dest))
        return 0
    cfg = load_profile(args.profile)
    # `all`: the files the profile reads (an embedded-world profile reads none), then its models
    what = [*data.profile_targets(cfg.data), "models"] if args.what == "all" else [args.what]
    for item in what:
        if item == "models":
            from cosearch_lib.experiment.preflight import model_names
            from cosearch_lib.models.registry import prefetch_models

            for row in prefetch_models(model_names(cfg)):
                print(f"{row['key']}: {row['model']} ({row['source']}) -> {row['path']}")
        else:
            print(f"{item}: {data.download_for_profile(cfg.data, item)}")
    return 0


def _cmd_export_world(args: argparse.Namespace) -> int:
    from cosearch_lib.experiment.paper_export import export_paper_hub

    repos = export_paper_hub(load_profile(args.profile), args.hub, progress=not args.quiet)
    print(json.dumps({repo: str(path) for repo, path in repos.items()}, indent=2))
    return 0


def _cmd_prepare_relevance(args: argparse.Namespace) -> int:
    from cosearch_lib.experiment.relevance_data import prepare_relevance_data

    summary = prepare_relevance_data(load_profile(args.profile, seed=args.seed), force=args.force, progress=not args.quiet)
    verb = "already prepared" if summary["reused"] else "wrote"
    print(f"{verb} {summary['path']}: {summary['kept']} of {summary['queries']} queries have a relevant passage in "
          f"their top {summary['topn']} ({summary['dropped']} dropped)")
    for source, row in summary["per_source"].items():
        print(f"  {source}: {row['kept']} of {row['queries']}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from cosearch_lib.experiment.preflight import check_inputs

    result = check_inputs(load_profile(args.profile), world_size=args.ranks)
    for line in result.checked:
        print(f"ok    {line}")
    for line in result.skipped:
        print(f"later {line}")
    return 0


def _cmd_models(args: argparse.Namespace) -> int:
    from cosearch_lib.models.registry import describe_models

    for row in describe_models():
        print(f"{row['name']:<24} {row['kind']:<10} {'installed' if row['installed'] else 'MISSING':<10} {row['path']}")
    return 0


def _cmd_profiles(args: argparse.Namespace) -> int:
    print("\n".join(available_profiles()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cosearch", description="CoSearch research workbook")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="execute notebooks with papermill into papermill_runs/<profile>/")
    p.add_argument("--profile", default="demo", help="profile name (papermill_runs/params/<name>.yaml) or a .yaml path")
    p.add_argument("--notebooks", nargs="*", help="notebook prefixes to run, e.g. 01 02 (default: all, in order)")
    p.add_argument("--seed", type=int, help="override the profile's seed")
    p.add_argument("-p", "--param", action="append", metavar="NAME=VALUE",
                   help="notebook parameter (repeatable; value read as YAML), checked against each notebook's parameters cell")
    p.add_argument("--quiet", action="store_true", help="no per-cell progress bar")
    p.add_argument("--cell-timeout", type=float, metavar="SECONDS", help="stop a notebook whose cell runs longer, naming the cell")
    p.set_defaults(fn=_cmd_run)

    p = sub.add_parser("grid", help="run a grid of cells (papermill_runs/params/grids/<grid>.yaml) locally or as a SLURM array")
    p.add_argument("grid", help="grid name (papermill_runs/params/grids/<name>.yaml) or a .yaml path")
    p.add_argument("--profile", default="demo", help="the base profile every cell extends")
    p.add_argument("--cells", nargs="*", help="cell names or 0-based indices to run (default: all; finished ones are skipped)")
    p.add_argument("--cell", help="one cell by name or index (what a SLURM array task runs: $SLURM_ARRAY_TASK_ID)")
    p.add_argument("--status", action="store_true", help="only print each cell's status (todo, partial, failed, done)")
    p.add_argument("--slurm", action="store_true", help="write the array and aggregation sbatch files and submit them")
    p.add_argument("--dry-run", action="store_true", help="with --slurm: write the sbatch files, submit nothing")
    p.add_argument("--force", action="store_true", help="with --slurm: submit though the plan says a cell cannot fit or finish")
    p.add_argument("--quiet", action="store_true", help="no per-cell progress bar")
    p.set_defaults(fn=_cmd_grid)

    p = sub.add_parser("train", help="GRPO-train methods of a profile: one process, or every rank of a torchrun/srun job "
                                     "(data parallel over the rollouts of a step; docs/USAGE.md)")
    p.add_argument("--profile", default="demo")
    p.add_argument("--methods", default="cosearch", help="comma-separated: search_r1, fixed_ranker, cosearch, oracle")
    p.add_argument("--steps", type=int, help="GRPO steps per method (default: training.steps of the profile)")
    p.add_argument("--seed", type=int, help="override the profile's seed")
    p.add_argument("--resume", action="store_true", help="continue each method from its newest checkpoint")
    p.add_argument("--retriever-url", help="search through this retrieval server (cosearch serve-retriever) instead of "
                                           "loading the index in every rank")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(fn=_cmd_train)

    p = sub.add_parser("evaluate", help="the evaluations notebooks 03 (trained methods before/after GRPO, the hop-level "
                                        "ceiling) and 02 (the oracle gap) read, as one job: one process or every rank "
                                        "of a torchrun/srun job, each evaluating its share into parts that resume and "
                                        "that the notebooks then read")
    p.add_argument("--profile", default="demo")
    p.add_argument("--notebooks", nargs="+", choices=("02", "03"), default=["02", "03"],
                   help="whose evaluations (default both: 03, then 02)")
    p.add_argument("--methods", help="notebook 03: comma-separated trained methods, their checkpoints must exist "
                                     "(default cosearch); notebook 02 reads its own")
    p.add_argument("--seed", type=int, help="override the profile's seed")
    p.add_argument("--no-ceiling", action="store_true", help="skip the hop-level oracle row (notebook 03: evaluate_ceiling=False)")
    p.add_argument("--retriever-url", help="search through this retrieval server instead of loading the index in every rank")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(fn=_cmd_evaluate)

    p = sub.add_parser("build-starts", help="build what a method's ranks read from the cache (warm start, Fixed Ranker) in "
                                            "one process: what `cosearch train` runs first under torchrun or srun")
    p.add_argument("--profile", default="demo")
    p.add_argument("--methods", default="cosearch")
    p.add_argument("--seed", type=int, help="override the profile's seed")
    p.add_argument("--retriever-url", help="search through this retrieval server instead of loading the index")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(fn=_cmd_build_starts)

    add_slurm_commands(sub, train=_cmd_slurm_train, notebooks=_cmd_slurm_notebooks, plan=_cmd_plan)

    p = sub.add_parser("warm-start", help="train (or load from the cache) the profile's supervised warm start")
    p.add_argument("--profile", default="demo")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(fn=_cmd_warm_start)

    p = sub.add_parser("build-world", help="generate (or reuse) the profile's embedded world")
    p.add_argument("--profile", default="demo")
    p.add_argument("--force", action="store_true", help="regenerate even if a matching world exists")
    p.set_defaults(fn=_cmd_build_world)

    p = sub.add_parser("build-index", help="build (or reuse) the profile's corpus store and FAISS index; under torchrun "
                                           "or srun the ranks encode its shards, and a cut build resumes")
    p.add_argument("--profile", default="demo")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(fn=_cmd_build_index)

    p = sub.add_parser("serve-retriever", help="serve the profile's retriever over Search-R1's HTTP protocol")
    p.add_argument("--profile", default="demo")
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default from the profile, 8000)")
    p.add_argument("--corpus", help="wiki-18-format corpus .jsonl(.gz) instead of the embedded world")
    p.add_argument("--index", help="prebuilt FAISS index for --corpus (e.g. wiki-18 e5_Flat.index)")
    p.add_argument("--encoder", help="encoder model name or path (e.g. intfloat/e5-base-v2)")
    p.set_defaults(fn=_cmd_serve)

    p = sub.add_parser("download", help="download public artefacts where a profile reads them (needs the Hugging Face "
                                        "hub or HF_ENDPOINT); `models`: the profile's models into the HF cache for offline nodes")
    p.add_argument("what", choices=["cosearch-data", "wiki18-corpus", "wiki18-index", "models", "all"])
    p.add_argument("--profile", help="write each file where this profile's data section reads it (data.root, data.*_path)")
    p.add_argument("--dest", help="or: this folder (cosearch-data: DIR/co-search-train, DIR/co-search-eval)")
    p.set_defaults(fn=_cmd_download)

    p = sub.add_parser("export-world", help="write the profile's embedded world as the paper's artefacts (wiki-18 corpus, "
                                            "split flat index, CoSearch parquet) in the hub's layout, for a local hub stand-in")
    p.add_argument("--profile", default="paper_mini", help="its world section sizes the world, its encoder builds the index")
    p.add_argument("--hub", required=True, help="folder to write <hub>/datasets/<org>/<repo>/... into")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(fn=_cmd_export_world)

    p = sub.add_parser("prepare-relevance", help="the Fixed Ranker's relevance data: the profile's training queries "
                                                 "(relevance.split, query_sources, n_queries), their top-N from the retriever "
                                                 "($COSEARCH_RETRIEVER_URL or the index), answer-containment labels, the "
                                                 "queries without a relevant candidate dropped; written to relevance.prepared_path")
    p.add_argument("--profile", default="demo")
    p.add_argument("--seed", type=int, help="override the profile's seed (it draws the n_queries sample)")
    p.add_argument("--force", action="store_true", help="write it again even when it is there with the same settings")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(fn=_cmd_prepare_relevance)

    p = sub.add_parser("check", help="check a profile's inputs (data files, columns, index dimension, models, context "
                                     "budget, launch) without loading weights: what train, run and slurm check first")
    p.add_argument("--profile", default="demo")
    p.add_argument("--ranks", type=int, default=1, help="ranks the job will run (a launch the backend cannot run is refused)")
    p.set_defaults(fn=_cmd_check)

    sub.add_parser("models", help="list bundled models and where their files are").set_defaults(fn=_cmd_models)
    sub.add_parser("profiles", help="list available profiles").set_defaults(fn=_cmd_profiles)

    p = sub.add_parser("compare-runs", help="compare the record tables (CSV, parquet) of two run folders; exit 1 if any differ")
    p.add_argument("first")
    p.add_argument("second")
    p.add_argument("--only", nargs="*", help="regexes a table's relative path must match")
    p.set_defaults(fn=_cmd_compare_runs)

    p = sub.add_parser("docs", help="regenerate docs/METRICS.md (from the code's glossaries) and docs/RESULTS.md (from docs/results/)")
    p.add_argument("--check", action="store_true", help="only report files that are out of date (exit 1 if any)")
    p.add_argument("--results-from", metavar="RUN_FOLDER", help="first copy a run folder's metrics and run records to docs/results/")
    p.set_defaults(fn=_cmd_docs)
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors that describe bad input or a missing download: print the message, no traceback."""
    from cosearch_lib.data.downloads import HubUnavailableError
    from cosearch_lib.runs.slurm_jobs import SlurmSubmitError

    return (FileNotFoundError, ValueError, LookupError, HubUnavailableError, SlurmSubmitError)


#: Commands that run notebooks (training inside papermill's kernel): a stop signal is passed on to the
#: kernel and makes the command exit with stop_signals.EXIT_STOPPED (docs/USAGE.md, "Time limits, preemption and requeueing").
STOPPABLE_COMMANDS = ("run", "grid")
#: Commands that train or evaluate in this process, or prepare for them, under a SLURM job: they listen
#: for stop signals from their first line (SLURM's --signal=B:USR1 reaches every process of the batch
#: step, srun's tasks included), so a warning during model loading or the warm start is kept, not fatal;
#: training stops at its next boundary (rl.run_protocol), the warm start finishes.
LISTENING_COMMANDS = ("train", "evaluate", "warm-start")


def _dispatch(args: argparse.Namespace) -> int:
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        return 130
    except _user_errors() as err:
        print(f"cosearch {args.command}: error: {err}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in LISTENING_COMMANDS:
        from cosearch_lib.stop_signals import StopRequest

        with StopRequest():
            return _dispatch(args)
    if args.command not in STOPPABLE_COMMANDS:
        return _dispatch(args)
    from cosearch_lib.stop_signals import EXIT_STOPPED, forward_stop_signals

    with forward_stop_signals() as stop:
        try:
            code = _dispatch(args)
        except BaseException:
            if stop.received is None:
                raise
            code = 1
    if stop.received is not None and code != 0:  # stopped on request and not finished: resumable
        again = "the same command resumes" if args.command == "grid" else \
            "run it again with -p resume=true to continue training from the checkpoint"
        print(f"cosearch {args.command}: stopped on {stop.received}; {again} (exit {EXIT_STOPPED})",
              file=sys.stderr, flush=True)
        return EXIT_STOPPED
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
