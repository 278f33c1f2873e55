"""The HTML run report (``clustertrain report PROJECT|RUN_DIR``): one self-contained file, every plot a base64 PNG
inside it, no script or style from anywhere else (its Content-Security-Policy allows none), so it opens offline.

What it reads per model, every part optional (a missing or damaged part is named in the model's "missing" box,
never an error): ``run.json`` and ``config.yaml`` (the project as the run resolved it: ``max_steps`` and the plan),
``status.json``, ``metrics.jsonl`` (a line cut by a kill is skipped; a Megatron model's new iteration lines are
ingested into it first, :mod:`clustertrain.megatron.logs`), ``timing/rank<R>.jsonl``, ``events.jsonl``
and ``monitor/<node>.events.jsonl``, ``usage.json``, ``monitor/<node>.csv`` and ``checkpoints/step_*/meta.json``
(formats: :mod:`clustertrain.core.run_events`, :mod:`clustertrain.monitor.samples`,
:mod:`clustertrain.train.checkpoint`, :mod:`clustertrain.core.run_records`).

What it shows per model: its state, progress, GPU-hours, cost and goodput as ``clustertrain status`` sees them
(:func:`clustertrain.monitor.status.model_status`, judged from the run directory: a report asks no Slurm
controller), where each attempt's allocated node-time went (:mod:`clustertrain.monitor.goodput`: a table and
:func:`~clustertrain.monitor.plots.goodput_figure`), the watchdog's incidents (``incidents/<id>/incident.json``,
:mod:`clustertrain.monitor.resilience`), the plan's prediction beside the measurement (step time: the median
``step_time_s`` after the first :data:`WARMUP_ROWS` logged rows; memory per GPU: the largest ``mem_allocated_gib``;
GPU-hours from ``usage.json``; cost = GPU-hours x the plan's price per GPU-hour), the figures of
:mod:`clustertrain.monitor.plots` (the slowest rank: :func:`slowest_rank`), the events and the checkpoints; then a
summary table across models, the project's goodput over them and its suspect nodes
(:mod:`clustertrain.monitor.suspects`; for a run directory, the project of its ``config.yaml``).

A project without GPUs (``cluster.gpus_per_node: 0``, CPU workers) is shown in its own units: CPU-hours (its ranks x
wall-clock hours: what ``usage.json`` counts for it) instead of GPU-hours, memory per rank instead of per GPU.

Where it is written by default (:attr:`Report.default_output`): ``RUN_DIR/report.html`` for a run directory,
``<outputs>/<project>/report.html`` for a project (``storage.outputs``, else ``storage.root``: beside the models'
run directories), always atomically.
"""

from __future__ import annotations

import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clustertrain.core.errors import ClusterTrainError, ConfigError, RunDirError
from clustertrain.monitor import plots
from clustertrain.monitor.goodput import Goodput
from clustertrain.core.run_events import PARTS, Event, TimingRow, Usage, read_events, read_jsonl, read_timing, read_usage
from clustertrain.monitor.resilience import project_suspects, read_incidents
from clustertrain.monitor.samples import read_samples
from clustertrain.monitor.status import NOT_STARTED, ModelStatus, human_duration, model_status, plan_gpu_hour_prices
from clustertrain.core.run_paths import RunPaths, write_atomic
from clustertrain.core.run_records import UNKNOWN_VERSION, read_resolved_config, read_run_info

if TYPE_CHECKING:
    from clustertrain.plan.plan import ModelPlan, Plan
    from clustertrain.project import Project

#: logged rows left out of the measured step time (start-up, compilation, warm caches)
WARMUP_ROWS = 2
GIB = 2**30
NO_MFU = "no MFU recorded: it is null on CPU workers and on GPUs without a known bf16 peak"


@dataclass
class Checkpoint:
    step: int
    time: float | None
    path: Path


