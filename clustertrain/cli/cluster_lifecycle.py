"""`clustertrain cluster create | status | update | delete PROJECT`: the cluster's lifecycle through aws-parallelcluster's
own ``pcluster`` CLI (the ``aws`` extra). The work is in :mod:`clustertrain.cloud.lifecycle`; this module parses and
calls it. :func:`register` adds the four commands to the ``cluster`` command group."""

from __future__ import annotations

from pathlib import Path

import typer

from clustertrain.cli.cluster_options import ProjectArg, SetOpt, YesOpt
from clustertrain.resolve import load_project

DryRunOpt = typer.Option(False, "--dry-run", help="Print every command it would run, one per line; run and write nothing.")
SuppressOpt = typer.Option(
    [], "--suppress-validator",
    help="Skip one of pcluster's validators (its type, e.g. KeyPairValidator, or ALL); passed as --suppress-validators.")
PollOpt = typer.Option(30.0, "--poll-interval", min=0.0, hidden=True, help="Seconds between describe-cluster polls.")


def register(app: typer.Typer) -> None:
    """Add ``create``, ``status``, ``update`` and ``delete`` to ``app`` (the ``cluster`` group)."""

    @app.command("create")
    def create_cmd(project_file: Path = ProjectArg, set_: list[str] = SetOpt, dry_run: bool = DryRunOpt,
                   suppress: list[str] = SuppressOpt, poll: float = PollOpt) -> None:
        """Create the cluster: config and node scripts written and uploaded, `pcluster create-cluster --dryrun true`
        (stops on its errors), `create-cluster`, then follow it until CREATE_COMPLETE or a failure."""
        from clustertrain.cloud.lifecycle import lifecycle

        lifecycle("create", load_project(project_file, set_), dry_run=dry_run, suppress=suppress, say=typer.echo, poll_s=poll)

    @app.command("status")
    def status_cmd(project_file: Path = ProjectArg, set_: list[str] = SetOpt, dry_run: bool = DryRunOpt) -> None:
        """The cluster's state from `pcluster describe-cluster`: status, compute fleet, head node, failures."""
        from clustertrain.cloud.lifecycle import lifecycle

        lifecycle("status", load_project(project_file, set_), dry_run=dry_run, say=typer.echo)

    @app.command("update")
    def update_cmd(project_file: Path = ProjectArg, set_: list[str] = SetOpt, dry_run: bool = DryRunOpt,
                   suppress: list[str] = SuppressOpt, poll: float = PollOpt) -> None:
        """Update the cluster to the project: `update-cluster --dryrun true` shows the change set (stops on update
        errors; says when the compute fleet must be stopped), then `update-cluster`, followed to UPDATE_COMPLETE."""
        from clustertrain.cloud.lifecycle import lifecycle

        lifecycle("update", load_project(project_file, set_), dry_run=dry_run, suppress=suppress, say=typer.echo, poll_s=poll)

    @app.command("delete")
    def delete_cmd(project_file: Path = ProjectArg, set_: list[str] = SetOpt, dry_run: bool = DryRunOpt,
                   yes: bool = YesOpt,
                   poll: float = PollOpt) -> None:
        """Delete the cluster (asks first) and follow until it is gone; FSx and EBS volumes are retained."""
        from clustertrain.cloud.lifecycle import lifecycle

        confirm = None if yes else (lambda question: typer.confirm(question, default=False))
        lifecycle("delete", load_project(project_file, set_), dry_run=dry_run, say=typer.echo, confirm=confirm, poll_s=poll)
