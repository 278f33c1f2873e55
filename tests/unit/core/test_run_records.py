"""The typed records of a run directory (clustertrain.core.run_records, checkpoint meta.json, jobs.jsonl and end
markers): old files still read, fields a newer version added are ignored, the writer's version is recorded;
and the lenient read of the resolved config.yaml with its version check."""

from __future__ import annotations

import json

import pytest
import yaml

from clustertrain import __version__
from clustertrain.core.errors import ConfigError, RunDirError
from clustertrain.core.job_records import JobRecord, add_record, read_end_marker, read_records
from clustertrain.launch.slurm import to_job_status
from clustertrain.launch.slurm_query import JobState
from clustertrain.project import Project, dump_project, validate_project
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.run_records import (
    BackupRecord, BackupState, BlendPrefix, RunInfo, RunStatus, mark_started, read_resolved_config, read_run_info, read_status,
    write_record, write_status_record,
)
from clustertrain.core.states import State
from clustertrain.core.checkpoint_format import CheckpointMeta, read_meta

# status.json and run.json exactly as clustertrain 0.1.0 (before the typed records) wrote them
OLD_STATUS = {"state": "stopped", "step": 12, "signal": "SIGUSR2", "checkpoint": "/r/checkpoints/step_00000012",
              "backup": None, "pid": 4242, "time": 1795000000.0, "backup_state": "failed", "backup_error": "boom",
              "backups": [{"checkpoint": "step_00000012", "url": "s3://b/x", "state": "failed", "started": 1.0,
                           "finished": 2.0, "seconds": 1.0, "error": "boom"}]}
OLD_RUN = {"project": "p", "model": "m", "fingerprint": "abc", "dataset": "/d/ds", "clustertrain": "0.1.0",
           "created": 1795000000.0}


