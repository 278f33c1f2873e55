"""Run start-up: seconds from starting `clustertrain run examples/quickstart.yaml` (2 CPU ranks, a fresh run
directory, the staged dataset and sample index already cached under storage.root) to its first step's line in rank
0's log, interleaved with the named reference `python -c "import torch"` (what every rank must pay at least), and
the breakdown read from the timestamps of the launcher's and rank 0's lines.

    .venv/bin/python bench/run_startup.py [--rounds 5]

Target (issue 40): run -> first step <= 4 s on an idle machine, printed as seconds (`at_most=4`, unit s). The
breakdown (each a figure without target, verdict "measured"): launcher (CLI imports, project load, data staging and
sample index checks, run directory) -> rank 0's log header; rank 0's interpreter + imports (torch, the trainer) ->
its first line; process group, data, model, optimizer, checkpoint manager -> the model line; the first step -> its
line. The first round warms the dataset cache and the bytecode (a warm-up round, dropped).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import ROOT, Bench, Ratio, interleave, timed

PY = sys.executable
QUICKSTART = "examples/quickstart.yaml"
#: (name, a substring of rank 0's line that ends the part)
MARKS = (("launcher -> rank 0 started", "=== clustertrain rank 0/"),
         ("rank imports (torch, trainer)", "[clustertrain] rank 0: "),
         ("process group, data, model, optimizer", "[clustertrain] model "),
         ("first step", "[clustertrain] step 1/"))


def run_to_first_step(run_dir: Path, steps: int, storage: Path) -> dict[str, float]:
    """Start `clustertrain run` on the quickstart in a fresh ``run_dir``; seconds from the start to each mark."""
    shutil.rmtree(run_dir, ignore_errors=True)
    log = run_dir / "logs" / "rank0.log"
    t0 = time.monotonic()
    proc = subprocess.Popen([PY, "-m", "clustertrain", "run", QUICKSTART, "--run-dir", str(run_dir),
                             "--set", f"models.0.training.max_steps={steps}", "--set", f"storage.root={storage}"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    at: dict[str, float] = {}
    try:
        while len(at) < len(MARKS):
            if proc.poll() is not None:
                raise SystemExit(f"clustertrain run exited {proc.returncode} before its first step: "
                                 f"{proc.stderr.read().strip()[-500:]}")
            text = log.read_text(errors="replace") if log.exists() else ""
            now = time.monotonic() - t0
            for name, mark in MARKS:
                if name not in at and mark in text:
                    at[name] = now
            time.sleep(0.01)
    finally:
        proc.wait(timeout=120)
    return at


def main() -> None:
    bench = Bench("run_startup", __doc__)
    args = bench.parse()
    steps = 1 if bench.smoke else 2
    with tempfile.TemporaryDirectory(prefix="ct-bench-startup-") as tmp:
        storage = Path(tmp) / "storage"
        shutil.copytree(ROOT / "runs" / "datasets", storage / "datasets") if (ROOT / "runs" / "datasets").is_dir() else None
        marks: list[dict[str, float]] = []

        def ours() -> float:
            marks.append(run_to_first_step(Path(tmp) / "run", steps, storage))
            return marks[-1]["first step"]

        if not bench.smoke:  # warm-up: stages the dataset and index if the copy lacks them, warms the file cache
            run_to_first_step(Path(tmp) / "run", steps, storage)
        times = interleave({"ours": ours, "reference": timed(lambda: subprocess.run([PY, "-c", "import torch"],
                                                                                   check=True))}, args.rounds)
    one = [1.0] * len(times["ours"])
    bench.report(Ratio.of('python -c "import torch" (reference)', times["reference"], one, unit=" s"))
    previous = [0.0] * len(marks)
    for name, _ in MARKS:
        cur = [m[name] for m in marks]
        bench.report(Ratio.of(f"breakdown: {name}", [c - p for c, p in zip(cur, previous)], one, unit=" s"))
        previous = cur
    bench.report(Ratio.of("clustertrain run quickstart -> first step (2 CPU ranks)", times["ours"], one,
                          at_most=4.0, unit=" s",
                          note=f"÷ import torch {Ratio.of('', times['ours'], times['reference']).median:.2f}x"))
    sys.exit(bench.finish())


if __name__ == "__main__":
    main()
