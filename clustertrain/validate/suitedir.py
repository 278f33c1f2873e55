"""The on-disk layout of one validation suite run, and its report.

A suite run lives in the storage layout's ``validation_dir()`` (``<outputs>/<project>/validation/``),
in a directory named for its start time, ``<YYYYmmdd-HHMMSS>/`` (``-1``, ``-2``... when taken);
:class:`SuitePaths` names every path in it:

    config/<check>.json       a check's config, read by the job's step (``--config``), written before submission
    jobs/<job>.sbatch         the batch script of each job (launch/templates/validate.sh.j2)
    logs/<job name>-<id>.out  the job's output (``#SBATCH --output``)
    results/<job>/            what the job's steps wrote (each step's ``srun --output``; the script runs here)
    report.json               :class:`SuiteReport`, written last and atomically: a suite directory without it
                              did not finish

``report.json`` (``format_version`` 1): the project, nodes, instance type, the thresholds.yaml entry used,
the directory, the start time, one :class:`JobOutcome` per job (state as :class:`~clustertrain.core.states.State`,
Slurm's own spelling kept in ``slurm_state``) and one :class:`~clustertrain.validate.check_rows.CheckRow` per
check; ``failed`` is true when any row failed. Read back leniently (:class:`~clustertrain.core.schema.StoredModel`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator, Field

from clustertrain.core.run_paths import write_atomic
from clustertrain.core.schema import StoredModel
from clustertrain.core.states import State
from clustertrain.validate.check_rows import CheckRow

FORMAT_VERSION = 1


@dataclass(frozen=True)
class SuitePaths:
    """Every path of one suite run (see the module docstring)."""

    root: Path

    @property
    def jobs(self) -> Path:
        return self.root / "jobs"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def report(self) -> Path:
        return self.root / "report.json"

    def config(self, check: str) -> Path:
        return self.root / "config" / f"{check}.json"

    def results(self, job: str) -> Path:
        return self.root / "results" / job

    def script(self, job: str) -> Path:
        return self.jobs / f"{job}.sbatch"

    def output(self, job_name: str, job_id: str) -> Path:
        return self.logs / f"{job_name}-{job_id}.out"


class JobOutcome(StoredModel):
    name: str = Field(description="Suite job name.")
    job_id: str | None = Field(default=None, description="Slurm job id (None: not submitted).")
    state: Annotated[State, BeforeValidator(State.parse)] = Field(
        description="Final state: COMPLETED, FAILED, CANCELLED, TIMEOUT (ran past --timeout, cancelled), NOT_STARTED "
                    "(pending past --start-timeout, cancelled), SKIPPED (not applicable), UNKNOWN.")
    slurm_state: str | None = Field(default=None, description="Slurm's own final state (NODE_FAIL, OUT_OF_MEMORY...); None when the suite "
                                      "cancelled the job at its limit or did not submit it.")
    exit_code: int | None = Field(default=None, description="Exit status of the batch script.")
    elapsed_s: float | None = Field(default=None, description="Seconds from submission to the end.")
    script: str | None = Field(default=None, description="The batch script.")
    output: str | None = Field(default=None, description="The job's output file.")


class SuiteReport(StoredModel):
    """``report.json``."""

    format_version: int = Field(default=FORMAT_VERSION, description="Version of this JSON layout.")
    project: str = Field(description="Project name.")
    nodes: int = Field(description="Nodes per multi-node job.")
    instance_type: str | None = Field(description="cluster.instance_type.")
    thresholds: str = Field(description="thresholds.yaml entry used.")
    directory: str = Field(description="Suite directory (scripts, logs, results).")
    started: str = Field(description="Start time, ISO 8601.")
    jobs: list[JobOutcome] = Field(default_factory=list, description="One per job.")
    rows: list[CheckRow] = Field(default_factory=list, description="One per check.")
    failed: bool = Field(default=False, description="Any check failed.")

    def finish(self) -> SuiteReport:
        self.failed = any(r.verdict == "fail" for r in self.rows)
        return self

    def write(self, paths: SuitePaths) -> None:
        """Write ``report.json`` atomically (the suite's last write)."""
        write_atomic(paths.report, self.model_dump_json(indent=2) + "\n")


def read_text(path: Path) -> str | None:
    """A result file's text, None when it is absent or unreadable."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def load_result(model: type[StoredModel], path: Path):
    """A JSON result a step printed (anything before its first ``{`` is skipped: srun's own lines), as
    ``model``; None when absent, empty or not that model."""
    text = read_text(path)
    if not text or "{" not in text:
        return None
    try:
        return model.model_validate_json(text[text.index("{"):])
    except ValueError:  # pydantic's ValidationError is one
        return None


def suite_table(report: SuiteReport):
    """A rich Table of the rows (verdict coloured)."""
    from rich.table import Table

    colour = {"pass": "green", "warn": "yellow", "fail": "bold red", "not-applicable": "dim"}
    t = Table(title=f"validation suite: {report.project} ({report.nodes} node(s), thresholds {report.thresholds})")
    for col in ("job", "check", "verdict", "found", "threshold", "detail"):
        t.add_column(col, overflow="fold")
    for r in report.rows:
        t.add_row(r.job, r.check, f"[{colour[r.verdict]}]{r.verdict}[/]", r.found, r.threshold, r.detail)
    return t