def small_project() -> Project:
    return validate_project({"name": "p", "cluster": {"procs_per_node": 2}, "models": [{
        "name": "m", "model": {"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8},
        "training": {"max_steps": 3, "micro_batch": 1, "global_batch": 2}}]})


def test_old_lower_case_status_reads_as_the_one_vocabulary(tmp_path):
    paths = RunPaths(tmp_path)
    paths.status.write_text(json.dumps(OLD_STATUS))
    status = read_status(paths)
    assert status.state is State.STOPPED and status.step == 12 and status.clustertrain == "unknown"
    assert status.backup_state is BackupState.FAILED and status.backups[0].error == "boom"
    paths.status.write_text(json.dumps({**OLD_STATUS, "state": "completed"}))
    assert read_status(paths).state is State.COMPLETED
    assert read_status(RunPaths(tmp_path / "none")) is None


def test_status_is_written_upper_case_with_the_version_and_then_the_marker(tmp_path):
    paths = RunPaths(tmp_path)
    mark_started(paths)  # no marker yet: nothing to remove
    write_status_record(paths, RunStatus(state=State.STOPPED, step=3))
    assert not paths.completed.exists()
    raw = json.loads(paths.status.read_text())
    assert (raw["state"], raw["version"], raw["clustertrain"]) == ("STOPPED", 1, __version__)
    rec = BackupRecord(checkpoint="step_00000005", url="s3://b/y", state=BackupState.VERIFIED)
    write_status_record(paths, RunStatus(state=State.COMPLETED, step=5, backups=[rec]))
    assert paths.completed.read_bytes() == b""
    assert json.loads(paths.status.read_text())["backups"][0]["state"] == "verified"
    mark_started(paths)
    assert not paths.completed.exists() and not list(tmp_path.glob(".*"))  # no temp file left


def test_fields_a_newer_version_added_are_ignored(tmp_path):
    paths = RunPaths(tmp_path)
    paths.run_json.write_text(json.dumps({**OLD_RUN, "clustertrain": "9.9.0", "version": 2, "new": {"x": 1}}))
    info = read_run_info(paths)
    assert (info.clustertrain, info.version, info.dataset) == ("9.9.0", 2, "/d/ds") and not hasattr(info, "new")
    paths.status.write_text(json.dumps({**OLD_STATUS, "state": "COMPLETED", "eta": 3, "backups": [
        {**OLD_STATUS["backups"][0], "bytes": 10}]}))
    assert read_status(paths).state is State.COMPLETED
    ckpt = tmp_path / "step_00000004"
    ckpt.mkdir()
    (ckpt / "meta.json").write_text(json.dumps({"step": 4, "fingerprint": "abc", "shards": 8}))
    meta = read_meta(ckpt)
    assert (meta.step, meta.fingerprint, meta.world_size, meta.clustertrain) == (4, "abc", None, "unknown")


def test_writers_record_their_version_and_damage_is_one_line(tmp_path):
    paths = RunPaths(tmp_path)
    write_record(paths.run_json, RunInfo(**{k: v for k, v in OLD_RUN.items() if k != "clustertrain"}))
    assert json.loads(paths.run_json.read_text())["clustertrain"] == __version__
    write_record(tmp_path / "meta.json", CheckpointMeta(step=1))
    assert json.loads((tmp_path / "meta.json").read_text())["format"] == "clustertrain-checkpoint"
    paths.status.write_text('{"state": ')
    with pytest.raises(RunDirError, match=r"status.json: not valid JSON .*remove it"):
        read_status(paths)
    paths.status.write_text('{"step": 3}')
    with pytest.raises(RunDirError, match=r"status.json: state: required key is missing"):
        read_status(paths)


def test_run_json_records_a_blend_and_reads_an_older_one_as_one_source(tmp_path):
    paths = RunPaths(tmp_path)
    paths.run_json.write_text(json.dumps(OLD_RUN))  # before `blend` existed
    assert read_run_info(paths).sources() == [(1.0, "/d/ds")]
    blend = [BlendPrefix(weight=0.7, prefix="/d/web"), BlendPrefix(weight=0.3, prefix="/d/code")]
    write_record(paths.run_json, RunInfo(**{**OLD_RUN, "dataset": "/d/web", "blend": blend}))
    raw = json.loads(paths.run_json.read_text())
    assert (raw["dataset"], raw["blend"]) == ("/d/web", [{"weight": 0.7, "prefix": "/d/web"},
                                                          {"weight": 0.3, "prefix": "/d/code"}])
    assert read_run_info(paths).sources() == [(0.7, "/d/web"), (0.3, "/d/code")]


def test_job_records_and_end_markers(tmp_path):
    paths = RunPaths(tmp_path)
    add_record(paths, JobRecord(job_id="7", model="m", job_name="p-m", script="s", output="o", submitted=1.0))
    line = json.loads(paths.jobs.read_text())
    assert (line["version"], line["clustertrain"], line["state"]) == (1, __version__, None)
    assert read_records(paths)[0].job_id == "7"
    (tmp_path / "jobs").mkdir()
    marker = "version=1\nstate=NODE_FAIL\nexit_code=143\nrestarts=\nended=1795000100\nnew=x\n"
    (tmp_path / "jobs" / "7.end").write_text(marker)
    end = read_end_marker(paths, "7")
    assert (end.state, end.exit_code, end.restarts, end.ended) == ("NODE_FAIL", 143, 0, 1795000100.0)
    (tmp_path / "jobs" / "8.end").write_text("version=1\nstate=")  # cut short: as if none were written
    assert read_end_marker(paths, "8") is None


def test_slurm_completed_uses_the_marker_and_the_typed_status():
    job = JobState("5", "p-m", "COMPLETED", exit_code=0)
    stopped = RunStatus(state="stopped", step=3)  # an old file's spelling
    assert to_job_status(job, stopped).state is State.STOPPED
    assert to_job_status(job, stopped, completed=True).state is State.COMPLETED
    assert to_job_status(job, None).state is State.COMPLETED and to_job_status(job).finished


def test_resolved_config_from_a_newer_version_drops_and_names_unknown_keys(tmp_path):
    raw = yaml.safe_load(dump_project(small_project()))
    raw["telemetry"] = {"endpoint": "x"}
    raw["models"][0]["training"]["ema_decay"] = 0.999
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    project, line = read_resolved_config(path, Project, written_by="9.9.0", running="0.1.0")
    assert project.models[0].training.max_steps == 3
    assert line.count("\n") == 0 and line.startswith(f"warning: {path}:")
    assert "prepared by clustertrain 9.9.0, but this node runs clustertrain 0.1.0" in line
    assert "models[0].training.ema_decay, telemetry" in line and "rebuild the container image" in line
    with pytest.raises(ConfigError, match="unknown key"):  # the user-facing model stays strict
        validate_project(raw)


def test_resolved_config_same_version_is_silent_and_skew_alone_is_one_line(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(dump_project(small_project()))
    assert read_resolved_config(path, Project, written_by="0.1.0", running="0.1.0")[1] is None
    assert read_resolved_config(path, Project, written_by="unknown", running="0.1.0")[1] is None
    _, line = read_resolved_config(path, Project, written_by="0.2.0", running="0.1.0")
    assert "clustertrain 0.2.0" in line and "ignored" not in line


def test_resolved_config_that_cannot_validate_names_both_versions(tmp_path):
    raw = yaml.safe_load(dump_project(small_project()))
    raw["models"][0]["model"]["layers"] = {"encoder": 2, "decoder": 2}  # a field whose type changed
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ConfigError) as err:
        read_resolved_config(path, Project, written_by="9.9.0", running="0.1.0")
    msg = str(err.value)
    assert msg.startswith(f"{path}:") and "models[0].model.layers" in msg and "\n" not in msg
    assert "prepared by clustertrain 9.9.0, but this node runs clustertrain 0.1.0" in msg
    assert "install clustertrain 9.9.0 on the compute nodes" in msg
