"""``launch_findings(project)``: the launch stage's part of ``clustertrain check`` (and of ``submit``).

Checked for a project with ``cluster.backend: slurm`` (nothing else submits jobs):

=====================================================  =======  ==============================================
rule                                                   level    path
=====================================================  =======  ==============================================
the ranks' interpreter (no container image) is an      error    ``launch.python``
absolute path, and in a project with an ``aws:``
section on one of its shared file systems (every node
must run the same one; a venv in the submitter's home
is not on the compute nodes)
a venv on a shared mount whose base interpreter is     warning  ``launch.python``
off it (each node needs the same base interpreter)
a container image given as a file is on a shared       error    ``cluster.container_image``
file system (the built image: its directory)                    / ``image.dir``
that file exists (a typo costs a queued job); when     error /  ``cluster.container_image``
its mount is not on this machine it cannot be seen     warning  / ``image``
from here (a warning: check on the head node)
``cluster.container_image`` and an ``image:``         warning  ``cluster.container_image``
section name different images
a model's node count (``plan.nodes``, the plan's       error    ``models[i].plan.nodes`` / ``plan.cluster_nodes``
allocation) or ``plan.cluster_nodes`` exceeds the
queue's ``max_count``
the time limit leaves no room: ``signal_grace_s`` >=   error    ``cluster.time_limit``
the limit, or less than one step + a save remains
the stop signal's grace plus Slurm's KillWait does not  error    ``launch.signal_grace_s``
cover one step + a checkpoint save (step time from
the plan)
the grace alone does not cover them: the save lands    warning  ``launch.signal_grace_s``
only in KillWait, after the time limit
periodic checkpoints never happen within one job       warning  ``models[i].training.checkpoint_every``
checkpoints take over 10 % of the training time        warning  ``models[i].training.checkpoint_every``
no time limit on a GPU project (the stop signal        warning  ``cluster.time_limit``
cannot be planned)
``launch.env`` sets a variable aws-ofi-nccl sets        warning  ``launch.env.NAME``
itself or that harms (nccl_presets.yaml ``discouraged``)
``launch.max_segments`` x the time limit cannot reach   error    ``launch.max_segments``
``max_steps`` at the plan's step time
(:mod:`clustertrain.launch.segments`)
``monitor.hang_ceiling_s`` is below                    warning  ``monitor.hang_ceiling_s``
``hang_step_factor`` x the largest model's save (the
watchdog would take a slow save for a hang)
=====================================================  =======  ==============================================

A checkpoint save takes what earlier runs of the model measured, where its run directory (the default one,
``storage_layout(project).run_dir(model)``, holding the same architecture) recorded committed checkpoints: the
longest of the last :data:`RECENT_SAVES` ``checkpoint`` events' save seconds (``threshold``) in
``RUN_DIR/events.jsonl``. Otherwise it is planned: the model's fp32 weights and AdamW moments (12 bytes per
parameter, what the built-in trainer writes) at :data:`SAVE_GBPS` (one writer), or the checkpoint file system's
aggregate throughput when that is lower (``aws.fsx[].throughput`` x capacity). Each message says which.

Slurm's stop sequence: ``--signal=B:USR2@signal_grace_s`` starts the stop save ``signal_grace_s`` before the
time limit; at the limit Slurm sends SIGTERM and, :data:`KILL_WAIT_S` later, SIGKILL. So the save must land
within the grace plus KillWait at the time limit. A preemption gives no KillWait: it signals the job and kills it
after the partition's GraceTime (ParallelCluster configures no preemption: ``PreemptType=preempt/none``).
No network call, nothing written; user mistakes become error findings.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from clustertrain.core.errors import ClusterTrainError
from clustertrain.core.findings import Finding
from clustertrain.launch.config import LaunchConfig, launch_config_of
from clustertrain.launch.presets import discouraged
from clustertrain.core.storage_layout import mount_of, off_mount_problems, storage_layout
from clustertrain.core.run_events import EventKind, read_events
from clustertrain.project import architecture_fingerprint
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.run_records import read_run_info

if TYPE_CHECKING:
    from clustertrain.plan.plan import Plan
    from clustertrain.project import ModelEntry, Project

#: assumed checkpoint write bandwidth of one writer (rank 0), GB/s
SAVE_GBPS = 1.0
CHECKPOINT_BYTES_PER_PARAM = 12  # fp32 weights + AdamW exp_avg + exp_avg_sq
MAX_SAVE_SHARE = 0.10
#: a measured save is the longest of the model's last this many committed checkpoints (recent: the same cluster
#: and file system; the longest: the stop save must not be the one that misses)
RECENT_SAVES = 10
#: Slurm's KillWait, seconds from SIGTERM to SIGKILL at the time limit: ParallelCluster's slurm.conf sets 30
#: (aws-parallelcluster-cookbook, cookbooks/aws-parallelcluster-slurm/templates/default/slurm/slurm.conf.erb),
#: which is also Slurm's default
KILL_WAIT_S = 30


@dataclass(frozen=True)
class SaveTime:
    """How long one checkpoint save of a model takes and where the figure comes from."""

    seconds: float
    how: str        # "measured: ..." or "planned at ..."
    measured: bool


def launch_findings(project: "Project", plan: "Plan | None" = None, launch: LaunchConfig | None = None,
                    models: list[str] | None = None) -> list[Finding]:
    """Findings for ``project`` (rules in the module docstring); ``models``: only these models' rules."""
    if project.cluster.backend != "slurm":
        return []
    launch = launch or launch_config_of(project)
    out = interpreter_findings(project, launch)
    out += env_findings(launch)
    if plan is None:
        try:
            from clustertrain.plan.plan import make_plan

            plan = make_plan(project)
        except ClusterTrainError:
            return out  # reported by the plan section
    out += capacity_findings(project, plan, models)
    out += time_findings(project, plan, launch, models)
    return out


