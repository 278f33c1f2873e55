"""`clustertrain submit | status | logs | cancel`: Slurm jobs of a project's models (``status``: every model,
local or Slurm; :mod:`clustertrain.monitor.status`).

Jobs are found through the run directories' records (``RUN_DIR/jobs.jsonl``): ``status``, ``logs`` and
``cancel`` take the same PROJECT, ``--model``, ``--run-dir`` and ``--set`` as ``submit`` and act on
each model's newest job (or ``--job ID``). Slurm clients need ``SLURM_CONF`` etc. in the environment
(for the local cluster: ``eval "$(clustertrain local-slurm env)"``). On a ``backend: slurm`` project with no
controller answering, ``submit``, ``logs`` and ``cancel`` refuse in one line before writing anything; ``status``
says so in one line (stderr) and shows what the run directories say.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional

import typer

from clustertrain.resolve import load_project

SET_HELP = "Override a project field, e.g. --set models.0.training.max_steps=40 (repeatable)."
_PROJECT = typer.Argument(..., help="Project file (YAML).")
_MODEL = typer.Option(None, "--model", help="Only this model (default: all of the project's models).")
_RUN_DIR = typer.Option(None, "--run-dir", help="Run directory (default: <storage.root>/<project>/<model>).")
_SET = typer.Option([], "--set", help=SET_HELP)


def register(app: typer.Typer) -> None:
    app.command("submit")(submit)
    app.command("status")(status)
    app.command("logs")(logs)
    app.command("cancel")(cancel)


def _run_paths(project, model: Optional[str], run_dir: Optional[Path]):
    from clustertrain.launch.prepare import run_dir_for
    from clustertrain.core.run_paths import RunPaths

    entries = [project.model(model)] if model else list(project.models)
    return [(e.name, RunPaths(run_dir_for(project, e, run_dir, len(entries) > 1))) for e in entries]


def submit(
    project_file: Path = _PROJECT,
    model: Optional[str] = _MODEL,
    run_dir: Optional[Path] = _RUN_DIR,
    set_: list[str] = _SET,
    no_resume: bool = typer.Option(False, "--no-resume", help="Start fresh: archive earlier checkpoints to RUN_DIR/previous/."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the batch script(s) and exit; submits nothing."),
) -> None:
    """Submit one Slurm batch job per model; return as soon as they are queued and print the job ids."""
    from clustertrain.check import require_clean
    from clustertrain.launch import SlurmLauncher, submit_project

    project = load_project(project_file, set_)
    require_clean(project, "submit", [model] if model else None)  # the whole preflight, also before a dry run
    launcher = SlurmLauncher(submit_command=submit_command_line(project_file, model, run_dir, set_, no_resume))
    for s in submit_project(project, model, run_dir, resume=not no_resume, launcher=launcher, dry_run=dry_run):
        if dry_run:
            typer.echo(s.script, nl=False)
        else:
            for note in s.notes:
                typer.echo(f"note: {note}", err=True)
            typer.echo(f"submitted {s.model}: job {s.job_id} (run dir {s.run_dir}, script {s.script})")


def submit_command_line(project_file: Path, model: Optional[str], run_dir: Optional[Path], set_: list[str],
                        no_resume: bool) -> str:
    """The ``clustertrain submit`` command that submits this job, for the batch script's header: built from the
    parsed options that shape the job (not ``--dry-run``), each shell-quoted."""
    argv = ["clustertrain", "submit", str(project_file)]
    if model:
        argv += ["--model", model]
    if run_dir:
        argv += ["--run-dir", str(run_dir)]
    for item in set_:
        argv += ["--set", item]
    if no_resume:
        argv.append("--no-resume")
    return shlex.join(argv)


def status(
    project_file: Path = _PROJECT,
    model: Optional[str] = _MODEL,
    run_dir: Optional[Path] = _RUN_DIR,
    set_: list[str] = _SET,
    job: Optional[str] = typer.Option(None, "--job", help="This job id (default: each model's newest job)."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as a JSON list (with --watch: one list per line)."),
    watch: bool = typer.Option(False, "--watch", help="Refresh every --interval seconds until Ctrl-C."),
    interval: float = typer.Option(5.0, "--interval", min=0.5, help="Seconds between two refreshes of --watch."),
) -> None:
    """Where every model of the project stands, local or Slurm: state, step, loss, speed, ETA, GPU-hours, cost,
    checkpoint, job and nodes, alarms (exit 1 if any model failed, cancelled or timed out)."""
    from clustertrain.launch.overview import newest_jobs
    from clustertrain.launch.slurm import SlurmLauncher, slurm_problem
    from clustertrain.monitor.status import any_failed, gpu_hour_prices, project_status
    from clustertrain.monitor.status_view import make_console, show
    from clustertrain.monitor.status_view import watch as watch_rows

    project = load_project(project_file, set_)
    runs = _run_paths(project, model, run_dir)
    prices = gpu_hour_prices(project)
    down = slurm_problem(project)  # the run directories still answer; the jobs' states are not asked
    if down:
        typer.echo(f"note: {down}", err=True)

    def collect():
        launcher = SlurmLauncher(unreachable=down) if down else None
        return project_status(project, runs, newest_jobs(runs, job, launcher), prices=prices)

    console = make_console()
    rows = watch_rows(collect, interval, console, as_json) if watch else collect()
    if not watch:
        show(rows, console, as_json)
    raise typer.Exit(1 if any_failed(rows) else 0)


def logs(
    project_file: Path = _PROJECT,
    model: Optional[str] = _MODEL,
    run_dir: Optional[Path] = _RUN_DIR,
    set_: list[str] = _SET,
    job: Optional[str] = typer.Option(None, "--job", help="This job id (default: the model's newest job)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines until the job has ended."),
) -> None:
    """Print (or follow) the Slurm output file of a model's job (a job still queued: one line on stderr says so)."""
    from clustertrain.core.errors import LaunchError
    from clustertrain.launch import SlurmLauncher
    from clustertrain.launch.slurm import require_reachable

    project = load_project(project_file, set_)
    require_reachable(project)
    runs = _run_paths(project, model, run_dir)
    if len(runs) > 1:
        raise LaunchError(f"the project has {len(runs)} models; choose one with --model ({', '.join(n for n, _ in runs)})")
    launcher = SlurmLauncher()
    job_id = launcher.attach(runs[0][1], job)
    queued = launcher.queued_line(job_id, follow)
    if queued:
        typer.echo(f"{runs[0][0]}: {queued}", err=True)
    for line in launcher.logs(job_id, follow=follow):
        typer.echo(line)


def cancel(
    project_file: Path = _PROJECT,
    model: Optional[str] = _MODEL,
    run_dir: Optional[Path] = _RUN_DIR,
    set_: list[str] = _SET,
    job: Optional[str] = typer.Option(None, "--job", help="This job id (default: each model's newest job)."),
) -> None:
    """Cancel each model's newest Slurm job (scancel)."""
    from clustertrain.launch import SlurmLauncher
    from clustertrain.launch.slurm import require_reachable

    project = load_project(project_file, set_)
    require_reachable(project)
    launcher = SlurmLauncher()
    for name, paths in _run_paths(project, model, run_dir):
        job_id = launcher.attach(paths, job)
        launcher.cancel(job_id)
        typer.echo(f"cancelled {name}: job {job_id}")
