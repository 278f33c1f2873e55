"""`clustertrain image render | build | check`: the training image of a project (see docs/image.md).

Thin faces over :mod:`clustertrain.image`: ``render`` writes the recipe (Dockerfile, build context,
``versions.json``); ``build`` runs ``docker build`` and ``enroot import`` on the head node (``--dry-run``
prints the exact commands); ``check`` runs ``clustertrain validate scan --role container`` inside the image
on one node through Pyxis and compares what it finds with the pins. Exit codes: 0 done / checked clean,
1 the check found a problem, 2 bad input (one ``error:`` line, nothing built or overwritten).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from clustertrain.cli.common import command_group
from clustertrain.resolve import load_project

app = command_group(help="The training image: render its recipe, build it (docker + enroot), check it on a node.")

ProjectArg = Annotated[Path, typer.Argument(metavar="PROJECT", help="Project file (YAML) with an image: section.")]
SetOpt = Annotated[list[str], typer.Option("--set", help="Override a project field (dotted key=value, repeatable).")]


@app.command()
def render(
    project_file: ProjectArg,
    output: Annotated[Path, typer.Option("--output", "-o", help="Directory to write (replaced as a whole, atomically).")],
    set_: SetOpt = [],
) -> None:
    """Write the Dockerfile, its build context (clustertrain's own wheel, requirements) and versions.json."""
    from clustertrain.image.recipe import render_recipe

    rendered = render_recipe(load_project(project_file, set_), output)
    typer.echo(f"wrote {rendered.dir}: Dockerfile, {rendered.wheel.name}, versions.json (image {rendered.reference})")


@app.command()
def build(
    project_file: ProjectArg,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the exact commands; run nothing, write nothing.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing .sqsh of the same name and tag.")] = False,
    work_dir: Annotated[Path | None, typer.Option(help="Build context and Enroot's cache/data/temp (default: image.work_dir).")] = None,
    set_: SetOpt = [],
) -> None:
    """docker build, then enroot import into the shared images directory; each command is printed before it runs."""
    from clustertrain.image.build import run_build

    result = run_build(load_project(project_file, set_), dry_run=dry_run, force=force, work_dir=work_dir, echo=typer.echo)
    if not dry_run:
        typer.echo(f"built {result.sqsh} ({result.size_bytes / 2**30:.1f} GiB): jobs of this project run in it")


@app.command()
def check(
    project_file: ProjectArg,
    no_container: Annotated[bool, typer.Option("--no-container", help="Scan the node's host instead of the image.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds the job may pend plus run before it is cancelled.")] = 900.0,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    set_: SetOpt = [],
) -> None:
    """Submit a one-node job that scans the image (via Pyxis) and compare the versions found with the pins."""
    from clustertrain.image.check import check_table, run_image_check

    report = run_image_check(load_project(project_file, set_), container=not no_container, timeout_s=timeout)
    typer.echo(report.model_dump_json(indent=2) if json_out else check_table(report))
    raise typer.Exit(1 if report.failed else 0)
