"""The ``launch:`` section of the project file: how Slurm jobs are submitted and kept alive.

It imports nothing from clustertrain but :mod:`clustertrain.core.schema` (the strict base), so that
``project.py`` can compose it.
Where Slurm output files go is not a launch setting: it follows the storage layout
(``storage.logs``, see :mod:`clustertrain.core.storage_layout`).

Example::

    launch:
      python: /fsx/envs/train/bin/python   # the ranks' interpreter (default: see LaunchConfig.python)
      signal: USR2            # sent to the batch script signal_grace_s before the time limit
      signal_grace_s: 300
      max_segments: 6         # time-limited jobs per submission: the first + continuations after the stop signal
      max_restarts: 3         # restarts after failures (hang, lost rank, node failure, a segment that saved nothing)
      exclusive: true
      env:                    # over the NCCL/EFA preset; null removes a preset variable
        NCCL_DEBUG: WARN
        NCCL_TUNER_PLUGIN: null
      sbatch_args: ["--qos=high"]
      srun_args: ["--cpu-bind=none"]
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from clustertrain.core.schema import StrictModel

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Signals the trainer turns into "finish the step, save, exit" (see clustertrain.train.signals).
STOP_SIGNALS = ("USR2", "TERM")


def _no_control_chars(value: str, what: str) -> str:
    if "\n" in value or "\r" in value or "\0" in value:
        raise ValueError(f"{what} {value!r} contains a newline or NUL, which cannot be rendered into a batch script")
    return value


class LaunchConfig(StrictModel):
    """How `clustertrain submit` renders and submits Slurm batch jobs."""

    python: str | None = Field(
        None,
        description="Interpreter the ranks run (`PYTHON -m clustertrain train`). Without `cluster.container_image` it must be "
        "an absolute path that is the same on every node — in a project with an `aws:` section, on one of its shared file "
        "systems (e.g. a venv under /fsx), or `submit` refuses. Default: the interpreter running `clustertrain submit`. "
        "With a container image: the interpreter inside the image (default `python`).",
    )
    signal: Literal["USR2", "TERM"] = Field(
        "USR2",
        description="Signal Slurm sends to the batch script `signal_grace_s` before the time limit (`--signal=B:SIG@s`); "
        "the script forwards it to the ranks, which save a checkpoint and stop, then requeues the job. "
        "USR2, not USR1: NCCL may use USR1.",
    )
    signal_grace_s: int = Field(
        300, ge=10, le=86400,
        description="Seconds before the time limit at which the signal is sent; must cover one step plus a checkpoint save.",
    )
    max_restarts: int = Field(
        3, ge=0, description="Restarts after failures: a hang, a lost rank or a rank killed by a signal (the job is submitted "
        "again without the blamed nodes), a requeue by Slurm after a node failure, or a segment that ended on the stop "
        "signal without saving a newer checkpoint. Continuing after the time limit or a preemption does not count "
        "(`max_segments` bounds that). 0 = never restart after a failure.",
    )
    max_segments: int = Field(
        4, ge=1, description="Time-limited jobs (segments) one submission may run: the first, then one more each time the "
        "stop signal (time limit, preemption) ended a segment that saved a newer checkpoint and the job requeues itself "
        "to continue. `clustertrain check` errors when `max_segments` x `cluster.time_limit` cannot reach `max_steps` "
        "at the plan's step time and says how many are needed. A bound you choose on what one submission may spend; "
        "1 = never continue.",
    )
    exclusive: bool = Field(True, description="Whole-node jobs ask for their nodes whole (`--exclusive`). A job on a share "
                            "of one node (`models[].plan.gpus`) never does, whatever this says: it asks for its GPUs, memory "
                            "and CPUs so that other shares fit beside it (docs/slurm.md \"Jobs that share a node\").")
    gpu_directive: Literal["gpus-per-node", "gres"] = Field(
        "gpus-per-node", description="How GPUs are requested: `--gpus-per-node=N`, or `--gres=gpu:N` for clusters without GPU TRES."
    )
    env: dict[str, str | None] = Field(
        default_factory=dict,
        description="Environment variables for the ranks, applied over the NCCL/EFA preset of the instance type "
        "(clustertrain/launch/nccl_presets.yaml); `null` removes a preset variable.",
    )
    sbatch_args: list[str] = Field(default_factory=list, description="Extra `#SBATCH` options, e.g. `--qos=high`.")
    srun_args: list[str] = Field(default_factory=list, description="Extra `srun` options, e.g. `--cpu-bind=none`.")

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str | None]) -> dict[str, str | None]:
        for key, val in value.items():
            if not ENV_NAME_RE.match(key):
                raise ValueError(f"launch.env: {key!r} is not a valid environment variable name (letters, digits, '_')")
            if val is not None:
                _no_control_chars(val, f"launch.env.{key}")
        return value

    @field_validator("python")
    @classmethod
    def _python(cls, value: str | None) -> str | None:
        if value is not None:
            _no_control_chars(value, "launch.python")
            if not value.strip():
                raise ValueError("launch.python must not be empty; give the interpreter's path, e.g. /fsx/envs/train/bin/python")
        return value

    @field_validator("sbatch_args", "srun_args")
    @classmethod
    def _args(cls, value: list[str]) -> list[str]:
        for arg in value:
            _no_control_chars(arg, "launch argument")
            if not arg.startswith("-"):
                raise ValueError(f"launch argument {arg!r} must be an option starting with '-', e.g. --qos=high")
        return value


def launch_config_of(project: Any) -> LaunchConfig:
    """The project's ``launch`` section (``Project.launch``, defaults filled in)."""
    return project.launch
