"""The emulated cluster: :class:`~clustertrain.launch.slurm_cluster.LocalSlurmCluster` whose daemons start
through the node boot driver (:mod:`clustertrain.rehearsal.boot`), each in its own mount namespace.

Order, as ParallelCluster creates a cluster: munged (this machine), then the head node boots and starts
slurmctld in its config phase; once its OnNodeConfigured actions are done (the job directories exist on the
shared file systems) the compute nodes boot, each ending in ``slurmd``. A compute node whose boot fails never
starts slurmd; :meth:`RehearsalCluster.failed_nodes` names it, and ``up()`` stops waiting for it. A head node
whose boot fails stops the rehearsal's cluster (ParallelCluster: CREATE_FAILED): :class:`HeadBootFailed`.

"On the head node" (``clustertrain submit`` runs there): :meth:`RehearsalCluster.head_command` prefixes a command
with ``nsenter`` into slurmctld's mount namespace and root.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from clustertrain.core.errors import LaunchError
from clustertrain.launch.slurm_cluster import LocalSlurmCluster, NodeGroup

HEAD = "head"


class HeadBootFailed(LaunchError):
    """The head node's boot failed (its result names the script)."""

    def __init__(self, result: dict) -> None:
        self.result = result
        super().__init__(f"head node boot failed: {result.get('error')}")


class RehearsalCluster(LocalSlurmCluster):
    def __init__(self, rehearsal_dir: Path, groups: list[NodeGroup], *, boot_timeout: float = 90.0,
                 memory_scheduling: bool = False) -> None:
        super().__init__(rehearsal_dir / "slurm", groups=groups, jobcomp="filetxt", min_job_age=300,
                         timeout=boot_timeout, memory_scheduling=memory_scheduling)
        self.dir = rehearsal_dir
        self.boot_dir = rehearsal_dir / "boot"
        self.spec_path = self.boot_dir / "spec.json"

    def wrap(self, name: str, argv: list[str]) -> list[str]:
        node = HEAD if name == "slurmctld" else name.removeprefix("slurmd-") if name.startswith("slurmd-") else None
        if node is None:
            return argv  # munged runs on this machine: only its socket is shared, through the rehearsal directory
        return [_need("unshare"), "--mount", "--propagation", "private", "--", sys.executable, "-m",
                "clustertrain.rehearsal.boot", str(self.spec_path), node, "--", *argv]

    def boot_result(self, node: str) -> dict | None:
        try:
            return json.loads((self.boot_dir / f"{node}.json").read_text())
        except (OSError, ValueError):
            return None

    def boot_results(self) -> dict[str, dict]:
        return {n: r for n in [HEAD, *self.node_names] if (r := self.boot_result(n)) is not None}

    def failed_nodes(self) -> set[str]:
        return {n for n in self.node_names if (self.boot_result(n) or {}).get("state") == "failed"}

    def _before_nodes(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            result = self.boot_result(HEAD) or {}
            if result.get("state") == "booted":
                return
            if result.get("state") == "failed":
                raise HeadBootFailed(result)
            time.sleep(0.1)
        raise LaunchError(f"head node did not finish booting within {self.timeout:.0f}s; see {self.boot_dir / HEAD}")

    def head_pid(self) -> int:
        pid = (self.paths.read_record() or {}).get("pids", {}).get("slurmctld")
        if not pid:
            raise LaunchError("the rehearsal's head node (slurmctld) is not running")
        return int(pid)

    def head_command(self, argv: list[str]) -> list[str]:
        """``argv`` run on the head node: in slurmctld's mount namespace and root directory."""
        # nsenter's own --wd resolves before it changes root; env changes directory inside the node's root
        return [_need("nsenter"), f"--target={self.head_pid()}", "--mount", "--root", "--", "env", "--chdir=/", *argv]


def _need(program: str) -> str:
    path = shutil.which(program) or shutil.which(program, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if not path:
        raise LaunchError(f"`{program}` not found: the rehearsal needs util-linux (apt-get install -y util-linux)")
    return path
