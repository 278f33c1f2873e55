"""``clustertrain run``: prepare and run the models of a project with the project's backend.

A run that has nothing left to train (its ``COMPLETED`` marker is there and it reached ``training.max_steps``:
:func:`completed_step`) is not prepared or started again when resuming: its outcome says so in one line
(``RunOutcome.already``), and nothing is written (no attempt in ``usage.json``, no restart counted)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from clustertrain.core.errors import ClusterTrainError, LaunchError
from clustertrain.launch.follow import follow_local
from clustertrain.launch.local import LocalLauncher
from clustertrain.launch.prepare import RunSpec, prepare_run, run_dir_for
from clustertrain.project import ModelEntry, Project, architecture_fingerprint
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.run_records import is_completed, read_run_info, read_status, record_failure
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
    already: bool = False  # it had completed before: nothing was started (``message`` says so)


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
    check_trackers_here(project)
    several = len(entries) > 1
    outcomes = []
    for entry in entries:
        root = run_dir_for(project, entry, run_dir, several)
        done = completed_step(RunPaths(root), project, entry) if resume else None
        if done is not None:  # before prepare_run: nothing is written, no rank starts
            line = already_completed_line(entry.name, done, root)
            outcomes.append(RunOutcome(entry.name, root, State.COMPLETED, 0, line, done, already=True))
            continue
        spec = prepare_run(project, entry, root, resume=resume, console=console)
        try:
            outcome = _run_one(project, entry, spec, console)
        finally:
            if spec.lease is not None:
                spec.lease.release()  # the run's writers are done: the directory is nobody's until the next run
        outcomes.append(outcome)
        if outcome.state != State.COMPLETED:
            break
    return outcomes


def completed_step(paths: RunPaths, project: Project, entry: ModelEntry) -> int | None:
    """The step a run completed at, when it has nothing left to train: its ``COMPLETED`` marker is there, its
    ``run.json`` is this project's model with the same architecture, and its ``status.json`` (a Megatron run: its
    latest checkpointed iteration) reached ``entry.training.max_steps``; else None (not completed, another project's
    or architecture's run — :func:`~clustertrain.launch.prepare.prepare_run` says so —, a damaged record, or
    max_steps raised since)."""
    if not is_completed(paths):
        return None
    try:
        info, status = read_run_info(paths), read_status(paths)
    except ClusterTrainError:
        return None
    if info is None or (info.project, info.model) != (project.name, entry.name) or \
            info.fingerprint != architecture_fingerprint(project, entry):
        return None
    step = status.step if status is not None and status.state == State.COMPLETED else None
    if step is None and entry.framework == "megatron":
        from clustertrain.megatron.backup import latest_iteration

        step = latest_iteration(paths.checkpoints)
    return step if step is not None and step >= entry.training.max_steps else None


def already_completed_line(model: str, step: int, root: Path) -> str:
    return (f"{model}: already completed at step {step} ({root}); nothing to do — raise training.max_steps to train "
            "further, or --no-resume to start over")


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


def check_trackers_here(project: Project) -> None:
    """``monitor.trackers`` that cannot work (:mod:`clustertrain.monitor.tracker_preflight`): refused before any rank."""
    from clustertrain.monitor.tracker_preflight import tracker_findings

    errors = [f for f in tracker_findings(project) if f.level == "error"]
    if errors:
        raise LaunchError(str(errors[0]).removeprefix("error: "))


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
