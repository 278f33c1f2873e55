"""`clustertrain config`: show a resolved project; write the project file's reference and JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from clustertrain.cli.common import command_group
from clustertrain.core.run_paths import write_atomic

app = command_group(help="Inspect project files; write their reference documentation and JSON Schema.")
OutputOpt = typer.Option(None, "-o", "--output", help="Write here (atomically) instead of stdout.")


@app.command("show")
def show(
    project_file: Path = typer.Argument(..., help="Project file (YAML)."),
    set_: list[str] = typer.Option([], "--set", help="Override a field (dotted key=value)."),
) -> None:
    """Validate a project file and print it with every default filled in."""
    from clustertrain.project import dump_project
    from clustertrain.resolve import load_project

    typer.echo(dump_project(load_project(project_file, set_)), nl=False)


@app.command("docs")
def docs(output: Optional[Path] = OutputOpt) -> None:
    """Print the project-file reference (Markdown), generated from the models."""
    from clustertrain.docs import project_reference

    _emit(project_reference(), output)


@app.command("schema")
def schema(output: Optional[Path] = OutputOpt) -> None:
    """Print the project file's JSON Schema (for editors: completion, hover docs, typo checks).

    With the YAML language server (VS Code's YAML extension, Neovim, ...) put this first line in a
    project file: ``# yaml-language-server: $schema=<path or URL of the written schema>``."""
    from clustertrain.docs import project_schema

    _emit(json.dumps(project_schema(), indent=2) + "\n", output)


def _emit(text: str, output: Optional[Path]) -> None:
    if output:
        write_atomic(output, text)
    else:
        typer.echo(text, nl=False)
