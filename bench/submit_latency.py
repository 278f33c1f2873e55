"""Submit latency: wall time from starting `clustertrain submit` to the first logged training step
(`[clustertrain] step 1/` in the job's Slurm output file) on the local Slurm cluster, 2 ranks on
2 emulated nodes; side by side with the reference `clustertrain run` (local backend, same model and
ranks) from start to its first step in rank 0's log. Alternating, best of --repeats each.

    .venv/bin/python bench/submit_latency.py [--repeats 3] [--state-dir DIR]

Starts (and at the end stops) a LocalSlurmCluster in --state-dir (default: a temp dir); needs root.
Target: submit -> first step <= 10 s. Also printed: the ratio slurm / local (the cost of sbatch,
scheduling, the batch script and srun on top of starting the same ranks locally).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clustertrain.launch.slurm_cluster import LocalSlurmCluster  # noqa: E402

TARGET_S = 10.0
FIRST_STEP = "[clustertrain] step 1/"
PROJECT = """
name: bench
cluster: {{backend: {backend}, nodes: {nodes}, gpus_per_node: 0, procs_per_node: {procs}, threads_per_worker: 1}}
storage: {{root: {root}}}
models:
  - name: m
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64}}
    training: {{max_steps: 5, micro_batch: 4, global_batch: 8, checkpoint_every: 1000, log_every: 1}}
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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--state-dir", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ct-bench-") as tmp:
        work = Path(tmp)
        cluster = LocalSlurmCluster(args.state_dir or work / "slurm", nodes=2)
        cluster.up()
        try:
            env = {**os.environ, **cluster.env()}
            slurm, submits, local = [], [], []
            for i in range(args.repeats):
                total, submitted = time_slurm(work, env, i)
                slurm.append(total)
                submits.append((submitted, total - submitted))
                local.append(time_local(work, i))
        finally:
            cluster.down()
    best_s, best_l = min(slurm), min(local)
    verdict = "OK" if best_s <= TARGET_S else "OVER TARGET"
    print(f"submit -> first step (local Slurm, 2 ranks on 2 nodes): best {best_s:.2f} s of {args.repeats} "
          f"(target <= {TARGET_S:.0f} s: {verdict})")
    cli_s, queued_s = min(submits, key=lambda x: x[0] + x[1])
    print(f"  of which: the submit command {cli_s:.2f} s (prepare + sbatch), queued -> first step {queued_s:.2f} s")
    print(f"reference `clustertrain run` -> first step (local backend, 2 ranks): best {best_l:.2f} s")
    print(f"ratio slurm / local: {best_s / best_l:.2f}")


if __name__ == "__main__":
    main()
