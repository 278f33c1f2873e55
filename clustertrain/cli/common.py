"""Pieces every command group shares."""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import typer

from clustertrain.errors import ClusterTrainError


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """A user mistake ends the command with one line on stderr and its exit code (2), also when a
    sub-app runs on its own (tests, ``python -m``) without :func:`clustertrain.cli.main` around it."""
    try:
        yield
    except ClusterTrainError as err:
        print(f"error: {err}", file=sys.stderr)
        raise typer.Exit(err.exit_code) from None