@dataclass
class ModelData:
    """Everything the report shows of one model, read from its run directory."""

    name: str
    run_dir: Path
    summary: ModelStatus | None = None       # state, progress, GPU-hours, cost: clustertrain.monitor.status
    metrics: list[dict[str, Any]] = field(default_factory=list)
    timing: dict[int, list[TimingRow]] = field(default_factory=dict)
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    plan: "ModelPlan | None" = None
    plan_note: str | None = None             # why there is no planned figure (infeasible, no config ...)
    price_per_gpu_hour: float | None = None
    missing: list[str] = field(default_factory=list)
    plots: list[plots.Plot] = field(default_factory=list)
    incidents: list[dict[str, Any]] = field(default_factory=list)  # every incident.json, oldest first
    goodput_plot: plots.Plot | None = None
    gpus_per_node: int | None = None         # the project's cluster.gpus_per_node (0: CPU workers; None: unknown)

    @property
    def trackers(self) -> list[dict[str, Any]]:
        """The model's tracker runs (``RUN_DIR/trackers.json``): tracker, run_id, note, and ``href`` for an http(s) URL
        (nothing else becomes a link)."""
        runs = self.summary.trackers if self.summary else []
        return [{**t, "href": t["url"] if str(t.get("url") or "").startswith(("http://", "https://")) else None}
                for t in runs]

    @property
    def cpu(self) -> bool:
        """Trains on CPU workers: its hours are CPU-hours (ranks x hours) and its memory is per rank."""
        return self.gpus_per_node == 0

    @property
    def hours_unit(self) -> str:
        return "CPU-hours" if self.cpu else "GPU-hours"

    @property
    def goodput(self) -> Goodput | None:
        return self.summary.goodput if self.summary else None

    @property
    def last(self) -> dict[str, Any]:
        return self.metrics[-1] if self.metrics else {}

    @property
    def step_time_s(self) -> float | None:
        values = [r["step_time_s"] for r in self.metrics[WARMUP_ROWS:] or self.metrics
                  if isinstance(r.get("step_time_s"), (int, float))]
        return statistics.median(values) if values else None

    @property
    def memory_gib(self) -> float | None:
        values = [r["mem_allocated_gib"] for r in self.metrics if isinstance(r.get("mem_allocated_gib"), (int, float))]
        return max(values) if values else None

    @property
    def state(self) -> str:
        return self.summary.state if self.summary else NOT_STARTED

    @property
    def max_steps(self) -> int | None:
        return self.summary.max_steps if self.summary else None

    @property
    def message(self) -> str | None:
        return self.summary.message if self.summary else None

    @property
    def gpu_hours(self) -> float | None:
        return self.summary.gpu_hours if self.summary else None

    @property
    def cost_usd(self) -> float | None:
        return self.summary.cost_usd if self.summary else None

    @property
    def slowest_rank(self) -> int | None:
        return slowest_rank(self.timing, self.metrics)

    @property
    def t0(self) -> float | None:
        """When the run started (the first attempt, else the first metrics row or sample): the time plots' zero."""
        starts = [a.started for a in self.usage.attempts]
        starts += [r["time"] for r in self.metrics[:1] if isinstance(r.get("time"), (int, float))]
        starts += [rows[0]["time"] for rows in self.samples.values() if rows]
        return min(starts) if starts else None

    def comparison(self) -> list[tuple[str, str, str, str]]:
        """The plan beside the measurement: (quantity, planned, measured, measured / planned)."""
        p = self.plan
        mem_plan = p.memory["total"] / GIB if p is not None and p.memory else None
        rows = [
            ("step time", seconds(p.step_time_s if p else None), seconds(self.step_time_s),
             _ratio(self.step_time_s, p.step_time_s if p else None)),
            ("memory per rank" if self.cpu else "memory per GPU", _num(mem_plan, "{:.2f} GiB"),
             _num(self.memory_gib, "{:.2f} GiB"), _ratio(self.memory_gib, mem_plan)),
            (f"{self.hours_unit} (planned: whole run; measured: so far)", _num(p.gpu_hours if p else None, "{:,.3f}"),
             _num(self.gpu_hours, "{:,.3f}"), "-"),
            ("cost (planned: whole run; measured: so far)", _num(p.cost_usd if p else None, "${:,.2f}"),
             _num(self.cost_usd, "${:,.2f}"), "-"),
        ]
        return rows


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def seconds(value: float | None) -> str:
    """A duration for people: ``630 ms``, ``2.00 s``, ``1,234 s``; None is ``-``."""
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.3g} ms"
    return f"{value:.2f} s" if value < 100 else f"{value:,.0f} s"


