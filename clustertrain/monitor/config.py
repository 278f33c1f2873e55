"""The ``monitor:`` section of the project file: the node sampler, per-rank step timing and the alarms.

It imports nothing from clustertrain but :mod:`clustertrain.schema` (the strict base), so that
``project.py`` can compose it.

Example::

    monitor:
      interval_s: 10            # node sampler period (NVML + psutil) -> RUN_DIR/monitor/<node>.csv
      gpu_temp_c: 85            # a GPU at or above this is a gpu_temperature event
      loss_spike_factor: 2.0    # loss above 2 x the median of the last loss_window logged losses
      loss_window: 20
      throughput_drop: 0.5      # tokens/s below half the median of the window
      straggler_factor: 1.5     # a rank's data/compute time above 1.5 x its peers' median ...
      straggler_steps: 3        # ... at 3 logged steps in a row
"""

from __future__ import annotations

from pydantic import Field

from clustertrain.schema import StrictModel


class MonitorConfig(StrictModel):
    """What runs beside training to watch it (see docs/monitor.md)."""

    enabled: bool = Field(
        True, description="Run the node sampler (one per node) and record per-rank step timing. Non-finite loss or "
        "gradient norm always stops the run, whatever this says.",
    )
    interval_s: float = Field(10.0, ge=0.2, le=3600, description="Seconds between two samples of the node sampler.")
    gpu_temp_c: int = Field(85, ge=40, le=120, description="A GPU at or above this temperature (°C) is a gpu_temperature event.")
    loss_spike_factor: float = Field(
        2.0, gt=1.0, description="A logged loss above this factor times the median of the last `loss_window` logged losses "
        "is a loss_spike event.",
    )
    loss_window: int = Field(20, ge=3, description="Logged steps in the moving window of the loss-spike and throughput alarms.")
    throughput_drop: float = Field(
        0.5, gt=0.0, lt=1.0, description="Tokens/s below this fraction of the window's median is a throughput_drop event.",
    )
    straggler_factor: float = Field(
        1.5, gt=1.0, description="A rank whose data or compute time per step is above this factor times its peers' median "
        "is slow at that step.",
    )
    straggler_steps: int = Field(3, ge=1, description="Logged steps in a row a rank must be slow to become a straggler event.")
