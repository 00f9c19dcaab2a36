"""The rollout stage's output, and the update job of each trained role from it.

A :class:`StepBatch` holds the whole step's trajectories (G per question, questions in step
order: in data parallel, every rank's after the exchange) and which of them this rank rolled out
itself. The reward and grouping stages read the whole batch; an update trains on the rank's own
rows only (:func:`role_job`), with their positions in the whole batch so that the gradient and the
statistics summed over ranks are those of one process. In one process every row is local.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cosearch_lib.agent.rollout import Trajectory
from cosearch_lib.rl.policy_sequences import agent_sequences, ranker_sequences
from cosearch_lib.rl.policy_update import UpdateJob
from cosearch_lib.rl.step_scoring import StepGroups, StepRewards

#: The roles a step can train, in the order their jobs join an adapter's update.
TRAINED_ROLES = ("agent", "ranker")


@dataclass(frozen=True)
class StepBatch:
    """One step's trajectories and the positions of this rank's own among them."""

    trajectories: Sequence[Trajectory]  # the whole step's, G per question, in step order
    local: tuple[int, ...]  # positions (into ``trajectories``) of the rows this rank rolled out

    def local_calls(self) -> list[int]:
        """Positions, in the step's call order (trajectory by trajectory, turn by turn), of the
        search calls this rank's trajectories made."""
        owned = set(self.local)
        call_rows = [i for i, t in enumerate(self.trajectories) for _ in t.ranker_calls]
        return [c for c, i in enumerate(call_rows) if i in owned]


def role_job(role: str, batch: StepBatch, rewards: StepRewards, groups: StepGroups, temperature: float) -> UpdateJob:
    """What ``role`` contributes to its adapter's update: the sequences of this rank's rows (the
    agent's trajectories, or the ranker's calls in them), their advantages, the temperature they
    were sampled at, and their positions in the step."""
    if role == "agent":
        rows = list(batch.local)
        return UpdateJob("agent", agent_sequences([rewards.trajectories[i] for i in rows]),
                         [groups.agent_advantages[i] for i in rows], temperature, positions=rows)
    if role == "ranker":
        rows = batch.local_calls()
        return UpdateJob("ranker", ranker_sequences([rewards.calls[i] for i in rows]),
                         [groups.ranker_advantages[i] for i in rows], temperature, positions=rows,
                         trained=[groups.call_groups[i] >= 0 for i in rows])  # a dropped call: no KL term either
    raise ValueError(f"unknown role {role!r}; expected one of {TRAINED_ROLES}")