def interpreter_findings(project: "Project", launch: LaunchConfig) -> list[Finding]:
    if project.container_image:
        return image_findings(project)
    python = launch.python or sys.executable
    source = "launch.python" if launch.python else f"the interpreter running clustertrain (sys.executable; launch.python unset)"
    if not Path(python).is_absolute():
        return [Finding("error", "launch.python", f"{python!r} is not an absolute path; every node must find the same "
                        "interpreter", "give the interpreter's absolute path, e.g. /fsx/envs/train/bin/python")]
    if project.aws is None:
        return []
    fix = ("set launch.python to an interpreter on a shared file system (e.g. a venv under "
           f"{(storage_layout(project).mounts or ('/fsx',))[0]}/envs/) or set cluster.container_image")
    out = [Finding("error", "launch.python", f"{source}: {message}", fix)
           for field, message in off_mount_problems(project, extra={"launch.python": python}) if field == "launch.python"]
    if not out and os.path.lexists(python):
        target = os.path.realpath(python)
        if mount_of(target, storage_layout(project).mounts) is None:
            out.append(Finding("warning", "launch.python", f"{python} resolves to {target}, which is not on a shared file "
                               "system: every node must have that same interpreter (a venv's base interpreter)",
                               "use an interpreter installed on the shared file system, or a container image"))
    return out


def image_findings(project: "Project") -> list[Finding]:
    """The container image every rank runs in: on a shared file system, and there."""
    image = project.container_image
    if not image or not image.startswith(("/", "./", "../")):
        return []  # none, or a registry reference that Enroot pulls on each node
    built = project.cluster.container_image is None  # the image: section's .sqsh
    field = "image" if built else "cluster.container_image"
    out: list[Finding] = []
    if not built and project.image is not None:
        from clustertrain.image.paths import sqsh_path

        if str(sqsh_path(project)) != image:
            out.append(Finding("warning", field, f"{image} is used, not the image `clustertrain image build` writes "
                               f"({sqsh_path(project)})", "remove cluster.container_image to run in the built image"))
    if project.aws is not None:
        off = [m for f, m in off_mount_problems(project, extra={field: image}) if f in (field, "image.dir")]
        if off:
            return out + [Finding("error", "image.dir" if built else field, off[0],
                                  "put the image (.sqsh) on a shared file system, e.g. under /fsx")]
    if Path(image).is_file():
        return out
    mount = mount_of(image, storage_layout(project).mounts) if project.aws is not None else None
    fix = ("build it on the head node: `clustertrain image build PROJECT` (docs/image.md)" if built else
           "import it (`enroot import -o FILE dockerd://IMAGE`) or correct cluster.container_image")
    if mount is not None and not Path(mount).is_dir():
        return out + [Finding("warning", field, f"{image} is on the cluster's {mount}, which is not mounted on this "
                              "machine: not verified", "run `clustertrain check` on the head node, where a missing image is an error")]
    return out + [Finding("error", field, f"{image} does not exist: every rank would fail to start its container", fix)]


