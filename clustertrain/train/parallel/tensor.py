"""Tensor (and sequence) parallelism with DTensor's ``parallelize_module`` (Megatron-LM's split).

Per block: q, k, v and the MLP's gate/up column-wise (each rank holds ``heads / tp`` query heads, ``kv_heads / tp``
whole key/value heads — wk and wv are ``[kv_heads x head_dim, h]``, so a row split is a head split; ``structure_problems``
in :mod:`clustertrain.core.parallel_layout` refuses a tp that does not divide ``kv_heads`` — and ``ffn / tp`` MLP
columns; rank r's query heads ``[r·H/tp, (r+1)·H/tp)`` read exactly its key/value heads ``[r·K/tp, (r+1)·K/tp)``, the
grouping of :class:`clustertrain.train.model.Attention`), the attention output and MLP down projection row-wise (one all-reduce —
or, with sequence parallelism, one reduce-scatter — per sub-layer). The token embedding is split by
vocabulary rows, the output layer by vocabulary columns, and its logits stay sharded into the loss
(loss parallelism: the ``V``-wide logits are never gathered). Norms, dropout and the residual stream
are replicated, or, with ``sequence_parallel``, split along the sequence (``GPT.seq_split`` is where
the embeddings' output is split; norms run on their sequence shard).
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from clustertrain.train.model import GPT


def apply_tensor_parallel(model: GPT, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Shard ``model`` (on the meta device or materialised; the whole model or a pipeline stage) over ``tp_mesh``;
    logits stay vocabulary-sharded. Between blocks, and so between pipeline stages, the residual stream is a plain
    local tensor (``[b, s / tp, h]`` with sequence parallelism)."""
    seq = Shard(1) if sequence_parallel else Replicate()
    top = {}
    if model.first:
        top["tok_emb"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        if sequence_parallel:
            top["seq_split"] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                                  use_local_output=True)
    if model.last:
        top["head"] = ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False)
        if sequence_parallel:
            top["norm_f"] = SequenceParallel()
    if top:
        parallelize_module(model, tp_mesh, top)
    for block in model.blocks.values():
        plan = {
            "attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(), "attn.wv": ColwiseParallel(),
            "attn.wo": RowwiseParallel(output_layouts=seq),
            "mlp.w_up": ColwiseParallel(), "mlp.w_down": RowwiseParallel(output_layouts=seq),
        }
        if hasattr(block.mlp, "w_gate"):
            plan["mlp.w_gate"] = ColwiseParallel()
        if sequence_parallel:
            plan |= {
                "norm1": SequenceParallel(), "norm2": SequenceParallel(),
                "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            }
        parallelize_module(block, tp_mesh, plan)
    model.tie_weights()  # both sides are Shard(0) over tp: the tied tensor is one DTensor again
