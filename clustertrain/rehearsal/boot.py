"""The boot of one emulated node of a rehearsal, in ParallelCluster's phase order; then it becomes the node's daemon.

Run as ``unshare -m --propagation private -- python -m clustertrain.rehearsal.boot SPEC NODE -- DAEMON...``
(:class:`clustertrain.rehearsal.cluster.RehearsalCluster` builds that line), so every mount below exists
only in this node's mount namespace and dies with its last process. Stdlib only: 81 of these start at once.

The node's file systems (nothing outside the rehearsal directory ``R`` is written on this machine):

* ``/``: a tmpfs mounted over ``R/nodes/<node>`` (in this namespace only) holds the node's root directory.
  Each directory of this machine's ``/`` appears in it as an overlay (this machine's directory below, the
  node's own changes above, on that tmpfs): the node's root volume, private to it. ``/proc``, ``/sys`` and
  ``/dev`` are this machine's (recursive binds); ``/tmp`` and ``/run`` are fresh tmpfs; a path that does
  not exist here (``/fsx``) is a directory of the node's own root. ``R`` itself is bound at its own path:
  the emulation's shared infrastructure (Slurm's state, as ``/opt/slurm`` is NFS-shared on a real cluster).
  The interpreter and the clustertrain installation running the rehearsal (the node's software, as the AMI or
  the image has it) are bound read-only at their paths when they lie in ``/tmp`` or ``/run`` (``software``).
* In the ``config`` phase (never before): the instance store as a tmpfs at the queue's
  ``EphemeralVolume.MountDir``, each shared file system (``SharedStorage`` ``MountDir``) bound from its one
  directory ``R/shared/<name>``, and ``/home`` from ``R/shared/home`` (ParallelCluster exports the head node's
  ``/home`` to every compute node over NFS).

Phases (:mod:`clustertrain.cloud.phases`): init (the OS's default user, as the AMI has it) -> OnNodeStart ->
config (the mounts above; the head node's slurmctld) -> OnNodeConfigured -> finalize (the daemon: slurmd, or
slurmctld on the head node, which starts in config: there OnNodeConfigured runs in a detached child once the
controller answers). Each custom action runs as ParallelCluster runs it: ``bash SCRIPT ARGS...`` as root,
its output in ``R/boot/<node>/<phase>-<script>.log``. A script that exits non-zero fails the boot: the
daemon never starts (ParallelCluster would replace the node) and the result says which script and why.

Spec (``R/boot/spec.json``, written by the rehearsal)::

    {"version": 1, "dir": R, "timeout_s": int, "path": "PATH for the scripts",
     "env": {"NAME": "value"},                      # the scripts' environment (CLUSTERTRAIN_MOUNT_TIMEOUT_S...)
     "links": {"/tmp/ct-slurm-x": "R/slurm"},       # symlinks recreated in each node's /tmp
     "software": ["/tmp/x/.venv", ...],             # directories bound read-only (see above)
     "user": {"name": "ec2-user", "uid": 1000},     # the OS default user (null: none)
     "shared": [{"name": "fsx-data", "source": "R/shared/fsx-data", "target": "/fsx/data"}],
     "nodes": {"NODE": "KIND"},
     "kinds": {"KIND": {"head": bool, "ephemeral": "/scratch" or null,
                        "actions": {"OnNodeStart": [{"script": "R/s3/...", "name": "x.sh", "args": []}], ...}}},
     "record": "R/slurm/cluster.json"}              # its ctld_port: where the head node's late phase waits for slurmctld

Result (``R/boot/<node>.json``, written atomically at every phase end)::

    {"version": 1, "node": str, "kind": str, "state": "booting" | "booted" | "failed",
     "phases": [{"phase": str, "script": str | null, "args": [...], "rc": int, "seconds": float, "log": str}],
     "error": str | null}                             # which script failed, and the last lines of its log
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import sys
import time

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384
HOOKS = ("OnNodeStart", "OnNodeConfigured")
_LIBC = ctypes.CDLL(None, use_errno=True)


class BootFailed(Exception):
    pass


def mount(source: str, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    rc = _LIBC.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                     data.encode() if data else None)
    if rc != 0:
        err = ctypes.get_errno()
        raise BootFailed(f"mount {source} on {target} ({fstype or 'bind'}): {os.strerror(err)}")


def build_root(spec: dict, node: str) -> str:
    """Mount the node's root (see the module docstring) and return its path on this machine."""
    rdir = spec["dir"]
    base = os.path.join(rdir, "nodes", node)
    os.makedirs(base, exist_ok=True)
    mount("rehearsal-node", base, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    root, cow = os.path.join(base, "root"), os.path.join(base, "cow")
    os.mkdir(root)
    os.mkdir(cow)
    for entry in os.scandir("/"):
        target = os.path.join(root, entry.name)
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), target)
        elif entry.name in ("proc", "sys", "dev"):
            os.mkdir(target)
            mount(entry.path, target, None, MS_BIND | MS_REC)
        elif entry.name in ("tmp", "run"):
            os.mkdir(target, 0o1777 if entry.name == "tmp" else 0o755)
            mount(f"rehearsal-{entry.name}", target, "tmpfs", MS_NOSUID | MS_NODEV,
                  "mode=1777" if entry.name == "tmp" else "mode=0755")
        elif entry.is_dir():
            upper, work = os.path.join(cow, "upper", entry.name), os.path.join(cow, "work", entry.name)
            os.makedirs(upper)
            os.makedirs(work)
            os.mkdir(target)
            mount("rehearsal-rootvol", target, "overlay", 0, f"lowerdir={entry.path},upperdir={upper},workdir={work}")
        elif entry.is_file():
            open(target, "w").close()
            mount(entry.path, target, None, MS_BIND)
    for path in spec.get("software", []):  # this machine's clustertrain and its interpreter, when under /tmp or /run
        os.makedirs(root + path, exist_ok=True)
        mount(path, root + path, None, MS_BIND | MS_REC)
        mount(path, root + path, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
    inside = root + rdir
    os.makedirs(inside, exist_ok=True)
    mount(rdir, inside, None, MS_BIND)
    for link, dest in spec.get("links", {}).items():
        path = root + link
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.symlink(dest, path)
    return root


def add_user(user: dict | None) -> None:
    """init: the AMI's default user (ec2-user, ubuntu) in the node's own /etc, unless it exists."""
    if not user:
        return
    name, uid = user["name"], int(user["uid"])
    with open("/etc/passwd") as f:
        if any(line.split(":", 1)[0] == name for line in f):
            return
    with open("/etc/group", "a") as f:
        f.write(f"{name}:x:{uid}:\n")
    with open("/etc/passwd", "a") as f:
        f.write(f"{name}:x:{uid}:{uid}::/home/{name}:/bin/bash\n")


def mount_config(spec: dict, kind: dict) -> None:
    """The config phase: instance store, shared file systems, /home."""
    if kind.get("ephemeral"):
        os.makedirs(kind["ephemeral"], exist_ok=True)
        mount("rehearsal-nvme", kind["ephemeral"], "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    for fs in spec["shared"]:
        os.makedirs(fs["target"], exist_ok=True)
        mount(fs["source"], fs["target"], None, MS_BIND)


class Booter:
    def __init__(self, spec: dict, node: str) -> None:
        self.spec, self.node = spec, node
        self.kind_name = spec["nodes"][node]
        self.kind = spec["kinds"][self.kind_name]
        self.dir = os.path.join(spec["dir"], "boot")
        self.logs = os.path.join(self.dir, node)
        self.result = {"version": 1, "node": node, "kind": self.kind_name, "state": "booting", "phases": [], "error": None}

    def phase(self, name: str, **extra) -> None:
        self.result["phases"].append({"phase": name, "script": None, "args": [], "rc": 0, "seconds": 0.0, "log": "", **extra})
        self.save()

    def save(self) -> None:
        path = os.path.join(self.dir, f"{self.node}.json")
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.result, f)
        os.replace(tmp, path)

    def fail(self, message: str) -> None:
        self.result["state"], self.result["error"] = "failed", message
        self.save()

    def run_hook(self, hook: str) -> None:
        env = {"PATH": self.spec["path"], "HOME": "/root", "LANG": "C.UTF-8", "USER": "root", "LOGNAME": "root",
               **self.spec.get("env", {})}
        for action in self.kind["actions"].get(hook, []):
            log = os.path.join(self.logs, f"{hook}-{action['name']}.log")
            start = time.monotonic()
            with open(log, "wb") as out:
                try:
                    rc = subprocess.run(["bash", action["script"], *action["args"]], stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=subprocess.STDOUT, env=env, cwd="/", timeout=self.spec["timeout_s"] + 60).returncode
                except subprocess.TimeoutExpired:
                    rc = 124
            seconds = round(time.monotonic() - start, 3)
            self.result["phases"].append({"phase": hook, "script": action["name"], "args": action["args"], "rc": rc,
                                          "seconds": seconds, "log": log})
            self.save()
            if rc != 0:
                raise BootFailed(f"{hook} script {action['name']} exited {rc} after {seconds:.1f}s: {tail(log)}")

    def boot(self, daemon: list[str]) -> None:
        os.makedirs(self.logs, exist_ok=True)
        try:
            root = build_root(self.spec, self.node)
            os.chroot(root)
            os.chdir("/")
            add_user(self.spec.get("user"))
            self.phase("init")
            self.run_hook("OnNodeStart")
            mount_config(self.spec, self.kind)
            self.phase("config")
            if self.kind.get("head"):
                self.late_head_phases()
            else:
                self.run_hook("OnNodeConfigured")
                self.result["state"] = "booted"
                self.phase("finalize", script=os.path.basename(daemon[0]))
        except (BootFailed, OSError) as err:
            self.fail(str(err))
            sys.exit(1)
        os.execv(daemon[0], daemon)

    def late_head_phases(self) -> None:
        """Head node: slurmctld starts in config (this process execs it); OnNodeConfigured runs in a detached
        grandchild once the controller answers, then the boot is complete."""
        if os.fork() != 0:
            return  # the parent goes on to exec slurmctld; the child exits at once, the grandchild is adopted
        if os.fork() != 0:
            os._exit(0)
        os.setsid()
        try:
            with open(self.spec["record"]) as f:
                port = int(json.load(f)["ctld_port"])
            wait_port("127.0.0.1", port, timeout=30.0)
            self.run_hook("OnNodeConfigured")
            self.result["state"] = "booted"
            self.phase("finalize")
            code = 0
        except (BootFailed, OSError) as err:
            self.fail(str(err))
            code = 1
        os._exit(code)


def wait_port(host: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=1.0).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise BootFailed(f"slurmctld did not answer on {host}:{port} within {timeout:.0f}s") from None
            time.sleep(0.1)


def tail(path: str, lines: int = 3) -> str:
    try:
        with open(path, errors="replace") as f:
            kept = [ln.strip() for ln in f.read().splitlines() if ln.strip()][-lines:]
    except OSError:
        return f"no log at {path}"
    return " | ".join(kept) if kept else "(no output)"


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] != "--":
        sys.exit("usage: python -m clustertrain.rehearsal.boot SPEC NODE -- DAEMON [ARGS...]")
    with open(argv[0]) as f:
        spec = json.load(f)
    Booter(spec, argv[1]).boot(argv[3:])


if __name__ == "__main__":
    main(sys.argv[1:])
