"""A profile: the :class:`ProfileConfig` that holds every section, and how a YAML file becomes one.

A profile is one YAML file under ``papermill_runs/params/``; its sections map onto the section
dataclasses (``world:`` -> :class:`~cosearch_lib.config.WorldConfig`, ``search:`` ->
:class:`~cosearch_lib.config.SearchBudget`, ...). The profile's one search budget and one rule set
are built first and handed to the sections that read them as those are constructed
(:func:`from_dict`); no section is changed after it is built.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cosearch_lib.config.checks import KEYED_WHEN_SET, SHARES, ConfigError, Fields, check_choice, invalid
from cosearch_lib.config.generation import LoraSettings, ModelsConfig, ProtocolConfig, RolloutConfig
from cosearch_lib.config.retrieval import RetrievalConfig, SearchBudget, ServerConfig
from cosearch_lib.config.rules import RULE_SETS, check_same_rules
from cosearch_lib.config.training import RelevanceConfig, TrainConfig, WarmStartConfig
from cosearch_lib.config.world import DataConfig, WorldConfig
from cosearch_lib.paths import params_dir


def _fingerprinted(obj: Any) -> Any:
    """``dataclasses.asdict`` without the fields marked :data:`~cosearch_lib.config.checks.SPEED_ONLY` or
    :data:`~cosearch_lib.config.checks.LOCATION_ONLY`, nor those marked
    :data:`~cosearch_lib.config.checks.KEYED_WHEN_SET` while None (the same JSON otherwise)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _fingerprinted(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if not (f.metadata.get("speed_only") or f.metadata.get("location_only")
                        or (f.metadata.get("keyed_when_set") and getattr(obj, f.name) is None))}
    if isinstance(obj, (list, tuple)):
        return [_fingerprinted(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _fingerprinted(v) for k, v in obj.items()}
    return obj


#: The answer F1 the evaluation tables report (EvaluationConfig.f1; metrics.answer_f1).
EVAL_F1_METRICS = ("plain", "yes_no")


#: How the one-generation baselines' replies are produced (``eval.harness``, docs/METHOD.md).
BASELINE_REPLIES = ("prefilled", "free")


@dataclass
class EvaluationConfig:
    split: str = "test"  # which split the evaluation harness reads
    n_per_dataset: int | None = None  # questions per data source (None = all)
    n_samples: int = 1  # rollouts per question at evaluation
    temperature: float = 0.0  # evaluation sampling temperature (0 = greedy)
    answer_max_new_tokens: int = 64  # tokens of the direct / RAG replies (CoT and agent turns: rollout.agent_max_new_tokens)
    f1: str = "plain"  # answer F1 of the tables: "plain" (SQuAD token F1 as the paper's code computes it) or "yes_no" (HotpotQA's yes/no rule)
    baseline_reply: str = "prefilled"  # Direct / CoT / RAG: "prefilled" (the reply is started with its tag, eval.harness) or "free" (the model writes every tag)
    # The test evaluations (notebooks 02 and 03, `cosearch evaluate`, grid cells) decode with bfloat16 copies of the
    # policies' weights, each adapter merged into its copy (TransformersBackend.bf16_scope), on a CPU with avx512_bf16
    # or AMX; float32 on a CPU without them (with a warning) and on a GPU (bf16 there already). Null (the default):
    # float32, so that the tables read every policy alike on every CPU. Validation stays float32 whatever this says.
    # Not autocast: on an AMX CPU it made the demo's evaluation 0.71x as fast (docs/LOG.md).
    bf16_weights: bool | None = field(default=None, metadata=KEYED_WHEN_SET)

    def __post_init__(self) -> None:
        check_choice("evaluation.f1", self.f1, EVAL_F1_METRICS)
        check_choice("evaluation.baseline_reply", self.baseline_reply, BASELINE_REPLIES)
        if self.bf16_weights is not None:
            Fields("evaluation", self).bools("bf16_weights")
            self.bf16_weights = self.bf16_weights or None  # false is null: one key for one computation


@dataclass
class ScopeConfig:
    """What a profile's runs can and cannot show, in a sentence each: every notebook states it under
    its parameters (``records.run_settings.profile_scope``), so that a plumbing check is not read as
    a result."""

    shows: str = ""  # what the profile's numbers and figures can show
    cannot_show: str = ""  # what they cannot, and why (sizes, model, budget)

    def __post_init__(self) -> None:
        for name in ("shows", "cannot_show"):
            if not isinstance(getattr(self, name), str):
                raise invalid(f"scope.{name}", getattr(self, name), "a sentence (a string)")


@dataclass
class SlurmConfig:
    """The ``#SBATCH`` lines of the jobs ``cosearch grid --slurm`` writes (one array task per grid
    cell, then one aggregation job). Edit them per cluster in the profile, or in the written
    ``.sbatch`` files before submitting them by hand."""

    partition: str | None = None  # --partition (None: the cluster's default)
    account: str | None = None  # --account
    gres: str | None = "gpu:1"  # --gres of an array task (None: CPU-only tasks)
    cpus_per_task: int = 16
    mem: str = "128G"
    time: str = "24:00:00"  # per array task
    aggregate_time: str = "02:00:00"  # the aggregation job (notebooks 04 and 05)
    max_parallel: int = 0  # array throttle "%M" (0: no limit)
    extra: tuple[str, ...] = ()  # further #SBATCH options, e.g. "--constraint=a100"
    signal_lead_s: int | None = None  # jobs get SIGUSR1 this long before their time limit, checkpoint and requeue; None: from the plan (`cosearch plan`: the part of a step a stop cannot cut, +10% and a minute); 0: no warning
    gpus_per_node: int | None = None  # the cluster's GPUs per node: a grid cell whose plan does not fit one task (slurm.gres) becomes a data-parallel job of 1, 2, 4 ... such nodes, the fewest the plan accepts; None: cells keep slurm.gres
    max_requeues: int = 5  # how often the cluster requeues a batch job (slurm.conf MaxBatchRequeue, default 5): the plan refuses a run that needs more
    requeue: bool = True  # --requeue: a preempted or failed-node task goes back to the queue (and resumes from its checkpoint)
    retriever_gres: str | None = None  # --gres of the retrieval-server job of `cosearch slurm train` (None: CPU; "gpu:1" for a GPU FAISS index)
    retriever_time: str | None = None  # --time of that server job (None: slurm.time); it must outlive the training job and its requeues

    def __post_init__(self) -> None:
        self.extra = tuple(self.extra)
        check = Fields("slurm", self)
        if self.signal_lead_s is not None:
            check.ints("signal_lead_s", minimum=0, why="seconds")
        check.ints("max_requeues", minimum=0)
        if self.gpus_per_node is not None:
            check.ints("gpus_per_node", minimum=1)
        check.bools("requeue")
        check.ints("cpus_per_task", minimum=1)
        check.ints("max_parallel", minimum=0, why="0: no limit")
        for line in self.extra:
            if not isinstance(line, str) or not line.startswith("--"):
                raise invalid("slurm.extra", line, "one sbatch option starting with '--' per entry")


@dataclass
class GridsConfig:
    """Grids of runs on this profile (``records.grid_cells``, ``runs.grid``, ``cosearch grid``).

    ``run`` names the cells ``cosearch run`` (``make demo``) runs before the grids' aggregate notebooks
    (04, 05): a reduced grid sized for the profile; the other cells stay for ``cosearch grid``.
    ``parameters`` are notebook parameters every grid cell of this profile gets (the cell budget, e.g.
    fewer GRPO steps), over the grid file's and under the cell's own; ``cosearch grid`` applies them too,
    so every cell of one profile is run alike and comparable."""

    # grid name -> cell names to run inside `cosearch run`; null: none (a profile that extends one with a grid)
    run: dict[str, list[str]] | None = field(default_factory=dict)
    parameters: dict[str, Any] = field(default_factory=dict)  # notebook parameters of every grid cell on this profile

    def __post_init__(self) -> None:
        if self.run is None:
            self.run = {}
        if not isinstance(self.run, dict) or not all(
                isinstance(k, str) and isinstance(v, list) and v and all(isinstance(c, str) for c in v)
                for k, v in self.run.items()):
            raise invalid("grids.run", self.run, "a mapping of grid name -> non-empty list of cell names")
        if not isinstance(self.parameters, dict):
            raise invalid("grids.parameters", self.parameters, "a mapping of notebook parameter -> value")


@dataclass
class ProfileConfig:
    """Every setting of a run. ``search`` and ``rules`` are the profile's one search budget and rule
    set: the sections that read them hold that same object, given to them when they are built (a
    section left out is built here with them; one given with other values is a ConfigError)."""

    profile: str = "demo"  # profile name; executed notebooks land in papermill_runs/<profile>/
    scope: ScopeConfig = field(default_factory=ScopeConfig)  # what the profile can and cannot show (stated in every notebook)
    seed: int = 0  # the one seed every random choice derives from
    rules: str = field(default="paper", metadata=SHARES)  # rule set: "paper" (the paper's equations, strict protocol) or "released" (the authors' code); docs/METHOD.md
    search: SearchBudget = field(default_factory=SearchBudget, metadata=SHARES)  # N, K and the search cap, shared by reference with protocol and rollout
    world: WorldConfig = field(default_factory=WorldConfig)  # the embedded world (used when data.corpus_path is None)
    data: DataConfig = field(default_factory=DataConfig)  # real corpora / QA files for cluster runs
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)  # encoder and index
    server: ServerConfig = field(default_factory=ServerConfig)  # the HTTP retrieval server
    models: ModelsConfig = field(default_factory=ModelsConfig)  # agent and ranker models, backend
    rollout: RolloutConfig = None  # token budgets and sampling of the multi-turn loop (None: built with search and rules)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)  # the evaluation harness
    protocol: ProtocolConfig = None  # prompts and passage caps (None: built with search)
    lora: LoraSettings = field(default_factory=LoraSettings)  # LoRA adapters of both policies (warm start and GRPO)
    warmstart: WarmStartConfig = field(default_factory=WarmStartConfig)  # supervised warm start on gold data
    relevance: RelevanceConfig = field(default_factory=RelevanceConfig)  # the ranker's relevance training (the Fixed Ranker), after the warm start
    training: TrainConfig = None  # joint GRPO training (None: built with rules)
    notebooks: dict[str, dict[str, Any]] = field(default_factory=dict)  # notebook stem -> papermill parameters for it (checked against its parameters cell)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)  # resources of the jobs `cosearch grid --slurm` submits
    grids: GridsConfig = field(default_factory=GridsConfig)  # the reduced grid `cosearch run` runs, and every cell's budget

    def __post_init__(self) -> None:
        check_choice("rules", self.rules, sorted(RULE_SETS))
        rules = RULE_SETS[self.rules]
        if self.protocol is None:
            self.protocol = ProtocolConfig(search=self.search)
        if self.rollout is None:
            self.rollout = RolloutConfig(search=self.search, rules=rules)
        if self.training is None:
            self.training = TrainConfig(rules=rules)
        # one SearchBudget object, shared by reference: the prompts, the rollout engine and the
        # harness built from this profile can never disagree on N, K or the cap
        self.protocol = self._sharing_search("protocol", self.protocol)
        self.rollout = self._sharing_search("rollout", self.rollout)
        check_same_rules("rollout.rules", self.rollout.rules, rules, "the profile")  # and one rule set
        check_same_rules("training.rules", self.training.rules, rules, "the profile")
        if not isinstance(self.notebooks, dict) or not all(isinstance(v, dict) for v in self.notebooks.values()):
            raise invalid("notebooks", self.notebooks, "a mapping of notebook -> {parameter: value}")
        if self.warmstart.topn is not None and self.warmstart.topn < self.search.topk:
            raise invalid("warmstart.topn", self.warmstart.topn, f"at least search.topk = {self.search.topk} (or null: search.topn)")

    def for_starts(self) -> ProfileConfig:
        """The profile as its starts see it (the warm start, the Fixed Rankers' training before GRPO and
        their caches): N = ``warmstart.topn`` where set, with that setting then cleared, so that their
        cache keys are those of the profile whose N it names; the profile itself otherwise."""
        n = self.warmstart.topn
        if n is None:
            return self
        view = self.with_search(topn=n)
        return dataclasses.replace(view, warmstart=dataclasses.replace(view.warmstart, topn=None))

    def with_search(self, **changes: Any) -> ProfileConfig:
        """A copy whose one search budget has ``changes`` (e.g. ``topn=10``), shared as ever by the prompts,
        the rollout engine and the harness."""
        search = dataclasses.replace(self.search, **changes)
        return dataclasses.replace(self, search=search, protocol=dataclasses.replace(self.protocol, search=search),
                                   rollout=dataclasses.replace(self.rollout, search=search))

    def _sharing_search(self, section: str, cfg: Any) -> Any:
        """``cfg`` holding the profile's SearchBudget object: as given, or rebuilt around it when it
        holds an equal copy; a different budget is a ConfigError (a profile has one)."""
        if cfg.search is self.search:
            return cfg
        if cfg.search != self.search:
            raise invalid(f"{section}.search", cfg.search, f"the profile's search budget {self.search} "
                          "(set in its top-level 'search:' section, which every stage shares)")
        return dataclasses.replace(cfg, search=self.search)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def fingerprint(self, *sections: str) -> str:
        """A short stable hash of the named sections (all when none), for cache folder names; fields
        that only change speed (:data:`~cosearch_lib.config.checks.SPEED_ONLY`) are left out."""
        d = _fingerprinted(self)
        picked = {k: d[k] for k in sections} if sections else d
        return hashlib.sha1(json.dumps(picked, sort_keys=True, default=str).encode()).hexdigest()[:12]

    @property
    def uses_embedded_world(self) -> bool:
        return self.data.corpus_path is None


