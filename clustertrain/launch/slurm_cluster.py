"""A real Slurm cluster on 127.0.0.1 for rehearsals and tests (Debian slurm-wlm 22.05 + munge).

:class:`LocalSlurmCluster` starts one private ``munged``, one ``slurmctld`` and N emulated nodes (``slurmd -N nodeK``; this build has MULTIPLE_SLURMD), all bound to
loopback on free high ports, and waits until every node is idle. Nothing is shared with the system
services or another cluster: each state directory has its own munge key and socket, so several
clusters (say, two test sessions) can run side by side. It installs nothing: a missing program is one
:class:`LaunchError` line naming ``apt-get install -y --no-install-recommends slurm-wlm munge`` (run it as
root; ``bash scripts/test.sh`` does it for the test suite).

The state directory (every path, the ``cluster.json`` record) is documented and named in
:mod:`clustertrain.launch.slurm_cluster_paths`; the daemons are found and stopped by
:mod:`clustertrain.launch.slurm_cluster_procs`.

``up()`` on a directory whose cluster is running with the same spec reuses it; it never stops or restarts
a cluster it did not start: another spec, a cluster partly running (a daemon gone, job processes left) or
one started on another host (a shared home) is one line naming its owner (``cluster.json``'s ``owner``)
and ``down``. Only a directory with nothing of its cluster alive gets a fresh start, which wipes ctld/,
spool/, run/, log/, dev/ and jobcomp.txt (job ids restart at 1). ``down()`` cancels the cluster's jobs
(:meth:`LocalSlurmCluster.jobs` lists them first), stops its daemons, then SIGTERMs and SIGKILLs every
process of the cluster left (:func:`~clustertrain.launch.slurm_cluster_procs.cluster_processes`: job
processes that ignore SIGTERM or left their step, slurmstepd and all under it), never another cluster's.

``munged`` runs as root with ``--force`` on a per-cluster key instead of the system ``munge`` user and
/etc/munge key: the munge user cannot reach a socket inside a private (0700) temp directory, and a shared
system munged could not be stopped by one cluster's ``down()`` without breaking another.
"""

from __future__ import annotations

import fcntl
import getpass
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from clustertrain.core.errors import LaunchError
from clustertrain.launch.slurm_cluster_paths import RECORD_VERSION, LocalSlurmPaths
from clustertrain.launch.slurm_cluster_procs import (
    DAEMON_NAMES,
    cluster_processes,
    find_ours,
    free_ports,
    is_ours,
    log_tail,
    stop,
    stop_processes,
    total_memory_mb,
    wait_for,
)
from clustertrain.launch.slurm_query import parse_nodes
from clustertrain.launch.slurmcli import run_slurm
from clustertrain.core.run_paths import write_atomic
from clustertrain.core.templating import render

__all__ = ["ClusterJob", "JOBCOMP_TYPES", "LocalSlurmCluster", "LocalSlurmPaths", "LocalSlurmStatus", "NodeGroup",
           "RECORD_VERSION", "owner_text", "require_installed"]

_TEMPLATES = Path(__file__).parent / "templates"
_SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")
_BAD_PATH_CHARS = set(" \t\n\"'#=,$%\\")
_PROGRAMS = ("slurmctld", "slurmd", "munged", "sbatch")
INSTALL_COMMAND = "apt-get install -y --no-install-recommends slurm-wlm munge"
#: JobCompType plugins the local cluster can run: ``filetxt`` keeps final states in jobcomp.txt; ``none`` is
#: what ParallelCluster configures (with MinJobAge=300), so a finished job is forgotten MinJobAge after its end.
JOBCOMP_TYPES = ("filetxt", "none")


