"""Monitor stage: what runs beside training to watch it, and what reads it back.

- :mod:`~clustertrain.monitor.config` — the ``monitor:`` section (:class:`MonitorConfig`).
- :mod:`~clustertrain.core.run_events` — the run's events, per-rank timing and usage records (formats).
- :mod:`~clustertrain.monitor.samples` — the node sampler's CSV (columns, reader).
- :mod:`~clustertrain.monitor.sampler` — the node sampler: NVML + psutil every ``monitor.interval_s``.
- :mod:`~clustertrain.train.alarms` — the trainer's alarm rules (loss spike, throughput drop, straggler).
- :mod:`~clustertrain.monitor.status` — one row per model: state, progress, speed, ETA, cost, alarms.
- :mod:`~clustertrain.monitor.report` — the self-contained HTML run report with plots.
- :mod:`~clustertrain.core.heartbeat_files` — each rank's heartbeat and the watchdog's requests (formats).
- :mod:`~clustertrain.monitor.hang_rules` — the watchdog's rules: a hang, a lost rank, whom to blame.
- :mod:`~clustertrain.monitor.hang_watchdog` — the watchdog: incidents (stacks, flight recorder), blame, the verdict.
- :mod:`~clustertrain.monitor.suspects` — the project's suspect-node list.
- :mod:`~clustertrain.monitor.goodput` — allocated node-hours as productive time, overhead, stalls, lost work, idle.
- :mod:`~clustertrain.monitor.resilience` — incidents, preemption saves and suspects as status reads them.

Public API (imported lazily, so that light commands do not pay for matplotlib).
"""

from clustertrain.core.lazy import lazy_exports

_PUBLIC = {
    "MonitorConfig": "clustertrain.monitor.config",
    "Event": "clustertrain.core.run_events",
    "EventKind": "clustertrain.core.run_events",
    "read_events": "clustertrain.core.run_events",
    "read_timing": "clustertrain.core.run_events",
    "read_usage": "clustertrain.core.run_events",
    "read_samples": "clustertrain.monitor.samples",
    "start_sampler": "clustertrain.monitor.sampler",
    "stop_sampler": "clustertrain.monitor.sampler",
    "ModelStatus": "clustertrain.monitor.status",
    "model_status": "clustertrain.monitor.status",
    "project_status": "clustertrain.monitor.status",
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _PUBLIC)
