"""Fixtures for tests that run real training."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

TINY = """
name: itest
cluster: {{backend: local, gpus_per_node: 0, procs_per_node: 2, threads_per_worker: 1}}
storage: {{root: {root}}}
models:
  - name: tiny
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64, dropout: 0.1}}
    training: {{max_steps: {steps}, micro_batch: 4, global_batch: 16, lr: 3.0e-3, min_lr: 3.0e-4, warmup_steps: 4,
               checkpoint_every: {ckpt}, keep_last: 2, log_every: 1, seed: 7}}
    parallelism: {parallelism}
"""


@pytest.fixture
def tiny_project(tmp_path):
    def make(steps: int = 20, ckpt: int = 5, root: Path | None = None, name: str = "p.yaml",
             parallelism: dict | None = None) -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(TINY.format(root=json.dumps(str(root or tmp_path / "fsx")), steps=steps, ckpt=ckpt,
                                                    parallelism=json.dumps(parallelism or {}))))
        return path

    return make
