"""The disk an image build takes, and where: ``image build`` (``--dry-run`` too) states it per place and refuses a
place without the room; ``check`` refuses a head node root volume that cannot hold a build.

Where the bytes go. ``docker build`` pulls the NGC base into Docker's data root (its compressed layers, then
unpacked), builds the build stage and the image's own layers there. ``enroot import dockerd://`` (enroot@8ea147d
``src/docker.sh``, ``docker::daemon::import``) runs ``docker create``, then ``docker export | tar -x`` into a
temporary directory under ``ENROOT_TEMP_PATH`` — a whole unpacked copy of the image — and ``mksquashfs`` from it
with ``ENROOT_SQUASH_OPTIONS``, by default ``-comp lzo -noD`` (``enroot.in``): data blocks are stored
uncompressed, so the ``.sqsh`` is about as large as the unpacked image.

========================  =============================================================  ====================
place                     holds                                                          sizes (versions.yaml)
========================  =============================================================  ====================
Docker's data root        the base as pulled and unpacked, the build stage, the image's  all four
                          layers (``/var/lib/docker``, or ``data-root`` in
                          ``/etc/docker/daemon.json``)
``<work>/enroot/tmp``     the unpacked export while ``mksquashfs`` runs, then removed    base unpacked + added
images directory          the ``.sqsh`` (``.partial`` while written, then renamed)       base unpacked + added
========================  =============================================================  ====================

Places on one file system add up (:func:`space_problem` groups them by device). The sizes are data
(``footprint:`` in ``versions.yaml``, each with its source; a pins file without them uses the shipped ones).

Head node (:func:`root_volume_problem`, an ``aws:`` project): ``aws.head_node.root_volume_gb`` (GiB) must hold
the AMI itself — counted as 35 GiB, the smallest root volume ParallelCluster's AMIs allow
(``clustertrain/cloud/config.py``) — plus Docker's data root, plus the export unless ``image.work_dir`` puts it
elsewhere (a head node has no instance store: the work dir falls back to the system temp directory).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from clustertrain.image.versions import FootprintSizes, VersionsFile, load_versions

if TYPE_CHECKING:
    from clustertrain.project import Project

GB = 10**9
GIB = 2**30
AMI_GIB = 35  # the smallest head node root volume the aws: section allows (cloud/config.py, ge=35): the AMI's own size
DOCKER_DEFAULT_ROOT = Path("/var/lib/docker")
DOCKER_DAEMON_JSON = Path("/etc/docker/daemon.json")
FIX_DOC = 'docs/image.md, "Disk"'

FreeBytes = Callable[[Path], int]


@dataclass(frozen=True)
class Place:
    """One directory a build writes into, and how many bytes it needs there."""

    what: str        # "Docker's data root", "the enroot export", "the .sqsh"
    path: Path
    need: int        # bytes
    holds: str       # what makes up the bytes, in words
    fix: str         # what to do when it does not fit


def sizes_of(versions: VersionsFile) -> FootprintSizes:
    """The pins' ``footprint:``, else the one shipped with clustertrain."""
    if versions.footprint is not None:
        return versions.footprint
    shipped = load_versions().footprint
    assert shipped is not None, "the shipped versions.yaml has a footprint: section"
    return shipped


def unpacked_bytes(s: FootprintSizes) -> int:
    """The built image unpacked: what ``docker export`` writes, and about what the ``.sqsh`` holds (``-noD``)."""
    return round((s.base_unpacked.gb + s.added.gb) * GB)


def docker_bytes(s: FootprintSizes) -> int:
    return round((s.base_compressed.gb + s.base_unpacked.gb + s.build_stage.gb + s.added.gb) * GB)


def docker_data_root(daemon_json: Path = DOCKER_DAEMON_JSON) -> Path:
    """Docker's data root on this machine: ``data-root`` in ``daemon.json`` when set, else ``/var/lib/docker``."""
    try:
        root = json.loads(daemon_json.read_text()).get("data-root")
    except (OSError, ValueError, AttributeError):
        root = None
    return Path(root) if isinstance(root, str) and root.startswith("/") else DOCKER_DEFAULT_ROOT


def build_places(s: FootprintSizes, *, docker_root: Path, enroot_temp: Path, images: Path) -> list[Place]:
    gb = lambda size: f"{size.gb:g}"  # noqa: E731
    return [
        Place("Docker's data root", docker_root, docker_bytes(s),
              f"NGC base {gb(s.base_compressed)} pulled + {gb(s.base_unpacked)} unpacked, build stage {gb(s.build_stage)}, "
              f"the image's layers {gb(s.added)}",
              f"move Docker's data-root ({DOCKER_DAEMON_JSON}) to a larger disk, or grow the disk "
              "(aws.head_node.root_volume_gb on the head node)"),
        Place("the enroot export", enroot_temp, unpacked_bytes(s),
              "`docker export | tar` unpacks the image there for mksquashfs, removed after",
              "pass --work-dir (or set image.work_dir) on a larger disk"),
        Place("the .sqsh", images, unpacked_bytes(s), "mksquashfs -noD stores data blocks uncompressed",
              "free space there, or set image.dir to a shared file system with room"),
    ]


def describe(places: list[Place]) -> list[str]:
    """The ``--dry-run`` lines: where the bytes go."""
    return [f"# disk: {p.need / GB:.1f} GB for {p.what} under {p.path} ({p.holds})" for p in places]


def existing_ancestor(path: Path) -> Path:
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def space_problem(places: list[Place], free_bytes: FreeBytes) -> str | None:
    """The first file system without room for the places on it (their needs added up), as one line; None if all fit."""
    groups: dict[int, list[tuple[Place, Path]]] = {}
    for place in places:
        where = existing_ancestor(place.path)
        groups.setdefault(os.stat(where).st_dev, []).append((place, where))
    for members in groups.values():
        need = sum(p.need for p, _ in members)
        free = free_bytes(members[0][1])
        if free < need:
            first = members[0][0]
            what = " + ".join(f"{p.what} {p.need / GB:.1f} GB" for p, _ in members)
            return (f"{first.path}: {free / GB:.1f} GB free on its file system, the build needs {need / GB:.1f} GB there "
                    f"({what}); {first.fix} ({FIX_DOC})")
    return None


def root_volume_need(s: FootprintSizes, *, export_on_root: bool) -> int:
    """Bytes a head node root volume needs for a build: the AMI, Docker's data root, the export when it is there."""
    return AMI_GIB * GIB + docker_bytes(s) + (unpacked_bytes(s) if export_on_root else 0)


def root_volume_problem(project: "Project", *, export_on_root: bool | None = None) -> str | None:
    """Why ``aws.head_node.root_volume_gb`` cannot hold an image build on the head node (one line); None when it
    can, or without an ``aws:`` or ``image:`` section. ``export_on_root`` None: unless ``image.work_dir`` is set."""
    if project.aws is None or project.image is None:
        return None
    if export_on_root is None:
        export_on_root = project.image.work_dir is None
    s = sizes_of(load_versions(project.image.versions))
    need = root_volume_need(s, export_on_root=export_on_root)
    have = project.aws.head_node.root_volume_gb
    if have * GIB >= need:
        return None
    parts = f"the AMI's {AMI_GIB} GiB, Docker's data root {docker_bytes(s) / GB:.0f} GB" + (
        f", the enroot export {unpacked_bytes(s) / GB:.0f} GB" if export_on_root else "")
    return (f"aws.head_node.root_volume_gb: {have} GiB cannot hold an image build on the head node, which needs "
            f"{need / GIB:.0f} GiB ({parts}); set it to at least {-(-need // GIB)} ({FIX_DOC})")
