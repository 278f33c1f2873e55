"""`clustertrain run` (local training of a project) and `clustertrain train` (the per-rank entry point)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from clustertrain.resolve import load_project

SET_HELP = "Override a project field, e.g. --set models.0.training.max_steps=40 (repeatable)."


def register(app: typer.Typer) -> None:
    app.command("run")(run)
    app.command("train")(train)
    app.command("watchdog", hidden=True)(watchdog)


def run(
    project_file: Path = typer.Argument(..., help="Project file (YAML)."),
    model: Optional[str] = typer.Option(None, "--model", help="Train only this model (default: all, one after another)."),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Run directory (default: <storage.root>/<project>/<model>)."),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    no_resume: bool = typer.Option(False, "--no-resume", help="Start fresh: archive earlier checkpoints to RUN_DIR/previous/."),
) -> None:
    """Train a project's models on this machine (the local backend), resuming from the latest checkpoint."""
    from clustertrain.launch.run import run_project

    project = load_project(project_file, set_)
    console = Console(highlight=False, soft_wrap=True)
    outcomes = run_project(project, model, run_dir, resume=not no_resume, console=console)
    code = 0
    for o in outcomes:
        if o.already:  # nothing to train: nothing was started
            typer.echo(o.message)
        elif o.state == "COMPLETED":
            console.print(f"[green]completed[/] {o.model}: step {o.step}, checkpoint {o.checkpoint}, metrics {o.run_dir / 'metrics.jsonl'}")
            if o.backup:
                console.print(f"backed up to {o.backup}")
            _backup_failures(console, o.run_dir)
        elif o.state == "STOPPED":
            console.print(f"[yellow]stopped[/] {o.model} at step {o.step}; checkpoint saved to {o.checkpoint}; "
                          "run the same command again to resume")
        else:
            typer.echo(f"error: {o.model}: {o.message}", err=True)
            code = o.exit_code
    raise typer.Exit(code)


def _backup_failures(console: Console, run_dir: Path) -> None:
    """Say so when a checkpoint backup failed (the run itself completed; see clustertrain.train.checkpoint_backup)."""
    from clustertrain.core.run_paths import RunPaths
    from clustertrain.core.run_records import BackupState, read_status

    status = read_status(RunPaths(run_dir))
    failed = [b for b in (status.backups if status else []) if b.state == BackupState.FAILED]
    if failed:
        console.print(f"[red]backup failed[/] for {len(failed)} checkpoint(s), last: {failed[-1].checkpoint}: "
                      f"{failed[-1].error}; copy by hand with `clustertrain storage sync`")


def train(
    run_dir: Path = typer.Option(..., "--run-dir", help="Run directory prepared by `clustertrain run` / `submit`."),
    model: str = typer.Option(..., "--model", help="Model name in the project."),
) -> None:
    """Per-rank entry point (started by the local launcher, torchrun or srun — not by hand)."""
    from clustertrain.train.entry import main as train_main

    raise typer.Exit(train_main(run_dir, model))


def watchdog(
    run_dir: Path = typer.Option(..., "--run-dir", help="Run directory of the job."),
    model: str = typer.Option(..., "--model", help="Model name in the project."),
    job: str = typer.Option(..., "--job", help="Slurm job id (the verdict file's name)."),
    nodes: str = typer.Option("", "--nodes", help="The job's nodes in order, comma-separated (rank placement)."),
    suspects: Optional[Path] = typer.Option(None, "--suspects", help="The project's suspect list."),
    output: Optional[Path] = typer.Option(None, "--output", help="The job's output file (srun's own error lines)."),
    offset: int = typer.Option(0, "--offset", help="Where this start of the job begins in --output (bytes)."),
) -> None:
    """A Slurm job's hang watchdog (started by the batch script as a step beside the ranks — not by hand)."""
    from clustertrain.monitor.hang_watchdog import Watchdog, placement, serve
    from clustertrain.core.run_paths import RunPaths
    from clustertrain.train.entry import load_resolved

    paths = RunPaths(run_dir)
    project = load_resolved(paths)
    names = [n for n in nodes.split(",") if n]
    rpn = project.cluster.ranks_per_node
    world = len(names) * rpn if names else project.cluster.nodes * rpn
    dog = Watchdog(paths, project.monitor, world, job=job, model=model, suspects=suspects,
                   expected=placement(names, rpn))
    raise typer.Exit(serve(dog, job, output, offset))
