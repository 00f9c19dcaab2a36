"""Downloads of the paper-scale artefacts (CoSearch QA files, wiki-18 corpus, Search-R1's e5 index).

Only for cluster runs; the embedded default downloads nothing. An unreachable hub is a
:class:`HubUnavailableError` that names the command to fetch the file by hand. Multi-part files are
merged atomically (``merge_parts``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any

from cosearch_lib.atomic_io import apply_umask
from cosearch_lib.config import ConfigError, DataConfig
from cosearch_lib.data.qa_formats import QA_SUFFIXES
from cosearch_lib.paths import data_dir, profile_data_path
from cosearch_lib.progress import tqdm

COSEARCH_REPOS = {"train": "hzeng/co-search-train", "eval": "hzeng/co-search-eval"}
#: The profile split each CoSearch file serves (``data.qa_paths``): the eval file is the test split.
COSEARCH_SPLITS = {"train": "train", "eval": "test"}
WIKI18_CORPUS_REPO = "PeterJinGo/wiki-18-corpus"
WIKI18_CORPUS_FILE = "wiki-18.jsonl.gz"
WIKI18_INDEX_REPO = "PeterJinGo/wiki-18-e5-index"
WIKI18_INDEX_PARTS = ("part_aa", "part_ab")
WIKI18_INDEX_FILE = "e5_Flat.index"


class HubUnavailableError(RuntimeError):
    """A Hugging Face download failed (offline machine, missing file, no access)."""


def cosearch_folder(which: str) -> str:
    """``"train"`` -> ``"co-search-train"``: the folder a CoSearch file lands in is its hub repo's name,
    the layout ``paper.yaml``'s ``data.qa_paths`` read."""
    return COSEARCH_REPOS[which].split("/")[1]


# ----------------------------------------------------------------------------- downloads


def download_cosearch_data(
    dest: str | os.PathLike | None = None, which: Iterable[str] = ("train", "eval"),
    *, folders: dict[str, str | os.PathLike] | None = None,
) -> dict[str, list[Path]]:
    """Fetch ``hzeng/co-search-{train,eval}`` into ``dest/co-search-{train,eval}``; returns their parquet files.

    Default ``dest`` is ``data_dir()/"cosearch"``; ``folders`` ({"train": dir, "eval": dir}) names
    each file's folder instead (``cosearch download --profile``: where the profile reads it). Only
    needed on a machine with internet access (the cluster); development machines use the embedded world.
    """
    dest = Path(dest) if dest is not None else data_dir() / "cosearch"
    out: dict[str, list[Path]] = {}
    for name in which:
        if name not in COSEARCH_REPOS:
            raise ValueError(f"which must name some of {sorted(COSEARCH_REPOS)}, got {name!r}")
        repo = COSEARCH_REPOS[name]
        folder = Path(folders[name]) if folders and name in folders else dest / cosearch_folder(name)
        hub = _hub()
        local = _hub_call(
            repo, "all parquet files",
            lambda hub=hub, repo=repo, folder=folder: hub.snapshot_download(
                repo_id=repo, repo_type="dataset", local_dir=str(folder),
                allow_patterns=["*.parquet", "*.md"],
            ),
        )
        files = sorted(Path(local).rglob("*.parquet"))
        if not files:
            raise HubUnavailableError(f"{repo} downloaded to {local} but holds no .parquet files")
        out[name] = files
    return out


def download_wiki18_corpus(dest: str | os.PathLike | None = None) -> Path:
    """Fetch Search-R1's wiki-18 corpus (``wiki-18.jsonl.gz``, ~21M passages) into ``dest``."""
    dest = Path(dest) if dest is not None else data_dir() / "wiki18"
    return _hub_file(WIKI18_CORPUS_REPO, WIKI18_CORPUS_FILE, dest)


def download_wiki18_e5_index_to(target: str | os.PathLike, *, keep_parts: bool = False) -> Path:
    """:func:`download_wiki18_e5_index` merged into the file ``target`` (any name; the parts are
    fetched beside it)."""
    target = Path(target)
    if target.is_file():
        return target
    parts = [_hub_file(WIKI18_INDEX_REPO, name, target.parent) for name in WIKI18_INDEX_PARTS]
    merged = merge_parts(parts, target)
    if not keep_parts:
        for p in parts:
            p.unlink(missing_ok=True)
    return merged


def download_wiki18_e5_index(
    dest: str | os.PathLike | None = None, *, keep_parts: bool = False
) -> Path:
    """Fetch the e5-base-v2 flat index parts and join them into ``dest/e5_Flat.index``.

    The hub stores the index split in two (``part_aa``, ``part_ab``: ``split`` output, joined by
    plain concatenation). The parts are deleted after a verified merge unless ``keep_parts``,
    because keeping both copies doubles a ~65 GB footprint. An existing
    merged file is reused as is: the merge is atomic, so a file under that name is complete
    (delete it to fetch again).
    """
    dest = Path(dest) if dest is not None else data_dir() / "wiki18"
    return download_wiki18_e5_index_to(dest / WIKI18_INDEX_FILE, keep_parts=keep_parts)


