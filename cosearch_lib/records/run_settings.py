"""What a notebook shows of its settings: a short table of what matters for the run.

The full configuration is long (every dataclass, the rule set repeated in each nested config) and
lives in the run records (``*.run.json``, checkpoints' ``config.json``). A reader of a notebook needs
the dozen settings that decide what the numbers mean: methods, steps, G, N/K, the rule set,
learning rates, the models. :func:`training_settings` (notebook 03) and :func:`evaluation_settings`
(notebook 02) give them as a two-column table.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from cosearch_lib.config import ProfileConfig
from cosearch_lib.eval.harness import HarnessConfig


def profile_scope(cfg: ProfileConfig) -> str:
    """One Markdown sentence pair: what the profile's runs can show and what they cannot (its
    ``scope`` section), stated under every notebook's parameters."""
    scope = cfg.scope
    if not scope.shows and not scope.cannot_show:
        return f"**Profile `{cfg.profile}`**: its YAML states no `scope:` (what its runs can and cannot show)."
    parts = [f"**Profile `{cfg.profile}`** can show {scope.shows}." if scope.shows else f"**Profile `{cfg.profile}`**."]
    if scope.cannot_show:
        parts.append(f"It cannot show {scope.cannot_show}.")
    return " ".join(parts)


def _table(rows: Sequence[tuple[str, object]]) -> pd.DataFrame:
    return pd.DataFrame({"value": [str(v) for _, v in rows]}, index=pd.Index([k for k, _ in rows], name="setting"))


def _shared(cfg: ProfileConfig) -> list[tuple[str, object]]:
    s, m = cfg.search, cfg.models
    models = m.agent if m.agent == m.ranker else f"agent {m.agent}, ranker {m.ranker}"
    return [("profile, seed", f"{cfg.profile}, {cfg.seed}"), ("models", f"{models} ({m.backend})"),
            ("N candidates / K shown / search cap", f"{s.topn} / {s.topk} / {s.max_searches}"),
            ("rule set", cfg.rules)]


def training_settings(cfg: ProfileConfig, methods: Sequence[str], *, steps: int | None = None) -> pd.DataFrame:
    """Notebook 03's settings: the methods and the GRPO budget they share."""
    t, ro = cfg.training, cfg.rollout
    validation = (f"{t.val_per_dataset} questions per family every {t.eval_every} steps"
                  + (" and before the first" if t.validate_at_start else "")) if t.eval_every else "off"
    rows = [("methods", ", ".join(methods)), *_shared(cfg),
            ("GRPO steps x questions x G", f"{steps or t.steps} x {t.questions_per_step} x {t.group_size}"),
            ("learning rate agent / ranker", f"{t.agent_lr:g} / {t.ranker_lr:g}"),
            ("sampling temperature", ro.temperature), ("KL weight", f"{t.grpo.kl_coef:g}" + (" toward the start" if t.grpo.start_reference else "")),
            ("grouping", f"{t.grouping.mode}, k_min {t.grouping.k_min}"),
            ("validation", validation), ("test questions per family", cfg.evaluation.n_per_dataset)]
    if cfg.relevance.enabled:
        rows.append(("Fixed Ranker", f"relevance-trained, {cfg.relevance.steps} steps"))
    return _table(rows)


def evaluation_settings(cfg: ProfileConfig, harness: HarnessConfig) -> pd.DataFrame:
    """Notebook 02's settings: the methods, the questions and how answers are scored."""
    rows = [("methods", ", ".join(harness.methods)), *_shared(cfg),
            ("split, questions per family", f"{harness.split}, {harness.n_per_dataset or 'all'}"),
            ("decoding", "greedy" if harness.temperature == 0 else f"temperature {harness.temperature}"),
            ("answer F1", harness.f1), ("baseline replies", harness.baseline_reply),
            ("tokens per agent turn / ranking", f"{harness.agent_max_new_tokens} / {harness.ranker_max_new_tokens}"),
            ("precision", "bf16 weights (evaluation.bf16_weights)" if harness.bf16 else "float32")]
    return _table(rows)
