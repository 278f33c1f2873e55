"""The `clustertrain` command: a thin face over the stages. Each command parses its options,
loads the project, calls one library function, prints and sets the exit code. User mistakes
(:class:`~clustertrain.errors.ClusterTrainError`) print one line and exit 2."""

from __future__ import annotations

import os
import sys
import traceback

import typer

from clustertrain.cli import check as check_cli
from clustertrain.cli import cluster as cluster_cli
from clustertrain.cli import config as config_cli
from clustertrain.cli import data as data_cli
from clustertrain.cli import jobs as jobs_cli
from clustertrain.cli import local_slurm as local_slurm_cli
from clustertrain.cli import plan as plan_cli
from clustertrain.cli import run as run_cli
from clustertrain.cli import storage as storage_cli
from clustertrain.cli import validate as validate_cli
from clustertrain.errors import ClusterTrainError

try:  # typer >= 0.25 carries its own copy of click
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import ClickException

app = typer.Typer(
    name="clustertrain", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    help="Distributed LLM training on Slurm GPU clusters — rehearsed on one machine.",
)
run_cli.register(app)
jobs_cli.register(app)
app.command("plan")(plan_cli.plan_command)
app.command("check")(check_cli.check_command)
app.add_typer(config_cli.app, name="config")
app.add_typer(data_cli.app, name="data")
app.add_typer(cluster_cli.app, name="cluster")
app.add_typer(storage_cli.app, name="storage")
app.add_typer(validate_cli.app, name="validate")
app.add_typer(local_slurm_cli.app, name="local-slurm")


def main(argv: list[str] | None = None) -> None:
    try:
        code = app(args=argv, standalone_mode=False)
    except ClusterTrainError as e:
        print(f"error: {e}", file=sys.stderr)
        if os.environ.get("CLUSTERTRAIN_DEBUG"):
            traceback.print_exc()
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        print("aborted", file=sys.stderr)
        sys.exit(130)
    except ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
