"""Sending a model's run to the experiment trackers of ``monitor.trackers`` (MLflow, W&B) from rank 0, beside
``metrics.jsonl``: :class:`TrackerSender`, and the run directory's record of the tracker runs, ``trackers.json``.

**The step path only enqueues.** :meth:`TrackerSender.row`, :meth:`~TrackerSender.note` and
:meth:`~TrackerSender.checkpoint` append to a bounded in-memory queue (``monitor.trackers.queue_rows``; beyond it the
oldest item is dropped and counted) and return. One background thread per run owns the clients
(:mod:`clustertrain.monitor.tracker_clients`, whose libraries it imports itself), wakes every :data:`FLUSH_S`, and
sends each tracker its backlog in small batches. It also forwards what the run records elsewhere, so that nothing
has to call it twice: new events of ``RUN_DIR/events.jsonl`` and of the node samplers'
``monitor/<node>.events.jsonl`` (alarms, stop signals, preemption saves, GPU events; not the routine ``checkpoint``
events, which :meth:`~TrackerSender.checkpoint` sends with the checkpoint's path) as notes, and a summary of the
samplers' new ``monitor/<node>.csv`` rows (:mod:`clustertrain.monitor.samples`) with each row, as
``node/<node>/gpu_util_pct``, ``node/<node>/gpu_mem_mib`` and ``node/<node>/cpu_pct`` (means over the samples
since the previous row). :meth:`~TrackerSender.note` is for what is not in those files.

**A tracker that fails** (unreachable at start or later, slow, erroring) costs one ``on_warning`` call (the trainer
records it as a ``tracker_down`` warning event); its items stay queued (bounded by ``queue_rows`` per tracker) and
are retried every :data:`RETRY_S` .. :data:`RETRY_MAX_S`. A recovery is one stderr line. Rows a tracker never
took before the attempt's start step (it was down when the previous attempt ended, or was not configured yet) are
sent first at the next attempt, from ``metrics.jsonl``, with the attempt that trained them (``starts``). At
:meth:`~TrackerSender.finish` the thread gets ``timeout_s`` to send what is left and end the runs; what was not
sent is counted (rows, first and last step) in ``trackers.json`` (``unsent``: this attempt's; ``unsent_by_attempt``:
each attempt's, kept) and on stderr (and through ``on_warning`` for a tracker that was never reported down, e.g. rows
dropped at the bound).

**W&B rows count once written, not once logged.** ``run.log`` returns once wandb-core has the row; wandb-core writes
it to the run's ``.wandb`` file later (every ``x_transaction_log_flush_interval``). A Slurm requeue (``scontrol
requeue``, ``scancel``, a time limit) sends SIGTERM to every process of the job, wandb-core too (``SIG_IGN`` in the
rank does not keep it alive): it exits at once, its file keeps its 7-byte header, and every row of the attempt is
gone although ``sent_step`` counted it. Hence (tests/integration/test_tracker_requeue.py, case ``scontrol``):

- the first ``ConnectionError`` from W&B in an attempt (its service died; the rank lives on, saving) starts the run
  again once (same id, ``resume="allow"``: a new service, offline a new ``offline-run-*`` directory) and sends the
  rows the dead service had logged (the latest ``queue_rows``; offline only those its file does not hold) before the
  backlog; no warning when that works;
- ``mode: offline``: at each attempt's start the earlier attempts' ``.wandb`` files are read
  (:mod:`clustertrain.monitor.wandb_files`), and every row of ``metrics.jsonl`` up to the start step whose step no
  file holds is sent again (``resent`` in ``trackers.json``);
- ``mode: online``: there is no file to check. Rows wait in wandb-core's memory until its file stream sends them
  (``x_file_stream_transmit_interval``; not set here: wandb-core's default); a service killed before then, with no
  rank left to start it again, loses them, and the next attempt cannot tell (it does not read the server's history).
  The restart above sends every kept row again: a row the server already had is then there twice, at the same
  step.

**One tracker run per training run.** ``RUN_DIR/trackers.json`` keeps the runs' ids; a later attempt (a resume, a
requeue, a resubmission, another layout) reopens them: the same MLflow run set RUNNING again, the same W&B id with
``resume="allow"``. Steps continue from the checkpoint's step. Rows the previous attempt sent past that step cannot
be taken back (MLflow keeps every metric point; W&B's steps only increase), so every row carries ``attempt`` (1, 2,
...) with the row's time as the point's timestamp, and the superseded range is a note and a tag
(``clustertrain.superseded`` / summary ``clustertrain/superseded``): "steps 31-37 of attempt 1 superseded by the
resume from step 30". Per step, the latest attempt's point (latest timestamp) is the one ``metrics.jsonl`` holds.

``trackers.json`` (written atomically with :func:`clustertrain.core.run_paths.write_atomic`; read leniently)::

    {"version": 1, "attempt": 2, "sent_step": 40,
     "trackers": {
       "mlflow": {"run_id": "9f1c...", "experiment_id": "1", "url": "http://mlflow:5000/#/experiments/1/runs/9f1c...",
                  "note": null, "tracking_uri": "http://mlflow:5000", "sent_step": 40,
                  "unsent": {"rows": 0, "first_step": null, "last_step": null},
                  "unsent_by_attempt": {"1": {...}, "2": {...}}},
       "wandb": {"run_id": "k3x9q2ab", "url": null,
                 "note": "offline: wandb sync /fsx/runs/p/m/wandb/offline-run-*-k3x9q2ab*",
                 "dir": "/fsx/runs/p/m", "sent_step": 40, "unsent": {...}, "unsent_by_attempt": {...},
                 "resent": {"rows": 30, "first_step": 1, "last_step": 30}}},
     "superseded": [{"attempt": 1, "first_step": 31, "last_step": 37, "resumed_from": 30}],
     "starts": [{"attempt": 1, "start_step": 0}, {"attempt": 2, "start_step": 30}]}

``attempt`` counts the starts of the sender in this run directory (``starts``: each one's start step); ``sent_step``
the highest step a tracker took (the top-level one: the highest of them, which is what a later attempt supersedes);
``resent``: the rows this attempt sent again because an earlier one did not get them into the tracker. A tracker's entry exists once its
run does (W&B's id is chosen before the run starts and written at once, so a kill before the first row still
reopens it).

Secrets: the params are the resolved project's sections (which hold no credentials: ``check`` scans them), without
any key naming a key, token, password or secret; no environment variable is sent. The trackers' own credentials come
from their environment variables or login files, read by their libraries.
"""

