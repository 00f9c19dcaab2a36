"""Names that exist: every Python name the docs and the library's own prose point at resolves.

Collected from README.md and docs/*.md (not docs/LOG.md, a dated history) and from
cosearch_lib's docstrings, comments and glossary texts (the ``*_GLOSSARY`` tables that
docs/METRICS.md is generated from). A dotted name is taken as meant for Python when it

* starts with ``cosearch_lib.``;
* starts with a module or subpackage of cosearch_lib, the short form relative to the package
  (``rl.trainer.STEP_GLOSSARY``, ``config.GRPOConfig``), unless it is a profile key path instead
  (``models.batch_size``, ``training.grouping.k_min``: dataclass fields of ``ProfileConfig``);
* starts with a lower-case word and holds a class-like (``CamelCase``) or constant-like
  (``UPPER_CASE``) part, the shape of a module attribute (``grouping.GROUPING_GLOSSARY``),
  unless its first part is a module outside cosearch_lib or a common alias of one (``np``);
* starts with a class of cosearch_lib (``JointTrainer.train_step``); or
* sits in a Sphinx role in a docstring (``:func:`name```), where a bare name is looked up in
  the docstring's own module first.

File names (``config.py``, ``steps.csv``) are not names. Resolving imports the longest module
prefix and getattr's the rest; a dataclass field or an attribute a class sets on ``self`` counts
as an attribute of the class.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import io
import re
import tokenize
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "cosearch_lib"

#: docs pages not checked: a dated history (it names things as they were then)
SKIPPED_DOCS = {"LOG.md"}

#: Stale names in files that were being rewritten in parallel when this test was written, so they
#: were left for the merge: (file, name) -> the name that exists. Fix the file, then delete its
#: entry here (a test fails while an entry names something that no longer needs it).
PENDING_FIXES: dict[tuple[str, str], str] = {}

#: a last part that makes a dotted word a file name, not a Python name
FILE_SUFFIXES = {
    "py", "md", "json", "jsonl", "yaml", "yml", "csv", "parquet", "pt", "toml", "sbatch", "png", "pdf", "txt",
    "ipynb", "sh", "cfg", "ini", "gz", "faiss", "npy", "bin", "safetensors", "log", "html", "svg", "zip", "tar",
    "whl", "lock", "out", "err", "index", "tsv", "pkl", "ckpt",
}

#: common short names of modules outside cosearch_lib (their attributes are not ours to check)
FOREIGN_ALIASES = {"np", "pd", "plt", "nn", "F", "sp", "tf", "hf", "mpl", "sns", "ipw", "widgets"}

#: names that are written the way ours are but belong to someone else (``self`` and the like)
FOREIGN_FIRST = {"self", "cls", "super", "e", "exc", "os", "sys", "re", "json", "math", "random", "time"}

#: optional packages that may not be installed here (so they cannot be told apart by importing)
OPTIONAL_PACKAGES = {"vllm", "unsloth", "faiss", "wandb", "flash_attn", "papermill", "ipywidgets", "IPython"}

_DOTTED = re.compile(r"(?<![\w./\-@$<])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w/\-]|\.\w)")
_ROLE = re.compile(r":(?:py:)?(?:func|class|data|meth|attr|mod|exc|obj|const|property):`~?([A-Za-z_][\w.]*)`")
_BACKTICK = re.compile(r"`([^`\n]+)`")
_CAMEL = re.compile(r"^_?[A-Z][a-z0-9]+[A-Za-z0-9]*$")
_UPPER = re.compile(r"^_?[A-Z][A-Z0-9_]*[A-Z0-9]$")


@dataclass(frozen=True)
class NameUse:
    """One dotted name found in prose, with where it was written."""

    name: str  # the name as written (a role's tilde and a trailing call's parentheses dropped)
    where: str  # "path:line", path relative to the project root
    module: str | None = None  # the cosearch_lib module whose prose holds it: relative names look there first
    cls: str | None = None  # the class whose docstring (or method's docstring) holds it: bare names look there too
    role: bool = False  # written in a Sphinx role, so meant as a Python name whatever its shape


# --------------------------------------------------------------------------- collecting


def names_in_text(text: str, where_line, *, module: str | None = None, cls: str | None = None,
                  roles: bool = False) -> list[NameUse]:
    """Every dotted word of ``text`` (and, with ``roles``, every Sphinx-role target); ``where_line(i)``
    names line i (0-based) of the text."""
    found = []
    for i, line in enumerate(text.splitlines()):
        role_spans = []
        if roles:
            for m in _ROLE.finditer(line):
                found.append(NameUse(m.group(1), where_line(i), module, cls, role=True))
                role_spans.append(m.span())
        for m in _DOTTED.finditer(line):
            if not any(a <= m.start() < b for a, b in role_spans):
                found.append(NameUse(m.group(1), where_line(i), module, cls))
    return found


def names_in_markdown(path: Path) -> list[NameUse]:
    rel = path.relative_to(ROOT)
    return names_in_text(path.read_text(), lambda i: f"{rel}:{i + 1}")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def names_in_module(path: Path, source: str | None = None) -> list[NameUse]:
    """Names in a module's docstrings, comments and ``*_GLOSSARY`` texts (``source``: the file's text)."""
    rel, module = path.relative_to(ROOT), _module_name(path)
    source = path.read_text() if source is None else source
    found: list[NameUse] = []

    def add(node: ast.Constant, cls: str | None, roles: bool) -> None:
        found.extend(names_in_text(node.value, lambda i: f"{rel}:{node.lineno + i}", module=module, cls=cls,
                                   roles=roles))

    def visit(node: ast.AST, cls: str | None) -> None:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if isinstance(node, ast.ClassDef):
                cls = node.name if cls is None else f"{cls}.{node.name}"
            doc = node.body[0].value if node.body and isinstance(node.body[0], ast.Expr) else None
            if isinstance(doc, ast.Constant) and isinstance(doc.value, str):
                add(doc, cls, roles=True)
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id.endswith("_GLOSSARY") for t in targets) and node.value is not None:
            for const in ast.walk(node.value):
                if isinstance(const, ast.Constant) and isinstance(const.value, str):
                    add(const, cls, roles=False)
        for child in ast.iter_child_nodes(node):
            visit(child, cls)

    visit(ast.parse(source), None)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            found.extend(names_in_text(tok.string, lambda i, t=tok: f"{rel}:{t.start[0]}", module=module))
    return found


def collect() -> list[NameUse]:
    uses = names_in_markdown(ROOT / "README.md")
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name not in SKIPPED_DOCS:
            uses += names_in_markdown(page)
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        uses += names_in_module(path)
    return uses


# --------------------------------------------------------------------------- deciding and resolving


@cache
def package_roots() -> frozenset[str]:
    """Top-level modules and subpackages of cosearch_lib (``rl``, ``config``, ...)."""
    base = ROOT / PACKAGE
    return frozenset(p.stem for p in base.glob("*.py") if p.stem != "__init__") | frozenset(
        p.name for p in base.iterdir() if (p / "__init__.py").exists())


@cache
def package_classes() -> dict[str, list[str]]:
    """Class name -> the modules defining it at top level (read with ast, nothing imported)."""
    homes: dict[str, list[str]] = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                homes.setdefault(node.name, []).append(_module_name(path))
    return homes


@cache
def _is_foreign_module(name: str) -> bool:
    if name in OPTIONAL_PACKAGES:
        return True
    if name in package_roots() or name == PACKAGE:
        return False
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def is_python_name(use: NameUse) -> bool:
    """Whether ``use`` is meant as a Python name of ours (the module docstring's rules)."""
    parts = use.name.split(".")
    if use.role:
        return not (len(parts) > 1 and _is_foreign_module(parts[0]))
    if parts[-1] in FILE_SUFFIXES or parts[0] in FOREIGN_FIRST | FOREIGN_ALIASES:
        return False
    if parts[0] == PACKAGE or parts[0] in package_roots():
        return True
    if parts[0] in package_classes():
        return True
    shaped = parts[0][0].islower() and any(_CAMEL.match(p) or _UPPER.match(p) for p in parts[1:])
    return shaped and not _is_foreign_module(parts[0])


def _has_attribute(obj: object, attr: str) -> tuple[bool, object]:
    if hasattr(obj, attr):
        return True, getattr(obj, attr)
    if inspect.isclass(obj):
        if dataclasses.is_dataclass(obj) and attr in {f.name for f in dataclasses.fields(obj)}:
            return True, _field_type(obj, attr)
        for klass in obj.__mro__:
            try:
                source = inspect.getsource(klass)
            except (OSError, TypeError):
                continue
            if re.search(rf"\bself\.{re.escape(attr)}\s*(?::[^=\n]+)?=(?!=)", source):
                return True, None
    return False, None


def _field_type(klass: type, attr: str) -> object:
    hint = typing.get_type_hints(klass).get(attr)
    return hint if inspect.isclass(hint) else None


def resolve_dotted(name: str) -> bool:
    """Import the longest module prefix of ``name``, then getattr the rest."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            if importlib.util.find_spec(module_name) is None:
                continue
        except (ImportError, ValueError):
            continue
        obj: object = importlib.import_module(module_name)
        for attr in parts[cut:]:
            if obj is None:  # an attribute set on self or an untyped field: nothing more to check
                return True
            ok, obj = _has_attribute(obj, attr)
            if not ok:
                return False
        return True
    return False


def is_profile_key(name: str) -> bool:
    """``training.grouping.k_min``: a path of dataclass fields from ``ProfileConfig``."""
    from cosearch_lib.config import ProfileConfig

    klass: object = ProfileConfig
    for part in name.split("."):
        if not (inspect.isclass(klass) and dataclasses.is_dataclass(klass)):
            return False
        if part not in {f.name for f in dataclasses.fields(klass)}:
            return False
        klass = _field_type(klass, part)
    return True


def resolves(use: NameUse) -> bool:
    """Whether ``use`` names something that exists, looked up where a reader would look: in its
    class and module and their parent packages, then relative to cosearch_lib, then in the class
    it starts with; a role may also name any importable object, and prose a profile key."""
    name, parts = use.name, use.name.split(".")
    candidates = []
    if use.module is not None:
        scopes = [use.module.rsplit(".", i)[0] for i in range(use.module.count(".") + 1)]
        if use.cls is not None:
            candidates.append(f"{use.module}.{use.cls}.{name}")
        candidates += [f"{scope}.{name}" for scope in scopes]
    if parts[0] == PACKAGE:
        candidates.append(name)
    else:
        candidates.append(f"{PACKAGE}.{name}")
        candidates += [f"{home}.{name}" for home in package_classes().get(parts[0], [])]
        if use.role:
            candidates.append(name)
    if any(resolve_dotted(c) for c in dict.fromkeys(candidates)):
        return True
    return not use.role and is_profile_key(name)


def unresolved(uses: list[NameUse]) -> list[NameUse]:
    return [u for u in uses if is_python_name(u) and not resolves(u)]


# --------------------------------------------------------------------------- the checks


def _pending(use: NameUse) -> bool:
    return (use.where.rsplit(":", 1)[0], use.name) in PENDING_FIXES


def test_every_name_in_the_docs_and_docstrings_exists():
    uses = collect()
    checked = [u for u in uses if is_python_name(u)]
    assert len(checked) > 300, f"the collector found only {len(checked)} names: is it still reading the docs?"
    bad = [u for u in unresolved(uses) if not _pending(u)]
    listing = "\n".join(f"  {u.where}: {u.name}" for u in bad)
    assert not bad, f"{len(bad)} names in docs or docstrings do not resolve:\n{listing}"


def test_each_pending_fix_is_still_needed_and_its_replacement_exists():
    stale = {(u.where.rsplit(":", 1)[0], u.name) for u in unresolved(collect()) if _pending(u)}
    done = sorted(set(PENDING_FIXES) - stale)
    assert not done, f"fixed, so delete from PENDING_FIXES: {done}"
    assert all(resolve_dotted(f"{PACKAGE}.{name}") for name in PENDING_FIXES.values())


def _uses(text: str, **kw) -> list[NameUse]:
    return names_in_text(text, lambda i: f"x.md:{i + 1}", **kw)


@pytest.mark.parametrize("text, bad", [
    ("see `cosearch_lib.rl.trainer.JointTrainer` and `run_schema.STEP_GLOSSARY`", []),
    ("the step: `cosearch_lib.rl.trainer.JointTrainer.train_step`, fields `config.GRPOConfig.clip_eps`", []),
    ("a planted `cosearch_lib.rl.trainer.NoSuchTrainer` and `rl.no_such_module.f`",
     ["cosearch_lib.rl.trainer.NoSuchTrainer", "rl.no_such_module.f"]),
    ("stale short forms: grouping.GROUPING_GLOSSARY, training.EVAL_METHOD", ["grouping.GROUPING_GLOSSARY", "training.EVAL_METHOD"]),
    ("profile keys `models.batch_size`, `training.grouping.k_min` and files `config.py`, `steps.csv`", []),
    # `models` is a subpackage and a profile section: either reading will do, neither here
    ("`models.no_such_module.f`, `models.no_such_key`, `models.agent`", ["models.no_such_module.f", "models.no_such_key"]),
    ("foreign names `torch.cat`, `np.mean`, `pd.DataFrame`, `self.cfg.X`", []),
    ("classes: `JointTrainer.run`, `RolloutConfig.search`, `LLMRanker.output_protocol`; `JointTrainer.fly`",
     ["JointTrainer.fly"]),
])
def test_the_resolver_flags_exactly_the_names_that_do_not_exist(text, bad):
    assert [u.name for u in unresolved(_uses(text))] == bad


def test_roles_resolve_in_their_module_and_bad_ones_are_reported_with_file_and_line():
    text = "Uses :func:`parse_ranking` and :class:`~cosearch_lib.config.RuleSet`.\nAlso :func:`grpo.policy_loss`."
    uses = _uses(text, module="cosearch_lib.agent.parsers", roles=True)
    assert [u.name for u in uses] == ["parse_ranking", "cosearch_lib.config.RuleSet", "grpo.policy_loss"]
    assert [(u.name, u.where) for u in unresolved(uses)] == [("grpo.policy_loss", "x.md:2")]
    # the same bare name outside its module does not resolve
    assert [u.name for u in unresolved(_uses(":func:`parse_ranking`", module="cosearch_lib.metrics", roles=True))] \
        == ["parse_ranking"]


def test_the_module_collector_reads_docstrings_comments_and_glossaries():
    source = ('"""Module: see `rl.trainer.NoSuchThing` and :func:`planted`."""\n'
              "X_GLOSSARY = {'a': 'from grouping.MISSING_GLOSSARY'}\n"
              "y = 1  # a comment naming cosearch_lib.metrics.no_such_metric, and metrics.token_f1\n"
              "z = 'a plain string naming cosearch_lib.nothing.here is not prose'\n"
              "class Planted:\n"
              "    \"\"\"Has :meth:`fly`; :attr:`speed` is not set.\"\"\"\n"
              "    def fly(self):\n"
              "        \"\"\"Calls :meth:`fly` and :meth:`land`.\"\"\"\n")
    path = ROOT / PACKAGE / "metrics.py"  # read as if it were metrics.py: the planted names are not there
    found = sorted((u.where, u.name) for u in unresolved(names_in_module(path, source)))
    assert found == sorted((where, name) for name, where in [("rl.trainer.NoSuchThing", "cosearch_lib/metrics.py:1"), ("planted", "cosearch_lib/metrics.py:1"),
                     ("grouping.MISSING_GLOSSARY", "cosearch_lib/metrics.py:2"),
                     ("fly", "cosearch_lib/metrics.py:6"), ("speed", "cosearch_lib/metrics.py:6"),
                     ("fly", "cosearch_lib/metrics.py:8"), ("land", "cosearch_lib/metrics.py:8"),
                     ("cosearch_lib.metrics.no_such_metric", "cosearch_lib/metrics.py:3")])


# --------------------------------------------------------------------------- file paths

#: top-level folders of the repository whose files the docs may name, as ``docs/METHOD.md`` or `tests/x.py`
REPO_FOLDERS = ("cosearch_lib", "docs", "notebooks", "tests", "benchmarks", "scripts", ".ci", "papermill_runs/params",
                "papermill_runs/slurm")
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _path_uses(page: Path) -> list[tuple[str, str, int]]:
    """(path as written, base folder it is relative to, line) of every repository path the page names:
    Markdown link targets (relative to the page) and code spans that start with a repository folder or
    a subpackage of cosearch_lib. Placeholders (``<profile>``, ``*``, ``{...}``) and URLs are skipped."""
    subpackages = {p.name for p in (ROOT / PACKAGE).iterdir() if p.is_dir() and not p.name.startswith("_")}
    out = []
    for n, line in enumerate(page.read_text().splitlines(), 1):
        for target in _LINK.findall(line):
            if "://" not in target and not target.startswith("mailto:"):
                out.append((target, str(page.parent), n))
        for span in _BACKTICK.findall(line):
            text = span.strip().split()[0] if span.strip() else ""
            if any(c in text for c in "<>*{}$") or "://" in text or "/" not in text.rstrip("/"):
                continue
            if text.startswith(REPO_FOLDERS):
                out.append((text, str(ROOT), n))
            elif text.split("/")[0] in subpackages and text.endswith(".py"):
                out.append((text, str(ROOT / PACKAGE), n))
    return out


def test_every_file_path_in_the_docs_exists():
    pages = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in SKIPPED_DOCS)]
    missing = [f"{page.relative_to(ROOT)}:{n}: {path}" for page in pages for path, base, n in _path_uses(page)
               if not (Path(base) / path).exists()]
    assert not missing, "paths the docs name that do not exist:\n" + "\n".join(missing)


def test_the_path_collector_finds_links_and_code_spans_and_skips_placeholders(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("See [the log](LOG.md#today), `docs/METHOD.md`, `rl/trainer.py`, `papermill_runs/<profile>/x`,\n"
                    "`make test`, [web](https://example.org) and `tests/no_such_test.py`.\n")
    found = {path for path, _, _ in _path_uses(page)}
    assert found == {"LOG.md", "docs/METHOD.md", "rl/trainer.py", "tests/no_such_test.py"}