def _init_fields(cls: type) -> dict[str, dataclasses.Field]:
    """The fields and init-only variables (InitVar) a dataclass is constructed from."""
    hints = typing.get_type_hints(cls)
    return {f.name: f for f in cls.__dataclass_fields__.values()
            if f.init and typing.get_origin(hints[f.name]) is not typing.ClassVar}


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def from_dict(cls: type, data: dict | None, where: str = "", shared: dict[str, Any] | None = None) -> Any:
    """Build dataclass ``cls`` from a (possibly nested) dict, rejecting unknown keys by name.

    The profile's one search budget and rule set (fields marked ``SHARES``) are built first; every
    nested dataclass is then constructed with them in its fields (or init-only variables) marked
    ``SHARED`` (``shared``: name -> that value), which a YAML section may not set itself."""
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{where or cls.__name__}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = _init_fields(cls)
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where or cls.__name__}: unknown key(s) {unknown}; known: {sorted(fields)}")
    shared = dict(shared or {})
    kwargs = {}
    for name, f in fields.items():
        if f.metadata.get("shares"):
            value = _value(hints[name], data[name], _key(where, name), shared) if name in data else _default(f)
            kwargs[name] = shared[name] = value
    for name, value in data.items():
        key = _key(where, name)
        if fields[name].metadata.get("shared"):
            raise ConfigError(f"{key}: set in the profile's top-level '{name}:' section, which every stage shares")
        if name not in kwargs:
            kwargs[name] = _value(hints[name], value, key, shared)
    kwargs.update({name: shared[name] for name, f in fields.items() if f.metadata.get("shared") and name in shared})
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where or cls.__name__}: {err}") from err


