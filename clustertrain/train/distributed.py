"""Who am I: the rank environment, from torchrun-style or Slurm variables, and process-group setup.

Precedence: ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` (torchrun, the local launcher) win; otherwise
``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID`` (so ``srun`` starts ranks with no torchrun).
``MASTER_ADDR`` defaults to the first host of ``SLURM_JOB_NODELIST`` (the Slurm batch script sets
it from the node's NodeAddr, because emulated node names do not resolve); ``MASTER_PORT`` defaults
to a port derived from ``SLURM_JOB_ID``.
"""

from __future__ import annotations

import datetime
import os
import re
from dataclasses import dataclass
from typing import Mapping

from clustertrain.errors import ConfigError


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str  # "torchrun" or "slurm"

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> "RankEnv":
        env = os.environ if env is None else env
        try:
            if "RANK" in env and "WORLD_SIZE" in env:
                rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
                local = int(env.get("LOCAL_RANK", rank))
                source = "torchrun"
            elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
                rank, world = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
                local = int(env.get("SLURM_LOCALID", 0))
                source = "slurm"
            else:
                return cls(0, 1, 0, "127.0.0.1", int(env.get("MASTER_PORT", 29500)), "single")
            addr = env.get("MASTER_ADDR") or first_host(env.get("SLURM_JOB_NODELIST", "")) or "127.0.0.1"
            port = int(env["MASTER_PORT"]) if env.get("MASTER_PORT") else port_for_job(env.get("SLURM_JOB_ID", "0"))
        except ValueError as e:
            raise ConfigError(f"rank environment: {e}; RANK/WORLD_SIZE/LOCAL_RANK/MASTER_PORT must be integers") from None
        if not 0 <= rank < world:
            raise ConfigError(f"rank environment: rank {rank} is outside world size {world}")
        return cls(rank, world, local, addr, port, source)


def port_for_job(job_id: str) -> int:
    """A port in 20000-29999 derived from the job id, the same on every node of the job."""
    digits = re.sub(r"\D", "", job_id) or "0"
    return 20000 + int(digits) % 10000


def expand_hostlist(spec: str) -> list[str]:
    """Expand a Slurm hostlist such as ``node[1-3,5],gpu-[01-02]`` (one bracket level, as Slurm prints them)."""
    hosts: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", spec):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not m:
            hosts.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{prefix}{i:0{width}d}{suffix}")
    return hosts


def first_host(spec: str) -> str | None:
    hosts = expand_hostlist(spec) if spec else []
    return hosts[0] if hosts else None


def init_process_group(env: RankEnv, backend: str, timeout_s: float = 600.0) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{env.master_addr}:{env.master_port}",
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def shutdown_process_group() -> None:
    """Barrier + destroy, always; tolerate a group that is already broken."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    try:
        dist.barrier()
    finally:
        dist.destroy_process_group()
