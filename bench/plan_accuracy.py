"""Planner accuracy: predicted ÷ measured step time of the quickstart on this machine's CPU workers.

  /work/main/.venv/bin/python bench/plan_accuracy.py [--steps 40] [--project examples/quickstart.yaml]

1. ``clustertrain.plan.calibrate`` measures this machine (fp32 GEMMs and the other kernels of a
   step at the model's shapes, with the workers' thread count) and predicts the step time;
2. the real trainer runs the same project for a few dozen steps
   (``clustertrain run PROJECT --run-dir TMP --set models.0.training.max_steps=N --no-resume``);
3. the measured step time is the mean ``step_time_s`` of TMP/metrics.jsonl after step 1 (step 1
   includes warm-up); calibrate runs again right after the training so that load from other
   processes on the machine affects both sides alike; the prediction is the mean of the two.
Target: predicted ÷ measured within 0.8–1.25.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clustertrain.plan.calibrate import calibrate  # noqa: E402
from clustertrain.resolve import load_project  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--project", default=str(ROOT / "examples" / "quickstart.yaml"))
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    project = load_project(args.project)
    before = calibrate(project)
    clustertrain = Path(sys.executable).with_name("clustertrain")
    cmd = [str(clustertrain)] if clustertrain.exists() else [sys.executable, "-m", "clustertrain"]
    with tempfile.TemporaryDirectory(prefix="plan-accuracy-") as tmp:
        cmd += ["run", args.project, "--run-dir", tmp, "--set", f"models.0.training.max_steps={args.steps}", "--no-resume"]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stdout[-2000:], proc.stderr[-2000:], sep="\n", file=sys.stderr)
            print(f"the trainer failed with exit code {proc.returncode}", file=sys.stderr)
            return 1
        rows = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    after = calibrate(project)
    timed = [r["step_time_s"] for r in rows if r["step"] > 1]
    measured = sum(timed) / len(timed)
    predicted = (before.predicted_step_s + after.predicted_step_s) / 2
    ratio = predicted / measured
    print(f"project            {args.project} ({project.cluster.ranks_per_node} CPU workers x {before.threads} thread(s))")
    print(f"fp32 matmul        {before.flops_per_worker / 1e9:.1f} / {after.flops_per_worker / 1e9:.1f} GFLOP/s per worker (before / after)")
    print(f"predicted step     {predicted:.4f} s  (efficiency {before.efficiency:.2f} of matmul throughput)")
    print("  parts            " + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in before.parts_s.items()))
    print(f"measured step      {measured:.4f} s  (mean step_time_s over {len(timed)} logged intervals, {args.steps} steps)")
    print(f"predicted/measured {ratio:.2f}  (target 0.80-1.25: {'PASS' if 0.8 <= ratio <= 1.25 else 'FAIL'})")
    return 0 if 0.8 <= ratio <= 1.25 else 1


if __name__ == "__main__":
    sys.exit(main())
