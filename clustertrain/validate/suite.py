"""The validation suite as Slurm jobs: ``run_suite(project, SuiteConfig, env)`` -> :class:`SuiteReport`.

Built as values first: :func:`plan_suite` asks each check unit (:mod:`clustertrain.validate.suite_checks`:
smoke, gpu-efa, collectives, nccl-tests, storage-K) for its :class:`SuiteJob` values; :func:`render_job` renders one as
a batch script. :func:`run_suite` then writes each job's config file and script into a new suite directory
(:mod:`clustertrain.validate.suitedir` names every path and documents ``report.json``), submits them through
the launch stage (:mod:`clustertrain.launch.batch`), waits, gathers and judges what each job left, and
writes ``report.json`` last.

Each job has its own limits: :func:`run_suite` cancels a job still running past ``job_timeout_s`` (or
pending past ``start_timeout_s``) and turns it into a failed ``job`` row. Thresholds are data
(``thresholds.yaml``, :mod:`clustertrain.validate.thresholds`), looked up per instance type.

In the image: with a container image (``cluster.container_image`` or the ``image:`` section's), the smoke,
collectives, nccl-tests and storage steps run through Pyxis in it with training's srun options, mounts and
environment (:func:`~clustertrain.validate.suitejob.in_image`) and the image's interpreter; the GPU/EFA job is
the host scan (driver, EFA devices, kernel modules) and runs on the bare node. :func:`require_image` refuses,
before anything is planned or written, a project whose image file is missing and a GPU project without an
image; a CPU project without one (``gpus_per_node: 0``) runs its steps on the hosts. clustertrain's local Slurm has
no Pyxis (srun refuses ``--container-*``): when the suite submits there (``SLURM_CONF`` names a clustertrain local
cluster, :func:`~clustertrain.launch.slurm_cluster_paths.local_cluster_of`), the same steps run in the stand-in view
(:mod:`clustertrain.launch.container_view`) given the same Pyxis options, with this machine's interpreter — as
training's ranks do there (:meth:`clustertrain.launch.slurm.SlurmLauncher.request_for`); the host scan stays bare.

Where: the storage layout's ``validation_dir()`` (``<outputs>/<project>/validation/``); an ``aws:`` project
must have it on a shared mount, else the suite refuses naming the field (:func:`validation_base`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

from clustertrain.core.errors import LaunchError
from clustertrain.launch.batch import batch_state, cancel_job, submit_script
from clustertrain.core.storage_layout import off_mount_problems, require_mounted, storage_layout, unmounted_here
from clustertrain.project import Project
from clustertrain.core.run_paths import write_atomic
from clustertrain.core.states import State
from clustertrain.validate.check_rows import CheckRow, Verdict, worst  # noqa: F401  (re-exported)
from clustertrain.validate.results import ValidateError
from clustertrain.validate.suite_checks import CHECKS
from clustertrain.validate.suite_checks.collectives import (  # noqa: F401  (re-exported)
    NCCL_DEBUG_ENV, default_collectives, evaluate_collectives,
)
from clustertrain.validate.suite_checks.gpu_efa import evaluate_gpu_efa  # noqa: F401  (re-exported)
from clustertrain.validate.suite_checks.smoke import GPU_EFA_CHECKS, evaluate_smoke  # noqa: F401  (re-exported)
from clustertrain.validate.suite_checks.storage import evaluate_storage, storage_targets  # noqa: F401  (re-exported)
from clustertrain.validate.suitedir import JobOutcome, SuitePaths, SuiteReport, suite_table  # noqa: F401  (re-exported)
from clustertrain.validate.suitejob import (  # noqa: F401  (re-exported)
    SuiteConfig, SuiteContext, SuiteJob, job_rows, render_job,
)
from clustertrain.validate.thresholds import (  # noqa: F401  (re-exported)
    BandConfig, ThresholdsConfig, bandwidth_rows, default_max_bytes, load_thresholds, thresholds_key,
)

UNITS = {unit.NAME: unit for unit in CHECKS}


def validation_base(project: Project) -> Path:
    """Where suites of ``project`` go; for an ``aws:`` project it must be on one of its shared mounts (the
    layout's rule, :func:`~clustertrain.core.storage_layout.off_mount_problems`), else one line naming the field."""
    layout = storage_layout(project)
    for field_name, message in off_mount_problems(project):
        if field_name in (layout.origin["outputs"], "aws.fsx"):
            raise ValidateError(f"{field_name}: {message}")
    return layout.validation_dir()


def require_image(project: Project) -> None:
    """Refuse in one line (:class:`ValidateError`): a GPU project without a container image (the suite measures the
    image's NCCL and aws-ofi-nccl, as training uses them), and a project whose image file does not exist. An image
    on a cluster mount this machine does not have cannot be seen from here and is not refused (the head node sees
    it); a registry reference is pulled by Enroot on each node."""
    image = project.container_image
    where = project.source
    if image is None:
        if project.cluster.gpus_per_node:
            raise ValidateError(f"{where}: no container image: the suite runs its GPU and collective steps in the image "
                                f"training uses; build one with `clustertrain image build {project.file or 'PROJECT'}` (an "
                                "`image:` section, docs/image.md) or set cluster.container_image")
        return
    if not image.startswith(("/", "./", "../")) or Path(image).is_file() or unmounted_here(project, image):
        return
    if project.cluster.container_image:
        raise ValidateError(f"cluster.container_image: {image} does not exist; import it (`enroot import -o {image} "
                            "dockerd://IMAGE`) or correct cluster.container_image")
    raise ValidateError(f"image: {image} does not exist (the image is not built); build it with "
                        f"`clustertrain image build {project.file or 'PROJECT'}`")


def new_suite_dir(project: Project, now: datetime | None = None) -> SuitePaths:
    base = validation_base(project)
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    for i in range(100):
        root = base / (stamp if i == 0 else f"{stamp}-{i}")
        try:
            root.mkdir(parents=True)
            return SuitePaths(root)
        except FileExistsError:
            continue
    raise ValidateError(f"{base}: cannot make a new suite directory for {stamp}")


def suite_context(project: Project, cfg: SuiteConfig, paths: SuitePaths, table: ThresholdsConfig | None = None,
                  env: Mapping[str, str] | None = None) -> SuiteContext:
    """The context the check units plan and judge with (the default collectives sweep filled in). ``env``: the Slurm
    client variables (over this process's environment); where its ``SLURM_CONF`` names a clustertrain local cluster
    (no Pyxis) and the project has an image, the steps go behind the stand-in view and the interpreter is this
    machine's (the image's does not exist here), as :func:`~clustertrain.launch.sbatch.with_container_view` does
    for training."""
    from clustertrain.launch.sbatch import interpreter, view_prefix
    from clustertrain.launch.slurm_cluster_paths import local_cluster_of

    table = table or load_thresholds()
    key = thresholds_key(table, project.cluster.instance_type, project.cluster.gpus_per_node)
    if cfg.collectives is None:
        cfg = cfg.model_copy(update={"collectives": default_collectives(project, table)})
    view: tuple[str, ...] = ()
    if project.container_image and local_cluster_of(env) is not None:
        view = view_prefix(sys.executable)
        cfg = cfg.model_copy(update={"python": sys.executable})
    if cfg.python is None:
        cfg = cfg.model_copy(update={"python": interpreter(project)})
    return SuiteContext(project, cfg, paths, table, key, view)


def plan_checks(ctx: SuiteContext) -> list[tuple[str, list[SuiteJob], str | None]]:
    """Per check unit, in order: its name, its jobs, and why it does not apply (then no job)."""
    out = []
    for unit in CHECKS:
        reason = unit.not_applicable(ctx)
        out.append((unit.NAME, [] if reason else unit.plan(ctx), reason))
    return out


def plan_suite(project: Project, cfg: SuiteConfig, paths: SuitePaths, table: ThresholdsConfig | None = None,
               env: Mapping[str, str] | None = None) -> tuple[list[SuiteJob], dict[str, str]]:
    """The jobs to submit (to the Slurm of ``env``: :func:`suite_context`), and the checks that do not apply with the
    reason (``gpu-efa`` without GPUs); a project :func:`require_image` refuses is refused first."""
    require_image(project)
    planned = plan_checks(suite_context(project, cfg, paths, table, env))
    return [j for _, jobs, _ in planned for j in jobs], {name: why for name, _, why in planned if why}


def gather(job: SuiteJob, outcome: JobOutcome, nodes: list[str], ctx: SuiteContext) -> list[CheckRow]:
    """The ``job`` row, then what the job's check unit reads from its results directory and judges."""
    rows, readable = job_rows(job, outcome, ctx.cfg)
    return rows + (UNITS[job.check].gather(job, outcome, nodes, ctx) if readable else [])


def resolve_nodes(nodes: str, project: Project, available: int | None) -> int:
    """``--nodes``: a count, or ``all`` (the partition's nodes, else cluster.nodes)."""
    where = f"partition {project.cluster.partition}" if project.cluster.partition else "the cluster"
    if nodes == "all":
        return available or project.cluster.nodes
    if not nodes.isdigit() or int(nodes) < 1:
        raise ValidateError(f"--nodes {nodes!r}: give a node count (2, 10...) or 'all'")
    if available is not None and int(nodes) > available:
        raise ValidateError(f"--nodes {nodes}: {where} has only {available} node(s); use --nodes {available} or 'all'")
    return int(nodes)


def run_suite(project: Project, cfg: SuiteConfig, env: Mapping[str, str] | None = None, *,
              thresholds: ThresholdsConfig | None = None, poll_s: float = 0.5) -> SuiteReport:
    """Submit every job, wait (cancelling those past their limits), gather, judge, write ``report.json``.
    ``env``: Slurm client variables (``SLURM_CONF``...) over this process's environment. No controller answering
    is one line (:func:`~clustertrain.launch.slurmcli.require_slurm`) before the suite directory is made."""
    from clustertrain.launch.slurmcli import require_slurm

    require_mounted(project, storage_layout(project).validation_dir(), "the validation suite's results",
                    f"clustertrain validate suite {project.file or 'PROJECT'}")
    require_image(project)
    require_slurm(env)
    paths = new_suite_dir(project)
    ctx = suite_context(project, cfg, paths, thresholds, env)
    planned = plan_checks(ctx)
    report = SuiteReport(project=project.name, nodes=cfg.nodes, instance_type=project.cluster.instance_type,
                         thresholds=ctx.key, directory=str(paths.root), started=datetime.now().isoformat(timespec="seconds"))
    paths.jobs.mkdir()
    paths.logs.mkdir()  # Slurm does not make the output directory
    submitted: dict[str, tuple[SuiteJob, str, float]] = {}
    try:
        for job in (j for _, jobs, _ in planned for j in jobs):
            job.results_dir.mkdir(parents=True, exist_ok=True)
            for path, text in job.files:
                write_atomic(path, text)
            write_atomic(paths.script(job.name), render_job(job, paths))
            job_id = submit_script(paths.script(job.name), env, cwd=paths.root)
            submitted[job.name] = (job, job_id, time.monotonic())
        outcomes = _wait_all(submitted, ctx.cfg, env, paths, poll_s)
    except BaseException:
        for _, job_id, _ in submitted.values():  # never leave jobs behind on an error or Ctrl-C
            try:
                cancel_job(job_id, env)
            except LaunchError:
                pass
        raise
    for name, jobs, reason in planned:
        if reason:
            report.jobs.append(JobOutcome(name=name, state=State.SKIPPED))
            report.rows.append(CheckRow(job=name, check="job", verdict="not-applicable", detail=reason))
        for job in jobs:
            outcome, nodes = outcomes[job.name]
            report.jobs.append(outcome)
            report.rows.extend(gather(job, outcome, nodes, ctx))
    report.finish().write(paths)
    return report


def _wait_all(submitted: dict[str, tuple[SuiteJob, str, float]], cfg: SuiteConfig, env: Mapping[str, str] | None,
              paths: SuitePaths, poll_s: float) -> dict[str, tuple[JobOutcome, list[str]]]:
    started: dict[str, float] = {}
    done: dict[str, tuple[JobOutcome, list[str]]] = {}
    while len(done) < len(submitted):
        for name, (job, job_id, t_submit) in submitted.items():
            if name in done:
                continue
            status = batch_state(job_id, env)
            now = time.monotonic()
            common = dict(name=name, job_id=job_id, script=str(paths.script(name)),
                          output=str(paths.output(job.job_name, job_id)), elapsed_s=round(now - t_submit, 2))
            if status.state.finished:
                done[name] = (JobOutcome(state=status.state, slurm_state=status.slurm_state or None,
                                         exit_code=status.exit_code, **common), list(status.nodes))
            elif status.state == State.RUNNING and now - started.setdefault(name, now) > cfg.job_timeout_s:
                cancel_job(job_id, env)
                done[name] = (JobOutcome(state=State.TIMEOUT, **common), list(status.nodes))
            elif status.state == State.PENDING and now - t_submit > cfg.start_timeout_s:
                cancel_job(job_id, env)
                done[name] = (JobOutcome(state=State.NOT_STARTED, **common), list(status.nodes))
        if len(done) < len(submitted):
            time.sleep(poll_s)
    return done
