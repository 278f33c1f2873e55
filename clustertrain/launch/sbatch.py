"""The Slurm batch script of one model's run: built as a value (:class:`SbatchRequest`), rendered
from ``launch/templates/sbatch.sh.j2``.

Quoting. Two syntaxes meet in a batch script:

* ``#SBATCH`` lines are parsed by sbatch itself, not by a shell: arguments split at blanks, double
  quotes group, a backslash escapes the next character, and an unescaped ``#`` starts a comment
  (single quotes are NOT special there). :func:`sbatch_quote` writes ``"..."`` with ``\\``, ``"``
  and ``#`` escaped.
* Everything in the shell body goes through :func:`shlex.quote` (the ``q`` filter).

No rendered string may hold a newline, carriage return or NUL (they would end a comment or a
directive); :func:`build_request` rejects them with a :class:`~clustertrain.core.errors.LaunchError`.
``%`` in Slurm file names is a pattern character, so literal ``%`` in the log directory is written ``%%``.

Containers (Pyxis). By default Pyxis sets the host's exported variables in the container *after* the
image's entrypoint, and a value the image defines wins (Pyxis README, ``--container-env``). The ranks'
wiring must not depend on what an image defines, so ``srun`` names it: ``--container-env=`` the
rendezvous and rank variables (:data:`clustertrain.core.ranks.RANK_VARIABLES`) plus every variable of the rank environment;
those keep the host's value. Nothing is prepended to ``LD_LIBRARY_PATH`` in a container: the image's
own value (its CUDA, NCCL and EFA libraries) stays. The image's root is read-only and HOME is not mounted, so
HOME and the caches programs keep under it go to a node-local mounted root (:func:`cache_environment`). A Slurm
without Pyxis (clustertrain's local one) runs the same options through the stand-in view
(:func:`with_container_view`, :mod:`clustertrain.launch.container_view`); docs/slurm.md says what each gives.

CPUs of the ranks. The script exports ``OMP_NUM_THREADS`` (``cluster.threads_per_worker``, else
``cluster.cpus_per_task``, else ``SLURM_CPUS_ON_NODE`` / ranks per node, computed on the node; ``launch.env`` wins),
since srun starts no torchrun that would set it. GPU jobs run their step with ``--cpu-bind=none`` (unless
``launch.srun_args`` names a ``--cpu-bind``): aws-ofi-nccl's wiki ("CPU Binding") asks for every rank's mask to hold
all the node's CPUs, and ParallelCluster's ``TaskPlugin=task/affinity,task/cgroup`` (cookbook ``slurm.conf.erb``)
would otherwise bind tasks whenever ``--cpus-per-task`` x tasks fills the node, CPU by CPU across the sockets (the
default ``block:cyclic`` distribution); each rank then binds itself to its GPU's NUMA node
(:mod:`clustertrain.train.threads`). ``--cpus-per-task`` is not derived from the catalog's ``vcpus``: a queue with
``DisableSimultaneousMultithreading`` offers half of them, and the job would not be scheduled.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import jinja2

from clustertrain import __version__
from clustertrain.core.errors import LaunchError
from clustertrain.launch.config import ENV_NAME_RE, LaunchConfig, launch_config_of
from clustertrain.launch.presets import RankEnvironment, node_env_lines, rank_environment
from clustertrain.monitor.tracker_preflight import tracker_env_names
from clustertrain.plan.packing import JobShare, job_share
from clustertrain.core.storage_layout import storage_layout
from clustertrain.project import ModelEntry, Project
from clustertrain.core.ranks import RANK_VARIABLES, batch_lines
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.templating import environment

TEMPLATES = Path(__file__).parent / "templates"
TEMPLATE = "sbatch.sh.j2"
OUTPUT_PATTERN = "%x-%j.out"  # job name - job id
CONTAINER_NAME = "clustertrain"  # Pyxis named container of the ranks' step (job-scoped), joined by the watchdog
_BAD_CHARS = ("\n", "\r", "\0")
NODE_NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")


@dataclass(frozen=True)
class SbatchRequest:
    """Everything the batch script says; a value, so that ``--dry-run`` and tests can print it."""

    project: str
    model: str
    job_name: str
    run_dir: Path
    log_dir: Path
    nodes: int
    ntasks_per_node: int
    python: str
    env: RankEnvironment = field(default_factory=RankEnvironment)
    gpus_per_node: int = 0
    gpu_directive: str = "gpus-per-node"
    cpus_per_task: int | None = None
    #: a job on a share of one node (models[].plan.gpus, :func:`clustertrain.plan.packing.job_share`): ``--mem`` in MB
    #: and ``--cpus-per-gpu`` (None: whole nodes, or unknown for an instance type outside the catalog)
    mem_mb: int | None = None
    cpus_per_gpu: int | None = None
    #: the job runs on a share of one node: its rendezvous port follows its first GPU (:func:`clustertrain.core.ranks.
    #: shared_node_port`), as other jobs may run on the node
    shared_node: bool = False
    #: cluster.threads_per_worker: the ranks' OMP_NUM_THREADS (None: the node's CPUs / ranks per node, computed on the node)
    threads_per_rank: int | None = None
    partition: str | None = None
    time_limit: str | None = None
    exclusive: bool = True
    signal: str = "USR2"
    signal_grace_s: int = 300
    max_restarts: int = 3
    max_segments: int = 4  # launch.max_segments: time-limited jobs one submission may run (docs/slurm.md)
    container_image: str | None = None
    container_mounts: tuple[str, ...] = ()
    container_env: tuple[str, ...] = ()
    sbatch_args: tuple[str, ...] = ()
    srun_args: tuple[str, ...] = ()
    submit_command: str = "clustertrain submit"
    version: str = __version__
    #: what each rank runs; empty: ``python -m clustertrain train --run-dir RUN_DIR --model MODEL`` (the rehearsal
    #: swaps in its payload here and nowhere else)
    rank_command: tuple[str, ...] = ()
    #: nodes the job must not use (``--exclude``): the project's suspect nodes (clustertrain.launch.exclusion)
    exclude: tuple[str, ...] = ()
    #: run the hang watchdog step beside the ranks (clustertrain.monitor.hang_watchdog)
    watchdog: bool = True
    #: the project's suspect list, where the watchdog blames nodes (None: blame nobody)
    suspects: Path | None = None
    #: ``clustertrain`` (the built-in trainer) or ``megatron`` (Megatron-LM's pretrain_gpt.py; rank_command holds it)
    framework: str = "clustertrain"
    #: megatron: the iterations of a complete run and Megatron's checkpoint directory (``--save``), where
    #: ``latest_checkpointed_iteration.txt`` tells a finished run from one Megatron ended early to be resumed
    train_iters: int = 0
    checkpoints: Path | None = None
    #: megatron: the one-task step that backs up the final checkpoint (empty: no checkpoint bucket)
    backup_command: tuple[str, ...] = ()
    #: a Slurm without Pyxis (clustertrain's local Slurm): the prefix that runs each containerised step's command
    #: in the stand-in view (:mod:`clustertrain.launch.container_view`, given the same Pyxis options); empty: Pyxis
    container_view: tuple[str, ...] = ()

    @property
    def output(self) -> str:
        """The ``--output`` pattern (Slurm fills in %x and %j)."""
        return slurm_filename(self.log_dir) + "/" + OUTPUT_PATTERN

    @property
    def completed_marker(self) -> Path:
        """The file whose presence tells the script not to requeue (:attr:`clustertrain.core.run_paths.RunPaths.completed`)."""
        return RunPaths(self.run_dir).completed

    def output_for(self, job_id: str) -> Path:
        """The output file of job ``job_id`` (what Slurm makes of :attr:`output`)."""
        return self.log_dir / OUTPUT_PATTERN.replace("%x", self.job_name).replace("%j", str(job_id))

    @property
    def output_prefix(self) -> str:
        """:meth:`output_for` up to the job id, for the script to complete with ``$SLURM_JOB_ID.out``."""
        prefix, _ = OUTPUT_PATTERN.replace("%x", self.job_name).split("%j")
        return str(self.log_dir / prefix)


def sbatch_quote(value: str) -> str:
    """Quote one ``#SBATCH`` argument for sbatch's own parser (see the module docstring)."""
    return '"' + re.sub(r'([\\"#])', r"\\\1", value) + '"'


