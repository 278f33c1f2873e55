"""Batch jobs that are not a model's run (the validation suite's jobs): submit a ready script, ask for
its state, cancel it, count a partition's nodes.

The public functions here are the launch stage's interface for a caller that renders its own script:
:func:`submit_script`, :func:`batch_state`, :func:`cancel_job`, :func:`partition_nodes`. Every client
command goes through :func:`clustertrain.launch.slurmcli.run_slurm`; job state comes from
:func:`clustertrain.launch.slurm_query.query_job` and is mapped to :class:`clustertrain.core.states.State`
(:func:`to_state`):

    PENDING, REQUEUED, CONFIGURING, ...           -> PENDING
    RUNNING, COMPLETING, SUSPENDED, STOPPED, ...  -> RUNNING   (Slurm's STOPPED is a paused job)
    COMPLETED, CANCELLED, TIMEOUT                 -> the same
    PREEMPTED                                     -> STOPPED
    FAILED, NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL...-> FAILED
    a job the controller forgot and no record has -> UNKNOWN   (ended; what happened is not known)

Slurm's own spelling stays in :attr:`BatchState.slurm_state` for the record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from clustertrain.core.errors import LaunchError
from clustertrain.launch.slurm_query import JobGone, query_job
from clustertrain.launch.slurmcli import run_slurm
from clustertrain.core.states import State

_PENDING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "RESV_DEL_HOLD",
                      "SPECIAL_EXIT"})
_RUNNING = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "RESIZING", "STOPPED"})
_SAME = {"COMPLETED": State.COMPLETED, "CANCELLED": State.CANCELLED, "TIMEOUT": State.TIMEOUT,
         "PREEMPTED": State.STOPPED}


@dataclass(frozen=True)
class BatchState:
    """One batch job's state. ``exit_code``: the script's exit status (128 + signal when killed), None while it
    runs or when unknown; ``nodes``: the hosts it ran on, in the job's order."""

    job_id: str
    state: State
    slurm_state: str
    exit_code: int | None = None
    nodes: tuple[str, ...] = ()
    detail: str = ""


def to_state(slurm_state: str) -> State:
    """Slurm's job state (``scontrol``/``sacct`` spelling, flags like ``CANCELLED by 0`` cut) -> :class:`State`."""
    base = (slurm_state or "").split()[0].upper() if (slurm_state or "").strip() else ""
    if base in _PENDING:
        return State.PENDING
    if base in _RUNNING:
        return State.RUNNING
    if base in _SAME:
        return _SAME[base]
    return State.FAILED if base else State.UNKNOWN


def submit_script(script: Path, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> str:
    """``sbatch --parsable SCRIPT`` (with ``--chdir=CWD`` when given: the job's starting directory); return
    the job id. ``env`` adds client variables (``SLURM_CONF``...) that the job inherits too."""
    argv = ["sbatch", "--parsable", *([f"--chdir={cwd}"] if cwd else []), str(script)]
    proc = run_slurm(argv, env)
    job_id = proc.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise LaunchError(f"sbatch {script.name} printed {proc.stdout.strip()!r}, not a job id")
    return job_id


def batch_state(job_id: str, env: Mapping[str, str] | None = None) -> BatchState:
    """The job's state now (see the module docstring for the mapping)."""
    try:
        js = query_job(job_id, env)
    except JobGone as e:
        return BatchState(str(job_id), State.UNKNOWN, "", detail=str(e))
    exit_code = js.exit_code if js.exit_code is None or not js.signal else 128 + js.signal
    return BatchState(js.job_id, to_state(js.state), js.state, exit_code if js.finished else None, tuple(js.nodes),
                      js.state if not js.reason else f"{js.state} ({js.reason})")


def cancel_job(job_id: str, env: Mapping[str, str] | None = None) -> None:
    """``scancel JOB``."""
    run_slurm(["scancel", str(job_id)], env)


def partition_nodes(partition: str | None, env: Mapping[str, str] | None = None) -> int | None:
    """Nodes in ``partition`` (in every partition without one) per ``sinfo``; None when Slurm does not answer."""
    argv = ["sinfo", "-h", "-o", "%D %P", *(["-p", partition] if partition else [])]
    try:
        proc = run_slurm(argv, env, check=False, timeout=30)
    except LaunchError:
        return None
    counts = [int(ln.split()[0]) for ln in proc.stdout.splitlines() if ln.split() and ln.split()[0].isdigit()]
    return sum(counts) if proc.returncode == 0 and counts else None