from __future__ import annotations

import csv
import io
import json
import re
import secrets
import string
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from clustertrain.core.run_paths import RunPaths, write_atomic
from clustertrain.monitor.config import TrackersConfig
from clustertrain.monitor.tracker_clients import Item, MlflowSink, RunSpec, WandbSink, flatten

IDS_FILE = "trackers.json"
IDS_VERSION = 1
#: the thread sends every FLUSH_S; a failed tracker is retried after RETRY_S, doubling up to RETRY_MAX_S
FLUSH_S = 1.0
RETRY_S = 5.0
RETRY_MAX_S = 60.0
#: items per send call (one MLflow log_batch for rows of up to 40 numbers)
BATCH = 25
#: param keys never sent (the project file holds no secrets; this is a second guard)
SECRET_KEY_RE = re.compile(r"(key|token|password|secret|credential)", re.IGNORECASE)
#: events forwarded as notes: all but the routine checkpoint (sent by checkpoint() with its path)
SKIPPED_EVENTS = frozenset({"checkpoint"})


@dataclass
class TrackerLink:
    """A model's run in one tracker, for ``status`` and ``report``."""

    tracker: str
    run_id: str
    url: str | None
    note: str | None  # how to reach it without a URL: "offline: wandb sync <dir>", "mlflow ui --backend-store-uri ..."


def ids_path(run_root: Path) -> Path:
    return Path(run_root) / IDS_FILE


