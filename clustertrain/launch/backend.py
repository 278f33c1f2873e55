"""The backend interface every launcher implements (local processes, Slurm jobs).

A backend turns a prepared :class:`~clustertrain.launch.prepare.RunSpec` into running ranks and
reports on them. Four methods, nothing more; optional abilities are separate mixins.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Protocol

if TYPE_CHECKING:
    from clustertrain.launch.prepare import RunSpec


@dataclass
class JobStatus:
    job_id: str
    state: str  # PENDING | RUNNING | COMPLETED | STOPPED | FAILED | CANCELLED
    exit_code: int | None = None
    detail: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.state not in ("PENDING", "RUNNING")


class Launcher(Protocol):
    def submit(self, spec: RunSpec) -> str:
        """Start (or queue) the ranks of one run; return a job id."""

    def status(self, job_id: str) -> JobStatus: ...

    def logs(self, job_id: str, follow: bool = False) -> Iterator[str]: ...

    def cancel(self, job_id: str) -> None: ...
