"""Retrieval server throughput and latency at 1, 8 and 32 concurrent clients, plus encoder speed.

Why: rollouts issue many small search calls from many workers at once; this measures what the
HTTP layer and its request batching cost on top of the in-process retriever, and how far batching
lifts throughput as concurrency grows.

    python benchmarks/retrieval_server.py --profile demo              # build/load the demo index
    python benchmarks/retrieval_server.py --url http://127.0.0.1:8000  # an already-running server
    python benchmarks/retrieval_server.py --fake                      # synthetic backend, no models

Prints a table and writes ``papermill_runs/<profile>/bench/retrieval_server[_fake].{csv,json}``.

With ``--profile`` the server runs in this process, beside the client threads that load it, so both
share one interpreter. To compare servers, start each in its own process (``cosearch
serve-retriever --profile demo --port 8012``, or another implementation of the same protocol) and
measure each with ``--url`` (docs/LOG.md, issue 12: ours against Search-R1's).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import sys
import threading
import time
import zlib
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout too

from cosearch_lib.config import ServerConfig
from cosearch_lib.data.passage import Passage, make_contents
from cosearch_lib.paths import runs_dir
from cosearch_lib.retrieval.http_client import HttpRetriever
from cosearch_lib.retrieval.http_server import serve_in_background

WORDS = ["amber", "basalt", "cedar", "delta", "ember", "fjord", "granite", "harbor", "indigo",
         "juniper", "kestrel", "lagoon", "meadow", "nimbus", "obsidian", "prairie", "quartz",
         "ridge", "summit", "tundra", "umber", "valley", "willow", "zephyr"]


# ------------------------------------------------------------------------------ fake backend


class _FakeEncoder:
    """Hashed character-trigram vectors: an encoder stand-in with the real API's shape."""

    def __init__(self, dim: int = 256) -> None:
        self.dim = dim

    def _one(self, text: str) -> np.ndarray:
        padded = f"  {text.lower()}  "
        vec = np.zeros(self.dim, dtype=np.float32)
        for i in range(len(padded) - 2):
            vec[zlib.crc32(padded[i:i + 3].encode()) % self.dim] += 1.0
        return vec / max(float(np.linalg.norm(vec)), 1e-12)

    def encode_queries(self, texts: list[str]) -> np.ndarray:
        return np.stack([self._one(t) for t in texts])  # (Q, dim)

    def encode_passages(self, texts: list[str]) -> np.ndarray:
        return np.stack([self._one(t) for t in texts])  # (P, dim)


class _FakeCorpus:
    def __init__(self, n: int, seed: int = 0) -> None:
        rng = random.Random(seed)
        self._rows = [(f"fake-{i}", make_contents(
            f"{rng.choice(WORDS).title()} {rng.choice(WORDS)} {i}",
            " ".join(rng.choice(WORDS) for _ in range(60)))) for i in range(n)]

    def __len__(self) -> int:
        return len(self._rows)

    def row(self, i: int, score: float = 0.0) -> Passage:
        return Passage(*self._rows[i], score=score)


class FakeRetriever:
    """Synthetic corpus + trigram encoder + exact inner product; ``delay_ms`` mimics model cost."""

    def __init__(self, n_passages: int = 2_000, delay_ms: float = 0.0) -> None:
        self.encoder, self.corpus = _FakeEncoder(), _FakeCorpus(n_passages)
        self.matrix = self.encoder.encode_passages(
            [self.corpus.row(i).contents for i in range(n_passages)])  # (N, dim)
        self.delay_s = delay_ms / 1e3

    def __len__(self) -> int:
        return len(self.corpus)

    def search(self, queries: list[str], topk: int) -> list[list[Passage]]:
        if self.delay_s:
            time.sleep(self.delay_s)
        # einsum, not BLAS: multithreaded BLAS spin-waits between calls and would steal the
        # server's CPU on small machines, which is a property of this fake, not of the server
        scores = np.einsum("qd,nd->qn", self.encoder.encode_queries(queries), self.matrix)
        top = np.argsort(-scores, axis=1)[:, :topk]  # (Q, topk)
        return [[self.corpus.row(int(j), float(s[j])) for j in row] for row, s in zip(top, scores)]


# ------------------------------------------------------------------------------ measurement


@dataclass
class BenchRow:
    """One measured configuration."""

    mode: str  # "http" (through the server) or "in_process" (backend.search directly)
    concurrency: int  # concurrent client threads
    requests: int  # requests timed
    queries_per_request: int  # queries in each request
    topk: int  # passages per query
    seconds: float  # wall time of the timed phase
    queries_per_s: float  # total queries / seconds
    p50_ms: float  # median request latency
    p99_ms: float  # 99th-percentile request latency
    backend_calls: int | None  # backend.search calls during the phase (from /stats), if known
    mean_batch_queries: float | None  # queries per backend call during the phase, if known
    errors: int = 0  # requests that failed (any exception or non-200), counted, not raised: a soak reports them