def slurm_filename(path: str | Path) -> str:
    """``path`` for a Slurm file name pattern (``--output``, ``srun --output``): literal ``%`` written ``%%``."""
    return str(path).replace("%", "%%")


def check_renderable(what: str, value: object) -> None:
    """Raise :class:`LaunchError` when ``value`` (a string, path or list of them) holds a newline, CR or NUL,
    which no batch script can carry; ``what`` names the field in the message."""
    for text in _strings(value):
        if any(c in text for c in _BAD_CHARS):
            raise LaunchError(f"{what} {text!r} contains a newline or NUL; such names cannot go into a "
                              "batch script: rename it")


def render_template(template: str, **context: object) -> str:
    """Render another ``launch/templates/*.j2`` with the filters of the training script (``q``: shell
    quoting with :func:`shlex.quote`; ``sq``: :func:`sbatch_quote`); ``template`` (the template's path in
    the package) is passed for the header, ``rank_wiring`` the lines that export the rendezvous
    (:func:`clustertrain.core.ranks.batch_lines`). Callers check their values with :func:`check_renderable`."""
    context = {"rank_wiring": batch_lines(), **context}  # a caller may pass its own rank_wiring
    return script_environment().get_template(template).render(template=f"clustertrain/launch/templates/{template}",
                                                        **context)


