"""`clustertrain local-slurm`: a real Slurm cluster on 127.0.0.1 for rehearsals (see docs/local-slurm.md).

Which cluster: ``--name NAME`` (``~/.clustertrain/local-slurm/NAME``), ``--state-dir DIR``, else
``$CLUSTERTRAIN_LOCAL_SLURM_DIR``, else the cluster named ``default``
(:func:`clustertrain.launch.slurm_cluster_paths.state_dir_for`)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from clustertrain.cli.common import command_group
from clustertrain.launch.slurm_cluster_paths import BASE_DIR, DEFAULT_NAME, STATE_DIR_ENV, state_dir_for

if TYPE_CHECKING:
    from clustertrain.launch import LocalSlurmCluster

app = command_group(help="Start, inspect and stop a local Slurm cluster (slurmctld + emulated nodes on 127.0.0.1).")

_NAME_HELP = f"The cluster's name: its state dir is {BASE_DIR}/NAME [default: ${STATE_DIR_ENV} or {DEFAULT_NAME}]"
_STATE_HELP = "The cluster's state directory (instead of --name)"
_NAME = typer.Option(None, "--name", help=_NAME_HELP)
_STATE = typer.Option(None, "--state-dir", help=_STATE_HELP)


def default_state_dir() -> Path:
    return state_dir_for()


def _cluster(name: str | None, state_dir: Path | None, **settings: Any) -> "LocalSlurmCluster":
    from clustertrain.launch import LocalSlurmCluster  # jinja2 and the Slurm helpers: only for these commands

    return LocalSlurmCluster(state_dir_for(name, state_dir), **settings)


@app.command()
def up(nodes: int = typer.Option(2, "--nodes", help="Number of emulated nodes"),
       cpus_per_node: int = typer.Option(None, "--cpus-per-node", help="CPUs each node declares [default: this machine's]"),
       gpus_per_node: int = typer.Option(0, "--gpus-per-node", help="Fake GPUs (gres) per node"),
       memory_mb: int = typer.Option(None, "--memory-mb", help="RealMemory (MB) each node declares [default: this machine's]"),
       memory_scheduling: bool = typer.Option(False, "--memory-scheduling",
                                              help="Memory-based scheduling (CR_CPU_Memory), as EnableMemoryBasedScheduling"),
       name: str = _NAME, state_dir: Path = _STATE) -> None:
    """Start the cluster (or reuse it when it runs with these options) and wait until all nodes are idle; a cluster
    running with other options, or partly, is not restarted (run `down` first)."""
    status = _cluster(name, state_dir, nodes=nodes, cpus_per_node=cpus_per_node, gpus_per_node=gpus_per_node,
                      memory_mb=memory_mb, memory_scheduling=memory_scheduling).up()
    typer.echo(status.describe())
    typer.echo(f"use it with: eval \"$(clustertrain local-slurm env --state-dir {shlex.quote(str(status.state_dir))})\"")


@app.command()
def down(name: str = _NAME, state_dir: Path = _STATE,
         yes: bool = typer.Option(False, "--yes", "-y", help="Cancel the cluster's jobs without asking")) -> None:
    """List the jobs it would cancel and ask (--yes: do not ask; required without a terminal), then cancel them, stop
    every daemon and kill every process left of the cluster and its jobs."""
    from clustertrain.core.errors import LaunchError

    cluster = _cluster(name, state_dir)
    jobs = cluster.jobs()
    if jobs and not yes:
        if not sys.stdin.isatty():
            raise LaunchError(cluster.down_refusal(jobs))
        typer.echo(f"local Slurm in {cluster.paths.root} has {len(jobs)} job(s):")
        for job in jobs:
            typer.echo(f"  {job.describe()}")
        typer.confirm("cancel them and stop the cluster?", abort=True)
    for job in cluster.down():
        typer.echo(f"cancelled {job.describe()}")
    typer.echo("stopped")


@app.command()
def status(name: str = _NAME, state_dir: Path = _STATE) -> None:
    """Show daemons, owner and node states; exit 1 when the cluster is not running."""
    result = _cluster(name, state_dir).status()
    typer.echo(result.describe())
    raise typer.Exit(0 if result.running else 1)


@app.command()
def env(name: str = _NAME, state_dir: Path = _STATE) -> None:
    """Print `export` lines for the Slurm clients: eval "$(clustertrain local-slurm env)"."""
    variables = _cluster(name, state_dir).env()
    for key, value in variables.items():
        typer.echo(f"export {key}={shlex.quote(value)}")
