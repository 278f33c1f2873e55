"""``clustertrain run``: prepare and run the models of a project with the project's backend."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from clustertrain.core.errors import LaunchError
from clustertrain.launch.follow import follow_local
from clustertrain.launch.local import LocalLauncher
from clustertrain.launch.prepare import RunSpec, prepare_run, run_dir_for
from clustertrain.project import ModelEntry, Project
from clustertrain.core.run_records import read_status, record_failure
from clustertrain.core.states import State


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
    check_megatron_here(project, [e.name for e in entries])
    several = len(entries) > 1
    outcomes = []
    for entry in entries:
        spec = prepare_run(project, entry, run_dir_for(project, entry, run_dir, several), resume=resume, console=console)
        try:
            outcome = _run_one(project, entry, spec, console)
        finally:
            if spec.lease is not None:
                spec.lease.release()  # the run's writers are done: the directory is nobody's until the next run
        outcomes.append(outcome)
        if outcome.state != State.COMPLETED:
            break
    return outcomes


def _run_one(project: Project, entry: ModelEntry, spec: RunSpec, console: Console) -> RunOutcome:
    """Start one prepared run's ranks, follow them to the end, and read how it ended."""
    console.print(f"[bold]run[/] {project.name}/{entry.name} -> {spec.paths.root}")
    launcher = LocalLauncher()
    job = launcher.submit(spec)
    result = follow_local(launcher, job, spec, console)
    if result.state == State.FAILED:  # the run's final state, written by the job's own launcher
        record_failure(spec.paths, result.message)
    if entry.framework == "megatron" and result.state == State.COMPLETED:
        from clustertrain.megatron.backup import latest_iteration

        if latest_iteration(spec.paths.checkpoints) == entry.training.max_steps:
            spec.paths.completed.touch()  # Megatron wrote no status: its checkpoint layout says it finished
    status = read_status(spec.paths)
    return RunOutcome(entry.name, spec.paths.root, State(result.state), result.exit_code, result.message,
                      status.step if status else None, status.checkpoint if status else None,
                      status.backup if status else None)


def local_gpus() -> int:
    """CUDA GPUs on this machine, as ``nvidia-smi -L`` lists them (0 without a driver)."""
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def check_megatron_here(project: Project, models: list[str]) -> None:
    """A Megatron-LM model runs on this machine's GPUs or not at all: never silently on the built-in trainer."""
    chosen = [e for e in project.models if e.name in models and e.framework == "megatron"]
    if not chosen:
        return
    from clustertrain.megatron.rules import megatron_findings

    errors = [f for f in megatron_findings(project, models) if f.level == "error"]
    if errors:
        raise LaunchError(str(errors[0]).removeprefix("error: "))
    have = local_gpus()
    want = project.cluster.ranks_per_node
    if have < want:
        raise LaunchError(f"models.{chosen[0].name}.framework: megatron needs {want} CUDA GPU(s) here (cluster.gpus_per_node) "
                          f"but this machine has {have} (nvidia-smi); run it on a GPU machine or submit it to a GPU "
                          "cluster, or set framework: clustertrain to train it with the built-in trainer")
