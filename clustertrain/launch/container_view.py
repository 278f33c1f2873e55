"""Run one rank the way Pyxis and Enroot run it, on a machine that has neither: the local stand-in for
``srun --container-image=...``.

``python -m clustertrain.launch.container_view [PYXIS OPTIONS] -- COMMAND...`` takes the very option strings the
batch script would give Pyxis (:func:`clustertrain.launch.sbatch.pyxis_options`) and runs ``COMMAND`` in a mount
namespace of its own with the view a container started by Pyxis has (the sources, read 2026-11):

* **a read-only root** — Enroot's container root is read-only unless ``ENROOT_ROOTFS_WRITABLE`` is set
  (enroot ``enroot.in``; Pyxis defers to it, ``pyxis_slurmstepd.c``; pyxis ``tests/env_vars.bats``: ``touch
  /newfile`` fails with "Read-only file system"), and clustertrain's node scripts keep it so. The image's file
  system does not exist here, so this machine's own root stands in for it (``--image-root``), every mount of
  it read-only; ``--container-writable`` keeps it writable, as Pyxis's option does.
* **Enroot's system mounts** (enroot ``conf/mounts/10-system.fstab``): ``/proc``, ``/dev`` (with ``/dev/shm``)
  bound read-write, ``/sys`` read-only, and fresh private tmpfs on ``/tmp`` and ``/run`` (``/var/run``).
* **only the ``--container-mounts`` sources**, bound read-write at their targets (``:ro`` read-only); a target
  that the image does not have is refused (Enroot's ``x-create`` would make it in the image; the stand-in root
  is this machine's and is never written).
* **HOME not mounted** unless ``--container-mount-home`` (pyxis ``--no-container-mount-home``; enroot
  ``conf/hooks/10-home.sh`` binds it only with ``ENROOT_MOUNT_HOME``): the host's home directory is hidden by
  an empty read-only directory, so a cache written under ``$HOME`` fails as it would on the cluster (the
  stand-in image's software that lives there, e.g. a pyenv interpreter, is bound back read-only).
* **the environment Pyxis gives** (pyxis ``tests/env.bats``: host variables pass through; a variable the
  image defines keeps the image's value unless ``--container-env`` names it). The stand-in image defines no
  variable, so every variable of the step passes.
* ``--container-workdir`` is the working directory; ``--container-name``, ``--container-image`` are accepted
  (the name only joins a container on a real node; the image file is checked by ``check``/``submit``).

The interpreter and clustertrain that run the rank are this machine's (the stand-in image's software): when
they live under ``/tmp`` or ``/run`` (a fresh clone in ``/tmp``), they are bound back read-only at their paths
(``--image-path``). A write anywhere else — a ``make`` in the image, a cache under ``$HOME``, a file beside the
run directory — fails with ``EROFS``/``ENOENT`` naming the path, in the rank's own output.

Needs root (``unshare(CLONE_NEWNS)``), as the local Slurm runs its jobs; stdlib only (640 of these start at
once in a rehearsal). A problem setting up the view is one line on stderr, exit 125 (nothing ran).
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
#: statvfs f_flag bits (ST_*) -> mount flags kept on a read-only remount
_KEEP = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC))
SETUP_FAILED = 125
#: the top-level directories Enroot mounts itself (10-system.fstab): never taken from the image root
_SYSTEM = {"proc", "dev", "sys", "tmp", "run"}
_LIBC = ctypes.CDLL(None, use_errno=True)


class ViewError(Exception):
    """The view cannot be set up (one line)."""


class Options:
    """The Pyxis options of one step, parsed as srun's SPANK options are (``--opt=value``)."""

    def __init__(self) -> None:
        self.image: str | None = None
        self.name: str | None = None
        self.mounts: list[tuple[str, str, str]] = []
        self.env: list[str] = []
        self.workdir: str | None = None
        self.mount_home = False
        self.writable = False
        self.image_root = "/"
        self.image_paths: list[str] = []