def default_log_dir(project: Project, entry: ModelEntry) -> Path:
    return storage_layout(project).log_dir(entry.name)


def interpreter(project: Project, launch: LaunchConfig | None = None) -> str:
    """The ranks' interpreter: ``launch.python``; else, in the image ``clustertrain image build`` writes, the
    interpreter it installed clustertrain for (:func:`clustertrain.image.paths.image_interpreter`); ``python``
    inside another container image; the interpreter running clustertrain (``sys.executable``) on the host."""
    launch = launch or launch_config_of(project)
    if launch.python:
        return launch.python
    if project.container_image:
        from clustertrain.image.paths import image_interpreter

        return image_interpreter(project) or "python"
    return sys.executable


def build_request(project: Project, entry: ModelEntry, run_dir: Path, *, launch: LaunchConfig | None = None,
                  job_name: str | None = None, python: str | None = None, nodes: int | None = None,
                  submit_command: str | None = None, exclude: tuple[str, ...] = (),
                  data: tuple[tuple[float, Path], ...] | None = None) -> SbatchRequest:
    """The batch request for one model. ``python`` defaults to :func:`interpreter`; ``nodes`` to the model's
    node count (:func:`clustertrain.plan.node_counts.nodes_for`: its pinned count, the plan's allocation, or
    ``cluster.nodes``); ``exclude``: nodes the job must not use (the project's suspects); ``data``: the staged
    (weight, prefix) sources a Megatron model reads (default: where staging will put them,
    :func:`clustertrain.data.staging.expected_prefix`)."""
    launch = launch or launch_config_of(project)
    cluster = project.cluster
    run_dir = Path(run_dir).absolute()
    log_dir = default_log_dir(project, entry).absolute()
    share = job_share(project, entry)  # None: whole nodes
    if share is not None:
        nodes = project.job_nodes(entry)
    elif nodes is None:
        from clustertrain.plan.node_counts import nodes_for

        nodes = nodes_for(project)[entry.name]
    image = project.container_image
    env = rank_environment(cluster.instance_type, nodes, launch, os=project.aws.os if project.aws else None,
                           container=bool(image), within_node=share is not None)
    mounts: tuple[str, ...] = ()
    if image:  # the run directory is the working directory; the cache root is where HOME and caches go
        mounts, env = container_step(project, env, run_dir, (log_dir,))
    request = SbatchRequest(
        project=project.name, model=entry.name, job_name=job_name or f"{project.name}-{entry.name}",
        run_dir=run_dir, log_dir=log_dir, nodes=nodes, ntasks_per_node=cluster.ranks_per_node,
        python=python or interpreter(project, launch), env=env,
        gpus_per_node=cluster.gpus_per_node, gpu_directive=launch.gpu_directive, cpus_per_task=cluster.cpus_per_task,
        threads_per_rank=cluster.threads_per_worker,
        partition=cluster.partition, time_limit=cluster.time_limit, exclusive=launch.exclusive,
        signal=launch.signal, signal_grace_s=launch.signal_grace_s, max_restarts=launch.max_restarts,
        max_segments=launch.max_segments,
        container_image=image, container_mounts=mounts,
        container_env=(*container_env_names(env), *tracker_env_names(project.monitor.trackers)) if image else (),
        sbatch_args=tuple(launch.sbatch_args), srun_args=tuple(launch.srun_args),
        submit_command=submit_command or f"clustertrain submit PROJECT --model {entry.name}",
        exclude=tuple(exclude), suspects=storage_layout(project).suspects_file().absolute(),
    )
    if share is not None:
        request = replace(request, **share_fields(cluster.gpus_per_node, cluster.cpus_per_task, share))
    if entry.framework == "megatron":
        request = megatron_request(project, entry, request, data)
    check_request(request)
    return request


