"""What the built-in trainer's data-parallel collectives move across the network per step, next to the compute
they should hide behind: the planner's evidence for ``reshard_after_forward`` and for pipeline stages.

Notation: P the tp-local parameter elements of a rank's stages (the most loaded pipeline rank's; the whole
model's / tp without pipelining), m micro-batches per step and data-parallel rank, d = dp, e_p / e_r bytes of the
compute dtype (``param_dtype``) and of ``reduce_dtype``.

Collectives per step (what the trainer's FSDP2 and DDP do; :mod:`clustertrain.train.parallel`):

* FSDP2 without pipelining, ``grad_sync: per_microbatch`` — every micro-batch gathers every block in forward
  (e_p P), again in backward when ``reshard_after_forward: true`` (the root and each stage's last block stay
  gathered: not them), and reduce-scatters the gradients (e_r P): m times per step;
* FSDP2 with ``grad_sync: per_step``, and FSDP2 with pipeline stages (torch's ``PipelineStage`` always does this) —
  the gradient reduce-scatter is off until the step's last micro-batch and the blocks stay gathered after each
  backward: one reduce-scatter per step, one all-gather with ``reshard_after_forward: false``, and with ``true`` one
  more for each of the m backwards that follow a forward (m + 1 gathers of the blocks each forward reshards; under
  pipeline stages ``reshard_after_forward`` is always false: one);
* DDP — one all-reduce of the fp32 gradients per step (``no_sync`` until the last micro-batch): 2 x 4 P.

Across the network: a data-parallel group of d ranks has g = min(d, GPUs per node / tp) of them on each node
(ranks are tp-innermost, :mod:`clustertrain.core.parallel_layout`), so a node hosts GPUs-per-node / g groups. Each
collective brings into a node the group's tensor less the node's own shards, (d - g) / d of it (a ring or tree
crossing each node boundary once per chunk): node bytes = groups per node x (d - g) / d x the bytes above. At the
node's network bandwidth (``network_gbps`` of the catalog, EFA on p4/p5) that takes ``seconds``; with d <= g the
group never leaves its node (NVLink) and there is no network time. These are transfer volumes at line rate, not a
simulation: they say whether the collectives can hide behind the compute of the step (the planner's step time
assumes they do).
"""

from __future__ import annotations

from dataclasses import dataclass

from clustertrain.plan.memory import DTYPE_BYTES, GRAD_BYTES, _held_numel, _local_numel, rank_parts
from clustertrain.core.model_shape import ModelShape
from clustertrain.core.parallel_layout import ParallelLayout


@dataclass(frozen=True)
class Traffic:
    """A step's data-parallel collectives of one model (module docstring)."""

    kind: str                 # fsdp | ddp
    params: int               # P: the tp-local parameter elements a rank's collectives move (most loaded pipeline rank)
    gathers: float            # all-gathers of P (in param_dtype) per step; fractional: the kept blocks are not re-gathered
    reduces: int              # reduce-scatters (fsdp, in reduce_dtype) or all-reduces (ddp, fp32) of P per step
    group_bytes: int          # what one data-parallel group's collectives carry per step (before the (d - g) / d share)
    node_bytes: int           # bytes into each node across the network per step; 0 when a group stays on its node
    seconds: float | None     # node_bytes at the node's network bandwidth; None when unknown or no network is crossed


def data_parallel_traffic(shape: ModelShape, layout: ParallelLayout, m: int, gpus_per_node: int,
                          network_gbps: float | None) -> Traffic | None:
    """The data-parallel traffic of one step (``m`` micro-batches per data-parallel rank); None with dp 1."""
    d = layout.dp
    if d == 1:
        return None
    tp_layout = ParallelLayout(world=layout.tp, dp=1, tp=layout.tp)   # the unsharded (tp-local) tensors
    held = [rank_parts(shape, layout, r * d * layout.tp) for r in range(layout.pp)]
    params, parts = max(((_held_numel(shape, p, tp_layout), p) for p in held), key=lambda x: x[0])
    if layout.fsdp:
        kept = (len(parts.stages) * _local_numel(shape, "block", tp_layout)
                + (params - parts.layers * _local_numel(shape, "block", tp_layout)))  # last blocks + roots
        again = params - kept if layout.reshard_after_forward else 0   # elements gathered again for each backward
        if layout.grad_sync == "per_microbatch":   # pp 1 (ParallelLayout: pipelined layouts are per_step)
            gathered, reduces = m * (params + again), m
        else:
            gathered, reduces = params + m * again, 1
        gathers = gathered / params
        # in whole elements: a fractional ``gathers`` times P may round below the bytes the ranks move
        group = DTYPE_BYTES[layout.param_dtype] * gathered + DTYPE_BYTES[layout.reduce_dtype] * params * reduces
        kind = "fsdp"
    else:
        gathers, reduces = 0.0, 1
        group = 2 * GRAD_BYTES * params
        kind = "ddp"
    g = min(d, max(1, gpus_per_node // layout.tp))
    node = int(gpus_per_node // g * group * (d - g) / d)
    seconds = node / (network_gbps * 1e9 / 8) if network_gbps and node else None
    return Traffic(kind, params, gathers, reduces, int(group), node, seconds)
