"""The retrieval contract shared by the in-process index, the HTTP client and the server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


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


@runtime_checkable
class SearchBackend(Protocol):
    """Anything with ``search(queries, topk) -> one ranked list of Passages per query``."""

    def search(self, queries: list[str], topk: int) -> list[list[Passage]]: ...
