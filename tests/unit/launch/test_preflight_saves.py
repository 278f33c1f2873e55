"""`check`'s stop-save rules with what runs measured (clustertrain.launch.preflight): the measured save time
replaces the planned one, Slurm's KillWait at the time limit, and the watchdog's hang ceiling against the
longest save."""

from __future__ import annotations

import pytest

from clustertrain.launch.preflight import KILL_WAIT_S, RECENT_SAVES, launch_findings, save_time
from clustertrain.core.storage_layout import storage_layout
from clustertrain.core.run_events import Event, EventKind, append_event
from clustertrain.plan.plan import make_plan
from clustertrain.project import architecture_fingerprint
from clustertrain.resolve import load_project
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.run_records import RunInfo, write_record
from tests.unit.launch.test_launch_preflight import FITS, P5E

BASE = [*FITS, "launch.python=/fsx/data/venv/bin/python", 'cluster.time_limit="48:00:00"']


def project_at(tmp_path, *sets: str):
    return load_project(P5E, [*BASE, f"storage.runs={tmp_path}/runs", *sets])


def record_saves(project, model: str, seconds: list[float], fingerprint: str | None = None) -> RunPaths:
    """A run directory of ``model`` whose rank 0 committed checkpoints that took ``seconds`` each."""
    entry = project.model(model)
    paths = RunPaths(storage_layout(project).run_dir(model))
    paths.root.mkdir(parents=True)
    write_record(paths.run_json, RunInfo(project=project.name, model=model, dataset="d", created=0.0,
                                         fingerprint=fingerprint or architecture_fingerprint(project, entry)))
    for step, s in enumerate(seconds, 1):
        append_event(paths.events, Event(kind=EventKind.CHECKPOINT, step=step * 1000, value=0.5, threshold=s,
                                         message="checkpoint committed"))
    return paths


def step_of(project, model: str = "model-1") -> float:
    return make_plan(project).model(model).step_time_s


def by_path(findings, path: str):
    return [f for f in findings if f.path == path]


def test_the_longest_recent_measured_save_replaces_the_planned_one(tmp_path):
    project = project_at(tmp_path)
    entry = project.model("model-1")
    params = make_plan(project).model("model-1").params
    planned = save_time(project, entry, params)
    assert not planned.measured and planned.how.startswith("planned at 1 GB/s")
    old_long = [500.0]  # an old slow save, older than the last RECENT_SAVES: not what the cluster does now
    paths = record_saves(project, "model-1", old_long + [40.0] * (RECENT_SAVES - 1) + [55.0])
    measured = save_time(project, entry, params)
    assert measured.measured and measured.seconds == 55.0
    assert measured.how == f"measured: the longest of the last {RECENT_SAVES} saves in {paths.events}"
    other = record_saves(project, "model-2", [900.0], fingerprint="another-architecture")
    assert not save_time(project, project.model("model-2"), params).measured, other  # a different model's saves


def test_a_measured_save_beyond_grace_and_killwait_is_an_error_saying_measured(tmp_path):
    project = project_at(tmp_path, "launch.signal_grace_s=600")
    assert by_path(launch_findings(project), "launch.signal_grace_s") == []  # planned: 2.3 s step + 31 s save
    record_saves(project, "model-3", [700.0])
    [f] = by_path(launch_findings(project), "launch.signal_grace_s")
    assert f.level == "error" and f"plus Slurm's KillWait ({KILL_WAIT_S} s) at the time limit" in f.message
    assert "model-3: one step" in f.message and "a checkpoint save (700 s, measured: the one save in " in f.message
    assert f.fix == f"set launch.signal_grace_s to at least {int((step_of(project) + 700) * 1.5) + 1}"


def test_a_save_that_lands_only_in_killwait_is_a_warning(tmp_path):
    project = project_at(tmp_path, "launch.signal_grace_s=600")
    record_saves(project, "model-1", [600 - step_of(project) + KILL_WAIT_S / 2])
    [f] = by_path(launch_findings(project), "launch.signal_grace_s")
    assert f.level == "warning" and "lands only after the time limit, in Slurm's KillWait" in f.message
    assert "a preemption gives no KillWait" in f.message and "measured" in f.message


def test_a_hang_ceiling_below_factor_times_the_longest_save_is_a_warning(tmp_path):
    project = project_at(tmp_path)
    assert by_path(launch_findings(project), "monitor.hang_ceiling_s") == []  # 3 x 37 s planned < 900 s
    record_saves(project, "model-5", [400.0])
    record_saves(project, "model-2", [310.0])
    [f] = by_path(launch_findings(project), "monitor.hang_ceiling_s")
    assert f.level == "warning" and f.message.startswith("900 s is shorter than monitor.hang_step_factor (3) x "
                                                         "model-5's checkpoint save (400 s, measured")
    assert "take a slow save for a hang" in f.message and f.fix == "raise monitor.hang_ceiling_s to at least 1200"
    raised = load_project(P5E, [*BASE, f"storage.runs={tmp_path}/runs", "monitor.hang_ceiling_s=1200"])
    assert by_path(launch_findings(raised), "monitor.hang_ceiling_s") == []
    only_two = by_path(launch_findings(project, models=["model-2"]), "monitor.hang_ceiling_s")
    assert [f.fix for f in only_two] == ["raise monitor.hang_ceiling_s to at least 930"]


@pytest.mark.parametrize("ceiling, warned", [(100, True), (120, False)])
def test_the_ceiling_rule_uses_the_planned_save_without_measurements(tmp_path, ceiling, warned):
    project = project_at(tmp_path, f"monitor.hang_ceiling_s={ceiling}")  # model-7's planned save: 36.9 s, x 3 = 111 s
    # from first principles: the largest model writes fp32 weights and AdamW's two moments, 12 B per parameter,
    # at the assumed 1 GB/s (the checkpoint FSx's 1000 MB/s per TiB x 7200 GB is more)
    plan = make_plan(project)
    largest = max(plan.models, key=lambda m: m.params)
    assert largest.name == "model-7" and 12 * largest.params / 1e9 == pytest.approx(36.9, abs=0.05)
    found = by_path(launch_findings(project), "monitor.hang_ceiling_s")
    assert bool(found) == warned
    if warned:
        assert "model-7's checkpoint save (37 s, planned at 1 GB/s for one writer (assumed))" in found[0].message
        assert found[0].fix == f"raise monitor.hang_ceiling_s to at least {-(-3 * 12 * largest.params // 10**9)}"
