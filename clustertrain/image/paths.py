"""Names and places of a project's training image: one rule, read by ``image build``, ``check``, ``submit``.

* docker reference ``<name>:<tag>`` — ``image.name``; ``image.tag`` or ``<clustertrain version>-<digest>``
  where the digest covers the pins file and the Megatron choice (:func:`clustertrain.image.versions.digest`);
* Enroot image ``<images>/<name>-<tag>.sqsh`` (``/`` in the name becomes ``+``), ``<images>`` from the
  storage layout (:attr:`clustertrain.core.storage_layout.StorageLayout.images`);
* the image's interpreter (``versions.yaml`` ``interpreter``) — the jobs' ``python`` when they run in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from clustertrain import __version__
from clustertrain.core.errors import ImageError
from clustertrain.image.config import ImageConfig
from clustertrain.image.versions import digest, load_versions
from clustertrain.core.storage_layout import storage_layout

if TYPE_CHECKING:
    from clustertrain.project import Project


@dataclass(frozen=True)
class ImageRef:
    """The built image of a project."""

    name: str
    tag: str
    sqsh: Path
    versions: Path | None  # the pins file (None: the one shipped with clustertrain)
    megatron: bool
    interpreter: str

    @property
    def reference(self) -> str:
        """``name:tag`` — what ``docker build --tag`` and ``enroot import dockerd://`` name."""
        return f"{self.name}:{self.tag}"


def image_config(project: "Project") -> ImageConfig:
    if project.image is None:
        raise ImageError(f"project {project.name!r} has no image: section; add one (e.g. `image: {{dir: /fsx/data/images}}`, "
                         "docs/image.md) to render, build and check its training image")
    return project.image


def image_tag(project: "Project") -> str:
    cfg = image_config(project)
    return cfg.tag or f"{__version__}-{digest(cfg.versions, cfg.megatron)}"


def sqsh_path(project: "Project") -> Path:
    """``<images>/<name>-<tag>.sqsh``."""
    cfg = image_config(project)
    images = storage_layout(project).images
    assert images is not None  # set whenever the image: section is
    return images / f"{cfg.name.replace('/', '+')}-{image_tag(project)}.sqsh"


def image_ref(project: "Project") -> ImageRef:
    cfg = image_config(project)
    return ImageRef(name=cfg.name, tag=image_tag(project), sqsh=sqsh_path(project), versions=cfg.versions,
                    megatron=cfg.megatron, interpreter=load_versions(cfg.versions).interpreter)


def image_interpreter(project: "Project") -> str | None:
    """The interpreter inside the project's built image when the ranks run in that image; None otherwise
    (no ``image:`` section, or ``cluster.container_image`` names another image)."""
    if project.image is None:
        return None
    if project.cluster.container_image and project.cluster.container_image != str(sqsh_path(project)):
        return None
    return load_versions(project.image.versions).interpreter
