"""The batch script's two budgets, run by bash with stand-ins for srun/scontrol/sbatch (tests/unit/launch/test_sbatch.py
``fake_slurm_bin``): continuing after the stop signal (time limit, preemption) draws on ``launch.max_segments`` only
when the segment saved a newer checkpoint; every other restart draws on ``launch.max_restarts``
(docs/slurm.md, "Segments and restarts"). The real requeue on the local Slurm: tests/integration/launch/test_slurm_backend.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from clustertrain.core.job_records import read_end_marker
from clustertrain.core.run_paths import RunPaths
from clustertrain.launch.config import LaunchConfig
from clustertrain.launch.sbatch import build_request, render_script
from tests.unit.launch.test_sbatch import fake_slurm_bin, project

# the ranks: save a newer checkpoint when asked (CKPT set), stop the batch shell as Slurm's --signal would, exit 0 on it
STOPPING_RANKS = ('[ -n "${CKPT:-}" ] && mkdir -p "$CKPT" && echo "$CKPT_STEP" > "$CKPT/latest"\n'
                  "trap 'exit 0' USR2\nkill -USR2 $PPID\nfor _ in $(seq 300); do sleep 0.1; done\nexit 3\n")


def run_stop(tmp_path: Path, *, max_segments: int, max_restarts: int, progress: bool, slurm_restarts: int = 0,
             continued_here: int = 0, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, bool, RunPaths]:
    p = project()
    run = tmp_path / "run"
    req = build_request(p, p.models[0], run, launch=LaunchConfig(max_segments=max_segments, max_restarts=max_restarts))
    script = tmp_path / "job.sh"
    script.write_text(render_script(req))
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text("step_00000100\n")
    if continued_here:
        (run / "jobs").mkdir()
        (run / "jobs" / "42.continued").write_text(f"{continued_here}\n")
    bin_dir = fake_slurm_bin(tmp_path, STOPPING_RANKS, ["node1"])
    full = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node1",
            "SLURM_RESTART_COUNT": str(slurm_restarts), **(env or {})}
    if progress:
        full |= {"CKPT": str(run / "checkpoints"), "CKPT_STEP": "step_00000200"}
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=full, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = tmp_path / "scontrol.calls"
    requeued = calls.exists() and "requeue 42" in calls.read_text().splitlines()
    return proc, requeued, RunPaths(run)


def test_a_segment_that_saved_continues_without_touching_the_failure_budget(tmp_path):
    """Issue 37 item 7: three continuations already and max_restarts 0: the fourth segment still continues."""
    proc, requeued, paths = run_stop(tmp_path, max_segments=6, max_restarts=0, progress=True, slurm_restarts=3,
                                     continued_here=3)
    assert "(restart 3: segment 4 of at most 6, 0 failure restarts of at most 0)" in proc.stdout
    assert requeued, proc.stdout
    assert "requeueing job 42 for segment 5 of at most 6" in proc.stdout
    assert (paths.root / "jobs" / "42.continued").read_text().strip() == "4"


def test_the_last_allowed_segment_stops_and_says_how_to_go_on(tmp_path):
    proc, requeued, paths = run_stop(tmp_path, max_segments=2, max_restarts=3, progress=True, slurm_restarts=1,
                                     continued_here=1)
    assert not requeued, proc.stdout
    assert "stopped after segment 2 of at most 2 (launch.max_segments=2); resubmit to resume" in proc.stdout
    assert (paths.root / "jobs" / "42.continued").read_text().strip() == "1"
    end = read_end_marker(paths, "42")
    assert end is not None and (end.state, end.restarts) == ("COMPLETED", 1)


@pytest.mark.parametrize("max_restarts,requeue", [(1, True), (0, False)])
def test_a_segment_that_saved_nothing_is_a_failure_restart(tmp_path, max_restarts, requeue):
    """No newer checkpoint: another segment would not get further; it is retried only within max_restarts, so a run
    that makes no progress cannot requeue itself for ever."""
    proc, requeued, paths = run_stop(tmp_path, max_segments=10, max_restarts=max_restarts, progress=False)
    assert requeued == requeue, proc.stdout
    assert "this segment saved no new checkpoint" in proc.stdout
    if requeue:
        assert "as failure restart 1 of 1 (restart 1)" in proc.stdout
    else:
        assert "launch.max_restarts=0" in proc.stdout
    assert not (paths.root / "jobs" / "42.continued").exists()


def test_counts_carried_by_a_resubmission_and_slurm_requeues_after_failures(tmp_path):
    """A job the script resubmitted after a failure gets the failures and continuations before it; a requeue Slurm made
    on its own (node failure: SLURM_RESTART_COUNT beyond this job's continuations) is a failure."""
    proc, requeued, _ = run_stop(tmp_path, max_segments=4, max_restarts=2, progress=False, slurm_restarts=2,
                                 continued_here=1, env={"CLUSTERTRAIN_FAILURES": "1", "CLUSTERTRAIN_CONTINUED": "1",
                                                        "CLUSTERTRAIN_RESTARTS": "3"})
    # restarts 3 + 2; segment 1 + 1 continued before + 1 here; failures 1 + (2 - 1)
    assert "(restart 5: segment 3 of at most 4, 2 failure restarts of at most 2)" in proc.stdout
    assert not requeued, proc.stdout
