"""``clustertrain status`` on screen: the rich table of :class:`~clustertrain.monitor.status.ModelStatus` rows with
their notes (incidents, preemption saves) and the project's lines (goodput over its models, suspect nodes), their
JSON (a list of the rows' fields, paths as strings) and the ``--watch`` loop (rich Live, one refresh every
``interval`` seconds until Ctrl-C, each headed by the local time it was made: "refreshed 14:03:22").

A project without GPUs (``cluster.gpus_per_node: 0``, as its run directories' ``config.yaml`` say) shows CPU-hours
("CPU-h": ranks x wall-clock hours, what ``usage.json`` counts for CPU workers) where a GPU project shows GPU-hours."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from clustertrain.monitor.goodput import Goodput
from clustertrain.monitor.resilience import DID_NOT_LAND
from clustertrain.monitor.status import (CANCELLED, COMPLETED, FAILED, NOT_STARTED, QUEUED, REQUEUED, RUNNING, STOPPED,
                                         ModelStatus, human_duration)

STYLES = {COMPLETED: "green", RUNNING: "cyan", QUEUED: "yellow", REQUEUED: "yellow", FAILED: "bold red",
          STOPPED: "magenta", NOT_STARTED: "dim", CANCELLED: "magenta"}
NODES_SHOWN = 3
WIDE = 240


def status_json(rows: list[ModelStatus], indent: int | None = 1) -> str:
    return json.dumps([r.to_dict() for r in rows], indent=indent)


#: (header, right-aligned, drop order on a narrow terminal: 0 = never)
COLUMNS = (("model", False, 0), ("state", False, 0), ("step", True, 0), ("loss", True, 7), ("tok/s", True, 6),
           ("MFU", True, 1), ("ETA", True, 0), ("GPU-h", True, 3), ("cost", True, 8), ("goodput", True, 4),
           ("checkpoint (age)", False, 5), ("job / nodes", False, 2), ("alarms", False, 9))


def status_table(rows: list[ModelStatus], width: int | None = None, cpu: bool | None = None) -> Table:
    """The table; on a console narrower than it (``width``), the least needed columns are left out and named in
    the caption (``--json`` has them all). ``cpu``: the project has no GPUs (its hours column is then "CPU-h");
    None: as :func:`trains_on_cpus` reads it from the rows' run directories."""
    cells = [_cells(r) for r in rows]
    headers = [_header(name, trains_on_cpus(rows) if cpu is None else cpu) for name, _, _ in COLUMNS]
    shown = list(range(len(COLUMNS)))
    need = [max([len(headers[i])] + [max(len(line) for line in str(c[i]).split("\n")) for c in cells]) + 3
            for i in shown]
    for i in sorted((i for i in shown if COLUMNS[i][2]), key=lambda i: COLUMNS[i][2]):
        if width is None or sum(need[j] for j in shown) <= width:
            break
        shown.remove(i)
    hidden = [headers[i] for i in range(len(COLUMNS)) if i not in shown]
    caption = f"not shown at this width: {', '.join(hidden)} (widen the terminal, or --json)" if hidden else None
    table = Table(header_style="bold", pad_edge=False, caption=caption, caption_justify="left")
    for i in shown:
        _, right, _ = COLUMNS[i]
        table.add_column(headers[i], justify="right" if right else "left", overflow="fold")
    for c in cells:
        table.add_row(*(c[i] for i in shown))
    return table


def _header(name: str, cpu: bool) -> str:
    return "CPU-h" if cpu and name == "GPU-h" else name


def trains_on_cpus(rows: list[ModelStatus]) -> bool:
    """Whether the project of ``rows`` has no GPUs: ``cluster.gpus_per_node`` is 0 in the first of their run
    directories' ``config.yaml`` that says (False when none does: the GPU wording, as before)."""
    for r in rows:
        gpus = _gpus_per_node(Path(r.run_dir) / "config.yaml")
        if gpus is not None:
            return gpus == 0
    return False


