"""`clustertrain plan PROJECT`: the arithmetic of a project file and what is wrong with it.

Exit codes: 0 feasible; 2 the plan is infeasible (the plan and its reasons printed), as ``clustertrain check`` exits
for the same problem, or bad input.
Registered in :mod:`clustertrain.cli` as ``app.command("plan")(plan_command)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer

from clustertrain.core.errors import ConfigError
from clustertrain.resolve import load_project

Format = Literal["table", "json", "markdown"]  # clustertrain.plan.render.FORMATS
INFEASIBLE_EXIT = 2  # as `check` exits on the same problem


def plan_command(
    project_file: Path = typer.Argument(..., help="Project file (YAML)."),
    format: Format = typer.Option("table", "--format", "-f", help="Output format."),
    set_: list[str] = typer.Option([], "--set", help="Override a project field, e.g. --set plan.cluster_nodes=64 (repeatable)."),
    calibrate: bool = typer.Option(
        False, "--calibrate", help="CPU projects: measure this machine (fp32 matmul and step kernels) to estimate step times."
    ),
    calibrate_from: Path | None = typer.Option(
        None, "--calibrate-from", metavar="RUN_DIR",
        help="Take step times from a real run (a short pilot job): its measured MFU (GPU) or FLOP/s per rank (CPU).",
    ),
) -> None:
    """Plan a project: cluster totals, memory per GPU, time and cost per model, node allocation."""
    from clustertrain.plan.plan import make_plan
    from clustertrain.plan.render import render_plan, terminal_width

    project = load_project(project_file, set_)
    calibration = None
    if calibrate and calibrate_from is not None:
        raise ConfigError("--calibrate and --calibrate-from both calibrate the step times: pass one of them")
    if calibrate_from is not None:
        from clustertrain.plan.pilot import plan_from_pilot

        plan = plan_from_pilot(project, calibrate_from)
        typer.echo(render_plan(plan, format, terminal_width()).rstrip("\n"))
        raise typer.Exit(0 if plan.feasible else INFEASIBLE_EXIT)
    if calibrate:
        if project.cluster.gpus_per_node > 0:
            raise ConfigError(f"{project_file}: --calibrate measures CPU workers; this project has cluster.gpus_per_node={project.cluster.gpus_per_node}")
        from clustertrain.plan.calibrate import calibrate as run_calibration

        calibration = run_calibration(project)
    plan = make_plan(project, calibration)
    typer.echo(render_plan(plan, format, terminal_width()).rstrip("\n"))
    raise typer.Exit(0 if plan.feasible else INFEASIBLE_EXIT)
