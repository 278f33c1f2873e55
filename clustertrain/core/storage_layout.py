"""Where each kind of data lives: the one rule from which every stage derives a job's paths.

A project names the places; nothing else picks a directory. Five kinds of data, each with a base:

==============  ====================  ==============================================================
kind            field                 used for
==============  ====================  ==============================================================
datasets        ``storage.datasets``  prepared datasets (content-addressed, shared by all models):
                                      ``<datasets>/<name>-<hash>/``
checkpoints     ``storage.runs``      run directories ``<runs>/<project>/<model>/`` (config, run.json,
                                      checkpoints, metrics, status, job records)
logs            ``storage.logs``      Slurm output ``<logs>/<project>/logs/<model>/<job>-<id>.out``
tensorboard     ``storage.tensorboard`` TensorBoard events ``<tensorboard>/<project>/tensorboard/<model>/``
outputs         ``storage.outputs``   validation suites and storage benchmarks
                                      ``<outputs>/<project>/validation/<time>/``
==============  ====================  ==============================================================

Beside them, with an ``image:`` section, the training images: ``<images>/<name>-<tag>.sqsh``, where
``images`` is ``image.dir`` or ``images/`` beside the datasets directory (the file system that holds
datasets: read-mostly data every node loads at job start).

A base is the field when it is set; otherwise, in a project with an ``aws:`` section, the mount
directory of the shared file system whose ``holds`` names the kind (``aws.fsx[].holds``; kinds no
file system names go to the first one, see :meth:`AwsConfig.layout`); otherwise derived from
``storage.root`` (``<root>/datasets``; ``<root>`` for runs, logs and outputs; TensorBoard inside the
run directory). Kinds may share a base: the ``logs``, ``tensorboard`` and ``validation`` levels keep
them apart, and model names may not be one of :data:`clustertrain.project.RESERVED_MODEL_NAMES`
(the project file's validation refuses them).

On a cluster every one of these must be on a shared file system of the ``aws:`` section (an
``aws.fsx`` or ``aws.ebs`` mount): the batch node, every rank and the head node must see the same
files. :func:`off_mount_problems` names each field that breaks that rule; ``clustertrain check``,
``submit`` and ``cluster config`` refuse such a project. The node scripts create exactly the
directories of :func:`project_dirs` (``setup-dirs.sh``), so what exists on the cluster is what the
jobs use.

Dependencies run one way: this module derives paths from a :class:`~clustertrain.project.Project`
(imported for type checking only); the project module imports nothing from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clustertrain.project import Project

KINDS = ("datasets", "checkpoints", "logs", "tensorboard", "outputs")
#: last component of :meth:`StorageLayout.bench_dir`
BENCH_DIR_NAME = "storage-bench"
#: project-file field that overrides each kind's base
FIELDS = {"datasets": "storage.datasets", "checkpoints": "storage.runs", "logs": "storage.logs",
          "tensorboard": "storage.tensorboard", "outputs": "storage.outputs"}


@dataclass(frozen=True)
class StorageLayout:
    """The resolved base of each kind for one project, and where each base came from."""

    project: str
    datasets: Path
    runs: Path
    logs: Path
    tensorboard: Path | None      # None: TensorBoard events stay inside each run directory
    outputs: Path
    origin: dict[str, str]        # kind -> the field the base came from (storage.runs, aws.fsx[1].holds, storage.root)
    mounts: tuple[str, ...] = ()  # shared mounts of the aws: section (empty without one)
    images: Path | None = None    # Enroot images (.sqsh) of the image: section; None without one
    images_origin: str = "image.dir"

    def run_dir(self, model: str) -> Path:
        return self.runs / self.project / model

    def log_dir(self, model: str) -> Path:
        return self.logs / self.project / "logs" / model

    def tensorboard_dir(self, model: str) -> Path | None:
        """Where rank 0 writes TensorBoard events; None = ``RUN_DIR/tensorboard``."""
        return None if self.tensorboard is None else self.tensorboard / self.project / "tensorboard" / model

    def validation_dir(self) -> Path:
        return self.outputs / self.project / "validation"

    def bench_dir(self, target: str | Path) -> Path:
        """Where the storage benchmark writes on the file system mounted at ``target`` (one of :attr:`mounts`, or the
        runs base of a project without them): ``<target>/<project>/validation/storage-bench``. A mount's root is
        root-owned 0755 on a real file system; this directory is the project's (``setup-dirs.sh`` creates it on every
        shared mount with the per-model directories' owner and mode, :func:`project_dirs`)."""
        return Path(target) / self.project / "validation" / BENCH_DIR_NAME

    def suspects_file(self) -> Path:
        """The project's suspect-node list (:mod:`clustertrain.monitor.suspects`), beside its run directories: every
        model's jobs read and add to it."""
        return self.runs / self.project / "suspects.jsonl"

    def bases(self) -> dict[str, Path]:
        """kind -> base directory (TensorBoard only when it has its own)."""
        out = {"datasets": self.datasets, "checkpoints": self.runs, "logs": self.logs, "outputs": self.outputs}
        if self.tensorboard is not None:
            out["tensorboard"] = self.tensorboard
        return out


