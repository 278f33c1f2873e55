"""The ``monitor:`` section of the project file: the node sampler, per-rank step timing and the alarms.

It imports nothing from clustertrain but :mod:`clustertrain.core.schema` (the strict base), so that
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
      heartbeat_s: 5            # each rank's heartbeat (step, phase) -> RUN_DIR/heartbeat/rank<R>.json
      hang_floor_s: 30          # no progress for max(hang_floor_s, hang_step_factor x step time) is a hang ...
      hang_step_factor: 3
      hang_ceiling_s: 900       # ... and never longer than this (start-up, first step, checkpoint saves)
      suspect_ttl_h: 24         # a node blamed for a hang or crash is excluded from this project's jobs this long
      trackers:                 # where rank 0 also sends every metrics row (docs/monitor.md "Experiment trackers")
        tensorboard: true
        mlflow: {tracking_uri: http://10.0.0.5:5000, experiment: my-project, tags: {team: pretrain}}
        wandb: {project: my-project, entity: my-team, mode: offline}
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from clustertrain.core.schema import StrictModel


class MlflowTrackerConfig(StrictModel):
    """One MLflow run per model (``monitor.trackers.mlflow``); credentials only from the environment
    (``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD``/``MLFLOW_TRACKING_TOKEN``), never here."""

    tracking_uri: str = Field(
        ..., description="Where MLflow keeps the runs: a server URL (`http://host:5000`), a database "
        "(`sqlite:////fsx/mlflow.db`) or a directory (`/fsx/mlruns`, `file:///fsx/mlruns`). Every node must reach it. "
        "No user name or password in it: MLflow reads them from MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD.",
    )
    experiment: str | None = Field(None, description="MLflow experiment holding the project's runs. Default: the project name.")
    tags: dict[str, str] = Field(default_factory=dict, description="Tags set on every run of the project.")


class WandbTrackerConfig(StrictModel):
    """One W&B run per model (``monitor.trackers.wandb``), grouped by project; the API key only from
    ``WANDB_API_KEY`` or W&B's own login file (``~/.netrc``), never here."""

    project: str | None = Field(None, description="W&B project. Default: the project name.")
    entity: str | None = Field(None, description="W&B entity (team or user). Default: the API key's default entity.")
    group: str | None = Field(None, description="W&B run group. Default: the project name (one group per project, one run per model).")
    mode: Literal["online", "offline"] = Field(
        "online", description="`online` streams to W&B; `offline` writes the run under `dir` for a later `wandb sync`.",
    )
    dir: Path | None = Field(
        None, description="Directory W&B writes its run files under (on a shared mount with the slurm backend). "
        "Default: the model's run directory.",
    )
    tags: list[str] = Field(default_factory=list, description="Tags set on every run of the project.")


class TrackersConfig(StrictModel):
    """Experiment trackers rank 0 sends the run to, beside ``metrics.jsonl`` (docs/monitor.md)."""

    tensorboard: bool = Field(True, description="Write TensorBoard event files (see `storage.tensorboard`).")
    mlflow: MlflowTrackerConfig | None = Field(None, description="Send each model's run to MLflow (extra: `clustertrain[tracking]`).")
    wandb: WandbTrackerConfig | None = Field(None, description="Send each model's run to Weights & Biases (extra: `clustertrain[tracking]`).")
    queue_rows: int = Field(
        10000, ge=10, le=1_000_000, description="Rows and notes waiting for a slow or unreachable tracker at most; "
        "beyond it the oldest are dropped and counted in the run's events (a tracker never stalls a step).",
    )


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
    heartbeat_s: float = Field(
        5.0, ge=0.5, le=60, description="Seconds between two writes of each rank's heartbeat (its step, phase and a "
        "liveness stamp; RUN_DIR/heartbeat/rank<R>.json, one small in-place write, no file created).",
    )
    hang_floor_s: float = Field(
        30.0, ge=5, le=3600, description="The least time without progress that counts as a hang (the watchdog then "
        "names the ranks behind, dumps every rank's stack and ends the job).",
    )
    hang_step_factor: float = Field(
        3.0, ge=1.5, le=100, description="A hang is no progress for max(hang_floor_s, this x the measured step time); "
        "a checkpoint save gets this x its measured save time.",
    )
    hang_ceiling_s: float = Field(
        900.0, ge=30, le=86400, description="The longest time without progress before a hang is declared, whatever "
        "the step time: also the bound of the phases with no measurement yet (start-up, the first step, the first "
        "checkpoint save).",
    )
    suspect_ttl_h: float = Field(
        24.0, gt=0, le=24 * 90, description="Hours a node blamed for a hang, a lost rank or failed GPU health stays on "
        "the project's suspect list (jobs of the project exclude it; `clustertrain nodes clear` ends it sooner).",
    )

    trackers: TrackersConfig = Field(
        default_factory=TrackersConfig, description="Experiment trackers (TensorBoard, MLflow, W&B) that receive every "
        "metrics row, the resolved project, events and checkpoint references from rank 0.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> "MonitorConfig":
        if self.hang_floor_s > self.hang_ceiling_s:
            raise ValueError(f"monitor.hang_floor_s ({self.hang_floor_s:g}) is above monitor.hang_ceiling_s "
                             f"({self.hang_ceiling_s:g}); lower the floor or raise the ceiling")
        return self
