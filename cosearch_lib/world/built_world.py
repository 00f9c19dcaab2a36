"""The World record: everything one generation produced, in memory (``io`` writes it to disk)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from cosearch_lib.config import WorldConfig
from cosearch_lib.world.entities import Entity


@dataclass
class World:
    config: WorldConfig  # what generated it
    passages: list[dict]  # corpus rows {"id", "contents"}, ids "0".."n-1" in row order
    questions: dict[str, list[dict]]  # split -> Search-R1 rows
    entities: dict[str, Entity]  # id -> entity with its facts
    passage_meta: list[dict] = field(default_factory=list)  # per passage: entity, kind, section, stated facts, mentions
    fact_passages: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # fact -> ids of passages stating it
    question_meta: dict[str, dict] = field(default_factory=dict)  # question id -> {"facts", "anchors"} (leakage checks)
    near_names: list[tuple[str, str]] = field(default_factory=list)  # confusable (original, near-name) entity id pairs
    namesakes: list[tuple[str, str]] = field(default_factory=list)  # (earlier, later) people sharing an exact name

    def clue_counts(self, etype: str, rels: tuple[str, ...]) -> Counter:
        """How many entities of a type share each combination of attribute values (cached)."""
        cache = self.__dict__.setdefault("_clue_cache", {})
        if (etype, rels) not in cache:
            cache[(etype, rels)] = Counter(tuple(e.attrs.get(r) for r in rels) + (e.info.get("kind"),)
                                           for e in self.entities.values() if e.type == etype)
        return cache[(etype, rels)]
