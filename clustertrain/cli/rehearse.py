"""`clustertrain rehearse`: the project's whole submission on an emulated copy of its cluster (docs/rehearse.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from clustertrain.cli.jobs import SET_HELP
from clustertrain.resolve import load_project


def rehearse_command(
    project_file: Path = typer.Argument(..., help="Project file (YAML) with cluster.backend: slurm and an aws: section."),
    nodes: Optional[int] = typer.Option(None, "--nodes", min=1, help="Nodes of the job partition's queue "
                                        "(and plan.cluster_nodes) [default: the project's]."),
    keep: bool = typer.Option(False, "--keep", help="Leave the emulated cluster running and its directory in place."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    directory: Optional[Path] = typer.Option(None, "--dir", help="Rehearsal directory [default: a new temporary one]."),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Boot an emulated copy of the project's ParallelCluster (one mount namespace per node, the project's own node
    scripts in ParallelCluster's boot order), submit every model's real batch script on its head node with a light
    payload on every rank, check what the ranks saw, tear it all down. Exit 1 when a check fails."""
    from clustertrain.rehearsal.report import render_table, summary_line
    from clustertrain.rehearsal.run import RehearseOptions, rehearse
    from clustertrain.rehearsal.shape import with_nodes

    project = load_project(project_file, set_)
    if nodes is not None:
        project = with_nodes(project, nodes)
    report = rehearse(project, RehearseOptions(keep=keep, dir=directory), log=lambda line: print(line, file=sys.stderr))
    if json_out:
        typer.echo(json.dumps(report.as_dict(), indent=2))
    else:
        typer.echo(render_table(report))
        typer.echo(summary_line(report))
    if report.kept:
        typer.echo(f"kept running in {report.kept}; stop it with: clustertrain local-slurm down --state-dir "
                   f"{report.kept}/slurm", err=True)
    raise typer.Exit(0 if report.ok else 1)
