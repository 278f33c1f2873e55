"""The report's figures: matplotlib (Agg, no pyplot, no display, no network) -> PNG bytes of a fixed size.

Every figure is :data:`WIDTH` x :data:`HEIGHT` pixels: saved at :data:`DPI` without a tight bounding box, so the
size is exact (the report's ``<img>`` tags and the tests rely on it). Each figure is one row of panels that share
an x axis: the training step (:func:`step_figure`, :func:`ranks_figure`) or the time since the run started
(:func:`telemetry_figure`, :func:`progress_figure`; :class:`Clock`); :func:`goodput_figure` stacks each attempt's
node-time by part (:mod:`clustertrain.monitor.goodput`). Vertical :class:`Marker` lines show checkpoints (grey, dotted)
and events (orange for warnings, red for errors) on those axes; events closer together than a label's width (the
same step, or nearly) share one label (:func:`label_groups`: "straggler x3, loss_spike"), so labels never overprint.
Every utilisation axis (GPU utilisation, host CPU, MFU) runs from 0 to 100 % and every memory axis from 0 to the
memory's total, whatever the values: a flat 99.7 % is drawn flat, not as a cliff. A panel with nothing to draw says
so in its middle.

The functions take plain values (metrics rows, :class:`~clustertrain.core.run_events.TimingRow` lists, the sampler
rows of :func:`~clustertrain.monitor.samples.read_samples`) and know nothing of run directories: gathering them is
:mod:`clustertrain.monitor.report`'s job. matplotlib is imported inside the functions (it is heavy).
"""

from __future__ import annotations

import base64
import io
import math
import statistics
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from clustertrain.core.run_events import PARTS, TimingRow

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from clustertrain.monitor.goodput import AttemptGoodput

WIDTH, HEIGHT, DPI = 1200, 300, 100
#: above this many ranks (or GPU series) one line each is unreadable: min / median / max bands instead
MAX_LINES = 8
COLORS = {"checkpoint": "#7f7f7f", "info": "#7f7f7f", "warning": "#ff7f0e", "error": "#d62728"}
#: goodput parts in the order an attempt goes through them: (label, colour)
GOODPUT_PARTS = {"overhead": ("restart overhead", "#1f77b4"), "productive": ("productive", "#2ca02c"),
                 "stall": ("checkpoint stalls", "#9467bd"), "lost": ("lost work", "#d62728"),
                 "idle": ("idle", "#7f7f7f")}
#: attempts above this many are drawn without their job and state in the labels
MAX_BAR_LABELS = 12
SLOW = "#d62728"
MAX_LABELS = 12  # event labels drawn on one panel (the lines are all drawn)
#: events whose lines are closer than this many pixels share one label (a rotated 7 pt line is ~10 px wide)
LABEL_GAP_PX = 16
#: a shared label longer than this ends in "+N more" (a rotated label must fit the panel's height)
LABEL_CHARS = 44
#: the fixed axis of a percentage panel
PERCENT = (0.0, 100.0)


@dataclass(frozen=True)
class Plot:
    """One figure of the report."""

    key: str        # stable id: loss_lr, throughput, grad_norm, ranks, telemetry, progress
    title: str
    png: bytes
    width: int
    height: int
    note: str | None = None  # one line under the figure (e.g. "no GPU columns: host CPU and memory")

    @property
    def data_uri(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.png).decode("ascii")


@dataclass(frozen=True)
class Marker:
    """A vertical line at ``x`` (a step, or Unix seconds on a time axis)."""

    x: float
    label: str
    kind: str  # checkpoint | info | warning | error


@dataclass(frozen=True)
class Panel:
    """One panel of a step figure: ``key`` of the metrics rows against ``step``."""

    key: str
    ylabel: str
    scale: float = 1.0
    empty: str = ""  # what the panel says when no row has the key
    limits: tuple[float, float] | None = None  # a fixed y axis (e.g. :data:`PERCENT`), never autoscaled or log


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def series(rows: Sequence[dict[str, Any]], x: str, y: str, scale: float = 1.0) -> tuple[list[float], list[float]]:
    """The (x, y) pairs of ``rows`` where both are numbers (a non-finite y stays: matplotlib leaves a gap)."""
    xs, ys = [], []
    for row in rows:
        a, b = _number(row.get(x)), _number(row.get(y))
        if a is not None and b is not None:
            xs.append(a)
            ys.append(b * scale)
    return xs, ys


