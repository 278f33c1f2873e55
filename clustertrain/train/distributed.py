"""Process-group setup for the ranks of a run. Who a process is (rank, world, rendezvous) is
:mod:`clustertrain.core.ranks`'s rule, shared with ``validate/`` and the batch scripts.

Two things are decided here for every rank, before the group exists (torch reads them when it creates a backend):

* **The flight recorder is on** (:func:`flight_recorder_env`): torch keeps each rank's last
  :data:`FLIGHT_BUFFER` collectives (``TORCH_FR_BUFFER_SIZE``, read in ``torch/distributed/distributed_c10d.py``
  with ``TORCH_NCCL_TRACE_BUFFER_SIZE`` as the older name), NCCL's watchdog dumps them when a collective times out
  (``TORCH_NCCL_DUMP_ON_TIMEOUT=1``; pytorch ``torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp``, which also needs
  ``TORCH_NCCL_ENABLE_MONITORING``, on by default) to ``TORCH_FR_DUMP_TEMP_FILE`` + the rank (the prefix pytorch's
  own flight recorder tests set, ``test/distributed/test_c10d_*``; ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` is the older
  name): ``RUN_DIR/flight/rank<R>``. The watchdog's beacons dump the same buffer at an incident
  (:mod:`clustertrain.train.heartbeat_writer`), and :mod:`clustertrain.monitor.flight` analyses the dumps. A value
  already in the rank's environment (the project's ``launch.env``, or the older names) is kept.
* **The process-group timeout** is :func:`clustertrain.monitor.hang_rules.process_group_timeout_s` of the
  ``monitor:`` section: past the watchdog's longest bound plus its evidence wait, so NCCL's own watchdog never ends
  a rank before clustertrain's has judged the hang and collected every rank's stack and dump.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import MutableMapping
from pathlib import Path

from clustertrain.core.ranks import RankInfo

#: collectives each rank's flight recorder keeps (torch's recommendation in its flight recorder docs: 2000)
FLIGHT_BUFFER = 2000
#: where NCCL's own dumps go, under the run directory (``<dir>/rank<R>``)
FLIGHT_DIR = "flight"
#: (variable, the older names torch also reads for it)
_FLIGHT_VARS = (("TORCH_FR_BUFFER_SIZE", ("TORCH_NCCL_TRACE_BUFFER_SIZE",)),
                ("TORCH_NCCL_DUMP_ON_TIMEOUT", ()),
                ("TORCH_FR_DUMP_TEMP_FILE", ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE",)))


def flight_recorder_env(run_dir: Path) -> dict[str, str]:
    """The flight recorder's variables for the ranks of the run in ``run_dir`` (see the module docstring)."""
    return {"TORCH_FR_BUFFER_SIZE": str(FLIGHT_BUFFER), "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_FR_DUMP_TEMP_FILE": str(Path(run_dir) / FLIGHT_DIR / "rank")}


def apply_flight_recorder_env(run_dir: Path, environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set :func:`flight_recorder_env` in ``environ`` (this process's environment) where neither the variable nor
    an older name of it is set; make the dump directory. Returns what it set."""
    environ = os.environ if environ is None else environ
    wanted = flight_recorder_env(run_dir)
    applied = {}
    for name, older in _FLIGHT_VARS:
        if name not in environ and not any(o in environ for o in older):
            environ[name] = applied[name] = wanted[name]
    prefix = environ.get("TORCH_FR_DUMP_TEMP_FILE") or environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    if prefix:
        try:
            Path(prefix).parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass  # NCCL cannot write its dump there: the beacon's dump at an incident still lands
    return applied


def init_process_group(env: RankInfo, backend: str, timeout_s: float = 600.0, run_dir: Path | None = None) -> None:
    """Join the ranks' default group with ``timeout_s`` (the trainer passes
    :func:`clustertrain.monitor.hang_rules.process_group_timeout_s`); with ``run_dir``, the flight recorder's
    variables are set first (:func:`apply_flight_recorder_env`)."""
    import torch.distributed as dist

    if run_dir is not None:
        apply_flight_recorder_env(run_dir)
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