def span(value: float | None) -> str:
    """A part of an attempt's time: ``0 s``, :func:`seconds` below a minute, else ``3m 07s``, ``2h 05m`` (``-`` for
    None)."""
    if value == 0:
        return "0 s"
    return seconds(value) if value is None or value < 60 else human_duration(value)


def _ratio(measured: float | None, planned: float | None) -> str:
    return "-" if measured is None or not planned else f"{measured / planned:.2f}x"


def slowest_rank(timing: dict[int, list[TimingRow]], metrics: list[dict[str, Any]]) -> int | None:
    """The rank rank 0 named most often in ``slowest_rank`` of its metrics rows; without those, the rank whose mean
    time in a part (:data:`~clustertrain.core.run_events.PARTS`) is the largest multiple of the median over ranks."""
    named = Counter(r["slowest_rank"] for r in metrics if isinstance(r.get("slowest_rank"), int))
    if named:
        return named.most_common(1)[0][0]
    if len(timing) < 2:
        return None
    best, score = None, 0.0
    for part in PARTS:
        means = {rank: statistics.fmean(getattr(r, f"{part}_s") for r in rows) for rank, rows in timing.items()}
        median = statistics.median(means.values())
        for rank, mean in means.items():
            ratio = mean / median if median > 0 else 0.0
            if ratio > score:
                best, score = rank, ratio
    return best


@dataclass
class Report:
    """The report of a project (every model) or of one run directory."""

    title: str
    source: Path
    default_output: Path
    models: list[ModelData]
    generated: float = field(default_factory=time.time)
    suspects: list[dict[str, Any]] | None = None  # the project's active suspect nodes (None: no project to ask)

    @property
    def hours_unit(self) -> str:
        """The summary's unit: CPU-hours when every model trains on CPU workers, else GPU-hours."""
        return "CPU-hours" if self.models and all(m.cpu for m in self.models) else "GPU-hours"

    @property
    def goodput(self) -> Goodput:
        """Over every attempt of every model."""
        return Goodput.combine(m.goodput for m in self.models)


# -- gathering --------------------------------------------------------------------------------------


def gather(path: Path, overrides: list[str] | None = None) -> Report:
    """The report of ``path``: a run directory (with ``run.json``) or a project file (every model's run directory
    from the storage layout; ``overrides`` are its ``--set`` items). Anything else is one :class:`RunDirError`."""
    from clustertrain.core.storage_layout import require_mounted, storage_layout
    from clustertrain.project import read_project

    path, now = Path(path), time.time()
    if path.is_dir() and RunPaths(path).run_json.is_file():
        if overrides:
            raise ConfigError(f"--set applies to a project file; {path} is a run directory (its config.yaml is what "
                              "the run used): pass the project file instead")
        paths = RunPaths(path)
        model, project, missing = _run_dir_identity(paths)
        data = gather_model(paths, model, project, _plan(project), missing, now)
        title = f"{project.name} / {model}" if project else model
        suspects = project_suspects(project, now) if project else None
        return Report(title, path, paths.root / "report.html", [data], now, suspects)
    if not path.is_file():
        raise RunDirError(f"{path}: neither a run directory (no run.json) nor a project file; pass a run directory "
                          "written by `clustertrain run`/`submit` or the project's YAML file")
    project = read_project(path, overrides or [])
    layout = storage_layout(project)
    require_mounted(project, layout.outputs, "the run report", f"clustertrain report {path}")
    plan = _plan(project)
    models = [gather_model(RunPaths(layout.run_dir(e.name)), e.name, project, plan, now=now) for e in project.models]
    return Report(project.name, path, layout.outputs / project.name / "report.html", models, now,
                  project_suspects(project, now))


