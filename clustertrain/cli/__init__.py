"""The `clustertrain` command: a thin face over the stages. Each command parses its options,
loads the project, calls one library function, prints and sets the exit code.

User mistakes (:class:`~clustertrain.core.errors.ClusterTrainError`) print one ``error:`` line and exit 2:
every app here is made by :func:`clustertrain.cli.common.command_group`, whose group class is the one
place that does it (for the root app run by :func:`main` and for a sub-app run on its own).

Start-up stays light: the command modules import their stages (torch, numpy, boto3, tokenizers,
aws-parallelcluster behind them) inside the command functions, so ``clustertrain --help`` and
``clustertrain plan`` load only what they use. The root app (:mod:`clustertrain.cli.root`) is built on first use,
and ``clustertrain data ...`` runs the ``data`` group without it (:func:`main`).
"""

from __future__ import annotations

import sys
from typing import Any, Sequence


def main(argv: Sequence[str] | None = None) -> None:
    """Run ``clustertrain`` with ``argv`` (default: the command line) and exit with its code.

    ``data ...`` runs the ``data`` group's own app, the very app the root mounts (same help, errors, exit codes),
    without building the root: that imports every command module and what they import at the top (the project's
    pydantic models: ~0.25 s), which ``data prepare``'s measured start-up (docs/data.md) does not need."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["data"]:
        from clustertrain.cli.data import app as data_app

        data_app(args=args[1:], prog_name="clustertrain data")
        return
    from clustertrain.cli.root import app as root_app

    root_app(args=args, prog_name="clustertrain")


def __getattr__(name: str) -> Any:
    """``clustertrain.cli.app``: the root app (:mod:`clustertrain.cli.root`), built on first use."""
    if name == "app":
        from clustertrain.cli.root import app as root_app

        return root_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
