"""Adapters served to a generation engine that reads LoRA weights from disk (vLLM): the policy set's
adapters saved and registered with the engine, and the training step whose weights it serves."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cosearch_lib.models.lora_policies import PolicySet


def sync_adapters(policies: PolicySet, backend: Any, folder: str | Path,
                  adapters: Iterable[str] | None = None) -> dict[str, Path]:
    """Save ``adapters`` (default: every adapter that plays a role) under ``folder/<adapter>/`` and
    register each with ``backend.add_adapter(name, path)``, so a generation engine that reads LoRA
    weights from disk (vLLM) samples with the current weights. Returns {adapter: folder}.

    vLLM caches adapter weights by integer id; :meth:`models.generation.vllm_backend.VLLMBackend.add_adapter` hands out
    a fresh id on every registration, so re-registering after each update makes it reload them."""
    names = list(dict.fromkeys(a for a in policies.roles.values() if a)) if adapters is None else list(adapters)
    if not names:
        return {}
    paths = policies.save_adapters(folder, names)
    for name, path in paths.items():
        backend.add_adapter(name, str(path))
    return paths


class ServedAdapters:
    """What a generation engine that reads LoRA weights from disk (vLLM: it has ``add_adapter``) serves,
    and the training step whose weights those are; a trainer's one place for it.

    ``serve(step)`` saves and registers the adapters (:func:`sync_adapters`) unless the engine already
    serves that step's weights (its first generation; after a restore, :meth:`forget`); ``push(step)``
    does it after an update, always. A backend without ``add_adapter`` generates with the trainer's own
    model: ``enabled`` is False and nothing is written."""

    def __init__(self, policies: PolicySet, backend: Any, folder: str | Path,
                 adapters: Iterable[str] | None = None) -> None:
        self.policies, self.backend, self.folder = policies, backend, Path(folder)
        self.adapters = None if adapters is None else list(adapters)  # None: every adapter that plays a role
        self.enabled = callable(getattr(backend, "add_adapter", None))
        self.step: int | None = None  # the step whose weights the engine serves (None: none yet)

    def serve(self, step: int) -> None:
        """The engine serves the adapters as they are at ``step`` (registered now unless it already does)."""
        if self.enabled and self.step != step:
            sync_adapters(self.policies, self.backend, self.folder, self.adapters)
            self.step = step

    def push(self, step: int, adapters: Iterable[str] | None = None) -> None:
        """After an update: ``adapters`` (default: those served) registered again, now the weights of ``step``."""
        if self.enabled:
            sync_adapters(self.policies, self.backend, self.folder, self.adapters if adapters is None else adapters)
            self.step = step

    def forget(self) -> None:
        """The weights changed outside an update (a checkpoint restored): the next ``serve`` registers them."""
        self.step = None
