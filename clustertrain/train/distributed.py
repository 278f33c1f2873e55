"""Process-group setup for the ranks of a run. Who a process is (rank, world, rendezvous) is
:mod:`clustertrain.core.ranks`'s rule, shared with ``validate/`` and the batch scripts."""

from __future__ import annotations

import datetime

from clustertrain.core.ranks import RankInfo

def init_process_group(env: RankInfo, backend: str, timeout_s: float = 600.0) -> None:
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
