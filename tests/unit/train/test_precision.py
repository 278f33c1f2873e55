"""Honest precision on one process (no process group, so no device mesh and no FSDP2): every layout computes in the
dtype its :class:`~clustertrain.train.parallel.Precision` reports — the dtype of the logits a forward pass returns,
on CPU, which runs bf16 matmuls. Before, a one-rank ``zero_stage: 3`` run had neither FSDP2's mixed precision nor
autocast, computed fp32 logits and its start line said ``bf16 params``. The same check on two gloo ranks:
tests/integration/train/test_precision_ranks.py."""

from __future__ import annotations

import pytest
import torch

from clustertrain.core.parallel_layout import resolve_layout
from clustertrain.train.config import ArchConfig, ParallelismConfig
from clustertrain.train.parallel import build_parallel_model

ARCH = ArchConfig(layers=2, hidden=32, heads=4, seq_len=16, mlp="swiglu")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def logits_dtype(pm) -> torch.dtype:
    seen: list[torch.dtype] = []
    handle = pm.module.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    batch = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(0))
    loss = pm.forward_backward(batch[:, :-1], batch[:, 1:], 1.0)
    handle.remove()
    assert torch.isfinite(loss) and len(seen) == 1
    return seen[0]


@pytest.mark.parametrize("zero_stage", [0, 3])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_one_rank_computes_in_the_dtype_it_reports(zero_stage, dtype):
    layout = resolve_layout(ParallelismConfig(zero_stage=zero_stage, param_dtype=dtype), 1, on_gpu=False)
    pm = build_parallel_model(ARCH, 64, layout, torch.device("cpu"), seed=1)
    assert pm.precision.compute == dtype                      # what the configuration asked for ...
    assert logits_dtype(pm) == DTYPES[pm.precision.compute]   # ... is what the forward computed in
    assert {p.dtype for p in pm.model.parameters()} == {DTYPES[pm.precision.params]} == {torch.float32}
    assert pm.precision.reduce is None                        # one process: nothing is reduced over dp
    assert pm.precision.how == ("autocast" if dtype == "bf16" else "none")
    assert pm.precision.describe() == f"params fp32 / compute {dtype} / no reduce"


def test_the_start_line_names_the_dtypes_used_not_the_configured_ones():
    layout = resolve_layout(ParallelismConfig(zero_stage=3, param_dtype="bf16"), 1, on_gpu=False)
    pm = build_parallel_model(ARCH, 64, layout, torch.device("cpu"), seed=1)
    assert layout.describe() == "fsdp 1, bf16 params / fp32 reduce"   # the plan's wording: the configured layout
    assert f"{layout.describe(dtypes=False)}, {pm.precision.describe()}" == "fsdp 1, params fp32 / compute bf16 / no reduce"
