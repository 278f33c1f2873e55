"""Can the job chain of a model reach ``max_steps``? The launch stage's rule on segments, part of ``clustertrain check``.

A Slurm job ends at ``cluster.time_limit``; the batch script then requeues it to continue from the stop checkpoint,
at most ``launch.max_segments`` jobs per submission (the failure restarts, ``launch.max_restarts``, are a separate
budget for time lost, not a source of training time: docs/slurm.md, "Segments and restarts"). So one submission
trains for at most::

    max_segments x (time_limit - signal_grace_s - start-up)

where the start-up of each segment is :data:`START_S` (Slurm's prolog, the container, the rendezvous) plus one
checkpoint load, taken as long as a save (:func:`clustertrain.launch.preflight.save_time`: the same bytes); the
first segment loads nothing but is counted alike. The model needs ``max_steps x`` the plan's step time (the plan's
``step_time_s``: the assumed MFU), plus each periodic checkpoint's save when saves block (``async_checkpoint:
false``). Too few segments is an error (the run stops early while the nodes bill); the fix names a count with
:data:`HEADROOM` over the plan (its MFU is an assumption, and a failure restart loses up to one checkpoint
interval).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from clustertrain.core.findings import Finding

if TYPE_CHECKING:
    from clustertrain.launch.config import LaunchConfig
    from clustertrain.plan.plan import Plan
    from clustertrain.project import ModelEntry, Project

#: seconds each segment spends before its first step besides the checkpoint load: Slurm's start, the container's
#: start, imports and the rendezvous (an assumption, stated in the finding)
START_S = 600
#: the suggested max_segments covers this multiple of the plan's training time
HEADROOM = 1.25
DAY = 86400


def needed_seconds(entry: "ModelEntry", step: float, save: float) -> float:
    """Seconds of training ``entry`` needs at ``step`` seconds per step (plus blocking periodic saves of ``save`` s)."""
    t = entry.training
    saves = 0.0 if t.async_checkpoint else (t.max_steps // t.checkpoint_every) * save
    return t.max_steps * step + saves


def segment_findings(project: "Project", plan: "Plan", launch: "LaunchConfig", saves: dict[str, float],
                     models: list[str] | None = None) -> list[Finding]:
    """One error naming the models whose chain of ``launch.max_segments`` jobs cannot reach ``max_steps`` (module
    docstring); ``saves``: each model's checkpoint save in seconds."""
    limit = project.cluster.time_limit_seconds
    if limit is None:
        return []  # no time limit: one job runs to the end (the missing limit has its own warning)
    short: list[tuple[int, float, float, float, "ModelEntry", float]] = []  # segments, need, usable, step, ...
    for entry in project.models:
        if (models is not None and entry.name not in models) or entry.name not in saves:
            continue
        step = plan.model(entry.name).step_time_s
        if step is None:
            continue
        save = saves[entry.name]
        usable = limit - launch.signal_grace_s - START_S - save
        if usable <= step:
            continue  # a segment cannot even run a step: the time-limit rules say so
        need = needed_seconds(entry, step, save)
        segments = math.ceil(need / usable)
        if segments > launch.max_segments:
            short.append((segments, need, usable, step, entry, save))
    if not short:
        return []
    segments, need, usable, step, entry, save = max(short, key=lambda s: (s[0], s[1]))
    reach = launch.max_segments * usable
    suggest = max(max(s[0] for s in short), *(math.ceil(s[1] * HEADROOM / s[2]) for s in short))
    others = [s[4].name for s in short if s[4] is not entry]
    also = f" ({', '.join(others)} too)" if others else ""
    return [Finding(
        "error", "launch.max_segments",
        f"{entry.name}{also} needs {segments} segments of {project.cluster.time_limit} for {entry.training.max_steps} "
        f"steps ({need / DAY:.1f} days at the plan's {step:.2f} s per step; each segment less the {launch.signal_grace_s} s "
        f"grace and {(START_S + save) / 60:.0f} min start-up), but launch.max_segments={launch.max_segments} "
        f"allows {reach / DAY:.1f} days: the run stops {(need - reach) / DAY:.1f} days short of max_steps",
        f"set launch.max_segments to at least {suggest} ({HEADROOM - 1:.0%} over the plan) or raise cluster.time_limit")]
