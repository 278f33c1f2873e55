"""`clustertrain check PROJECT`: the preflight that joins every stage (see :mod:`clustertrain.check`).

Exit 0 when there is no error (warnings are printed), 2 when there is one; one row per finding,
naming the section, the field and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from clustertrain.cli.common import plain_table
from clustertrain.core.errors import ConfigError
from clustertrain.resolve import load_project


def check_command(
    project_file: Path = typer.Argument(..., help="Project file (YAML)."),
    set_: list[str] = typer.Option([], "--set", help="Override a project field (dotted key=value, repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Check a project end to end before anything is paid for: cluster config, paths on shared storage,
    plan feasibility, data and tokenizer, interpreter/image, time limits, secrets. Exit 2 on errors."""
    from clustertrain.check import run_check
    from clustertrain.cloud.validate import is_project, read_cluster_config

    if not is_project(read_cluster_config(project_file)):
        raise ConfigError(f"{project_file}: this is a ParallelCluster config, not a clustertrain project; check it with "
                          "`clustertrain cluster validate`, or pass the project file it was generated from")
    report = run_check(load_project(project_file, set_))
    if as_json:
        typer.echo(json.dumps(report.as_dict(), indent=1))
        raise typer.Exit(0 if report.ok else 2)
    rows = [(f.level, section, f.path, f"{f.message}{'' if f.source == 'clustertrain' else f' [{f.source}]'}; fix: {f.fix}")
            for section, f in report.findings]
    if rows:  # one line per finding (a table that greps and pastes well), errors first
        rows.sort(key=lambda r: r[0] != "error")
        typer.echo(plain_table(("level", "check", "field", "problem; fix"), rows))
    for note in report.notes:
        typer.echo(f"note: {note}")
    typer.echo(f"{project_file}: {len(report.errors)} error(s), {len(report.warnings)} warning(s) "
             f"(checked: {', '.join(report.sections)})")
    raise typer.Exit(0 if report.ok else 2)

