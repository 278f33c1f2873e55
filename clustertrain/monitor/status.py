"""One row per model of a project: where its run stands (``clustertrain status``, the report's summary).

Read from the run directory (``run.json``, ``status.json``, ``usage.json``, ``metrics.jsonl``, ``config.yaml``,
checkpoints, events; formats: :mod:`clustertrain.core.run_records`, :mod:`clustertrain.core.run_events`) and, for Slurm
runs, the job as the launch stage sees it (handed in as a :class:`~clustertrain.launch.backend.JobStatus`, e.g. by
:func:`clustertrain.launch.overview.newest_jobs`; this module does not query Slurm and does not import launch;
for a Megatron model, :mod:`clustertrain.megatron.logs` reads ``jobs.jsonl`` for the jobs' output files).

A run is a Slurm run when a job is handed in for it (its directory has ``jobs.jsonl``), else a local run:

- **Slurm**: the job's state wins while it is queued or running (PENDING -> queued, RUNNING -> running; either
  after a restart, ``extra["restarts"] > 0`` -> requeued); a pending job's Slurm ``Reason`` (``extra["reason"]``, else
  the parenthesis of ``detail``) is ``pending_reason``. Once it ended, ``status.json`` and the job's end
  state (the batch script's end marker, already folded into the JobStatus) tell completed / stopped / failed;
  CANCELLED (scancel) is cancelled (``failed`` for the exit code), TIMEOUT and every other end count as failed. A
  job Slurm forgot that left no end marker (``extra["source"] == "run-dir"``) is named in ``missing``; ``status.json``
  then decides if it is final.
- **local**: ``status.json`` (or, when it is older or absent, ``usage.json``'s last attempt): COMPLETED, STOPPED,
  FAILED as written; RUNNING is checked: rank 0 on this host whose pid is gone (or reused by a younger process)
  -> failed, "rank 0 (pid N) is gone without a final state"; on another host -> running, with the age of its last
  heartbeat (``Attempt.last``). No run directory or no ``run.json`` -> not started.

Figures: step, loss, tokens/s and MFU from the last row of ``metrics.jsonl`` (for a Megatron model, with its project
handed in, Megatron's new iteration lines are first ingested into it: :mod:`clustertrain.megatron.logs`; what cannot
be read is named in ``missing``); the measured step time is the median
``step_time_s`` of the last :data:`STEP_TIME_ROWS` rows; ETA = (max_steps - step) x step time while its ranks run
(running, or requeued and running again; never while a job is pending); ``max_steps`` from the run's
``config.yaml``, else the project.
GPU-hours over every attempt of ``usage.json`` (a running attempt counts to now), cost = GPU-hours x the plan's
price per GPU-hour (:func:`gpu_hour_prices`). Alarms: the events of the current attempt (time >= its start),
one short line per rank/GPU and kind, errors first (records such as ``checkpoint`` and ``info`` events are not alarms).
Goodput (rules: :mod:`clustertrain.monitor.goodput`); restarts: of a Slurm run, its job's (``extra["restarts"]``:
requeues + resubmissions so far, continuations after the time limit and failure restarts alike, the ``restart N``
its batch script prints (its log tells the two apart: docs/slurm.md); for a job that cannot be asked, what
``jobs.jsonl`` last recorded), of a local run, attempts - 1 (every start of its ranks after the first); the newest
incident of the current attempt, the last preemption save and the project's suspect nodes
(:mod:`clustertrain.monitor.resilience`). Whatever cannot be read leaves its fields None and is named in
``missing``; nothing here raises on a damaged run directory.
"""

from __future__ import annotations

import socket
import statistics
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clustertrain.core.errors import ClusterTrainError
from clustertrain.monitor.goodput import Goodput, run_goodput
from clustertrain.core.run_events import Attempt, Event, Severity, read_events, read_jsonl_counted, read_usage
from clustertrain.monitor.resilience import (RECORD_KINDS, incident_since, newest_incident, preempt_line,
                                             project_suspects)
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.run_records import RunStatus, read_run_info, read_status
from clustertrain.core.schema import read_yaml
from clustertrain.core.states import State
from clustertrain.monitor.trackers import read_ids, read_tracker_links

if TYPE_CHECKING:
    from clustertrain.launch.backend import JobStatus
    from clustertrain.project import Project
    from clustertrain.plan.plan import Plan