def _figure(panels: int) -> tuple["Figure", list["Axes"]]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH / DPI, HEIGHT / DPI), dpi=DPI, layout="constrained")
    axes = fig.subplots(1, panels, squeeze=False)[0]
    for ax in axes:
        ax.grid(True, color="#dddddd", linewidth=0.6)
        ax.tick_params(labelsize=8)
    return fig, list(axes)


def _png(fig: "Figure") -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def _empty(ax: "Axes", text: str) -> None:
    ax.text(0.5, 0.5, "\n".join(textwrap.wrap(text, 50)), ha="center", va="center", transform=ax.transAxes, fontsize=9,
            color="#666666")
    ax.set_xticks([])
    ax.set_yticks([])


def _markers(ax: "Axes", markers: Sequence[Marker], scale=lambda x: x) -> None:
    labelled = []
    for m in markers:
        x = scale(m.x)
        ax.axvline(x, color=COLORS.get(m.kind, COLORS["warning"]), linestyle=":" if m.kind == "checkpoint" else "--",
                   linewidth=0.9, alpha=0.8, zorder=1)
        if m.kind != "checkpoint":
            labelled.append(Marker(x, m.label, m.kind))
    for m in label_groups(labelled, _label_gap(ax))[:MAX_LABELS]:
        ax.text(m.x, 0.98, f" {m.label}", rotation=90, va="top", ha="right", fontsize=7,
                color=COLORS.get(m.kind, COLORS["warning"]), transform=ax.get_xaxis_transform())


def _label_gap(ax: "Axes") -> float:
    """:data:`LABEL_GAP_PX` in the axis' data units (its width before the layout shrinks it a little: 80 %)."""
    lo, hi = ax.get_xlim()
    pixels = ax.get_position().width * WIDTH * 0.8
    return abs(hi - lo) * LABEL_GAP_PX / pixels if pixels > 0 else 0.0


def label_groups(markers: Sequence[Marker], gap: float) -> list[Marker]:
    """One label per run of markers within ``gap`` of the run's first (in x order): at that first x, naming each kind
    once with its count ("straggler x3, loss_spike", at most :data:`LABEL_CHARS` characters, then "+N more"), red
    when one of them is an error. Two labels are then always more than ``gap`` apart."""
    groups: list[list[Marker]] = []
    for m in sorted(markers, key=lambda m: m.x):
        if groups and m.x - groups[-1][0].x <= gap:
            groups[-1].append(m)
        else:
            groups.append([m])
    out = []
    for group in groups:
        counts: dict[str, int] = {}
        for m in group:
            counts[m.label] = counts.get(m.label, 0) + 1
        names = [f"{label} x{n}" if n > 1 else label for label, n in counts.items()]
        text = names[0]
        for i, name in enumerate(names[1:], 1):
            rest = len(names) - i
            if len(f"{text}, {name}") > LABEL_CHARS - (len(f" +{rest - 1} more") if rest > 1 else 0):
                text += f" +{rest} more"
                break
            text += f", {name}"
        kind = "error" if any(m.kind == "error" for m in group) else group[0].kind
        out.append(Marker(group[0].x, text, kind))
    return out


def step_figure(key: str, title: str, rows: Sequence[dict[str, Any]], panels: Sequence[Panel],
                markers: Sequence[Marker] = ()) -> Plot | None:
    """One panel per metric against the step; None when no panel has a single point."""
    data = [series(rows, "step", p.key, p.scale) for p in panels]
    if not any(xs for xs, _ in data):
        return None
    fig, axes = _figure(len(panels))
    for ax, panel, (xs, ys) in zip(axes, panels, data):
        if not xs:
            _empty(ax, panel.empty or f"no {panel.key} recorded")
            continue
        ax.plot(xs, ys, color="#1f77b4", linewidth=1.4, marker="o" if len(xs) < 30 else None, markersize=3)
        if panel.limits is not None:
            ax.set_ylim(*panel.limits)
        elif ys and all(v > 0 for v in ys if math.isfinite(v)) and _spread(ys) > 30:
            ax.set_yscale("log")
        _markers(ax, markers)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel(panel.ylabel, fontsize=8)
    return Plot(key, title, _png(fig), WIDTH, HEIGHT)


def _spread(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v) and v > 0]
    return max(finite) / min(finite) if finite else 1.0


