"""Write the section ``scripts/gpu-check.sh`` adds to ``docs/gpu.md``: the machine (device, driver, CUDA, torch,
Python), the GPU tests' outcome (from pytest's JUnit XML) and bench/mfu.py's figures against issue 38's targets
(from ``bench/mfu.py --json``). The section goes after the page's introduction, newest first; it is also written on
its own to ``--section``. Figures are reported, never asserted."""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

GiB = 2**30


def machine() -> str:
    import torch

    name = torch.cuda.get_device_name(0)
    total = torch.cuda.get_device_properties(0).total_memory // 2**20
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        driver = "unknown (no nvidia-smi)"
    return (f"one {name} ({total} MiB), driver {driver}, CUDA {torch.version.cuda}, torch {torch.__version__}, "
            f"Python {platform.python_version()}")


def tests_table(xml: Path) -> list[str]:
    if not xml.is_file():
        return ["The GPU tests left no report (they did not run to the end: see tests.log)."]
    rows, counts = [], {"passed": 0, "failed": 0, "skipped": 0}
    for case in ET.parse(xml).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped":
                outcome = "skipped"
        counts[outcome] += 1
        detail = next((c.get("message", "") for c in case if c.tag in ("failure", "error", "skipped")), "")
        rows.append(f"| `{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}` | {outcome} | "
                    f"{float(case.get('time', 0)):.1f} s | {detail.splitlines()[0][:120] if detail else ''} |")
    head = [f"GPU tests (`pytest -m gpu tests/gpu`): {counts['passed']} passed, {counts['failed']} failed, "
            f"{counts['skipped']} skipped.", "", "| test | outcome | time | note |", "|---|---|---|---|"]
    return head + rows


def bench_table(path: Path) -> list[str]:
    if not path.is_file():
        return ["bench/mfu.py left no figures (it did not finish: see mfu.log)."]
    f = json.loads(path.read_text())
    pct = lambda v: "n/a" if v is None else f"{v:.1%}"  # noqa: E731
    lines = ["| figure | measured | target |", "|---|---|---|",
             f"| bare loop (whole-model compile, fused AdamW, trainer's data path) | {f['bare_step_s'] * 1e3:.1f} ms/step, "
             f"{pct(f['bare_mfu'])} MFU | — |",
             f"| trainer (its step and data path) | {f['trainer_step_s'] * 1e3:.1f} ms/step, **{pct(f['trainer_mfu'])} MFU** "
             f"| ≥ 45 % |",
             f"| trainer ÷ bare | **{f['trainer_over_bare']:.3f}** | ≥ 0.97 |"]
    if f.get("allocated_bytes"):
        lines.append(f"| peak allocated / planner | {f['allocated_bytes'] / GiB:.1f} / {f['planned_bytes'] / GiB:.2f} GiB = "
                     f"**{f['allocated_bytes'] / f['planned_bytes']:.2f}** | 0.85–1.15 |")
    if "stall_s" in f:
        lines.append(f"| async save blocks the loop | {f['stall_s']:.2f} s = **{f['stall_s'] / f['trainer_step_s']:.2f} "
                     f"steps** (first {f['stall_first_s']:.2f} s; whole save {f['save_s']:.1f} s; step "
                     f"{f['step_during_write_s'] * 1e3:.0f} ms while writing) | < 1 step |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tests", type=Path, required=True)
    ap.add_argument("--mfu", type=Path, required=True)
    ap.add_argument("--bench-args", default="")
    ap.add_argument("--seconds", type=int, default=0)
    ap.add_argument("--section", type=Path, required=True)
    ap.add_argument("--docs", type=Path, required=True)
    ap.add_argument("--machine", default=None, help="the machine line (default: asked of torch and nvidia-smi)")
    args = ap.parse_args()
    today = datetime.date.today().isoformat()
    section = [f"## {today} — {args.machine or machine()}", "",
               f"`scripts/gpu-check.sh` ({args.seconds} s in all; bench: `bench/mfu.py {args.bench_args}`).", ""]
    section += tests_table(args.tests) + [""] + bench_table(args.mfu) + [""]
    text = "\n".join(section) + "\n"
    args.section.write_text(text)
    docs = args.docs.read_text() if args.docs.is_file() else "# GPU figures\n\n"
    at = docs.find("\n## ")
    new = docs + "\n" + text if at < 0 else docs[:at + 1] + text + "\n" + docs[at + 1:]
    tmp = args.docs.with_suffix(".md.tmp")
    tmp.write_text(new)
    tmp.replace(args.docs)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
