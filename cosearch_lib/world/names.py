"""Made-up names: pronounceable words for people, places and organisations, and work titles.

Every generated word is unique world-wide (case-insensitive) and never a word the templates print,
so an answer string cannot match unrelated text in answer-containment checks. The exceptions are
deliberate: near-names ("Venn" / "Vennor") and namesakes (two people called "Aldric Venn").
"""

from __future__ import annotations

import random
import re

TITLE_ADJ = ("Glass Silent Hollow Crimson Distant Paper Iron Quiet Amber Broken Northern Burning Gentle "
             "Patient Silver Restless Forgotten Velvet Copper Seventh Narrow Wandering Painted Borrowed "
             "Sleeping Drowned Hidden Bright Last Lonely Salt Winter").split()
TITLE_NOUN = ("Orchard Lantern Harbour Cartographer Mirror Garden River Tower Letter Island Bell Compass "
              "Archive Meadow Furnace Lighthouse Ferry Clockmaker Weaver Violin Shore Forest Bridge Window "
              "Kingdom Ember Thread Anchor Orchid Falcon Atlas Cellar Quarry Tide Season Harvest Voyage "
              "Signal Chorus Lake").split()

_ONSETS = "b br c d dr f g gr h k kr l m n p r s st t th tr v w z j sh".split() + ["", ""]
_VOWELS = "a e i o u a e i o a e o y ae ei ou".split()
_CODAS = "n r l s th nd rk m v ll rn".split() + ["", "", ""]
_BAD_CLUSTER = re.compile(r"(.)\1\1|[aeiou]{3}|[^aeiou]{4}|^[^aeiou]{3}")


def article(word: str) -> str:
    return ("an " if word[0].lower() in "aeiou" else "a ") + word


def article_year(year: int) -> str:
    """Indefinite article for a year: "an 1843 novel" (eighteen...) but "a 1921 novel"."""
    return ("an " if str(year).startswith(("8", "11", "18")) else "a ") + str(year)


class Namer:
    """Pronounceable made-up words, unique world-wide (case-insensitive) and never a word the
    templates use, so a name cannot match unrelated text in answer-containment checks."""

    def __init__(self, rng: random.Random, blocked: set[str]):
        self.rng, self.used = rng, set(blocked)

    def claim(self, word: str) -> bool:
        if word.lower() in self.used:
            return False
        self.used.add(word.lower())
        return True

    def fresh(self, syllables: tuple[int, ...] = (2,), suffixes: tuple[str, ...] = ("",), max_len: int = 10) -> str:
        r = self.rng
        for _ in range(100_000):
            n = r.choice(syllables)
            w = "".join(r.choice(_ONSETS) + r.choice(_VOWELS) + (r.choice(_CODAS) if i == n - 1 or r.random() < 0.3 else "")
                        for i in range(n)) + r.choice(suffixes)
            if 5 <= len(w) <= max_len and not _BAD_CLUSTER.search(w) and self.claim(w):
                return w.capitalize()
        raise RuntimeError("name space exhausted; lower the entity counts")

    def near(self, word: str) -> str | None:
        """A confusable variant of ``word`` (extra ending or one vowel changed), if still free."""
        opts = [word + s for s in ("or", "a", "en", "e", "s")]
        for i, ch in enumerate(word):
            if ch in "aeiou":
                opts += [word[:i] + v + word[i + 1:] for v in "aeiou" if v != ch]
                break
        self.rng.shuffle(opts)
        return next((o for o in opts if self.claim(o)), None)


def make_title(rng: random.Random, namer: Namer, used: set[str]) -> str:
    """A made-up work title from English words (or one invented place), unique in the world."""
    for _ in range(10_000):
        adj, noun, noun2 = rng.choice(TITLE_ADJ), rng.choice(TITLE_NOUN), rng.choice(TITLE_NOUN)
        pattern = rng.randrange(5)
        if pattern == 2:
            t = f"The {noun} of {namer.fresh((2,))}"
        else:
            art = "An" if noun[0] in "AEIOU" else "A"
            t = [f"The {adj} {noun}", f"{adj} {noun}", "", f"{noun} and {noun2}",
                 f"{art} {noun} for the {adj} {noun2}"][pattern]
        if noun != noun2 and t.lower() not in used:
            used.add(t.lower())
            return t
    raise RuntimeError("title space exhausted; lower n_works")



def near_title(rng: random.Random, base: str, used: set[str]) -> str | None:
    """A confusable variant of an earlier title, one English word swapped ("The Silent Orchard"
    for "The Glass Orchard"), if one is still free."""
    words = base.split()
    slots = [i for i, w in enumerate(words) if (w in TITLE_ADJ or w in TITLE_NOUN) and (i == 0 or words[i - 1] not in ("A", "An"))]
    for _ in range(20 if slots else 0):
        i = rng.choice(slots)
        new = list(words)
        new[i] = rng.choice(TITLE_ADJ if words[i] in TITLE_ADJ else TITLE_NOUN)
        t = " ".join(new)
        if t.lower() not in used and len(set(new)) == len(new):
            used.add(t.lower())
            return t
    return None