def ranks_figure(timing: dict[int, list[TimingRow]], slowest: int | None, nodes: dict[int, str]) -> Plot | None:
    """Seconds per step of every rank in each part (:data:`PARTS`: data, forward, backward, optimizer, comm; one line each when few, else the min-max band and the
    median), the slowest rank drawn in red; None without timing rows."""
    if not timing:
        return None
    fig, axes = _figure(len(PARTS))
    banded = len(timing) > MAX_LINES
    for ax, part in zip(axes, PARTS):
        field = f"{part}_s"
        if banded:
            by_step: dict[int, list[float]] = {}
            for rows in timing.values():
                for r in rows:
                    by_step.setdefault(r.step, []).append(getattr(r, field))
            steps = sorted(by_step)
            lo = [min(by_step[s]) for s in steps]
            hi = [max(by_step[s]) for s in steps]
            ax.fill_between(steps, lo, hi, color="#1f77b4", alpha=0.25, linewidth=0, label=f"min-max of {len(timing)} ranks")
            ax.plot(steps, [statistics.median(by_step[s]) for s in steps], color="#1f77b4", linewidth=1.2, label="median")
        else:
            for rank, rows in timing.items():
                if rank != slowest:
                    ax.plot([r.step for r in rows], [getattr(r, field) for r in rows], linewidth=1.0, alpha=0.85,
                            label=f"rank {rank}")
        if slowest is not None and slowest in timing:
            rows = timing[slowest]
            where = f" ({nodes[slowest]})" if nodes.get(slowest) else ""
            ax.plot([r.step for r in rows], [getattr(r, field) for r in rows], color=SLOW, linewidth=2.2,
                    label=f"rank {slowest}{where}, slowest")
        ax.set_title(f"{part} s/step", fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.legend(fontsize=7, loc="best")
    return Plot("ranks", "Per-rank step time: " + " / ".join(PARTS), _png(fig), WIDTH, HEIGHT)


@dataclass(frozen=True)
class Clock:
    """The x axis of the time plots: seconds, minutes or hours (whichever suits the run's span) since ``t0``."""

    t0: float
    unit: str       # seconds | minutes | hours
    t0_text: str    # how the axis label names t0 (e.g. "2026-11-23 10:00:05Z")

    @classmethod
    def spanning(cls, t0: float, t1: float, t0_text: str) -> "Clock":
        span = t1 - t0
        return cls(t0, "seconds" if span < 300 else "minutes" if span < 3 * 3600 else "hours", t0_text)

    def __call__(self, t: float) -> float:
        return (t - self.t0) / {"seconds": 1, "minutes": 60, "hours": 3600}[self.unit]

    def label(self, ax: "Axes") -> None:
        ax.set_xlabel(f"{self.unit} since {self.t0_text}", fontsize=8)


def telemetry_figure(samples: dict[str, list[dict[str, Any]]], markers: Sequence[Marker], clock: Clock) -> Plot | None:
    """GPU utilisation, memory and power per node (per GPU when few) from the sampler rows; host CPU % and memory
    when no row has GPU columns. None without rows. Utilisation axes run from 0 to 100 %, memory axes from 0 to the
    largest ``memory.total`` / ``host.memory.total`` sampled (scaled to the values when no total was sampled)."""
    rows = [r for node_rows in samples.values() for r in node_rows]
    if not rows:
        return None
    gpu = any(r.get("utilization.gpu") is not None for r in rows)
    if gpu:
        panels = [("utilization.gpu", "GPU utilisation %", 1.0, PERCENT),
                  ("memory.used", "GPU memory used GiB", 1 / 1024, _total(rows, "memory.total", 1 / 1024)),
                  ("power.draw", "GPU power W", 1.0, None)]
        lines = _gpu_lines(samples)
        title, note = "GPU utilisation, memory and power per node", None
    else:
        panels = [("host.cpu_pct", "host CPU %", 1.0, PERCENT),
                  ("host.memory.used", "host memory used GiB", 1 / 1024, _total(rows, "host.memory.total", 1 / 1024))]
        lines = {node: node_rows for node, node_rows in samples.items() if node_rows}
        title, note = "Host CPU and memory per node", "no GPU columns in the sampler CSVs: host CPU and memory instead"
    fig, axes = _figure(len(panels))
    for ax, (column, ylabel, scale, limits) in zip(axes, panels):
        drawn = 0
        for label, line_rows in lines.items():
            xs, ys = series(line_rows, "time", column, scale)
            if xs:  # on a fixed axis a line at its top (a CPU pinned at 100 %) is drawn over the frame, not under it
                ax.plot([clock(x) for x in xs], ys, linewidth=1.1, label=label, marker="o" if len(xs) < 30 else None,
                        markersize=3, zorder=3, clip_on=limits is None)
                drawn += 1
        if not drawn:
            _empty(ax, f"no {column} samples")
            continue
        if limits is not None:
            ax.set_ylim(*limits)
        _markers(ax, markers, clock)
        clock.label(ax)
        ax.set_ylabel(ylabel, fontsize=8)
        if drawn <= 10:
            ax.legend(fontsize=7, loc="best")
    return Plot("telemetry", title, _png(fig), WIDTH, HEIGHT, note)


def _gpu_lines(samples: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """label -> rows: one line per GPU when there are few, else one per node (the mean over its GPUs per sample)."""
    per_gpu: dict[str, list[dict[str, Any]]] = {}
    for node, rows in samples.items():
        for r in rows:
            if r.get("utilization.gpu") is not None or r.get("memory.used") is not None:
                index = r.get("index")
                per_gpu.setdefault(f"{node} gpu{int(index) if index is not None else '?'}", []).append(r)
    if len(per_gpu) <= MAX_LINES:
        return per_gpu
    out = {}
    for node, rows in samples.items():
        by_time: dict[float, list[dict[str, Any]]] = {}
        for r in rows:
            by_time.setdefault(round(r["time"], 0), []).append(r)
        out[node] = [{"time": t, **{c: _mean(g, c) for c in ("utilization.gpu", "memory.used", "power.draw")}}
                     for t, g in sorted(by_time.items())]
    return out


def _total(rows: list[dict[str, Any]], column: str, scale: float) -> tuple[float, float] | None:
    """The axis of a memory panel: 0 to the largest total sampled (None without one)."""
    totals = [v for v in (_number(r.get(column)) for r in rows) if v is not None and v > 0]
    return (0.0, max(totals) * scale) if totals else None


def _mean(rows: list[dict[str, Any]], column: str) -> float | None:
    values = [r[column] for r in rows if r.get(column) is not None]
    return sum(values) / len(values) if values else None


def progress_figure(rows: Sequence[dict[str, Any]], checkpoints: Sequence[tuple[float, int]],
                    markers: Sequence[Marker], clock: Clock) -> Plot | None:
    """Steps against wall-clock minutes, each checkpoint a dot at its save time, events as lines; None when no
    metrics row has a time."""
    xs, ys = series(rows, "time", "step")
    if not xs:
        return None
    fig, axes = _figure(1)
    ax = axes[0]
    ax.plot([clock(x) for x in xs], ys, color="#1f77b4", linewidth=1.4, label="logged step",
            marker="o" if len(xs) < 30 else None, markersize=3)
    if checkpoints:
        ax.scatter([clock(t) for t, _ in checkpoints], [s for _, s in checkpoints], color="#2ca02c", marker="s", s=28,
                   zorder=3, label="checkpoint saved")
    _markers(ax, markers, clock)
    clock.label(ax)
    ax.set_ylabel("step", fontsize=8)
    ax.legend(fontsize=7, loc="best")
    return Plot("progress", "Progress, checkpoints and events over time", _png(fig), WIDTH, HEIGHT)


def goodput_figure(attempts: Sequence["AttemptGoodput"]) -> Plot | None:
    """One horizontal bar per attempt, its node-time stacked by part (productive, restart overhead, checkpoint
    stalls, lost work, idle) in node-seconds, -minutes or -hours (whichever suits the longest); None without
    attempts."""
    if not attempts:
        return None
    longest = max(a.allocated_s * a.nodes for a in attempts)
    unit, div = ("seconds", 1) if longest < 600 else ("minutes", 60) if longest < 3 * 3600 else ("hours", 3600)
    fig, axes = _figure(1)
    ax = axes[0]
    ys = list(range(len(attempts)))
    left = [0.0] * len(attempts)
    for part, (label, color) in GOODPUT_PARTS.items():
        widths = [a.part_s(part) * a.nodes / div for a in attempts]
        ax.barh(ys, widths, left=left, color=color, height=0.6, label=label, zorder=2)
        left = [x + w for x, w in zip(left, widths)]
    ax.set_yticks(ys, [_attempt_label(i, a, len(attempts) <= MAX_BAR_LABELS) for i, a in enumerate(attempts)],
                  fontsize=8)
    ax.invert_yaxis()  # the first attempt on top
    ax.set_xlabel(f"node-{unit} of the allocation", fontsize=8)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside upper center", ncols=len(GOODPUT_PARTS), fontsize=7)
    return Plot("goodput", "Goodput: where each attempt's allocated node-time went", _png(fig), WIDTH, HEIGHT)


def _attempt_label(i: int, a: "AttemptGoodput", detailed: bool) -> str:
    if not detailed:
        return str(i + 1)
    return f"{i + 1}: {a.job_id or '-'} ({a.outcome})"