def _holders(project: "Project") -> dict[str, tuple[str, str]]:
    """kind -> (mount dir, 'aws.fsx[i].holds' or similar) from the aws: section."""
    aws = project.aws
    if aws is None:
        return {}
    layout = aws.layout()
    where: dict[str, str] = {}
    for i, f in enumerate(aws.fsx):
        for kind in f.holds:
            where[kind] = f"aws.fsx[{i}].holds"
    first = "aws.fsx[0].mount_dir" if aws.fsx else "aws.ebs[0].mount_dir"
    return {kind: (mount, where.get(kind, first)) for kind, mount in layout.items()}


def storage_layout(project: "Project") -> StorageLayout:
    """The layout of ``project`` (see the module docstring)."""
    s = project.storage
    holders = _holders(project)
    root = Path(s.root)
    explicit = {"datasets": s.datasets, "checkpoints": s.runs, "logs": s.logs, "tensorboard": s.tensorboard,
                "outputs": s.outputs}
    bases: dict[str, Path | None] = {}
    origin: dict[str, str] = {}
    for kind in KINDS:
        if explicit[kind] is not None:
            bases[kind], origin[kind] = Path(explicit[kind]), FIELDS[kind]
        elif kind in holders:
            mount, where = holders[kind]
            bases[kind] = Path(mount) / "datasets" if kind == "datasets" else Path(mount)
            origin[kind] = where
        elif kind == "tensorboard":
            bases[kind], origin[kind] = None, "storage.root"
        else:
            bases[kind] = root / "datasets" if kind == "datasets" else root
            origin[kind] = "storage.root"
    mounts = tuple(shared_mounts(project))
    images, images_origin = None, "image.dir"
    if project.image is not None:
        explicit_dir = project.image.dir
        images = Path(explicit_dir) if explicit_dir is not None else bases["datasets"].parent / "images"  # type: ignore[union-attr]
        images_origin = "image.dir" if explicit_dir is not None else origin["datasets"]
    return StorageLayout(project=project.name, datasets=bases["datasets"], runs=bases["checkpoints"],  # type: ignore[arg-type]
                         logs=bases["logs"], tensorboard=bases["tensorboard"], outputs=bases["outputs"],  # type: ignore[arg-type]
                         origin=origin, mounts=mounts, images=images, images_origin=images_origin)


def shared_mounts(project: "Project") -> list[str]:
    """Mount directories of the aws: section's shared file systems (FSx for Lustre, then EBS)."""
    aws = project.aws
    if aws is None:
        return []
    return [f.mount_dir for f in aws.fsx] + [e.mount_dir for e in aws.ebs]


def mount_of(path: str | Path, mounts: list[str] | tuple[str, ...]) -> str | None:
    """The deepest mount in ``mounts`` that contains ``path`` (lexically), or None."""
    p = PurePosixPath(str(path))
    inside = [m for m in mounts if p == PurePosixPath(m) or PurePosixPath(m) in p.parents]
    return max(inside, key=len) if inside else None


