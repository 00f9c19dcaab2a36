"""What a world is made of: the question families, the splits, the entity types, the generator's
version and the cache key of a written world (the generator's knobs are ``config.WorldConfig``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from cosearch_lib.config import WorldConfig

#: Bump when the generator's output changes, so cached worlds built by older code are rebuilt.
#: 2: incoming mentions (hard negatives), namesakes, indirect phrasings, longer passages.
GENERATOR_VERSION = 2
SPLITS = ("train", "dev", "test")
TYPES = ("country", "city", "person", "org", "work")


@dataclass(frozen=True)
class Family:
    name: str  # the ``data_source`` value of its rows
    group: str  # "single" or "multi" (the paper's grouped averages)
    mirrors: str  # ``data_source`` of the real benchmark it imitates
    description: str  # one line: what its questions look like


FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("syn_nq", "single", "nq", "one fact about a named entity, lower-case search-log style like NQ"),
    Family("syn_triviaqa", "single", "triviaqa", "the answer entity is described by clues instead of named"),
    Family("syn_popqa", "single", "popqa", "one fixed template per relation, PopQA style"),
    Family("syn_hotpotqa", "multi", "hotpotqa", "2-hop bridge questions plus some which-came-first comparisons"),
    Family("syn_2wiki", "multi", "2wikimultihopqa", "comparisons, balanced yes/no questions and 2-hop compositions"),
    Family("syn_musique", "multi", "musique", "3-hop compositional chains"),
    Family("syn_bamboogle", "multi", "bamboogle", "2-hop compositions with indirect, fronted phrasing"),
]}


def world_fingerprint(cfg: WorldConfig) -> str:
    """Stable hash of the config and generator version: the cache key of a written world."""
    blob = json.dumps({"config": asdict(cfg), "generator_version": GENERATOR_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
