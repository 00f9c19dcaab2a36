"""HTTP retrieval server speaking Search-R1's ``POST /retrieve`` protocol, with request batching.

Why a server at all: at paper scale the wiki-18 index needs ~62 GB of RAM, so one process holds it
and every rollout worker (and existing Search-R1 / CoSearch clients) queries it over HTTP.

Protocol (as Search-R1's ``retrieval_server.py`` and its ``generation.py`` client use it)::

    POST /retrieve  {"queries": [str, ...], "topk": int = 3, "return_scores": bool = false}
    return_scores true  -> {"result": [[{"document": {"id", "contents"}, "score": float}, ...]]}
    return_scores false -> {"result": [[{"id", "contents"}, ...]]}   (bare documents)

One list per query, in request order, best passage first. ``topk`` absent or null means
``ServerConfig.default_topk``. Unknown top-level fields are ignored (as Search-R1's pydantic model
does), so clients that send extra keys keep working.

Batching: concurrent requests are queued; one background task gathers them for up to
``batch_wait_ms`` or ``max_batch_queries`` queries, calls ``backend.search`` once with the largest
``topk`` among them, and truncates each request's lists to its own ``topk``. The backend (encoder +
FAISS, CPU heavy) runs in a single worker thread, so calls are serial (the backend need not be
thread safe) and the event loop keeps accepting connections; requests arriving during a call
form the next, larger batch. The window is waited only under concurrent load (the previous call
merged several requests, or several are already queued): an idle server answers a lone request
at once instead of holding it for ``batch_wait_ms``.

Errors are JSON ``{"error": {"code", "message", "field"}}``: 400 malformed JSON, 413 body too
large, 408 body not sent within ``body_timeout_s``, 422 invalid fields, 404/405 unknown path/method,
500 backend failure, 503 (with ``Retry-After``) overloaded or
shutting down, 504 timed out. Bad input never produces a 500. Whatever the path, a body the
server did not read is drained before the error goes out (:class:`DrainUnreadBody`), so a client
that sends its whole body first reads the error instead of a connection reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from cosearch_lib.config import ServerConfig
from cosearch_lib.retrieval.request_batcher import Batcher, ServerStats
from cosearch_lib.retrieval.retrieve_protocol import (
    BackendFailure,
    RequestError,
    format_or_fail,
    invalid_field,
    parse_body,
    validate_request,
)
from cosearch_lib.retrieval.retriever import SearchBackend

# ------------------------------------------------------------------------------------------ app


def backend_corpus_size(backend: Any) -> int | None:
    """Number of passages behind ``backend`` if it tells us (``len(backend)`` or ``.corpus``)."""
    for obj in (backend, getattr(backend, "corpus", None)):
        if obj is None:
            continue
        with contextlib.suppress(TypeError, AttributeError, NotImplementedError):
            size = len(obj)
            if isinstance(size, int) and size > 0:
                return size
    return None


def _backend_name(backend: Any) -> str:
    name = getattr(backend, "name", None)
    return name if isinstance(name, str) else type(backend).__name__


#: A body the server answers without reading (an error: 404, 405, 413, ...) is read and thrown away
#: up to this many bytes before the answer is sent, so a client that writes its whole body before
#: reading (Python's urllib, requests) gets the answer instead of a connection reset; a larger one
#: is cut off without reading it.
DRAIN_LIMIT_BYTES = 64 * 1024 * 1024


async def _read_body(request: Request, limit: int) -> bytes:
    """Read at most ``limit`` bytes; a larger body (declared or counted) is refused with 413 (the
    rest is drained by :class:`DrainUnreadBody` before the answer goes out)."""
    too_large = RequestError(413, "body_too_large", f"request body exceeds {limit} bytes")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


class DrainUnreadBody:
    """ASGI middleware: before a response starts, read and discard whatever of the request body
    the app left unread (at most :data:`DRAIN_LIMIT_BYTES` in all, and only until ``timeout_s``
    after the request came in, so a stalled sender's 408 is not held back further).

    Why here and not in a route: an unknown path (404), a wrong method (405) or a refused body
    (413) is answered without reading the body, and the server then closes a connection that still
    has unread bytes in its receive buffer, which the kernel turns into a reset; a client still
    writing its body sees "connection reset by peer" instead of the JSON error."""

    def __init__(self, app: Any, *, timeout_s: float) -> None:
        self.app, self.timeout_s = app, timeout_s

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length", b"")
        state = {"done": declared.isdigit() and int(declared) == 0, "read": 0}

        async def tracked_receive() -> dict:
            message = await receive()
            if message["type"] == "http.request":
                state["read"] += len(message.get("body", b""))
                state["done"] = state["done"] or not message.get("more_body", False)
            elif message["type"] == "http.disconnect":
                state["done"] = True
            return message

        async def drain() -> None:
            while not state["done"] and state["read"] <= DRAIN_LIMIT_BYTES:
                await tracked_receive()

        async def draining_send(message: dict) -> None:
            too_big = declared.isdigit() and int(declared) > DRAIN_LIMIT_BYTES
            if message["type"] == "http.response.start" and not state["done"] and not too_big:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(drain(), max(0.0, deadline - asyncio.get_running_loop().time()))
            await send(message)

        await self.app(scope, tracked_receive, draining_send)


def create_app(backend: SearchBackend, cfg: ServerConfig | None = None) -> FastAPI:
    """A FastAPI app serving ``backend`` with Search-R1's protocol, batching and JSON errors."""
    cfg = cfg or ServerConfig()
    stats = ServerStats()
    batcher = Batcher(backend, cfg, stats)
    corpus_size = backend_corpus_size(backend)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> Any:
        batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="CoSearch retrieval server", lifespan=lifespan, docs_url=None,
                  redoc_url=None, openapi_url=None)
    app.state.stats, app.state.batcher, app.state.config = stats, batcher, cfg
    app.add_middleware(DrainUnreadBody, timeout_s=cfg.body_timeout_s)

    def error_response(err: RequestError, headers: dict | None = None) -> JSONResponse:
        if 400 <= err.status < 500:
            stats.rejected += 1
        return JSONResponse(err.payload(), status_code=err.status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {404: "not_found", 405: "method_not_allowed"}
        err = RequestError(exc.status_code, codes.get(exc.status_code, "http_error"),
                           str(exc.detail))
        return error_response(err, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_req: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(invalid_field("invalid_request", str(exc), None))

    @app.exception_handler(Exception)
    async def internal_error(_req: Request, exc: Exception) -> JSONResponse:
        err = RequestError(500, "internal_error", f"{type(exc).__name__}: {exc}")
        return JSONResponse(err.payload(), status_code=500)

    @app.post("/retrieve")
    async def retrieve(request: Request) -> JSONResponse:
        try:
            try:
                raw = await asyncio.wait_for(_read_body(request, cfg.max_body_bytes), cfg.body_timeout_s)
            except asyncio.TimeoutError:
                raise RequestError(408, "body_timeout", f"request body not received within {cfg.body_timeout_s} s") from None
            body = parse_body(raw)
            req = validate_request(body, cfg, corpus_size)
            stats.requests += 1
            stats.queries += len(req.queries)
            ranked = await batcher.submit(req.queries, req.topk)
            body = format_or_fail(ranked, req.return_scores)
        except RequestError as err:
            retry = {"Retry-After": str(cfg.retry_after_s)} if err.status == 503 else None
            return error_response(err, headers=retry)
        except BackendFailure as exc:
            return error_response(RequestError(500, "backend_error", f"retrieval backend "
                                               f"failed: {exc}"))
        return JSONResponse(body)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        limits = {k: getattr(cfg, k) for k in ("default_topk", "max_topk",
                  "max_queries_per_request", "max_query_chars", "max_batch_queries",
                  "max_body_bytes")}
        if corpus_size:
            limits["max_topk"] = min(cfg.max_topk, corpus_size)
        return {"status": "ok", "backend": _backend_name(backend), "corpus_size": corpus_size,
                "limits": limits, "stats": stats.snapshot()}

    @app.get("/stats")
    async def get_stats() -> dict[str, Any]:
        return stats.snapshot()

    return app


# -------------------------------------------------------------------------------------- running


def _uvicorn_config(app: Any, cfg: ServerConfig) -> Any:
    return uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level,
                          access_log=False, lifespan="on", timeout_graceful_shutdown=5)


def run_server(backend: SearchBackend, cfg: ServerConfig | None = None) -> None:
    """Serve ``backend`` in the foreground until Ctrl-C (blocking)."""

    cfg = cfg or ServerConfig()
    print(f"retrieval server for {_backend_name(backend)} on http://{cfg.host}:{cfg.port}"
          " (POST /retrieve, GET /health); Ctrl-C stops it", flush=True)
    uvicorn.Server(_uvicorn_config(create_app(backend, cfg), cfg)).run()


def _bind(host: str, port: int) -> socket.socket:
    """Bind the listening socket ourselves so port 0 yields a real port before uvicorn starts.

    ``IPPROTO_TCP`` must be explicit: asyncio sets TCP_NODELAY on accepted connections only when
    ``sock.proto`` says TCP, and without it Nagle + delayed ACK add ~40 ms to every response.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot bind retrieval server to {host}:{port}: {exc}") from exc
    return sock


class ServerThread:
    """uvicorn on a real loopback socket in a daemon thread; ``start()`` returns the base URL.

    Used by tests, notebooks and the benchmark: the notebook's kernel keeps running while the
    server answers agents. ``stop()`` (or leaving the ``with`` block) shuts down cleanly.
    """

    def __init__(self, backend: SearchBackend, cfg: ServerConfig | None = None,
                 startup_timeout_s: float = 30.0) -> None:

        self.cfg = cfg or ServerConfig()
        self.app = create_app(backend, self.cfg)
        self._server = uvicorn.Server(_uvicorn_config(self.app, self.cfg))
        self._thread: threading.Thread | None = None
        self._startup_timeout_s = startup_timeout_s
        self.url = ""

    def start(self) -> str:
        sock = _bind(self.cfg.host, self.cfg.port)
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{port}"
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name=f"cosearch-retrieval-{port}", daemon=True)
        self._thread.start()
        self._wait_healthy()
        return self.url

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self._startup_timeout_s
        while time.monotonic() < deadline:
            if self._thread is not None and not self._thread.is_alive():
                raise RuntimeError(f"retrieval server thread exited during startup ({self.url})")
            if self._server.started:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                        return
            time.sleep(0.02)
        self.stop()
        raise TimeoutError(f"retrieval server at {self.url} not healthy after "
                           f"{self._startup_timeout_s} s")

    def stop(self, timeout_s: float = 10.0) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    @property
    def stats(self) -> ServerStats:
        return self.app.state.stats

    def __enter__(self) -> ServerThread:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


@contextlib.contextmanager
def serve_in_background(backend: SearchBackend,
                        cfg: ServerConfig | None = None) -> Iterator[str]:
    """``with serve_in_background(retriever, ServerConfig(port=0)) as url: ...`` (base URL)."""
    server = ServerThread(backend, cfg)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()
