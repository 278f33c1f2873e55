"""One job of the validation suite as a value, and what every check unit shares.

A check unit (:mod:`clustertrain.validate.suite_checks`) plans its jobs as :class:`SuiteJob` values from a
:class:`SuiteContext` (the project, :class:`SuiteConfig`, the suite's paths, the thresholds entry) and
judges what they left. This module holds those values, :func:`new_job` (a job with the project's Slurm
settings), :func:`srun_step` (one ``srun`` argv whose output lands in the job's results directory),
:func:`in_image` (the Pyxis options that put a step in the project's image, exactly as training's steps are:
:func:`clustertrain.launch.sbatch.container_options`; on a Slurm without Pyxis, the stand-in view's prefix that takes
them instead, :class:`ImageStep`), :func:`job_env` (the ranks' environment),
:func:`render_job` (the batch script, ``launch/templates/validate.sh.j2`` through
:mod:`clustertrain.core.templating`) and :func:`job_rows` (the ``job`` row every job gets).

Quoting: ``#SBATCH`` values go through :func:`~clustertrain.launch.sbatch.sbatch_quote` (filter ``sq``),
everything in the shell body through ``shlex.quote`` (filter ``q``); ``%`` in a Slurm file name is written
``%%``; newlines, CR and NUL are refused (:func:`~clustertrain.launch.sbatch.check_renderable`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from pydantic import Field

from clustertrain import __version__
from clustertrain.core.errors import LaunchError
from clustertrain.launch.config import ENV_NAME_RE
from clustertrain.launch.presets import RankEnvironment, rank_environment
from clustertrain.launch.sbatch import (
    check_renderable, container_env_names, container_options, container_step, in_view, script_environment, slurm_filename,
)
from clustertrain.project import Project
from clustertrain.core.ranks import batch_lines
from clustertrain.core.schema import StrictModel
from clustertrain.core.states import State
from clustertrain.validate.check_rows import CheckRow
from clustertrain.validate.collectives_config import CollectivesConfig
from clustertrain.validate.storagebench import StorageBenchConfig
from clustertrain.validate.suitedir import JobOutcome, SuitePaths, read_text
from clustertrain.validate.thresholds import ThresholdsConfig

TEMPLATE = "validate.sh.j2"


class SuiteConfig(StrictModel):
    """How the suite runs (the CLI fills it from options)."""

    nodes: int = Field(2, ge=1, description="Nodes of each multi-node job (smoke, gpu-efa, collectives).")
    job_timeout_s: float = Field(600, gt=0, description="A job still running this long after it started is cancelled: fail.")
    start_timeout_s: float = Field(600, gt=0, description="A job still pending this long after submission is cancelled: fail.")
    collectives: CollectivesConfig | None = Field(
        None, description="Collectives benchmark (fault: rehearsal only); None: the project's default sweep "
                          "(default_collectives: up to the bandwidth bands on GPUs, 1 MiB on CPU).")
    storage: StorageBenchConfig = Field(default_factory=StorageBenchConfig, description="Storage bench per mount.")
    python: str | None = Field(None, description="Python of the steps; None: the ranks' interpreter "
                                                 "(clustertrain.launch.sbatch.interpreter: launch.python, else the "
                                                 "image's, else the one running clustertrain).")


@dataclass(frozen=True)
class SuiteContext:
    """What a check unit plans and judges with. ``cfg.collectives`` and ``cfg.python`` are always set (the default
    sweep and the ranks' interpreter filled in); ``key``: the thresholds.yaml entry of the project; ``view``: the
    stand-in view's prefix (:func:`~clustertrain.launch.sbatch.view_prefix`) when the suite submits to a Slurm
    without Pyxis (clustertrain's local one) and the project has an image, else empty."""

    project: Project
    cfg: SuiteConfig
    paths: SuitePaths
    table: ThresholdsConfig
    key: str
    view: tuple[str, ...] = ()


@dataclass(frozen=True)
class ImageStep:
    """How one step runs in the project's image. Under Pyxis the ``options`` are srun's (:attr:`srun`) and the
    command is itself; on a Slurm without Pyxis (``view`` set: the local one) srun gets none of them and the command
    runs behind the stand-in view's prefix given the same options, as training's ranks do
    (:func:`~clustertrain.launch.sbatch.in_view`, :mod:`clustertrain.launch.container_view`). No image: neither."""

    options: tuple[str, ...] = ()
    view: tuple[str, ...] = ()

    @property
    def srun(self) -> tuple[str, ...]:
        """The words srun gets (Pyxis's options, or none behind the view)."""
        return () if self.view else self.options

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` as the step runs it (behind the view's prefix on a Slurm without Pyxis)."""
        return in_view(self.view, self.options, argv) if self.view and self.options else list(argv)


@dataclass(frozen=True)
class SuiteJob:
    """One batch job of the suite, as a value. ``check``: the unit that planned it and judges it; ``outputs``:
    result files the steps must leave; ``files``: (path, text) written before submission (its config)."""

    name: str
    check: str
    job_name: str
    project: str
    nodes: int
    ntasks_per_node: int
    steps: tuple[tuple[str, ...], ...]
    outputs: tuple[Path, ...]
    results_dir: Path
    time_limit: str
    gpus_per_node: int = 0
    gpu_directive: str = "gpus-per-node"
    partition: str | None = None
    exclusive: bool = True
    env: RankEnvironment = field(default_factory=RankEnvironment)
    sbatch_args: tuple[str, ...] = ()
    target: str = ""  # storage jobs: the mount benchmarked
    files: tuple[tuple[Path, str], ...] = ()
    submit_command: str = "clustertrain validate suite PROJECT"
    version: str = __version__


def new_job(ctx: SuiteContext, name: str, check: str, *, nodes: int, ntasks_per_node: int,
            steps: list[list[str]], outputs: list[Path], gpus: bool = True, **extra: object) -> SuiteJob:
    """A job with the project's Slurm settings (partition, exclusive, sbatch_args, GPU directive) and the
    suite's time limit; ``gpus``: ask for the project's GPUs per node."""
    cl, launch = ctx.project.cluster, ctx.project.launch
    job = SuiteJob(name=name, check=check, job_name=f"{ctx.project.name}-validate-{name}", project=ctx.project.name,
                   nodes=nodes, ntasks_per_node=ntasks_per_node, steps=tuple(tuple(s) for s in steps),
                   outputs=tuple(outputs), results_dir=ctx.paths.results(name),
                   time_limit=str(int(ctx.cfg.job_timeout_s // 60) + 2),  # Slurm's own limit: a backstop behind ours
                   gpus_per_node=cl.gpus_per_node if gpus else 0, gpu_directive=launch.gpu_directive,
                   partition=cl.partition, exclusive=launch.exclusive, sbatch_args=tuple(launch.sbatch_args),
                   **extra)  # type: ignore[arg-type]
    check_job(job)
    return job


def srun_step(ctx: SuiteContext, nodes: int, per_node: int | None, results: Path, pattern: str,
              extra: tuple[str, ...] = ()) -> list[str]:
    """The ``srun`` words of one step (command not included): ``per_node`` tasks per node (None: one task in
    all), ``--output``/``--error`` to ``results/pattern`` and ``.err``, then ``extra`` and ``launch.srun_args``."""
    argv = ["srun", f"--nodes={nodes}"]
    argv += [f"--ntasks-per-node={per_node}"] if per_node else ["--ntasks=1"]
    stem = slurm_filename(results) + "/" + pattern
    return [*argv, *extra, *ctx.project.launch.srun_args, f"--output={stem}", f"--error={stem}.err"]


def job_env(ctx: SuiteContext, nodes: int) -> RankEnvironment:
    """The environment training's ranks get on ``nodes`` nodes (the project's NCCL/EFA preset and launch.env):
    every job of a project with a container image runs with it, so the image sees what training gives it."""
    p = ctx.project
    return rank_environment(p.cluster.instance_type, nodes, p.launch, os=p.aws.os if p.aws else None,
                            container=bool(p.container_image))


def in_image(ctx: SuiteContext, env: RankEnvironment, workdir: Path,
             dirs: tuple[Path, ...] = ()) -> tuple[ImageStep, RankEnvironment]:
    """A step in the project's image: its Pyxis options (as an :class:`ImageStep`, behind ``ctx.view`` where there is
    one) and the job's environment, from the functions training's steps use
    (:func:`~clustertrain.launch.sbatch.container_step`, :func:`~clustertrain.launch.sbatch.container_options`):
    the image, the named container, the mounts (the shared mounts or storage bases, the suite directory, ``dirs``, the
    node-local cache root), ``--container-env`` of ``env`` with the cache variables, ``workdir``, HOME not mounted.
    Without an image: no option, ``env`` as it is."""
    image = ctx.project.container_image
    if not image:
        return ImageStep(), env
    mounts, env = container_step(ctx.project, env, workdir, (ctx.paths.root, *dirs))
    return ImageStep(tuple(container_options(image, mounts, container_env_names(env), workdir)), ctx.view), env


def check_job(job: SuiteJob) -> None:
    """Refuse what no batch script can carry: newlines/CR/NUL in any value, a bad environment variable name."""
    for f in fields(job):
        value = getattr(job, f.name)
        check_renderable(f"{job.name}: {f.name}", [path for path, _ in value] if f.name == "files" else value)
    for name in [*job.env.set, *job.env.prepend]:
        if not ENV_NAME_RE.match(name):
            raise LaunchError(f"{job.name}: environment variable name {name!r} is not valid (letters, digits, '_')")


def render_job(job: SuiteJob, paths: SuitePaths) -> str:
    """The batch script of one suite job."""
    output = slurm_filename(paths.logs) + "/%x-%j.out"
    check_renderable("log directory", output)
    check_job(job)
    return script_environment().get_template(TEMPLATE).render(template=f"clustertrain/launch/templates/{TEMPLATE}", j=job,
                                             steps=[list(s) for s in job.steps], output=output,
                                             rank_wiring=batch_lines())


def why_missing(job: SuiteJob, outcome: JobOutcome) -> str:
    """The job's state and the last lines its steps and script printed to stderr: why a result is missing."""
    errs = [read_text(Path(str(o) + ".err")) or "" for o in job.outputs] + [read_text(Path(outcome.output or "/-")) or ""]
    lines = [ln for text in errs for ln in text.strip().splitlines() if ln.strip()]
    return f"job {outcome.state}, exit {outcome.exit_code}: {' | '.join(lines[-2:])[:240]}"


def job_rows(job: SuiteJob, outcome: JobOutcome, cfg: SuiteConfig) -> tuple[list[CheckRow], bool]:
    """The ``job`` row of one job, and whether its results are worth reading (False: cancelled by the suite)."""
    if outcome.state in (State.TIMEOUT, State.NOT_STARTED) and outcome.slurm_state is None:  # the suite cancelled it
        limit = cfg.job_timeout_s if outcome.state == State.TIMEOUT else cfg.start_timeout_s
        what = "still running" if outcome.state == State.TIMEOUT else "still pending"
        return [CheckRow(job=job.name, check="job", verdict="fail", found=f"{what} after {limit:g}s; cancelled",
                         threshold=f"ends within {limit:g}s", detail=f"Slurm job {outcome.job_id}")], False
    slurm = outcome.slurm_state
    state = outcome.state.value + (f" ({slurm})" if slurm and slurm.split()[0] != outcome.state else "")
    verdict = "fail" if outcome.state == State.TIMEOUT else "warn" if outcome.state == State.UNKNOWN else "pass"
    detail = f"Slurm job {outcome.job_id}" + (
        "; Slurm's time limit ended it" if outcome.state == State.TIMEOUT else
        "; Slurm no longer knows the job and keeps no record of its end" if outcome.state == State.UNKNOWN else
        "; a step exited non-zero: the checks below say why" if outcome.exit_code else "")
    return [CheckRow(job=job.name, check="job", verdict=verdict, found=f"{state}, exit {outcome.exit_code}",
                     threshold=f"ends within {cfg.job_timeout_s:g}s", detail=detail)], True
