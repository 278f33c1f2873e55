"""A real Slurm cluster on 127.0.0.1 for rehearsals and tests (Debian slurm-wlm 22.05 + munge).

:class:`LocalSlurmCluster` installs the packages if missing, then starts one private ``munged``, one
``slurmctld`` and N emulated nodes (``slurmd -N nodeK``; this build has MULTIPLE_SLURMD), all bound to
loopback on free high ports, and waits until every node is idle. Nothing is shared with the system
services or another cluster: each state directory has its own munge key and socket, so several
clusters (say, two test sessions) can run side by side.

State-directory layout (every path is named once, in :class:`LocalSlurmPaths`)::

    <state_dir>/
      cluster.json        what up() started: version, spec, ports, pids -- written last, after every
                          daemon was spawned; a directory without it holds no cluster
      slurm.conf          rendered from launch/templates/slurm.conf.j2 (clients need SLURM_CONF=this)
      gres.conf           only with gpus_per_node > 0 (Slurm reads it next to slurm.conf)
      jobcomp.txt         jobcomp/filetxt: one line per finished job, read by slurm_query after the job
                          left the controller (MinJobAge); absent with ``jobcomp="none"`` (ParallelCluster's
                          setting), where only the run directory's own records outlive the controller
      munge/              munge.key (random per cluster, mode 0400), munge.socket, munged.pid/.log/.seed
      ctld/               StateSaveLocation of slurmctld
      spool/nodeK/        SlurmdSpoolDir of each node (batch scripts, step sockets)
      log/                slurmctld.log, slurmd-nodeK.log, and *.out (the daemons' stdout/stderr)
      run/                slurmctld.pid, slurmd-nodeK.pid
      dev/                fake GPU character devices nvidia0..  (gpus_per_node > 0 only)
      .lock               serialises up()/down() on this directory

Unix socket paths hold at most 107 bytes, and step sockets live at spool/nodeK/nodeK_<job>.<step>.
When the state dir is longer than 63 characters, slurm.conf and munged reach munge/ and spool/
through the short symlink /tmp/ct-slurm-<hash of the state dir> -> <state_dir> (removed by down()).

``up()`` on a directory whose cluster is running with the same spec reuses it; a fresh start wipes
ctld/, spool/, run/, log/, dev/ and jobcomp.txt (job ids restart at 1). ``munged`` runs as root
with ``--force`` on a per-cluster key instead of the system ``munge`` user and /etc/munge key: the
munge user cannot reach a socket inside a private (0700) temp directory, and a shared system munged
could not be stopped by one cluster's ``down()`` without breaking another.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from clustertrain.errors import LaunchError
from clustertrain.launch.slurm_query import parse_nodes

RECORD_VERSION = 1
_TEMPLATES = Path(__file__).parent / "templates"
_SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")
_BAD_PATH_CHARS = set(" \t\n\"'#=,$%\\")
_DAEMON_NAMES = ("munged", "slurmctld", "slurmd", "slurmstepd")
_MAX_SOCKET_PATH = 107  # sun_path is 108 bytes with the terminating NUL
#: JobCompType plugins the local cluster can run: ``filetxt`` keeps final states in jobcomp.txt; ``none`` is
#: what ParallelCluster configures (with MinJobAge=300), so a finished job is forgotten MinJobAge after its end.
JOBCOMP_TYPES = ("filetxt", "none")


@dataclass(frozen=True)
class LocalSlurmPaths:
    """Every path in a local cluster's state directory (see the module docstring)."""

    root: Path

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.root / "gres.conf"

    @property
    def record(self) -> Path:
        return self.root / "cluster.json"

    @property
    def jobcomp(self) -> Path:
        return self.root / "jobcomp.txt"

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    @property
    def munge_dir(self) -> Path:
        return self.root / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.socket_root / "munge" / "munge.socket"

    @property
    def short_root(self) -> Path:
        return Path("/tmp") / f"ct-slurm-{hashlib.sha1(str(self.root).encode()).hexdigest()[:10]}"

    @property
    def socket_root(self) -> Path:
        """The state dir as socket paths name it: itself, or ``short_root`` when sockets would not fit."""
        longest = len(str(self.root)) + len("/spool/node9999/node9999_12345678.4294967291")
        return self.root if longest <= _MAX_SOCKET_PATH else self.short_root

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


