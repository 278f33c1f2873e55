"""The parallel model on one process (no process group): recomputation and torch.compile change no loss."""

from __future__ import annotations

import pytest
import torch

from clustertrain.train.config import ArchConfig, ParallelismConfig
from clustertrain.core.parallel_layout import resolve_layout
from clustertrain.train.parallel import build_parallel_model

ARCH = ArchConfig(layers=2, hidden=32, heads=4, seq_len=16, mlp="swiglu")


def losses(**par) -> list[float]:
    layout = resolve_layout(ParallelismConfig(**par), 1, on_gpu=False)
    pm = build_parallel_model(ARCH, 64, layout, torch.device("cpu"), seed=1)
    opt = torch.optim.AdamW(pm.model.parameters(), lr=1e-2)
    data = torch.randint(0, 64, (4, 4, 17), generator=torch.Generator().manual_seed(0))
    out = []
    for batch in data:
        out.append(float(pm.forward_backward(batch[:, :-1], batch[:, 1:], 1.0)))
        pm.clip_grad_norm_(1.0)
        opt.step()
        opt.zero_grad()
    return out


def test_recompute_is_exact_on_one_process():
    base = losses()
    assert losses(recompute="full") == base and losses(recompute="selective") == base


@pytest.mark.slow
def test_compile_trains_the_eager_losses():
    """Compiled kernels fuse and reorder float operations: equal to 1e-5, not bit for bit."""
    assert losses(compile=True, recompute="full") == pytest.approx(losses(), rel=1e-5)
