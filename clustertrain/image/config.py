"""The ``image:`` section of the project file: the training image ``clustertrain image`` renders, builds and checks.

It imports nothing from clustertrain but :mod:`clustertrain.core.schema`, so that ``project.py`` can compose it.
With the section present and ``cluster.container_image`` unset, every rank runs in the image
``clustertrain image build`` writes (:attr:`clustertrain.project.Project.container_image`).

Example::

    image:
      name: clustertrain-train     # docker repository name; the .sqsh is <dir>/<name>-<tag>.sqsh
      dir: /fsx/data/images        # default: images/ beside the datasets directory
      megatron: true               # add Megatron-LM at the pinned tag
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, field_validator

from clustertrain.core.schema import StrictModel

#: docker's repository path grammar (distribution/reference): lowercase components separated by '/',
#: each alphanumerics joined by '.', '_', '__' or '-' runs; an optional registry host first.
NAME_RE = re.compile(r"^(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
                     r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
#: docker's tag grammar
TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


class ImageConfig(StrictModel):
    name: str = Field(
        "clustertrain-train", description="Docker image name (repository), lowercase as docker requires; the Enroot image is "
        "`<dir>/<name>-<tag>.sqsh` (`/` in the name becomes `+`).",
    )
    tag: str | None = Field(
        None, description="Docker tag. Default: the clustertrain version and a digest of the pins "
        "(`0.1.0-3f2a9c1b`), so that a new pin set is a new image and running jobs keep theirs.",
    )
    dir: Path | None = Field(
        None, description="Directory of the Enroot images (`.sqsh`); on a cluster it must be on a shared file system. "
        "Default: `images/` beside the datasets directory (`/fsx/data/images` when `/fsx/data` holds datasets).",
    )
    megatron: bool = Field(False, description="Add Megatron-LM at the pinned tag (`/opt/megatron-lm`, installed into the image's "
                                              "clustertrain environment).")
    versions: Path | None = Field(
        None, description="A pins file of your own (copy `clustertrain/image/versions.yaml`, change versions and sources). "
        "Default: the pins shipped with clustertrain; `clustertrain image render` writes the resolved set to `versions.json`.",
    )
    work_dir: Path | None = Field(
        None, description="Where `image build` puts the build context and Enroot's cache, data and temp directories "
        "(`<work_dir>/enroot/...`, as the compute nodes' script sets them). Default: `aws.enroot.local_dir` (`/scratch`, the "
        "node's NVMe) when that exists on the building machine, else the system temp directory.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v) or len(v) > 255:
            raise ValueError(f"image name {v!r} is not a docker image name: lowercase letters, digits and '.', '_', '-' "
                             "between them, components separated by '/' (e.g. clustertrain-train or myteam/train)")
        return v

    @field_validator("tag")
    @classmethod
    def _tag(cls, v: str | None) -> str | None:
        if v is not None and not TAG_RE.match(v):
            raise ValueError(f"image tag {v!r} is not a docker tag: up to 128 letters, digits, '_', '.' or '-', "
                             "not starting with '.' or '-'")
        return v
