"""The launch stage's part of ``clustertrain status``: for each model's run directory, its newest Slurm job.

A run directory with job records (``jobs.jsonl``, :mod:`clustertrain.core.job_records`) is a Slurm run: its newest
job (or the one asked for) is asked about through :meth:`SlurmLauncher.status`, which also answers for jobs
Slurm has forgotten (the batch script's end marker, ``jobs.jsonl``). A run without records is a local run: None,
and Slurm is never asked (a local project needs no Slurm client). The values go to
:func:`clustertrain.monitor.status.project_status` (the monitor stage does not import launch).
"""

from __future__ import annotations

from collections.abc import Iterable

from clustertrain.core.errors import ClusterTrainError
from clustertrain.launch.backend import JobStatus
from clustertrain.core.job_records import read_records
from clustertrain.launch.slurm import SlurmLauncher
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.states import State

#: a failure of the Slurm client itself, not of one job: the next runs are not asked again
_CLIENT_DOWN = ("not found: install the Slurm client", "did not answer")


def newest_jobs(runs: Iterable[tuple[str, RunPaths]], job_id: str | None = None,
                launcher: SlurmLauncher | None = None) -> dict[str, JobStatus | None]:
    """model -> the newest job of its run (``job_id``: that job) as a :class:`JobStatus`, None for a run with no
    job record (a local run). A job whose state cannot be read (no Slurm client, controller down) is a JobStatus
    in state UNKNOWN whose ``detail`` says why, so one model's trouble does not hide the others. A ``job_id`` the
    run has no record of is a :class:`~clustertrain.core.errors.LaunchError` (one line)."""
    out: dict[str, JobStatus | None] = {}
    down: str | None = None
    for name, paths in runs:
        if job_id is None and not read_records(paths):
            out[name] = None
            continue
        launcher = launcher or SlurmLauncher()
        jid = launcher.attach(paths, job_id)
        if down is not None:
            out[name] = JobStatus(jid, State.UNKNOWN, None, f"not asked: {down}", {"error": down})
            continue
        try:
            out[name] = launcher.status(jid)
        except ClusterTrainError as e:
            out[name] = JobStatus(jid, State.UNKNOWN, None, str(e), {"error": str(e)})
            if any(s in str(e) for s in _CLIENT_DOWN):
                down = str(e)
    return out
