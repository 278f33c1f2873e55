"""`clustertrain report PROJECT|RUN_DIR [-o FILE]`: the self-contained HTML run report with plots.

Registered in :mod:`clustertrain.cli` as ``app.command("report")(report_command)``. Exit codes: 0 written, 2 bad input
(a path that is neither a run directory nor a project file, a bad project file or ``--set``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def report_command(
    target: Path = typer.Argument(
        ..., metavar="PROJECT|RUN_DIR", help="A project file (YAML: every model, from its run directory <storage.runs or "
        "storage.root>/<project>/<model>) or a run directory (with run.json; e.g. one started with --run-dir)."),
    output: Optional[Path] = typer.Option(
        None, "--output", "-o", help="Where to write the HTML file. Default: RUN_DIR/report.html for a run directory, "
        "<storage.outputs or storage.root>/<project>/report.html (beside the run directories) for a project file."),
    set_: list[str] = typer.Option([], "--set", help="Override a project field, e.g. --set storage.root=/fsx (repeatable; "
                                   "project files only)."),
) -> None:
    """Write one self-contained HTML report (plots embedded, opens offline) of every model of a project, or of one run:
    loss and lr, tokens/s and MFU, grad norm, per-rank step time, node telemetry, checkpoints, events, the plan beside
    the measurement and a summary table. Parts a run has not written yet are marked missing."""
    from clustertrain.monitor.report import write_report

    path, report = write_report(target, set_, output)
    states = ", ".join(f"{m.name} {m.state}" for m in report.models)
    typer.echo(f"wrote {path} ({len(report.models)} model{'s' if len(report.models) != 1 else ''}: {states})")
