"""The passage record every stage passes around, and the ``contents`` convention of wiki-18 rows
(a quoted title line, then the text).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Passage:
    """One corpus row as the wiki-18 format stores it, plus the retriever's score.

    ``contents`` is the raw row: a quoted title line, a newline, then the text.
    """

    id: str
    contents: str
    score: float = 0.0

    @property
    def title(self) -> str:
        return split_contents(self.contents)[0]

    @property
    def text(self) -> str:
        return split_contents(self.contents)[1]

    def to_document(self) -> dict:
        """The ``document`` object of Search-R1's retrieval protocol."""
        return {"id": self.id, "contents": self.contents}


def split_contents(contents: str) -> tuple[str, str]:
    """``'"Title"\\ntext'`` -> ``("Title", "text")``; a row without a title line has title ``""``."""
    head, sep, rest = contents.partition("\n")
    if not sep:
        return "", contents
    return head.strip().strip('"'), rest


def make_contents(title: str, text: str) -> str:
    """The inverse of :func:`split_contents`: the wiki-18 ``contents`` field."""
    return f'"{title}"\n{text}'
