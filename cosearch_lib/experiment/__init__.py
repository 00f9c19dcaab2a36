"""The one place that wires a profile into running objects, in three modules, one job each:

* ``experiment.building``: profile -> retriever, generation backends, the harness's settings and context;
* ``experiment.cached_starts``: where each policy starts (warm start, the Fixed Ranker of each ranker
  kind, the scoring rankers), trained on first use and cached by its settings;
* ``experiment.method_runs``: the trainer of a method, training methods in turn, and evaluating
  trained policies (before/after GRPO, the hop-level ceiling).

Notebooks, benchmarks and the CLI import what they need from here; every layer below takes explicit
settings objects and never reads a profile itself.
"""

from cosearch_lib.experiment.building import (
    build_backends,
    build_retriever,
    harness_config,
    harness_context,
    resolve_profile,
    search_backend,
    vllm_options,
)
from cosearch_lib.experiment.cached_starts import (
    FIXED_RANKER_METHODS,
    LLM_JUDGE_VERSION,
    RANKER_STARTS,
    RELEVANCE_VERSION,
    RankerStart,
    cross_encoder_dir,
    cross_encoder_start,
    fixed_ranker,
    fixed_ranker_cached,
    held_out_ranker_rows,
    llm_judge_dir,
    llm_judge_start,
    method_starts,
    policy_starts,
    relevance_dir,
    relevance_held_out,
    relevance_ranker,
    warm_roles,
    warm_start,
    warmstart_dir,
)
from cosearch_lib.experiment.method_runs import (
    BEFORE_AFTER_LABELS,
    HOP_ORACLE_LABEL,
    ORACLE_GAP_LABEL,
    POLICY_SOURCES,
    before_after_pairs,
    build_trainer,
    evaluate_before_after,
    evaluate_hop_oracle,
    evaluate_policies,
    oracle_gap_config,
    policy_adapters,
    reads_fixed_ranker,
    train_methods,
    trained_eval_settings,
    with_policies,
)

__all__ = ["BEFORE_AFTER_LABELS", "FIXED_RANKER_METHODS", "HOP_ORACLE_LABEL", "LLM_JUDGE_VERSION", "ORACLE_GAP_LABEL", "POLICY_SOURCES",
           "RELEVANCE_VERSION", "before_after_pairs", "build_backends", "build_retriever", "build_trainer", "search_backend",
           "cross_encoder_dir", "cross_encoder_start", "evaluate_before_after", "evaluate_hop_oracle", "evaluate_policies", "fixed_ranker",
           "RANKER_STARTS", "RankerStart", "fixed_ranker_cached", "harness_config",
           "harness_context", "held_out_ranker_rows", "llm_judge_dir", "llm_judge_start", "method_starts",
           "oracle_gap_config", "policy_adapters", "policy_starts", "relevance_dir", "relevance_held_out", "relevance_ranker",
           "reads_fixed_ranker", "resolve_profile", "train_methods", "trained_eval_settings",
           "vllm_options", "warm_roles", "warm_start", "warmstart_dir", "with_policies"]
