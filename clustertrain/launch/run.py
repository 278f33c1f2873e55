"""``clustertrain run``: prepare and run the models of a project with the project's backend."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from clustertrain.errors import LaunchError
from clustertrain.launch.follow import follow_local
from clustertrain.launch.local import LocalLauncher
from clustertrain.launch.prepare import prepare_run, run_dir_for
from clustertrain.project import Project
from clustertrain.runstate import read_status, record_failure
from clustertrain.states import State


@dataclass
class RunOutcome:
    model: str
    run_dir: Path
    state: State  # COMPLETED | STOPPED | FAILED
    exit_code: int
    message: str
    step: int | None = None
    checkpoint: str | None = None
    backup: str | None = None


def run_project(project: Project, model: str | None, run_dir: Path | None, resume: bool,
                console: Console) -> list[RunOutcome]:
    """Run one model (``model``) or all of them one after another; stop at the first failure."""
    if project.cluster.backend != "local":
        raise LaunchError(
            f"cluster.backend is {project.cluster.backend!r}: `run` trains locally only; use `clustertrain submit`, "
            "or --set cluster.backend=local to rehearse here"
        )
    entries = [project.model(model)] if model else list(project.models)
    several = len(entries) > 1
    outcomes = []
    for entry in entries:
        spec = prepare_run(project, entry, run_dir_for(project, entry, run_dir, several), resume=resume, console=console)
        console.print(f"[bold]run[/] {project.name}/{entry.name} -> {spec.paths.root}")
        launcher = LocalLauncher()
        job = launcher.submit(spec)
        result = follow_local(launcher, job, spec, console)
        if result.state == State.FAILED:  # the run's final state, written by the job's own launcher
            record_failure(spec.paths, result.message)
        status = read_status(spec.paths)
        outcome = RunOutcome(entry.name, spec.paths.root, State(result.state), result.exit_code, result.message,
                             status.step if status else None, status.checkpoint if status else None,
                             status.backup if status else None)
        outcomes.append(outcome)
        if outcome.state != State.COMPLETED:
            break
    return outcomes
