"""Training metrics: ``RUN_DIR/metrics.jsonl`` and TensorBoard, written by rank 0.

Each line of metrics.jsonl is one JSON object for one logged step::

    {"step": 10, "loss": 3.21, "lr": 0.0003, "grad_norm": 1.2, "tokens_per_s": 5400.0,
     "step_time_s": 0.094, "mfu": null, "tokens": 40960, "time": 1763772000.0}

``mfu`` is model FLOPs utilisation (flops_per_token x tokens/s / (peak x GPUs)); it is null where
the peak is unknown (CPUs). On resume from step S, lines with step > S are dropped first, so the
file always describes one continuous run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# Dense bf16 peak TFLOP/s per GPU, from the vendors' data sheets (without sparsity).
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 70.0, "L4": 121.0, "B200": 2250.0}


def peak_flops_for(device_name: str | None) -> float | None:
    if not device_name:
        return None
    for key, tflops in PEAK_BF16_TFLOPS.items():
        if key in device_name.upper():
            return tflops * 1e12
    return None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a kill
    return rows


class MetricsWriter:
    def __init__(self, path: Path, tensorboard_dir: Path | None, start_step: int):
        self.path = path
        kept = [r for r in read_metrics(path) if r.get("step", 0) <= start_step]
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        os.replace(tmp, path)
        self._file = open(path, "a", encoding="utf-8")
        self._tb = None
        if tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(tensorboard_dir), purge_step=start_step + 1)

    def write(self, row: dict[str, Any]) -> None:
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in row.items():
                if key not in ("step", "time") and isinstance(value, (int, float)):
                    self._tb.add_scalar(f"train/{key}", value, row["step"])

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