@dataclass(frozen=True)
class LocalSlurmStatus:
    """What :meth:`LocalSlurmCluster.status` found."""

    state_dir: Path
    running: bool
    pids: dict[str, int | None] = field(default_factory=dict)
    nodes: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        lines = [f"state dir: {self.state_dir}", f"running:   {'yes' if self.running else 'no'}"]
        lines += [f"  {name:<16} pid {pid if pid else '-'}" for name, pid in sorted(self.pids.items())]
        lines += [f"  {node:<16} {state}" for node, state in sorted(self.nodes.items())]
        return "\n".join(lines)


def ensure_installed() -> None:
    """Install slurm-wlm and munge with apt-get if their daemons are missing (root only)."""
    if all(_find(name) for name in ("slurmctld", "slurmd", "munged", "sbatch")):
        return
    if os.geteuid() != 0:
        raise LaunchError("Slurm is not installed and installing needs root: run "
                          "`apt-get install -y --no-install-recommends slurm-wlm munge` as root")
    install = ["apt-get", "install", "-y", "--no-install-recommends", "slurm-wlm", "munge"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    proc = subprocess.run(install, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        subprocess.run(["apt-get", "update"], capture_output=True, text=True, env=env)
        proc = subprocess.run(install, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise LaunchError(f"`{' '.join(install)}` failed: {last[0]}")


class LocalSlurmCluster:
    """A Slurm controller plus ``nodes`` emulated nodes, all state in ``state_dir``."""

    def __init__(self, state_dir: str | Path, nodes: int = 2, cpus_per_node: int | None = None,
                 gpus_per_node: int = 0, *, gpu_type: str = "h100", partition: str = "debug",
                 min_job_age: int = 300, jobcomp: str = "filetxt", timeout: float = 30.0) -> None:
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
        self.paths = LocalSlurmPaths(root)
        self.spec = {"nodes": nodes, "cpus_per_node": cpus_per_node or os.cpu_count() or 1,
                     "gpus_per_node": gpus_per_node, "gpu_type": gpu_type, "partition": partition,
                     "min_job_age": min_job_age, "jobcomp": jobcomp}
        self.timeout = timeout
        self._children: dict[int, subprocess.Popen] = {}

    @property
    def node_names(self) -> list[str]:
        return [f"node{k}" for k in range(1, self.spec["nodes"] + 1)]

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
            record = self._read_record()
            if record and self._all_alive(record):
                wanted = {k: record.get("spec", {}).get(k) for k in self.spec}
                if wanted != self.spec:
                    raise LaunchError(f"local Slurm in {self.paths.root} already runs with {wanted}; run "
                                      "`clustertrain local-slurm down` first to start it as asked")
                return self._wait_idle(deadline=time.monotonic() + self.timeout)
            self._stop_all(record)
            ensure_installed()
            try:
                self._start()
                return self._wait_idle(deadline=time.monotonic() + self.timeout)
            except BaseException:
                self._stop_all(self._read_record())
                raise

    def down(self) -> None:
        """Cancel all jobs, stop every daemon of this state dir by pid and wait until they are gone."""
        if not self.paths.root.is_dir():
            return
        with self._locked():
            self._stop_all(self._read_record())

    def status(self) -> LocalSlurmStatus:
        record = self._read_record() or {}
        pids = {name: (pid if _is_ours(pid, self.paths) else None)
                for name, pid in record.get("pids", {}).items()}
        running = bool(pids) and all(pids.values())
        nodes: dict[str, str] = {}
        if pids.get("slurmctld"):
            proc = self._client(["scontrol", "show", "node", "-o"], check=False)
            if proc.returncode == 0:
                nodes = {n.name: n.state for n in parse_nodes(proc.stdout)}
        return LocalSlurmStatus(self.paths.root, running, pids, nodes)

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
        key = os.open(p.munge_dir / "munge.key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(key, "wb") as fh:
            fh.write(os.urandom(1024))
        ports = _free_ports(1 + self.spec["nodes"])
        _write_atomic(p.conf, self.render_conf(ports[0], ports[1:]))
        if self.spec["gpus_per_node"]:
            self._make_gres()
        pids: dict[str, int] = {}
        record = {"version": RECORD_VERSION, "spec": self.spec, "ctld_port": ports[0],
                  "node_ports": dict(zip(self.node_names, ports[1:])), "pids": pids}
        pids["munged"] = self._spawn("munged", [
            _need("munged"), "--foreground", "--force", f"--socket={p.munge_socket}",
            f"--key-file={p.munge_dir / 'munge.key'}", f"--pid-file={p.munge_dir / 'munged.pid'}",
            f"--log-file={p.munge_dir / 'munged.log'}", f"--seed-file={p.munge_dir / 'munged.seed'}"])
        _write_atomic(p.record, json.dumps(record, indent=2))  # so a failure below can stop munged
        _wait_for(lambda: p.munge_socket.exists(), 10.0, "munged socket", self._log_of("munged"))
        pids["slurmctld"] = self._spawn("slurmctld", [_need("slurmctld"), "-D", "-i", "-f", str(p.conf)])
        for n in self.node_names:
            pids[f"slurmd-{n}"] = self._spawn(f"slurmd-{n}", [_need("slurmd"), "-D", "-f", str(p.conf), "-N", n])
        _write_atomic(p.record, json.dumps(record, indent=2))

    def render_conf(self, ctld_port: int, node_ports: list[int]) -> str:
        """The slurm.conf text for these ports (a value; ``up()`` writes it)."""
        if len(node_ports) != self.spec["nodes"]:
            raise LaunchError(f"local Slurm: {len(node_ports)} node ports for {self.spec['nodes']} nodes")
        node_list = [{"name": n, "port": port} for n, port in zip(self.node_names, node_ports)]
        env = jinja2.Environment(loader=jinja2.FileSystemLoader(_TEMPLATES), trim_blocks=True,
                                 lstrip_blocks=True, undefined=jinja2.StrictUndefined, autoescape=False)
        p = self.paths
        mem_kib = next((int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                        if line.startswith("MemTotal:")), 4 << 20)
        return env.get_template("slurm.conf.j2").render(
            state_dir=p.root, cluster_name="clustertrain-local", hostname=socket.gethostname().split(".")[0],
            munge_socket=p.munge_socket, jobcomp_file=p.jobcomp, ctld_dir=p.ctld_dir,
            spool_dir=p.slurmd_spool,
            run_dir=p.run_dir, log_dir=p.log_dir, real_memory_mb=max(1, mem_kib // 1024), ctld_port=ctld_port,
            node_list=node_list, **self.spec)

    def _make_gres(self) -> None:
        p, n = self.paths, self.spec["gpus_per_node"]
        p.dev_dir.mkdir(mode=0o755)
        for i in range(n):  # Slurm 22.05 drops GPUs without File=; CUDA_VISIBLE_DEVICES needs char devices
            os.mknod(p.dev_dir / f"nvidia{i}", 0o666 | 0o020000, os.makedev(195, i))
        files = f"{p.dev_dir}/nvidia[0-{n - 1}]" if n > 1 else f"{p.dev_dir}/nvidia0"
        _write_atomic(p.gres_conf, "# Generated by clustertrain (local-slurm): fake GPU devices, do not edit.\n"
                      f"AutoDetect=off\nNodeName=node[1-{self.spec['nodes']}] Name=gpu "
                      f"Type={self.spec['gpu_type']} File={files}\n")

    def _spawn(self, name: str, argv: list[str]) -> int:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.paths.conf)  # slurmstepd inherits it: down() finds leftovers by it
        with open(self.paths.log_dir / f"{name}.out", "ab") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=env, cwd=self.paths.root, start_new_session=True)
        self._children[proc.pid] = proc
        return proc.pid

    def _wait_idle(self, deadline: float) -> LocalSlurmStatus:
        states: dict[str, str] = {}
        while True:
            record = self._read_record() or {}
            for name, pid in record.get("pids", {}).items():
                # A daemon we just spawned may not have exec'd yet (its /proc entry still shows this
                # process's command line and environment): ask its Popen instead of /proc.
                child = self._children.get(pid)
                gone = child.poll() is not None if child is not None else not _is_ours(pid, self.paths)
                if gone:
                    raise LaunchError(f"local Slurm: {name} exited during start-up; "
                                      f"{_log_tail(self._log_of(name))}")
            proc = self._client(["scontrol", "show", "node", "-o"], check=False)
            if proc.returncode == 0:
                states = {n.name: n.state for n in parse_nodes(proc.stdout)}
                if set(states) == set(self.node_names) and all(s == "IDLE" for s in states.values()):
                    return self.status()
            if time.monotonic() > deadline:
                shown = ", ".join(f"{k}={v}" for k, v in sorted(states.items())) or "controller not answering"
                raise LaunchError(f"local Slurm: nodes not idle after {self.timeout:.0f}s ({shown}); "
                                  f"{_log_tail(self.paths.log_dir / 'slurmctld.log')}")
            time.sleep(0.2)

    def _stop_all(self, record: dict | None) -> None:
        pids = dict((record or {}).get("pids", {}))
        if pids.get("slurmctld") and _is_ours(pids["slurmctld"], self.paths):
            jobs = self._client(["squeue", "-h", "-o", "%A"], check=False).stdout.split()
            if jobs:
                self._client(["scancel", *jobs], check=False)
                _wait_for(lambda: not _find_ours(self.paths, {"slurmstepd"}), 5.0, None, None)
        order = [n for n in pids if n.startswith("slurmd-")] + ["slurmctld", "munged"]
        for name in order:
            pid = pids.get(name)
            if pid and (pid in self._children or _is_ours(pid, self.paths)):  # our Popen: ours even before exec
                self._stop_pid(pid)
        for pid in _find_ours(self.paths, set(_DAEMON_NAMES)):  # stragglers: steps, unrecorded daemons
            self._stop_pid(pid)
        link = self.paths.short_root
        if link.is_symlink() and Path(os.readlink(link)) == self.paths.root:
            link.unlink()

    def _stop_pid(self, pid: int, grace: float = 10.0) -> None:
        child = self._children.pop(pid, None)
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if child is not None and child.poll() is not None:
                    return
                if not _alive(pid):
                    return
                time.sleep(0.05)
        if child is not None:
            child.poll()

    def _client(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **self.env()}, timeout=30)
        if check and proc.returncode != 0:
            raise LaunchError(f"`{' '.join(argv)}` failed: {proc.stderr.strip().splitlines()[-1:]}")
        return proc

    def _read_record(self) -> dict | None:
        try:
            return json.loads(self.paths.record.read_text())
        except (OSError, ValueError):
            return None

    def _all_alive(self, record: dict) -> bool:
        pids = record.get("pids", {})
        return bool(pids) and all(_is_ours(pid, self.paths) for pid in pids.values())

    def _log_of(self, name: str) -> Path:
        log = self.paths.munge_dir / "munged.log" if name == "munged" else self.paths.log_dir / f"{name}.log"
        return log if log.exists() and log.stat().st_size else self.paths.log_dir / f"{name}.out"

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.paths.lock, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


# -- process helpers -------------------------------------------------------------------------------

def _find(name: str) -> str | None:
    return shutil.which(name) or next((f"{d}/{name}" for d in _SBIN if os.access(f"{d}/{name}", os.X_OK)), None)


def _need(name: str) -> str:
    path = _find(name)
    if not path:
        raise LaunchError(f"local Slurm: `{name}` not found; install slurm-wlm and munge")
    return path


def _alive(pid: int) -> bool:
    """True when the process exists and is not a zombie (stopped daemons linger as zombies)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _proc_refs(pid: int) -> tuple[str, bytes, bytes]:
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        return comm, Path(f"/proc/{pid}/cmdline").read_bytes(), Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return "", b"", b""


def _is_ours(pid: object, paths: LocalSlurmPaths) -> bool:
    """The pid is alive and is a daemon started for this state dir (guards against pid reuse)."""
    if not isinstance(pid, int) or not _alive(pid):
        return False
    comm, cmdline, environ = _proc_refs(pid)
    args = cmdline.split(b"\0")
    return (str(paths.conf).encode() in args or f"--socket={paths.munge_socket}".encode() in args
            or f"SLURM_CONF={paths.conf}".encode() in environ.split(b"\0") and comm in _DAEMON_NAMES)


def _find_ours(paths: LocalSlurmPaths, names: set[str]) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            pid = int(entry.name)
            if _proc_refs(pid)[0] in names and _is_ours(pid, paths):
                found.append(pid)
    return found


def _free_ports(count: int) -> list[int]:
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _wait_for(cond, timeout: float, what: str | None, log: Path | None) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            if what is None:
                return
            raise LaunchError(f"local Slurm: {what} not ready after {timeout:.0f}s; {_log_tail(log)}")
        time.sleep(0.05)


def _log_tail(log: Path | None, lines: int = 3) -> str:
    try:
        tail = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-lines:]
    except (OSError, AttributeError):
        return f"no log at {log}"
    return f"last lines of {log}: " + " | ".join(tail) if tail else f"{log} is empty"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