def _key(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _value(hint: Any, value: Any, key: str, shared: dict[str, Any]) -> Any:
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and value is not None:
        sections = [t for t in typing.get_args(hint) if dataclasses.is_dataclass(t)]
        if len(sections) == 1:  # an optional section (``X | None``): a mapping builds it, null leaves it out
            hint = sections[0]
    return from_dict(hint, value, key, shared) if dataclasses.is_dataclass(hint) else _check_scalar(value, hint, key)


def _check_scalar(value: Any, hint: Any, key: str) -> Any:
    """Light type check of YAML scalars against the field's annotation (int/float/str/bool/None)."""
    allowed = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    plain = tuple(t for t in allowed if t in (int, float, str, bool, type(None)))
    if not plain or len(plain) != len(allowed):
        return value  # containers and other types: trust the dataclass
    if isinstance(value, bool) and bool not in plain:
        raise ConfigError(f"{key}: expected {_names(plain)}, got a boolean")
    if isinstance(value, int) and not isinstance(value, bool) and float in plain and int not in plain:
        return float(value)
    if not isinstance(value, plain):
        raise ConfigError(f"{key}: expected {_names(plain)}, got {value!r}")
    return value


def _names(types: tuple) -> str:
    return " or ".join("null" if t is type(None) else t.__name__ for t in types)


def profile_path(name_or_path: str | Path) -> Path:
    """``"demo"`` -> ``papermill_runs/params/demo.yaml``; a path to a .yaml file is used as is."""
    p = Path(name_or_path)
    if p.suffix in {".yaml", ".yml"}:
        return p
    return params_dir() / f"{name_or_path}.yaml"


def available_profiles() -> list[str]:
    return sorted(p.stem for p in params_dir().glob("*.yaml"))


def _merged(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """``child`` over ``base``, section by section (nested mappings merge; anything else replaces), sharing no
    mapping or list with either: what the result's reader does to it leaves a grid cell's overrides as they were."""
    return _overlay(copy.deepcopy(base), copy.deepcopy(child))


def _overlay(out: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """``child`` written into ``out`` in place, nested mappings merged (both already private copies)."""
    for key, value in child.items():
        out[key] = _overlay(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def read_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    """A YAML file that must hold a mapping (profiles, grid files); ConfigError naming the file otherwise
    (``what`` completes "<path>: ..." when the top level is not a mapping)."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: {what}, got {type(data).__name__}")
    return data


def profile_data(name_or_path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A profile file's mapping, with ``extends: <profile>`` resolved: the named profile's settings
    first, this file's on top (so a larger profile can reuse a smaller one's world, models and
    warm start and change only what it scales up)."""
    path = profile_path(name_or_path)
    if not path.exists():
        raise ConfigError(f"no profile file {path}; available profiles: {available_profiles()}")
    if path.resolve() in _seen:
        raise ConfigError(f"{path}: 'extends' loops back to itself ({' -> '.join(p.stem for p in _seen)})")
    data = read_yaml_mapping(path, "a profile is a mapping of settings")
    base = data.pop("extends", None)
    if base is None:
        return data
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{path}: 'extends' names one profile, got {base!r}")
    return _merged(profile_data(base, (*_seen, path.resolve())), data)


def load_profile(name_or_path: str | Path = "demo", **overrides: Any) -> ProfileConfig:
    """Read a profile; keyword overrides replace top-level scalars (e.g. ``seed=3`` from papermill)."""
    path = profile_path(name_or_path)
    data = profile_data(name_or_path)
    for key, value in overrides.items():
        if value is not None:
            data[key] = value
    try:
        return from_dict(ProfileConfig, data)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from err


def extended_profile(name_or_path: str | Path, sections: dict[str, Any]) -> ProfileConfig:
    """The profile a file ``extends: <name_or_path>`` holding ``sections`` would load, built in memory (a grid
    cell's settings read without writing its profile file); ConfigError naming the base profile."""
    try:
        return from_dict(ProfileConfig, _merged(profile_data(name_or_path), sections))
    except ConfigError as err:
        raise ConfigError(f"{profile_path(name_or_path)} extended by {sorted(sections)}: {err}") from err


def papermill_parameters(name_or_path: str | Path) -> dict[str, Any]:
    """The top-level scalars of a profile (``extends`` resolved): what papermill injects into each notebook."""
    data = profile_data(name_or_path)
    return {k: v for k, v in data.items() if not isinstance(v, (dict, list))}
