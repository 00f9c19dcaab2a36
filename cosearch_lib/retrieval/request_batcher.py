"""Request batching of the retrieval server: concurrent ``/retrieve`` requests merged into few
``backend.search`` calls, run one at a time in a worker thread (see ``retrieval.http_server``'s
module docstring for the policy), and the counters that show it happened (:class:`ServerStats`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from cosearch_lib.config import ServerConfig
from cosearch_lib.data.passage import Passage
from cosearch_lib.retrieval.retrieve_protocol import BackendFailure, RequestError
from cosearch_lib.retrieval.retriever import SearchBackend


@dataclass
class ServerStats:
    """Counters exposed by ``/stats`` and ``/health``; they prove batching happened."""

    requests: int = 0  # /retrieve requests that passed validation
    queries: int = 0  # queries in those requests
    backend_calls: int = 0  # calls to backend.search
    backend_queries: int = 0  # queries sent to the backend (sum over calls)
    max_batch_queries_seen: int = 0  # largest number of queries in one backend call
    max_batch_requests_seen: int = 0  # most request chunks merged into one backend call
    rejected: int = 0  # requests answered with a 4xx
    backend_errors: int = 0  # backend calls that raised or returned a malformed result
    backend_seconds: float = 0.0  # wall time spent inside backend.search
    batch_windows: int = 0  # batches that waited batch_wait_ms for more requests (only under concurrent load)

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = asdict(self)
        calls = max(self.backend_calls, 1)
        out["mean_batch_queries"] = self.backend_queries / calls if self.backend_calls else 0.0
        out["mean_backend_ms"] = 1e3 * self.backend_seconds / calls if self.backend_calls else 0.0
        return out



# -------------------------------------------------------------------------------------- batcher


@dataclass
class _Job:
    """One slice of a request's queries waiting for a backend call."""

    queries: list[str]  # at most cfg.max_batch_queries queries
    topk: int  # this request's topk (the call uses the batch's maximum)
    future: asyncio.Future  # resolved with one list of Passages per query


class Batcher:
    """Merges concurrent requests into few ``backend.search`` calls (see module docstring)."""

    def __init__(self, backend: SearchBackend, cfg: ServerConfig, stats: ServerStats) -> None:
        self.backend, self.cfg, self.stats = backend, cfg, stats
        self._pending: deque[_Job] = deque()
        self._pending_queries = 0
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._last_batch_jobs = 0  # requests merged into the previous backend call: >1 means concurrent load

    def start(self) -> None:
        """Start the batching task on the running loop (idempotent)."""
        if self._task is not None and not self._task.done():
            return
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cosearch-backend")
        self._task = asyncio.get_running_loop().create_task(self._run(), name="cosearch-batcher")

    async def stop(self) -> None:
        """Cancel the task and fail whatever is still queued with 503."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        while self._pending:
            _fail(self._pending.popleft(), RequestError(503, "shutting_down",
                                                        "the retrieval server is shutting down"))
        self._pending_queries = 0
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, queries: list[str], topk: int) -> list[list[Passage]]:
        """Queue ``queries`` (split into backend-sized slices) and wait for their results."""
        self.start()
        if self._pending_queries + len(queries) > self.cfg.max_pending_queries:
            raise RequestError(503, "overloaded", f"{self._pending_queries} queries already "
                               f"queued (limit {self.cfg.max_pending_queries}); retry later")
        loop = asyncio.get_running_loop()
        step = self.cfg.max_batch_queries
        jobs = [_Job(queries[i:i + step], topk, loop.create_future())
                for i in range(0, len(queries), step)]
        self._pending.extend(jobs)
        self._pending_queries += len(queries)
        assert self._wakeup is not None
        self._wakeup.set()
        try:  # return_exceptions: every slice's outcome is retrieved, the first failure raised
            parts = await asyncio.wait_for(
                asyncio.gather(*(j.future for j in jobs), return_exceptions=True),
                self.cfg.request_timeout_s)
        except asyncio.TimeoutError:
            raise RequestError(504, "timeout", f"no answer within {self.cfg.request_timeout_s} "
                               "s; the backend is busy or stuck") from None
        for part in parts:
            if isinstance(part, BaseException):
                raise part
        return [ranked for part in parts for ranked in part]

    async def _run(self) -> None:
        while True:
            batch = await self._collect()
            try:
                await self._execute(batch)
            except Exception as exc:  # noqa: BLE001 - keep the batcher alive whatever happens
                for job in batch:
                    _fail(job, BackendFailure(f"batcher error: {exc!r}"))

    async def _collect(self) -> list[_Job]:
        """Wait for a first job; under concurrent load (the previous call merged several requests, or
        several are queued) wait up to batch_wait_ms for more; then pop what fits."""
        assert self._wakeup is not None
        while not self._pending:
            self._wakeup.clear()
            await self._wakeup.wait()
        await asyncio.sleep(0)  # let requests that have already arrived enqueue themselves
        if self._last_batch_jobs <= 1 and len(self._pending) <= 1:
            return self._pop_batch()  # idle server: no window for a lone request
        self.stats.batch_windows += 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.batch_wait_ms / 1e3
        while self._pending_queries < self.cfg.max_batch_queries:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            self._wakeup.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), remaining)
        return self._pop_batch()

    def _pop_batch(self) -> list[_Job]:
        batch: list[_Job] = []
        size = 0
        while self._pending:
            job = self._pending[0]
            if batch and size + len(job.queries) > self.cfg.max_batch_queries:
                break
            self._pending.popleft()
            self._pending_queries -= len(job.queries)
            if job.future.done():  # the client timed out or went away: skip its work
                continue
            batch.append(job)
            size += len(job.queries)
        return batch

    async def _execute(self, batch: list[_Job]) -> None:
        self._last_batch_jobs = len(batch)
        if not batch:
            return
        queries = [q for job in batch for q in job.queries]
        topk = max(job.topk for job in batch)  # the wire's Search-R1 name: the backend's N (search(queries, topn))
        started = time.perf_counter()
        try:
            ranked = await asyncio.get_running_loop().run_in_executor(
                self._executor, self.backend.search, queries, topk)
            _check_backend_result(ranked, len(queries))
        except Exception as exc:  # noqa: BLE001 - any backend failure becomes a JSON error
            self.stats.backend_errors += 1
            for job in batch:
                _fail(job, BackendFailure(f"{type(exc).__name__}: {exc}"))
            return
        finally:
            self._record_call(len(queries), len(batch), time.perf_counter() - started)
        offset = 0
        for job in batch:
            part = [list(r[:job.topk]) for r in ranked[offset:offset + len(job.queries)]]
            offset += len(job.queries)
            if not job.future.done():
                job.future.set_result(part)

    def _record_call(self, n_queries: int, n_jobs: int, seconds: float) -> None:
        s = self.stats
        s.backend_calls += 1
        s.backend_queries += n_queries
        s.backend_seconds += seconds
        s.max_batch_queries_seen = max(s.max_batch_queries_seen, n_queries)
        s.max_batch_requests_seen = max(s.max_batch_requests_seen, n_jobs)


def _fail(job: _Job, exc: Exception) -> None:
    if not job.future.done():
        job.future.set_exception(exc)


def _check_backend_result(ranked: Any, n_queries: int) -> None:
    if not isinstance(ranked, (list, tuple)) or len(ranked) != n_queries:
        got = len(ranked) if isinstance(ranked, (list, tuple)) else type(ranked).__name__
        raise BackendFailure(f"backend.search returned {got} result lists for {n_queries} queries")
