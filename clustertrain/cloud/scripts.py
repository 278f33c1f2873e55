"""Node setup scripts rendered from the project (templates in ``cloud/templates/*.sh.j2``).

Every value rendered into shell goes through ``shlex.quote`` (the ``q`` filter of the one Jinja
environment, :mod:`clustertrain.core.templating`). Scripts are rendered to memory first
(:func:`render_node_scripts`), then written file by file with :func:`clustertrain.core.run_paths.write_atomic`
(:func:`write_node_scripts`), so a bad project never leaves a half-written directory.

Directories on the shared file systems: ``setup-dirs.sh`` creates exactly what the jobs use, as
:mod:`clustertrain.core.storage_layout` derives it from the project (``aws.fsx[].holds`` says which file system
holds which kind of data).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from clustertrain.cloud.pcluster import COMPUTE_SCRIPT, HEAD_SCRIPT, SETUP_DIRS_SCRIPT, dir_owner, require_aws, scripts_uri
from clustertrain.core.errors import ConfigError
from clustertrain.core.storage_layout import off_mount_problems, project_dirs
from clustertrain.core.run_paths import write_atomic
from clustertrain.core.templating import render

if TYPE_CHECKING:
    from clustertrain.project import Project

TEMPLATES = Path(__file__).with_name("templates")


def model_dirs(project: "Project", allow_off_mount: bool = False) -> list[str]:
    """Every directory setup-dirs.sh creates, parents before children: exactly the directories the
    project's jobs use (:func:`clustertrain.core.storage_layout.project_dirs`). A directory off the shared file systems is
    refused, unless ``allow_off_mount`` (the rehearsal runs such a project to show where it breaks)."""
    aws = require_aws(project)
    if not aws.layout():
        raise ConfigError("aws.fsx (or aws.ebs) is empty: there is no shared file system to lay out; add at least one")
    problems = [] if allow_off_mount else off_mount_problems(project)
    if problems:
        field, message = problems[0]
        raise ConfigError(f"{field}: {message}")
    return project_dirs(project)


def render_node_scripts(project: "Project", allow_off_mount: bool = False) -> dict[str, str]:
    """File name -> script text (``allow_off_mount``: see :func:`model_dirs`)."""
    aws = require_aws(project)
    owner, group = dir_owner(aws)
    mounts = sorted(set(aws.layout().values()), key=lambda d: (d.count("/"), d))
    common = {"project": project.name, "timeout": int(aws.shared_dirs.mount_timeout_s)}
    return {
        SETUP_DIRS_SCRIPT: render(TEMPLATES, "setup-dirs.sh.j2", **common, owner=owner, group=group,
                                  mode=aws.shared_dirs.mode, mounts=mounts, dirs=model_dirs(project, allow_off_mount)),
        HEAD_SCRIPT: render(TEMPLATES, "head-node.sh.j2", **common, scripts_uri=scripts_uri(project)),
        COMPUTE_SCRIPT: render(TEMPLATES, "compute-node.sh.j2", **common, local_dir=aws.enroot.local_dir),
    }


def write_node_scripts(scripts: dict[str, str], out_dir: Path) -> list[Path]:
    """Write each script executable (0755), each whole or not at all; returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in scripts.items():
        write_atomic(out_dir / name, text, mode=0o755)
        written.append(out_dir / name)
    return written


def upload_command(project: "Project", out_dir: Path) -> str:
    """The command that puts the scripts where the cluster config points."""
    return f"aws s3 cp --recursive {shlex.quote(str(out_dir))} {shlex.quote(scripts_uri(project))}/ --exclude '.*'"
