"""A local stand-in for the Hugging Face hub: the real ``huggingface_hub`` client downloads from it.

Point ``HF_ENDPOINT`` at it and ``snapshot_download`` / ``hf_hub_download`` (and ``cosearch download``,
which calls them) run their own code against files on this machine. It serves a folder laid out as
the hub names repositories::

    <root>/datasets/<org>/<name>/<files...>     hzeng/co-search-train, PeterJinGo/wiki-18-corpus, ...
    <root>/models/<org>/<name>/<files...>       HuggingFaceTB/SmolLM2-135M-Instruct, ...

and answers the endpoints the client calls (huggingface_hub 1.x; the 0.x ``siblings`` list too):

* ``GET /api/{datasets,models}/<repo>/revision/<rev>``: ``{"id", "sha", "siblings"}``;
* ``GET /api/{datasets,models}/<repo>/tree/<rev>``: the file list (``type, path, size, oid``);
* ``HEAD|GET /datasets/<repo>/resolve/<rev>/<file>`` and ``/<repo>/resolve/<rev>/<file>``: the file,
  with the headers the client requires (``X-Repo-Commit`` equal to the revision's ``sha``, an
  ``ETag``, ``Content-Length``). No ``X-Xet-*`` header is sent, so the client uses plain HTTP.

A missing repository or file is a 404 with ``X-Error-Code`` (``RepoNotFound``, ``EntryNotFound``),
which the client turns into its typed errors. ``requests`` counts what was asked, for tests.

Run by hand: ``python tests/hub_standin.py --root DIR [--port 0]`` prints its URL.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

_KINDS = {"datasets": "datasets", "models": "models"}


class HubStandin:
    """The server over ``root``; a context manager that serves on a thread."""

    def __init__(self, root: str | Path, host: str = "127.0.0.1", port: int = 0) -> None:
        self.root = Path(root)
        self.requests: Counter[str] = Counter()  # "GET /api/datasets/..." -> count
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                standin._answer(self, body=True)

            def do_HEAD(self) -> None:  # noqa: N802
                standin._answer(self, body=False)

            def log_message(self, *args) -> None:  # quiet
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> HubStandin:
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    # ------------------------------------------------------------------ repositories

    def repo_dir(self, kind: str, repo: str) -> Path:
        return self.root / kind / repo

    def files(self, kind: str, repo: str) -> list[str]:
        folder = self.repo_dir(kind, repo)
        return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())

    def sha(self, kind: str, repo: str) -> str:
        """A 40-hex commit id that changes when any file's name or size does."""
        folder = self.repo_dir(kind, repo)
        listing = [(f, (folder / f).stat().st_size) for f in self.files(kind, repo)]
        return hashlib.sha1(json.dumps([kind, repo, listing]).encode()).hexdigest()

    # ------------------------------------------------------------------ requests

    def _answer(self, h: BaseHTTPRequestHandler, *, body: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        self.requests[f"{h.command} {path}"] += 1
        parts = [p for p in path.split("/") if p]
        try:
            if parts[:1] == ["api"] and len(parts) >= 6 and parts[1] in _KINDS:
                kind, repo, what = parts[1], "/".join(parts[2:4]), parts[4]
                self._need_repo(kind, repo)
                if what == "revision":
                    return self._json(h, {"id": repo, "sha": self.sha(kind, repo),
                                          "siblings": [{"rfilename": f} for f in self.files(kind, repo)]}, body)
                if what == "tree":
                    folder = self.repo_dir(kind, repo)
                    return self._json(h, [{"type": "file", "path": f, "size": (folder / f).stat().st_size,
                                           "oid": _etag(folder / f)} for f in self.files(kind, repo)], body)
            kind = "datasets" if parts[:1] == ["datasets"] else "models"
            rest = parts[1:] if kind == "datasets" else parts
            if len(rest) >= 5 and rest[2] == "resolve":
                repo, file = "/".join(rest[:2]), "/".join(rest[4:])
                self._need_repo(kind, repo)
                target = self.repo_dir(kind, repo) / file
                if not target.is_file():
                    raise _NotFound("EntryNotFound", f"{file} is not in {repo}")
                return self._file(h, target, self.sha(kind, repo), body)
            raise _NotFound("RepoNotFound", f"no route for {path}")
        except _NotFound as err:
            data = json.dumps({"error": err.message}).encode()
            h.send_response(404)
            h.send_header("X-Error-Code", err.code)
            h.send_header("X-Error-Message", err.message)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            if body:
                h.wfile.write(data)

    def _need_repo(self, kind: str, repo: str) -> None:
        if not self.repo_dir(kind, repo).is_dir():
            raise _NotFound("RepoNotFound", f"{kind[:-1]} repository {repo} not found")

    @staticmethod
    def _json(h: BaseHTTPRequestHandler, obj: object, body: bool) -> None:
        data = json.dumps(obj).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if body:
            h.wfile.write(data)

    @staticmethod
    def _file(h: BaseHTTPRequestHandler, target: Path, sha: str, body: bool) -> None:
        size = target.stat().st_size
        h.send_response(200)
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Content-Length", str(size))
        h.send_header("ETag", f'"{_etag(target)}"')
        h.send_header("X-Repo-Commit", sha)
        h.end_headers()
        if body:
            with open(target, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    h.wfile.write(chunk)


class _NotFound(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _etag(path: Path) -> str:
    """sha1 of the bytes (the hub's ETag of a small file is its git blob id; any stable hex works)."""
    digest = hashlib.sha1()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def main() -> None:  # pragma: no cover - by hand
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    standin = HubStandin(args.root, args.host, args.port)
    print(standin.url, flush=True)
    standin._server.serve_forever()


if __name__ == "__main__":  # pragma: no cover
    main()
