"""Recovery time on the local Slurm cluster: from a fault to the first step after the restart, per fault kind, with
the share spent in detection, queue, start-up and checkpoint load, against a cold start measured in the same run.

    flock /tmp/ct-heavy.lock .venv/bin/python bench/recovery.py [--rounds 2] [--nodes 3] [--steps 60]
    .venv/bin/python bench/recovery.py --smoke     # one SIGKILL run, a few steps (~25 s)

Starts a local Slurm cluster (3 emulated nodes, root needed), then each round submits a fresh 2-node run of a tiny
model per kind, with the project's default watchdog settings (heartbeat 5 s, hang floor 30 s):

* ``cold``: no fault; submit -> first step (the reference, named "cold start");
* ``hang``: rank 1 hangs in an all-reduce at step 12 (CLUSTERTRAIN_INJECT_HANG);
* ``sigkill``: rank 1's process is SIGKILLed after step 12.

The kinds run in alternating order between rounds (cold hang sigkill, sigkill hang cold, ...: bench/harness.py
``interleave``), so a restart is compared with the cold start of its own round, seconds apart; each run's jobs are
cancelled once it is measured (and waited for until Slurm has none left), so that no run trains beside the next one.
A smoke run submits only the ``sigkill`` run, at step 5 of 20, and takes its first attempt (submit -> first step of a
fresh run) as the cold start.

For a fault, from the records the run leaves: detection = fault -> the end of the failed job (the watchdog's
incident, or Slurm's attribution of the killed rank, and the batch script's resubmission); queue = that end -> the
next job's allocation (``usage.json`` attempt ``allocated``); start-up = allocation -> rank 0 ready to train
(``started``: process start, rendezvous, data, model and the checkpoint load); first step = -> the first step after
the restart (``first_step``). Targets (issue 18): detection <= 60 s, restart-to-first-step (fault -> first step,
less the detection) <= 2 x the cold start of the same round.

A loaded machine: every wait has a generous bound (``--patience``, 300 s by default; a run on a busy 2-core machine
once gave up after 120 s). A round whose run does not get there in time is not a crash: its jobs are cancelled, the
round's figure is missing, and a target with a missing round says "inconclusive" (unless the rounds that finished
already fall short), with the count of rounds that gave up.

Then (unless ``--no-restart-stats``; not in a smoke run) the restart's file-system metadata cost:
bench/restart_stats.py counts each rank's opens, listings and stats during a resume at 2, 4 and 8 gloo ranks, rank 0
deciding (the current rule) against every rank checking (the old one), and extrapolates both to the flagship's 640
ranks (issue 38, item 5).
"""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness import INCONCLUSIVE, ROOT, SHORT, SMOKE, Bench, Ratio, interleave

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
FAULT_STEP = 12
SMOKE_FAULT_STEP = 5
MISSING = float("nan")


class GaveUp(Exception):
    """A wait ran past its bound: the round has no figure (the machine was too busy, or the run stuck)."""


@dataclass
class Partial(Ratio):
    """A :class:`Ratio` whose missing rounds (NaN: the run gave up waiting) make "holds" inconclusive: nothing says
    the missing rounds would have met the target. Rounds that finished and fall short still say "short"."""

    def done(self) -> list[float]:
        return [v for v in self.values if not math.isnan(v)]

    @property
    def median(self) -> float:
        return statistics.median(self.done()) if self.done() else MISSING

    def judge(self, smoke: bool) -> str:
        if smoke:
            return SMOKE
        done, missing = self.done(), len(self.values) - len(self.done())
        if not done:
            return INCONCLUSIVE
        verdict = Ratio(self.name, done, self.at_least, self.at_most).judge(False)
        return INCONCLUSIVE if missing and verdict != SHORT else verdict

    def line(self) -> str:
        missing = len(self.values) - len(self.done())
        if missing:
            self.note = "; ".join(x for x in (self.note, f"{missing} of {len(self.values)} round(s) gave up waiting")
                                  if x)
        shown = Ratio(self.name, self.done() or [MISSING], self.at_least, self.at_most, self.unit, self.note)
        shown.verdict = self.verdict
        return shown.line()


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise GaveUp(f"{what}: gave up after {timeout:.0f} s (load {os.getloadavg()[0]:.1f})")


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


def cancel_all(cluster, settle: bool = True, patience: float = 60) -> None:
    """Cancel every job of the cluster (a run measured, or one that gave up) and wait until none is left, so that
    nothing trains beside the next run and its nodes are free (a batch script may resubmit while it is being
    cancelled: cancel again). ``settle=False`` (smoke) stops waiting once none is pending or running."""
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        jobs = cluster.jobs()
        live = [j for j in jobs if j.state in ("PENDING", "RUNNING", "CONFIGURING", "REQUEUED", "SUSPENDED")]
        if live:
            subprocess.run(["scancel", *(j.job_id for j in live)], env={**os.environ, **cluster.env()},
                           capture_output=True)
        elif not jobs or not settle:
            return
        time.sleep(0.5)


def attempts(run: Path):
    from clustertrain.core.run_events import read_usage
    from clustertrain.core.run_paths import RunPaths

    return read_usage(RunPaths(run)).attempts


def steps_done(run: Path) -> int:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()] \
        if (run / "metrics.jsonl").exists() else []
    return max((r["step"] for r in rows), default=0)


def cold(cluster, work: Path, name: str, steps: int, patience: float) -> float:
    run, _, submitted = submit(cluster, work, name, steps)
    first = wait_for(lambda: (attempts(run) or [None])[0] and attempts(run)[0].first_step, patience,
                     f"{name}: first step")
    return first - submitted


