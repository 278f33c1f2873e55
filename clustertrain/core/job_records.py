"""Job records: ``RUN_DIR/jobs.jsonl`` and the batch scripts under ``RUN_DIR/jobs/``.

Format (version 1, :class:`JobRecord`): one JSON object per line, one line per submitted Slurm job, oldest first::

    {"version": 1, "clustertrain": "0.1.0", "job_id": "42", "model": "tiny", "job_name": "proj-tiny",
     "script": "RUN_DIR/jobs/20261122-010203-42.sbatch", "output": "/fsx/proj/logs/tiny/proj-tiny-42.out",
     "submitted": 1795000000.0, "state": "COMPLETED", "exit_code": 0, "restarts": 1, "ended": 1795000100.0}

``state`` is null until someone observed the end (``clustertrain status``, :meth:`SlurmLauncher.status`,
``wait``), then the final state in Slurm's own words (COMPLETED, FAILED, CANCELLED, TIMEOUT, PREEMPTED,
NODE_FAIL...: what :func:`clustertrain.launch.slurm.to_job_status` maps to a
:class:`clustertrain.core.states.State`, so PREEMPTED and NODE_FAIL stay told apart). ``restarts`` counts
requeues; ``clustertrain`` is the version that wrote the line (see :mod:`clustertrain.core.run_records`).
Updates rewrite the file atomically (temp file + rename); readers ignore unknown keys and damaged
lines, so a newer clustertrain can add fields.

End markers (:class:`EndMarker`): ``RUN_DIR/jobs/<job id>.end``, written by the batch script itself (so
they exist even when nobody ran ``status`` before Slurm forgot the job: ParallelCluster keeps a finished
job MinJobAge=300 s and has no completion log). ``key=value`` lines, written to a temp file and renamed
(``state`` in Slurm's words, like ``jobs.jsonl``; a marker that does not parse counts as none)::

    version=1
    state=COMPLETED          # COMPLETED (exit 0) | FAILED (exit != 0) | CANCELLED/TIMEOUT/... (SIGTERM from Slurm)
    exit_code=0              # the batch script's exit status (143 after SIGTERM)
    restarts=1               # restarts before this job ended (requeues + resubmissions, both kinds)
    segment=2                # the run's segment this job trained (1 + continuations after the stop signal)
    failures=0               # failure restarts before it (launch.max_restarts; docs/slurm.md "Segments and restarts")
    ended=1795000100         # epoch seconds
    next_job=43              # the job the script submitted to go on after a failure (empty: none)

The script removes its job's marker when it starts (a requeued job runs again under the same id) and
writes none when it requeues itself. A job killed without warning (node failure, SIGKILL) leaves none.
Beside it, ``RUN_DIR/jobs/<job id>.continued`` (one number): how many of the job's requeues were continuations
after the stop signal, written by the script before it requeues itself; the rest of ``SLURM_RESTART_COUNT`` are
failure restarts.

Resubmissions. After a hang, a lost rank or a rank Slurm reports killed by a signal, the batch script submits
itself again as a new job that excludes the blamed nodes (``sbatch --exclude``; see
``launch/templates/sbatch.sh.j2``) and names it in its end marker's ``next_job``. :func:`read_records` adds a record
for each such successor the run does not have yet (same model, name and script; ``submitted`` = the marker's
``ended``), so the run's newest record is always the job that carries it on.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pydantic import ConfigDict, Field, ValidationError

from clustertrain.core.errors import RunDirError
from clustertrain.core.run_paths import RunPaths, write_atomic
from clustertrain.core.run_records import StoredRecord, parse_record
from clustertrain.core.schema import StoredModel

RECORD_VERSION = 1
SLURM_STATE = r"^[A-Z][A-Z_]*$"


class JobRecord(StoredRecord):
    """One line of ``jobs.jsonl`` (format in the module docstring)."""

    version: int = Field(RECORD_VERSION, description="Number of the record's format.")
    job_id: str = Field(..., description="Slurm job id.")
    model: str = Field(..., description="Model the job trains.")
    job_name: str = Field(..., description="Slurm job name.")
    script: str = Field(..., description="The batch script as submitted (RUN_DIR/jobs/...).")
    output: str = Field(..., description="The job's output file.")
    submitted: float = Field(..., description="When it was submitted (Unix seconds).")
    state: str | None = Field(None, description="Final Slurm state, once observed.")
    exit_code: int | None = Field(None, description="Exit code (128 + signal when killed by one).")
    restarts: int = Field(0, description="Requeues.")
    ended: float | None = Field(None, description="When it ended (Unix seconds).")


END_MARKER_VERSION = 1


class EndMarker(StoredModel):
    """What the batch script recorded when its job ended (format in the module docstring)."""

    model_config = ConfigDict(frozen=True)

    version: int = Field(END_MARKER_VERSION, description="Number of the marker's format.")
    job_id: str = Field(..., description="Slurm job id (the file's name).")
    state: str = Field(..., pattern=SLURM_STATE, description="Final Slurm state as the script saw it.")
    exit_code: int | None = Field(None, description="The batch script's exit status.")
    restarts: int = Field(0, description="Restarts before this job ended (requeues + resubmissions).")
    ended: float | None = Field(None, description="When it ended (Unix seconds).")
    next_job: str | None = Field(None, pattern=r"^[0-9]+$", description="The job submitted to go on after a failure.")


def scripts_dir(paths: RunPaths) -> Path:
    return paths.root / "jobs"


def end_marker_path(paths: RunPaths, job_id: str) -> Path:
    return scripts_dir(paths) / f"{job_id}.end"


def read_end_marker(paths: RunPaths, job_id: str) -> EndMarker | None:
    """The end marker of ``job_id`` in this run, or None (none written, or not readable as one)."""
    try:
        text = end_marker_path(paths, str(job_id)).read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None
    kv = {k.strip(): v.strip() for k, v in (line.split("=", 1) for line in text.splitlines() if "=" in line)}
    fields = {k: v for k, v in kv.items() if v}  # an empty value (unset in the script) counts as absent
    try:
        return EndMarker.model_validate({**fields, "job_id": str(job_id)})
    except ValidationError:
        return None  # a half-written or foreign file: as if none had been written


def new_script_path(paths: RunPaths) -> Path:
    """Where the next batch script of this run is written (unique per submission)."""
    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{time.time_ns() % 1_000_000_000:09d}"
    return scripts_dir(paths) / f"{stamp}.sbatch"


def read_records(paths: RunPaths) -> list[JobRecord]:
    """The run's job records, oldest first, with the successors the batch scripts submitted (module docstring)."""
    try:
        lines = paths.jobs.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(parse_record(json.loads(line), JobRecord, str(paths.jobs)))
        except (ValueError, RunDirError):
            continue  # a damaged line is skipped, not fatal
    return _with_successors(paths, out)


