"""A slow notebook cell or a hung test fails one test, by name, and the suite goes on (issue 37)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import nbformat
import pytest

from cosearch_lib.paths import project_root
from cosearch_lib.runs.papermill_runner import CellTimeout, run_notebook


def _sleeping_notebook(path, seconds: float, pid_file) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell('profile = "ci"')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell("x = 1"),
                nbformat.v4.new_code_cell(f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
                                          f"time.sleep({seconds})"),
                nbformat.v4.new_code_cell("y = 2")]
    nbformat.write(nb, path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited
        return f.read().split()[2] != "Z"


def test_a_cell_past_its_timeout_fails_naming_the_notebook_and_cell_and_shuts_its_kernel(tmp_path):
    notebook, pid_file = tmp_path / "sleepy.ipynb", tmp_path / "kernel.pid"
    _sleeping_notebook(notebook, 120, pid_file)
    t0 = time.perf_counter()
    with pytest.raises(CellTimeout, match=r"sleepy.ipynb on profile 'ci': code cell 3 of 4 \('import os, time'\) "
                                          r"ran past the 3 s cell timeout") as err:
        run_notebook(notebook, "ci", out_dir=tmp_path / "runs", progress=False, cell_timeout=3)
    assert time.perf_counter() - t0 < 60  # stopped at the cell timeout, not after the cell's 120 s
    record = (tmp_path / "runs" / "sleepy.run.json").read_text()
    assert '"status": "timeout"' in record and "CellTimeout" in record and str(err.value)[:40] in record
    pid = int(pid_file.read_text())
    deadline = time.time() + 20
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.5)
    assert not _alive(pid), "the timed-out kernel is still running"


SUITE = '''
import time
import pytest
from cosearch_lib.runs.papermill_runner import run_notebook

def test_first():
    assert True

def test_slow_notebook(tmp_path):
    run_notebook({notebook!r}, "ci", out_dir=tmp_path, progress=False, cell_timeout=2)

@pytest.mark.timeout(2)
def test_hung():
    time.sleep(60)

def test_after():
    assert True
'''


def test_in_a_suite_the_slow_notebook_and_the_hung_test_fail_alone_and_the_summary_is_printed(tmp_path):
    notebook = tmp_path / "sleepy.ipynb"
    _sleeping_notebook(notebook, 120, tmp_path / "kernel.pid")
    (tmp_path / "test_suite.py").write_text(textwrap.dedent(SUITE.format(notebook=str(notebook))))
    env = {**os.environ, "PYTHONPATH": str(project_root())}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.timeout_report", "-o", "timeout_method=signal",
                          "--rootdir", str(tmp_path), "-p", "no:cacheprovider", str(tmp_path / "test_suite.py")],
                         capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    out = run.stdout + run.stderr
    assert "INTERNALERROR" not in out
    assert "2 failed, 2 passed" in out, out[-3000:]
    assert "FAILED test_suite.py::test_slow_notebook" in out and "code cell 3 of 4" in out
    assert "FAILED test_suite.py::test_hung" in out and "Timeout (>2.0s) from pytest-timeout" in out
