"""``clustertrain plan --calibrate-from RUN_DIR``: calibrate the planner from a real run (a short pilot job).

Teams size a long job from a short pilot: run a few dozen steps of one model on the real hardware, read its achieved
throughput, and plan the others with it. :func:`read_pilot` reads what a run directory records
(:mod:`clustertrain.core.run_paths`): ``run.json`` (which model of which project), ``config.yaml`` (the resolved
project the ranks ran: shape, batch, layout, cluster), ``usage.json`` (how many ranks the last start had; without it,
the cluster's) and ``metrics.jsonl`` (one row per logged step,
:mod:`clustertrain.train.metrics`: ``step_time_s`` is the mean step time of the logged interval, ``mfu`` the model FLOPs
utilisation where the GPU's peak is known). The pilot's step time is the median over the second half of its logged
intervals (never the first): a run's first steps are not its steady state — the first interval holds start-up work
(first-iteration allocation, autotuning, the data loader's first fill), and on 2 CPU ranks here steps 2-5 still ran
1.4-2.7x the steady step (0.69, 0.45, 0.41, 0.37 s, then 0.25-0.28 s; 4 x 256 model, DDP). A run that logged fewer
than two intervals has no timed steps.

What carries over to another model is the achieved rate (the standard MFU transfer):

- **GPU pilot** (``mfu`` recorded): the median ``mfu`` becomes ``plan.assumed_mfu`` of the project being planned (a
  model's own ``models[].plan.assumed_mfu`` still wins), so every GPU model's step = FLOPs per step / (GPUs x dense
  bf16 peak x MFU) (:mod:`clustertrain.plan.allocate`). Only a run on the same GPU model calibrates a GPU project:
  MFU depends on the GPU generation.
- **CPU pilot** (CPU workers have no data-sheet peak, so ``mfu`` is null): the achieved model FLOP/s per rank —
  FLOPs per token (the trainer's formula, :meth:`clustertrain.core.model_shape.ModelShape.flops_per_token`) x tokens
  per step / (median step x ranks) — stands in for peak x MFU (``Calibration.flops_per_worker`` with efficiency 1).
  Only a run with the same workers per node and threads per worker calibrates a CPU project: the rate per rank
  depends on how the cores are shared. It is a rate of *this* machine under *the pilot's* load: calibrate from a run
  made where and when the planned runs will run (``bench/plan_accuracy.py`` does, from each run's own first steps).

A run that cannot calibrate the project (CPU run for a GPU project or the reverse, another GPU model, other
workers/threads per node, a Megatron-LM run for the built-in trainer or the reverse) is refused in one line naming
``--calibrate-from`` and the fix, as is a path that is not a run directory or a run with no timed steps.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from clustertrain.core.errors import ConfigError
from clustertrain.core.run_events import read_jsonl, read_usage
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.run_records import UNKNOWN_VERSION, read_resolved_config, read_run_info

OPTION = "--calibrate-from"


@dataclass(frozen=True)
class Pilot:
    """What a run directory says about the speed it ran at."""

    run_dir: Path
    project: object                 # the resolved project the ranks ran (clustertrain.project.Project)
    model: str                      # the model of the project the run trained
    step_time_s: float              # median step_time_s of the timed rows (the second half of the logged ones)
    timed_rows: int                 # how many rows the median is over
    last_step: int
    flops_per_token: float          # the trainer's formula for the run's model
    world_size: int                 # ranks of the run
    mfu: float | None               # median mfu (GPU runs whose GPU peak is known), else None

    @property
    def entry(self):
        return next(e for e in self.project.models if e.name == self.model)

    @property
    def on_gpu(self) -> bool:
        return self.project.cluster.gpus_per_node > 0

    @property
    def flops_per_rank(self) -> float:
        """Achieved model FLOP/s per rank: FLOPs per token x tokens per step / (step time x ranks)."""
        t = self.entry.training
        tokens = t.global_batch * self.entry.model.seq_len
        return self.flops_per_token * tokens / (self.step_time_s * self.world_size)

    def describe(self) -> str:
        c = self.project.cluster
        layout = self.entry.parallelism
        where = (f"{self.world_size} GPU(s) of {c.instance_type}" if self.on_gpu
                 else f"{self.world_size} CPU rank(s)")
        rate = (f"MFU {self.mfu:.1%}" if self.mfu is not None
                else f"{self.flops_per_rank / 1e9:.2f} GFLOP/s model FLOPs per rank")
        return (f"calibrated from {self.run_dir} ({self.model}, zero_stage {layout.zero_stage}, tp {layout.tp}, "
                f"pp {layout.pp}, {where}): median step {self.step_time_s:.4g} s over {self.timed_rows} logged "
                f"interval(s) up to step {self.last_step}, {rate}")


def _bad(run_dir: Path, problem: str, fix: str) -> ConfigError:
    return ConfigError(f"{OPTION} {run_dir}: {problem}; {fix}")


def read_pilot(run_dir: Path | str) -> Pilot:
    """The pilot run in ``run_dir`` (see the module docstring); a ConfigError line for anything unusable."""
    from clustertrain.plan.plan import model_spec
    from clustertrain.project import Project

    run_dir = Path(run_dir)
    paths = RunPaths(run_dir)
    if not run_dir.is_dir():
        raise _bad(run_dir, "no such directory", "pass the run directory of a run that trained for some steps "
                   "(`clustertrain status` prints it)")
    missing = [p.name for p in (paths.run_json, paths.config, paths.metrics) if not p.is_file()]
    if missing:
        raise _bad(run_dir, f"not a run directory with logged steps (no {', '.join(missing)})",
                   "pass the directory `clustertrain run`/`submit` trained in, after some logged steps")
    info = read_run_info(paths)
    project, _ = read_resolved_config(paths.config, Project, info.clustertrain if info else UNKNOWN_VERSION)
    entry = next((e for e in project.models if info is not None and e.name == info.model), None)
    if entry is None:
        raise _bad(run_dir, f"run.json names model {info.model if info else None!r}, which its config.yaml does "
                   "not hold", "the run directory is damaged: calibrate from another run")
    rows = [r for r in read_jsonl(paths.metrics) if isinstance(r.get("step_time_s"), (int, float))
            and r["step_time_s"] > 0]
    timed = rows[max(1, len(rows) // 2):]  # the second half: past the start-up work and the warm-up steps
    if not timed:
        raise _bad(run_dir, f"no timed steps: metrics.jsonl has {len(rows)} logged row(s) and the first is "
                   "start-up, not a step time", "let the run log at least two intervals "
                   "(models[].training.log_every below max_steps / 2), then calibrate from it")
    mfus = [r["mfu"] for r in timed if isinstance(r.get("mfu"), (int, float))]
    spec = model_spec(project, project.models.index(entry), entry, 0.4, project.cluster.gpus_per_node == 0)
    attempts = read_usage(paths).attempts  # the ranks it ran on (a model pinned to other nodes than cluster.nodes)
    world = attempts[-1].world_size if attempts else project.cluster.world_size
    return Pilot(run_dir, project, entry.name, statistics.median(r["step_time_s"] for r in timed), len(timed),
                 int(timed[-1].get("step", 0)), spec.shape.flops_per_token(), world,
                 statistics.median(mfus) if mfus else None)


def check_compatible(pilot: Pilot, project) -> None:
    """Refuse a pilot that cannot calibrate ``project`` (module docstring), naming the difference and the fix."""
    from clustertrain.plan.catalog import find_instance, load_catalog
    from clustertrain.plan.frameworks import framework_of

    c, pc = project.cluster, pilot.project.cluster
    run = pilot.run_dir
    if pilot.on_gpu != (c.gpus_per_node > 0):
        kinds = ("a GPU run", "a CPU project") if pilot.on_gpu else ("a CPU run", "a GPU project")
        raise _bad(run, f"{kinds[0]} cannot calibrate {kinds[1]} (cluster.gpus_per_node {pc.gpus_per_node} there, "
                   f"{c.gpus_per_node} here)", "calibrate from a run on the hardware this project plans for")
    theirs = {framework_of(e).name for e in pilot.project.models if e.name == pilot.model}
    ours = {framework_of(e).name for e in project.models}
    if not ours <= theirs:
        raise _bad(run, f"a {'/'.join(sorted(theirs))} run cannot calibrate {'/'.join(sorted(ours - theirs))} models "
                   "(another framework, another efficiency)", "calibrate from a run of the same models[].framework")
    if pilot.on_gpu:
        if pilot.mfu is None:
            raise _bad(run, "the run recorded no mfu (its GPU has no bf16 peak in the catalog)",
                       "calibrate from a run on a GPU the catalog knows, or set plan.assumed_mfu")
        if not pc.instance_type or not c.instance_type:
            where = "the run's config.yaml" if not pc.instance_type else "this project"
            raise _bad(run, f"{where} names no cluster.instance_type, so which GPU model the MFU is of is unknown",
                       "set cluster.instance_type (the run's: --set on the run, or calibrate from a run that set it)")
        theirs_gpu = find_instance(load_catalog(pilot.project.plan), pc.instance_type, pilot.project.plan).gpu_model
        ours_gpu = find_instance(load_catalog(project.plan), c.instance_type, project.plan).gpu_model
        if theirs_gpu != ours_gpu:
            raise _bad(run, f"the run used {theirs_gpu} GPUs ({pc.instance_type}), this project plans for "
                       f"{ours_gpu} ({c.instance_type}): MFU differs between GPU models",
                       "calibrate from a run on the same GPU model, or set plan.assumed_mfu")
    elif (pc.ranks_per_node, pc.threads_per_worker) != (c.ranks_per_node, c.threads_per_worker):
        raise _bad(run, f"the run had {pc.ranks_per_node} CPU workers per node x threads_per_worker "
                   f"{pc.threads_per_worker}, this project {c.ranks_per_node} x {c.threads_per_worker}: "
                   "the rate per rank depends on how the cores are shared",
                   "calibrate from a run with the same cluster.procs_per_node and cluster.threads_per_worker")


def calibrate_from(project, run_dir: Path | str):
    """(project to plan, calibration or None, note) for ``make_plan(project, calibration)`` from the pilot run in
    ``run_dir``: a GPU pilot's MFU as ``plan.assumed_mfu``; a CPU pilot's achieved FLOP/s per rank as a
    :class:`~clustertrain.plan.calibrate.Calibration`. ``note`` is the assumption line the plan should show."""
    return calibration_for(project, read_pilot(run_dir))


def calibration_for(project, pilot: Pilot):
    """:func:`calibrate_from` for a pilot already read."""
    from clustertrain.plan.calibrate import Calibration

    check_compatible(pilot, project)
    if pilot.on_gpu:
        planned = project.model_copy(update={"plan": project.plan.model_copy(update={"assumed_mfu": pilot.mfu})})
        return planned, None, pilot.describe()
    threads = project.cluster.threads_per_worker or 0
    calibration = Calibration(threads, pilot.flops_per_rank, 1.0, pilot.step_time_s, {}, note=pilot.describe())
    return project, calibration, pilot.describe()


def plan_from_pilot(project, run_dir: Path | str):
    """``make_plan`` with the pilot's calibration, its note first among the assumptions (replacing the line about
    measuring CPU workers, which does not apply)."""
    from clustertrain.plan.plan import make_plan

    planned, calibration, note = calibrate_from(project, run_dir)
    plan = make_plan(planned, calibration)
    mfu = planned.plan.assumed_mfu
    plan.assumptions = [note] + [
        re.sub(r"MFU [\d.]+% \((plan\.assumed_mfu|catalog default)\)", f"MFU {mfu:.1%} (the pilot's)", a)
        if calibration is None else a
        for a in plan.assumptions if not a.startswith("CPU workers: ")]
    return plan
