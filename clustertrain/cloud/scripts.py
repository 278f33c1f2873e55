"""Node setup scripts rendered from the project (templates in ``cloud/templates/*.sh.j2``).

Every value rendered into shell goes through ``shlex.quote`` (the ``q`` filter of the one Jinja
environment, :mod:`clustertrain.core.templating`). Scripts are rendered to memory first
(:func:`render_node_scripts`), then written file by file with :func:`clustertrain.core.run_paths.write_atomic`
(:func:`write_node_scripts`), so a bad project never leaves a half-written directory.

Directories on the shared file systems: ``setup-dirs.sh`` creates exactly what the jobs use, as
:mod:`clustertrain.core.storage_layout` derives it from the project (``aws.fsx[].holds`` says which file system
holds which kind of data), the storage benchmark's directory on every mount included
(:meth:`~clustertrain.core.storage_layout.StorageLayout.bench_dir`).

The container configuration the scripts write is defined here, as text, so golden files pin it
(tests/unit/cloud/golden/node-config/):

* Pyxis (head-node.sh, once for the whole cluster): ``/opt/slurm/etc`` is the head node's, NFS-exported to every
  compute node (ParallelCluster cookbook ``aws-parallelcluster-slurm/recipes/config/config_head_node.rb``
  ``nfs_export``, ``mount_slurm_dir.rb``), so the one ``plugstack.conf`` every slurmd/slurmstepd reads is the one
  head-node.sh writes; the cookbook itself only leaves samples under ``/opt/parallelcluster/examples``
  (``recipes/install/install_pyxis.rb``, templates ``pyxis/plugstack.conf.erb`` and ``pyxis/pyxis.conf.erb``:
  ``required /usr/local/lib/slurm/spank_pyxis.so runtime_path=/run/pyxis``). Ours is that line plus
  ``container_scope=job``: Pyxis's default scope is global (pyxis ``config.c``), which reuses a named container
  (``--container-name``) across jobs on a node, so after an image rebuild one job would run two image versions.
  Job-scoped containers are removed when the job ends (pyxis ``pyxis_slurmd.c``).
* Enroot (compute-node.sh, per compute node): its runtime, cache, data and temp paths on the NVMe, and the
  settings of ParallelCluster's own sample (cookbook ``aws-parallelcluster-platform/templates/enroot/enroot.conf.erb``)
  that decide what a container may write, but with the image's root kept read-only: ``ENROOT_ROOTFS_WRITABLE no``
  where the sample says ``yes`` (Enroot's own default, and what the rehearsal's container view and every fix of
  issue 37 are built for: a job writes only to its mounts, so no rank's start-up can change the image another rank
  or node sees — Megatron-LM's helper is built in the image, caches go to the cache root below),
  ``ENROOT_MOUNT_HOME no``, ``ENROOT_RESTRICT_DEV no``. The sample's ``ENROOT_SQUASH_OPTIONS`` only matters where images are squashed (the
  head node's ``image build``), and its ``ENROOT_CONFIG_PATH`` (``/var/enroot``) is left at Enroot's default under
  HOME, where users keep registry credentials. Caches a container would keep under HOME (not mounted) go to
  :attr:`~clustertrain.cloud.config.EnrootConfig.containers_cache` on the NVMe, mode 1777.
* Docker (head-node.sh, ``aws.head_node.docker``): ParallelCluster AMIs ship Enroot and Pyxis but no Docker, so
  ``clustertrain image build`` has none on the head node; awsome-distributed-training installs it with
  aws-samples/aws-parallelcluster-post-install-scripts ``docker/postinstall.sh`` on a 500 GB head node root volume
  (``1.architectures/2.aws-parallelcluster/deployment-guides/templates/cluster-vanilla.yaml``). Ours: Amazon
  Linux 2023's own ``docker`` package (it carries the buildx plugin BuildKit needs: amazonlinux/amazon-linux-2023
  issues #400, #482), Docker's apt repository on Ubuntu (``docker-ce`` and ``docker-buildx-plugin``, as that
  script does); ``data-root`` set in ``/etc/docker/daemon.json``, the project's directory owner added to the
  ``docker`` group. A failed install is logged as an ERROR and does not fail the head node (Slurm and the job
  directories do not need Docker; ``image build`` then refuses: docker missing).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from clustertrain.cloud.config import CONTAINERS_CACHE_NAME
from clustertrain.cloud.pcluster import COMPUTE_SCRIPT, HEAD_SCRIPT, SETUP_DIRS_SCRIPT, dir_owner, require_aws, scripts_uri
from clustertrain.cloud.project_rules import sharing_models
from clustertrain.core.errors import ConfigError
from clustertrain.core.storage_layout import off_mount_problems, project_dirs
from clustertrain.core.run_paths import write_atomic
from clustertrain.core.templating import render

if TYPE_CHECKING:
    from clustertrain.project import Project

TEMPLATES = Path(__file__).with_name("templates")

#: ParallelCluster's Slurm configuration directory, NFS-shared from the head node (cookbook attributes
#: ``default['cluster']['slurm']['install_dir'] = '/opt/slurm'``; ``spank_config_dir`` = ``<it>/plugstack.conf.d``)
SLURM_ETC = "/opt/slurm/etc"
#: where the AMI's Pyxis build installs the plugin, and its runtime directory (cookbook ``pyxis/pyxis.conf.erb``,
#: ``default['cluster']['pyxis']['runtime_path'] = '/run/pyxis'``)
PYXIS_SO = "/usr/local/lib/slurm/spank_pyxis.so"
PYXIS_RUNTIME = "/run/pyxis"
#: enroot.conf settings beyond the paths, as ParallelCluster's sample enroot.conf.erb has them
ENROOT_SAMPLE_SETTINGS = (("ENROOT_ROOTFS_WRITABLE", "no"), ("ENROOT_MOUNT_HOME", "no"), ("ENROOT_RESTRICT_DEV", "no"))
#: the lines around the block compute-node.sh owns in enroot.conf
ENROOT_MARKS = ("# BEGIN clustertrain", "# END clustertrain")


def plugstack_conf() -> str:
    """``/opt/slurm/etc/plugstack.conf``: include every file of ``plugstack.conf.d`` (as the cookbook's sample)."""
    return ("# Written by clustertrain head-node.sh, as the ParallelCluster sample spank/plugstack.conf; do not edit.\n"
            f"include {SLURM_ETC}/plugstack.conf.d/*\n")


def pyxis_conf() -> str:
    """``/opt/slurm/etc/plugstack.conf.d/pyxis.conf``: ParallelCluster's sample line plus ``container_scope=job``."""
    return ("# Written by clustertrain head-node.sh; do not edit. The ParallelCluster sample pyxis.conf plus\n"
            "# container_scope=job: a named container lives as long as its job (the default scope, global, reuses\n"
            "# it in later jobs on the same node, with the files of the image it was made from).\n"
            f"required {PYXIS_SO} runtime_path={PYXIS_RUNTIME} container_scope=job\n")


def enroot_settings(local_dir: str) -> list[tuple[str, str]]:
    """The enroot.conf settings compute-node.sh owns, in order: Enroot's paths on the NVMe (``$(id -u)``/``$(id -g)``
    literal: Enroot expands them per user), then :data:`ENROOT_SAMPLE_SETTINGS`."""
    return [("ENROOT_RUNTIME_PATH", f"{local_dir}/enroot/runtime/user-$(id -u)"),
            ("ENROOT_CACHE_PATH", f"{local_dir}/enroot/cache/group-$(id -g)"),
            ("ENROOT_DATA_PATH", f"{local_dir}/enroot/data/user-$(id -u)"),
            ("ENROOT_TEMP_PATH", f"{local_dir}/enroot/tmp"),
            *ENROOT_SAMPLE_SETTINGS]


def enroot_block(local_dir: str) -> str:
    """The block compute-node.sh appends to ``/etc/enroot/enroot.conf`` (after removing every other line that sets
    one of its keys)."""
    lines = [f"{k} {v}" for k, v in enroot_settings(local_dir)]
    return "\n".join([ENROOT_MARKS[0], *lines, ENROOT_MARKS[1]]) + "\n"


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
    local_dir = aws.enroot.local_dir
    return {
        SETUP_DIRS_SCRIPT: render(TEMPLATES, "setup-dirs.sh.j2", **common, owner=owner, group=group,
                                  mode=aws.shared_dirs.mode, mounts=mounts, dirs=model_dirs(project, allow_off_mount)),
        HEAD_SCRIPT: render(TEMPLATES, "head-node.sh.j2", **common, scripts_uri=scripts_uri(project),
                            slurm_etc=SLURM_ETC, pyxis_so=PYXIS_SO, pyxis_runtime=PYXIS_RUNTIME,
                            plugstack_conf=plugstack_conf(), pyxis_conf=pyxis_conf(), docker=aws.head_node.docker,
                            docker_data_root=aws.head_node.docker_data_root,
                            constrain_devices=bool(sharing_models(project))),
        COMPUTE_SCRIPT: render(TEMPLATES, "compute-node.sh.j2", **common, local_dir=local_dir,
                               cache_name=CONTAINERS_CACHE_NAME, marks=ENROOT_MARKS, enroot_keys=[k for k, _ in enroot_settings(local_dir)],
                               enroot_block=enroot_block(local_dir)),
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
