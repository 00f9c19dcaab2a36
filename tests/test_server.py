"""The retrieval server and client over real loopback sockets (uvicorn in a thread, httpx).

A deterministic fake backend (30 passages, hashed character-trigram vectors, cosine scores) stands
in for the encoder + FAISS retriever, and counts its calls so batching can be proven.
"""

from __future__ import annotations

import socket
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from cosearch_lib.config import ServerConfig
from cosearch_lib.data.passage import Passage, make_contents
from cosearch_lib.retrieval.http_client import HttpRetriever, RetrievalServerError, RetrievalServerUnavailable
from cosearch_lib.retrieval.http_server import ServerThread, serve_in_background

TOPICS = ["volcano", "river", "castle", "comet", "orchard", "glacier", "harbor", "desert",
          "library", "forest"]
ASPECTS = ["history", "geography", "legends"]
DIM = 512


def _trigram_vector(text: str) -> np.ndarray:
    """Hashed character-trigram counts, L2-normalised: a stable stand-in for an encoder."""
    padded = f"  {text.lower()}  "
    vec = np.zeros(DIM, dtype=np.float64)
    for i in range(len(padded) - 2):
        vec[zlib.crc32(padded[i:i + 3].encode()) % DIM] += 1.0
    return vec / max(np.linalg.norm(vec), 1e-12)


