"""The rehearsal's report as text: :func:`render_table` (what ``clustertrain rehearse`` prints) and
:func:`summary_line` (its last line). Pure functions of a :class:`~.model.RehearsalReport`; no colour codes, so the
text reads the same in a terminal, a CI log and a test."""

from __future__ import annotations

import io

from rich import box
from rich.console import Console
from rich.table import Table

from clustertrain.rehearsal.checks import hostlist, plural
from clustertrain.rehearsal.observed import Check, RehearsalReport

WIDTH = 120


def status(check: Check) -> str:
    """PASS, FAIL or SKIP (``ok is None``: the check did not run)."""
    return "SKIP" if check.ok is None else "PASS" if check.ok else "FAIL"


def _placed(nodes) -> str:
    """A job's placed nodes: a count, or a list of node names (shown as their count and Slurm hostlist)."""
    if isinstance(nodes, (list, tuple)):
        return f"{len(nodes)} ({hostlist(nodes)})" if nodes else "0"
    return "" if nodes is None else str(nodes)


def _header(report: RehearsalReport) -> str:
    line = (f"rehearsal of {report.project}: {report.nodes} nodes, {report.gpus} GPUs, "
            f"{plural(len(report.jobs), 'job')}, {report.wall_s:.0f} s")
    return line + (f"; kept running in {report.kept}" if report.kept else "")


def render_table(report: RehearsalReport) -> str:
    """A header line, one row per job, then one row per check (PASS / FAIL / SKIP, its name and title) followed
    by its detail lines, indented; fits a 120-column terminal (check names never wrap)."""
    buf = io.StringIO()
    console = Console(file=buf, width=WIDTH, color_system=None, highlight=False, emoji=False, markup=False)
    console.print(_header(report), soft_wrap=True)
    if report.jobs:
        jobs = Table(box=box.SIMPLE_HEAD, pad_edge=False, title=None)
        jobs.add_column("model", no_wrap=True)
        jobs.add_column("job", no_wrap=True)
        jobs.add_column("planned", justify="right", no_wrap=True)
        jobs.add_column("placed", overflow="fold")
        jobs.add_column("state", no_wrap=True)
        jobs.add_column("reason", overflow="fold")
        for job in report.jobs:
            jobs.add_row(str(job.get("model", "")), str(job.get("job_id") or "-"), str(job.get("planned_nodes", "")),
                         _placed(job.get("nodes")), str(job.get("state") or "-"), str(job.get("reason") or ""))
        console.print(jobs)
    checks = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_lines=False)
    checks.add_column("result", no_wrap=True)
    checks.add_column("check", no_wrap=True, min_width=max([len(c.name) for c in report.checks] + [5]))
    checks.add_column("what it asserts / what went wrong", overflow="fold")
    for check in report.checks:
        checks.add_row(status(check), check.name, check.title)
        for line in check.details:
            checks.add_row("", "", f"  {line}")
    console.print(checks)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()).strip("\n") + "\n"


def summary_line(report: RehearsalReport) -> str:
    """``rehearsal passed: 10 checks, 7 jobs on 80 nodes (640 GPUs) in 52 s`` or
    ``rehearsal failed: booted, paths (2 of 10 checks)`` (checks that did not run are counted after)."""
    total = len(report.checks)
    if report.ok:
        return (f"rehearsal passed: {total} checks, {plural(len(report.jobs), 'job')} on {report.nodes} nodes "
                f"({report.gpus} GPUs) in {report.wall_s:.0f} s")
    failed = [c.name for c in report.checks if c.ok is False]
    skipped = [c.name for c in report.checks if c.ok is None]
    if not failed:
        return f"rehearsal failed: {len(skipped)} of {total} checks did not run ({', '.join(skipped)})"
    tail = f", {len(skipped)} not run" if skipped else ""
    return f"rehearsal failed: {', '.join(failed)} ({len(failed)} of {total} checks{tail})"
