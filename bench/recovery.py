"""Recovery time on the local Slurm cluster: from a fault to the first step after the restart, per fault kind, with
the share spent in detection, queue, start-up and checkpoint load, against a cold start measured in the same run.

    .venv/bin/python bench/recovery.py [--nodes 3] [--steps 60]

Starts a local Slurm cluster (3 emulated nodes, root needed), then for each fault kind submits a fresh 2-node run of
a tiny model with the project's default watchdog settings (heartbeat 5 s, hang floor 30 s):

* ``cold``: no fault; submit -> first step (the reference);
* ``hang``: rank 1 hangs in an all-reduce at step 12 (CLUSTERTRAIN_INJECT_HANG);
* ``sigkill``: rank 1's process is SIGKILLed after step 12.

For a fault, from the records the run leaves: detection = fault -> the end of the failed job (the watchdog's
incident, or Slurm's attribution of the killed rank, and the batch script's resubmission); queue = that end -> the
next job's allocation (``usage.json`` attempt ``allocated``); start-up = allocation -> rank 0 ready to train
(``started``: process start, rendezvous, data, model and the checkpoint load); first step = -> the first step after
the restart (``first_step``). Targets (issue 18): detection <= 60 s, restart-to-first-step <= 2 x the cold start.

Then (unless ``--no-restart-stats``) the restart's file-system metadata cost: bench/restart_stats.py counts each
rank's opens, listings and stats during a resume at 2, 4 and 8 gloo ranks, rank 0 deciding (the current rule) against
every rank checking (the old one), and extrapolates both to the flagship's 640 ranks (issue 38, item 5).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROJECT = """
name: {name}
cluster: {{backend: slurm, nodes: 2, gpus_per_node: 0, procs_per_node: 1, threads_per_worker: 1}}
storage: {{root: {root}}}
launch: {{exclusive: false}}
models:
  - name: m
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64}}
    training: {{max_steps: {steps}, micro_batch: 4, global_batch: 8, checkpoint_every: 4, keep_last: 2, log_every: 1,
               async_checkpoint: false}}
"""


def wait_for(predicate, timeout: float, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"gave up after {timeout:.0f} s")


def submit(cluster, work: Path, name: str, steps: int, **env) -> tuple[Path, str, float]:
    from clustertrain.launch.config import LaunchConfig
    from clustertrain.launch.slurm import SlurmLauncher, submit_project
    from clustertrain.resolve import load_project

    path = work / f"{name}.yaml"
    path.write_text(PROJECT.format(name=name, root=json.dumps(str(work / "fsx")), steps=steps))
    slurm = SlurmLauncher(env={**cluster.env(), **env}, launch=LaunchConfig(exclusive=False))
    submitted = time.time()
    [sub] = submit_project(load_project(path), None, None, resume=True, launcher=slurm)
    return sub.run_dir, sub.job_id, submitted


def attempts(run: Path):
    from clustertrain.core.run_events import read_usage
    from clustertrain.core.run_paths import RunPaths

    return read_usage(RunPaths(run)).attempts


def steps_done(run: Path) -> int:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()] \
        if (run / "metrics.jsonl").exists() else []
    return max((r["step"] for r in rows), default=0)


def cold(cluster, work: Path, steps: int) -> float:
    run, _, submitted = submit(cluster, work, "cold", steps)
    first = wait_for(lambda: (attempts(run) or [None])[0] and attempts(run)[0].first_step, 120)
    return first - submitted


def fault(cluster, work: Path, kind: str, steps: int) -> dict[str, float]:
    from clustertrain.core.job_records import read_end_marker
    from clustertrain.core.run_paths import RunPaths

    env = {"CLUSTERTRAIN_INJECT_HANG": "1:12"} if kind == "hang" else {}
    run, job, _ = submit(cluster, work, kind, steps, **env)
    if kind == "hang":
        wait_for(lambda: list((run / "incidents").glob("*/incident.json")), 180)
        incident = json.loads(next((run / "incidents").glob("*/incident.json")).read_text())
        at = incident["detected"] - incident["waited_s"]
    else:
        wait_for(lambda: steps_done(run) >= 12, 120)
        pid = json.loads(RunPaths(run).rank_heartbeat(1).read_bytes())["pid"]
        at = time.time()
        os.kill(pid, signal.SIGKILL)
    marker = wait_for(lambda: read_end_marker(RunPaths(run), job), 180)
    second = wait_for(lambda: len(attempts(run)) > 1 and attempts(run)[1].first_step and attempts(run)[1], 180)
    allocated = second.allocated or second.started
    return {"detection": marker.ended - at, "queue": allocated - marker.ended, "start-up and checkpoint load": second.started - allocated,
            "first step": second.first_step - second.started, "restart to first step": second.first_step - at}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--no-restart-stats", action="store_true",
                        help="skip counting a resume's file-system operations per rank (bench/restart_stats.py)")
    args = parser.parse_args()
    from clustertrain.launch.slurm_cluster import LocalSlurmCluster

    with tempfile.TemporaryDirectory(prefix="ct-recovery-") as tmp:
        work = Path(tmp)
        cluster = LocalSlurmCluster(work / "slurm", nodes=args.nodes)
        cluster.up()
        try:
            reference = cold(cluster, work, args.steps)
            print(f"cold start (submit -> first step): {reference:.1f} s")
            for kind in ("hang", "sigkill"):
                parts = fault(cluster, work, kind, args.steps)
                total = parts["restart to first step"]
                shares = ", ".join(f"{k} {v:.1f} s ({v / total:.0%})" for k, v in parts.items()
                                   if k != "restart to first step")
                print(f"{kind}: fault -> first step after restart {total:.1f} s = {shares}; detection "
                      f"{parts['detection']:.1f} s (target <= 60); restart-to-first-step "
                      f"{total - parts['detection']:.1f} s = {(total - parts['detection']) / reference:.2f} x cold "
                      "start (target <= 2)")
        finally:
            cluster.down()
    if not args.no_restart_stats:
        print("\nrestart stats (bench/restart_stats.py):", flush=True)
        return subprocess.run([sys.executable, str(ROOT / "bench" / "restart_stats.py")]).returncode
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
