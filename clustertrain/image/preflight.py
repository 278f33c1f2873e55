"""``image_findings(project)``: the image stage's part of ``clustertrain check``.

=====================================================  =======  ==============================================
rule                                                   level    path
=====================================================  =======  ==============================================
the pins file loads (``image.versions`` or the one     error    ``image.versions``
shipped with clustertrain)
the pins work together by the compatibility table      error    ``image.versions: <field>`` (e.g. ``pins.nccl``)
(:func:`clustertrain.image.versions.compat_problems`)
the pins render into a Dockerfile (names, versions)    error    ``image.versions``
with an ``aws:`` section, the head node's root volume  error    ``aws.head_node.root_volume_gb``
holds an image build (:func:`clustertrain.image.
footprint.root_volume_problem`: the AMI, Docker's
data root, the enroot export unless ``image.work_dir``)
=====================================================  =======  ==============================================

Whether the image file exists, and is on a shared file system, is the launch stage's rule (it is what every
job runs in: :func:`clustertrain.launch.preflight.image_findings`). Nothing is built or written here; the
clustertrain wheel is not built either (``image render`` does that).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clustertrain.core.errors import ImageError
from clustertrain.core.findings import Finding
from clustertrain.image.versions import DEFAULT_VERSIONS, compat_problems, load_compat, load_versions

if TYPE_CHECKING:
    from clustertrain.project import Project

FIX = "pin versions that compat.yaml lists together, each with its source (docs/image.md, \"Moving to a newer release\")"


def image_findings(project: "Project") -> list[Finding]:
    if project.image is None:
        return []
    source = project.image.versions or DEFAULT_VERSIONS
    try:
        versions = load_versions(project.image.versions)
        problems = compat_problems(versions, load_compat(), project.image.megatron)
        if not problems:
            from clustertrain.image.recipe import validate_pins

            validate_pins(versions, str(source))
    except ImageError as err:
        return [Finding("error", "image.versions", str(err), FIX)]
    out = [Finding("error", f"image.versions: {field}", f"{source}: {message}", FIX) for field, message in problems]
    from clustertrain.image.footprint import root_volume_problem

    volume = root_volume_problem(project)
    if volume:
        field, _, rest = volume.partition(": ")
        message, _, fix = rest.rpartition("; ")
        out.append(Finding("error", field, message, fix))
    return out
