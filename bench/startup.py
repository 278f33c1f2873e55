"""CLI start-up: wall time of fresh `clustertrain plan examples/quickstart.yaml` processes, interleaved with the
named reference `python -c "import torch"` (printed beside it), plus `clustertrain --help` and
`clustertrain submit examples/quickstart.yaml --dry-run --set cluster.backend=slurm` (what a user rehearsing a
submission types; --dry-run prints the batch script and submits nothing, so no Slurm is needed).

    .venv/bin/python bench/startup.py [--rounds 5]

Targets (issues 13, 40), printed as seconds per round: `clustertrain plan` <= 0.5 s, `clustertrain --help` <= 0.5 s,
`submit --dry-run` <= 1 s. Also printed: the heavy libraries (torch, numpy, boto3, tokenizers, pcluster) each
command imported (none of them should import torch). The run's own start-up is bench/run_startup.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

from harness import ROOT, Bench, Ratio, interleave

PY = sys.executable
HEAVY = ("torch", "numpy", "boto3", "tokenizers", "pcluster")
QUICKSTART = "examples/quickstart.yaml"
REFERENCE = 'python -c "import torch"'
#: name -> (argv after the interpreter, target in seconds)
CASES: dict[str, tuple[list[str], float]] = {
    f"clustertrain plan {QUICKSTART}": (["-m", "clustertrain", "plan", QUICKSTART], 0.5),
    "clustertrain --help": (["-m", "clustertrain", "--help"], 0.5),
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
    import time

    t0 = time.perf_counter()
    proc = subprocess.run([PY, *argv], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"`{' '.join(argv)}` failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return elapsed


def heavy_imports(argv: list[str]) -> list[str]:
    proc = subprocess.run([PY, "-c", PROBE, *argv[2:]], cwd=ROOT, capture_output=True, text=True)
    return json.loads(proc.stderr.strip().splitlines()[-1])


def main() -> None:
    bench = Bench("startup", __doc__)
    args = bench.parse()
    sides = {name: (lambda argv=argv: time_once(argv)) for name, (argv, _) in CASES.items()}
    sides[REFERENCE] = lambda: time_once(["-c", "import torch"])
    times = interleave(sides, args.rounds, warmup=0 if bench.smoke else 1)  # warm-up: file and bytecode caches
    one = [1.0] * args.rounds
    bench.report(Ratio.of(f"{REFERENCE} (reference)", times[REFERENCE], one, unit=" s"))
    for name, (argv, target) in CASES.items():
        heavy = ", ".join(heavy_imports(argv)) or "none"
        torch_x = Ratio.of("", times[name], times[REFERENCE]).median
        bench.report(Ratio.of(name, times[name], one, at_most=target, unit=" s",
                              note=f"÷ import torch {torch_x:.2f}x; heavy imports: {heavy}"))
    sys.exit(bench.finish())


if __name__ == "__main__":
    main()
