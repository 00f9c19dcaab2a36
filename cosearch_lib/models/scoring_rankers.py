"""Saved scoring rankers, whatever their model: the cross-encoder (``models.cross_encoder``), the
LLM judge (``models.llm_judge``) and the listwise identifier-logit ranker (``models.listwise_logits``).
Each writes a marker file last; :func:`load_scoring_ranker` reads the folder by its marker, so the
trainer, its checkpoints and the evaluation harness load any of them the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cosearch_lib.models import cross_encoder, listwise_logits, llm_judge

#: marker file -> the class that loads a folder holding it
_LOADERS = {cross_encoder.MARKER: cross_encoder.CrossEncoderScorer, llm_judge.JUDGE_MARKER: llm_judge.LLMJudgeScorer,
            listwise_logits.LISTWISE_MARKER: listwise_logits.ListwiseLogitScorer}


def is_scoring_ranker_folder(folder: str | Path) -> bool:
    """Whether ``folder`` holds a complete saved scoring ranker (its marker file is there)."""
    return any((Path(folder) / marker).exists() for marker in _LOADERS)


def load_scoring_ranker(folder: str | Path) -> Any:
    """The scoring ranker saved in ``folder``; FileNotFoundError naming the markers when it holds none."""
    for marker, cls in _LOADERS.items():
        if (Path(folder) / marker).exists():
            return cls.load(folder)
    raise FileNotFoundError(f"{folder} holds no saved scoring ranker (none of {sorted(_LOADERS)})")


__all__ = ["is_scoring_ranker_folder", "load_scoring_ranker"]
