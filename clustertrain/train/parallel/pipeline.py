"""Pipeline parallelism (``parallelism.pp > 1``) with ``torch.distributed.pipelining``: the model's layers split
into ``pp x virtual_stages`` stages (:func:`clustertrain.core.parallel_layout.stage_layers`), each rank of pipeline rank
``r`` holding stages ``r, r + pp, ...``; a step's gradient-accumulation micro-batches are the schedule's
micro-batches (``gpipe``, ``1f1b`` or ``interleaved_1f1b``).

The stages of one rank are views (:meth:`clustertrain.train.model.GPT.view`) of one ``GPT`` that holds just their
blocks (and the embeddings on the first stage, the final norm and output layer on the last), so the optimizer
and the checkpoint see one module whose parameter names are the whole model's (``blocks.17.attn.wq.weight``):
DCP saves each stage's tensors under the same keys as a model without pipeline parallelism, and any layout
loads them. Tensor parallelism, recomputation, compile and FSDP2 / DDP (over the ``dp`` mesh dimension) apply
to each stage as they do to the whole model (the stage, torch's ``PipelineStage``, drives FSDP2's gradient
reduce-scatter on the last micro-batch), except DDP: a replicated stage averages its gradients over ``dp`` after
the schedule (:func:`clustertrain.train.parallel.data_parallel.allreduce_gradients`).

What the loop sees is :class:`~clustertrain.train.parallel.ParallelModel`'s: one ``forward_backward_step``
for a step's micro-batches, returning the summed (scaled) loss on every rank (the last stage's, summed over
the pipeline group, the other stages adding 0), and a gradient norm over all stages (their squared norms
summed over the pipeline group).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from clustertrain.train.config import ArchConfig
from clustertrain.core.parallel_layout import ParallelLayout, stage_costs, stage_layers
from clustertrain.train.model import GPT, loss_fn

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved_1f1b": ScheduleInterleaved1F1B}


def rank_layers(arch: ArchConfig, vocab: int, layout: ParallelLayout, rank: int) -> tuple[list[range], list[int]]:
    """(the blocks of every stage, the stages ``rank`` holds): the split the planner plans with."""
    split = stage_layers(arch.layers, layout.stages, stage_costs(arch, vocab))
    return split, layout.rank_stages(rank)


def build_stage_model(arch: ArchConfig, vocab: int, layout: ParallelLayout, rank: int) -> tuple[GPT, list[GPT], list[int]]:
    """On the meta device: the rank's holder model (its blocks, embeddings when it holds the first stage, output
    layer when it holds the last), the stage views of it in schedule order, and their global stage indices."""
    split, stages = rank_layers(arch, vocab, layout, rank)
    layers = [i for s in stages for i in split[s]]
    last = layout.stages - 1
    with torch.device("meta"):
        holder = GPT(arch, vocab, layers=layers, first=0 in stages, last=last in stages)
    views = [holder.view(split[s], first=s == 0, last=s == last) for s in stages]
    return holder, views, stages


class Pipeline:
    """The rank's ``PipelineStage`` objects and the schedule that runs a step's micro-batches through them."""

    def __init__(self, model: GPT, modules: list[torch.nn.Module], stages: list[int], layout: ParallelLayout, pp_group,
                 device: torch.device, microbatches: int, replicas=None):
        self.layout = layout
        self.model = model
        self.pp_group = pp_group
        self.replicas = replicas  # zero_stage 0 and dp > 1: the data-parallel group the stage's gradients average over
        self.first = 0 in stages
        self.last = layout.stages - 1 in stages
        self.scale = 1.0
        self.stages = [PipelineStage(m, s, layout.stages, device, group=pp_group) for m, s in zip(modules, stages)]
        kind = SCHEDULES[layout.schedule]

        def scaled_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return loss_fn(logits, targets) * self.scale

        # scale_grads=False: the loss is already scaled by 1 / micro-batches (and the NaN injection's scale)
        if layout.schedule == "interleaved_1f1b":
            self.schedule = kind(self.stages, n_microbatches=microbatches, loss_fn=scaled_loss, scale_grads=False)
        else:
            self.schedule = kind(self.stages[0], n_microbatches=microbatches, loss_fn=scaled_loss, scale_grads=False)

    def step(self, x: torch.Tensor, y: torch.Tensor, scale: float, context: Callable) -> torch.Tensor:
        """Forward and backward of every micro-batch (``x``, ``y``: the step's micro-batches concatenated); the
        sum of their scaled losses, the same value on every rank of the pipeline group."""
        self.scale = scale
        losses: list[torch.Tensor] = []
        args = (x,) if self.first else ()
        with context():
            self.schedule.step(*args, target=y if self.last else None, losses=losses if self.last else None,
                               return_outputs=False)
        if self.replicas is not None:
            from clustertrain.train.parallel.data_parallel import allreduce_gradients

            allreduce_gradients(list(self.model.parameters()), self.replicas)
        total = torch.zeros((), device=x.device)
        for loss in losses:
            loss = loss.detach()
            total += loss.to_local() if hasattr(loss, "to_local") else loss
        dist.all_reduce(total, group=self.pp_group)  # the last stage's sum; the other stages add 0
        return total
