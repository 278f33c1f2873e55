"""Session-wide local Slurm cluster (2 emulated nodes on 127.0.0.1), started once and stopped at the end."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.slurm import local_slurm_cluster


@pytest.fixture(scope="session")
def local_slurm(tmp_path_factory):
    yield from local_slurm_cluster(tmp_path_factory.mktemp("slurm"), nodes=2)


# --- Slurm backend tests (test_slurm_backend.py) ---------------------------------------------------

TINY_SLURM = """
name: {name}
cluster: {{backend: slurm, nodes: 2, gpus_per_node: 0, procs_per_node: 1, threads_per_worker: 1}}
storage: {{root: {root}}}
models:
{models}
"""
TINY_MODEL = """  - name: {model}
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64}}
    training: {{max_steps: {steps}, micro_batch: 4, global_batch: 8, lr: 3.0e-3, min_lr: 3.0e-4,
               checkpoint_every: {ckpt}, keep_last: 2, log_every: 1, seed: 7}}
"""


@pytest.fixture
def slurm_project(tmp_path):
    """Write a tiny 2-node x 1-rank project (CPU, gloo) for the Slurm backend; return its path."""
    import json

    def make(models=("tiny",), steps: int = 12, ckpt: int = 4, root=None, name: str = "sl") -> "Path":
        text = TINY_SLURM.format(name=name, root=json.dumps(str(root or tmp_path / "fsx")),
                                 models="".join(TINY_MODEL.format(model=m, steps=steps, ckpt=ckpt) for m in models))
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        return path

    return make
