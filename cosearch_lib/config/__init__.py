"""Every setting of the workbook, as typed dataclasses, and the profiles that fill them.

A profile is one YAML file under ``papermill_runs/params/``; its sections map onto the dataclasses
re-exported here (``world:`` -> :class:`WorldConfig`, ``search:`` -> :class:`SearchBudget`, ...).
Each field has its default and a one-line doc; a profile only states what differs. Unknown keys
are errors, so a typo cannot quietly run the default; a bad value is a :class:`ConfigError` naming
the key, the value and what is allowed. The top-level scalars (``profile``, ``seed``) are also the
papermill parameters of every notebook; ``notebooks:`` holds per-notebook parameters.

This package is the bottom layer of the library: it imports nothing heavier than PyYAML (no torch,
no fastapi), so loading a profile is cheap and every layer can depend on it. Its modules follow the
data flow of the method (docs/ARCHITECTURE.md):

* :mod:`~cosearch_lib.config.checks` -- :class:`ConfigError` and the checks every section runs;
* :mod:`~cosearch_lib.config.rules` -- the rule sets (paper or released code);
* :mod:`~cosearch_lib.config.world` -- the embedded world and real data files;
* :mod:`~cosearch_lib.config.retrieval` -- the search budget, encoder, index and server;
* :mod:`~cosearch_lib.config.generation` -- models, sampling, LoRA, prompt protocol, rollout;
* :mod:`~cosearch_lib.config.grpo` -- what GRPO optimises: agent and ranker rewards, grouping, the loss;
* :mod:`~cosearch_lib.config.methods` -- the training methods, each a named record (:func:`method_spec`);
* :mod:`~cosearch_lib.config.training` -- roles, the training run, the warm start;
* :mod:`~cosearch_lib.config.profile` -- :class:`ProfileConfig` and loading a profile file.
"""

from cosearch_lib.config.checks import (
    ConfigError,
    Fields,
    check_bool,
    check_choice,
    check_int,
    check_number,
    check_str,
    invalid,
)
from cosearch_lib.config.generation import (
    AGENT_STOPS,
    BACKEND_KINDS,
    OBSERVATION_CLOSE,
    OBSERVATION_OPEN,
    TRAIN_BACKENDS,
    LoraSettings,
    ModelsConfig,
    ProtocolConfig,
    RolloutConfig,
    SamplingConfig,
)
from cosearch_lib.config.grpo import (
    AGGREGATIONS,
    KL_REFERENCES,
    MICRO_BATCHED_AGGREGATIONS,
    OLD_LOGPROBS,
    PAPER_HIT_KS,
    AgentRewardConfig,
    GroupingConfig,
    GRPOConfig,
    RankerRewardConfig,
)
from cosearch_lib.config.methods import METHODS, TRAINING_METHODS, MethodSpec, RankedBy, method_rows, method_spec
from cosearch_lib.config.profile import (
    BASELINE_REPLIES,
    EVAL_F1_METRICS,
    EvaluationConfig,
    GridsConfig,
    ProfileConfig,
    ScopeConfig,
    SlurmConfig,
    available_profiles,
    extended_profile,
    from_dict,
    load_profile,
    papermill_parameters,
    profile_data,
    profile_path,
    read_yaml_mapping,
)
from cosearch_lib.config.ranker_kinds import RANKER_KINDS, SCORING_RANKER_KINDS, RankerKind, ranker_kind
from cosearch_lib.config.retrieval import EncoderConfig, RetrievalConfig, SearchBudget, ServerConfig
from cosearch_lib.config.rules import PAPER_RULES, RULE_OPTIONS, RULE_SETS, RuleSet, check_same_rules, rule_set
from cosearch_lib.config.training import (
    TRACKER_KINDS,
    AutocastConfig,
    CrossEncoderConfig,
    LLMJudgeConfig,
    RelevanceConfig,
    TrainConfig,
    UpdateSettings,
    WarmStartConfig,
    check_kinds,
)
from cosearch_lib.config.world import DataConfig, WorldConfig

__all__ = [
    "PAPER_HIT_KS",
    "AGENT_STOPS", "AGGREGATIONS", "MICRO_BATCHED_AGGREGATIONS", "BASELINE_REPLIES", "BACKEND_KINDS", "EVAL_F1_METRICS", "OBSERVATION_CLOSE", "OBSERVATION_OPEN", "KL_REFERENCES", "OLD_LOGPROBS",
    "METHODS", "PAPER_RULES", "RANKER_KINDS", "RankerKind", "ranker_kind", "SCORING_RANKER_KINDS", "RULE_OPTIONS", "RULE_SETS", "TRACKER_KINDS", "TRAINING_METHODS",
    "TRAIN_BACKENDS", "AgentRewardConfig", "AutocastConfig", "ConfigError", "CrossEncoderConfig", "DataConfig", "EncoderConfig",
    "EvaluationConfig", "Fields", "MethodSpec", "RankedBy", "GRPOConfig", "GridsConfig", "GroupingConfig", "LLMJudgeConfig", "LoraSettings", "ModelsConfig",
    "ProfileConfig", "ProtocolConfig", "RankerRewardConfig", "RelevanceConfig", "RetrievalConfig", "RolloutConfig", "RuleSet",
    "SamplingConfig", "SearchBudget", "ServerConfig", "ScopeConfig", "SlurmConfig", "TrainConfig", "UpdateSettings", "WarmStartConfig",
    "WorldConfig", "available_profiles", "extended_profile", "check_bool", "check_choice", "check_int", "check_kinds", "check_number",
    "check_same_rules", "check_str", "from_dict", "invalid", "load_profile", "method_rows", "method_spec", "papermill_parameters",
    "profile_data", "profile_path", "read_yaml_mapping", "rule_set",
]
