"""The root ``clustertrain`` app: every command group mounted (see :mod:`clustertrain.cli`, which builds it on first
use, so that ``clustertrain data ...`` can skip it)."""

from __future__ import annotations

from clustertrain.cli import check as check_cli
from clustertrain.cli import cluster as cluster_cli
from clustertrain.cli import config as config_cli
from clustertrain.cli import data as data_cli
from clustertrain.cli import export as export_cli
from clustertrain.cli import image as image_cli
from clustertrain.cli import jobs as jobs_cli
from clustertrain.cli import local_slurm as local_slurm_cli
from clustertrain.cli import nodes as nodes_cli
from clustertrain.cli import plan as plan_cli
from clustertrain.cli import rehearse as rehearse_cli
from clustertrain.cli import report as report_cli
from clustertrain.cli import run as run_cli
from clustertrain.cli import storage as storage_cli
from clustertrain.cli import validate as validate_cli
from clustertrain.cli.common import command_group

app = command_group(name="clustertrain", help="Distributed LLM training on Slurm GPU clusters — rehearsed on one machine.")
run_cli.register(app)
jobs_cli.register(app)
app.command("plan")(plan_cli.plan_command)
app.command("check")(check_cli.check_command)
app.command("rehearse")(rehearse_cli.rehearse_command)
app.command("report")(report_cli.report_command)
app.command("export")(export_cli.export_command)
app.add_typer(config_cli.app, name="config")
app.add_typer(data_cli.app, name="data")
app.add_typer(cluster_cli.app, name="cluster")
app.add_typer(image_cli.app, name="image")
app.add_typer(storage_cli.app, name="storage")
app.add_typer(validate_cli.app, name="validate")
app.add_typer(local_slurm_cli.app, name="local-slurm")
app.add_typer(nodes_cli.app, name="nodes")
