"""`clustertrain local-slurm`: a real Slurm cluster on 127.0.0.1 for rehearsals (see docs/local-slurm.md)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from clustertrain.cli.common import command_group

if TYPE_CHECKING:
    from clustertrain.launch import LocalSlurmCluster

app = command_group(help="Start, inspect and stop a local Slurm cluster (slurmctld + emulated nodes on 127.0.0.1).")

STATE_DIR_ENV = "CLUSTERTRAIN_LOCAL_SLURM_DIR"
_STATE_HELP = f"State directory [default: ${STATE_DIR_ENV} or ~/.clustertrain/local-slurm]"


def default_state_dir() -> Path:
    return Path(os.environ.get(STATE_DIR_ENV) or "~/.clustertrain/local-slurm").expanduser()


def _cluster(state_dir: Path | None, **settings: Any) -> "LocalSlurmCluster":
    from clustertrain.launch import LocalSlurmCluster  # jinja2 and the Slurm helpers: only for these commands

    return LocalSlurmCluster(state_dir or default_state_dir(), **settings)


@app.command()
def up(nodes: int = typer.Option(2, "--nodes", help="Number of emulated nodes"),
       cpus_per_node: int = typer.Option(None, "--cpus-per-node", help="CPUs each node declares [default: this machine's]"),
       gpus_per_node: int = typer.Option(0, "--gpus-per-node", help="Fake GPUs (gres) per node"),
       state_dir: Path = typer.Option(None, "--state-dir", help=_STATE_HELP)) -> None:
    """Start the cluster (or reuse the one running in the state dir) and wait until all nodes are idle."""
    status = _cluster(state_dir, nodes=nodes, cpus_per_node=cpus_per_node, gpus_per_node=gpus_per_node).up()
    typer.echo(status.describe())
    typer.echo(f"use it with: eval \"$(clustertrain local-slurm env --state-dir {shlex.quote(str(status.state_dir))})\"")


@app.command()
def down(state_dir: Path = typer.Option(None, "--state-dir", help=_STATE_HELP)) -> None:
    """Cancel all jobs and stop every daemon of the cluster."""
    _cluster(state_dir).down()
    typer.echo("stopped")


@app.command()
def status(state_dir: Path = typer.Option(None, "--state-dir", help=_STATE_HELP)) -> None:
    """Show daemons and node states; exit 1 when the cluster is not running."""
    result = _cluster(state_dir).status()
    typer.echo(result.describe())
    raise typer.Exit(0 if result.running else 1)


@app.command()
def env(state_dir: Path = typer.Option(None, "--state-dir", help=_STATE_HELP)) -> None:
    """Print `export` lines for the Slurm clients: eval "$(clustertrain local-slurm env)"."""
    variables = _cluster(state_dir).env()
    for key, value in variables.items():
        typer.echo(f"export {key}={shlex.quote(value)}")