def share_fields(gpus_per_node: int, cpus_per_task: int | None, share: JobShare) -> dict[str, object]:
    """The request fields of a job on a share of one node (docs/slurm.md "Jobs that share a node"): one node, one
    rank per GPU of the share (``plan.gpus``; rank slots with CPU workers), ``--gpus-per-node``/``--gres`` of those
    GPUs, ``--mem`` of the share's host memory, and its CPUs: ``--cpus-per-gpu`` unless ``cluster.cpus_per_task``
    is set (sbatch refuses the two together: "--cpus-per-gpu is mutually exclusive with --cpus-per-task", Slurm's
    sbatch man page "Not compatible with the --cpus-per-task option"; one rank per GPU makes them the same thing).
    With CPU workers the CPUs are ``--cpus-per-task``. Never ``--exclusive``: that would take the whole node
    (``launch.exclusive`` applies to whole-node jobs only)."""
    cpus = share.cpus_per_gpu
    per_gpu = cpus if gpus_per_node and cpus_per_task is None else None
    per_task = cpus_per_task if cpus_per_task is not None or gpus_per_node else cpus
    return {"nodes": 1, "ntasks_per_node": share.gpus, "gpus_per_node": share.gpus if gpus_per_node else 0,
            "mem_mb": share.mem_mb, "cpus_per_gpu": per_gpu, "cpus_per_task": per_task, "exclusive": False,
            "shared_node": True}


def megatron_request(project: Project, entry: ModelEntry, request: SbatchRequest,
                     data: tuple[tuple[float, Path], ...] | None) -> SbatchRequest:
    """``request`` with Megatron-LM's ``pretrain_gpt.py`` as every rank's command (:mod:`clustertrain.megatron.args`),
    its rank variables and environment, no heartbeat watchdog (Megatron's ranks write no heartbeats), and the
    final checkpoint's backup step."""
    from dataclasses import replace

    from clustertrain.data.staging import expected_prefix
    from clustertrain.megatron.args import (MegatronContext, megatron_args, rank_command, rank_environment,
                                            tracker_environment)
    from clustertrain.train.checkpoint_backup import checkpoint_backup_url

    if data is None:
        root = storage_layout(project).datasets
        data = tuple((w, expected_prefix(one, root)) for w, one in entry.data.sources())
    world = request.nodes * request.ntasks_per_node
    ctx = MegatronContext(project, entry, world, request.run_dir, tuple(data),
                          storage_layout(project).tensorboard_dir(entry.name) or RunPaths(request.run_dir).tensorboard)
    env = replace(request.env, set={**request.env.set, **rank_environment(entry),
                                    **tracker_environment(project, entry, request.run_dir)})
    extra = [name for name in env.set if name not in request.container_env]
    backup: tuple[str, ...] = ()
    checkpoints = ctx.checkpoints
    url = checkpoint_backup_url(project, entry, checkpoints)
    if url:
        base = url.rsplit("/", 1)[0]  # <bucket>/<project>/<model>; the step picks iter_<N> itself
        storage = project.storage
        backup = (request.python, "-m", "clustertrain.megatron.backup", str(checkpoints), base,
                  *(["--endpoint-url", storage.endpoint_url] if storage.endpoint_url else []),
                  *(["--region", storage.region] if storage.region else []))
    return replace(request, framework="megatron", env=env, watchdog=False,
                   container_env=(*request.container_env, *extra) if request.container_image else (),
                   rank_command=tuple(rank_command(request.python, entry, megatron_args(ctx))),
                   train_iters=entry.training.max_steps, checkpoints=checkpoints, backup_command=backup)


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid-{os.getuid()}"