def unmounted_here(project: "Project", path: str | Path) -> str | None:
    """The cluster mount (``aws.fsx``/``aws.ebs``) that holds ``path`` when this machine does not have it, else None
    (a local project, a path on no cluster mount, or the mount is here)."""
    if project.aws is None:
        return None
    mount = mount_of(str(path), storage_layout(project).mounts)
    return mount if mount is not None and not Path(mount).is_dir() else None


def require_mounted(project: "Project", path: str | Path, what: str, where: str) -> None:
    """:class:`~clustertrain.core.errors.RunDirError` (one line) when ``path`` lies on a cluster mount this machine does
    not have: writing there would make a local directory no job sees (reading would find nothing). ``what`` names
    the path, ``where`` the command to run on the head node instead."""
    mount = unmounted_here(project, path)
    if mount is not None:
        from clustertrain.core.errors import RunDirError

        raise RunDirError(f"{path} is on the cluster's {mount}, which is not mounted on this machine: {what} written "
                          f"here would be a local copy no job sees, so nothing was written; run `{where}` on the head "
                          f"node (or a node that mounts {mount})")


def off_mount_problems(project: "Project", extra: dict[str, str | Path | None] | None = None) -> list[tuple[str, str]]:
    """``(field, message)`` for every job path of a cluster project that is not on a shared mount.

    Only projects with an ``aws:`` section are checked (a local project has no shared file system to be
    on). ``extra`` adds more ``field -> path`` pairs to check (the interpreter, a container image...)."""
    if project.aws is None:
        return []
    layout = storage_layout(project)
    mounts = layout.mounts
    if not mounts:
        return [("aws.fsx", "the aws: section has no shared file system (aws.fsx or aws.ebs), so no path a job uses "
                 "is shared between nodes; add an FSx for Lustre file system")]
    shown = ", ".join(mounts)
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for kind, base in layout.bases().items():
        field = layout.origin[kind]
        if mount_of(base, mounts) is None and field not in seen:
            seen.add(field)
            fix = (f"set {FIELDS[kind]} to a directory on one of them, or list {kind!r} in an aws.fsx[].holds"
                   if field == "storage.root" else f"set {field} to a directory on one of them")
            out.append((field, f"{base} ({kind}) is not on a shared file system of the aws: section "
                               f"(mounts: {shown}); {fix}"))
    if layout.images is not None and mount_of(layout.images, mounts) is None and layout.images_origin not in seen:
        fix = "set image.dir to a directory on one of them"
        out.append(("image.dir", f"{layout.images} (training images) is not on a shared file system of the aws: section "
                                 f"(mounts: {shown}); {fix}"))
    for field, path in (extra or {}).items():
        if path is not None and mount_of(path, mounts) is None:
            out.append((field, f"{path} is not on a shared file system of the aws: section (mounts: {shown}); "
                               "every node must see the same file: put it on one of them"))
    return out


def project_dirs(project: "Project") -> list[str]:
    """Every directory the project's jobs write into, each with its parents below the file system's mount,
    parents first: what ``setup-dirs.sh`` creates (so each gets the owner and mode, not just the leaves)."""
    layout = storage_layout(project)
    leaves: list[Path] = [layout.datasets, layout.validation_dir()] + ([layout.images] if layout.images else [])
    leaves += [layout.bench_dir(m) for m in layout.mounts]
    for m in project.models:
        leaves += [layout.run_dir(m.name), layout.log_dir(m.name)]
        tb = layout.tensorboard_dir(m.name)
        if tb is not None:
            leaves.append(tb)
    dirs: list[Path] = []
    for leaf in leaves:
        top = mount_of(leaf, layout.mounts)
        chain = [leaf, *leaf.parents]
        for d in reversed(chain[: chain.index(Path(top))] if top else [leaf]):
            if d not in dirs:
                dirs.append(d)
    return [str(d) for d in dirs]
