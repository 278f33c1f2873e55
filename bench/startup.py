"""CLI start-up time: wall time of fresh `clustertrain` processes for the light commands, side by side
with the bare interpreter (`python -c pass`) and `python -c "import torch"` as references. Each is the
median of --repeats runs, measured in alternation so that machine load hits them alike.

    .venv/bin/python bench/startup.py [--repeats 5]

Targets (issue 13): `clustertrain --help` <= 0.5 s, `clustertrain plan examples/quickstart.yaml`
<= 0.5 s, `clustertrain submit examples/quickstart.yaml --dry-run` <= 1 s. The quickstart project runs
on the local backend, so submit gets `--set cluster.backend=slurm` (what a user rehearsing a submission
types); --dry-run prints the batch script and submits nothing, so no Slurm is needed. Also printed:
each command's ratio to its target and to the bare interpreter, and the heavy libraries
(torch, numpy, boto3, tokenizers, pcluster) each command imported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
HEAVY = ("torch", "numpy", "boto3", "tokenizers", "pcluster")
QUICKSTART = "examples/quickstart.yaml"
#: name -> (argv after the interpreter, target in seconds or None for a reference)
CASES: dict[str, tuple[list[str], float | None]] = {
    "python -c pass": (["-c", "pass"], None),
    'python -c "import torch"': (["-c", "import torch"], None),
    "clustertrain --help": (["-m", "clustertrain", "--help"], 0.5),
    f"clustertrain plan {QUICKSTART}": (["-m", "clustertrain", "plan", QUICKSTART], 0.5),
    f"clustertrain submit {QUICKSTART} --dry-run": (
        ["-m", "clustertrain", "submit", QUICKSTART, "--dry-run", "--set", "cluster.backend=slurm"], 1.0),
}
#: prints which heavy libraries a CLI command left in sys.modules (run once per command, not timed)
PROBE = (
    "import sys, json\nfrom clustertrain.cli import main\n"
    "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
    f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr)"
)


def time_once(argv: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([PY, *argv], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"`{' '.join(argv)}` failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return elapsed


def heavy_imports(argv: list[str]) -> list[str]:
    if argv[:2] != ["-m", "clustertrain"]:
        return []
    proc = subprocess.run([PY, "-c", PROBE, *argv[2:]], cwd=ROOT, capture_output=True, text=True)
    return json.loads(proc.stderr.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    for argv, _ in CASES.values():  # warm the file cache and the bytecode cache
        time_once(argv)
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.repeats):
        for name, (argv, _) in CASES.items():
            times[name].append(time_once(argv))
    median = {name: statistics.median(t) for name, t in times.items()}
    bare = median["python -c pass"]
    width = max(map(len, CASES))
    print(f"median of {args.repeats} fresh processes ({PY}):")
    print(f"  {'command':<{width}}  {'seconds':>7}  {'/ target':>8}  {'/ python':>8}  heavy imports")
    over = []
    for name, (argv, target) in CASES.items():
        ratio = f"{median[name] / target:8.2f}" if target else f"{'-':>8}"
        heavy = ", ".join(heavy_imports(argv)) or "-"
        print(f"  {name:<{width}}  {median[name]:7.3f}  {ratio}  {median[name] / bare:8.1f}  {heavy if target else ''}")
        if target and median[name] > target:
            over.append(f"{name} ({median[name]:.2f} s > {target:g} s)")
    print("all within target" if not over else "OVER TARGET: " + "; ".join(over))


if __name__ == "__main__":
    main()
