"""Job records: ``RUN_DIR/jobs.jsonl`` and the batch scripts under ``RUN_DIR/jobs/``.

Format (version 1): one JSON object per line, one line per submitted Slurm job, oldest first::

    {"version": 1, "job_id": "42", "model": "tiny", "job_name": "proj-tiny",
     "script": "RUN_DIR/jobs/20261122-010203-42.sbatch", "output": "/fsx/proj/logs/tiny/proj-tiny-42.out",
     "submitted": 1795000000.0, "state": "COMPLETED", "exit_code": 0, "restarts": 1, "ended": 1795000100.0}

``state`` is null until someone observed the end (``clustertrain status``, :meth:`SlurmLauncher.status`,
``wait``), then the final Slurm state (COMPLETED, FAILED, CANCELLED, TIMEOUT...). ``restarts`` counts
requeues. Updates rewrite the file atomically (temp file + rename); readers ignore unknown keys
and damaged lines, so a newer clustertrain can add fields.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from clustertrain.rundir import RunPaths, write_atomic

RECORD_VERSION = 1


@dataclass
class JobRecord:
    job_id: str
    model: str
    job_name: str
    script: str
    output: str
    submitted: float
    state: str | None = None
    exit_code: int | None = None
    restarts: int = 0
    ended: float | None = None
    version: int = RECORD_VERSION

    @classmethod
    def from_json(cls, data: dict) -> "JobRecord":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def scripts_dir(paths: RunPaths) -> Path:
    return paths.root / "jobs"


def new_script_path(paths: RunPaths) -> Path:
    """Where the next batch script of this run is written (unique per submission)."""
    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{time.time_ns() % 1_000_000_000:09d}"
    return scripts_dir(paths) / f"{stamp}.sbatch"


def read_records(paths: RunPaths) -> list[JobRecord]:
    try:
        lines = paths.jobs.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            data = json.loads(line)
            out.append(JobRecord.from_json(data))
        except (ValueError, TypeError):
            continue  # a damaged line is skipped, not fatal
    return out


def _write(paths: RunPaths, records: list[JobRecord]) -> None:
    write_atomic(paths.jobs, "".join(json.dumps(asdict(r), sort_keys=False) + "\n" for r in records))


def add_record(paths: RunPaths, record: JobRecord) -> None:
    _write(paths, [*read_records(paths), record])


def update_record(paths: RunPaths, job_id: str, **changes: object) -> JobRecord | None:
    """Change the fields of ``job_id``'s record; ``None`` when the run has no record of it."""
    records = read_records(paths)
    found = None
    for r in records:
        if r.job_id == job_id:
            for key, value in changes.items():
                setattr(r, key, value)
            found = r
    if found is not None:
        _write(paths, records)
    return found


def find_record(paths: RunPaths, job_id: str | None = None) -> JobRecord | None:
    """The record of ``job_id``, or the newest one when ``job_id`` is None."""
    records = read_records(paths)
    if job_id is None:
        return records[-1] if records else None
    return next((r for r in reversed(records) if r.job_id == str(job_id)), None)
