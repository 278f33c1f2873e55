"""The project file: one YAML document that describes the cluster, storage and the models to train.

This module keeps the root: :class:`Project` and :class:`ModelEntry` (one model's composition), the
sections every stage reads (``cluster:``, ``storage:``), loading with ``--set`` overrides, and a
model's identity (:func:`architecture_fingerprint`). Each stage owns the sections only it interprets,
next to the code that uses them, and this module composes them:

=========================  ==========================================
section                    model (module)
=========================  ==========================================
``models[].model``         ``ArchConfig`` (:mod:`clustertrain.train.config`)
``models[].training``      ``TrainingConfig`` (:mod:`clustertrain.train.config`)
``models[].parallelism``   ``ParallelismConfig`` (:mod:`clustertrain.train.config`)
``models[].data``          ``DataConfig`` (:mod:`clustertrain.data.config`)
``models[].plan``, ``plan``  ``ModelPlanConfig``, ``PlanConfig`` (:mod:`clustertrain.plan.config`)
``models[].megatron``      ``MegatronConfig`` (:mod:`clustertrain.megatron.config`)
``launch``                 ``LaunchConfig`` (:mod:`clustertrain.launch.config`)
``aws``                    ``AwsConfig`` (:mod:`clustertrain.cloud.config`)
``image``                  ``ImageConfig`` (:mod:`clustertrain.image.config`)
=========================  ==========================================

Those section modules import only :mod:`clustertrain.core.schema` (never this module), so there is no cycle.

Loading is strict (every section subclasses :class:`clustertrain.core.schema.StrictModel`: unknown keys
are errors, so typos never pass silently); every field carries a description, which is also the
reference documentation (``clustertrain config docs`` writes ``docs/project-file.md``) and the JSON
Schema for editors (``clustertrain config schema``). Relative paths are resolved against the
directory of the project file. ``--set KEY=VALUE`` overrides use dotted keys
(``models.0.training.max_steps`` or ``models.tiny.training.max_steps``); values are parsed as YAML
scalars and type-checked like the file, and a mistake in a value an override wrote names the override
(``p.yaml (--set cluster.nodes): ...``), not a line of the file. A loaded :class:`Project` remembers its
file and overrides (:attr:`Project.file`, :attr:`Project.overrides`), so later errors can name them.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator

from clustertrain.cloud.config import AwsConfig
from clustertrain.data.config import DataConfig
from clustertrain.core.errors import ConfigError
from clustertrain.image.config import ImageConfig
from clustertrain.launch.config import LaunchConfig
from clustertrain.megatron.config import MegatronConfig
from clustertrain.megatron.config import structure_problems as megatron_structure
from clustertrain.monitor.config import MonitorConfig
from clustertrain.plan.config import ModelPlanConfig, PlanConfig
from clustertrain.core.schema import (
    StrictModel, format_error, leading_loc, ordered_errors, read_yaml, require_mapping, validate_model,
)
from clustertrain.train.config import (
    ArchConfig,
    ParallelismConfig,
    TrainingConfig,
    builtin_problems,
    microbatch_problems,
)
from clustertrain.core.parallel_layout import node_problems, pipeline_problems, structure_problems, world_problems

#: prefixes below aws.buckets.checkpoints / aws.buckets.data that runs write by default
CHECKPOINT_PREFIX = "checkpoints"
DATASET_PREFIX = "datasets"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
#: directory names a model's run directory could collide with when several kinds of data share one base
#: (see :mod:`clustertrain.core.storage_layout`, which derives every path from a project and so imports this module)
RESERVED_MODEL_NAMES = ("logs", "tensorboard", "validation", "datasets", "previous")


_SLURM_TIME_RE = re.compile(r"^(?:(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?|(\d+)(?::(\d+)(?::(\d+))?)?)$")


def slurm_time_seconds(text: str) -> int | None:
    """Seconds of a Slurm time string (sbatch --time formats), or None when it is not one.
    ``UNLIMITED``/``INFINITE`` are not accepted: a job needs a limit for the stop signal to arrive."""
    m = _SLURM_TIME_RE.match(text.strip())
    if not m:
        return None
    if m.group(1) is not None:  # D-HH[:MM[:SS]]
        d, h, mi, se = (int(g) if g else 0 for g in m.group(1, 2, 3, 4))
        return ((d * 24 + h) * 60 + mi) * 60 + se
    a, b, c = m.group(5, 6, 7)
    if c is not None:  # HH:MM:SS
        return (int(a) * 60 + int(b)) * 60 + int(c)
    if b is not None:  # MM:SS
        return int(a) * 60 + int(b)
    return int(a) * 60  # MINUTES


def _check_name(value: str, what: str) -> str:
    if not NAME_RE.match(value):
        raise ValueError(
            f"{what} {value!r} must be 1-64 characters of letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return value


class ClusterConfig(StrictModel):
    backend: Literal["local", "slurm"] = Field(
        "local", description="Where `clustertrain run` trains: `local` spawns worker processes on this machine; `slurm` submits batch jobs."
    )
    nodes: int = Field(1, ge=1, description="Nodes per training job (the local backend supports 1).")
    gpus_per_node: int = Field(
        0, ge=0, description="GPUs per node; 0 means CPU workers (gloo). With GPUs, one rank per GPU and NCCL."
    )
    procs_per_node: int | None = Field(
        None, ge=1, description="Ranks per node. Default: gpus_per_node, or 2 CPU workers when gpus_per_node is 0."
    )
    partition: str | None = Field(None, description="Slurm partition (queue) to submit to.")
    instance_type: str | None = Field(None, description="Compute instance type, e.g. `p5e.48xlarge` (planning, cloud config, NCCL presets).")
    container_image: str | None = Field(
        None, description="Container image for Pyxis/Enroot (`--container-image`), e.g. `/fsx/images/train.sqsh`. None: run on the host."
    )
    cpus_per_task: int | None = Field(None, ge=1, description="CPUs per rank for Slurm (`--cpus-per-task`).")
    time_limit: str | None = Field(
        None, description="Slurm time limit as a quoted string: `MINUTES`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM` or `D-HH:MM:SS`, "
        "e.g. `\"48:00:00\"` (unquoted, YAML reads 48:00:00 as a base-60 number).",
    )
    threads_per_worker: int | None = Field(
        None, ge=1, description="torch intra-op threads (and OMP_NUM_THREADS) per rank, CPU workers and GPU ranks alike. Default: the CPUs the rank may use (Slurm's SLURM_CPUS_ON_NODE, else its affinity) divided by the ranks per node."
    )
    master_port: int | None = Field(
        None, ge=1024, le=65535, description="Rendezvous port for local runs. Default: a free port."
    )

    @field_validator("time_limit", mode="before")
    @classmethod
    def _time_limit(cls, v: Any) -> Any:
        if isinstance(v, bool) or isinstance(v, (int, float)):
            raise ValueError(
                f"time_limit must be a quoted string such as \"48:00:00\"; YAML read the unquoted value as the number {v!r} "
                "(it parses 48:00:00 as base 60): put quotes around it"
            )
        if isinstance(v, str) and slurm_time_seconds(v) is None:
            raise ValueError(f"time_limit {v!r} is not a Slurm time: use MINUTES, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, e.g. \"48:00:00\"")
        return v

    @property
    def time_limit_seconds(self) -> int | None:
        return None if self.time_limit is None else slurm_time_seconds(self.time_limit)

    @property
    def ranks_per_node(self) -> int:
        if self.procs_per_node is not None:
            return self.procs_per_node
        return self.gpus_per_node if self.gpus_per_node > 0 else 2

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @model_validator(mode="after")
    def _check(self) -> "ClusterConfig":
        if self.gpus_per_node > 0 and self.procs_per_node not in (None, self.gpus_per_node):
            raise ValueError(
                f"procs_per_node ({self.procs_per_node}) must equal gpus_per_node ({self.gpus_per_node}): one rank per GPU"
            )
        if self.backend == "local" and self.nodes != 1:
            raise ValueError("the local backend runs on one node: set cluster.nodes=1 or cluster.backend=slurm")
        return self


class StorageConfig(StrictModel):
    root: Path = Field(
        Path("./runs"),
        description="Directory below which runs and prepared data live when nothing more specific is set: `./runs` locally. "
        "In a project with an `aws:` section each kind of data goes to the shared file system whose `aws.fsx[].holds` names it, "
        "and `root` is used only for kinds that no shared file system holds (it must then be on one).",
    )
    datasets: Path | None = Field(
        None, description="Where prepared datasets are cached. Default: `<mount>/datasets` of the `aws.fsx` file system that "
        "holds `datasets`, else `<root>/datasets`. On a cluster it must be on a shared file system (see docs/walkthrough.md).",
    )
    runs: Path | None = Field(
        None, description="Base of the run directories `<runs>/<project>/<model>/` (config, checkpoints, metrics, job records). "
        "Default: the mount of the `aws.fsx` file system that holds `checkpoints`, else `root`.",
    )
    logs: Path | None = Field(
        None, description="Base of the Slurm output files `<logs>/<project>/logs/<model>/<job>-<id>.out`. Default: the mount of "
        "the `aws.fsx` file system that holds `logs`, else `root`.",
    )
    tensorboard: Path | None = Field(
        None, description="Base of the TensorBoard event directories `<tensorboard>/<project>/tensorboard/<model>/`. Default: the mount of "
        "the `aws.fsx` file system that holds `tensorboard`, else `tensorboard/` inside each run directory.",
    )
    outputs: Path | None = Field(
        None, description="Base of validation-suite results and storage benchmarks `<outputs>/<project>/validation/`. Default: "
        "the mount of the `aws.fsx` file system that holds `outputs`, else `root`.",
    )
    data_bucket: str | None = Field(None, description="`s3://bucket/prefix` where prepared datasets are published (`clustertrain data prepare --publish`); a model reads one with `data.source: s3://...`.")
    checkpoint_bucket: str | None = Field(
        None, description="`s3://bucket/prefix` (or a local path) where checkpoints are backed up (optional). "
        "Default: `s3://<aws.buckets.checkpoints>/checkpoints` when the aws: section names a checkpoint bucket.",
    )
    endpoint_url: str | None = Field(None, description="S3-compatible endpoint URL (default: AWS, or AWS_ENDPOINT_URL).")
    region: str | None = Field(None, description="AWS region of the buckets.")


class ModelEntry(StrictModel):
    name: str = Field(..., description="Model name: names its run directory, job and logs.")
    model: ArchConfig = Field(..., description="Architecture of the GPT.")
    data: DataConfig = Field(default_factory=DataConfig, description="Training data.")
    training: TrainingConfig = Field(..., description="Optimisation and schedule.")
    parallelism: ParallelismConfig = Field(default_factory=ParallelismConfig, description="How ranks split the work.")
    plan: ModelPlanConfig = Field(default_factory=ModelPlanConfig, description="Planning inputs for this model (clustertrain plan).")
    framework: Literal["clustertrain", "megatron"] = Field(
        "clustertrain", description="What trains the model: `clustertrain` (the built-in PyTorch trainer, CPU or GPU) or "
        "`megatron` (Megatron-LM's `pretrain_gpt.py` in the image, GPUs only; docs/megatron.md).",
    )
    megatron: MegatronConfig | None = Field(
        None, description="Megatron-LM options (`framework: megatron` only; defaults when omitted).")

    @property
    def megatron_options(self) -> MegatronConfig:
        """``megatron``, or its defaults when the section is omitted."""
        return self.megatron if self.megatron is not None else MegatronConfig()

    def structure_problems(self) -> list[tuple[str, str]]:
        """(field, problem) for what this model's framework cannot run, whatever the cluster."""
        out = structure_problems(self.model, self.parallelism)
        if self.framework == "megatron":
            return out + megatron_structure(self.model, self.parallelism, self.megatron_options)
        if self.megatron is not None:
            out.append(("megatron", "a megatron: section needs framework: megatron; set it, or remove the section"))
        return out + pipeline_problems(self.model, self.parallelism) + builtin_problems(self.parallelism, self.model)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if v in RESERVED_MODEL_NAMES:
            raise ValueError(f"model name {v!r} is reserved (a directory of the storage layout beside the run directories: "
                             f"{', '.join(RESERVED_MODEL_NAMES)}); rename the model")
        return _check_name(v, "model name")