def env_findings(launch: LaunchConfig) -> list[Finding]:
    reasons = discouraged()
    return [Finding("warning", f"launch.env.{name}", reasons[name],
                    f"remove launch.env.{name} unless a measurement on your cluster shows it helps")
            for name, value in launch.env.items() if value is not None and name in reasons]


def capacity_findings(project: "Project", plan: "Plan", models: list[str] | None) -> list[Finding]:
    aws, cluster = project.aws, project.cluster
    if aws is None or cluster.partition is None:
        return []
    queue = next(((i, q) for i, q in enumerate(aws.queues) if q.name == cluster.partition), None)
    if queue is None:
        return []  # cluster.partition vs aws.queues: the cluster section's rule
    i, q = queue
    out = []
    if project.plan.cluster_nodes is not None and project.plan.cluster_nodes > q.max_count:
        out.append(Finding("error", "plan.cluster_nodes", f"{project.plan.cluster_nodes} nodes, but aws.queues[{i}] "
                           f"({q.name}) launches at most {q.max_count}", f"lower plan.cluster_nodes or raise aws.queues[{i}].max_count"))
    from clustertrain.plan.node_counts import nodes_for

    for index, entry in enumerate(project.models):
        if models is not None and entry.name not in models:
            continue
        nodes = nodes_for(project, plan)[entry.name]
        if nodes > q.max_count:
            field = f"models[{index}].plan.nodes" if entry.plan.nodes else ("plan.cluster_nodes" if project.plan.cluster_nodes
                                                                             else "cluster.nodes")
            out.append(Finding("error", field, f"{entry.name} runs on {nodes} nodes, but aws.queues[{i}] ({q.name}) "
                               f"launches at most {q.max_count}", f"lower {field} or raise aws.queues[{i}].max_count"))
    return out


def save_seconds(project: "Project", params: int) -> tuple[float, str]:
    """(estimated seconds to write one checkpoint, how it was estimated)."""
    gbps, how = SAVE_GBPS, f"{SAVE_GBPS:g} GB/s for one writer (assumed)"
    aws = project.aws
    if aws is not None:
        for f in aws.fsx:
            if "checkpoints" in f.holds and f.throughput:
                aggregate = f.throughput * f.capacity_gb / 1024 / 1000  # MB/s per TiB x TiB -> GB/s
                if aggregate < gbps:
                    gbps, how = aggregate, f"{aggregate:.2f} GB/s, the throughput of {f.name}"
    return params * CHECKPOINT_BYTES_PER_PARAM / (gbps * 1e9), how


def measured_save(paths: RunPaths) -> tuple[float, int] | None:
    """(the longest of the last :data:`RECENT_SAVES` save times that ``paths`` recorded, how many were looked at),
    or None when it recorded none."""
    saves = [e.threshold for e in read_events(paths) if e.kind == EventKind.CHECKPOINT and e.threshold is not None]
    recent = saves[-RECENT_SAVES:]
    return (max(recent), len(recent)) if recent else None


def save_time(project: "Project", entry: "ModelEntry", params: int) -> SaveTime:
    """The model's save time: measured by earlier runs in its run directory when that holds the same architecture
    (a changed model saves a different amount), else planned (:func:`save_seconds`)."""
    paths = RunPaths(storage_layout(project).run_dir(entry.name))
    try:
        info = read_run_info(paths)
    except ClusterTrainError:
        info = None  # a damaged run.json: nothing measured can be trusted to be this model's
    found = measured_save(paths) if info and info.fingerprint == architecture_fingerprint(project, entry) else None
    if found is not None:
        seconds, count = found
        which = f"the longest of the last {count} saves" if count > 1 else "the one save"
        return SaveTime(seconds, f"measured: {which} in {paths.events}", True)
    seconds, how = save_seconds(project, params)
    return SaveTime(seconds, f"planned at {how}", False)


def time_findings(project: "Project", plan: "Plan", launch: LaunchConfig, models: list[str] | None) -> list[Finding]:
    limit = project.cluster.time_limit_seconds
    grace = launch.signal_grace_s
    if limit is not None and limit <= grace:
        return [Finding("error", "cluster.time_limit", f"{project.cluster.time_limit} is not longer than "
                        f"launch.signal_grace_s ({grace} s): the stop signal would come as the job starts",
                        "raise cluster.time_limit or lower launch.signal_grace_s")]
    out: list[Finding] = []
    saves: list[tuple[str, SaveTime]] = []
    timed = False
    for index, entry in enumerate(project.models):
        if models is not None and entry.name not in models:
            continue
        m = plan.model(entry.name)
        save = save_time(project, entry, m.params)
        saves.append((entry.name, save))
        if m.step_time_s is None:
            continue
        timed = True
        stop = stop_findings(project, entry.name, m.step_time_s, save, grace)
        out += stop
        if not any(f.path == "cluster.time_limit" for f in stop):
            out += interval_findings(project, index, entry, m.step_time_s, save, grace)
    if timed and limit is None:
        out.append(Finding("warning", "cluster.time_limit", "not set: the partition's limit applies, so when (and "
                           "whether) the stop signal comes cannot be checked against the step and checkpoint times",
                           "set cluster.time_limit, e.g. \"48:00:00\""))
    from clustertrain.launch.segments import segment_findings

    return out + segment_findings(project, plan, launch, {n: s.seconds for n, s in saves}, models) + hang_findings(project, saves)


