"""Build a model for a :class:`~clustertrain.train.layout.ParallelLayout`: the device mesh, then each
parallelism in torchtitan's order — tensor parallelism, activation checkpointing, compile, data
parallelism (FSDP2 or DDP) — on the meta device, then materialise and initialise the local shards.

:class:`ParallelModel` is what the training loop sees: ``forward_backward`` for one micro-batch,
``clip_grad_norm_``, and the unwrapped ``model`` for the optimizer and checkpoints. The loop does
not know which parallelisms are on. Each parallelism is one small module here (``tensor``,
``data_parallel``, ``recompute``, ``compile``, ``grads``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from clustertrain.train.config import ArchConfig
from clustertrain.train.layout import ParallelLayout
from clustertrain.train.model import GPT, loss_fn
from clustertrain.train.parallel.grads import clip_grad_norm_


@dataclass
class ParallelModel:
    model: GPT                              # the (sharded) model: parameters, optimizer, checkpoints
    module: nn.Module                       # what forward is called on (DDP's wrapper or the model)
    layout: ParallelLayout
    mesh: object | None = None              # DeviceMesh with dims ("dp", "tp"), None on one process
    loss_parallel: bool = False
    autocast: Callable[[], AbstractContextManager] = field(default=nullcontext)

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, scale: float, sync: bool = True,
                         timed_forward: Callable[[], AbstractContextManager] = nullcontext) -> torch.Tensor:
        """Loss of one micro-batch times ``scale``, backpropagated; returns it detached as a plain tensor.
        ``sync=False``: DDP skips its gradient all-reduce (every micro-batch but the last). ``timed_forward``
        wraps the forward pass (per-rank step timing)."""
        no_sync = getattr(self.module, "no_sync", None)
        with nullcontext() if sync or no_sync is None else no_sync(), self._loss_context():
            with self.autocast(), timed_forward():
                loss = loss_fn(self.module(x), y) * scale
            loss.backward()
        loss = loss.detach()
        return loss.to_local() if hasattr(loss, "to_local") else loss

    def _loss_context(self) -> AbstractContextManager:
        if not self.loss_parallel:
            return nullcontext()
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        return clip_grad_norm_(self.model.parameters(), max_norm)

    def train(self) -> None:
        self.module.train()


def build_mesh(layout: ParallelLayout, device: torch.device):
    """The ("dp", "tp") device mesh of an initialised process group; None on a single process."""
    if not dist.is_initialized():
        return None
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (layout.dp, layout.tp), mesh_dim_names=("dp", "tp"))


def build_parallel_model(arch: ArchConfig, vocab: int, layout: ParallelLayout, device: torch.device,
                         seed: int) -> ParallelModel:
    """The GPT of ``arch`` sharded by ``layout`` on ``device``; never materialised whole on one rank
    under FSDP/TP (built on the meta device, each rank initialises only its shards). With
    ``layout.compile``, call :func:`~clustertrain.train.parallel.compile.check_compiler` first."""
    from clustertrain.train.parallel.compile import apply_compile
    from clustertrain.train.parallel.recompute import apply_recompute

    mesh = build_mesh(layout, device)
    with torch.device("meta"):
        model = GPT(arch, vocab)
    if layout.tp > 1:
        from clustertrain.train.parallel.tensor import apply_tensor_parallel

        apply_tensor_parallel(model, mesh["tp"], layout.sequence_parallel)
    apply_recompute(model, layout.recompute)
    if layout.compile:
        apply_compile(model)
    if layout.fsdp and mesh is not None:
        from clustertrain.train.parallel.data_parallel import apply_fsdp

        apply_fsdp(model, mesh["dp"], layout)
    model.to_empty(device=device)
    model.tie_weights()
    model.init_weights(seed)
    module: nn.Module = model
    autocast: Callable[[], AbstractContextManager] = nullcontext
    if not layout.fsdp:
        if mesh is not None:
            from clustertrain.train.parallel.data_parallel import apply_ddp

            module = apply_ddp(model, device)
        if layout.param_dtype == "bf16":  # fp32 weights, bf16 compute (FSDP2 casts with its MixedPrecisionPolicy instead)
            def autocast() -> AbstractContextManager:
                return torch.autocast(device.type, dtype=torch.bfloat16)
    return ParallelModel(model=model, module=module, layout=layout, mesh=mesh, loss_parallel=layout.tp > 1,
                         autocast=autocast)
