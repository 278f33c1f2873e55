"""Training metrics: ``RUN_DIR/metrics.jsonl`` and TensorBoard, written by rank 0.

Each line of metrics.jsonl is one JSON object for one logged step::

    {"step": 10, "loss": 3.21, "lr": 0.0003, "grad_norm": 1.2, "tokens_per_s": 5400.0,
     "step_time_s": 0.094, "mfu": null, "tokens": 40960, "time": 1763772000.0}

With several ranks a row also carries ``slowest_rank``, ``slowest_node``, ``slowest_part`` (data | compute) and
``spread_s`` (:func:`clustertrain.train.alarms.spread` over every rank's step timing, gathered at that step).
``mfu`` is model FLOPs utilisation (flops_per_token x tokens/s / (peak x GPUs)); it is null where
the peak is unknown (CPUs, GPUs without a bf16 peak). The peak is the GPU's dense bf16 figure from the
instance catalog (``clustertrain/plan/instances.yaml``). On resume from step S, lines with step > S are
dropped first (the file is rewritten whole, atomically), so the file always describes one continuous run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clustertrain.core.run_events import read_jsonl
from clustertrain.plan.catalog import read_catalog
from clustertrain.core.run_paths import write_atomic


def peak_flops_for(device_name: str | None) -> float | None:
    """Dense bf16 peak FLOP/s of the GPU a CUDA device name is (``NVIDIA H100 80GB HBM3``); None when the
    catalog does not know the GPU or it has no bf16 peak."""
    gpu = read_catalog().gpu_for_device(device_name)
    return gpu.peak_bf16_tflops * 1e12 if gpu is not None and gpu.peak_bf16_tflops else None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of ``metrics.jsonl`` (a line cut by a kill is skipped)."""
    return read_jsonl(path)


class MetricsWriter:
    def __init__(self, path: Path, tensorboard_dir: Path | None, start_step: int):
        self.path = path
        kept = [r for r in read_metrics(path) if r.get("step", 0) <= start_step]
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
        self._file = open(path, "a", encoding="utf-8")
        self._tb = None
        # the SummaryWriter (torch.utils.tensorboard: ~0.5 s of imports) opens at the second row, not on the way to the
        # first step: the first row waits for it in memory (written with its own step)
        self._tb_dir, self._tb_purge = tensorboard_dir, start_step + 1
        self._tb_rows: list[dict[str, Any]] = []

    def write(self, row: dict[str, Any]) -> None:
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._tb_dir is None:
            return
        self._tb_rows.append(row)
        if len(self._tb_rows) > 1 or self._tb is not None:
            self._flush_tb()

    def _flush_tb(self) -> None:
        if self._tb is None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self._tb_dir), purge_step=self._tb_purge)
        for row in self._tb_rows:
            for key, value in row.items():
                if key not in ("step", "time") and isinstance(value, (int, float)):
                    self._tb.add_scalar(f"train/{key}", value, row["step"])
        self._tb_rows.clear()

    def close(self) -> None:
        self._file.close()
        if self._tb_rows:
            self._flush_tb()
        if self._tb is not None:
            self._tb.close()