def make_queries(backend: Any, n: int, seed: int = 0) -> list[str]:
    """Queries from corpus titles when the backend is local, else from a fixed vocabulary."""
    rng = random.Random(seed)
    corpus = getattr(backend, "corpus", None)
    if corpus is not None and len(corpus):
        rows = [corpus.row(rng.randrange(len(corpus))) for _ in range(n)]
        return [f"what is known about {p.title or p.contents[:60]}?" for p in rows]
    return [f"{rng.choice(WORDS)} {rng.choice(WORDS)} history" for _ in range(n)]


def _percentile_ms(latencies: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(latencies) * 1e3, q)) if latencies else float("nan")


def _server_stats(client: HttpRetriever) -> dict[str, Any] | None:
    try:
        return client.health().get("stats")
    except Exception:  # noqa: BLE001 - a plain Search-R1 server has no /health
        return None


def _run_clients(url: str, queries: list[str], n_requests: int, concurrency: int,
                 per_request: int, topk: int) -> tuple[float, list[float], int]:
    """``n_requests`` requests shared by ``concurrency`` threads; returns (wall s, latencies of the
    answered ones, failed requests)."""
    counter = iter(range(n_requests))
    lock = threading.Lock()
    latencies: list[float] = []
    errors = [0]

    def worker(_: int) -> None:
        with HttpRetriever(url, retries=0, max_queries_per_request=per_request) as client:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                batch = [queries[(i * per_request + j) % len(queries)] for j in range(per_request)]
                t0 = time.perf_counter()
                try:
                    client.search(batch, topk)
                except Exception:  # noqa: BLE001 - a soak counts failures instead of stopping
                    with lock:
                        errors[0] += 1
                    continue
                with lock:
                    latencies.append(time.perf_counter() - t0)

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, range(concurrency)))
    return time.perf_counter() - start, latencies, errors[0]


def bench_http(url: str, queries: list[str], n_requests: int, concurrency: int,
               per_request: int, topk: int, warmup: int, pool: ProcessPoolExecutor) -> BenchRow:
    """Client threads run in ``pool``'s process so they do not share the server's GIL."""
    def clients(n: int, conc: int) -> tuple[float, list[float], int]:
        return pool.submit(_run_clients, url, queries, n, conc, per_request, topk).result()

    clients(warmup, min(concurrency, max(warmup, 1)))
    with HttpRetriever(url, retries=0) as probe:
        before = _server_stats(probe)
        seconds, lat, errors = clients(n_requests, concurrency)
        after = _server_stats(probe)
    calls = mean_batch = None
    if before and after:
        calls = after["backend_calls"] - before["backend_calls"]
        sent = after["backend_queries"] - before["backend_queries"]
        mean_batch = sent / calls if calls else None
    return BenchRow("http", concurrency, n_requests, per_request, topk, seconds,
                    n_requests * per_request / seconds, _percentile_ms(lat, 50),
                    _percentile_ms(lat, 99), calls, mean_batch, errors)


def bench_in_process(backend: Any, queries: list[str], n_requests: int, per_request: int,
                     topk: int) -> BenchRow:
    """The same requests, one at a time, straight into backend.search: the no-HTTP baseline."""
    backend.search(queries[:per_request], topk)  # warm caches
    lat = []
    start = time.perf_counter()
    for i in range(n_requests):
        batch = [queries[(i * per_request + j) % len(queries)] for j in range(per_request)]
        t0 = time.perf_counter()
        backend.search(batch, topk)
        lat.append(time.perf_counter() - t0)
    seconds = time.perf_counter() - start
    return BenchRow("in_process", 1, n_requests, per_request, topk, seconds,
                    n_requests * per_request / seconds, _percentile_ms(lat, 50),
                    _percentile_ms(lat, 99), n_requests, float(per_request))


def bench_encoder(backend: Any, n_passages: int, batch: int = 64) -> float | None:
    """Passages encoded per second by ``backend.encoder.encode_passages`` (None if no encoder)."""
    encoder, corpus = getattr(backend, "encoder", None), getattr(backend, "corpus", None)
    if encoder is None or corpus is None or not len(corpus):
        return None
    n = min(n_passages, len(corpus))
    texts = [corpus.row(i).contents for i in range(n)]
    encoder.encode_passages(texts[:min(8, n)])  # warm-up (threads, lazy init)
    start = time.perf_counter()
    for i in range(0, n, batch):
        encoder.encode_passages(texts[i:i + batch])
    return n / (time.perf_counter() - start)


# ------------------------------------------------------------------------------ reporting


