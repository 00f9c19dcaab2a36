"""Which evaluation the policies of a training method get: the harness method of its spec
(``config.methods.MethodSpec.eval_method``) and the ``HarnessConfig`` adapter fields that load its
policies, from the adapters at hand (names loaded in a model, or checkpoint folders).

The trainer's validation and ``experiment.evaluate_before_after`` both evaluate through this, so a
method is evaluated one way wherever it is evaluated."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cosearch_lib.config.methods import MethodSpec
from cosearch_lib.paths import path_text
from cosearch_lib.run_schema import SCORER_SLOT


def policy_eval_settings(spec: MethodSpec, adapters: Mapping[str, str | Path | None],
                         fixed_ranker: str | Path | None = None) -> dict[str, Any]:
    """``HarnessConfig`` fields (``methods`` and the adapter fields) that evaluate ``spec``'s policies.

    ``adapters`` maps "agent", "ranker", "shared" (one adapter playing both roles) and
    ``run_schema.SCORER_SLOT`` (a scoring ranker, whatever its kind; its value may be None when the
    harness context holds the live scorer) to what the harness loads. A method that trains its ranker is evaluated with
    that ranker, or, when there is none (before GRPO, without a warm start), with the base model
    prompted as a fixed ranker; a method whose ranker stays frozen gets ``adapters["ranker"]``, else
    ``fixed_ranker`` (the warm start it started from)."""
    agent = adapters.get("agent", adapters.get("shared"))
    if agent is None and adapters:
        raise ValueError(f"no agent adapter among {sorted(adapters)}")
    fields: dict[str, Any] = {"methods": (spec.eval_method,), "agent_adapter": path_text(agent)}
    if not spec.has_ranker_policy:
        return fields
    if SCORER_SLOT in adapters:  # a scoring ranker is the ranker policy
        return {**fields, "methods": ("agent_scorer",), "scorer_model": path_text(adapters[SCORER_SLOT])}
    if spec.trains_ranker:
        fields["trained_ranker_adapter"] = path_text(adapters.get("ranker", adapters.get("shared")))
        if fields["trained_ranker_adapter"] is None:
            fields["methods"] = ("agent_fixed_ranker",)
    else:
        fields["fixed_ranker_adapter"] = path_text(adapters.get("ranker") or fixed_ranker)
    return fields
