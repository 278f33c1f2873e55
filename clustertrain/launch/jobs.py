"""Job records: ``RUN_DIR/jobs.jsonl`` and the batch scripts under ``RUN_DIR/jobs/``.

Format (version 1): one JSON object per line, one line per submitted Slurm job, oldest first::

    {"version": 1, "job_id": "42", "model": "tiny", "job_name": "proj-tiny",
     "script": "RUN_DIR/jobs/20261122-010203-42.sbatch", "output": "/fsx/proj/logs/tiny/proj-tiny-42.out",
     "submitted": 1795000000.0, "state": "COMPLETED", "exit_code": 0, "restarts": 1, "ended": 1795000100.0}

``state`` is null until someone observed the end (``clustertrain status``, :meth:`SlurmLauncher.status`,
``wait``), then the final Slurm state (COMPLETED, FAILED, CANCELLED, TIMEOUT...). ``restarts`` counts
requeues. Updates rewrite the file atomically (temp file + rename); readers ignore unknown keys
and damaged lines, so a newer clustertrain can add fields.

End markers: ``RUN_DIR/jobs/<job id>.end``, written by the batch script itself (so they exist even when
nobody ran ``status`` before Slurm forgot the job: ParallelCluster keeps a finished job MinJobAge=300 s
and has no completion log). ``key=value`` lines, written to a temp file and renamed::

    version=1
    state=COMPLETED          # COMPLETED (exit 0) | FAILED (exit != 0) | CANCELLED/TIMEOUT/... (SIGTERM from Slurm)
    exit_code=0              # the batch script's exit status (143 after SIGTERM)
    restarts=1               # SLURM_RESTART_COUNT of the run that ended
    ended=1795000100         # epoch seconds

The script removes its job's marker when it starts (a requeued job runs again under the same id) and
writes none when it requeues itself. A job killed without warning (node failure, SIGKILL) leaves none.
"""

from __future__ import annotations

import json
import re
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


END_MARKER_VERSION = 1


@dataclass(frozen=True)
class EndMarker:
    """What the batch script recorded when its job ended (format in the module docstring)."""

    job_id: str
    state: str
    exit_code: int | None
    restarts: int
    ended: float | None


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
    kv = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    state = kv.get("state", "").strip()
    if not re.fullmatch(r"[A-Z][A-Z_]*", state):
        return None

    def number(key: str) -> int | None:
        value = kv.get(key, "").strip()
        return int(value) if value.lstrip("-").isdigit() else None

    return EndMarker(str(job_id), state, number("exit_code"), number("restarts") or 0,
                     float(number("ended")) if number("ended") is not None else None)


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