def merge_parts(
    parts: Sequence[str | os.PathLike],
    dest: str | os.PathLike,
    *,
    chunk_size: int = 64 << 20,
    progress: bool = True,
) -> Path:
    """Concatenate ``parts`` in order into ``dest``; all or nothing.

    Streams in ``chunk_size`` chunks (the parts are tens of GB) into a temp file beside ``dest``,
    checks the total size, then renames it into place, so an interrupted merge never leaves a
    truncated index that FAISS would later fail to read (or worse, read).
    """

    parts = [Path(p) for p in parts]
    dest = Path(dest)
    if not parts:
        raise ValueError("merge_parts needs at least one part")
    for p in parts:
        if not p.is_file():
            raise FileNotFoundError(f"part file not found: {p}")
    expected = sum(p.stat().st_size for p in parts)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".partial")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, tqdm(
            total=expected, unit="B", unit_scale=True, desc=f"merging {dest.name}", disable=not progress
        ) as bar:
            for p in parts:
                _copy_into(p, out, chunk_size, bar)
            out.flush()
            os.fsync(out.fileno())
        written = tmp.stat().st_size
        if written != expected:
            raise OSError(f"merged {dest.name} has {written} bytes, expected {expected} (sum of parts)")
        apply_umask(tmp)  # mkstemp's 0600 would hide the file from the rest of a cluster group
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return dest


def _copy_into(src: Path, out: IO[bytes], chunk_size: int, bar: Any) -> None:
    with open(src, "rb") as fh:
        while chunk := fh.read(chunk_size):
            out.write(chunk)
            bar.update(len(chunk))


def _hub():
    """huggingface_hub, imported only when a download is asked for."""
    try:
        import huggingface_hub
    except ImportError as e:  # pragma: no cover - it is a core dependency
        raise ImportError("downloads need huggingface_hub: pip install huggingface_hub") from e
    return huggingface_hub


def _hub_file(repo: str, filename: str, dest: Path) -> Path:
    hub = _hub()
    dest.mkdir(parents=True, exist_ok=True)
    local = _hub_call(
        repo, filename,
        lambda: hub.hf_hub_download(
            repo_id=repo, filename=filename, repo_type="dataset", local_dir=str(dest)
        ),
    )
    return Path(local)


def _hub_call(repo: str, what: str, call) -> str:
    """Run one hub call; any failure becomes an error that says what to fetch and how."""
    try:
        return call()
    except Exception as e:  # offline, 404, gated, proxy: the advice is the same
        raise HubUnavailableError(
            f"could not download {what} from the Hugging Face dataset {repo!r} "
            f"({type(e).__name__}: {e}). This needs internet access to huggingface.co: run on a "
            f"machine that has it (e.g. a cluster login node) with "
            f"`huggingface-cli download {repo} --repo-type dataset --local-dir <dir>`, "
            f"or set HF_ENDPOINT to a reachable mirror, then point the profile at the files."
        ) from e


# ----------------------------------------------------------------------------- where a profile reads them


def profile_targets(data_cfg: DataConfig) -> dict[str, Any]:
    """Where a profile reads each artefact (``data`` section, ``data.root`` resolved): the CoSearch
    folders ``{"train": dir, "eval": dir}``, the corpus file and the index file. ``cosearch download
    WHAT --profile P`` writes there, so the files land where the profile looks for them. A setting
    that cannot hold a download (a QA *file* where the hub gives a folder) is a ConfigError naming it."""
    targets: dict[str, Any] = {}
    qa = {}
    for which, split in COSEARCH_SPLITS.items():
        value = data_cfg.qa_paths.get(split)
        if value is None:
            continue
        path = profile_data_path(data_cfg.root, value)
        if any(path.name.lower().endswith(s) for s in QA_SUFFIXES):
            raise ConfigError(f"data.qa_paths.{split}: {value!r} names a file, but {COSEARCH_REPOS[which]} downloads "
                              f"as a folder of parquet files; name a folder, e.g. cosearch/{cosearch_folder(which)}")
        qa[which] = path
    if qa:
        targets["cosearch-data"] = qa
    if data_cfg.corpus_path:
        targets["wiki18-corpus"] = profile_data_path(data_cfg.root, data_cfg.corpus_path)
    if data_cfg.index_path:
        targets["wiki18-index"] = profile_data_path(data_cfg.root, data_cfg.index_path)
    return targets


def download_for_profile(data_cfg: DataConfig, what: str) -> Any:
    """Fetch ``what`` (``cosearch-data``, ``wiki18-corpus`` or ``wiki18-index``) to where the profile reads it."""
    targets = profile_targets(data_cfg)
    if what not in targets:
        key = {"cosearch-data": "data.qa_paths.train / data.qa_paths.test", "wiki18-corpus": "data.corpus_path",
               "wiki18-index": "data.index_path"}.get(what)
        if key is None:
            raise ValueError(f"unknown download {what!r}; expected one of cosearch-data, wiki18-corpus, wiki18-index")
        raise ConfigError(f"the profile sets no {key}, so it reads no {what}; set it (papermill_runs/params/paper.yaml shows how)")
    if what == "cosearch-data":
        folders = targets[what]
        return download_cosearch_data(which=tuple(folders), folders=folders)
    if what == "wiki18-corpus":
        target = targets[what]
        got = download_wiki18_corpus(target.parent)
        if got != target:  # the profile names the file otherwise: same bytes, its name
            os.replace(got, target)
        return target
    return download_wiki18_e5_index_to(targets[what])