def _with_successors(paths: RunPaths, records: list[JobRecord]) -> list[JobRecord]:
    known = {r.job_id for r in records}
    i = 0
    while i < len(records):
        record = records[i]
        marker = read_end_marker(paths, record.job_id)
        if marker is not None and marker.next_job and marker.next_job not in known:
            old = f"{record.job_id}.out"
            output = record.output[: -len(old)] + f"{marker.next_job}.out" if record.output.endswith(old) else record.output
            records.append(record.model_copy(update={
                "job_id": marker.next_job, "output": output, "submitted": marker.ended or record.submitted,
                "state": None, "exit_code": None, "restarts": 0, "ended": None}))
            known.add(marker.next_job)
        i += 1
    return records


def _write(paths: RunPaths, records: list[JobRecord]) -> None:
    write_atomic(paths.jobs, "".join(r.model_dump_json() + "\n" for r in records))


def add_record(paths: RunPaths, record: JobRecord) -> None:
    _write(paths, [*read_records(paths), record])


def update_record(paths: RunPaths, job_id: str, **changes: object) -> JobRecord | None:
    """Change the fields of ``job_id``'s record; ``None`` when the run has no record of it."""
    records = read_records(paths)
    found = None
    for i, r in enumerate(records):
        if r.job_id == job_id:
            records[i] = found = JobRecord.model_validate({**r.model_dump(), **changes})
    if found is not None:
        _write(paths, records)
    return found


def find_record(paths: RunPaths, job_id: str | None = None) -> JobRecord | None:
    """The record of ``job_id``, or the newest one when ``job_id`` is None."""
    records = read_records(paths)
    if job_id is None:
        return records[-1] if records else None
    return next((r for r in reversed(records) if r.job_id == str(job_id)), None)
