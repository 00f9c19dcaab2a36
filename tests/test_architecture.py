"""The package's shape: config is a leaf, the layer contract holds, generated docs are current,
and two runs' records can be compared table by table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cosearch_lib.records.compare import compare_tables, diff_table
from cosearch_lib.records.docs import GLOSSARIES, generated_pages, render_metrics_page
from cosearch_lib.records.markdown_tables import markdown_cell, markdown_table

ROOT = Path(__file__).resolve().parents[1]


def _modules_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return set(out.stdout.split())


def test_loading_a_profile_imports_no_torch_and_no_fastapi():
    loaded = _modules_after("from cosearch_lib.config import load_profile; load_profile('demo'); load_profile('ci')")
    heavy = {m for m in loaded if m.split(".")[0] in {"torch", "fastapi", "transformers", "peft", "trl", "pandas", "numpy"}}
    assert not heavy, f"config pulled in {sorted(heavy)[:5]}"
    assert "cosearch_lib.config" in loaded
    outside = {m for m in loaded if m.startswith("cosearch_lib.") and m != "cosearch_lib.paths"
               and m != "cosearch_lib.config" and not m.startswith("cosearch_lib.config.")}
    assert not outside, f"config pulled in {sorted(outside)[:5]}"


def test_the_layer_contract_holds():
    """import-linter's contracts (pyproject.toml): layers, config as a leaf, no sibling cycles."""
    lint = Path(sys.executable).parent / "lint-imports"
    if not lint.exists():
        pytest.skip("import-linter is not installed (pip install -e .[dev])")
    out = subprocess.run([str(lint), "--no-cache"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:]
    assert out.stdout.count("KEPT") == 4


def test_no_module_imports_package_code_inside_a_function():
    """Imports inside functions hide cycles; only optional heavy packages may be imported lazily
    (and the CLI, which nothing imports, so that `cosearch --help` does not load torch)."""
    import ast

    lazy_ok = {"vllm", "unsloth", "faiss", "wandb", "torch.utils.tensorboard", "IPython", "IPython.display",
               "huggingface_hub", "vllm.lora.request", "vllm.inputs", "torch", "vllm.lora.ops.torch_ops",
               "vllm.lora.punica_wrapper"}
    offenders = []
    for path in sorted((ROOT / "cosearch_lib").rglob("*.py")):
        if path.name == "cli.py":  # the top of the stack: commands import their modules when they run
            continue
        tree = ast.parse(path.read_text())
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top:
                mod = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                if isinstance(node, ast.ImportFrom) and node.level:
                    mod = "." + (mod or "")
                if mod is None or mod.startswith((".", "cosearch_lib")) or mod not in lazy_ok:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {mod}")
    # torch stays lazy only where it is optional (seeding, provenance); TYPE_CHECKING blocks are top-level Ifs
    assert not offenders, offenders


def _private_imports(source: str) -> list[str]:
    """``module.name`` for every underscore-prefixed name (or module) that ``source`` imports from
    package code: ``from cosearch_lib.x import _y``, ``from .x import _y``, ``import cosearch_lib._x``.
    Dunder names (``__version__``) are public; other packages' private names are their business."""
    import ast

    def private(name: str) -> bool:
        return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if node.level or module.split(".")[0] == "cosearch_lib":
                found += [f"{module}.{a.name}" for a in node.names
                          if private(a.name) or any(private(part) for part in module.lstrip(".").split(".") if part)]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names
                      if a.name.split(".")[0] == "cosearch_lib" and any(private(part) for part in a.name.split("."))]
    return found


def test_the_private_import_check_finds_what_it_should():
    source = """
from cosearch_lib.models.registry import load_causal_lm, _hidden
from .sibling import _helper
from cosearch_lib.x._internal import thing
import cosearch_lib.y._impl
from torch import _C
from cosearch_lib import __version__
def f():
    from cosearch_lib.eval.harness import _late
"""
    assert sorted(_private_imports(source)) == sorted([
        "cosearch_lib.models.registry._hidden", ".sibling._helper", "cosearch_lib.x._internal.thing",
        "cosearch_lib.y._impl", "cosearch_lib.eval.harness._late"])
    assert _private_imports("from cosearch_lib.models.registry import load_causal_lm\nimport torch._dynamo\n") == []