class FakeBackend:
    """30 passages, cosine over trigram vectors; records (n_queries, topk) for every call."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.passages = [
            (f"doc-{i:02d}", make_contents(f"{t.title()} {a}",
                                           f"The {a} of the {t} of Zentria, entry {i}."))
            for i, (t, a) in enumerate((t, a) for t in TOPICS for a in ASPECTS)]
        self.matrix = np.stack([_trigram_vector(c) for _, c in self.passages])  # (N, DIM)
        self.delay_s = delay_s
        self.calls: list[tuple[int, int]] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.passages)

    def search(self, queries: list[str], topn: int) -> list[list[Passage]]:
        with self._lock:
            self.calls.append((len(queries), topn))
        if self.delay_s:
            time.sleep(self.delay_s)
        out = []
        for query in queries:  # one mat-vec per query: scores do not depend on batch size
            row = self.matrix @ _trigram_vector(query)  # (N,)
            order = np.lexsort((np.arange(len(row)), -row))[:topn]  # score desc, then index
            out.append([Passage(*self.passages[j], score=float(row[j])) for j in order])
        return out


class ExplodingBackend(FakeBackend):
    """Raises for any batch containing a query with 'boom' in it."""

    def search(self, queries: list[str], topn: int) -> list[list[Passage]]:
        if any("boom" in q for q in queries):
            raise RuntimeError("index shard offline")
        return super().search(queries, topn)


def _cfg(**overrides) -> ServerConfig:
    return ServerConfig(port=0, **overrides)


@pytest.fixture(scope="module")
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture(scope="module")
def server(backend):
    with ServerThread(backend, _cfg(max_queries_per_request=8, max_body_bytes=20_000,
                                    max_query_chars=200, max_topk=20)) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=10.0) as client:
        yield client


# ------------------------------------------------------------------------------ good requests


def test_health_reports_backend_and_limits(http, backend):
    body = http.get("/health").json()
    assert body["status"] == "ok"
    assert body["backend"] == "FakeBackend"
    assert body["corpus_size"] == len(backend)
    assert body["limits"]["max_queries_per_request"] == 8
    assert set(body["stats"]) >= {"requests", "backend_calls", "queries", "mean_batch_queries"}


def test_binds_loopback_by_default(backend):
    assert ServerConfig().host == "127.0.0.1"
    with serve_in_background(backend, _cfg()) as url:
        assert url.startswith("http://127.0.0.1:")
        assert not url.endswith(":0")
        assert httpx.get(f"{url}/health").json()["status"] == "ok"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=1.0)


def test_scores_shape_matches_search_r1(http, backend):
    queries = ["volcano legends", "history of the harbor"]
    body = http.post("/retrieve", json={"queries": queries, "topk": 5,
                                        "return_scores": True}).json()
    assert list(body) == ["result"] and len(body["result"]) == 2
    expected = backend.search(queries, 5)
    for row, want in zip(body["result"], expected):
        assert len(row) == 5
        assert all(set(hit) == {"document", "score"} for hit in row)
        assert all(set(hit["document"]) == {"id", "contents"} for hit in row)
        scores = [hit["score"] for hit in row]
        assert scores == sorted(scores, reverse=True)
        assert [hit["document"] for hit in row] == [p.to_document() for p in want]
        assert scores == [p.score for p in want]
    assert body["result"][0][0]["document"]["contents"].startswith('"Volcano legends"')


def test_without_scores_returns_bare_documents(http, backend):
    body = http.post("/retrieve", json={"queries": ["glacier geography"], "topk": 4,
                                        "return_scores": False}).json()
    row = body["result"][0]
    assert [set(doc) for doc in row] == [{"id", "contents"}] * 4
    assert row == [p.to_document() for p in backend.search(["glacier geography"], 4)[0]]


def test_defaults_topk_3_and_no_scores(http):
    for payload in ({"queries": ["comet"]}, {"queries": ["comet"], "topk": None}):
        row = http.post("/retrieve", json=payload).json()["result"][0]
        assert len(row) == 3 and "document" not in row[0]


def test_unknown_fields_are_ignored(http):
    response = http.post("/retrieve", json={"queries": ["river"], "topk": 2, "extra": [1, 2]})
    assert response.status_code == 200 and len(response.json()["result"][0]) == 2


def test_http_retriever_equals_backend(server, backend):
    queries = [f"{t} {a}" for t in TOPICS for a in ASPECTS[:2]]  # 20 > the limit of 8
    before = server.stats.requests
    with HttpRetriever(server.url + "/retrieve") as client:
        got = client.search(queries, topn=6)
        assert client.health()["status"] == "ok"
    assert got == backend.search(queries, 6)
    assert all(isinstance(p, Passage) for row in got for p in row)
    assert server.stats.requests - before == 3  # chunks of 8, 8, 4
    assert HttpRetriever(server.url).search([], 3) == []


def test_http_retriever_without_scores(server, backend):
    with HttpRetriever(server.url, return_scores=False) as client:
        got = client.search(["orchard history"], topn=2)[0]
    want = backend.search(["orchard history"], 2)[0]
    assert [(p.id, p.contents, p.score) for p in got] == [(p.id, p.contents, 0.0) for p in want]


# ------------------------------------------------------------------------------ bad requests


BAD_REQUESTS = [
    # (raw body, status, error code, field)
    (b'{"queries": ["a"', 400, "invalid_json", None),
    (b"\xff\xfe not utf8", 400, "invalid_json", None),
    (b"", 400, "invalid_json", None),
    (b'["a", "b"]', 422, "wrong_type", None),
    (b'{"topk": 3}', 422, "missing_field", "queries"),
    (b'{"queries": "just one string"}', 422, "wrong_type", "queries"),
    (b'{"queries": []}', 422, "empty_value", "queries"),
    (b'{"queries": ["ok", 7]}', 422, "wrong_type", "queries[1]"),
    (b'{"queries": ["ok", null]}', 422, "wrong_type", "queries[1]"),
    (b'{"queries": ["ok", "   "]}', 422, "empty_value", "queries[1]"),
    (b'{"queries": ["' + b"x" * 201 + b'"]}', 422, "too_long", "queries[0]"),
    (b'{"queries": ["q","q","q","q","q","q","q","q","q"]}', 422, "too_many_queries", "queries"),
    (b'{"queries": ["a"], "topk": "3"}', 422, "wrong_type", "topk"),
    (b'{"queries": ["a"], "topk": 2.5}', 422, "wrong_type", "topk"),
    (b'{"queries": ["a"], "topk": true}', 422, "wrong_type", "topk"),
    (b'{"queries": ["a"], "topk": 0}', 422, "out_of_range", "topk"),
    (b'{"queries": ["a"], "topk": -2}', 422, "out_of_range", "topk"),
    (b'{"queries": ["a"], "topk": 21}', 422, "out_of_range", "topk"),
    (b'{"queries": ["a"], "return_scores": "yes"}', 422, "wrong_type", "return_scores"),
    (b'{"queries": ["a"], "return_scores": 1}', 422, "wrong_type", "return_scores"),
    (b'{"queries": ["a"], "return_scores": null}', 422, "wrong_type", "return_scores"),
]


@pytest.mark.parametrize("raw,status,code,field", BAD_REQUESTS)
def test_bad_input_gives_json_4xx(http, raw, status, code, field):
    response = http.post("/retrieve", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["code"], error["field"]) == (code, field)
    assert isinstance(error["message"], str) and error["message"]


def test_body_too_large_is_413(http):
    big = b'{"queries": ["' + b"y" * 30_000 + b'"]}'
    response = http.post("/retrieve", content=big)
    assert response.status_code == 413 and response.json()["error"]["code"] == "body_too_large"

    def chunked():  # no Content-Length: the server must count while reading
        yield big[:10_000]
        yield big[10_000:]

    response = http.post("/retrieve", content=chunked())
    assert response.status_code == 413


def test_topk_bounded_by_corpus_size(backend):
    with serve_in_background(backend, _cfg(max_topk=100)) as url:
        assert httpx.get(f"{url}/health").json()["limits"]["max_topk"] == 30
        ok = httpx.post(f"{url}/retrieve", json={"queries": ["a"], "topk": 30})
        too_many = httpx.post(f"{url}/retrieve", json={"queries": ["a"], "topk": 31})
    assert ok.status_code == 200 and len(ok.json()["result"][0]) == 30
    assert too_many.status_code == 422 and "corpus has 30" in too_many.json()["error"]["message"]


def test_unknown_path_and_wrong_method_are_json(http):
    missing = http.get("/nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    wrong = http.get("/retrieve")
    assert wrong.status_code == 405
    assert wrong.json()["error"]["code"] == "method_not_allowed"
    assert "POST" in wrong.headers.get("allow", "")


def test_client_reports_server_message(server):
    with HttpRetriever(server.url) as client:
        with pytest.raises(RetrievalServerError, match=r"422 out_of_range \(field topk\)") as err:
            client.search(["river"], topn=0)
    assert err.value.status == 422 and "1..20" in str(err.value)


# ---------------------------------------------------------------------- batching, failures


def test_concurrent_clients_are_batched():
    backend = FakeBackend(delay_s=0.01)  # a slow backend lets requests pile up, as in real use
    n_threads, per_thread = 24, 4
    cfg = _cfg(batch_wait_ms=5.0, max_batch_queries=64)

    def worker(url: str, i: int) -> bool:
        with HttpRetriever(url, max_queries_per_request=8) as client:
            for j in range(per_thread):
                query, topk = f"{TOPICS[(i + j) % 10]} {ASPECTS[i % 3]}", 1 + (i + j) % 7
                if client.search([query], topk) != backend.search([query], topk):
                    return False
        return True

    with ServerThread(backend, cfg) as srv:
        backend.calls.clear()
        with ThreadPoolExecutor(n_threads) as pool:
            ok = list(pool.map(lambda i: worker(srv.url, i), range(n_threads)))
        stats = srv.stats.snapshot()
        server_calls = list(backend.calls)
    assert all(ok)
    assert stats["requests"] == n_threads * per_thread
    assert stats["backend_calls"] < stats["requests"] / 2, stats
    assert stats["max_batch_requests_seen"] > 1 and stats["mean_batch_queries"] > 2 and stats["batch_windows"] > 0
    # the reference answers above also called backend.search; count only the server's calls
    from_server = [c for c in server_calls if c[0] > 1]
    assert from_server and max(n for n, _ in server_calls) <= 64


def test_backend_error_is_json_and_server_survives():
    with serve_in_background(ExplodingBackend(), _cfg()) as url:
        bad = httpx.post(f"{url}/retrieve", json={"queries": ["boom"], "return_scores": True})
        good = httpx.post(f"{url}/retrieve", json={"queries": ["castle"], "topk": 2})
        stats = httpx.get(f"{url}/stats").json()
        with HttpRetriever(url, retries=0) as client, pytest.raises(
                RetrievalServerError, match="index shard offline"):
            client.search(["boom again"], 2)
    assert bad.status_code == 500
    assert bad.json()["error"]["code"] == "backend_error"
    assert "index shard offline" in bad.json()["error"]["message"]
    assert good.status_code == 200 and len(good.json()["result"][0]) == 2
    assert stats["backend_errors"] == 1


def test_client_errors_when_server_down():
    with socket.socket() as sock:  # a port that nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = HttpRetriever(f"http://127.0.0.1:{port}", retries=1, backoff_s=0.01, timeout=2.0)
    with pytest.raises(RetrievalServerUnavailable, match=f"127.0.0.1:{port}.*2 attempt"):
        client.search(["anything"], 3)
    with pytest.raises(RetrievalServerUnavailable, match="Is it running"):
        client.health()
    with pytest.raises(ValueError, match="http://"):
        HttpRetriever("localhost:8000")


def test_large_request_is_split_into_backend_sized_calls():
    backend = FakeBackend()
    queries = [f"{t} legends" for t in TOPICS]  # 10 queries, backend calls of at most 4
    with serve_in_background(backend, _cfg(max_batch_queries=4)) as url:
        body = httpx.post(f"{url}/retrieve", json={"queries": queries, "topk": 2,
                                                   "return_scores": True}).json()
        server_calls = list(backend.calls)
    assert [[h["document"]["id"] for h in row] for row in body["result"]] == [
        [p.id for p in row] for row in backend.search(queries, 2)]
    assert sorted(n for n, _ in server_calls) == [2, 4, 4]


def test_slow_backend_gives_504_and_client_timeout_message():
    with serve_in_background(FakeBackend(delay_s=0.4), _cfg(request_timeout_s=0.1)) as url:
        slow = httpx.post(f"{url}/retrieve", json={"queries": ["desert"]})
    assert slow.status_code == 504 and slow.json()["error"]["code"] == "timeout"
    with serve_in_background(FakeBackend(delay_s=0.4), _cfg()) as url:
        with HttpRetriever(url, timeout=0.15, retries=0) as client, pytest.raises(
                RetrievalServerUnavailable, match="timed out after 0.15 s"):
            client.search(["desert"], 1)


def test_backend_returning_wrong_shapes_is_a_json_500():
    class WrongShapes(FakeBackend):
        def search(self, queries, topn):
            return [[{"id": "x"}]] if queries[0] == "dicts" else []

    with serve_in_background(WrongShapes(), _cfg()) as url:
        for query in ("dicts", "too few"):
            bad = httpx.post(f"{url}/retrieve", json={"queries": [query]})
            assert bad.status_code == 500 and bad.json()["error"]["code"] == "backend_error"
        assert httpx.get(f"{url}/health").status_code == 200


def test_an_idle_server_answers_a_lone_request_without_waiting_for_a_batch_window():
    backend = FakeBackend()
    cfg = _cfg(batch_wait_ms=2_000.0)  # a window no test could miss: every request would take >= 2 s
    with ServerThread(backend, cfg) as srv:
        with HttpRetriever(srv.url) as client:
            for i in range(3):  # one client, one request at a time
                assert client.search([TOPICS[i]], 2) == backend.search([TOPICS[i]], 2)
        stats = srv.stats.snapshot()
    assert stats["requests"] == 3 and stats["backend_calls"] == 3
    assert stats["batch_windows"] == 0  # no request was held back for company


# ---------------------------------------------------------------------- faults a long run meets


def _raw(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _read_response(sock: socket.socket) -> str:
    """One HTTP response off a raw socket: headers, then as many body bytes as Content-Length says
    (they may come in several segments)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return (head + b"\r\n\r\n" + body).decode()


