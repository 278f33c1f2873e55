"""Honest precision on two real gloo ranks: each layout — DDP, FSDP2 (``zero_stage: 3``), dp 1 x tp 2 (FSDP2 over a
one-rank dp mesh) and a two-stage pipeline — computes in the dtype its :class:`~clustertrain.train.parallel.Precision`
reports, checked on the logits a forward pass returns (CPU runs bf16 matmuls), with ``param_dtype: bf16`` and fp32.
World size 1: tests/unit/train/test_precision.py.

The ranks run this file as a script (``python test_precision_ranks.py OUT``, :func:`tests.support.ranks.launch_ranks`);
rank 0 writes every rank's observations to ``OUT/result.json``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.ranks import launch_ranks

pytestmark = pytest.mark.slow

ARCH = dict(layers=2, hidden=32, heads=4, seq_len=16, vocab=64, mlp="swiglu", tie_embeddings=False)
LAYOUTS = {
    "ddp": {},
    "fsdp": {"zero_stage": 3},
    "tp": {"zero_stage": 3, "tp": 2},
    "pp": {"pp": 2, "schedule": "gpipe"},
}


# -- the ranks' side ------------------------------------------------------------------------------
def observe(overrides: dict, dtype: str, world: int) -> dict:
    import torch

    from clustertrain.core.parallel_layout import resolve_layout
    from clustertrain.train.config import ArchConfig, ParallelismConfig
    from clustertrain.train.parallel import build_parallel_model

    arch = ArchConfig(**ARCH)
    layout = resolve_layout(ParallelismConfig(param_dtype=dtype, **overrides), world, on_gpu=False)
    pm = build_parallel_model(arch, arch.vocab, layout, torch.device("cpu"), seed=3, microbatches=2)
    seen: list[str] = []
    if pm.model.head is not None:  # the output layer, whose output is the logits (a pipeline: on its last stage)
        pm.model.head.register_forward_hook(lambda module, args, out: seen.append(str(out.dtype).removeprefix("torch.")))
    batch = torch.randint(0, arch.vocab, (4, arch.seq_len + 1), generator=torch.Generator().manual_seed(0))
    loss = pm.forward_backward_step([(batch[:2, :-1], batch[:2, 1:]), (batch[2:, :-1], batch[2:, 1:])], 0.5)
    assert torch.isfinite(loss)
    return {"logits": sorted(set(seen)), "params": sorted({str(p.dtype).removeprefix("torch.") for p in pm.model.parameters()}),
            "precision": {"params": pm.precision.params, "compute": pm.precision.compute, "reduce": pm.precision.reduce,
                          "how": pm.precision.how}}


def worker(out: Path) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = {f"{name}-{dtype}": observe(overrides, dtype, world) for name, overrides in LAYOUTS.items()
            for dtype in ("bf16", "fp32")}
    ranks: list[dict | None] = [None] * world
    dist.all_gather_object(ranks, mine)
    if rank == 0:
        (out / "result.json").write_text(json.dumps(ranks))
    dist.barrier()
    dist.destroy_process_group()


# -- the test's side ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def result(tmp_path_factory) -> list[dict]:
    return launch_ranks(__file__, tmp_path_factory.mktemp("precision"), 2, timeout=600)


NAMES = {"bf16": "bfloat16", "fp32": "float32"}


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_two_ranks_compute_in_the_dtype_they_report(result, name, dtype):
    ranks = [r[f"{name}-{dtype}"] for r in result]
    logits = [seen for r in ranks for seen in r["logits"]]
    assert logits, "no rank saw the logits"          # the pipeline: only the last stage produces them
    for r in ranks:
        p = r["precision"]
        assert p["compute"] == dtype                    # what was configured ...
        assert set(r["logits"]) <= {NAMES[p["compute"]]}  # ... is what the forward computed in
        assert r["params"] == [NAMES[p["params"]]] == ["float32"]   # fp32 master weights in every layout
        assert p["how"] == ("fsdp2" if name in ("fsdp", "tp") else "autocast" if dtype == "bf16" else "none")
        # reduced over dp: FSDP2 in reduce_dtype, DDP's fp32 gradients; dp 1 (tp 2, pp 2) reduces nothing
        assert p["reduce"] == {"ddp": "fp32", "fsdp": "fp32", "tp": "fp32", "pp": None}[name]


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