def parse(argv: list[str]) -> tuple[Options, list[str]]:
    """(options, command) of ``argv`` = ``[OPTION...] -- COMMAND...``."""
    if "--" not in argv:
        raise ViewError("usage: python -m clustertrain.launch.container_view [PYXIS OPTIONS] -- COMMAND...")
    cut = argv.index("--")
    opts, command = Options(), argv[cut + 1:]
    if not command:
        raise ViewError("container view: no command after --")
    for arg in argv[:cut]:
        name, _, value = arg.partition("=")
        if name == "--container-image":
            opts.image = value
        elif name == "--container-name":
            opts.name = value
        elif name == "--container-mounts":
            for item in filter(None, value.split(",")):
                parts = item.split(":")
                if len(parts) == 1:
                    parts = [parts[0], parts[0]]
                if len(parts) > 3 or not parts[0].startswith("/") or not parts[1].startswith("/"):
                    raise ViewError(f"--container-mounts: {item!r} is not SRC:DST[:FLAGS] with absolute paths")
                opts.mounts.append((parts[0], parts[1], parts[2] if len(parts) == 3 else ""))
        elif name == "--container-env":
            opts.env = [v for v in value.split(",") if v]
        elif name == "--container-workdir":
            opts.workdir = value
        elif name in ("--container-mount-home", "--no-container-mount-home"):
            opts.mount_home = name == "--container-mount-home"
        elif name in ("--container-writable", "--container-readonly"):
            opts.writable = name == "--container-writable"
        elif name == "--image-root":
            opts.image_root = value
        elif name == "--image-path":
            opts.image_paths.append(value)
        else:
            raise ViewError(f"container view: unknown option {arg!r} (Pyxis options only)")
    return opts, command


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    rc = _LIBC.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                     data.encode() if data else None)
    if rc != 0:
        err = ctypes.get_errno()
        raise ViewError(f"container view: mount {source} on {target}: {os.strerror(err)}")


def _mount_points(prefix: str) -> list[str]:
    """Mount points at or below ``prefix`` (``/proc/self/mountinfo``, octal escapes undone), parents first."""
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            point = line.split()[4]
            point = point.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
            if point == prefix or point.startswith(prefix.rstrip("/") + "/"):
                out.append(point)
    return sorted(set(out), key=len)


def _read_only(tree: str) -> None:
    """Remount ``tree`` and every mount below it read-only, keeping nosuid/nodev/noexec."""
    for point in _mount_points(tree):
        try:
            flags = os.statvfs(point).f_flag
        except OSError:
            continue  # a mount point this namespace cannot reach (a stale network mount): leave it
        keep = sum(bit for st, bit in _KEEP if flags & st)
        if _LIBC.mount(point.encode(), point.encode(), None, MS_BIND | MS_REMOUNT | MS_RDONLY | keep, None) != 0:
            err = ctypes.get_errno()
            if point != tree and err == 22:
                continue  # EINVAL: a mount hidden under a later one at a parent path (that one is remounted)
            raise ViewError(f"container view: read-only remount of {point}: {os.strerror(err)}")


def _bind(source: str, target: str, read_only: bool) -> None:
    _mount(source, target, None, MS_BIND | MS_REC)
    if read_only:
        _read_only(target)


def _make_target(root: str, path: str, like: str) -> str:
    """``root + path``, created (directory, or an empty file when ``like`` is a file) when it lies on one of the
    view's own tmpfs (/tmp, /run); elsewhere it must exist in the image."""
    target = root + path
    if os.path.lexists(target):
        return target
    top = path.strip("/").split("/")[0]
    if top not in ("tmp", "run"):
        raise ViewError(f"container view: mount target {path} does not exist in the image (the stand-in root "
                        f"{'/'} has no such path); mount it at a path the image has, or under /tmp")
    if os.path.isdir(like):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "w").close()
    return target