def test_a_flood_beyond_the_queue_gets_503_with_retry_after_and_the_queue_stays_bounded():
    backend = FakeBackend(delay_s=0.3)  # slow: requests pile up behind the one in the backend
    cfg = _cfg(max_pending_queries=3, max_batch_queries=1, retry_after_s=2)
    with ServerThread(backend, cfg) as srv:
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda i: httpx.post(f"{srv.url}/retrieve", json={"queries": [TOPICS[i % 10]]},
                                                         timeout=30), range(16)))
        after = httpx.post(f"{srv.url}/retrieve", json={"queries": ["castle"], "topk": 1}, timeout=30)
        stats = srv.stats.snapshot()
    refused = [a for a in answers if a.status_code == 503]
    assert refused and all(a.headers["retry-after"] == "2" and a.json()["error"]["code"] == "overloaded" for a in refused)
    assert all(a.status_code in (200, 503) for a in answers) and len(refused) < 16
    assert stats["max_batch_queries_seen"] == 1 and after.status_code == 200
    assert stats["backend_calls"] <= 16 - len(refused) + 1  # refused requests never reached the backend


def test_a_client_that_stalls_while_sending_its_body_gets_408_and_frees_the_server(backend):
    with serve_in_background(backend, _cfg(body_timeout_s=0.5)) as url:
        with _raw(url) as sock:
            sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{\"queries\": [")  # 13 of 100 bytes, then silence
            reply = _read_response(sock)
        assert reply.startswith("HTTP/1.1 408") and "body_timeout" in reply
        assert httpx.post(f"{url}/retrieve", json={"queries": ["castle"], "topk": 1}).status_code == 200