def check_request(request: SbatchRequest) -> None:
    """Reject what cannot be rendered safely: newlines/CR/NUL anywhere, '/' in the job name."""
    for f in fields(request):
        check_renderable(f.name, getattr(request, f.name))
    for name in [*request.env.set, *request.env.prepend, *request.env.on_node, *request.container_env]:
        if not ENV_NAME_RE.match(name):
            raise LaunchError(f"environment variable name {name!r} is not valid (letters, digits, '_')")
    for node in request.exclude:
        if not NODE_NAME_RE.match(node):
            raise LaunchError(f"node name {node!r} cannot be excluded: Slurm node names are letters, digits, '.', '_', "
                              "'-'; remove it from the suspect list with `clustertrain nodes clear`")
    if not request.job_name or "/" in request.job_name:
        raise LaunchError(f"job name {request.job_name!r} must be non-empty and contain no '/' "
                          "(it becomes part of the output file name)")


def _strings(value: object) -> list[str]:
    if isinstance(value, (str, Path)):
        return [str(value)]
    if isinstance(value, RankEnvironment):
        return [*value.set, *value.set.values(), *value.prepend, *(d for ds in value.prepend.values() for d in ds),
                *value.on_node]
    if isinstance(value, (tuple, list)):
        return [s for v in value for s in _strings(v)]
    return []


def script_environment() -> jinja2.Environment:
    """The one Jinja environment (:func:`clustertrain.core.templating.environment`) plus the batch scripts' filters:
    ``sq`` and ``node_env`` (training and validation scripts alike)."""
    env = environment(TEMPLATES)
    env.filters["sq"] = lambda v: sbatch_quote(str(v))
    env.filters["node_env"] = node_env_lines  # the lines that compute RankEnvironment.on_node on the node
    return env


def render_script(request: SbatchRequest) -> str:
    """The batch script text of ``request``."""
    check_request(request)
    wd_srun, wd_command = watchdog_command(request)
    return render_template(TEMPLATE, r=request, srun=srun_command(request), wd_srun=wd_srun, wd_command=wd_command,
                           step_srun=step_srun(request), backup_words=in_container(request, list(request.backup_command)),
                           rank_wiring=batch_lines(shared_node=request.shared_node))


