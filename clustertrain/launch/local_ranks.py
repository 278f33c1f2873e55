"""Start the ranks of one job as processes on this machine: the one local rank launcher.

Both the local backend (:class:`clustertrain.launch.local.LocalLauncher`, training) and the local
collectives benchmark (:func:`clustertrain.validate.collectives.launch_local`) start their ranks here.
Each rank gets this process's environment without its ``SLURM_*`` and torchrun variables, plus the
torchrun-style rank variables of :meth:`clustertrain.core.ranks.RankInfo.environ` (MASTER_ADDR=127.0.0.1,
MASTER_PORT a free port unless given) and ``PYTHONUNBUFFERED=1``. Its stdout and stderr are appended
to its log file after a header line. ``OMP_NUM_THREADS`` is this process's CPUs (its affinity, ``os.sched_getaffinity``)
divided by the ranks, unless ``extra_env`` gives it: the rule of :mod:`clustertrain.train.threads`, so a shell's
stray value does not size every rank's thread pools (the batch script does the same on a Slurm node). Each rank leads its own process group (so a signal reaches
everything it started) and gets SIGTERM when the launcher dies.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from clustertrain.core.processes import die_with_parent
from clustertrain.core.ranks import TORCHRUN_VARIABLES, RankInfo

LOCAL_ADDR = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOCAL_ADDR, 0))
        return s.getsockname()[1]


def local_rank_info(rank: int, world: int, port: int) -> RankInfo:
    """Rank ``rank`` of ``world`` ranks, all on this machine."""
    return RankInfo(rank=rank, world_size=world, local_rank=rank, local_world_size=world, node_rank=0,
                    master_addr=LOCAL_ADDR, master_port=port, source="torchrun")


def threads_per_local_rank(world: int) -> int:
    """CPU threads per rank when ``world`` ranks share this process's CPUs (at least 1)."""
    return max(1, len(os.sched_getaffinity(0)) // max(1, world))


def start_local_ranks(argv: Sequence[str], world: int, log_for: Callable[[int], Path], *, port: int | None = None,
                      skip: Iterable[int] = (), extra_env: Mapping[str, str] | None = None) -> dict[int, subprocess.Popen]:
    """Start ``argv`` once per rank ``0 .. world-1`` (except those in ``skip``), with rank ``r``'s output
    appended to ``log_for(r)``; returns rank -> process."""
    port = port or free_port()
    skipped = set(skip)
    drop = set(TORCHRUN_VARIABLES) | {"MASTER_ADDR", "MASTER_PORT"}
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in drop}
    base["OMP_NUM_THREADS"] = str(threads_per_local_rank(world))
    procs: dict[int, subprocess.Popen] = {}
    try:
        for rank in range(world):
            if rank in skipped:
                continue
            env = {**base, **(extra_env or {}), **local_rank_info(rank, world, port).environ(), "PYTHONUNBUFFERED": "1"}
            with open(log_for(rank), "ab") as log:
                log.write(f"=== clustertrain rank {rank}/{world} started {time.strftime('%Y-%m-%d %H:%M:%S')} ===\n"
                          .encode())
                log.flush()
                procs[rank] = subprocess.Popen(list(argv), env=env, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    except BaseException:
        stop_ranks(procs.values(), signal.SIGKILL)
        raise
    return procs


def stop_ranks(procs: Iterable[subprocess.Popen], sig: int) -> None:
    """Send ``sig`` to the process group of every rank still running."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass


def reap_ranks(procs: Iterable[subprocess.Popen], grace: float) -> None:
    """Wait up to ``grace`` seconds for every rank to exit, then kill what is left and reap it."""
    procs = list(procs)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    stop_ranks(procs, signal.SIGKILL)
    for p in procs:
        p.wait()


def _die_with_parent() -> None:  # runs in the child before exec
    os.setsid()
    die_with_parent()
