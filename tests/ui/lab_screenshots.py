"""Notebooks as a reader sees them in JupyterLab (headless Chromium): one PNG per screen.

A review aid, not a test (pytest does not collect it). Two ways:

    python tests/ui/lab_screenshots.py --profile ci --notebooks 02 03 05     # run them, as a user would
    python tests/ui/lab_screenshots.py papermill_runs/demo/0*.ipynb          # notebooks papermill executed

Run mode: for each notebook the profile is injected (papermill's prepare-only mode, so the
parameters cell and its "injected-parameters" twin look as in a papermill run), JupyterLab opens it,
"Run All Cells" runs it with live widgets and progress bars, and the notebook is then scrolled one
screen at a time. A cell that raises stops the run there; the script says which. Given executed
notebooks instead, it only opens and scrolls them (widgets then show as their saved text). PNGs go to
``papermill_runs/screenshots/<profile>/`` (or ``--out``).

Needs what the project's venv does not ship: Chromium and its driver (Debian: ``apt-get install
chromium chromium-driver``) and ``selenium`` in the Python that runs this script (it may be a venv of
its own: the script starts JupyterLab from the project's venv, ``--lab-python``).
"""

from __future__ import annotations

import argparse
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# JupyterLab's application object (exposed with --LabApp.expose_app_in_browser) and the notebook open
# in the main area: these drive Run All and tell when the kernel is done
_NOTEBOOK = "if (!window.jupyterapp) { return null; } const nb = window.jupyterapp.shell.currentWidget;"
_STATE_JS = _NOTEBOOK + """
if (!nb || !nb.content || !nb.sessionContext || !nb.sessionContext.session) { return null; }
const cells = nb.content.widgets.filter(c => c.model.type === 'code');
const errors = cells.filter(c => c.model.outputs.toJSON().some(o => o.output_type === 'error'));
return {
  status: nb.sessionContext.session.kernel ? nb.sessionContext.session.kernel.status : 'none',
  code_cells: cells.length,
  executed: cells.filter(c => c.model.executionCount !== null).length,
  running: document.querySelectorAll('.jp-InputArea-prompt').length
    ? Array.from(document.querySelectorAll('.jp-InputArea-prompt')).filter(p => p.textContent.includes('*')).length
    : 0,
  error_cell: errors.length ? nb.content.widgets.indexOf(errors[0]) : -1,
};
"""
_SCROLLER = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer"
# [end of the last cell, visible height] in the scroller: its scrollHeight also counts the blank
# space JupyterLab leaves under the last cell
_CONTENT_JS = f"""
const s = document.querySelector('{_SCROLLER}');
const cells = s.querySelectorAll('.jp-Cell');
const last = cells[cells.length - 1];
const end = last ? last.getBoundingClientRect().bottom - s.getBoundingClientRect().top + s.scrollTop + 10 : s.scrollHeight;
return [Math.min(end, s.scrollHeight), s.clientHeight];
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prepare(notebook: Path, profile: str, lab_python: str, out: Path) -> None:
    """Inject the profile the way papermill does, without running anything."""
    code = (
        "import papermill as pm, sys; "
        "pm.execute_notebook(sys.argv[1], sys.argv[2], parameters={'profile': sys.argv[3]}, "
        "prepare_only=True, progress_bar=False, cwd=None)"
    )
    subprocess.run([lab_python, "-c", code, str(notebook), str(out), profile], check=True, cwd=ROOT)


def _start_lab(lab_python: str, port: int, token: str, log: Path) -> subprocess.Popen:
    cmd = [
        lab_python, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={ROOT}",
        "--LabApp.expose_app_in_browser=True", "--ServerApp.allow_root=True",
        "--LabApp.news_url=None",  # no "get notified about Jupyter news?" toast over the notebook
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"JupyterLab exited (rc {proc.returncode}); see {log}") from None
            time.sleep(1)
    proc.kill()
    raise SystemExit(f"JupyterLab did not listen on port {port} within 120 s; see {log}")


def _browser(width: int, height: int):
    try:
        from selenium import webdriver
    except ImportError:  # pragma: no cover - a tool outside the project's dependencies
        raise SystemExit("selenium is not installed in this Python: pip install selenium") from None
    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--hide-scrollbars"):
        opts.add_argument(arg)
    import shutil

    from selenium.webdriver.chrome.service import Service

    # the system's Chromium and driver: selenium's own manager would try to download a browser
    browser, chromedriver = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
    if not browser or not chromedriver:
        raise SystemExit("Chromium and its driver are needed: apt-get install chromium chromium-driver")
    opts.binary_location = browser
    return webdriver.Chrome(options=opts, service=Service(chromedriver))


def _wait(driver, predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def _run_all(driver, timeout: float) -> dict:
    """Run All Cells; return the final state once every code cell ran (or one raised)."""
    _wait(driver, lambda: (driver.execute_script(_STATE_JS) or {}).get("status") == "idle", 180, "the kernel")
    driver.execute_script("window.jupyterapp.shell.collapseLeft();")  # the file browser opened with the file: close it
    driver.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells');")
    time.sleep(3)
    started, last = time.time(), -1

    def done():
        nonlocal last
        state = driver.execute_script(_STATE_JS) or {}
        if state.get("executed", 0) != last:
            last = state.get("executed", 0)
            print(f"  {last}/{state.get('code_cells')} cells after {time.time() - started:.0f} s", flush=True)
        finished = state.get("executed") == state.get("code_cells") or state.get("error_cell", -1) >= 0
        return state if finished and state.get("status") == "idle" and not state.get("running") else None

    return _wait(driver, done, timeout, "Run All Cells to finish")


def _screens(driver, out_dir: Path, stem: str, overlap: int = 80) -> list[Path]:
    """Scroll the notebook one screen at a time, saving each screen."""
    driver.execute_script("window.jupyterapp.commands.execute('notebook:enter-command-mode');")
    # toasts (e.g. JupyterLab asking whether to fetch its news) would cover the notebook's right edge
    driver.execute_script("document.querySelectorAll('.jp-Notification-Toast-Close, .Toastify__close-button').forEach(b => b.click());")
    shots, top, index = [], 0, 0
    while True:
        driver.execute_script(f"document.querySelector('{_SCROLLER}').scrollTop = {top};")
        time.sleep(1.0)  # lazily rendered cells and widget views
        path = out_dir / f"{stem}_{index:02d}.png"
        driver.save_screenshot(str(path))
        shots.append(path)
        height, view = driver.execute_script(_CONTENT_JS)
        if top + view >= height or index >= 60:
            return shots
        top += view - overlap
        index += 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("executed", nargs="*", type=Path, help="executed notebooks to open and scroll (not run)")
    p.add_argument("--profile", default="ci")
    p.add_argument("--notebooks", nargs="+", default=["02", "03", "05"], help="number prefixes, run in this order")
    p.add_argument("--out", type=Path, help="default: papermill_runs/screenshots/<profile>")
    p.add_argument("--lab-python", default=str(ROOT / ".venv" / "bin" / "python"))
    p.add_argument("--size", default="1600x1000", help="browser window, WIDTHxHEIGHT")
    p.add_argument("--timeout", type=float, default=3600, help="seconds allowed per notebook")
    args = p.parse_args(argv)

    out = args.out or ROOT / "papermill_runs" / "screenshots" / ("executed" if args.executed else args.profile)
    out.mkdir(parents=True, exist_ok=True)
    width, height = (int(v) for v in args.size.split("x"))
    port, token = _free_port(), secrets.token_hex(16)
    lab = _start_lab(args.lab_python, port, token, out / "jupyterlab.log")
    driver = _browser(width, height)
    failed = []
    try:
        for book in args.executed:
            rel = book.resolve().relative_to(ROOT).as_posix()
            driver.get(f"http://127.0.0.1:{port}/lab/workspaces/shots-{book.stem}/tree/{rel}?reset&token={token}")
            _wait(driver, lambda: (driver.execute_script(_STATE_JS) or {}).get("status") == "idle", 180, "the kernel")
            driver.execute_script("window.jupyterapp.shell.collapseLeft();")
            time.sleep(3)  # the saved outputs render
            shots = _screens(driver, out, book.stem)
            print(f"[screenshots] {len(shots)} screens: {out}/{book.stem}_*.png", flush=True)
        for prefix in [] if args.executed else args.notebooks:
            matches = sorted((ROOT / "notebooks").glob(f"{prefix}_*.ipynb"))
            if len(matches) != 1:
                raise SystemExit(f"no single notebook starts with {prefix!r} in notebooks/")
            prepared = out / matches[0].name
            _prepare(matches[0], args.profile, args.lab_python, prepared)
            rel = prepared.relative_to(ROOT).as_posix()
            print(f"[screenshots] {rel}: Run All Cells ...", flush=True)
            driver.get(f"http://127.0.0.1:{port}/lab/workspaces/shots-{prefix}/tree/{rel}?reset&token={token}")
            state = _run_all(driver, args.timeout)
            driver.execute_script("window.jupyterapp.commands.execute('docmanager:save');")
            shots = _screens(driver, out, prepared.stem)
            if state.get("error_cell", -1) >= 0:
                failed.append(f"{rel}: cell {state['error_cell']} raised")
            print(f"[screenshots] {len(shots)} screens: {shots[0].parent}/{prepared.stem}_*.png", flush=True)
            driver.execute_script(_NOTEBOOK + "nb.sessionContext.shutdown();")
    finally:
        driver.quit()
        lab.terminate()
        lab.wait(timeout=30)
    for line in failed:
        print(f"[screenshots] FAILED {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
