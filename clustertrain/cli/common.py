"""Pieces every command group shares: the one path from a user mistake to its line (one per mistake) and exit code.

Every typer app of the CLI — the root ``clustertrain`` app and each sub-app (``config``, ``cluster``,
``data`` ...) — is made by :func:`command_group`, whose click group class :class:`CommandGroup` turns a
:class:`~clustertrain.core.errors.ClusterTrainError` raised anywhere below it into ``error: <message>`` on
stderr and the error's exit code (2). That is the one place: :func:`clustertrain.cli.main` runs the root
app through it, and a sub-app run on its own (``CliRunner().invoke(sub_app, ...)``, ``python -c
"from clustertrain.cli.storage import app; app()"``) gets the same behaviour. Commands therefore just
raise; they catch nothing. Typer/click handle their own exceptions as usual: a bad option or value is a
usage error with exit code 2, ``typer.Exit(n)`` exits n, Ctrl-C exits 130.

A message may hold several lines, one per mistake (a project file with three mistakes names all three): each
line is printed as its own ``error:`` line. With ``CLUSTERTRAIN_DEBUG`` set to ``1``, ``true`` or ``yes`` (any case)
the traceback follows the lines (for bug reports); any other value (``0``, ``false``, empty) leaves it off.
Anything that is not a ``ClusterTrainError`` is a bug in clustertrain and keeps its traceback.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any, Sequence

import typer
from typer.core import TyperGroup

from clustertrain.core.errors import ClusterTrainError

DEBUG_ENV = "CLUSTERTRAIN_DEBUG"
DEBUG_ON = ("1", "true", "yes")


def debug_enabled() -> bool:
    """Whether ``CLUSTERTRAIN_DEBUG`` asks for tracebacks: ``1``, ``true`` or ``yes`` (any case, blanks aside)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() in DEBUG_ON


def error_lines(err: ClusterTrainError) -> list[str]:
    """``err``'s message as ``error:`` lines: one per line of the message (one per mistake), blank lines dropped."""
    lines = [line for line in str(err).splitlines() if line.strip()]
    return [f"error: {line}" for line in lines or [str(err)]]


def report_user_error(err: ClusterTrainError) -> int:
    """Print ``err`` on stderr, an ``error:`` line per line of its message (plus its traceback when
    :func:`debug_enabled`); return its exit code."""
    for line in error_lines(err):
        print(line, file=sys.stderr)
    if debug_enabled():
        traceback.print_exception(type(err), err, err.__traceback__, file=sys.stderr)
    return err.exit_code


class CommandGroup(TyperGroup):
    """A typer group whose :meth:`main` ends a user mistake with :func:`report_user_error`."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        try:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        except ClusterTrainError as err:
            code = report_user_error(err)
            if standalone_mode:
                sys.exit(code)
            return code


def command_group(help: str, **settings: Any) -> typer.Typer:
    """A typer app with the CLI's settings: the one error path, help without arguments, no shell-completion
    options, plain tracebacks for bugs."""
    options: dict[str, Any] = {"no_args_is_help": True, "add_completion": False, "pretty_exceptions_enable": False,
                               "rich_markup_mode": None}  # usage errors as click's plain lines, not a box
    return typer.Typer(cls=CommandGroup, help=help, **{**options, **settings})


def plain_table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A borderless rich table as text, one line per row: columns two blanks apart, no wrapping (the console is wider
    than any line, so a long last cell stays on its row's one line and the output greps and pastes well), no colour,
    markup or emoji (``[cfn-lint]`` and ``node[1-3]`` print as written), trailing blanks cut."""
    import io

    from rich.console import Console
    from rich.table import Table

    buf = io.StringIO()
    console = Console(file=buf, width=1 << 20, highlight=False, color_system=None, markup=False, emoji=False)
    table = Table(*head, box=None, pad_edge=False)
    for row in rows:
        table.add_row(*(str(c) for c in row))
    console.print(table)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines())
