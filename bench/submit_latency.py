"""Submit latency: wall time from starting `clustertrain submit` to the first logged training step
(`[clustertrain] step 1/` in the job's Slurm output file) on the local Slurm cluster, 2 ranks on
2 emulated nodes; side by side with the reference `clustertrain run` (local backend, same model and
ranks) from start to its first step in rank 0's log. Interleaved rounds (bench/harness.py).

    .venv/bin/python bench/submit_latency.py [--rounds 3] [--state-dir DIR]

Starts (and at the end stops) a LocalSlurmCluster (clustertrain.launch.slurm_cluster: slurmctld and one slurmd per
emulated node, in --state-dir, default a temp dir); needs root and slurm-wlm. The cluster's own start is not timed.
Target (issue 40): submit -> first step <= 6 s, printed as seconds (at_most=6). Also printed: the reference local
run's seconds, the submit command's own seconds, and the ratio slurm / local (the cost of sbatch, scheduling, the
batch script and srun on top of starting the same ranks locally).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import Bench, Ratio, interleave  # puts the repository on sys.path

from clustertrain.launch.slurm_cluster import LocalSlurmCluster  # noqa: E402

TARGET_S = 6.0
FIRST_STEP = "[clustertrain] step 1/"
PROJECT = """
name: bench
cluster: {{backend: {backend}, nodes: {nodes}, gpus_per_node: 0, procs_per_node: {procs}, threads_per_worker: 1}}
storage: {{root: {root}}}
models:
  - name: m
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64}}
    training: {{max_steps: 2, micro_batch: 4, global_batch: 8, checkpoint_every: 1000, log_every: 1}}
"""


def wait_for_line(path_of, timeout: float = 120.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = path_of()
        if path is not None and path.exists() and FIRST_STEP in path.read_text(errors="replace"):
            return time.monotonic()
        time.sleep(0.02)
    raise SystemExit(f"no first step within {timeout:.0f} s ({path_of()})")


def time_slurm(work: Path, env: dict, i: int) -> tuple[float, float]:
    project = work / f"slurm-{i}.yaml"
    project.write_text(PROJECT.format(backend="slurm", nodes=2, procs=1, root=json.dumps(str(work / f"fsx-s{i}"))))
    run = work / f"fsx-s{i}" / "bench" / "m"

    def output() -> Path | None:
        try:
            return Path(json.loads((run / "jobs.jsonl").read_text().splitlines()[-1])["output"])
        except (FileNotFoundError, IndexError):
            return None

    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "clustertrain", "submit", str(project)], env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"submit failed: {proc.stderr.strip()}")
    submitted = time.monotonic() - t0
    t1 = wait_for_line(output)
    job_id = proc.stdout.split("job ")[1].split()[0]
    subprocess.run(["scancel", job_id], env=env, check=False)
    print(f"  slurm: submit returned after {submitted:.2f} s, first step at {t1 - t0:.2f} s (job {job_id})")
    return t1 - t0, submitted


def time_local(work: Path, i: int) -> float:
    project = work / f"local-{i}.yaml"
    project.write_text(PROJECT.format(backend="local", nodes=1, procs=2, root=json.dumps(str(work / f"fsx-l{i}"))))
    log = work / f"fsx-l{i}" / "bench" / "m" / "logs" / "rank0.log"
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "clustertrain", "run", str(project)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    t1 = wait_for_line(lambda: log)
    proc.wait(timeout=120)
    print(f"  local: first step at {t1 - t0:.2f} s")
    return t1 - t0


def main() -> None:
    bench = Bench("submit_latency", __doc__, rounds=3)
    bench.parser.add_argument("--state-dir", type=Path, default=None)
    args = bench.parse()
    submits: list[float] = []
    with tempfile.TemporaryDirectory(prefix="ct-bench-") as tmp:
        work = Path(tmp)
        cluster = LocalSlurmCluster(args.state_dir or work / "slurm", nodes=2)
        cluster.up()
        try:
            env = {**os.environ, **cluster.env()}
            counter = iter(range(10_000))

            def slurm() -> float:
                total, submitted = time_slurm(work, env, next(counter))
                submits.append(submitted)
                return total

            times = interleave({"slurm": slurm, "local": lambda: time_local(work, next(counter))}, args.rounds)
        finally:
            cluster.down()
    one = [1.0] * len(submits)
    bench.report(Ratio.of("reference: clustertrain run -> first step (local backend, 2 ranks)", times["local"], one,
                          unit=" s"))
    bench.report(Ratio.of("of which the submit command (prepare + sbatch)", submits, one, unit=" s"))
    bench.report(Ratio.of("slurm / local", times["slurm"], times["local"], unit="x"))
    bench.report(Ratio.of("clustertrain submit -> first step (local Slurm, 2 ranks on 2 nodes)", times["slurm"], one,
                          at_most=TARGET_S, unit=" s"))
    sys.exit(bench.finish())


if __name__ == "__main__":
    main()