def stop_findings(project: "Project", name: str, step: float, save: SaveTime, grace: int) -> list[Finding]:
    """The stop save (one step, then a checkpoint) against the grace, Slurm's KillWait and the time limit."""
    limit = project.cluster.time_limit_seconds
    need = step + save.seconds
    where = (f"{name}: one step ({step:.1f} s, the plan's estimate) + a checkpoint save ({save.seconds:.0f} s, "
             f"{save.how})")
    fix = f"set launch.signal_grace_s to at least {int(need * 1.5) + 1}"
    out: list[Finding] = []
    if grace + KILL_WAIT_S < need:
        out.append(Finding("error", "launch.signal_grace_s", f"{grace} s, plus Slurm's KillWait ({KILL_WAIT_S} s) at "
                           f"the time limit, is less than {where}: the job is killed before its stop checkpoint is "
                           "written", fix))
    elif grace < need:
        out.append(Finding("warning", "launch.signal_grace_s", f"{grace} s is less than {where}: the stop "
                           "checkpoint lands only after the time limit, in Slurm's KillWait (SIGTERM, then SIGKILL "
                           f"{KILL_WAIT_S} s later), and a preemption gives no KillWait", fix))
    if limit is not None and limit - grace < need:
        out.append(Finding("error", "cluster.time_limit", f"{project.cluster.time_limit} less the {grace} s grace "
                           f"leaves less than {where}", "raise cluster.time_limit"))
    return out


def interval_findings(project: "Project", index: int, entry: "ModelEntry", step: float, save: SaveTime,
                      grace: int) -> list[Finding]:
    """Periodic checkpoints: at least one per job, and not more than :data:`MAX_SAVE_SHARE` of the time saving."""
    limit = project.cluster.time_limit_seconds
    every = entry.training.checkpoint_every
    interval = every * step
    field = f"models[{index}].training.checkpoint_every"
    if limit is not None and interval > limit - grace:
        return [Finding("warning", field, f"{entry.name}: every {every} steps is {interval / 3600:.1f} h at the plan's "
                        f"step time, longer than one job ({project.cluster.time_limit} less the grace): only the stop "
                        "signal's checkpoint saves progress, a crash loses the whole job",
                        f"lower checkpoint_every to at most {max(1, int((limit - grace) / step / 2))}")]
    share = save.seconds / (interval + save.seconds)
    if share > MAX_SAVE_SHARE:
        return [Finding("warning", field, f"{entry.name}: a checkpoint every {every} steps ({interval:.0f} s) takes "
                        f"{save.seconds:.0f} s to write ({save.how}): {share:.0%} of the time goes to saving",
                        f"raise checkpoint_every to at least {int(save.seconds / MAX_SAVE_SHARE / step) + 1}")]
    return []


def hang_findings(project: "Project", saves: list[tuple[str, SaveTime]]) -> list[Finding]:
    """The watchdog's ceiling against the longest save: a save gets ``hang_step_factor`` x its measured time, never
    more than ``hang_ceiling_s`` (the first save of a job, unmeasured yet, gets the ceiling)."""
    if not saves:
        return []
    monitor = project.monitor
    name, save = max(saves, key=lambda item: item[1].seconds)
    bound = monitor.hang_step_factor * save.seconds
    if monitor.hang_ceiling_s >= bound:
        return []
    return [Finding("warning", "monitor.hang_ceiling_s", f"{monitor.hang_ceiling_s:g} s is shorter than "
                    f"monitor.hang_step_factor ({monitor.hang_step_factor:g}) x {name}'s checkpoint save "
                    f"({save.seconds:.0f} s, {save.how}): the watchdog would take a slow save for a hang and end the "
                    "job",
                    f"raise monitor.hang_ceiling_s to at least {math.ceil(bound)}")]