def build_root(opts: Options, home: str | None) -> str:
    """Mount the view (module docstring) in this (new) mount namespace; return its root."""
    base = tempfile.mkdtemp(prefix="clustertrain-view-")
    _mount("clustertrain-view", base, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    root = os.path.join(base, "root")
    os.mkdir(root)
    image = opts.image_root
    for entry in sorted(os.scandir(image), key=lambda e: e.name):
        target = os.path.join(root, entry.name)
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), target)
        elif entry.name in ("proc", "dev", "sys"):
            os.mkdir(target)
            _bind(os.path.join("/", entry.name), target, read_only=entry.name == "sys")
        elif entry.name in ("tmp", "run"):
            os.mkdir(target)
            _mount(f"view-{entry.name}", target, "tmpfs", MS_NOSUID | MS_NODEV,
                   "mode=1777" if entry.name == "tmp" else "mode=0755")
        elif entry.is_dir():
            os.mkdir(target)
            _bind(entry.path, target, read_only=not opts.writable)
        elif entry.is_file():
            open(target, "w").close()
            _bind(entry.path, target, read_only=not opts.writable)
    for name in ("tmp", "run"):  # an image root without them still gets Enroot's tmpfs
        if not os.path.lexists(os.path.join(root, name)):
            os.mkdir(os.path.join(root, name))
            _mount(f"view-{name}", os.path.join(root, name), "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    hidden = None
    if home and home != "/":
        target = root + home
        if opts.mount_home:
            _bind(home, _make_target(root, home, home), read_only=False)
        elif os.path.isdir(target):
            _mount("view-no-home", target, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
            hidden = home
    paths = [p for p in opts.image_paths  # the outermost only: a later bind of a parent would hide an inner one
             if not any(o != p and p.startswith(o.rstrip("/") + "/") for o in opts.image_paths)]
    for path in paths:  # the stand-in image's software, where the view's tmpfs hid it
        under_home = hidden is not None and (path == hidden or path.startswith(hidden.rstrip("/") + "/"))
        if os.path.isdir(path) and (under_home or path.strip("/").split("/")[0] in ("tmp", "run")):
            target = root + path
            os.makedirs(target, exist_ok=True)
            _bind(path, target, read_only=True)
    if hidden is not None:  # the empty HOME, read-only once the software in it is in place
        _mount("view-no-home", root + hidden, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    for source, dest, flags in opts.mounts:
        if not os.path.exists(source):
            raise ViewError(f"container view: mount source {source} does not exist on this node; create it or "
                            "correct the mount")
        _bind(source, _make_target(root, dest, source), read_only="ro" in flags.split("+"))
    return root


def enter(opts: Options) -> None:
    """Move this process into the view: a private mount namespace, the root above, the working directory."""
    if os.geteuid() != 0:
        raise ViewError("container view: needs root (a mount namespace of its own); the local Slurm runs jobs "
                        "as root — run `clustertrain local-slurm up` as root")
    if _LIBC.unshare(CLONE_NEWNS) != 0:
        raise ViewError(f"container view: unshare(CLONE_NEWNS): {os.strerror(ctypes.get_errno())}")
    if _LIBC.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0 and ctypes.get_errno() != 22:
        # EINVAL: "/" is no mount point here (a rehearsal node's chroot, whose namespace is private already)
        raise ViewError(f"container view: making / private: {os.strerror(ctypes.get_errno())}")
    root = build_root(opts, os.environ.get("HOME"))
    os.chroot(root)
    workdir = opts.workdir or "/"
    try:
        os.chdir(workdir)
    except OSError as err:
        raise ViewError(f"container view: --container-workdir {workdir}: {err.strerror} in the container; "
                        "mount it (--container-mounts) or choose a path the image has") from None


def main(argv: list[str]) -> None:
    try:
        opts, command = parse(argv)
        enter(opts)
    except ViewError as err:
        print(str(err), file=sys.stderr, flush=True)
        raise SystemExit(SETUP_FAILED) from None
    try:
        os.execvp(command[0], command)
    except OSError as err:
        print(f"container view: {command[0]}: {err.strerror}", file=sys.stderr, flush=True)
        raise SystemExit(127) from None


if __name__ == "__main__":
    main(sys.argv[1:])
