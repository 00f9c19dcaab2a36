"""Notebooks execute end to end under papermill on the `ci` profile (the same path as `make demo`)."""

from __future__ import annotations

import json

import nbformat
import pytest

from cosearch_lib.runs import list_notebooks, run_notebook


@pytest.fixture
def isolated_outputs(tmp_path, monkeypatch):
    """Figures and run records go to a temp folder; the world/index cache stays shared (data/)."""
    monkeypatch.setenv("COSEARCH_FIGURES", str(tmp_path / "figures"))
    monkeypatch.setenv("COSEARCH_RUNS", str(tmp_path / "runs"))
    return tmp_path


@pytest.mark.slow
def test_01_retriever_setup_runs_on_ci_profile(isolated_outputs):
    nb_path = next(p for p in list_notebooks() if p.name.startswith("01_"))
    executed = run_notebook(nb_path, "ci", progress=False)
    nb = nbformat.read(executed, as_version=4)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    assert executed == isolated_outputs / "runs" / "ci" / nb_path.name
    record = json.loads((isolated_outputs / "runs" / "ci" / "01_retriever_setup.run.json").read_text())
    assert record["status"] == "ok" and record["parameters"]["profile"] == "ci"
    figs = isolated_outputs / "figures" / "ci"
    assert (figs / "recall_at_k.png").stat().st_size > 10_000 and (figs / "recall_at_k.csv").exists()
    assert (figs / "hop_recall_at_k.png").exists() and (figs / "hop_recall_at_k.csv").exists()
    metrics = json.loads((isolated_outputs / "runs" / "ci" / "01_retriever_setup.metrics.json").read_text())
    rows = {r["data_source"]: r for r in metrics["recall"]}
    n, k = metrics["N"], metrics["K"]
    assert rows["avg"][f"R@{n}"] >= rows["avg"][f"R@{k}"] > 0.0
    hop_rows = {r["data_source"]: r for r in metrics["hop_recall"]}
    assert set(hop_rows) >= {"syn_nq", "syn_musique", "avg"}  # every family's chain was measured


@pytest.mark.slow
def test_02_oracle_gap_study_runs_on_ci_profile(isolated_outputs):
    from cosearch_lib.evaluation import load_records

    nb_path = next(p for p in list_notebooks() if p.name.startswith("02_"))
    methods = ["direct", "rag", "agent_retrieval", "agent_oracle"]  # the fixed-ranker path is unit-tested
    executed = run_notebook(nb_path, "ci", parameters={"methods": ",".join(methods)}, progress=False)
    nb = nbformat.read(executed, as_version=4)
    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
    runs, figs = isolated_outputs / "runs" / "ci", isolated_outputs / "figures" / "ci"
    records = load_records(runs / "02_eval_records.parquet")
    assert list(dict.fromkeys(records["method"])) == methods
    assert records.groupby("method").size().tolist() == [7] * len(methods)  # one question per family on ci
    assert (records.loc[records["method"] == "rag", "n_searches"] == 1).all()
    for name in ("oracle_gap", "search_turns"):
        assert (figs / f"{name}.png").stat().st_size > 10_000 and (figs / f"{name}.csv").exists()
    metrics = json.loads((runs / "02_oracle_gap_study.metrics.json").read_text())
    assert set(metrics["oracle_gap"]) == {"standard", "oracle", "relative gain %"}
    assert metrics["n_records"] == len(records)
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "stream")
    assert "showing" in text and "question:" in text  # the trajectory browser's printed fallback
