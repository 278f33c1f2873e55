"""The backend interface every launcher implements (local processes, Slurm jobs).

A backend turns a prepared :class:`~clustertrain.launch.prepare.RunSpec` into running ranks and
reports on them. Four methods, nothing more; optional abilities are separate mixins.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Protocol

from clustertrain.core.states import State

if TYPE_CHECKING:
    from clustertrain.launch.prepare import RunSpec


@dataclass
class JobStatus:
    """A job as a backend sees it; ``state`` is one of :class:`~clustertrain.core.states.State` (PENDING, RUNNING,
    COMPLETED, STOPPED, FAILED, CANCELLED; a plain string of one of them is converted)."""

    job_id: str
    state: State
    exit_code: int | None = None
    detail: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.state = State(self.state)

    @property
    def finished(self) -> bool:
        return self.state.finished


class Launcher(Protocol):
    def submit(self, spec: RunSpec) -> str:
        """Start (or queue) the ranks of one run; return a job id."""

    def status(self, job_id: str) -> JobStatus: ...

    def logs(self, job_id: str, follow: bool = False) -> Iterator[str]: ...

    def cancel(self, job_id: str) -> None: ...
