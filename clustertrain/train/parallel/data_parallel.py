"""The data-parallel dimension: DDP (``zero_stage: 0``) or FSDP2 full sharding (``zero_stage: 3``).

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

from clustertrain.train.layout import ParallelLayout
from clustertrain.train.model import GPT

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def apply_fsdp(model: GPT, dp_mesh: DeviceMesh, layout: ParallelLayout) -> None:
    mp = MixedPrecisionPolicy(param_dtype=DTYPES[layout.param_dtype], reduce_dtype=DTYPES[layout.reduce_dtype])
    last = len(model.blocks) - 1
    for i, block in enumerate(model.blocks):
        # the last block's parameters are needed again at once by backward: keeping them saves an all-gather
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=layout.reshard_after_forward and i < last)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=layout.reshard_after_forward)


def apply_ddp(model: nn.Module, device: torch.device) -> nn.Module:
    kwargs = {"device_ids": [device.index]} if device.type == "cuda" else {}
    return DistributedDataParallel(model, **kwargs)
