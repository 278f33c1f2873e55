"""What watches the training loop: each concern is one :class:`Callback`, and the loop calls the list of them
(:class:`Callbacks`) at its few moments — a step starts, a phase begins, a step ends, a row is logged, a checkpoint is committed,
a stop signal is agreed, the run ends. A new concern is a new callback, not a trainer edit (torchtitan's
``components/metrics.py`` ``MetricsProcessor`` and ``components/checkpoint.py`` ``CheckpointManager`` are owned by
its ``train.py`` the same way: the loop calls them at fixed points).

The hot path calls only :meth:`Callback.phase` (attribute writes: :class:`clustertrain.train.heartbeat_writer.Beacon`)
and :meth:`Callback.step_done`; everything that writes files happens at a logged step, a commit or the end. Order
matters where one callback adds fields another writes: :class:`Watch` (the slowest rank, the spread) comes before
:class:`Metrics` (the row's writer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clustertrain.core.run_events import Event
from clustertrain.core.states import State


class Callback:
    """Every hook is optional; the defaults do nothing."""

    def step_started(self, step: int) -> None:
        """Step ``step`` (1-based) begins (after its first phase is set, so the heartbeat already names it)."""

    def phase(self, name: str, step: int | None = None) -> None:
        """The rank enters ``name`` (:data:`clustertrain.core.heartbeat_files.PHASES`), of step ``step`` when given."""

    def step_done(self, step: int, seconds: float, interval_mean_s: float) -> None:
        """Step ``step`` finished after ``seconds``; the mean step time of the log interval so far."""

    def logged(self, row: dict[str, Any], timings: list) -> None:
        """A logged step's metrics row (add fields to it here) and every rank's timing means (rank 0)."""

    def save_stalled(self, seconds: float) -> None:
        """Training waited ``seconds`` for a checkpoint save."""

    def committed(self, step: int, path: Path, save_s: float | None, stopping: bool,
                  stop_received: float | None) -> None:
        """A checkpoint is complete (rank 0): ``save_s`` from its start to its commit."""

    def stop_signal(self, step: int, signal: str | None, received: float) -> None:
        """The ranks agreed to stop after ``step`` (rank 0)."""

    def event(self, event: Event) -> None:
        """Something the run should remember (rank 0): a non-finite step."""

    def finished(self, state: State, step: int) -> None:
        """The ranks trained to the end, or stopped as asked."""

    def failed(self, step: int, message: str) -> None:
        """The ranks failed at ``step`` (rank 0)."""

    def close(self) -> None:
        """The loop is over (always called, after a failure too)."""


class Callbacks(Callback):
    """The list of callbacks, called in order."""

    def __init__(self, *callbacks: Callback | None):
        self.items = [c for c in callbacks if c is not None]

    def step_started(self, step):
        for c in self.items:
            c.step_started(step)

    def phase(self, name, step=None):
        for c in self.items:
            c.phase(name, step)

    def step_done(self, step, seconds, interval_mean_s):
        for c in self.items:
            c.step_done(step, seconds, interval_mean_s)

    def logged(self, row, timings):
        for c in self.items:
            c.logged(row, timings)

    def save_stalled(self, seconds):
        for c in self.items:
            c.save_stalled(seconds)

    def committed(self, step, path, save_s, stopping, stop_received):
        for c in self.items:
            c.committed(step, path, save_s, stopping, stop_received)

    def stop_signal(self, step, signal, received):
        for c in self.items:
            c.stop_signal(step, signal, received)

    def event(self, event):
        for c in self.items:
            c.event(event)

    def finished(self, state, step):
        for c in self.items:
            c.finished(state, step)

    def failed(self, step, message):
        for c in self.items:
            c.failed(step, message)

    def close(self):
        errors = []
        for c in self.items:
            try:
                c.close()
            except Exception as e:  # every callback closes; the first failure is raised after
                errors.append(e)
        if errors:
            raise errors[0]


class Heartbeat(Callback):
    """The rank's heartbeat (:class:`clustertrain.train.heartbeat_writer.Beacon`): phases, step times, save times."""

    def __init__(self, beacon):
        self.beacon = beacon

    def phase(self, name, step=None):
        self.beacon.phase(name, step=step)

    def step_done(self, step, seconds, interval_mean_s):
        self.beacon.step_done(seconds)

    def committed(self, step, path, save_s, stopping, stop_received):
        if save_s is not None:
            self.beacon.saved(save_s)


