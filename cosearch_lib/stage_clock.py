"""Wall-clock time of the named stages of a piece of work (a training step: rollout, reward,
grouping, update, sync, validate), so every stage is timed one way and named once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class StageClock:
    """``with clock("rollout"): ...`` adds the block's seconds to stage "rollout"; :meth:`columns`
    gives them as ``{"rollout_s": ...}``. A stage entered twice adds up; stages may nest (an
    adapter's update inside the update stage)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        self.seconds.setdefault(stage, 0.0)  # columns in the order the stages start
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start

    def total(self, *stages: str) -> float:
        """Seconds of the named stages that ran, summed."""
        return sum(self.seconds.get(s, 0.0) for s in stages)

    def columns(self) -> dict[str, float]:
        """``{"<stage>_s": seconds}`` of every stage that ran, in the order they first ran."""
        return {f"{stage}_s": s for stage, s in self.seconds.items()}
