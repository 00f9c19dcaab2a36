"""Rule sets: where the paper's equations and the authors' released code differ, one named option each.

The profile's top-level ``rules:`` picks one of :data:`RULE_SETS`; the configs that read it
(:class:`~cosearch_lib.config.RolloutConfig`, :class:`~cosearch_lib.config.TrainConfig` and the
reward and grouping configs inside it) receive that one object when they are built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cosearch_lib.config.checks import ConfigError, check_choice

#: Where the paper's equations and the authors' released code differ, one named option each
#: (docs/METHOD.md, "Rule sets", has an example input per option). The profile's top-level
#: ``rules:`` picks one of :data:`RULE_SETS`; every stage reads the same object.
RULE_OPTIONS: dict[str, tuple[str, str]] = {
    "f1_arithmetic": ("overlap", "precision_recall"),
    "trivial_golds": ("drop_each", "drop_if_all"),
    "ranker_output": ("strict", "released"),
    "agent_format": ("strict", "released"),
    "dedupe_key": ("ranking", "rerank_text"),
    "zero_variance": ("tolerance", "exact"),
    "empty_subqueries": ("apart", "together"),
    "reward_dtype": ("float64", "float32"),
}


@dataclass(frozen=True)
class RuleSet:
    """One value per :data:`RULE_OPTIONS` entry; the first value of each is the paper's (the default)."""

    name: str = "paper"  # "paper" or "released", or "custom" for a mix
    f1_arithmetic: str = "overlap"  # token F1 as 2*overlap/(|pred|+|gold|) (exact at 0.8), or P, R then 2PR/(P+R) in floats (release)
    trivial_golds: str = "drop_each"  # pseudo-relevance: drop every gold normalising to yes/no/true/false, or none unless all are trivial by lower+strip (release)
    ranker_output: str = "strict"  # ranker validity: the strict tag protocol, or the release's (one reason block; only what follows the last </reason> is checked)
    agent_format: str = "strict"  # Eq. 4's format verdict: the strict protocol, or the release's tag counts and order (no check of extra text, JSON or tool name)
    dedupe_key: str = "ranking"  # duplicate ranker outputs (dedupe on): same prompt and parsed ranking, or same prompt and raw <rerank> text (release)
    zero_variance: str = "tolerance"  # a group is flat when its rewards differ by <= 1e-9, or when they are equal floats (release)
    empty_subqueries: str = "apart"  # exact-match grouping: empty sub-queries each alone, or all in one group (release)
    reward_dtype: str = "float64"  # rewards enter the advantages as float64, or rounded to float32 first (release stores scores as float32)

    def __post_init__(self) -> None:
        for option, allowed in RULE_OPTIONS.items():
            check_choice(f"rules.{option}", getattr(self, option), allowed)

    @property
    def released(self) -> bool:
        return self.name == "released"


RULE_SETS: dict[str, RuleSet] = {
    "paper": RuleSet(),
    "released": RuleSet("released", **{option: allowed[1] for option, allowed in RULE_OPTIONS.items()}),
}

#: The default rule set of a config built alone (the paper's).
PAPER_RULES = RULE_SETS["paper"]


def rule_set(name: str | RuleSet) -> RuleSet:
    """The rule set called ``name`` ("paper" or "released"); a RuleSet is returned as it is."""
    if isinstance(name, RuleSet):
        return name
    check_choice("rules", name, sorted(RULE_SETS))
    return RULE_SETS[name]


def _label(rules: RuleSet) -> str:
    return repr(rules.name) if RULE_SETS.get(rules.name) == rules else repr(rules)


def check_same_rules(key: str, given: Any, expected: RuleSet, owner: str) -> None:
    """A nested config's rule set (``key``, e.g. ``training.grouping.rules``) is the one of the config
    that holds it (``owner``); a config cannot run two rule sets at once."""
    if given != expected:
        raise ConfigError(f"{key} must be {owner}'s rule set {_label(expected)}, got {_label(given)}; build the "
                          f"nested config with rules={expected.name!r} (or leave it out: {owner} then builds it)")
