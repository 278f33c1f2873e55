"""Process lifetime, in one place (leaf module: stdlib only): a child that must not outlive its parent."""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send this process ``sig`` when its parent dies (Linux ``PR_SET_PDEATHSIG``; elsewhere
    nothing). Call it in the child: as a ``preexec_fn`` (the local rank launcher, before any thread exists) or
    first thing after start (the node sampler, which also checks its parent's pid for the race before the call)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        pass
