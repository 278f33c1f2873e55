"""The state directory of a local Slurm cluster (:class:`~clustertrain.launch.slurm_cluster.LocalSlurmCluster`):
every path in it, named once in :class:`LocalSlurmPaths`, and the ``cluster.json`` record.

State-directory layout::

    <state_dir>/
      cluster.json        what up() started -- written last, after every daemon was spawned (and once
                          before, right after munged, so a failure can stop it); a directory without it
                          holds no cluster. Format (JSON): {"version": 1, "owner": {"pid", "uid", "user",
                          "host", "started" (ISO time)} (who ran up(); up() refuses a live cluster of another
                          spec or host instead of restarting it), "cluster_name": ClusterName in slurm.conf
                          (ct-<hash of the state dir>; jobs see it as SLURM_CLUSTER_NAME), "spec": {nodes,
                          cpus_per_node, gpus_per_node, gpu_type, partition, min_job_age, jobcomp, groups: [{partition,
                          prefix, count, cpus, memory_mb, gpus, gpu_type}]}, "ctld_port": int,
                          "node_ports": {"node1": int, ...}, "pids": {"munged": int, "slurmctld": int,
                          "slurmd-node1": int, ...}}; readers ignore fields they do not know
      slurm.conf          rendered from launch/templates/slurm.conf.j2 (clients need SLURM_CONF=this)
      gres.conf           only when a node group has GPUs (Slurm reads it next to slurm.conf)
      cgroup.conf         only with constrain_devices (task/cgroup, ConstrainDevices=yes; next to slurm.conf)
      jobcomp.txt         jobcomp/filetxt: one line per finished job, read by slurm_query after the job
                          left the controller (MinJobAge); absent with ``jobcomp="none"`` (ParallelCluster's
                          setting), where only the run directory's own records outlive the controller
      munge/              munge.key (random per cluster, mode 0400), munge.socket, munged.pid/.log/.seed
      ctld/               StateSaveLocation of slurmctld
      spool/nodeK/        SlurmdSpoolDir of each node (batch scripts, step sockets)
      log/                slurmctld.log, slurmd-nodeK.log, and *.out (the daemons' stdout/stderr)
      run/                slurmctld.pid, slurmd-nodeK.pid
      dev/                fake GPU character devices nvidia0..  (gpus_per_node > 0 only)
      (the directory itself is flock'ed while up()/down() run on it: no lock file is written)

Unix socket paths hold at most 107 bytes, and step sockets live at spool/nodeK/nodeK_<job>.<step>.
When the state dir is longer than 63 characters (fewer with node names longer than 8 characters, such as
ParallelCluster's ``gpu-queue-st-p5e-48xlarge-80``), slurm.conf and munged reach munge/ and spool/
through the short symlink /tmp/ct-slurm-<hash of the state dir> -> <state_dir> (removed by down()).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from clustertrain.core.errors import LaunchError
from clustertrain.core.run_paths import write_atomic

RECORD_VERSION = 1
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes with the terminating NUL
#: Named clusters live in ``BASE_DIR/<name>``; ``$STATE_DIR_ENV`` names one cluster's state directory itself.
BASE_DIR = "~/.clustertrain/local-slurm"
STATE_DIR_ENV = "CLUSTERTRAIN_LOCAL_SLURM_DIR"
DEFAULT_NAME = "default"
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")


def state_dir_for(name: str | None = None, state_dir: str | Path | None = None) -> Path:
    """Which cluster a command means: ``state_dir`` as given; else ``~/.clustertrain/local-slurm/<name>``; else
    ``$CLUSTERTRAIN_LOCAL_SLURM_DIR`` (one cluster's state dir, for a script of its own); else the cluster named
    ``default``. Both ``name`` and ``state_dir``, or a name that is not a plain word, is one line."""
    if name is not None and state_dir is not None:
        raise LaunchError(f"local Slurm: --name {name} and --state-dir {state_dir} both say which cluster; give one")
    if state_dir is not None:
        return Path(state_dir).expanduser()
    if name is not None:
        if not _NAME.fullmatch(name):
            raise LaunchError(f"local Slurm: --name {name!r} must be 1-40 lowercase letters, digits, '_' or '-' "
                              "(starting with a letter or digit), e.g. --name ci-1")
        return Path(BASE_DIR).expanduser() / name
    return Path(os.environ.get(STATE_DIR_ENV) or Path(BASE_DIR).expanduser() / DEFAULT_NAME).expanduser()


@dataclass(frozen=True)
class LocalSlurmPaths:
    """Every path in a local cluster's state directory (see the module docstring)."""

    root: Path
    node_name_len: int = 8  # the longest node name (step sockets hold it twice)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.root / "gres.conf"

    @property
    def cgroup_conf(self) -> Path:
        return self.root / "cgroup.conf"

    @property
    def record(self) -> Path:
        return self.root / "cluster.json"

    @property
    def jobcomp(self) -> Path:
        return self.root / "jobcomp.txt"

    @property
    def cluster_name(self) -> str:
        """ClusterName in slurm.conf: ``ct-`` and a hash of the state dir, so it names this cluster only (Slurm
        exports it to every job as SLURM_CLUSTER_NAME; ``down()`` finds the jobs' processes by it)."""
        return f"ct-{hashlib.sha1(str(self.root).encode()).hexdigest()[:12]}"

    @property
    def munge_dir(self) -> Path:
        return self.root / "munge"

    @property
    def munge_key(self) -> Path:
        return self.munge_dir / "munge.key"

    @property
    def munge_socket(self) -> Path:
        return self.socket_root / "munge" / "munge.socket"

    @property
    def short_root(self) -> Path:
        return Path("/tmp") / f"ct-slurm-{hashlib.sha1(str(self.root).encode()).hexdigest()[:10]}"

    @property
    def socket_root(self) -> Path:
        """The state dir as socket paths name it: itself, or ``short_root`` when sockets would not fit."""
        name = "n" * max(8, self.node_name_len)
        longest = len(str(self.root)) + len(f"/spool/{name}/{name}_12345678.4294967291")
        return self.root if longest <= MAX_SOCKET_PATH else self.short_root

    @property
    def slurmd_spool(self) -> Path:
        return self.socket_root / "spool"

    @property
    def ctld_dir(self) -> Path:
        return self.root / "ctld"

    @property
    def spool_dir(self) -> Path:
        return self.root / "spool"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def dev_dir(self) -> Path:
        return self.root / "dev"

    def fresh_dirs(self) -> tuple[Path, ...]:
        """Directories wiped on a fresh start."""
        return (self.ctld_dir, self.spool_dir, self.log_dir, self.run_dir, self.dev_dir, self.munge_dir)

    def log_of(self, name: str) -> Path:
        """The log that explains daemon ``name``'s failure: its own log when it wrote one, else its stdout/stderr."""
        log = self.munge_dir / "munged.log" if name == "munged" else self.log_dir / f"{name}.log"
        return log if log.exists() and log.stat().st_size else self.log_dir / f"{name}.out"

    def read_record(self) -> dict | None:
        """``cluster.json``, or None when there is none (or it cannot be read: then no cluster is known)."""
        try:
            record = json.loads(self.record.read_text())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def write_record(self, record: dict) -> None:
        write_atomic(self.record, json.dumps(record, indent=2))


def local_cluster_of(env: Mapping[str, str] | None = None) -> Path | None:
    """The state directory of the clustertrain local cluster that ``SLURM_CONF`` (``env`` over this process's
    environment) names — its ``slurm.conf`` beside a ``cluster.json`` record — or None (a real cluster's Slurm)."""
    conf = {**os.environ, **(env or {})}.get("SLURM_CONF")
    if not conf:
        return None
    root = Path(conf).parent
    paths = LocalSlurmPaths(root)
    return root if Path(conf) == paths.conf and paths.read_record() is not None else None