class Project(StrictModel):
    doc_reference: ClassVar[str] = "docs/project-file.md"
    _file: Path | None = PrivateAttr(None)  # the file read_project read (None: built from a mapping)
    _overrides: tuple[str, ...] = PrivateAttr(())  # the --set items read_project applied
    _infra_state: Any = PrivateAttr(None)  # the cloud.state.InfraState beside the file (None: no stack deployed)
    _filled_from_state: tuple[str, ...] = PrivateAttr(())  # aws fields the resolver filled from it
    _built_image: str | None = PrivateAttr(None)  # the image: section's .sqsh, named by the resolver

    name: str = Field(..., description="Project name.")
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="Where and on what the models train.")
    storage: StorageConfig = Field(default_factory=StorageConfig, description="Shared file system root and buckets.")
    models: list[ModelEntry] = Field(..., min_length=1, description="Models to train (several can share one cluster).")
    plan: PlanConfig = Field(default_factory=PlanConfig, description="Planner settings (clustertrain plan).")
    launch: LaunchConfig = Field(default_factory=LaunchConfig, description="How Slurm jobs are submitted (clustertrain submit).")
    monitor: MonitorConfig = Field(default_factory=MonitorConfig, description="Node sampler, per-rank step timing and "
                                   "alarms while training (clustertrain status / report).")
    aws: AwsConfig | None = Field(None, description="AWS ParallelCluster and infrastructure settings (clustertrain cluster ...).")
    image: ImageConfig | None = Field(
        None, description="The training image (clustertrain image render / build / check). With it and no "
        "`cluster.container_image`, every rank runs in the image `image build` writes.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _check_name(v, "project name")

    @model_validator(mode="after")
    def _derive_storage(self) -> "Project":
        """The buckets and region of the aws: section are where runs back up and publish by default
        (prefixes ``checkpoints/`` and ``datasets/``: the only ones the generated storage policy lets nodes write)."""
        aws, storage = self.aws, self.storage
        if aws is not None:
            if storage.checkpoint_bucket is None and aws.buckets.checkpoints:
                storage.checkpoint_bucket = f"s3://{aws.buckets.checkpoints}/{CHECKPOINT_PREFIX}"
            if storage.data_bucket is None and aws.buckets.data:
                storage.data_bucket = f"s3://{aws.buckets.data}/{DATASET_PREFIX}"
            if storage.region is None:
                storage.region = aws.region
        return self

    @model_validator(mode="after")
    def _check(self) -> "Project":
        seen: set[str] = set()
        for i, m in enumerate(self.models):
            if m.name in seen:
                raise ValueError(f"models[{i}].name {m.name!r} is used twice; model names must be unique")
            seen.add(m.name)
            for field, problem in m.structure_problems()[:1]:
                raise ValueError(f"models[{i}].{field}: {problem}")
            p = m.parallelism
            if m.plan.gpus is not None:  # a share of one node
                rpn = self.cluster.ranks_per_node
                if m.plan.nodes is not None:
                    raise ValueError(f"models[{i}].plan.gpus: a share of a node ({m.plan.gpus} GPUs) cannot also have "
                                     f"plan.nodes ({m.plan.nodes}); keep one: plan.gpus below a node's, or plan.nodes")
                if m.plan.gpus > rpn:
                    raise ValueError(f"models[{i}].plan.gpus: {m.plan.gpus} GPUs span more than one node ({rpn} per "
                                     f"node); a model on several nodes takes whole nodes: set plan.nodes instead")
            elif self.plan.cluster_nodes is not None:  # models share the cluster: the planner allocates and reports
                for field, problem in node_problems(p, self.cluster.ranks_per_node)[:1]:
                    raise ValueError(f"models[{i}].{field}: {problem}")
                continue
            world = self.job_gpus(m)
            where = (f"a share of one node: plan.gpus {world}" if m.plan.gpus is not None else
                     f"{m.plan.nodes or self.cluster.nodes} node(s) x {self.cluster.ranks_per_node} ranks")
            for field, problem in world_problems(p, world, min(world, self.cluster.ranks_per_node))[:1]:
                raise ValueError(f"models[{i}].{field}: {problem} ({where})")
            dp = world // (p.tp * p.pp)
            t = m.training
            if t.global_batch % (t.micro_batch * dp):
                raise ValueError(
                    f"models[{i}].training.global_batch ({t.global_batch}) must be a multiple of micro_batch x dp "
                    f"({t.micro_batch} x {dp} = {t.micro_batch * dp})"
                )
            if m.framework == "clustertrain":  # torch's schedules (Megatron's 1F1B also runs fewer micro-batches than pp)
                for field, problem in microbatch_problems(p, t.global_batch // (t.micro_batch * dp))[:1]:
                    raise ValueError(f"models[{i}].{field}: {problem}")
        return self

    # ----- helpers used by several stages -----
    @property
    def file(self) -> Path | None:
        """The project file :func:`read_project` read (None for a project built from a mapping)."""
        return self._file

    @property
    def infra_state(self) -> Any:
        """What ``clustertrain cluster infra deploy`` recorded beside the project file
        (:class:`clustertrain.cloud.state.InfraState`), or None."""
        return self._infra_state

    def attach_infra_state(self, state: Any, filled: tuple[str, ...]) -> None:
        """The resolver's step (:func:`clustertrain.resolve.resolve`): the deployed stack's state beside the file, and the
        ``aws`` fields it filled in."""
        self._infra_state, self._filled_from_state = state, tuple(filled)

    def attach_built_image(self, sqsh: str | None) -> None:
        """The resolver's step: the ``.sqsh`` that ``clustertrain image build`` writes for the ``image:`` section."""
        self._built_image = sqsh

    @property
    def filled_from_state(self) -> tuple[str, ...]:
        """The ``aws`` fields the project file left out and the deployed stack's outputs filled."""
        return self._filled_from_state

    @property
    def overrides(self) -> tuple[str, ...]:
        """The ``--set`` items :func:`read_project` applied to :attr:`file`, in order."""
        return self._overrides

    @property
    def source(self) -> str:
        """What an error about this project's content names: the file it was loaded from, else the project."""
        return str(self._file) if self._file is not None else f"project {self.name!r}"

    @property
    def container_image(self) -> str | None:
        """The image every rank runs in (Pyxis ``--container-image``): ``cluster.container_image``; else, with an
        ``image:`` section, the ``.sqsh`` that ``clustertrain image build`` writes; else None (the host's interpreter)."""
        if self.cluster.container_image:
            return self.cluster.container_image
        if self.image is not None:
            if self._built_image is None:
                raise RuntimeError("Project.container_image read before clustertrain.resolve.resolve(project) "
                                   "named the built image")
            return self._built_image
        return None

    def model(self, name: str) -> ModelEntry:
        for m in self.models:
            if m.name == name:
                return m
        raise ConfigError(f"no model named {name!r} in project {self.name!r}; models: {', '.join(m.name for m in self.models)}")

    def dp_size(self, entry: ModelEntry) -> int:
        """Data-parallel ranks of ``entry`` on its share of a node (models[].plan.gpus), its pinned node count
        (models[].plan.nodes) or cluster.nodes."""
        return self.job_gpus(entry) // (entry.parallelism.tp * entry.parallelism.pp)

    def shares_node(self, entry: ModelEntry) -> bool:
        """``entry`` runs on a share of one node (``models[].plan.gpus`` below a node's): its job asks Slurm for its
        GPUs, memory and CPUs instead of ``--exclusive`` whole nodes."""
        return entry.plan.gpus is not None and entry.plan.gpus < self.cluster.ranks_per_node

    def job_gpus(self, entry: ModelEntry) -> int:
        """Ranks (one per GPU; rank slots with CPU workers) of ``entry``'s job: ``models[].plan.gpus``, else its
        pinned node count (``models[].plan.nodes``) or ``cluster.nodes`` times the ranks per node."""
        if entry.plan.gpus is not None:
            return entry.plan.gpus
        return (entry.plan.nodes or self.cluster.nodes) * self.cluster.ranks_per_node

    def job_nodes(self, entry: ModelEntry) -> int:
        """Nodes of ``entry``'s job: 1 for a share of a node, else ``models[].plan.nodes`` or ``cluster.nodes``."""
        return 1 if entry.plan.gpus is not None else (entry.plan.nodes or self.cluster.nodes)


# ---------------------------------------------------------------------------------------------
# loading


def read_project(path: str | Path, overrides: list[str] | None = None) -> Project:
    """Read, override and validate a project file (relative paths made absolute against it): the project as the file
    describes it. Commands load it with :func:`clustertrain.resolve.load_project`, which adds what the other stages
    derive (the deployed stack's outputs, the built image). Raises ConfigError with one line per mistake."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: project file not found (pass the path to a YAML file, e.g. examples/quickstart.yaml)")
    raw = require_mapping(read_yaml(path), path, "a YAML mapping with keys name, cluster, storage, models "
                          "(see examples/quickstart.yaml)")
    applied: list[tuple[str, tuple]] = []
    for item in overrides or []:
        try:
            applied.append((item.partition("=")[0].strip(), apply_override(raw, item)))
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
    try:
        project = Project.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_validation_message(e, path, applied)) from None
    project._file, project._overrides = path, tuple(overrides or ())
    base = path.resolve().parent
    storage = project.storage
    for key in ("root", "datasets", "runs", "logs", "tensorboard", "outputs"):
        value = getattr(storage, key)
        if value is not None and not value.is_absolute():
            setattr(storage, key, (base / value).resolve())
    if project.image is not None:
        for key in ("dir", "versions", "work_dir"):
            value = getattr(project.image, key)
            if value is not None and not value.is_absolute():
                setattr(project.image, key, (base / value).resolve())
    for m in project.models:
        for holder in [m.data, *m.data.blend]:
            src = holder.source
            if not src.startswith(("builtin:", "s3://")) and not Path(src).is_absolute():
                holder.source = str(base / src)
        if m.data.tokenizer != "byte" and not Path(m.data.tokenizer.removeprefix("hf:")).is_absolute():
            m.data.tokenizer = str(base / m.data.tokenizer.removeprefix("hf:"))
        init = m.training.init_from  # a Hugging Face directory (clustertrain.train.init_from), unless s3://
        if init is not None and not init.startswith("s3://") and not Path(init).is_absolute():
            m.training.init_from = str(base / init)
    return project


def _validation_message(err: ValidationError, path: Path, applied: list[tuple[str, tuple]]) -> str:
    """The lines for a project that does not validate: one per mistake, in :func:`ordered_errors`' order (unknown
    keys first, cross-field checks last). A value that ``--set KEY`` wrote (or one below it) is blamed on the
    override, not on a line of the file that does not hold it; an error about a section an override changed names
    the override too."""
    lines = [_blamed_line(e, path, applied) for e in ordered_errors(err, Project)]
    return "\n".join(dict.fromkeys(lines))


def _blamed_line(error: dict, path: Path, applied: list[tuple[str, tuple]]) -> str:
    """One error's line, its source the file's line or the ``--set`` override that wrote the value."""
    loc = tuple(error["loc"]) or leading_loc(error["msg"])
    for key, target in reversed(applied):  # the last override of a path is the one that counts
        wrote = loc[:len(target)] == target or (error["type"] == "extra_forbidden" and target[:len(loc)] == loc)
        if loc and wrote:  # the bad value, or the unknown key, is the override's
            return format_error(error, f"{path} (--set {key})", Project)
        if loc and target[:len(loc)] == loc:
            return format_error(error, f"{path} (with --set {key})", Project)
    return format_error(error, str(path), Project, path)


def validate_project(raw: dict[str, Any], source: str = "project", path: Path | None = None) -> Project:
    """Validate a raw mapping; with ``path`` each line of the error (one per mistake) names the key's line in that file."""
    return validate_model(raw, Project, source, path=path)


def apply_override(raw: dict[str, Any], item: str) -> tuple:
    """Apply one ``a.b.c=value`` override to the raw mapping (value parsed as a YAML scalar); return the
    location it wrote, list items as indices (``models.tiny.training.lr`` → ``("models", 0, "training", "lr")``)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. models.0.training.max_steps=40")
    key, _, text = item.partition("=")
    parts = [p for p in key.strip().split(".")]
    if not key.strip() or any(not p for p in parts):
        raise ConfigError(f"--set {item!r}: empty key part; use dotted keys like models.0.training.max_steps")
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
    node: Any = raw
    where: list[str | int] = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            idx = _list_index(node, part)
            if idx is None:
                names = [m.get("name") for m in node if isinstance(m, dict)]
                raise ConfigError(f"--set {key}: {part!r} is neither an index (0-{len(node) - 1}) nor a name "
                                  f"({', '.join(map(str, names))}); use one of them")
            where.append(idx)
            if last:
                node[idx] = value
            else:
                node[idx] = _own(node[idx])
                node = node[idx]
        elif isinstance(node, dict):
            where.append(part)
            if last:
                node[part] = value
            else:
                node[part] = {} if node.get(part) is None else _own(node[part])
                node = node[part]
        else:
            value_key = ".".join(parts[:i])
            raise ConfigError(f"--set {key}: {value_key} is a value, not a section; set {value_key} itself "
                              "or a key inside a section")
    return tuple(where)


def _own(node: Any) -> Any:
    """A shallow copy of a section on an override's path: YAML anchors and merge keys (``<<: *small``) share
    one object between models, and an override of one model must not change the others."""
    return dict(node) if isinstance(node, dict) else list(node) if isinstance(node, list) else node


def _list_index(node: list, part: str) -> int | None:
    if part.lstrip("-").isdigit():
        idx = int(part)
        return idx if 0 <= idx < len(node) else None
    for i, m in enumerate(node):
        if isinstance(m, dict) and m.get("name") == part:
            return i
    return None


# ---------------------------------------------------------------------------------------------
# identity


#: architecture fields added after checkpoints existed, with the values that mean the earlier model: left out of the
#: fingerprint at these values, so runs of a classic GPT keep resuming (``preset`` is always left out: the fields it
#: fills in are what count)
_LATER_ARCH_FIELDS = {"kv_heads": None, "position": "learned", "rope_theta": 10000.0, "rope_scaling": None,
                      "ffn_multiple_of": 64, "ffn_multiplier": None, "norm_eps": 1e-5, "bias": True}


def architecture_fingerprint(project: Project, entry: ModelEntry) -> str:
    """What a checkpoint depends on: project name, model name, architecture. Changes make old checkpoints unusable."""
    arch = entry.model.model_dump(mode="json", exclude={"preset"})
    for field, earlier in _LATER_ARCH_FIELDS.items():
        if arch.get(field) == earlier:
            arch.pop(field)
    blob = json.dumps({"project": project.name, "model": entry.name, "arch": arch}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def dump_project(project: Project) -> str:
    return yaml.safe_dump(project.model_dump(mode="json"), sort_keys=False)