def test_clients_that_disconnect_mid_request_leave_the_server_serving():
    backend = FakeBackend(delay_s=0.2)
    with ServerThread(backend, _cfg()) as srv:
        body = b'{"queries": ["castle walls"], "topk": 2}'
        for _ in range(5):  # the whole request, then gone before the answer
            with _raw(srv.url) as sock:
                sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        with _raw(srv.url) as sock:  # and one gone halfway through its body
            sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"que")
        time.sleep(0.5)
        ok = httpx.post(f"{srv.url}/retrieve", json={"queries": ["castle"], "topk": 1}, timeout=30)
        stats = srv.stats.snapshot()
    assert ok.status_code == 200 and len(ok.json()["result"][0]) == 1
    assert stats["backend_errors"] == 0


@pytest.mark.parametrize("method, path, status, code", [
    ("POST", "/nope", 404, "not_found"),
    ("GET", "/retrieve", 405, "method_not_allowed"),
    ("PUT", "/health", 405, "method_not_allowed"),
    ("POST", "/retrieve", 413, "body_too_large"),
])
def test_a_10_mb_body_to_any_path_gets_a_json_error_a_plain_urllib_client_can_read(backend, method, path, status, code):
    import json
    import urllib.error
    import urllib.request

    huge = b'{"queries": ["' + b"y" * 10_000_000 + b'"]}'  # 10 MB; the limit is 1 MB
    with serve_in_background(backend, _cfg()) as url:
        request = urllib.request.Request(f"{url}{path}", data=huge, method=method, headers={"content-type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as err:  # not a URLError: connection reset by peer
            urllib.request.urlopen(request, timeout=30)
        assert err.value.code == status and json.loads(err.value.read())["error"]["code"] == code
        assert httpx.post(f"{url}/retrieve", json={"queries": ["castle"], "topk": 1}).status_code == 200  # still serving
