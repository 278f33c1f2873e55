"""Status that tells the truth (issue 36, item 6), against the real local Slurm cluster (2 emulated nodes) and a real
local run: a queued job shows Slurm's pending reason and no ETA, ``logs`` says it is queued, a cancelled job is
``cancelled``; the restart count ``status`` shows is the one the batch log prints, across a resubmission and a new
``submit``; ``run`` on a completed run starts no rank and counts no restart; routine events are ``info``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from clustertrain.core.job_records import end_marker_path, read_end_marker, read_records
from clustertrain.core.run_events import read_events, read_usage
from clustertrain.core.run_paths import RunPaths
from clustertrain.launch.config import LaunchConfig
from clustertrain.launch.slurm import SlurmLauncher, submit_project
from clustertrain.launch.slurm_query import query_job
from clustertrain.resolve import load_project
from tests.support.projects import tiny_project
from tests.support.slurm import client_env, sbatch
from tests.support.training import run_cli, wait_for

pytestmark = pytest.mark.slow


def cli(cluster, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clustertrain", *args], capture_output=True, text=True,
                          env=client_env(cluster), timeout=timeout)


def status_row(cluster, path: Path, *args: str) -> tuple[int, dict]:
    proc = cli(cluster, "status", str(path), "--json", *args)
    assert proc.returncode in (0, 1), proc.stderr
    [row] = json.loads(proc.stdout)
    return proc.returncode, row


def test_a_queued_job_shows_its_reason_and_no_eta_logs_says_queued_and_a_cancel_is_cancelled(local_slurm,
                                                                                           slurm_project, tmp_path):
    path = slurm_project(steps=3, ckpt=3)
    blocker = sbatch(local_slurm, tmp_path, "sleep 120\n", "--nodes=2", "--exclusive", "-J", "blocker")
    try:
        sub = cli(local_slurm, "submit", str(path))
        assert sub.returncode == 0, sub.stderr
        job_id = sub.stdout.split("job ")[1].split()[0]
        wait_for(lambda: (lambda s: s.state == "PENDING" and s.reason)(query_job(job_id, local_slurm.env())), 30,
                 interval=0.2)
        waiting = "Resources|Priority"  # Slurm's scheduler moves a job held behind another between the two
        code, row = status_row(local_slurm, path)
        assert (code, row["state"], row["job_id"], row["eta_s"], row["restarts"]) == (0, "queued", job_id, None, 0), row
        assert re.fullmatch(waiting, row["pending_reason"] or ""), row
        table = cli(local_slurm, "status", str(path))
        assert re.search(rf"queued \(({waiting})\)", table.stdout), table.stdout

        logs = cli(local_slurm, "logs", str(path))
        assert (logs.returncode, logs.stdout) == (0, ""), logs.stderr
        assert re.fullmatch(rf"tiny: job {job_id} is queued \(({waiting})\): no output yet; --follow waits for it",
                            logs.stderr.strip()), logs.stderr

        cancel = cli(local_slurm, "cancel", str(path))
        assert cancel.returncode == 0 and f"cancelled tiny: job {job_id}" in cancel.stdout, cancel.stderr
        wait_for(lambda: query_job(job_id, local_slurm.env()).finished, 30, interval=0.2)
        code, row = status_row(local_slurm, path)
        assert (code, row["state"], row["job_state"], row["pending_reason"]) == (1, "cancelled", "CANCELLED", None), row
        assert row["message"].startswith(f"job {job_id} CANCELLED")
    finally:
        subprocess.run(["scancel", blocker], env=client_env(local_slurm), check=True)


def batch_restart(output: str, job_id: str) -> int:
    """The restart count the batch script printed when job ``job_id`` started (the last start)."""
    found = re.findall(rf"clustertrain: job {job_id} \(restart (\d+): segment \d+ of at most \d+, \d+ failure restarts of at most 3\)", output)
    assert found, output[-3000:]
    return int(found[-1])


def test_restart_counts_agree_between_the_batch_log_and_status(local_slurm, slurm_project):
    path = slurm_project(steps=2, ckpt=2)
    project = load_project(path)

    def submit(steps: int, **env) -> str:
        launcher = SlurmLauncher(env={**local_slurm.env(), **env}, launch=LaunchConfig(exclusive=False))
        p = load_project(path, [f"models.0.training.max_steps={steps}"])
        [sub] = submit_project(p, None, None, resume=True, launcher=launcher)
        final = launcher.wait(sub.job_id, timeout=120)
        assert final.state == "COMPLETED", "\n".join(launcher.logs(sub.job_id))[-3000:]
        return sub.job_id

    run = RunPaths(project.storage.root / "sl" / "tiny")
    first = submit(2)
    second = submit(3, CLUSTERTRAIN_RESTARTS="1")  # as the batch script of `first` resubmits after a failure:
    marker = end_marker_path(run, first)           # its end marker names the job that carries the run on
    marker.write_text(re.sub(r"(?m)^next_job=.*$", f"next_job={second}", marker.read_text()))
    assert read_end_marker(run, first).next_job == second
    third = submit(4)  # a user's new submit: the count starts again
    assert len(read_usage(run).attempts) == 3  # three starts of the ranks in one run directory

    for job, expected in ((first, 0), (second, 1), (third, 0)):
        output = Path(next(r.output for r in read_records(run) if r.job_id == job)).read_text(errors="replace")
        code, row = status_row(local_slurm, path, "--job", job)
        assert (code, row["job_id"], row["restarts"]) == (0, job, expected), row
        assert batch_restart(output, job) == expected
    table = cli(local_slurm, "status", str(path))
    assert f"{third} " in table.stdout and "(restart" not in table.stdout, table.stdout


def test_run_on_a_completed_run_starts_nothing_and_counts_no_restart(tmp_path):
    path = tiny_project(tmp_path)
    run_dir = tmp_path / "run"
    done = run_cli("run", str(path), "--run-dir", str(run_dir), timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    paths = RunPaths(run_dir)
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()}
    assert len(read_usage(paths).attempts) == 1
    checkpoints = [e for e in read_events(paths) if e.kind == "checkpoint"]
    assert checkpoints and {e.severity for e in checkpoints} == {"info"}  # routine: not a warning

    again = run_cli("run", str(path), "--run-dir", str(run_dir), timeout=120)
    assert again.returncode == 0 and again.stdout.strip() == (
        f"tiny: already completed at step 1 ({run_dir}); nothing to do — raise training.max_steps to train further, "
        "or --no-resume to start over"), again.stdout + again.stderr
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()} == before  # nothing written
    shown = run_cli("status", str(path), "--run-dir", str(run_dir), "--json")
    [row] = json.loads(shown.stdout)
    assert (shown.returncode, row["state"], row["restarts"], row["goodput"]["restarts"]) == (0, "completed", 0, 0), row
