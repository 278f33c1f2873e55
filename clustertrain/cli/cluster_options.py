"""The typer parameters the ``cluster`` command modules share (:mod:`clustertrain.cli.cluster` and
:mod:`clustertrain.cli.cluster_lifecycle`)."""

from __future__ import annotations

import typer

ProjectArg = typer.Argument(..., help="Project file (YAML) with an `aws:` section.")
SetOpt = typer.Option([], "--set", help="Override a project field (dotted key=value).")
PollOpt = typer.Option(5.0, "--poll", help="Seconds between status polls.", hidden=True)
YesOpt = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation.")