#: the states a model is shown in
QUEUED, RUNNING, COMPLETED, FAILED, STOPPED, REQUEUED, NOT_STARTED, CANCELLED = (
    "queued", "running", "completed", "failed", "stopped", "requeued", "not started", "cancelled")
#: logged rows whose median step_time_s is the measured step time
STEP_TIME_ROWS = 5
_LIVE = (QUEUED, RUNNING, REQUEUED)


@dataclass
class ModelStatus:
    model: str
    run_dir: Path
    state: str                              # one of the constants above
    step: int | None = None
    max_steps: int | None = None
    loss: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    step_time_s: float | None = None        # measured: median of the last logged steps
    eta_s: float | None = None              # (max_steps - step) x step_time_s while the ranks run (never while pending)
    gpu_hours: float | None = None          # over every attempt (usage.json)
    cost_usd: float | None = None           # gpu_hours x the plan's price per GPU-hour (None without a price)
    checkpoint: str | None = None           # the latest complete checkpoint's directory
    checkpoint_age_s: float | None = None
    job_id: str | None = None
    nodes: list[str] = field(default_factory=list)
    restarts: int = 0
    alarms: list[str] = field(default_factory=list)   # open alarms, one short line each
    missing: list[str] = field(default_factory=list)  # what could not be read ("metrics", "job", ...)
    message: str | None = None              # why it failed, or a note
    backend: str = "local"                  # local | slurm: how this run was started (jobs.jsonl or not)
    job_state: str | None = None            # the job's state as its backend says (PENDING, CANCELLED, TIMEOUT...)
    job_detail: str | None = None           # the backend's own words, e.g. "CANCELLED" or "PENDING (Resources)"
    pending_reason: str | None = None       # while the job waits in the queue: Slurm's Reason (Resources, BeginTime...)
    exit_code: int | None = None            # the job's exit code once it ended
    host: str | None = None                 # rank 0's node (usage.json)
    heartbeat_age_s: float | None = None    # seconds since rank 0 was last seen alive (usage.json)
    price_per_gpu_hour: float | None = None
    goodput: Goodput | None = None          # where the allocated node-hours went (clustertrain.monitor.goodput)
    incident: dict[str, Any] | None = None  # the newest incident of the current attempt: kind, message, time, dir
    preempt_save: str | None = None         # the last preemption save in one line (clustertrain.monitor.resilience)
    suspects: list[dict[str, Any]] = field(default_factory=list)  # the project's active suspect nodes
    trackers: list[dict[str, Any]] = field(default_factory=list)  # the model's tracker runs: tracker, run_id, url, note

    @property
    def failed(self) -> bool:
        """Failed, or cancelled (a cancelled job did not finish its run either: ``status`` exits 1 for both)."""
        return self.state in (FAILED, CANCELLED)

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready values (paths as strings)."""
        return {**asdict(self), "run_dir": str(self.run_dir)}


def model_status(name: str, run_dir: Path, job: "JobStatus | None" = None, *, max_steps: int | None = None,
                 price_per_gpu_hour: float | None = None, now: float | None = None,
                 host: str | None = None, project: "Project | None" = None) -> ModelStatus:
    """Where model ``name``'s run in ``run_dir`` stands (rules in the module docstring). ``job``: its newest Slurm
    job (None: a local run); ``max_steps``: the project's, used when the run has no ``config.yaml``; ``host``: the
    name of this machine (default ``socket.gethostname()``), for the local liveness check; ``project``: the model's
    project (a Megatron model's output is then ingested into ``metrics.jsonl`` first)."""
    now = time.time() if now is None else now
    paths = RunPaths(Path(run_dir))
    st = ModelStatus(name, paths.root, NOT_STARTED, max_steps=max_steps, price_per_gpu_hour=price_per_gpu_hour,
                     backend="local" if job is None else "slurm")
    if not _prepared(paths, st) and job is None:
        return st
    if project is not None:
        _ingest_megatron(paths, project, name, st)
    st.max_steps = _max_steps(paths, name, st) or max_steps
    run = _run_status(paths, st)
    usage = read_usage(paths)
    if paths.usage.is_file() and not usage.attempts:
        st.missing.append("usage.json: damaged or empty")
    last = usage.attempts[-1] if usage.attempts else None
    logged = _progress(paths, st, run, last)
    if job is not None and job.state != State.UNKNOWN:
        live = _state_from_job(st, job, run, last)
    else:
        if job is not None:  # a Slurm run whose job could not be asked about: judge by the run directory
            st.job_id, st.job_state = job.job_id, None
            st.missing.append(f"job {job.job_id}: {job.detail or 'state unknown'}")
            st.restarts = _recorded_restarts(paths, job.job_id)
        live = _state_from_run(paths, st, run, last, host or socket.gethostname(), now)
    if last is not None:
        st.host = st.host or last.host
        st.nodes = st.nodes or list(last.nodes)
        if job is None:
            st.job_id = st.job_id or last.job_id
    if not logged and st.state not in (NOT_STARTED, QUEUED):
        st.missing.append("metrics.jsonl: no rows yet")
    _eta(st, live)
    _usage(st, usage.attempts, live, now)
    _checkpoint(paths, st, now)
    events = read_events(paths)
    st.alarms = alarms(events, since=last.started if last else None)
    st.goodput = run_goodput(paths, usage.attempts, events, live, now)
    if job is None:  # a local run: every start of its ranks after the first (a Slurm run: its job's own count)
        st.restarts = max(0, len(usage.attempts) - 1)
    st.incident = newest_incident(paths, incident_since(usage.attempts))
    st.preempt_save = preempt_line(events, usage.attempts, live)
    st.trackers = [asdict(link) for link in read_tracker_links(paths.root)]
    return st


def project_status(project: "Project", runs: Iterable[tuple[str, RunPaths | Path]],
                   jobs: Mapping[str, "JobStatus | None"] | None = None, now: float | None = None,
                   prices: Mapping[str, float | None] | None = None) -> list[ModelStatus]:
    """:func:`model_status` of each ``(model, run dir)`` of ``project``; ``jobs``: model -> its newest job (absent
    or None: a local run); ``prices``: model -> price per GPU-hour (default :func:`gpu_hour_prices`)."""
    prices = gpu_hour_prices(project) if prices is None else prices
    jobs = jobs or {}
    now = time.time() if now is None else now
    out = []
    for name, where in runs:
        root = where.root if isinstance(where, RunPaths) else Path(where)
        out.append(model_status(name, root, jobs.get(name), max_steps=project.model(name).training.max_steps,
                                price_per_gpu_hour=prices.get(name), now=now, project=project))
    suspects = project_suspects(project, now)
    for row in out:
        row.suspects = suspects
    return out


def gpu_hour_prices(project: "Project") -> dict[str, float | None]:
    """model -> the plan's price per GPU-hour (the instance's hourly price in the project's region / its GPUs;
    :func:`clustertrain.plan.plan.make_plan`), None where the plan has none (CPU runs, no price for the region)."""
    from clustertrain.plan.plan import make_plan

    try:
        plan = make_plan(project)
    except ClusterTrainError:
        return {}
    return plan_gpu_hour_prices(plan)


def plan_gpu_hour_prices(plan: "Plan") -> dict[str, float | None]:
    """:func:`gpu_hour_prices` from a plan already made."""
    cluster = plan.cluster
    flat = cluster.price_per_hour / cluster.gpus_per_node if cluster.price_per_hour and cluster.gpus_per_node else None
    out: dict[str, float | None] = {}
    for m in plan.models:
        out[m.name] = m.cost_usd / m.gpu_hours if m.cost_usd is not None and m.gpu_hours else flat
    return out


def any_failed(rows: Iterable[ModelStatus]) -> bool:
    return any(r.failed for r in rows)


# -- the run directory --------------------------------------------------------------------------------------------


def _prepared(paths: RunPaths, st: ModelStatus) -> bool:
    """Whether the run was prepared (``run.json``); a damaged one counts, and is named."""
    try:
        return read_run_info(paths) is not None
    except ClusterTrainError:
        st.missing.append("run.json: damaged")
        return True
    except OSError:
        return False


def _ingest_megatron(paths: RunPaths, project: "Project", name: str, st: ModelStatus) -> None:
    """A Megatron model (``framework: megatron``): its new iteration lines into ``metrics.jsonl``
    (:func:`clustertrain.megatron.logs.ingest_megatron_log`); what cannot be read is one line in ``missing``."""
    entry = next((m for m in project.models if m.name == name), None)
    if entry is None or entry.framework != "megatron":
        return
    from clustertrain.megatron.logs import ingest_megatron_log, log_sources

    try:
        added = ingest_megatron_log(paths, entry, project, log_sources(paths))
    except (ClusterTrainError, OSError) as e:
        st.missing.append(f"Megatron's log not read: {e}")
        return
    if added:
        _send_megatron_rows(paths, project, name, st)


#: seconds a status call gives the trackers to take a Megatron model's new rows
MEGATRON_SEND_S = 10.0


def _send_megatron_rows(paths: RunPaths, project: "Project", name: str, st: ModelStatus) -> None:
    """The rows just ingested, sent to MLflow, which Megatron-LM core_v0.16.1 has no option for (W&B: Megatron's
    own ``--wandb-*`` options, :mod:`clustertrain.megatron.args`): a :class:`TrackerSender` opened at the last
    ingested step sends every row of ``metrics.jsonl`` the MLflow run has not taken (``trackers.json``'s
    ``sent_step``), then finishes within :data:`MEGATRON_SEND_S`. A failure is one line in ``missing``."""
    trackers = project.monitor.trackers
    if trackers.mlflow is None:
        return
    last = None
    for row in read_jsonl_counted(paths.metrics)[0]:
        if isinstance(row.get("step"), int):
            last = row["step"] if last is None else max(last, row["step"])
    if last is None or last <= int(read_ids(paths.root).get("sent_step") or 0):
        return
    from clustertrain.monitor.trackers import TrackerSender

    warnings: list[str] = []
    only_mlflow = trackers.model_copy(update={"wandb": None})
    sender = TrackerSender.open(only_mlflow, project.name, name, paths.root, last, {}, warnings.append, ingest=True)
    if sender is not None:
        sender.finish("RUNNING", timeout_s=MEGATRON_SEND_S)
    st.missing += [f"tracker: {w}" for w in warnings[:1]]


def _recorded_restarts(paths: RunPaths, job_id: str) -> int:
    """The restarts ``jobs.jsonl`` last recorded for a job that cannot be asked about now (0 when none)."""
    from clustertrain.core.job_records import find_record

    try:
        record = find_record(paths, job_id)
    except (ClusterTrainError, OSError):
        return 0
    return record.restarts if record is not None else 0


def _max_steps(paths: RunPaths, name: str, st: ModelStatus) -> int | None:
    if not paths.config.is_file():
        return None
    try:
        raw = read_yaml(paths.config)
        entry = next(m for m in raw["models"] if isinstance(m, dict) and m.get("name") == name)
        return int(entry["training"]["max_steps"])
    except (ClusterTrainError, KeyError, TypeError, ValueError, StopIteration):
        st.missing.append("config.yaml: no models[].training.max_steps for this model")
        return None


def _run_status(paths: RunPaths, st: ModelStatus) -> RunStatus | None:
    try:
        return read_status(paths)
    except ClusterTrainError:
        st.missing.append("status.json: damaged")
        return None


def _progress(paths: RunPaths, st: ModelStatus, run: RunStatus | None, last: Attempt | None) -> bool:
    """Step, loss, speed from ``metrics.jsonl`` (else the step from status.json/usage.json); whether it has rows."""
    rows, damaged = read_jsonl_counted(paths.metrics)
    if damaged:
        st.missing.append(f"metrics.jsonl: {damaged} damaged line{'s' if damaged > 1 else ''} skipped")
    rows = [r for r in rows if isinstance(r.get("step"), int)]
    if rows:
        row = rows[-1]
        st.step = row["step"]
        st.loss, st.tokens_per_s, st.mfu = (_num(row.get(k)) for k in ("loss", "tokens_per_s", "mfu"))
        times = [t for t in (_num(r.get("step_time_s")) for r in rows[-STEP_TIME_ROWS:]) if t is not None and t > 0]
        st.step_time_s = statistics.median(times) if times else None
    else:
        st.step = run.step if run is not None else (last.step if last is not None else None)
    return bool(rows)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


# -- the state ----------------------------------------------------------------------------------------------------


def _state_from_job(st: ModelStatus, job: "JobStatus", run: RunStatus | None, last: Attempt | None) -> bool:
    """Set the state of a Slurm run from its job; return whether its ranks run now."""
    extra = job.extra or {}
    st.job_id, st.job_detail, st.exit_code = job.job_id, job.detail or None, job.exit_code
    st.job_state = str(job.state)
    st.restarts = int(extra.get("restarts") or 0)
    st.nodes = list(extra.get("nodes") or [])
    if job.state == State.PENDING:
        st.state = REQUEUED if st.restarts else QUEUED
        st.pending_reason = pending_reason(job)
        if st.restarts:
            why = f" ({st.pending_reason})" if st.pending_reason else ""
            st.message = f"restart {st.restarts}: pending again{why}"
        return False
    if job.state == State.RUNNING:
        st.state = REQUEUED if st.restarts else RUNNING
        if st.restarts:
            st.message = f"restart {st.restarts}: running again"
        return True
    final = run.state if run is not None and run.state in (State.COMPLETED, State.STOPPED, State.FAILED) else None
    if extra.get("source") == "run-dir":  # Slurm forgot the job and its script left no end marker
        st.job_state = None
        st.missing.append("job end state: Slurm forgot the job and it left no end marker")
        job_state = final or State.FAILED
    else:
        job_state = job.state
    if job_state == State.COMPLETED and final != State.FAILED:
        st.state = COMPLETED
    elif job_state == State.STOPPED and final != State.FAILED:
        st.state = STOPPED
        st.message = f"stopped at step {run.step}; submit again to resume" if run is not None else "stopped"
    elif job_state == State.CANCELLED and final != State.FAILED:  # scancel: by a user or an admin, not a failure
        st.state = CANCELLED
        exit_code = "" if job.exit_code is None else f", exit {job.exit_code}"
        again = "resume" if run is not None or last is not None else "start"
        st.message = f"job {job.job_id} {job.detail or job.state}{exit_code}; submit again to {again}"
    else:
        st.state = FAILED
        exit_code = "" if job.exit_code is None else f", exit {job.exit_code}"
        st.message = (run.message if final == State.FAILED and run is not None and run.message
                      else f"job {job.job_id} {job.detail or job.state}{exit_code}")
    if not st.nodes and last is not None and last.job_id == job.job_id:
        st.nodes = list(last.nodes)
    return False


def pending_reason(job: "JobStatus") -> str | None:
    """Why a pending job waits, in Slurm's words (``Resources``, ``Priority``, ``BeginTime``...): the JobStatus's
    ``extra["reason"]``, else the parenthesis of its ``detail`` (``PENDING (Resources)``); None when Slurm gives none."""
    reason = (job.extra or {}).get("reason")
    if not reason and job.detail and job.detail.endswith(")") and " (" in job.detail:
        reason = job.detail[job.detail.index(" (") + 2:-1]
    return str(reason) if reason and str(reason) != "None" else None


def _state_from_run(paths: RunPaths, st: ModelStatus, run: RunStatus | None, last: Attempt | None, host: str,
                    now: float) -> bool:
    """Set the state of a local run (or a Slurm run whose job is unknown) from its records; return whether its ranks
    run now."""
    newer_attempt = last is not None and (run is None or (run.time is not None and run.time < last.started - 1))
    state = last.state if newer_attempt else (run.state if run is not None else None)
    if state == State.COMPLETED:
        st.state = COMPLETED
        return False
    if state == State.STOPPED:
        st.state = STOPPED
        st.message = f"stopped at step {st.step}; run the same command again to resume"
        return False
    if state == State.FAILED:
        st.state = FAILED
        st.message = run.message if run is not None and not newer_attempt and run.message else "failed"
        return False
    if state == State.RUNNING:
        pid = last.pid if last is not None else run.pid  # type: ignore[union-attr]
        where = last.host if last is not None else None
        if last is not None:
            st.heartbeat_age_s = max(0.0, now - last.last)
        if where is not None and where != host:
            st.state = RUNNING
            st.message = f"on {where}: last heartbeat {human_duration(st.heartbeat_age_s or 0)} ago"
            return True
        started = last.started if last is not None else None
        if pid is not None and not pid_alive(pid, started):
            st.state = FAILED
            st.message = f"rank 0 (pid {pid}) is gone without a final state"
            return False
        st.state = RUNNING
        return True
    # nothing says how the ranks stand (a clustertrain from before status.json said RUNNING, or they have just begun)
    sign = _last_sign_of_life(paths)
    if sign is None:
        st.state = NOT_STARTED
        st.message = "prepared, but no rank has started"
        return False
    st.state = RUNNING
    st.missing.append("status.json and usage.json: none yet")
    st.message = f"assumed running: last output {human_duration(max(0.0, now - sign))} ago"
    return True


def pid_alive(pid: int, started: float | None = None) -> bool:
    """Whether process ``pid`` exists on this host and is not a zombie; with ``started``, also that it is no younger
    than that (a pid reused by a later process is not the rank)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return False
        return started is None or proc.create_time() <= started + 5
    except psutil.NoSuchProcess:  # also a zombie that psutil already saw as such
        return False
    except psutil.AccessDenied:  # it exists, but is not ours to inspect: count it alive
        return True


def _last_sign_of_life(paths: RunPaths) -> float | None:
    times = []
    for p in (paths.metrics, paths.rank_log(0)):
        try:
            times.append(p.stat().st_mtime)
        except OSError:
            continue
    return max(times) if times else None


# -- figures ------------------------------------------------------------------------------------------------------


def _eta(st: ModelStatus, live: bool) -> None:
    """The ETA while the ranks run; none while the job waits in the queue (queued, or requeued and pending: how long
    it waits is Slurm's to say, ``pending_reason``) and none once it ended."""
    if not live or st.state not in _LIVE or st.step is None or not st.max_steps or st.step_time_s is None:
        return
    st.eta_s = max(0, st.max_steps - st.step) * st.step_time_s


def _usage(st: ModelStatus, attempts: list[Attempt], live: bool, now: float) -> None:
    if not attempts:
        if st.state not in (NOT_STARTED, QUEUED):
            st.missing.append("usage.json: none (GPU-hours and cost unknown)")
        return
    st.gpu_hours = sum(a.gpu_hours(now, alive=live and a is attempts[-1]) for a in attempts)
    if st.price_per_gpu_hour is not None:
        st.cost_usd = st.gpu_hours * st.price_per_gpu_hour


def _checkpoint(paths: RunPaths, st: ModelStatus, now: float) -> None:
    from clustertrain.core.checkpoint_format import find_latest, read_meta

    try:
        latest = find_latest(paths.checkpoints)
    except OSError:
        st.missing.append("checkpoints: not readable")
        return
    if latest is None:
        return
    st.checkpoint = str(latest)
    try:
        saved = read_meta(latest).time
    except ClusterTrainError:
        saved = None
    if saved is None:
        try:
            saved = (latest / "meta.json").stat().st_mtime
        except OSError:
            return
    st.checkpoint_age_s = max(0.0, now - saved)


def alarms(events: list[Event], since: float | None = None) -> list[str]:
    """The open alarms among ``events`` (those at or after ``since``): one short line per kind and rank/node/GPU
    (the latest; "x N" when it recurred), errors first, then the newest."""
    groups: dict[tuple, list[Event]] = {}
    for e in events:
        if (since is None or e.time >= since) and e.kind not in RECORD_KINDS and e.severity != Severity.INFO:
            groups.setdefault((e.kind, e.rank, e.node, e.gpu, e.part), []).append(e)
    ordered = sorted(groups.values(), key=lambda g: (g[-1].severity != Severity.ERROR, -g[-1].time))
    return [alarm_line(g[-1]) + (f" x{len(g)}" if len(g) > 1 else "") for g in ordered]


def alarm_line(e: Event) -> str:
    """One event in a few words: "straggler rank 3 on node-2 (data)", "GPU 2 on node-1 hot (91 °C)"."""
    gpu = f"GPU {e.gpu}" + (f" on {e.node}" if e.node else "") if e.gpu is not None else (e.node or "a GPU")
    at = f" at step {e.step}" if e.step is not None else ""
    value = "" if e.value is None else f"{e.value:g}"
    lines = {
        "straggler": f"straggler rank {e.rank}" + (f" on {e.node}" if e.node else "") + (f" ({e.part})" if e.part else ""),
        "nonfinite": f"non-finite{at}: run stopped",
        "loss_spike": f"loss spike{at}" + (f" ({value})" if value else ""),
        "throughput_drop": f"tokens/s drop{at}",
        "gpu_temperature": f"{gpu} hot" + (f" ({e.value:.0f} °C)" if e.value is not None else ""),
        "gpu_throttle": f"{gpu} throttled",
        "gpu_ecc": f"{gpu} ECC errors",
        "gpu_xid": f"{gpu} XID" + (f" {value}" if value else ""),
        "sampler_failed": "sampler failed" + (f" on {e.node}" if e.node else ""),
        "hang": f"hang{at}" + (f": rank {e.rank}" if e.rank is not None else "") + (f" on {e.node}" if e.node else ""),
        "rank_lost": f"rank {e.rank} lost" + (f" on {e.node}" if e.node else "") + at,
        "node_suspect": f"{e.node} suspect",
    }
    return lines.get(e.kind) or f"{e.kind}: {e.message[:60]}"


def human_duration(seconds: float | None) -> str:
    """45s, 3m 07s, 2h 05m, 3d 04h ("-" for None)."""
    if seconds is None:
        return "-"
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"
