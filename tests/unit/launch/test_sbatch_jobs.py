"""Job records (RUN_DIR/jobs.jsonl) and the Slurm-state -> JobStatus mapping of the Slurm backend."""

from __future__ import annotations

import json

import pytest

from clustertrain.core.job_records import JobRecord, add_record, find_record, read_records, update_record
from clustertrain.launch.slurm import to_job_status
from clustertrain.launch.slurm_query import JobState
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.run_records import RunStatus


def record(job_id: str) -> JobRecord:
    return JobRecord(job_id=job_id, model="m", job_name="p-m", script=f"/r/jobs/{job_id}.sbatch",
                     output=f"/logs/m/p-m-{job_id}.out", submitted=1.0)


def test_records_round_trip_update_and_find(tmp_path):
    paths = RunPaths(tmp_path)
    assert read_records(paths) == [] and find_record(paths) is None
    add_record(paths, record("7"))
    add_record(paths, record("9"))
    assert find_record(paths).job_id == "9" and find_record(paths, "7").output == "/logs/m/p-m-7.out"
    assert update_record(paths, "7", state="FAILED", exit_code=1, restarts=2).state == "FAILED"
    assert update_record(paths, "404", state="X") is None
    rows = [json.loads(line) for line in paths.jobs.read_text().splitlines()]
    assert [(r["job_id"], r["state"], r["exit_code"], r["restarts"], r["version"]) for r in rows] == \
        [("7", "FAILED", 1, 2, 1), ("9", None, None, 0, 1)]
    assert not list(tmp_path.glob(".jobs.jsonl.*"))  # atomic write leaves no temp file


def test_reading_tolerates_new_fields_and_damaged_lines(tmp_path):
    paths = RunPaths(tmp_path)
    good = {**record("3").__dict__, "added_by_a_newer_version": True}
    paths.jobs.write_text(json.dumps(good) + "\n{not json\n" + json.dumps({"job_id": "4"}) + "\n")
    assert [r.job_id for r in read_records(paths)] == ["3"]


@pytest.mark.parametrize("slurm,run_state,mapped", [
    ("PENDING", None, "PENDING"), ("REQUEUED", None, "PENDING"), ("CONFIGURING", None, "PENDING"),
    ("RUNNING", None, "RUNNING"), ("COMPLETING", None, "RUNNING"),
    ("COMPLETED", "completed", "COMPLETED"), ("COMPLETED", None, "COMPLETED"), ("COMPLETED", "stopped", "STOPPED"),
    ("PREEMPTED", None, "STOPPED"), ("CANCELLED", None, "CANCELLED"), ("FAILED", None, "FAILED"),
    ("TIMEOUT", None, "FAILED"), ("NODE_FAIL", None, "FAILED"), ("OUT_OF_MEMORY", None, "FAILED"),
])
def test_slurm_states_map_to_job_status(slurm, run_state, mapped):
    status = to_job_status(JobState("5", "p-m", slurm, reason="Resources"), RunStatus(state=run_state) if run_state else None)
    assert (status.state, status.extra["slurm_state"], status.detail) == (mapped, slurm, f"{slurm} (Resources)")
    assert status.finished == (mapped not in ("PENDING", "RUNNING"))


def test_exit_code_of_a_signalled_job_is_128_plus_signal():
    assert to_job_status(JobState("5", "n", "FAILED", exit_code=0, signal=9)).exit_code == 137
    assert to_job_status(JobState("5", "n", "FAILED", exit_code=3, signal=0)).exit_code == 3
    assert to_job_status(JobState("5", "n", "RUNNING")).exit_code is None


def test_end_marker_written_by_the_script_body_is_read_back(tmp_path):
    """The very shell function the batch script uses writes the marker; read_end_marker parses it."""
    import subprocess
    from pathlib import Path

    from clustertrain.core.job_records import read_end_marker
    from clustertrain.launch.sbatch import build_request, render_script
    from clustertrain.project import validate_project

    p = validate_project({"name": "p", "cluster": {"backend": "slurm", "nodes": 1, "procs_per_node": 1},
                          "storage": {"root": str(tmp_path)}, "models": [{"name": "m", "model": {"layers": 1, "hidden": 8,
                          "heads": 1, "seq_len": 8}, "training": {"max_steps": 1, "micro_batch": 1, "global_batch": 1}}]})
    run = tmp_path / "run 'x'"
    text = render_script(build_request(p, p.models[0], run))
    start = text.index("JOBS_DIR=")
    body = text[text.index("RUN_DIR="):text.index("\n", text.index("RUN_DIR="))] + "\nRESTARTS=2\n" + \
        text[start:text.index("\n}\n", start) + 3] + "record_end TIMEOUT 143\n"
    subprocess.run(["bash", "-c", body], check=True, env={"SLURM_JOB_ID": "77", "PATH": "/usr/bin:/bin"})
    end = read_end_marker(RunPaths(run), "77")
    assert (end.state, end.exit_code, end.restarts) == ("TIMEOUT", 143, 2) and end.ended > 1.7e9
    assert [f.name for f in (run / "jobs").iterdir()] == ["77.end"]  # no temp file left behind
    (run / "jobs" / "78.end").write_text("state=rm -rf /\n")
    assert read_end_marker(RunPaths(run), "78") is None and read_end_marker(RunPaths(run), "79") is None
    assert read_end_marker(RunPaths(Path("/nonexistent")), "1") is None