def _run_dir_identity(paths: RunPaths) -> tuple[str, "Project | None", list[str]]:
    """The model name and resolved project of a run directory, and what of them could not be read."""
    from clustertrain.project import Project

    missing = []
    try:
        info = read_run_info(paths)
    except RunDirError as e:
        info, missing = None, [f"run.json: {e}"]
    model = info.model if info else paths.root.name
    try:
        project, _ = read_resolved_config(paths.config, Project, info.clustertrain if info else UNKNOWN_VERSION)
    except ClusterTrainError as e:
        return model, None, [*missing, f"config.yaml: {e}"]
    return model, project, missing


def _plan(project: "Project | None") -> "Plan | str | None":
    """The project's plan, or the one line why there is none."""
    if project is None:
        return None
    from clustertrain.plan.plan import make_plan

    try:
        return make_plan(project)
    except ClusterTrainError as e:
        return f"no plan: {e}"


def gather_model(paths: RunPaths, name: str, project: "Project | None", plan: "Plan | str | None",
                 missing: list[str] | None = None, now: float | None = None) -> ModelData:
    """Read one model's run directory (see the module docstring) and draw its figures."""
    now = time.time() if now is None else now
    m = ModelData(name=name, run_dir=paths.root, missing=list(missing or []),
                  gpus_per_node=project.cluster.gpus_per_node if project else None)
    entry = next((e for e in project.models if e.name == name), None) if project else None
    _attach_plan(m, plan)
    # the run's own config.yaml gives max_steps as it was started (its --set included), else the project's
    m.summary = model_status(name, paths.root, None, max_steps=entry.training.max_steps if entry else None,
                             price_per_gpu_hour=m.price_per_gpu_hour, now=now, project=project)
    if not paths.root.is_dir():
        m.missing.append(f"run directory: the model has not started (no {paths.root})")
        return m
    m.metrics = [r for r in read_jsonl(paths.metrics) if isinstance(r.get("step"), int)]
    m.timing = read_timing(paths)
    m.events = read_events(paths)
    m.usage = read_usage(paths)
    if paths.monitor.is_dir():
        m.samples = {f.stem: read_samples(f) for f in sorted(paths.monitor.glob("*.csv"))}
    m.checkpoints = _checkpoints(paths, m.missing)
    m.incidents = read_incidents(paths)
    for part, present in (("metrics.jsonl", m.metrics), ("timing/rank<R>.jsonl", m.timing),
                          (f"usage.json (no {m.hours_unit}, no cost)", m.usage.attempts),
                          ("monitor/<node>.csv (no node telemetry)", any(m.samples.values())),
                          ("checkpoints", m.checkpoints)):
        if not present:
            m.missing.append(part)
    named = {_subject(x) for x in m.missing}  # and what the status read found damaged beyond that
    m.missing += [x for x in m.summary.missing if _subject(x) not in named]
    m.plots = _figures(m)
    m.goodput_plot = plots.goodput_figure(m.goodput.attempts) if m.goodput else None
    return m


def _subject(missing: str) -> str:
    """The file a line of ``missing`` is about: ``metrics.jsonl: 1 damaged line skipped`` -> ``metrics.jsonl``."""
    return re.split(r"[: (]", missing, maxsplit=1)[0]


