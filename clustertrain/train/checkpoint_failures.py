"""What a failed checkpoint save is, said in one line: the file system that holds the checkpoints (type, mount point,
free and total space), whether it is full, and the lowest failing rank's error (DCP gathers every rank's failure).
The line itself is built by :meth:`clustertrain.train.checkpoint.CheckpointManager`.

A save that fails (a full file system, quota, I/O error; in the synchronous write, the asynchronous
write — seen at :meth:`~CheckpointManager.commit_finished`/:meth:`~CheckpointManager.wait` — or the commit) raises one
:class:`~clustertrain.core.errors.RunDirError` line naming the step, the file system (type, mount point, free and
total space: ``os.statvfs`` and ``/proc/self/mounts``) and the checkpoint ``latest`` still names; rank 0
first removes the half-written ``.tmp-step_N``.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import psutil

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def save_errors() -> tuple[type[BaseException], ...]:
    """What a failed DCP write raises: its CheckpointException is a BaseException (gathered rank failures)."""
    from torch.distributed.checkpoint.api import CheckpointException

    return (Exception, CheckpointException)


def describe_file_system(path: Path) -> str:
    """``"<type> mounted at <mount point>, <free> free of <total>"`` for the file system holding ``path``
    (its mount from :func:`psutil.disk_partitions`, which reads ``/proc/self/mounts`` and unescapes ``\\040``:
    the longest mount point above it, the last mounted on top)."""
    real = os.path.realpath(path)
    mount, kind = "/", "unknown"
    try:
        partitions = psutil.disk_partitions(all=True)
    except OSError:
        partitions = []
    for part in partitions:
        point = part.mountpoint
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(mount):
            mount, kind = point, part.fstype
    st = os.statvfs(path)
    return (f"{kind} mounted at {mount}, {size(st.f_bavail * st.f_frsize)} free of "
            f"{size(st.f_blocks * st.f_frsize)}")


def size(n: int) -> str:
    """Bytes for a person: ``812 B``, ``3.4 MiB``, ``1.2 TiB``."""
    if n < 1024:
        return f"{n} B"
    power = min(4, (n.bit_length() - 1) // 10)
    return f"{n / 1024 ** power:.1f} {('KiB', 'MiB', 'GiB', 'TiB')[power - 1]}"


def os_error(e: BaseException | None, depth: int = 0) -> OSError | None:
    """The first :class:`OSError` behind ``e``: itself, a DCP rank failure (``failures``), a cause or context
    (torch.save turns a failed write into a RuntimeError whose context is the OSError)."""
    if e is None or depth > 8:
        return None
    if isinstance(e, OSError) and e.errno is not None:
        return e
    failures = getattr(e, "failures", None) or {}
    inner = [failures[r][0] for r in sorted(failures)] + [e.__cause__, e.__context__]
    return next((found for x in inner if (found := os_error(x, depth + 1)) is not None), None)


def one_line(e: BaseException) -> str:
    """The lowest failing rank's message, on one line (DCP wraps each rank's exception with its traceback)."""
    failures = getattr(e, "failures", None)
    if failures:
        e = failures[min(failures)][0]
    text = " ".join(str(e).split())
    return text[:300] + ("…" if len(text) > 300 else "")
