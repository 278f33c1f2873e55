"""Activation checkpointing per block (``parallelism.recompute``): ``full`` keeps only each block's
input and recomputes the block in backward; ``selective`` keeps the projections and recomputes the
attention core (softmax(qkᵀ)v), the part whose activations grow with the sequence (Korthikanti et
al. 2022). Both use ``torch.utils.checkpoint`` (non-reentrant, RNG state preserved, so losses are
identical with and without), switched on inside the model's own modules so parameter names — the
checkpoint keys — do not change."""

from __future__ import annotations

from clustertrain.train.model import GPT


def apply_recompute(model: GPT, mode: str) -> None:
    for block in model.blocks.values():
        block.recompute = mode == "full"
        block.attn.recompute_core = mode == "selective"
