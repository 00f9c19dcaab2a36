"""The ``POST /retrieve`` protocol of the retrieval server (Search-R1's, see ``retrieval.http_server``):
request validation into a :class:`RetrieveRequest`, the JSON error type, and the response body.

Plain functions of request bodies and passages, with no server in them, so the protocol can be
tested (and fuzzed) without a socket."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from cosearch_lib.config import ServerConfig
from cosearch_lib.data.passage import Passage

# --------------------------------------------------------------------------------------- errors


class RequestError(Exception):
    """A request the server refuses; rendered as ``{"error": {"code", "message", "field"}}``."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field

    def payload(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "field": self.field}}


class BackendFailure(Exception):
    """backend.search raised or returned something that is not one list per query."""


def invalid_field(code: str, message: str, field: str | None) -> RequestError:
    return RequestError(422, code, message, field)


# ----------------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class RetrieveRequest:
    """A validated ``/retrieve`` body."""

    queries: list[str]  # the query strings, as sent
    topk: int  # passages per query
    return_scores: bool  # wrap documents as {"document", "score"} (true) or send bare documents


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def parse_body(raw: bytes) -> dict[str, Any]:
    """Bytes -> JSON object; 400 if it is not JSON, 422 if it is JSON but not an object."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise RequestError(400, "invalid_json", f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise invalid_field("wrong_type", f"request body must be a JSON object, got {_type_name(body)}",
                       None)
    return body


def _check_queries(value: Any, cfg: ServerConfig) -> list[str]:
    if value is None:
        raise invalid_field("missing_field", "'queries' is required: a list of query strings", "queries")
    if not isinstance(value, list):
        raise invalid_field("wrong_type", f"'queries' must be a list of strings, got "
                       f"{_type_name(value)}", "queries")
    if not value:
        raise invalid_field("empty_value", "'queries' must contain at least one query", "queries")
    if len(value) > cfg.max_queries_per_request:
        raise invalid_field("too_many_queries", f"{len(value)} queries in one request; the limit is "
                       f"{cfg.max_queries_per_request}", "queries")
    for i, query in enumerate(value):
        where = f"queries[{i}]"
        if not isinstance(query, str):
            raise invalid_field("wrong_type", f"{where} must be a string, got {_type_name(query)}",
                           where)
        if not query.strip():
            raise invalid_field("empty_value", f"{where} is empty or whitespace", where)
        if len(query) > cfg.max_query_chars:
            raise invalid_field("too_long", f"{where} has {len(query)} characters; the limit is "
                           f"{cfg.max_query_chars}", where)
    return value


def _check_topk(value: Any, default: int, max_topk: int, corpus_size: int | None) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid_field("wrong_type", f"'topk' must be an integer, got {_type_name(value)} "
                       f"{value!r}", "topk")
    if not 1 <= value <= max_topk:
        bound = f" (corpus has {corpus_size} passages)" if corpus_size == max_topk else ""
        raise invalid_field("out_of_range", f"'topk' must be in 1..{max_topk}{bound}, got {value}",
                       "topk")
    return value


def validate_request(body: dict[str, Any], cfg: ServerConfig,
                     corpus_size: int | None = None) -> RetrieveRequest:
    """Check every field of a ``/retrieve`` body; unknown fields are ignored on purpose."""
    queries = _check_queries(body.get("queries"), cfg)
    max_topk = min(cfg.max_topk, corpus_size) if corpus_size else cfg.max_topk
    topk = _check_topk(body.get("topk"), min(cfg.default_topk, max_topk), max_topk, corpus_size)
    scores = body.get("return_scores", False)
    if not isinstance(scores, bool):
        raise invalid_field("wrong_type", f"'return_scores' must be true or false, got "
                       f"{_type_name(scores)} {scores!r}", "return_scores")
    return RetrieveRequest(queries=queries, topk=topk, return_scores=scores)


# ---------------------------------------------------------------------------------- formatting


def _json_score(score: Any) -> float | None:
    """JSON has no NaN/inf (FAISS pads missing hits with -inf-like values): send null instead."""
    value = float(score)
    return value if math.isfinite(value) else None


def format_result(ranked: list[list[Passage]], return_scores: bool) -> dict[str, Any]:
    """Search-R1's response body (see module docstring for both shapes)."""
    if return_scores:
        result = [[{"document": p.to_document(), "score": _json_score(p.score)} for p in row]
                  for row in ranked]
    else:
        result = [[p.to_document() for p in row] for row in ranked]
    return {"result": result}


def format_or_fail(ranked: list[list[Passage]], return_scores: bool) -> dict[str, Any]:
    try:
        return format_result(ranked, return_scores)
    except (AttributeError, TypeError, ValueError) as exc:
        raise BackendFailure(f"backend.search must return lists of Passage: {exc}") from None
