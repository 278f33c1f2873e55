"""The data-parallel dimension: DDP (``zero_stage: 0``) or FSDP2 full sharding (``zero_stage: 3``). A replicated
pipeline stage reduces its gradients with :func:`allreduce_gradients` after the schedule instead of DDP.

FSDP2 (``fully_shard``) wraps each block, then the root (embeddings, final norm and output layer),
so one block's parameters are gathered at a time; with ``param_dtype: bf16`` the sharded fp32
parameters stay the optimizer's master weights and blocks compute on gathered bf16 copies
(``MixedPrecisionPolicy``), gradients reduce-scattered in ``reduce_dtype``. On a 2-D mesh the
tensor-parallel DTensors are sharded again over ``dp`` (FSDP × TP).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from clustertrain.core.parallel_layout import ParallelLayout
from clustertrain.train.model import GPT

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def apply_fsdp(model: GPT, dp_mesh: DeviceMesh, layout: ParallelLayout) -> None:
    mp = MixedPrecisionPolicy(param_dtype=DTYPES[layout.param_dtype], reduce_dtype=DTYPES[layout.reduce_dtype])
    blocks = list(model.blocks.values())
    last = len(blocks) - 1
    for i, block in enumerate(blocks):
        # the last block's parameters are needed again at once by backward: keeping them saves an all-gather
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=layout.reshard_after_forward and i < last)
    # the root (embeddings, final norm, output layer): None lets FSDP2 keep it gathered from forward to backward (it
    # is needed again at once: torch/distributed/fsdp/_fully_shard/_fsdp_state.py ``_lazy_init``, "For the root, do not
    # reshard after forward"); an explicit True would free and re-gather it every micro-batch
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=None if layout.reshard_after_forward else False)


def set_fsdp_sync(model: nn.Module, sync: bool) -> None:
    """Before a micro-batch of a ``grad_sync: per_step`` FSDP2 model: ``sync=False`` (every micro-batch but the last)
    keeps its gradients unsharded and unreduced (accumulated in ``reduce_dtype``) and its blocks gathered after
    backward; ``sync=True`` (the last) reduce-scatters the accumulated gradients and reshards, once per block. The
    three switches torch's ``PipelineStage`` sets around a pipelined FSDP2 stage's backwards
    (``torch/distributed/pipelining/stage.py``: ``backward_maybe_with_nosync`` and ``perform_reduce_grad``; torch
    2.13's ``FSDPModule.set_requires_gradient_sync`` / ``set_reshard_after_backward`` recurse into every FSDP2 module,
    ``set_is_last_backward`` is the root's and keeps the backward-prefetch order until the step's last backward)."""
    from torch.distributed.fsdp import FSDPModule

    assert isinstance(model, FSDPModule), "grad_sync per_step: the FSDP2 root"
    model.set_is_last_backward(sync)
    model.set_reshard_after_backward(sync)
    model.set_requires_gradient_sync(sync)


def apply_ddp(model: nn.Module, device: torch.device, group=None) -> nn.Module:
    """DDP over ``group`` (the data-parallel ranks; None: all ranks)."""
    kwargs = {"device_ids": [device.index]} if device.type == "cuda" else {}
    return DistributedDataParallel(model, process_group=group, **kwargs)


#: bytes per all-reduce of :func:`allreduce_gradients` (DDP's default bucket_cap_mb)
BUCKET_BYTES = 25 * 2**20


def allreduce_gradients(params: list[torch.Tensor], group) -> None:
    """Average the gradients of ``params`` over ``group`` in buckets of :data:`BUCKET_BYTES` — DDP's reduction, for
    a replicated pipeline stage. DDP itself cannot wrap one: its reducer expects one forward per backward and
    asserts (torch 2.13, ``rebuilt parameter indices``) under gpipe and interleaved schedules, which run several
    micro-batches' forwards before their backwards. Called once per step, after the schedule."""
    import torch.distributed as dist
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    grads = [p.grad for p in params if p.grad is not None]
    size = dist.get_world_size(group)
    bucket: list[torch.Tensor] = []
    filled = 0

    def flush() -> None:
        flat = _flatten_dense_tensors(bucket)
        dist.all_reduce(flat, group=group)
        flat.div_(size)
        for grad, reduced in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
            grad.copy_(reduced)

    for grad in grads:
        bucket.append(grad)
        filled += grad.numel() * grad.element_size()
        if filled >= BUCKET_BYTES:
            flush()
            bucket, filled = [], 0
    if bucket:
        flush()