@dataclass(frozen=True)
class NodeGroup:
    """Nodes of one shape in one partition: ``<prefix>1`` .. ``<prefix><count>`` (a ParallelCluster compute
    resource of a queue). ``memory_mb`` None declares this machine's memory; ``cpus`` and ``memory_mb`` are what
    the node lines declare (``SlurmdParameters=config_overrides``), not what the emulation has."""

    partition: str
    prefix: str
    count: int
    cpus: int
    memory_mb: int | None = None
    gpus: int = 0
    gpu_type: str = "h100"

    @property
    def names(self) -> list[str]:
        return [f"{self.prefix}{k}" for k in range(1, self.count + 1)]

    @property
    def hostlist(self) -> str:
        """The Slurm hostlist of the group (``gpu-st-p5e-[1-80]``)."""
        return f"{self.prefix}[1-{self.count}]" if self.count > 1 else f"{self.prefix}1"


@dataclass(frozen=True)
class ClusterJob:
    """A job of the cluster as ``squeue`` lists it (what ``down`` names before cancelling)."""

    job_id: str
    name: str
    user: str
    state: str

    def describe(self) -> str:
        return f"job {self.job_id} {self.name!r} of {self.user}, {self.state}"


@dataclass(frozen=True)
class LocalSlurmStatus:
    """What :meth:`LocalSlurmCluster.status` found."""

    state_dir: Path
    running: bool
    pids: dict[str, int | None] = field(default_factory=dict)
    nodes: dict[str, str] = field(default_factory=dict)
    owner: str = ""

    def describe(self) -> str:
        lines = [f"state dir: {self.state_dir}", f"running:   {'yes' if self.running else 'no'}"]
        lines += [f"owner:     {self.owner}"] if self.owner else []
        lines += [f"  {name:<16} pid {pid if pid else '-'}" for name, pid in sorted(self.pids.items())]
        lines += [f"  {node:<16} {state}" for node, state in sorted(self.nodes.items())]
        return "\n".join(lines)


def require_installed(search: str | None = None) -> None:
    """Raise one :class:`LaunchError` line naming the install command when a Slurm or munge program is missing
    from ``search`` (a PATH-style list; default: PATH and the sbin directories). Library code installs
    nothing: ``bash scripts/test.sh`` installs the system packages the suite needs."""
    missing = [name for name in _PROGRAMS if not _find(name, search)]
    if missing:
        raise LaunchError(f"local Slurm: {', '.join(missing)} not found; install Slurm and munge as root: "
                          f"`{INSTALL_COMMAND}` (bash scripts/test.sh does it for the test suite)")


