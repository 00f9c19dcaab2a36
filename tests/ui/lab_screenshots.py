"""Screenshots of executed notebooks as a reader sees them in JupyterLab (headless Chromium).

A review aid, not a test (pytest does not collect it): it starts ``jupyter lab`` on a free port,
opens each notebook, and saves one PNG per screen height while scrolling through it, so the pages
can be looked at (tables cut off, widget state, raw reprs, figures).

Needs Debian's ``chromium`` and ``chromium-driver`` and ``pip install selenium``::

    python tests/ui/lab_screenshots.py papermill_runs/demo/*.ipynb --out /tmp/lab
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_lab(port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}", "--ServerApp.token=",
           "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True", f"--ServerApp.root_dir={ROOT}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(120):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("jupyter lab did not start within 60 s")


def browser(width: int, height: int):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)


def shoot(driver, port: int, notebook: Path, out: Path, max_screens: int) -> list[Path]:
    rel = notebook.resolve().relative_to(ROOT)
    driver.get(f"http://127.0.0.1:{port}/lab/tree/{rel.as_posix()}")
    time.sleep(8)  # JupyterLab loads, renders the outputs
    panel = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer"
    saved, last = [], -1
    for i in range(max_screens):
        path = out / f"{notebook.stem}_{i:02d}.png"
        driver.save_screenshot(str(path))
        saved.append(path)
        top = driver.execute_script(f"const p = document.querySelector('{panel}'); if (!p) return -1;"
                                    "p.scrollTop += p.clientHeight * 0.9; return p.scrollTop;")
        if top in (-1, last):
            break
        last = top
        time.sleep(1.5)
    return saved


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=Path("/tmp/lab_screenshots"))
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=1000)
    ap.add_argument("--max-screens", type=int, default=12, help="screens per notebook")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    lab = start_lab(port)
    driver = browser(args.width, args.height)
    try:
        for nb in args.notebooks:
            shots = shoot(driver, port, nb, args.out, args.max_screens)
            print(f"{nb}: {len(shots)} screenshots -> {args.out}")
    finally:
        driver.quit()
        lab.terminate()


if __name__ == "__main__":
    main()
