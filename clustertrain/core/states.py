"""The one vocabulary of run and job states, shared by every backend, ``status.json``, the batch
script's end markers, the validation suite and the CLI. Values are Slurm's own spelling
(upper case) so a state read from Slurm and one written by clustertrain compare equal.

    PENDING      queued, not started               RUNNING    ranks are running
    COMPLETED    training reached its last step    STOPPED    stopped early by a signal, resumable
    FAILED       a rank or the job failed          CANCELLED  cancelled by a user or an admin
    TIMEOUT      ran past a time limit             NOT_STARTED never left the queue in time
    SKIPPED      not run (an earlier check failed) UNKNOWN    nothing records what happened
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    STOPPED = "STOPPED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    NOT_STARTED = "NOT_STARTED"
    SKIPPED = "SKIPPED"
    UNKNOWN = "UNKNOWN"

    @property
    def finished(self) -> bool:
        return self not in (State.PENDING, State.RUNNING)

    @classmethod
    def parse(cls, value: str) -> "State":
        """Read a stored state; older files wrote some in lower case (``"completed"``)."""
        try:
            return cls(str(value).upper())
        except ValueError:
            return cls.UNKNOWN
