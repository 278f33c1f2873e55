"""The trainer's step on one CUDA device (issue 38's GPU test layer; skips without CUDA, run by
``scripts/gpu-check.sh``):

- a one-GPU ``zero_stage: 3`` run computes in bf16 and says so (before issue 38 it computed fp32 and said bf16);
- compile composes with FSDP2 (a one-rank NCCL group gives FSDP2 its mesh, as a one-node-one-GPU job does);
- the step makes no device-to-host sync: ``torch.cuda.set_sync_debug_mode("error")`` raises on any synchronising
  call (torch/cuda/__init__.py ``set_sync_debug_mode``), around the trainer's own step and data path.
"""

from __future__ import annotations

import socket

import pytest
import torch

from clustertrain.core.parallel_layout import resolve_layout
from clustertrain.train.config import ArchConfig, ParallelismConfig, TrainingConfig
from clustertrain.train.optim import NonFiniteSkip, build_optimizer
from clustertrain.train.parallel import build_parallel_model
from clustertrain.train.step import StepParts, train_step
from tests.unit.train.test_feed import Samples

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ARCH = ArchConfig(layers=2, hidden=64, heads=4, seq_len=8, mlp="swiglu")
VOCAB = 4096  # >= the test feed's token ids (row i holds 9i .. 9i+8)
CFG = TrainingConfig(max_steps=8, micro_batch=2, global_batch=4, lr=1e-3, min_lr=1e-4, warmup_steps=1)


def logits_dtype(pm, device) -> torch.dtype:
    seen: list[torch.dtype] = []
    handle = pm.module.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    batch = torch.randint(0, VOCAB, (2, ARCH.seq_len + 1), device=device)
    loss = pm.forward_backward(batch[:, :-1], batch[:, 1:], 1.0)
    handle.remove()
    assert torch.isfinite(loss).item() and len(seen) == 1
    return seen[0]


@pytest.fixture
def one_rank_nccl():
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_one_gpu_zero3_computes_in_bf16():
    device = torch.device("cuda", 0)
    layout = resolve_layout(ParallelismConfig(zero_stage=3, param_dtype="bf16"), 1, on_gpu=True)
    pm = build_parallel_model(ARCH, VOCAB, layout, device, seed=1)
    assert pm.precision.compute == "bf16" and logits_dtype(pm, device) == torch.bfloat16


def test_compile_with_fsdp2_on_one_rank(one_rank_nccl):
    from clustertrain.train.feed import BatchFeed

    device = torch.device("cuda", 0)
    layout = resolve_layout(ParallelismConfig(zero_stage=3, param_dtype="bf16", compile=True), 1, on_gpu=True)
    pm = build_parallel_model(ARCH, VOCAB, layout, device, seed=1)
    assert pm.precision.how == "fsdp2" and logits_dtype(pm, device) == torch.bfloat16
    parts = StepParts(pm, build_optimizer(pm.model, CFG), NonFiniteSkip(device), CFG, norm_part="comm")
    feed = BatchFeed(Samples(), global_batch=4, micro_batch=2, dp_rank=0, accum=2, device=device)
    losses = [float(train_step(parts, s, feed.step_batches(s), 0.5)[0]) for s in range(4)]
    assert all(torch.isfinite(torch.tensor(losses))) and parts.nonfinite.first() is None


def test_the_step_makes_no_device_sync():
    from clustertrain.train.feed import BatchFeed

    device = torch.device("cuda", 0)
    layout = resolve_layout(ParallelismConfig(param_dtype="bf16"), 1, on_gpu=True)
    pm = build_parallel_model(ARCH, VOCAB, layout, device, seed=1)
    parts = StepParts(pm, build_optimizer(pm.model, CFG), NonFiniteSkip(device), CFG)
    feed = BatchFeed(Samples(), global_batch=4, micro_batch=2, dp_rank=0, accum=2, device=device)
    train_step(parts, 0, feed.step_batches(0), 0.5)  # the first step creates AdamW's state
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for s in range(1, 4):
            train_step(parts, s, feed.step_batches(s), 0.5)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    # the check does see a sync: reading the non-finite flag is one
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            parts.nonfinite.first()
    finally:
        torch.cuda.set_sync_debug_mode("default")
