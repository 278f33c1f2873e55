"""Ranks reading a run prepared by another clustertrain version (as under Pyxis, where the container image's
clustertrain runs the ranks): real 2-rank gloo training through the local launcher.

On the old code the first test fails: the ranks validated config.yaml with the strict user model
(extra="forbid"), so the key a newer version added killed every rank with exit code 2."""

from __future__ import annotations

import json

import pytest
import yaml

from clustertrain import __version__
from clustertrain.launch.local import LocalLauncher
from clustertrain.launch.prepare import prepare_run
from clustertrain.resolve import load_project
from clustertrain.core.run_records import read_status
from clustertrain.core.states import State

from tests.support.training import metrics

pytestmark = pytest.mark.slow
NEWER = "99.0.0"


def prepared_by_another_version(tiny_project, tmp_path, edit):
    project = load_project(tiny_project(steps=3, ckpt=3))
    spec = prepare_run(project, project.models[0], tmp_path / "run")
    raw = yaml.safe_load(spec.paths.config.read_text())
    edit(raw)
    spec.paths.config.write_text(yaml.safe_dump(raw, sort_keys=False))
    info = json.loads(spec.paths.run_json.read_text())
    spec.paths.run_json.write_text(json.dumps({**info, "clustertrain": NEWER, "added_in_99": True}))
    return spec


def test_ranks_train_a_config_a_newer_version_wrote_and_say_so_once(tiny_project, tmp_path):
    def newer(raw):
        raw["models"][0]["training"]["ema_decay"] = 0.999
        raw["cluster"]["numa_binding"] = {"policy": "spread"}

    spec = prepared_by_another_version(tiny_project, tmp_path, newer)
    launcher = LocalLauncher()
    result = launcher.wait(launcher.submit(spec))
    logs = [spec.paths.rank_log(r).read_text() for r in (0, 1)]
    assert (result.state, result.exit_code) == ("COMPLETED", 0), (result.message, logs)
    assert [r["step"] for r in metrics(spec.paths.root)] == [1, 2, 3]
    assert read_status(spec.paths).state is State.COMPLETED and spec.paths.completed.is_file()
    [line] = [ln for ln in logs[0].splitlines() if ln.startswith("warning:")]  # rank 0 only, one line
    assert f"prepared by clustertrain {NEWER}, but this node runs clustertrain {__version__}" in line
    assert "ignored the keys" in line and "cluster.numa_binding, models[0].training.ema_decay" in line
    assert "rebuild the container image" in line
    assert "warning:" not in logs[1]


def test_a_config_the_ranks_cannot_read_fails_with_one_line_naming_both_versions(tiny_project, tmp_path):
    def changed(raw):
        raw["models"][0]["training"]["max_steps"] = {"phase1": 2, "phase2": 1}  # a field whose type changed

    spec = prepared_by_another_version(tiny_project, tmp_path, changed)
    launcher = LocalLauncher()
    result = launcher.wait(launcher.submit(spec))
    assert (result.state, result.exit_code) == ("FAILED", 2), result.message
    assert "\n" not in result.message and "models[0].training.max_steps" in result.message
    assert f"prepared by clustertrain {NEWER}, but this node runs clustertrain {__version__}" in result.message
    assert f"install clustertrain {NEWER} on the compute nodes" in result.message
    assert "Traceback" not in spec.paths.rank_log(0).read_text()
    assert not spec.paths.status.exists() and not spec.paths.completed.exists()