def print_table(rows: list[BenchRow], encoder_pps: float | None, label: str) -> None:
    print(f"\nretrieval server benchmark ({label})")
    head = f"{'mode':<11}{'conc':>5}{'reqs':>6}{'q/req':>6}{'topk':>5}{'queries/s':>11}" \
           f"{'p50 ms':>9}{'p99 ms':>9}{'calls':>7}{'q/call':>8}{'errors':>8}"
    print(head)
    print("-" * len(head))
    for r in rows:
        calls = "-" if r.backend_calls is None else str(r.backend_calls)
        per_call = "-" if r.mean_batch_queries is None else f"{r.mean_batch_queries:.1f}"
        print(f"{r.mode:<11}{r.concurrency:>5}{r.requests:>6}{r.queries_per_request:>6}"
              f"{r.topk:>5}{r.queries_per_s:>11.1f}{r.p50_ms:>9.2f}{r.p99_ms:>9.2f}"
              f"{calls:>7}{per_call:>8}{r.errors:>8}")
    enc = "n/a (remote server)" if encoder_pps is None else f"{encoder_pps:.1f}"
    print(f"encoder passages/s: {enc}")


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_results(rows: list[BenchRow], meta: dict[str, Any], out_dir: Path, stem: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    fields = list(asdict(rows[0]))
    lines = [",".join(fields)] + [",".join("" if v is None else str(v) for v in asdict(r).values())
                                  for r in rows]
    _atomic_write(out_dir / f"{stem}.csv", "\n".join(lines) + "\n")
    record = {**meta, "rows": [asdict(r) for r in rows]}
    _atomic_write(out_dir / f"{stem}.json", json.dumps(record, indent=2))
    return out_dir / f"{stem}.json"


# ------------------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="demo", help="profile whose index is served (and the "
                   "papermill_runs/<profile>/bench/ output folder)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--url", help="benchmark an already-running server instead of starting one")
    src.add_argument("--fake", action="store_true", help="serve a synthetic backend (no models)")
    p.add_argument("--requests", type=int, default=200, help="timed requests per concurrency")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--topk", type=int, default=5)
    p.add_argument("--queries-per-request", type=int, default=1,
                   help="queries in each request (agents send one sub-query per turn)")
    p.add_argument("--warmup", type=int, default=16, help="untimed requests before each level")
    p.add_argument("--encoder-passages", type=int, default=512,
                   help="passages encoded to measure encoder throughput")
    p.add_argument("--batch-wait-ms", type=float, default=ServerConfig.batch_wait_ms)
    p.add_argument("--max-batch-queries", type=int, default=ServerConfig.max_batch_queries)
    p.add_argument("--fake-passages", type=int, default=2_000)
    p.add_argument("--fake-delay-ms", type=float, default=0.0,
                   help="sleep per backend call, to mimic encoder + FAISS cost")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: "
                   "papermill_runs/<profile>/bench)")
    args = p.parse_args(argv)
    for name in ("requests", "topk", "queries_per_request"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if min(args.concurrency) < 1:
        p.error("--concurrency values must be >= 1")
    return args


def load_backend(args: argparse.Namespace) -> Any:
    if args.fake:
        return FakeRetriever(args.fake_passages, args.fake_delay_ms)
    from cosearch_lib.experiment import build_retriever

    return build_retriever(args.profile)


def run(args: argparse.Namespace) -> list[BenchRow]:
    backend = None if args.url else load_backend(args)
    queries = make_queries(backend, 512)
    per_req, topk = args.queries_per_request, args.topk
    rows: list[BenchRow] = []
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))

    def levels(url: str) -> list[BenchRow]:
        return [bench_http(url, queries, args.requests, c, per_req, topk, args.warmup, pool)
                for c in args.concurrency]

    with pool:
        if backend is not None:
            rows.append(bench_in_process(backend, queries, args.requests, per_req, topk))
            cfg = ServerConfig(port=0, batch_wait_ms=args.batch_wait_ms,
                               max_batch_queries=args.max_batch_queries)
            with serve_in_background(backend, cfg) as url:
                rows += levels(url)
            encoder_pps = bench_encoder(backend, args.encoder_passages)
        else:
            rows += levels(args.url)
            encoder_pps = None
    label = "fake backend" if args.fake else (args.url or f"profile {args.profile}")
    print_table(rows, encoder_pps, label)
    meta = {"benchmark": "retrieval_server", "target": label, "profile": args.profile,
            "encoder_passages_per_s": encoder_pps, "batch_wait_ms": args.batch_wait_ms,
            "max_batch_queries": args.max_batch_queries, "cpu_count": os.cpu_count(),
            "python": platform.python_version(), "machine": platform.machine(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    out_dir = args.out or runs_dir() / args.profile / "bench"
    path = write_results(rows, meta, out_dir, "retrieval_server_fake" if args.fake
                         else "retrieval_server")
    print(f"wrote {path} (+ .csv)")
    return rows


def main(argv: list[str] | None = None) -> int:
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