def step_srun(request: SbatchRequest) -> list[str]:
    """A one-task step on the batch node after the ranks' step (the Megatron checkpoint backup), in the ranks'
    container; the template adds ``--nodelist="$SLURMD_NODENAME"``."""
    return ["srun", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", *_container_args(request)]


def _container_args(request: SbatchRequest) -> list[str]:
    """Pyxis options of the ranks' step, also used by the watchdog's step: the named container (job-scoped) is
    created by the ranks' step and joined by the watchdog's, so the image is unpacked once per node."""
    if not request.container_image or request.container_view:
        return []
    return container_options(request.container_image, request.container_mounts, request.container_env,
                             request.run_dir)


def container_options(image: str, mounts: tuple[str, ...], env_names: tuple[str, ...], workdir: str | Path) -> list[str]:
    """The Pyxis options of every containerised step, training's and the validation suite's alike: the image, the
    named container, ``mounts`` (:func:`container_mounts`), the variables that keep the host's value
    (:func:`container_env_names`), the working directory, HOME not mounted."""
    return [f"--container-image={image}", f"--container-name={CONTAINER_NAME}",
            f"--container-mounts={','.join(mounts)}", f"--container-env={','.join(env_names)}",
            f"--container-workdir={workdir}", "--no-container-mount-home"]


def container_mounts(project: Project, dirs: tuple[Path, ...] = (), *, cache: str | None = None) -> tuple[str, ...]:
    """``--container-mounts`` of a project's steps: the aws: section's shared mounts (else the storage layout's
    bases) and ``dirs``, each at its own path, none inside another. No device is bound: Enroot binds the host's
    ``/dev`` into every container (enroot ``conf/mounts/10-system.fstab``), EFA's ``/dev/infiniband`` included
    (the redundant bind is gone). ``cache``: the node-local cache root (:func:`container_cache_root`), bound too.
    A path holding ',' or ':' (Pyxis' separators) is a :class:`LaunchError`."""
    layout = storage_layout(project)
    candidates = [Path(m) for m in layout.mounts] or [Path(b).absolute() for b in layout.bases().values()]
    candidates += [Path(d).absolute() for d in dirs]
    kept = [d for d in candidates if not any(d != o and d.is_relative_to(o) for o in candidates)]
    mounts = tuple(f"{d}:{d}" for d in dict.fromkeys(kept))
    if cache and not any(Path(cache).is_relative_to(d) for d in kept):
        mounts += (f"{cache}:{cache}",)
    for m in mounts:
        if "," in m or m.count(":") != 1:
            raise LaunchError(f"container mount {m!r}: paths with ',' or ':' cannot be passed to "
                              "--container-mounts; move storage.root / the run directory to a plain path")
    return mounts


def container_cache_root(project: Project, run_dir: Path) -> str:
    """Where the containers' HOME and caches go: the node's NVMe (``aws.enroot.containers_cache``, which the compute
    node script makes, mode 1777) on a cluster whose instance type has one (ParallelCluster's EphemeralVolume);
    else ``RUN_DIR/cache`` (a local or NVMe-less cluster: the run directory is mounted anyway)."""
    if project.aws is not None:
        from clustertrain.plan.catalog import read_catalog

        facts = read_catalog().instances.get(project.cluster.instance_type) if project.cluster.instance_type else None
        if facts is not None and facts.nvme_gb:
            return project.aws.enroot.containers_cache
    return str(Path(run_dir).absolute() / "cache")


def cache_environment(root: str, user: str) -> dict[str, str]:
    """The variables that move what programs write under HOME out of the read-only image: Enroot does not mount
    HOME (Pyxis ``--no-container-mount-home``) and the image's root is read-only, so ``torch.compile``'s Triton
    and Inductor caches, CUDA's PTX JIT cache (``~/.nv/ComputeCache``), ``~/.cache`` (Hugging Face, torch
    extensions as Transformer Engine builds them) would fail or fall back. All go under ``root/user`` on the node."""
    base = f"{root.rstrip('/')}/{user}"
    return {"HOME": f"{base}/home", "XDG_CACHE_HOME": f"{base}/cache", "TRITON_CACHE_DIR": f"{base}/triton",
            "TORCHINDUCTOR_CACHE_DIR": f"{base}/inductor", "CUDA_CACHE_PATH": f"{base}/nv-compute-cache"}


def container_env_names(env: RankEnvironment) -> tuple[str, ...]:
    """``--container-env``: the rank variables and every variable of ``env`` (those computed on the node too, and the
    batch script's ``OMP_NUM_THREADS``) keep the host's value in the image."""
    return tuple(dict.fromkeys([*RANK_VARIABLES, *env.set, *env.on_node, "OMP_NUM_THREADS", "PYTHONUNBUFFERED"]))


def container_step(project: Project, env: RankEnvironment, workdir: Path,
                   dirs: tuple[Path, ...] = ()) -> tuple[tuple[str, ...], RankEnvironment]:
    """The mounts and environment of a containerised step of ``project`` that works in ``workdir`` and also uses
    ``dirs`` — what :func:`build_request` gives the ranks (the node-local cache root and its variables included), for
    steps outside a model's run (the validation suite's, :mod:`clustertrain.validate.suitejob`)."""
    cache = container_cache_root(project, workdir)
    return (container_mounts(project, (workdir, *dirs), cache=cache),
            replace(env, set={**env.set, **cache_environment(cache, _user())}))


def in_container(request: SbatchRequest, command: list[str]) -> list[str]:
    """``command`` as a containerised step runs it: itself under Pyxis (whose options are srun's), or behind the
    stand-in view's prefix with the same options (:attr:`SbatchRequest.container_view`)."""
    if not (request.container_image and request.container_view):
        return list(command)
    options = container_options(request.container_image, request.container_mounts, request.container_env,
                                request.run_dir)
    return in_view(request.container_view, options, command)


def in_view(view: tuple[str, ...], options: list[str] | tuple[str, ...], command: list[str]) -> list[str]:
    """``command`` behind the stand-in view's prefix ``view`` (:func:`view_prefix`) given Pyxis's ``options``
    (:func:`container_options`): what a Slurm without Pyxis runs for a step Pyxis would run with them."""
    return [*view, *options, "--", *command]


def view_prefix(python: str = sys.executable) -> tuple[str, ...]:
    """:attr:`SbatchRequest.container_view` for this machine: its interpreter runs the view, and the stand-in
    image's software (that interpreter's prefix and this clustertrain) is bound back where the view's own /tmp
    would hide it."""
    import clustertrain

    paths = dict.fromkeys([sys.prefix, sys.base_prefix, str(Path(clustertrain.__file__).resolve().parents[1])])
    return (python, "-m", "clustertrain.launch.container_view", *(f"--image-path={p}" for p in paths))


def with_container_view(request: SbatchRequest, python: str = sys.executable) -> SbatchRequest:
    """``request`` for a Slurm without Pyxis (the local one): the ranks (this machine's ``python``, the stand-in
    image's interpreter) run in the stand-in view of the same image, mounts, environment and working directory."""
    if not request.container_image:
        return request
    rank_command = tuple(python if w == request.python else w for w in request.rank_command)
    return replace(request, container_view=view_prefix(python), python=python, rank_command=rank_command)


def watchdog_command(request: SbatchRequest) -> tuple[list[str], list[str]]:
    """The watchdog step: (srun and its options, the command), unquoted; the template puts the batch node
    (``--nodelist="$SLURMD_NODENAME"``) between them and the job's own options (``--job``, ``--nodes``...) after.
    One task, overlapping the ranks' step."""
    srun = ["srun", "--overlap", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--cpus-per-task=1",
            *_container_args(request)]
    command = [request.python, "-m", "clustertrain", "watchdog", "--run-dir", str(request.run_dir),
               "--model", request.model]
    if request.suspects is not None:
        command += ["--suspects", str(request.suspects)]
    return srun, in_container(request, command)


def srun_command(request: SbatchRequest) -> list[str]:
    """The ``srun`` argv the script runs (unquoted; the template quotes each word)."""
    argv = ["srun", "--kill-on-bad-exit=1", f"--nodes={request.nodes}", f"--ntasks-per-node={request.ntasks_per_node}"]
    if request.cpus_per_task:
        argv.append(f"--cpus-per-task={request.cpus_per_task}")  # 22.05+: srun no longer inherits it from sbatch
    if request.gpus_per_node and not any(a.startswith(("--cpu-bind", "--cpu_bind")) for a in request.srun_args):
        argv.append("--cpu-bind=none")  # each GPU rank binds itself to its GPU's NUMA node (clustertrain.train.threads)
    argv += _container_args(request)
    argv += list(request.srun_args)
    if request.rank_command:
        return argv + in_container(request, list(request.rank_command))
    return argv + in_container(request, [request.python, "-m", "clustertrain", "train", "--run-dir",
                                         str(request.run_dir), "--model", request.model])
