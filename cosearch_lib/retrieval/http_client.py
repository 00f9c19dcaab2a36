"""``HttpRetriever``: the in-process ``Retriever.search`` contract, answered by a remote server.

Rollout code takes any ``SearchBackend``; swapping the local index for this client (for the 62 GB
wiki-18 index on another node) changes nothing else. It speaks Search-R1's ``POST /retrieve``
protocol, so it also works against Search-R1's own ``retrieval_server.py``.
"""

from __future__ import annotations

import math
import time
from typing import Any

import httpx

from cosearch_lib.data.passage import Passage

_FALLBACK_CHUNK = 64  # queries per POST when the server does not publish its limit


class RetrievalServerError(RuntimeError):
    """The server answered with an error (its JSON ``error`` object is kept on the exception)."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None,
                 field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.field = status, code, field


class RetrievalServerUnavailable(RetrievalServerError):
    """The server could not be reached (or kept answering 503) after every retry."""


def base_url(url: str) -> str:
    """Accept ``http://host:port``, with or without a trailing ``/`` or ``/retrieve``."""
    url = url.strip().rstrip("/")
    if url.endswith("/retrieve"):
        url = url[: -len("/retrieve")]
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"retrieval server url must start with http:// or https://, got {url!r}")
    return url


def _parse_hit(item: Any, with_score: bool) -> Passage:
    """One hit in either shape: ``{"document": {...}, "score": s}`` or a bare document."""
    doc = item.get("document", item) if isinstance(item, dict) else None
    if not isinstance(doc, dict) or "contents" not in doc:
        raise RetrievalServerError(f"malformed hit in server response: {item!r:.200}")
    score = item.get("score") if with_score else None
    value = float(score) if score is not None else (math.nan if with_score else 0.0)
    return Passage(id=str(doc.get("id", "")), contents=str(doc["contents"]), score=value)


class HttpRetriever:
    """``search(queries, topk) -> list[list[Passage]]`` over HTTP, with retries and chunking.

    ``return_scores=True`` fills ``Passage.score`` (null scores from the server become NaN);
    with False scores are 0.0 and the responses are smaller. Query lists longer than the
    server's ``max_queries_per_request`` (read once from ``/health``) are sent in chunks.
    """

    def __init__(self, url: str, timeout: float = 60.0, retries: int = 2,
                 return_scores: bool = True, max_queries_per_request: int | None = None,
                 backoff_s: float = 0.25) -> None:

        self.url = base_url(url)
        self.timeout, self.retries, self.return_scores = timeout, retries, return_scores
        self.backoff_s = backoff_s
        self._chunk = max_queries_per_request
        self._client = httpx.Client(timeout=timeout)

    # ------------------------------------------------------------------------------ public

    def search(self, queries: list[str], topn: int) -> list[list[Passage]]:
        if isinstance(queries, str):
            raise TypeError("search() takes a list of query strings, got a single str")
        queries = list(queries)
        if not queries:
            return []
        step = self._chunk_size()
        out: list[list[Passage]] = []
        for start in range(0, len(queries), step):
            out.extend(self._search_chunk(queries[start:start + step], topn))
        return out

    def health(self) -> dict[str, Any]:
        """The server's ``/health`` body (status, backend, corpus size, limits, stats)."""
        return self._request("GET", "/health")

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HttpRetriever:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"HttpRetriever({self.url!r})"

    # ----------------------------------------------------------------------------- private

    def _chunk_size(self) -> int:
        """The server's per-request query limit, asked once; Search-R1 servers publish none."""
        if self._chunk is None:
            try:
                limits = self.health().get("limits") or {}
                self._chunk = int(limits.get("max_queries_per_request", _FALLBACK_CHUNK))
            except RetrievalServerUnavailable:
                raise
            except (RetrievalServerError, ValueError, TypeError, AttributeError):
                self._chunk = _FALLBACK_CHUNK
        return max(1, self._chunk)

    def _search_chunk(self, queries: list[str], topn: int) -> list[list[Passage]]:
        payload = {"queries": queries, "topk": topn, "return_scores": self.return_scores}  # the wire keeps Search-R1's name
        body = self._request("POST", "/retrieve", json=payload)
        result = body.get("result") if isinstance(body, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            got = len(result) if isinstance(result, list) else type(result).__name__
            raise RetrievalServerError(f"server at {self.url} returned {got} result lists for "
                                       f"{len(queries)} queries")
        return [[_parse_hit(hit, self.return_scores) for hit in row] for row in result]

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        """One call with retries on connection failures and 503; 4xx/5xx raise at once."""

        last, hint = "", ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                response = self._client.request(method, self.url + path, **kwargs)
            except httpx.TimeoutException as exc:
                last, hint = f"timed out after {self.timeout} s ({type(exc).__name__})", (
                    " Raise HttpRetriever(timeout=...) or send fewer queries per call.")
                continue
            except httpx.TransportError as exc:
                last, hint = f"{type(exc).__name__}: {exc}", (
                    " Is it running? (start one with cosearch_lib.retrieval.server."
                    "serve_in_background or run_server)")
                continue
            if response.status_code == 503:
                last = _error_text(response)
                continue
            if response.status_code >= 400:
                raise _server_error(self.url + path, response)
            try:
                return response.json()
            except ValueError:
                raise RetrievalServerError(f"{self.url}{path} answered non-JSON: "
                                           f"{response.text[:200]!r}") from None
        raise RetrievalServerUnavailable(
            f"retrieval server at {self.url} unavailable after {self.retries + 1} attempt(s): "
            f"{last}.{hint}", status=503)


def _error_text(response: Any) -> str:
    try:
        err = response.json().get("error", {})
        return f"HTTP {response.status_code} {err.get('code')}: {err.get('message')}"
    except (ValueError, AttributeError):
        return f"HTTP {response.status_code}: {response.text[:200]!r}"


def _server_error(where: str, response: Any) -> RetrievalServerError:
    """Turn the server's ``{"error": {...}}`` (or FastAPI's ``{"detail"}``) into an exception."""
    code = field = None
    try:
        body = response.json()
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict):
            code, field, text = err.get("code"), err.get("field"), err.get("message")
        else:
            text = str(body.get("detail", body) if isinstance(body, dict) else body)
    except ValueError:
        text = response.text[:200]
    where_field = f" (field {field})" if field else ""
    return RetrievalServerError(f"retrieval server {where} rejected the request: HTTP "
                                f"{response.status_code} {code or ''}{where_field}: {text}",
                                status=response.status_code, code=code, field=field)