def test_no_module_imports_another_modules_private_names():
    """A name with a leading underscore is its module's own: another module that needs it gets a
    public name (one home, one contract), not a reach into the module's insides."""
    offenders = {str(path.relative_to(ROOT)): found for path in sorted((ROOT / "cosearch_lib").rglob("*.py"))
                 if (found := _private_imports(path.read_text()))}
    assert not offenders, offenders


def test_adapter_switching_imports_no_generation_engine():
    """The policy update switches adapters; that must not load the transformers loop or vLLM."""
    loaded = _modules_after("import cosearch_lib.models.generation.adapters")
    engines = {"cosearch_lib.models.generation.transformers_backend", "cosearch_lib.models.generation.vllm_backend",
               "cosearch_lib.models.generation.backend_factory", "vllm"}
    assert "cosearch_lib.models.generation.adapters" in loaded
    assert not loaded & engines, sorted(loaded & engines)


#: The most lines a module of the package may have: a hub is split by stage, not grown.
MAX_MODULE_LINES = 500


def test_no_module_of_the_package_exceeds_the_size_limit():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in (ROOT / "cosearch_lib").rglob("*.py")}
    assert len(sizes) > 60  # the walk found the package
    too_big = {path: n for path, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not too_big, f"split these by stage (limit {MAX_MODULE_LINES} lines): {too_big}"


def test_module_names_are_unique_across_the_package():
    stems = [p.stem for p in (ROOT / "cosearch_lib").rglob("*.py") if p.stem != "__init__"]
    dupes = sorted({s for s in stems if stems.count(s) > 1})
    assert not dupes, f"module names used twice: {dupes}"


def test_public_names_are_unique_across_the_package():
    """One name, one home: a public function, class or constant is defined in one module only."""
    import ast
    from collections import defaultdict

    homes = defaultdict(list)
    for path in sorted((ROOT / "cosearch_lib").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            else:
                continue
            for name in names:
                if not name.startswith("_"):
                    homes[name].append(str(path.relative_to(ROOT)))
    assert not {n: h for n, h in homes.items() if len(h) > 1}


def test_generated_docs_are_current():
    for path, text in generated_pages().items():
        assert path.exists(), f"{path.name} missing: run `cosearch docs`"
        assert path.read_text() == text, f"{path.relative_to(ROOT)} is out of date: run `cosearch docs`"


def test_a_profile_setting_changed_without_method_md_makes_the_docs_stale(monkeypatch, tmp_path):
    """METHOD.md Section 10's table is the profiles' settings: a profile whose N, K, G or temperature
    changes leaves the committed page stale until `cosearch docs` rewrites it."""
    import yaml

    import cosearch_lib.records.settings_page as settings_page
    from cosearch_lib.config import load_profile
    from cosearch_lib.records.docs import write_generated_docs

    method = ROOT / "docs" / "METHOD.md"
    assert method not in write_generated_docs(check=True)
    changes = {"N": {"search": {"topn": 12}}, "K": {"search": {"topk": 3}}, "G": {"training": {"group_size": 8}},
               "temperature": {"rollout": {"temperature": 0.3}}}
    for name, change in changes.items():
        changed = tmp_path / f"demo_{name}.yaml"
        changed.write_text(yaml.safe_dump({"extends": "demo", "profile": "demo", **change}))
        monkeypatch.setattr(settings_page, "load_profile", lambda p, f=changed: load_profile(str(f) if p == "demo" else p))
        assert method in write_generated_docs(check=True), name


def test_metrics_page_lists_every_glossary_entry():
    page = render_metrics_page()
    for _, _, glossary, home in GLOSSARIES:
        assert home in page
        missing = [k for k in glossary if f"| {markdown_cell(f'`{k}`')} |" not in page]
        assert not missing, f"{home}: {missing}"


def test_markdown_table_orders_columns_and_blanks_missing_values():
    rows = [{"data_source": "avg", "R@10": 0.5, "R@2": float("nan")}, {"data_source": "syn_nq", "R@10": 1.0}]
    text = markdown_table(rows)
    assert text.splitlines()[0] == "| data_source | R@2 | R@10 |"
    assert "| avg |  | 0.500 |" in text and "| syn_nq |  | 1.000 |" in text


def _write(folder: Path, name: str, df: pd.DataFrame) -> None:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(path) if name.endswith(".parquet") else df.to_csv(path, index=False)


def test_compare_tables_ignores_timing_and_finds_real_differences(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    base = pd.DataFrame({"step": [0, 1], "agent_reward": [0.2, float("nan")], "rollout_s": [1.0, 2.0], "wall_s": [3.0, 4.0]})
    _write(a, "training/cosearch/steps.csv", base)
    _write(b, "training/cosearch/steps.csv", base.assign(rollout_s=[9.0, 9.0], wall_s=[1.0, 1.0]))  # timing only
    _write(a, "02_eval_records.parquet", pd.DataFrame({"f1": [0.5, 1.0], "prediction": ["x", "y"]}))
    _write(b, "02_eval_records.parquet", pd.DataFrame({"f1": [0.5, 1.0], "prediction": ["x", "z"]}))
    _write(a, "only_here.csv", base)
    report = compare_tables(a, b).set_index("table")
    assert report.loc["training/cosearch/steps.csv", "status"] == "identical"  # NaN == NaN, timing ignored
    assert report.loc["02_eval_records.parquet", "status"] == "differs"
    assert "prediction (rows [1]" in report.loc["02_eval_records.parquet", "detail"]
    assert report.loc["only_here.csv", "status"] == "missing in second"
    assert diff_table(base, base.drop(columns="agent_reward")).startswith("columns differ")
    assert diff_table(base, base.iloc[:1]) == "2 rows against 1"
    assert diff_table(base, base[list(reversed(base.columns))]) is None  # the same columns in another order
    assert diff_table(base, base.assign(agent_reward=[0.2, 0.3])).startswith("agent_reward (rows [1]")


def test_compare_runs_cli_exit_code(tmp_path, capsys):
    from cosearch_lib.cli import main

    a, b = tmp_path / "a", tmp_path / "b"
    _write(a, "t.csv", pd.DataFrame({"x": [1]}))
    _write(b, "t.csv", pd.DataFrame({"x": [1]}))
    assert main(["compare-runs", str(a), str(b)]) == 0
    _write(b, "t.csv", pd.DataFrame({"x": [2]}))
    assert main(["compare-runs", str(a), str(b)]) == 1
    assert "0 of 1 tables identical" in capsys.readouterr().out


def test_the_cli_answers_without_loading_the_heavy_stack():
    loaded = _modules_after("from cosearch_lib.cli import build_parser; build_parser()")
    assert not {m for m in loaded if m.split(".")[0] in {"torch", "transformers", "papermill", "fastapi"}}


def test_the_module_table_lists_every_module_by_its_docstring_and_refuses_one_without(tmp_path):
    from cosearch_lib.records.architecture_page import module_purpose, module_table

    table = module_table()
    modules = [p.relative_to(ROOT / "cosearch_lib") for p in (ROOT / "cosearch_lib").rglob("*.py")]
    assert all(f"| `{m}` |" in table for m in modules) and table.count("\n| `") == len(modules)
    assert table.index("`cli.py`") < table.index("`rl/trainer.py`") < table.index("`paths.py`")  # layer order, top down
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "stage.py").write_text('"""One stage: :func:`run` with ``x``.\n\nDetails."""\n')
    assert module_purpose(tmp_path / "pkg" / "stage.py") == "One stage: `run` with `x`."
    (tmp_path / "pkg" / "bare.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="no module docstring"):
        module_table(tmp_path / "pkg")


def test_log_index_links_every_entry_by_githubs_anchor_and_links_into_the_log_resolve():
    import re

    from cosearch_lib.records.log_page import github_anchor, log_entries

    assert github_anchor("2026-11-28, fifth session (issue 47): a step's rows; `.ci/run` 28:30, then ~27:50") == \
        "2026-11-28-fifth-session-issue-47-a-steps-rows-cirun-2830-then-2750"
    seen: dict[str, int] = {}
    assert [github_anchor("Notes", seen) for _ in range(3)] == ["notes", "notes-1", "notes-2"]
    log = (ROOT / "docs" / "LOG.md").read_text()
    entries = log_entries(log)
    assert len(entries) == sum(line.startswith("## ") for line in log.splitlines()) > 30
    index = log.split("<!-- end of index -->")[0]
    assert all(f"](#{anchor})" in index for _, anchor in entries)
    anchors = {a for _, a in entries}
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    links = [(p.name, a) for p in pages for a in re.findall(r"LOG\.md#([\w-]+)", p.read_text())]
    assert not [link for link in links if link[1] not in anchors]  # a renamed entry breaks no link