def _gpus_per_node(config: Path) -> int | None:
    import yaml

    try:
        raw = yaml.safe_load(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    cluster = raw.get("cluster") if isinstance(raw, dict) else None
    gpus = cluster.get("gpus_per_node") if isinstance(cluster, dict) else None
    return gpus if isinstance(gpus, int) and not isinstance(gpus, bool) else None


def _cells(r: ModelStatus) -> list:
    return [r.model, Text(state_cell(r), style=STYLES.get(r.state, "")), _step(r), _num(r.loss, "{:.4f}"),
            _num(r.tokens_per_s, "{:,.0f}"), _num(None if r.mfu is None else r.mfu * 100, "{:.1f}%"),
            human_duration(r.eta_s) if r.eta_s is not None else "-", _hours(r.gpu_hours), _num(r.cost_usd, "${:,.2f}"),
            _num(r.goodput.percent if r.goodput else None, "{:.1f}%"), _checkpoint(r), _job(r),
            Text("\n".join(r.alarms) or "-", style="red" if r.alarms else "dim")]


def status_view(rows: list[ModelStatus], width: int | None = None, now: float | None = None,
                cpu: bool | None = None, refreshed: float | None = None) -> RenderableType:
    """The table (fitted to ``width``; ``cpu`` as in :func:`status_table`); one line per model with a note or
    something missing, its newest incident and its last preemption save; then, once for the project, its goodput
    (several models) and suspect nodes. ``refreshed`` (``--watch``): when the rows were collected, shown above the
    table in local time ("refreshed 14:03:22")."""
    notes = []
    for r in rows:
        parts = ([r.message] if r.message else []) + ([f"missing: {'; '.join(r.missing)}"] if r.missing else [])
        if parts:
            notes.append(Text(f"{r.model}: " + " | ".join(parts), style="red" if r.state == FAILED else "dim"))
        if r.incident:
            notes.append(Text(f"{r.model}: {r.incident['kind']}: {r.incident['message']} (incident: "
                              f"{r.incident['dir']})", style="red"))
        if r.preempt_save:
            notes.append(Text(f"{r.model}: last preemption save {r.preempt_save}",
                              style="red" if r.preempt_save == DID_NOT_LAND else "dim"))
        notes += [Text(f"{r.model}: {tracker_line(t)}", style="dim") for t in r.trackers]
    head = [Text(refreshed_line(refreshed), style="dim")] if refreshed is not None else []
    return Group(*head, status_table(rows, width, cpu), *notes,
                 *project_lines(rows, time.time() if now is None else now))


def tracker_line(t: dict) -> str:
    """One tracker run of a model: "mlflow run 9f1c...: http://..." or, without a URL, how to reach it
    (``RUN_DIR/trackers.json``, :func:`clustertrain.monitor.trackers.read_tracker_links`)."""
    where = t.get("url") or t.get("note") or "no link recorded"
    return f"{t['tracker']} run {t['run_id']}: {where}"


def refreshed_line(t: float) -> str:
    """"refreshed 14:03:22 (Ctrl-C to stop)": ``t`` in this machine's local time."""
    return f"refreshed {datetime.fromtimestamp(t).strftime('%H:%M:%S')} (Ctrl-C to stop)"


def project_lines(rows: list[ModelStatus], now: float) -> list[Text]:
    """The project's goodput over its models (when there are several) and its suspect nodes, each said once."""
    out = []
    accounted = [r.goodput for r in rows if r.goodput is not None]
    total = Goodput.combine(accounted)
    if len(accounted) > 1 and total.percent is not None:
        out.append(Text(f"project goodput: {goodput_line(total)}", style="dim"))
    suspects = rows[0].suspects if rows else []
    if suspects:
        out.append(Text("suspect nodes (excluded from the project's jobs): "
                        + "; ".join(suspect_line(s, now) for s in suspects), style="yellow"))
    return out


def goodput_line(g: Goodput) -> str:
    """"87.2% of 12.40 node-h (lost 0.50, overhead 0.90, idle 0.10, stalls 0.10); 2 restarts"."""
    parts = ", ".join(f"{name} {g.hours(part):,.2f}" for part, name in
                      (("lost", "lost"), ("overhead", "overhead"), ("idle", "idle"), ("stall", "stalls")))
    return (f"{g.percent:.1f}% of {g.allocated_h:,.2f} node-h ({parts}); {g.restarts} restart"
            + ("s" if g.restarts != 1 else ""))


def suspect_line(s: dict, now: float) -> str:
    """One suspect node in a few words: "node2 (hang, 23h 10m left): rank 1 on node2 is stuck in collective ..."."""
    left = human_duration(max(0.0, s["expires"] - now))
    return f"{s['node']} ({s['source']}, {left} left)" + (f": {s['reason']}" if s.get("reason") else "")


def make_console() -> Console:
    """A console for the table: the terminal's width, or a wide one (``WIDE``) when the output is a file or pipe."""
    console = Console(highlight=False)
    return console if console.is_terminal else Console(highlight=False, width=max(console.width, WIDE))


def show(rows: list[ModelStatus], console: Console, as_json: bool = False) -> None:
    if as_json:
        print(status_json(rows), flush=True)
    else:
        console.print(status_view(rows, console.width))


def watch(collect: Callable[[], list[ModelStatus]], interval: float, console: Console,
          as_json: bool = False) -> list[ModelStatus]:
    """Show ``collect()`` every ``interval`` seconds (the table in place; with ``as_json`` one JSON list per line)
    until Ctrl-C; return the rows of the last refresh."""
    rows = collect()
    try:
        if as_json:
            while True:
                print(status_json(rows, indent=None), flush=True)
                time.sleep(interval)
                rows = collect()
        refreshed = time.time()
        with Live(status_view(rows, console.width, refreshed=refreshed), console=console, auto_refresh=False,
                  transient=False) as live:
            while True:
                time.sleep(interval)
                rows = collect()
                refreshed = time.time()
                live.update(status_view(rows, console.width, refreshed=refreshed), refresh=True)
    except KeyboardInterrupt:
        return rows


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _hours(value: float | None) -> str:
    if value is None:
        return "-"
    return "<0.01" if 0 < value < 0.005 else f"{value:,.2f}"


def _step(r: ModelStatus) -> str:
    if r.step is None:
        return "-" if r.max_steps is None else f"-/{r.max_steps}"
    return f"{r.step}/{r.max_steps}" if r.max_steps else str(r.step)


def state_cell(r: ModelStatus) -> str:
    """The state, and while its job waits in the queue Slurm's reason: "queued (Resources)", "requeued (BeginTime)"."""
    return f"{r.state} ({r.pending_reason})" if r.pending_reason else r.state


def _checkpoint(r: ModelStatus) -> str:
    if not r.checkpoint:
        return "-"
    return f"{Path(r.checkpoint).name} ({human_duration(r.checkpoint_age_s)})"


def _job(r: ModelStatus) -> str:
    nodes = r.nodes[:NODES_SHOWN]
    more = len(r.nodes) - len(nodes)
    where = ",".join(nodes) + (f" +{more}" if more else "")
    job = r.job_id or "-"
    if r.restarts:
        job += f" (restart {r.restarts})"
    return f"{job} {where}".strip() if where else job