class Timing(Callback):
    """Per-rank step timing (:class:`clustertrain.train.timing.StepTimer`): the loop times its parts with
    ``timer.part``; this callback counts steps, writes the rank's line at a logged step and closes the file."""

    def __init__(self, timer):
        self.timer = timer

    def step_done(self, step, seconds, interval_mean_s):
        self.timer.end_step(seconds)

    def logged(self, row, timings):
        self.timer.log(row["step"])

    def close(self):
        self.timer.close()


class Watch(Callback):
    """The run's own records on rank 0 (:class:`clustertrain.train.run_recorder.RunWatch`): usage.json, status.json,
    events.jsonl, the alarms, stragglers and the slowest rank."""

    def __init__(self, watch, timings_on: bool):
        self.watch, self.timings_on = watch, timings_on

    def step_done(self, step, seconds, interval_mean_s):
        self.watch.stepped(step, interval_mean_s)

    def logged(self, row, timings):
        row.update(self.watch.logged(row, timings if self.timings_on else []))

    def save_stalled(self, seconds):
        self.watch.stalled(seconds)

    def committed(self, step, path, save_s, stopping, stop_received):
        self.watch.committed(step, path, save_s, stop_received if stopping else None)

    def stop_signal(self, step, signal, received):
        self.watch.stop_signal(step, signal, received)

    def event(self, event):
        self.watch.event(event, echo=False)  # the entry point prints the error line

    def finished(self, state, step):
        self.watch.finish(state, step)

    def failed(self, step, message):
        self.watch.fail(step, message)

    @property
    def stop_saved_s(self) -> float | None:
        return self.watch.stop_saved_s


class Metrics(Callback):
    """metrics.jsonl and TensorBoard on rank 0 (:class:`clustertrain.train.metrics.MetricsWriter`)."""

    def __init__(self, writer):
        self.writer = writer

    def logged(self, row, timings):
        self.writer.write(row)

    def close(self):
        self.writer.close()


class Backup(Callback):
    """Hands committed checkpoints to the backup (:class:`clustertrain.train.checkpoint_backup.CheckpointBackup`) when
    due: every ``backup.every_steps``, the last step and a stop."""

    def __init__(self, backup, entry, max_steps: int):
        self.backup, self.entry, self.max_steps = backup, entry, max_steps

    def committed(self, step, path, save_s, stopping, stop_received):
        from clustertrain.train.checkpoint_backup import is_due

        if step == self.max_steps or stopping or is_due(self.entry, step):
            self.backup.submit(path)


class Trackers(Callback):
    """Rank 0's experiment trackers (:class:`clustertrain.monitor.trackers.TrackerSender`, ``monitor.trackers``): each
    logged row, each committed checkpoint (its path) and the end state; the run's events reach them from
    ``events.jsonl`` through the sender itself. A tracker's failure is one ``tracker_down`` warning event (through the
    run's :class:`Watch`), never a stop."""

    def __init__(self, sender):
        self.sender = sender

    @classmethod
    def open(cls, project, entry, paths, step: int, layout, watch: "Watch | None") -> "Trackers | None":
        """The callback for ``entry``'s run in ``paths`` from ``step``; None when no MLflow or W&B is configured."""
        from clustertrain.core.run_events import Event, EventKind, Severity
        from clustertrain.monitor.trackers import TrackerSender

        def warn(message: str) -> None:
            event = Event(kind=EventKind.TRACKER_DOWN, severity=Severity.WARNING, message=message)
            if watch is not None:
                watch.watch.event(event)
            else:
                import sys

                print(f"[clustertrain] warning: {message}", file=sys.stderr, flush=True)

        params = {"model": entry.model_dump(mode="json"), "cluster": project.cluster.model_dump(mode="json"),
                  "layout": layout.to_dict()}
        sender = TrackerSender.open(project.monitor.trackers, project.name, entry.name, paths.root, step, params, warn)
        return cls(sender) if sender is not None else None

    def logged(self, row, timings):
        self.sender.row(row)

    def committed(self, step, path, save_s, stopping, stop_received):
        self.sender.checkpoint(step, str(path))

    def finished(self, state, step):
        self.sender.finish(str(state))

    def failed(self, step, message):
        self.sender.finish("FAILED")

    def close(self):
        self.sender.finish("FAILED")  # nothing when finished or failed said it first
