"""One writer per run directory, with real `clustertrain run` processes: a second `run` of a run directory that a live
`run` trains in is refused in one line naming the first's pid, writes nothing, and leaves the first to train exactly
as a lone run does; once the first has ended, the next `run` takes the lease over and resumes."""

from __future__ import annotations

import pytest

from clustertrain.core.run_lease import read_lease
from clustertrain.core.run_paths import RunPaths
from tests.support.training import clustertrain, metrics, run_cli, wait_for

pytestmark = pytest.mark.slow


def listing(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def checkpoints(run_dir) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step_"))


def test_a_second_run_of_a_live_run_directory_is_refused_and_the_first_trains_as_alone(tiny_project, tmp_path):
    project = tiny_project(steps=12, ckpt=4)
    shared, alone = tmp_path / "shared", tmp_path / "alone"
    first = clustertrain("run", str(project), "--run-dir", str(shared))
    try:  # the first has the lease once its lease.json names it (then it trains)
        wait_for(lambda: (lease := read_lease(RunPaths(shared))) is not None and lease.pid == first.pid, 120, 0.1)
        wait_for(lambda: (shared / "logs" / "rank0.log").exists(), 60, 0.1)
        before = {k: v for k, v in listing(shared).items() if not k.startswith(("logs/", "heartbeat/", "monitor/"))}
        second = run_cli("run", str(project), "--run-dir", str(shared), timeout=120)
        assert second.returncode == 2, second.stdout
        errors = [line for line in second.stdout.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and f"in use by pid {first.pid} on " in errors[0] and f"kill {first.pid}" in errors[0]
        assert "Traceback" not in second.stdout
        out, _ = first.communicate(timeout=240)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, out
    after = listing(shared)
    assert all(after.get(k) == v for k, v in before.items() if k in ("run.json", "config.yaml")), \
        "the refused run rewrote the run's records"
    lone = run_cli("run", str(project), "--run-dir", str(alone), timeout=240)
    assert lone.returncode == 0, lone.stdout
    a, b = metrics(shared), metrics(alone)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, 13))
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    assert checkpoints(shared) == checkpoints(alone) == ["step_00000008", "step_00000012"]

    again = run_cli("run", str(project), "--run-dir", str(shared), "--set", "models.tiny.training.max_steps=14",
                    timeout=240)
    assert again.returncode == 0, again.stdout
    assert f"took over the lease of {shared} from pid {first.pid}" in again.stdout
    assert [r["step"] for r in metrics(shared)][-2:] == [13, 14]  # resumed from step 12