def read_ids(run_root: Path) -> dict[str, Any]:
    """``trackers.json`` as a dict; {} when missing or damaged."""
    try:
        value = json.loads(ids_path(run_root).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def read_tracker_links(run_root: Path) -> list[TrackerLink]:
    """The tracker runs ``trackers.json`` names ([] when there is no file)."""
    links = []
    for name, entry in sorted((read_ids(run_root).get("trackers") or {}).items()):
        if isinstance(entry, dict) and entry.get("run_id"):
            links.append(TrackerLink(name, str(entry["run_id"]), entry.get("url"), entry.get("note")))
    return links


def tracker_params(sections: dict[str, Any]) -> dict[str, str]:
    """The flat params sent to the trackers: ``sections`` (``{"model": ..., "cluster": ..., "layout": ...}``)
    flattened with dots, keys naming a secret left out."""
    return {k: v for k, v in flatten(sections).items() if not SECRET_KEY_RE.search(k)}


def _new_wandb_id() -> str:
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


class _Tracker:
    """A sink and its backlog, owned by the thread (``lock`` guards the counters read by finish)."""

    def __init__(self, sink, bound: int, previous: dict | None):
        self.sink, self.name = sink, sink.name
        self.pending: deque[Item] = deque()
        self.bound = bound
        self.previous = previous
        self.started = False
        self.entry: dict[str, Any] = dict(previous or {})
        self.warned = False
        self.down = False
        self.retry_at = 0.0
        self.backoff = RETRY_S
        self.dropped: list[int | None] = []  # steps of dropped rows
        self.sent_step = int(self.entry.get("sent_step") or 0)
        self.backfill_after = self.sent_step  # rows after this one up to the start step were never sent: resent
        self.ended = False
        self.error: Exception | None = None  # the latest failure
        self.recovered = False  # the sink's service was started again once this attempt (W&B: _recover)

    def push(self, item: Item) -> None:
        if len(self.pending) >= self.bound:
            old = self.pending.popleft()
            if old.kind == "row":
                self.dropped.append(old.step)
        self.pending.append(item)

    def unsent(self) -> dict[str, Any]:
        steps = [i.step for i in self.pending if i.kind == "row"] + self.dropped
        steps = [s for s in steps if s is not None]
        return {"rows": len(steps), "first_step": min(steps) if steps else None,
                "last_step": max(steps) if steps else None}


class TrackerSender:
    """Rank 0's sender of one model's run to its trackers (see the module docstring)."""

    def __init__(self, trackers: TrackersConfig, spec: RunSpec, start_step: int, on_warning: Callable[[str], None],
                 ids: dict[str, Any]):
        self.config, self.spec, self.start_step, self.on_warning = trackers, spec, start_step, on_warning
        self.paths = RunPaths(spec.run_root)
        self.ids = ids
        self._lock = threading.Lock()
        self._inbox: deque[Item] = deque()
        self._inbox_dropped: list[int | None] = []
        self._wake = threading.Event()
        self._state: str | None = None
        self._finished = False
        self._offsets: dict[Path, int] = {}
        self._headers: dict[Path, list[str]] = {}
        self._skip_existing()
        prev = ids.get("trackers") or {}
        sinks = []
        if trackers.mlflow is not None:
            sinks.append(MlflowSink(trackers.mlflow, spec))
        if trackers.wandb is not None:
            sinks.append(WandbSink(trackers.wandb, spec, keep_rows=trackers.queue_rows))
        self.trackers = [_Tracker(s, trackers.queue_rows, prev.get(s.name)) for s in sinks]
        for t in self.trackers:  # the same dict: what the thread learns is in the next write
            self.ids.setdefault("trackers", {})[t.name] = t.entry
        self._thread = threading.Thread(target=self._run, name="clustertrain-trackers", daemon=True)

    @classmethod
    def open(cls, trackers: TrackersConfig, project_name: str, model_name: str, run_root: Path, start_step: int,
             params: dict, on_warning: Callable[[str], None], ingest: bool = False) -> "TrackerSender | None":
        """Start sending the run in ``run_root`` (a model's RUN_DIR) from ``start_step`` (the checkpoint's step);
        None when neither MLflow nor W&B is configured. ``params``: nested sections (flattened, secrets left out).

        ``ingest``: not an attempt of the ranks but a reader handing on rows another program logged (``status``
        ingesting Megatron-LM's log, :mod:`clustertrain.monitor.status`): the current attempt goes on (none is
        counted, no config artifact, nothing superseded) and ``finish("RUNNING")`` leaves the tracker run running."""
        if trackers.mlflow is None and trackers.wandb is None:
            return None
        run_root = Path(run_root)
        ids = read_ids(run_root)
        attempt = int(ids.get("attempt") or 0) + (0 if ingest and ids.get("attempt") else 1)
        prev_sent = int(ids.get("sent_step") or 0)
        superseded = list(ids.get("superseded") or [])
        note = None
        if ingest:
            start_step = max(start_step, prev_sent)
        if prev_sent > start_step:
            superseded.append({"attempt": attempt - 1, "first_step": start_step + 1, "last_step": prev_sent,
                               "resumed_from": start_step})
            note = (f"steps {start_step + 1}-{prev_sent} of attempt {attempt - 1} superseded by the resume from step "
                    f"{start_step}")
        entries = dict(ids.get("trackers") or {})
        if trackers.wandb is not None and not (entries.get("wandb") or {}).get("run_id"):
            entries["wandb"] = {"run_id": _new_wandb_id()}
        starts = [s for s in ids.get("starts") or [] if isinstance(s, dict)]
        if not (ingest and any(s.get("attempt") == attempt for s in starts)):
            starts.append({"attempt": attempt, "start_step": start_step})
        ids = {"version": IDS_VERSION, "attempt": attempt, "sent_step": min(prev_sent, start_step),
               "trackers": entries, "superseded": superseded, "starts": starts}
        config_path = RunPaths(run_root).config
        config_text = config_path.read_text(encoding="utf-8") if config_path.is_file() and not ingest else None
        spec = RunSpec(project=project_name, model=model_name, attempt=attempt, params=tracker_params(params),
                       config_text=config_text, run_root=run_root)
        sender = cls(trackers, spec, start_step, on_warning, ids)
        for t in sender.trackers:  # this attempt's counts start here (what an earlier one left unsent: _backfill)
            t.sent_step = min(t.sent_step, start_step)
            t.entry["sent_step"] = t.sent_step
            t.entry.pop("unsent", None)  # this attempt's (each attempt's stays in unsent_by_attempt)
            t.entry.pop("resent", None)
        sender._write_ids()
        if note:
            sender.note("superseded", note, start_step)
        sender._thread.start()
        return sender

    # -- the step path: enqueue only -------------------------------------------------------------------
    def _put(self, item: Item) -> None:
        with self._lock:
            if len(self._inbox) >= self.config.queue_rows:
                old = self._inbox.popleft()
                if old.kind == "row":
                    self._inbox_dropped.append(old.step)
            self._inbox.append(item)

    def row(self, row: dict) -> None:
        """A metrics row (its numeric fields; ``step`` is the x-axis, ``time`` the timestamp); never blocks."""
        self._put(self._row_item(row))

    def _row_item(self, row: dict, attempt: int | None = None) -> Item:
        values = {k: float(v) for k, v in row.items()
                  if k not in ("step", "time") and isinstance(v, (int, float)) and not isinstance(v, bool)}
        values["attempt"] = float(attempt or self.spec.attempt)
        return Item("row", int(row["step"]), float(row.get("time") or time.time()), values)

    def note(self, kind: str, message: str, step: int | None) -> None:
        """An event (an alarm, an incident, a preemption save) as the trackers' note."""
        self._put(Item("note", step, time.time(), text=message, note_kind=kind))

    def checkpoint(self, step: int, path: str) -> None:
        """A committed checkpoint, as a reference (its path or URL), never its weights."""
        self._put(Item("checkpoint", step, time.time(), text=str(path), note_kind="checkpoint"))

    def finish(self, state: str, timeout_s: float = 30.0) -> None:
        """The run's end ``state`` (COMPLETED | STOPPED | FAILED): send what can be sent within ``timeout_s``, end the
        tracker runs, report what was not sent. Once; later calls do nothing."""
        with self._lock:
            if self._finished:
                return
            self._finished = True
            self._state = str(state)
        self._wake.set()
        self._thread.join(timeout_s)
        with self._lock:
            waiting = [i.step for i in self._inbox if i.kind == "row"] + self._inbox_dropped
            for t in self.trackers:
                for _ in range(3):  # the thread may still be sending (timed out): read its backlog again if it moved
                    try:
                        unsent = t.unsent()
                        break
                    except RuntimeError:
                        continue
                else:
                    unsent = {"rows": None, "first_step": None, "last_step": None}
                steps = [s for s in waiting if s is not None]
                if steps and unsent["rows"] is not None:
                    every = steps + [s for s in (unsent["first_step"], unsent["last_step"]) if s is not None]
                    unsent = {"rows": unsent["rows"] + len(steps), "first_step": min(every), "last_step": max(every)}
                t.entry["unsent"] = unsent
                t.entry.setdefault("unsent_by_attempt", {})[str(self.spec.attempt)] = unsent
            self._write_ids()
            for t in self.trackers:
                unsent = t.entry["unsent"]
                if unsent["rows"]:
                    msg = (f"{t.name} tracker: {unsent['rows']} metrics row(s) not sent (steps {unsent['first_step']}"
                           f"-{unsent['last_step']}); metrics.jsonl has them ({IDS_FILE} counts them)")
                    print(f"[clustertrain] warning: {msg}", file=sys.stderr, flush=True)
                    if not t.warned:
                        t.warned = True
                        self.on_warning(msg)

    # -- the thread ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        self._backfill()
        while True:
            self._wake.wait(FLUSH_S)
            final = self._finished
            self._drain()
            for t in self.trackers:
                self._pump(t, final)
            if final:
                break
        for t in self.trackers:
            for _ in range(2):  # a finish that found the service dead: once more after the recovery (_failed)
                if t.started and not t.down and not t.pending and not t.ended:
                    try:
                        t.sink.finish(self._state or "FAILED")
                        t.ended = True
                    except Exception as e:
                        self._failed(t, e)

    def _recover(self, t: _Tracker) -> bool:
        """Once per attempt, at the first ``ConnectionError`` of a sink that can (W&B): its service process died
        under this attempt (wandb-core, killed by a Slurm requeue's SIGTERM while the rank saves and stops, or by
        anything else mid-run): start its run again, queue the rows it had logged but not written before the backlog,
        and send. True when that worked (then no warning: nothing was lost)."""
        try:
            queued = {id(i) for i in t.pending}  # a chunk that failed half-way is both logged and still queued
            rows = [i for i in t.sink.recover() if id(i) not in queued]
        except Exception as e:
            t.error = e
            return False
        t.pending = deque(sorted(rows + list(t.pending), key=lambda i: (i.step is None, i.step or 0)))
        t.down, t.error = False, None
        print(f"[clustertrain] {t.name} tracker: its service process had died; the run was started again and "
              f"{len(rows)} row(s) it had not written are sent again", file=sys.stderr, flush=True)
        self._pump(t, self._finished)
        return not t.down

    def _backfill(self) -> None:
        """Rows up to the start step that a tracker never took (it was down when an earlier attempt ended, or not
        configured then) or never wrote (W&B offline: steps no earlier ``.wandb`` file holds, see
        :meth:`WandbSink.held_steps <clustertrain.monitor.tracker_clients.WandbSink.held_steps>`): sent first, from
        ``metrics.jsonl`` (which holds no row past the start step by now), with the attempt that trained them."""
        if self.start_step <= 0:
            return
        from clustertrain.core.run_events import read_jsonl

        rows = None
        for t in self.trackers:
            held = None
            if hasattr(t.sink, "held_steps"):
                try:
                    held = t.sink.held_steps(t.previous)
                except Exception as e:  # an unreadable file: as if it held nothing past sent_step
                    print(f"[clustertrain] warning: {t.name} tracker: could not read its earlier files ({e})",
                          file=sys.stderr, flush=True)
            if held is None and t.backfill_after >= self.start_step:
                continue
            if rows is None:
                rows = [r for r in read_jsonl(self.paths.metrics)
                        if isinstance(r.get("step"), int) and r["step"] <= self.start_step]
            missing = [r for r in rows if (r["step"] not in held if held is not None else r["step"] > t.backfill_after)]
            for r in missing:
                t.push(self._row_item(r, self._trained_by(r["step"])))
            if missing:
                steps = [r["step"] for r in missing]
                with self._lock:
                    t.entry["resent"] = {"rows": len(steps), "first_step": min(steps), "last_step": max(steps)}

    def _trained_by(self, step: int) -> int:
        """The attempt whose row of ``step`` ``metrics.jsonl`` holds: the latest earlier start before it (``starts``
        of ``trackers.json``; this attempt when they are not recorded)."""
        earlier = [int(s.get("attempt") or 0) for s in self.ids.get("starts") or []
                   if int(s.get("attempt") or 0) < self.spec.attempt and int(s.get("start_step") or 0) < step]
        return max(earlier) if earlier else self.spec.attempt

    def _drain(self) -> None:
        with self._lock:
            items = list(self._inbox)
            self._inbox.clear()
            dropped, self._inbox_dropped = self._inbox_dropped, []
        items += [Item("note", e.get("step"), float(e.get("time") or time.time()), text=str(e.get("message", "")),
                       note_kind=str(e.get("kind", "event"))) for e in self._new_events()]
        last_row = next((i for i in reversed(items) if i.kind == "row"), None)
        if last_row is not None:
            last_row.values.update(self._telemetry())
        for t in self.trackers:
            t.dropped += dropped
            for item in items:
                t.push(item)

    def _pump(self, t: _Tracker, final: bool) -> None:
        if t.down and time.time() < t.retry_at and not final:
            return
        try:
            if not t.started:
                t.entry.update(t.sink.start(t.previous or t.entry))
                t.started = True
                with self._lock:
                    self._write_ids()
            wrote = False
            while t.pending:
                chunk = [t.pending[i] for i in range(min(BATCH, len(t.pending)))]
                t.sink.send(chunk)
                for _ in chunk:
                    t.pending.popleft()
                steps = [i.step for i in chunk if i.kind == "row" and i.step is not None]
                if steps:
                    t.sent_step = max(steps)  # the latest row sent: rows arrive in step order
                    wrote = True
            if t.down:
                t.down, t.backoff = False, RETRY_S
                print(f"[clustertrain] {t.name} tracker reachable again; its queued rows were sent",
                      file=sys.stderr, flush=True)
            if wrote:
                with self._lock:
                    t.entry["sent_step"] = t.sent_step
                    self.ids["sent_step"] = max(int(self.ids.get("sent_step") or 0), t.sent_step)
                    self._write_ids()
        except Exception as e:  # whatever the client raises: the tracker is down, training goes on
            self._failed(t, e)

    def _failed(self, t: _Tracker, error: Exception) -> None:
        if isinstance(error, ConnectionError) and t.started and not t.recovered and hasattr(t.sink, "recover"):
            t.recovered = True
            if self._recover(t):
                return
            error = t.error or error
        t.down = True
        t.error = error
        t.retry_at = time.time() + t.backoff
        t.backoff = min(RETRY_MAX_S, t.backoff * 2)
        if not t.warned:
            t.warned = True
            detail = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
            self.on_warning(f"{t.name} tracker failed ({type(error).__name__}: {detail}); training goes on, its rows "
                            f"are kept (at most monitor.trackers.queue_rows={self.config.queue_rows}) and retried")

    def _write_ids(self) -> None:
        try:
            write_atomic(ids_path(self.spec.run_root), json.dumps(self.ids, indent=1) + "\n")
        except OSError as e:
            print(f"[clustertrain] warning: could not write {IDS_FILE} ({e})", file=sys.stderr, flush=True)

    # -- what the run records elsewhere --------------------------------------------------------------------
    def _event_files(self) -> list[Path]:
        files = [self.paths.events]
        if self.paths.monitor.is_dir():
            files += sorted(self.paths.monitor.glob("*.events.jsonl"))
        return files

    def _skip_existing(self) -> None:
        """Events and samples written before this attempt are not sent again."""
        files = self._event_files() + (sorted(self.paths.monitor.glob("*.csv")) if self.paths.monitor.is_dir() else [])
        for f in files:
            try:
                self._offsets[f] = f.stat().st_size
            except OSError:
                pass

    def _new_lines(self, path: Path) -> list[str]:
        """Complete lines appended to ``path`` since the last read."""
        offset = self._offsets.get(path, 0)
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        self._offsets[path] = offset + end
        return data[:end].decode("utf-8", errors="replace").splitlines()

    def _new_events(self) -> list[dict[str, Any]]:
        out = []
        for f in self._event_files():
            for line in self._new_lines(f):
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict) and event.get("kind") not in SKIPPED_EVENTS:
                    out.append(event)
        return out

    def _telemetry(self) -> dict[str, float]:
        """Per node, the means of the samplers' rows since the last call (GPU utilisation and memory, CPU)."""
        out: dict[str, float] = {}
        if not self.paths.monitor.is_dir():
            return out
        for f in sorted(self.paths.monitor.glob("*.csv")):
            if f not in self._headers:
                try:
                    with open(f, encoding="utf-8") as fh:
                        self._headers[f] = next(csv.reader([fh.readline()]), [])
                except OSError:
                    continue
            lines = self._new_lines(f)
            rows = [r for r in csv.DictReader(io.StringIO("\n".join(lines)), fieldnames=self._headers[f])
                    if r.get("timestamp") != "timestamp"]
            node = re.sub(r"[^A-Za-z0-9_.-]", "_", f.stem)
            for column, name in (("utilization.gpu", "gpu_util_pct"), ("memory.used", "gpu_mem_mib"),
                                 ("host.cpu_pct", "cpu_pct")):
                values = []
                for r in rows:
                    try:
                        values.append(float(r.get(column) or ""))
                    except ValueError:
                        continue
                if values:
                    out[f"node/{node}/{name}"] = round(sum(values) / len(values), 3)
        return out