class LocalSlurmCluster:
    """A Slurm controller plus ``nodes`` emulated nodes, all state in ``state_dir``."""

    def __init__(self, state_dir: str | Path, nodes: int = 2, cpus_per_node: int | None = None,
                 gpus_per_node: int = 0, *, gpu_type: str = "h100", partition: str = "debug",
                 min_job_age: int = 300, jobcomp: str = "filetxt", timeout: float = 30.0,
                 groups: list[NodeGroup] | None = None) -> None:
        if nodes < 1:
            raise LaunchError(f"local Slurm: nodes={nodes} must be at least 1")
        if cpus_per_node is not None and cpus_per_node < 1:
            raise LaunchError(f"local Slurm: cpus_per_node={cpus_per_node} must be at least 1")
        if not 0 <= gpus_per_node <= 64:
            raise LaunchError(f"local Slurm: gpus_per_node={gpus_per_node} must be between 0 and 64")
        if min_job_age < 2:
            raise LaunchError(f"local Slurm: min_job_age={min_job_age} must be >= 2 s (Slurm's smallest safe value)")
        if jobcomp not in JOBCOMP_TYPES:
            raise LaunchError(f"local Slurm: jobcomp={jobcomp!r} must be one of {', '.join(JOBCOMP_TYPES)}")
        for key, value in (("gpu_type", gpu_type), ("partition", partition)):
            if not re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", value):
                raise LaunchError(f"local Slurm: {key}={value!r} must be letters, digits, '_', '.' or '-'")
        root = Path(state_dir).expanduser().absolute()
        bad = sorted(_BAD_PATH_CHARS & set(str(root)))
        if bad:
            raise LaunchError(f"local Slurm: state dir {str(root)!r} contains {''.join(bad)!r}, which "
                              "slurm.conf cannot hold; choose a path without spaces or quotes")
        cpus = cpus_per_node or os.cpu_count() or 1
        if groups is None:
            groups = [NodeGroup(partition, "node", nodes, cpus, None, gpus_per_node, gpu_type)]
        self.paths = LocalSlurmPaths(root, max(len(f"{g.prefix}{g.count}") for g in groups))
        for g in groups:
            if g.count < 1 or g.cpus < 1 or not 0 <= g.gpus <= 64 or not all(
                    re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", v) for v in (g.partition, g.prefix, g.gpu_type)):
                raise LaunchError(f"local Slurm: node group {g} needs count, cpus >= 1, 0-64 GPUs and names of "
                                  "letters, digits, '_', '.' or '-'")
        self.groups = list(groups)
        self.spec = {"nodes": sum(g.count for g in groups), "cpus_per_node": cpus,
                     "gpus_per_node": gpus_per_node, "gpu_type": gpu_type, "partition": partition,
                     "min_job_age": min_job_age, "jobcomp": jobcomp,
                     "groups": [dict(vars(g)) for g in groups]}
        self.timeout = timeout
        self._children: dict[int, subprocess.Popen] = {}

    @property
    def node_names(self) -> list[str]:
        return [n for g in self.groups for n in g.names]

    def env(self) -> dict[str, str]:
        """The variables a Slurm client (sbatch, squeue, scontrol...) needs: SLURM_CONF and PATH."""
        found = [_find(n) for n in ("sbatch", "slurmctld")]
        dirs = list(dict.fromkeys(os.path.dirname(p) for p in found if p))
        path = os.environ.get("PATH", "")
        dirs += [d for d in path.split(os.pathsep) if d and d not in dirs]
        return {"SLURM_CONF": str(self.paths.conf), "PATH": os.pathsep.join(dirs)}

    # -- lifecycle ---------------------------------------------------------------------------------

    def up(self) -> LocalSlurmStatus:
        """Start the cluster (or reuse the one running in this state dir) and wait until all nodes are idle."""
        self.paths.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        with self._locked():
            record = self.paths.read_record()
            if record:
                self._refuse_other_host(record)
                if self._all_alive(record):
                    wanted = {k: record.get("spec", {}).get(k) for k in self.spec}
                    if wanted != self.spec:
                        raise LaunchError(f"local Slurm in {self.paths.root} already runs with {wanted} "
                                          f"({owner_text(record)}); it is not restarted: stop it with "
                                          f"`{self.down_command}` (cancels its jobs) or start another with --name NAME")
                    return self._wait_idle(deadline=time.monotonic() + self.timeout)
                left = cluster_processes(self.paths)
                if left:
                    shown = ", ".join(f"{p.info['name']} {p.pid}" for p in left[:4]) + (", ..." * (len(left) > 4))
                    raise LaunchError(f"local Slurm in {self.paths.root} is partly running ({len(left)} process(es) "
                                      f"left: {shown}; {owner_text(record)}); `up` does not restart a cluster it did "
                                      f"not start: run `{self.down_command}` first")
            require_installed()
            try:
                self._start()
                return self._wait_idle(deadline=time.monotonic() + self.timeout)
            except BaseException:
                self._stop_all(self.paths.read_record())
                raise

    def down(self) -> list[ClusterJob]:
        """Cancel all jobs, stop every daemon of this state dir, then every process of the cluster left
        (SIGTERM, SIGKILL after a grace period); return the jobs it cancelled. A cluster started on another host
        is one line (its processes are there)."""
        if not self.paths.root.is_dir():
            return []
        with self._locked():
            record = self.paths.read_record()
            if record:
                self._refuse_other_host(record)
            return self._stop_all(record)

    def jobs(self) -> list[ClusterJob]:
        """The cluster's jobs (``squeue``: id, name, user, state) -- what ``down()`` would cancel; [] when its
        controller is not running."""
        record = self.paths.read_record() or {}
        if record:
            self._refuse_other_host(record)
        if not is_ours(record.get("pids", {}).get("slurmctld"), self.paths):
            return []
        proc = self._client(["squeue", "-h", "-o", "%A\t%u\t%T\t%j"], check=False)
        jobs = []
        for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
            parts = line.split("\t", 3)
            if len(parts) == 4 and parts[0].strip().isdigit():
                jobs.append(ClusterJob(parts[0].strip(), parts[3], parts[1], parts[2]))
        return jobs

    def down_refusal(self, jobs: list[ClusterJob]) -> str:
        """The one line ``down`` without ``--yes`` and without a terminal to ask on says."""
        shown = "; ".join(j.describe() for j in jobs[:5]) + ("; ..." if len(jobs) > 5 else "")
        return (f"local Slurm in {self.paths.root}: down would cancel {len(jobs)} job(s) ({shown}); nothing was "
                f"stopped: run `{self.down_command} --yes` to cancel them, or wait until they end")

    @property
    def down_command(self) -> str:
        return f"clustertrain local-slurm down --state-dir {shlex.quote(str(self.paths.root))}"

    def status(self) -> LocalSlurmStatus:
        record = self.paths.read_record() or {}
        pids = {name: (pid if is_ours(pid, self.paths) else None)
                for name, pid in record.get("pids", {}).items()}
        running = bool(pids) and all(pids.values())
        nodes: dict[str, str] = {}
        if pids.get("slurmctld"):
            proc = self._client(["scontrol", "show", "node", "-o"], check=False)
            if proc.returncode == 0:
                nodes = {n.name: n.state for n in parse_nodes(proc.stdout)}
        return LocalSlurmStatus(self.paths.root, running, pids, nodes, owner_text(record) if record else "")

    # -- internals ---------------------------------------------------------------------------------

    def _start(self) -> None:
        p = self.paths
        for d in p.fresh_dirs():
            shutil.rmtree(d, ignore_errors=True)
        for f in (p.jobcomp, p.record, p.gres_conf):
            f.unlink(missing_ok=True)
        for d in (p.ctld_dir, p.spool_dir, p.log_dir, p.run_dir, p.munge_dir):
            d.mkdir(mode=0o700)
        if p.socket_root == p.short_root:
            p.short_root.unlink(missing_ok=True)
            p.short_root.symlink_to(p.root)
        write_atomic(p.munge_key, os.urandom(1024), mode=0o400)
        ports = free_ports(1 + self.spec["nodes"])
        write_atomic(p.conf, self.render_conf(ports[0], ports[1:]))
        if any(g.gpus for g in self.groups):
            self._make_gres()
        pids: dict[str, int] = {}
        record = {"version": RECORD_VERSION, "owner": _owner(), "cluster_name": p.cluster_name,
                  "spec": self.spec, "ctld_port": ports[0],
                  "node_ports": dict(zip(self.node_names, ports[1:])), "pids": pids}
        pids["munged"] = self._spawn("munged", [
            _need("munged"), "--foreground", "--force", f"--socket={p.munge_socket}",
            f"--key-file={p.munge_key}", f"--pid-file={p.munge_dir / 'munged.pid'}",
            f"--log-file={p.munge_dir / 'munged.log'}", f"--seed-file={p.munge_dir / 'munged.seed'}"])
        p.write_record(record)  # so a failure below can stop munged
        wait_for(lambda: p.munge_socket.exists(), 10.0, "munged socket", p.log_of("munged"))
        pids["slurmctld"] = self._spawn("slurmctld", [_need("slurmctld"), "-D", "-i", "-f", str(p.conf)])
        p.write_record(record)
        self._before_nodes()
        for n in self.node_names:
            pids[f"slurmd-{n}"] = self._spawn(f"slurmd-{n}", [_need("slurmd"), "-D", "-f", str(p.conf), "-N", n])
        p.write_record(record)

    def _before_nodes(self) -> None:
        """Runs after slurmctld was spawned and before the first slurmd (a subclass boots its head node here)."""

    def wrap(self, name: str, argv: list[str]) -> list[str]:
        """The command line that starts daemon ``name`` (``argv`` as is; a subclass may prefix a boot driver
        that execs ``argv``, so the recorded pid stays the daemon's)."""
        return argv

    def render_conf(self, ctld_port: int, node_ports: list[int]) -> str:
        """The slurm.conf text for these ports (a value; ``up()`` writes it)."""
        if len(node_ports) != self.spec["nodes"]:
            raise LaunchError(f"local Slurm: {len(node_ports)} node ports for {self.spec['nodes']} nodes")
        ports = dict(zip(self.node_names, node_ports))
        node_list = [{"name": n, "port": ports[n], "cpus": g.cpus, "memory_mb": g.memory_mb or total_memory_mb(),
                      "gpus": g.gpus, "gpu_type": g.gpu_type} for g in self.groups for n in g.names]
        partitions: dict[str, list[str]] = {}
        for g in self.groups:
            partitions.setdefault(g.partition, []).append(g.hostlist)
        p = self.paths
        return render(
            _TEMPLATES, "slurm.conf.j2", state_dir=p.root, cluster_name=p.cluster_name,
            hostname=socket.gethostname().split(".")[0], munge_socket=p.munge_socket, jobcomp_file=p.jobcomp,
            ctld_dir=p.ctld_dir, spool_dir=p.slurmd_spool, run_dir=p.run_dir, log_dir=p.log_dir,
            ctld_port=ctld_port, node_list=node_list, partitions={k: ",".join(v) for k, v in partitions.items()},
            any_gpus=any(g.gpus for g in self.groups), **self.spec)

    def _make_gres(self) -> None:
        p = self.paths
        p.dev_dir.mkdir(mode=0o755)
        for i in range(max(g.gpus for g in self.groups)):  # Slurm 22.05 drops GPUs without File=; CUDA_VISIBLE_DEVICES needs char devices
            os.mknod(p.dev_dir / f"nvidia{i}", 0o666 | 0o020000, os.makedev(195, i))
        lines = ["# Generated by clustertrain (local-slurm): fake GPU devices, do not edit.", "AutoDetect=off"]
        for g in self.groups:
            if g.gpus:
                files = f"{p.dev_dir}/nvidia[0-{g.gpus - 1}]" if g.gpus > 1 else f"{p.dev_dir}/nvidia0"
                lines.append(f"NodeName={g.hostlist} Name=gpu Type={g.gpu_type} File={files}")
        write_atomic(p.gres_conf, "\n".join(lines) + "\n")

    def _spawn(self, name: str, argv: list[str]) -> int:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.paths.conf)  # slurmstepd inherits it: down() finds leftovers by it
        with open(self.paths.log_dir / f"{name}.out", "ab") as out:
            proc = subprocess.Popen(self.wrap(name, argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=env, cwd=self.paths.root, start_new_session=True)
        self._children[proc.pid] = proc
        return proc.pid

    def failed_nodes(self) -> set[str]:
        """Nodes that will never come up and that ``up()`` does not wait for (a subclass whose boot failed)."""
        return set()

    def _wait_idle(self, deadline: float) -> LocalSlurmStatus:
        states: dict[str, str] = {}
        while True:
            record = self.paths.read_record() or {}
            failed = self.failed_nodes()
            for name, pid in record.get("pids", {}).items():
                if name.removeprefix("slurmd-") in failed:
                    continue
                # A daemon we just spawned may not have exec'd yet (its command line and environment are
                # still this process's): ask its Popen instead of looking at the process.
                child = self._children.get(pid)
                gone = child.poll() is not None if child is not None else not is_ours(pid, self.paths)
                if gone:
                    raise LaunchError(f"local Slurm: {name} exited during start-up; "
                                      f"{log_tail(self.paths.log_of(name))}")
            proc = self._client(["scontrol", "show", "node", "-o"], check=False)
            if proc.returncode == 0:
                states = {n.name: n.state for n in parse_nodes(proc.stdout)}
                wanted = set(self.node_names) - failed
                if set(states) == set(self.node_names) and all(states[n] == "IDLE" for n in wanted):
                    return self.status()
            if time.monotonic() > deadline:
                shown = ", ".join(f"{k}={v}" for k, v in sorted(states.items())) or "controller not answering"
                raise LaunchError(f"local Slurm: nodes not idle after {self.timeout:.0f}s ({shown}); "
                                  f"{log_tail(self.paths.log_dir / 'slurmctld.log')}")
            time.sleep(0.2)

    def _stop_all(self, record: dict | None) -> list[ClusterJob]:
        pids = dict((record or {}).get("pids", {}))
        jobs: list[ClusterJob] = []
        if pids.get("slurmctld") and is_ours(pids["slurmctld"], self.paths):
            jobs = self.jobs()
            if jobs:
                self._client(["scancel", *(j.job_id for j in jobs)], check=False)
                deadline = time.monotonic() + 8.0  # KillWait=5: Slurm SIGKILLs what ignores SIGTERM after 5 s
                while time.monotonic() < deadline and any(
                        p.info["name"] not in ("slurmctld", "slurmd", "munged") for p in cluster_processes(self.paths)):
                    time.sleep(0.25)
        order = [n for n in pids if n.startswith("slurmd-")] + ["slurmctld", "munged"]
        for name in order:
            pid = pids.get(name)
            if pid and (pid in self._children or is_ours(pid, self.paths)):  # our Popen: ours even before exec
                self._stop_pid(pid)
        for pid in find_ours(self.paths, set(DAEMON_NAMES) - {"slurmstepd"}):  # unrecorded daemons
            self._stop_pid(pid)
        stuck: list = []
        for grace in (3.0, 0.5, 0.5, 0.5, 0.5):  # again while a process started one before it was killed
            left = cluster_processes(self.paths)  # steps, job processes, all under them
            if not left or left == stuck:
                break
            stuck = stop_processes(left, grace)
        link = self.paths.short_root
        if link.is_symlink() and Path(os.readlink(link)) == self.paths.root:
            link.unlink()
        if stuck:
            raise LaunchError(f"local Slurm in {self.paths.root}: {len(stuck)} process(es) survived SIGKILL "
                              f"({', '.join(str(p.pid) for p in stuck[:5])}); see `ps -o pid,stat,wchan,cmd -p "
                              f"{','.join(str(p.pid) for p in stuck[:5])}`")
        return jobs

    def _refuse_other_host(self, record: dict) -> None:
        host = (record.get("owner") or {}).get("host")
        if host and host != socket.gethostname():
            raise LaunchError(f"local Slurm in {self.paths.root} was started on host {host} ({owner_text(record)}); "
                              f"its processes run there: run `{self.down_command}` on {host}, or use another --name")

    def _stop_pid(self, pid: int, grace: float = 10.0) -> None:
        stop(pid, self._children.pop(pid, None), grace)

    def _client(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
        return run_slurm(argv, env=self.env(), check=check, timeout=30)

    def _all_alive(self, record: dict) -> bool:
        pids = record.get("pids", {})
        return bool(pids) and all(is_ours(pid, self.paths) for pid in pids.values())

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.paths.root, os.O_RDONLY | os.O_DIRECTORY)  # the directory itself: no lock file to write
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock


def _owner() -> dict:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return {"pid": os.getpid(), "uid": os.getuid(), "user": user, "host": socket.gethostname(),
            "started": datetime.now().isoformat(timespec="seconds")}


def owner_text(record: dict) -> str:
    """Who started the cluster of ``record``, for a message: ``started by root (uid 0, pid 42) on vm at ...``."""
    o = record.get("owner") or {}
    if not o:
        return "started by an older clustertrain, owner not recorded"
    return (f"started by {o.get('user', '?')} (uid {o.get('uid', '?')}, pid {o.get('pid', '?')}) on "
            f"{o.get('host', '?')} at {o.get('started', '?')}")


# -- programs --------------------------------------------------------------------------------------

def _find(name: str, search: str | None = None) -> str | None:
    """``name`` on ``search``; default: PATH, then the sbin directories (a user's PATH often lacks them)."""
    return shutil.which(name, path=search if search is not None else os.pathsep.join([os.environ.get("PATH", ""), *_SBIN]))


def _need(name: str) -> str:
    path = _find(name)
    if not path:
        raise LaunchError(f"local Slurm: `{name}` not found; install Slurm and munge as root: `{INSTALL_COMMAND}`")
    return path
