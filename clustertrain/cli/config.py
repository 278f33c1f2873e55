"""`clustertrain config`: show a resolved project, write the project-file reference."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from clustertrain.project import dump_project, load_project

app = typer.Typer(no_args_is_help=True, help="Inspect project files and their reference documentation.")


@app.command("show")
def show(
    project_file: Path = typer.Argument(..., help="Project file (YAML)."),
    set_: list[str] = typer.Option([], "--set", help="Override a field (dotted key=value)."),
) -> None:
    """Validate a project file and print it with every default filled in."""
    typer.echo(dump_project(load_project(project_file, set_)), nl=False)


@app.command("docs")
def docs(output: Optional[Path] = typer.Option(None, "-o", "--output", help="Write here instead of stdout.")) -> None:
    """Print the project-file reference (Markdown), generated from the models."""
    from clustertrain.docs import project_reference
    from clustertrain.rundir import write_atomic

    text = project_reference()
    if output:
        write_atomic(output, text)
    else:
        typer.echo(text, nl=False)