def _attach_plan(m: ModelData, plan: "Plan | str | None") -> None:
    if plan is None:
        m.plan_note = "no plan: the run's config.yaml could not be read"
    elif isinstance(plan, str):
        m.plan_note = plan
    else:
        mp = next((x for x in plan.models if x.name == m.name), None)
        m.plan = mp
        if mp is None:
            m.plan_note = f"the plan has no model {m.name!r}"
        elif not mp.feasible:
            m.plan_note = "plan infeasible: " + "; ".join(mp.reasons)
        elif mp.step_time_s is None:
            m.plan_note = "the plan has no step time (CPU workers: `clustertrain plan --calibrate` estimates one)"
        m.price_per_gpu_hour = plan_gpu_hour_prices(plan).get(m.name)
        if m.price_per_gpu_hour is None and m.plan_note is None:
            m.plan_note = plan.cluster.price_note or "the plan has no price (no cost)"


def _checkpoints(paths: RunPaths, missing: list[str]) -> list[Checkpoint]:
    from clustertrain.core.checkpoint_format import complete_checkpoints, read_meta

    out = []
    for path in complete_checkpoints(paths.checkpoints):
        try:
            meta = read_meta(path)
        except ClusterTrainError as e:
            missing.append(f"checkpoint {path.name}: {e}")
            continue
        out.append(Checkpoint(meta.step, meta.time, path))
    return out


def _figures(m: ModelData) -> list[plots.Plot]:
    P = plots.Panel
    step_marks = [plots.Marker(c.step, c.path.name, "checkpoint") for c in m.checkpoints]
    step_marks += [plots.Marker(e.step, e.kind, str(e.severity)) for e in m.events if e.step is not None]
    time_marks = [plots.Marker(c.time, c.path.name, "checkpoint") for c in m.checkpoints if c.time]
    time_marks += [plots.Marker(e.time, e.kind, str(e.severity)) for e in m.events]
    figures = [
        plots.step_figure("loss_lr", "Loss and learning rate", m.metrics,
                          [P("loss", "loss"), P("lr", "learning rate")], step_marks),
        plots.step_figure("throughput", "Tokens/s and MFU", m.metrics,
                          [P("tokens_per_s", "tokens/s"), P("mfu", "MFU %", 100.0, NO_MFU, plots.PERCENT)], step_marks),
        plots.step_figure("grad_norm", "Gradient norm and step time", m.metrics,
                          [P("grad_norm", "grad norm"), P("step_time_s", "step time s")], step_marks),
        plots.ranks_figure(m.timing, m.slowest_rank, {r: rows[-1].node for r, rows in m.timing.items()}),
    ]
    t0 = m.t0
    if t0 is not None:
        ends = [t0, *(mk.x for mk in time_marks), *(r["time"] for rows in m.samples.values() for r in rows[-1:])]
        ends += [r["time"] for r in m.metrics[-1:] if isinstance(r.get("time"), (int, float))]
        clock = plots.Clock.spanning(t0, max(ends), utc(t0))
        figures.append(plots.telemetry_figure(m.samples, time_marks, clock))
        figures.append(plots.progress_figure(m.metrics, [(c.time, c.step) for c in m.checkpoints if c.time],
                                             time_marks, clock))
    return [f for f in figures if f is not None]


# -- the page ---------------------------------------------------------------------------------------


def utc(t: float | None) -> str:
    return "-" if t is None else datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def render_html(report: Report) -> str:
    """The report as one HTML page (the Jinja2 template ``templates/report.html.j2``, HTML-escaped)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
                             autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["utc"] = utc
    env.filters["num"] = _num
    env.filters["seconds"] = seconds
    env.filters["duration"] = human_duration
    env.filters["span"] = span
    return env.get_template("report.html.j2").render(report=report, parts=PARTS, goodput_parts=plots.GOODPUT_PARTS)


def write_report(path: Path, overrides: list[str] | None = None, output: Path | None = None) -> tuple[Path, Report]:
    """Gather the report of ``path`` (a run directory or a project file), write it atomically to ``output`` (default:
    :attr:`Report.default_output`) and return where it went and what it holds."""
    report = gather(path, overrides)
    target = Path(output) if output is not None else report.default_output
    if target.is_dir():
        raise ConfigError(f"{target}: is a directory; pass the report's file name, e.g. -o {target / 'report.html'}")
    write_atomic(target, render_html(report))
    return target, report