def fault(cluster, work: Path, name: str, kind: str, steps: int, at_step: int, patience: float) -> dict[str, float]:
    from clustertrain.core.job_records import read_end_marker
    from clustertrain.core.run_paths import RunPaths

    env = {"CLUSTERTRAIN_INJECT_HANG": f"1:{at_step}"} if kind == "hang" else {}
    run, job, submitted = submit(cluster, work, name, steps, **env)
    if kind == "hang":
        wait_for(lambda: list((run / "incidents").glob("*/incident.json")), patience, f"{name}: the hang's incident")
        incident = json.loads(next((run / "incidents").glob("*/incident.json")).read_text())
        at = incident["detected"] - incident["waited_s"]
    else:
        wait_for(lambda: steps_done(run) >= at_step, patience, f"{name}: step {at_step}")
        pid = json.loads(RunPaths(run).rank_heartbeat(1).read_bytes())["pid"]
        at = time.time()
        os.kill(pid, signal.SIGKILL)
    marker = wait_for(lambda: read_end_marker(RunPaths(run), job), patience, f"{name}: the failed job's end")
    second = wait_for(lambda: len(attempts(run)) > 1 and attempts(run)[1].first_step and attempts(run)[1], patience,
                      f"{name}: the restart's first step")
    allocated = second.allocated or second.started
    return {"detection": marker.ended - at, "queue": allocated - marker.ended,
            "start-up and checkpoint load": second.started - allocated,
            "first step": second.first_step - second.started, "restart to first step": second.first_step - at,
            "cold": attempts(run)[0].first_step - submitted}


def main() -> int:
    bench = Bench("recovery", __doc__, rounds=2)
    bench.parser.add_argument("--nodes", type=int, default=3)
    bench.parser.add_argument("--steps", type=int, default=60)
    bench.parser.add_argument("--patience", type=float, default=300,
                              help="seconds each wait allows before the round gives up (default %(default)s)")
    bench.parser.add_argument("--no-restart-stats", action="store_true",
                              help="skip counting a resume's file-system operations per rank (bench/restart_stats.py)")
    args = bench.parse()
    kinds = ("sigkill",) if bench.smoke else ("cold", "hang", "sigkill")
    steps, at_step = (20, SMOKE_FAULT_STEP) if bench.smoke else (args.steps, FAULT_STEP)
    from clustertrain.launch.slurm_cluster import LocalSlurmCluster

    parts: dict[str, list[dict[str, float] | None]] = {k: [] for k in kinds if k != "cold"}
    # a SIGTERM (`timeout`, a CI runner) unwinds through `finally`, so the local cluster's daemons are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(f"recovery: terminated (load {os.getloadavg()[0]:.1f})"))
    with tempfile.TemporaryDirectory(prefix="ct-recovery-") as tmp:
        work = Path(tmp)
        cluster = LocalSlurmCluster(work / "slurm", nodes=args.nodes)
        cluster.up()

        def side(kind: str):
            def run() -> float:
                name = f"{kind}-{len(parts.get(kind, [])) if kind != 'cold' else len(cold_runs)}"
                try:
                    if kind == "cold":
                        value = cold(cluster, work, name, steps, args.patience)
                        cold_runs.append(value)
                        print(f"{name}: cold start (submit -> first step) {value:.1f} s", flush=True)
                        return value
                    got = fault(cluster, work, name, kind, steps, at_step, args.patience)
                    parts[kind].append(got)
                    total = got["restart to first step"]
                    shares = ", ".join(f"{k} {v:.1f} s ({v / total:.0%})" for k, v in got.items()
                                       if k not in ("restart to first step", "cold"))
                    print(f"{name}: fault -> first step after restart {total:.1f} s = {shares}", flush=True)
                    return total
                except GaveUp as exc:
                    print(f"{name}: {exc}; this round has no {kind} figure", flush=True)
                    if kind == "cold":
                        cold_runs.append(MISSING)
                    else:
                        parts[kind].append(None)
                    return MISSING
                finally:
                    cancel_all(cluster, settle=not bench.smoke)
            return run

        cold_runs: list[float] = []
        try:
            got = interleave({k: side(k) for k in kinds}, bench.rounds)
        finally:
            cluster.down()
    if bench.smoke:  # the sigkill run's first attempt is the cold start
        got["cold"] = [r["cold"] if r else MISSING for r in parts["sigkill"]]
    bench.report(Partial("cold start, submit -> first step", got["cold"], unit=" s"))
    for kind in (k for k in kinds if k != "cold"):
        rows = parts[kind]
        detection = [r["detection"] if r else MISSING for r in rows]
        restart = [r["restart to first step"] - r["detection"] if r else MISSING for r in rows]
        bench.report(Partial(f"{kind}: detection (fault -> failed job's end)", detection, at_most=60, unit=" s"))
        per_cold = [a / b for a, b in zip(restart, got["cold"])]
        bench.report(Partial(f"{kind}: restart to first step / cold start", per_cold,
                             at_most=2, note="restart = fault -> first step after the restart, less the detection"))
    status = bench.finish()
    if not args.no_restart_stats and not bench.smoke:
        print("\nrestart stats (bench/restart_stats.py):", flush=True)
        status = max(status, subprocess.run([sys.executable, str(ROOT / "bench" / "restart_stats.py")]).returncode)
    return status


if __name__ == "__main__":
    sys.exit(main())
