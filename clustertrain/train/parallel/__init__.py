"""Build a model for a :class:`~clustertrain.core.parallel_layout.ParallelLayout`: the device mesh, then each
parallelism in torchtitan's order — tensor parallelism, activation checkpointing, compile, data
parallelism (FSDP2 or DDP) — on the meta device, then materialise and initialise the local shards; with
pipeline parallelism, the rank's stages first (``pipeline``), each stage then treated as a model.

:class:`ParallelModel` is what the training loop sees: ``forward_backward_step`` for a step's micro-batches,
``clip_grad_norm_``, the unwrapped ``model`` for the optimizer and checkpoints, and the :class:`Precision` it
computes in. The loop does not know which parallelisms are on. Each parallelism is one small module here (``tensor``,
``data_parallel``, ``recompute``, ``compile``, ``grads``, ``pipeline``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from clustertrain.train.config import ArchConfig
from clustertrain.core.parallel_layout import ParallelLayout
from clustertrain.train.model import GPT, loss_fn
from clustertrain.train.parallel.grads import clip_grad_norm_

if TYPE_CHECKING:
    from clustertrain.train.parallel.pipeline import Pipeline


@dataclass(frozen=True)
class Precision:
    """The dtypes a built model uses, decided by what was applied to it (not by the configured ``param_dtype``
    alone): ``params`` of the stored parameters (the optimizer's master weights), ``compute`` of the forward and
    backward (FSDP2's gathered copies under its ``MixedPrecisionPolicy``, or bf16 autocast where FSDP2 was not
    applied), ``reduce`` of the data-parallel gradient reduction (None: nothing is reduced over dp — one process
    without a data-parallel wrapper). ``how``: ``fsdp2`` | ``autocast`` | ``none``."""

    params: str
    compute: str
    reduce: str | None
    how: str

    def describe(self) -> str:
        """``params fp32 / compute bf16 / reduce fp32`` (the trainer's start line)."""
        return f"params {self.params} / compute {self.compute} / " + (
            f"reduce {self.reduce}" if self.reduce else "no reduce")


def _no_part(name: str) -> AbstractContextManager:
    return nullcontext()


@dataclass
class ParallelModel:
    model: GPT                              # the rank's (sharded) model or pipeline stages: optimizer, checkpoints
    module: nn.Module                       # what forward is called on (DDP's wrapper or the model; pp: unused)
    layout: ParallelLayout
    mesh: object | None = None              # DeviceMesh with dims ("dp", "tp") (pp > 1: ("pp", "dp", "tp")); None alone
    loss_parallel: bool = False
    autocast: Callable[[], AbstractContextManager] = field(default=nullcontext)
    precision: Precision = Precision("fp32", "fp32", None, "none")
    pipeline: Pipeline | None = None        # pp > 1: the rank's stages and the schedule
    total_params: int = 0                   # of the whole (unsharded, unsplit) model
    non_embedding_params: int = 0

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, scale: float, sync: bool = True,
                         part: Callable[[str], AbstractContextManager] = _no_part) -> torch.Tensor:
        """Loss of one micro-batch times ``scale``, backpropagated; returns it detached as a plain tensor.
        ``sync=False`` (every micro-batch but the last): DDP skips its gradient all-reduce, and FSDP2 with
        ``grad_sync: per_step`` its reduce-scatter (:func:`~clustertrain.train.parallel.data_parallel.set_fsdp_sync`);
        FSDP2 with ``per_microbatch`` reduce-scatters after every micro-batch whatever ``sync`` says. ``part(name)``
        wraps the forward pass (``"forward"``) and the backward (``"backward"``): the trainer's timing and heartbeat
        phase. Not for pipelined models (:meth:`forward_backward_step`)."""
        assert self.pipeline is None, "a pipelined model runs a whole step's micro-batches: forward_backward_step"
        if self.fsdp_applied and self.layout.grad_sync == "per_step":
            from clustertrain.train.parallel.data_parallel import set_fsdp_sync

            set_fsdp_sync(self.module, sync)
        no_sync = getattr(self.module, "no_sync", None)
        with nullcontext() if sync or no_sync is None else no_sync(), self._loss_context():
            with part("forward"), self.autocast():
                loss = loss_fn(self.module(x), y) * scale
            with part("backward"):
                loss.backward()
        loss = loss.detach()
        return loss.to_local() if hasattr(loss, "to_local") else loss

    def forward_backward_step(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], scale: float,
                              part: Callable[[str], AbstractContextManager] = _no_part) -> torch.Tensor:
        """Forward and backward of a step's micro-batches (``(x, y)`` pairs, each loss times ``scale``); the sum of
        their losses, on every rank. Without a pipeline: one micro-batch at a time, ``batches[i]`` taken just before
        its turn (a lazy sequence reads each there, as ``part("data")``), ``part("forward")`` and
        ``part("backward")`` around its forward and backward, the gradient reduction on the last. Pipelined: the
        schedule runs them all, under ``part("forward")`` (forward and backward interleave in it)."""
        if self.pipeline is not None:
            pairs = [batches[i] for i in range(len(batches))]
            x = torch.cat([b[0] for b in pairs])
            y = torch.cat([b[1] for b in pairs])

            @contextmanager
            def context() -> Iterator[None]:
                with self._loss_context(), self.autocast():
                    yield

            with part("forward"):
                return self.pipeline.step(x, y, scale, context)
        total: torch.Tensor | None = None
        for i in range(len(batches)):
            x, y = batches[i]
            loss = self.forward_backward(x, y, scale, sync=i == len(batches) - 1, part=part)
            total = loss if total is None else total + loss
        assert total is not None, "a step has at least one micro-batch"
        return total

    @property
    def fsdp_applied(self) -> bool:
        """Whether FSDP2 wraps the model (``zero_stage: 3`` on a process group; not at world size 1)."""
        from torch.distributed.fsdp import FSDPModule

        return isinstance(self.module, FSDPModule)

    def _loss_context(self) -> AbstractContextManager:
        if not self.loss_parallel:
            return nullcontext()
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip to ``max_norm`` over every parameter of the model (all pipeline stages); return the global norm."""
        group = self.pipeline.pp_group if self.pipeline is not None else None
        return clip_grad_norm_(self.model.parameters(), max_norm, group)

    def train(self) -> None:
        self.module.train()


def build_mesh(layout: ParallelLayout, device: torch.device):
    """The device mesh of an initialised process group: ("dp", "tp"), or ("pp", "dp", "tp") with pipeline
    parallelism (rank order: :mod:`clustertrain.core.parallel_layout`); None on a single process."""
    if not dist.is_initialized():
        return None
    from torch.distributed.device_mesh import init_device_mesh

    if layout.pp > 1:
        return init_device_mesh(device.type, (layout.pp, layout.dp, layout.tp), mesh_dim_names=("pp", "dp", "tp"))
    return init_device_mesh(device.type, (layout.dp, layout.tp), mesh_dim_names=("dp", "tp"))


def build_parallel_model(arch: ArchConfig, vocab: int, layout: ParallelLayout, device: torch.device,
                         seed: int, microbatches: int = 1) -> ParallelModel:
    """The GPT of ``arch`` sharded by ``layout`` on ``device``; never materialised whole on one rank
    under FSDP/TP/PP (built on the meta device, each rank initialises only its shards). ``microbatches``:
    per step, what a pipeline schedule runs. With ``layout.compile``, call
    :func:`~clustertrain.train.parallel.compile.check_compiler` first."""
    from clustertrain.train.parallel.compile import apply_compile
    from clustertrain.train.parallel.recompute import apply_recompute

    mesh = build_mesh(layout, device)
    with torch.device("meta"):
        whole = GPT(arch, vocab)
    counts = {"total_params": whole.num_params(), "non_embedding_params": whole.num_params(non_embedding=True)}
    if layout.pp > 1:
        from clustertrain.train.parallel.pipeline import build_stage_model

        model, parts, stages = build_stage_model(arch, vocab, layout, dist.get_rank())
    else:
        model, parts, stages = whole, [whole], [0]
    if layout.tp > 1:
        from clustertrain.train.parallel.tensor import apply_tensor_parallel

        for part in parts:
            apply_tensor_parallel(part, mesh["tp"], layout.sequence_parallel)
    apply_recompute(model, layout.recompute)
    if layout.compile:
        apply_compile(model)
    # FSDP2 needs a device mesh, which needs a process group: one process (world size 1) has neither, and nothing to
    # shard; its zero_stage 3 then runs unwrapped, and computes in param_dtype through autocast like DDP does
    fsdp = layout.fsdp and mesh is not None
    if fsdp:
        from clustertrain.train.parallel.data_parallel import apply_fsdp

        for part in parts:
            apply_fsdp(part, mesh["dp"], layout)
    for part in parts:  # each module belongs to one stage: materialise them stage by stage (FSDP2's roots)
        part.to_empty(device=device)
    model.tie_weights()
    model.init_weights(seed)
    modules: list[nn.Module] = list(parts)
    autocast: Callable[[], AbstractContextManager] = nullcontext
    params = _dtype_name(next(model.parameters()).dtype)
    reduce: str | None = layout.reduce_dtype if fsdp else None
    precision = Precision(params, layout.param_dtype if fsdp else params, reduce, "fsdp2" if fsdp else "none")
    if not fsdp:
        if mesh is not None and layout.dp > 1:  # DDP, or (pp > 1) the pipeline's own all-reduce: of the fp32 gradients
            reduce = params
            if layout.pp == 1:
                from clustertrain.train.parallel.data_parallel import apply_ddp

                modules = [apply_ddp(part, device, mesh["dp"].get_group())]
        precision = Precision(params, params, reduce, "none")
        if layout.param_dtype == "bf16":  # fp32 weights, bf16 compute (FSDP2 casts with its MixedPrecisionPolicy instead)
            def autocast() -> AbstractContextManager:
                return torch.autocast(device.type, dtype=torch.bfloat16)

            precision = Precision(params, "bf16", reduce, "autocast")
    pipeline = None
    if layout.pp > 1:
        from clustertrain.train.parallel.pipeline import Pipeline

        replicas = mesh["dp"].get_group() if not layout.fsdp and layout.dp > 1 else None
        pipeline = Pipeline(model, modules, stages, layout, mesh["pp"].get_group(), device, microbatches, replicas)
    return ParallelModel(model=model, module=modules[0] if pipeline is None else model, layout=layout, mesh=mesh,
                         loss_parallel=layout.tp > 1, autocast=autocast, precision=precision, pipeline=pipeline, **counts)


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float32: "fp32"}.get(dtype, str(dtype).removeprefix("torch."))
