"""Memory per GPU (rank) for the trainer's GPT under DP/ZeRO, TP and PP.

Notation: h hidden, f ffn_dim, a heads, s seq_len, b micro_batch, L layers, V vocab,
t = tp, p = pp, d = dp, P = parameters held by the rank, e = bytes per activation element
(2 for bf16, 4 for fp32).

Model states (Rajbhandari et al. 2020, "ZeRO", §3.1 and §5):
  fp32 training:          weights 4P, gradients 4P, AdamW moments (exp_avg, exp_avg_sq) 8P
  bf16, bf16 weights:     weights 2P, gradients 2P, fp32 master weights + moments 12P (2+2+12 = 16 B/param)
  bf16, fp32 weights:     as fp32 (the trainer's autocast today) + a bf16 copy of the weights cached by
                          autocast during the forward pass (2P, counted as a buffer)
  plus 4 bytes per parameter tensor: torch's AdamW keeps a float32 ``step`` tensor per parameter.
  ZeRO-1 divides the optimizer states (incl. master weights) by d, ZeRO-2 also the gradients,
  ZeRO-3 (FSDP full shard) also the weights; ZeRO-3 adds an all-gather buffer of two layers'
  unsharded weights (current + prefetched).
  Without sharding and d > 1, torch DDP copies gradients into its buckets (gradient_as_bucket_view
  is False by default): another gradient-sized buffer.

Division by TP and PP (Shoeybi et al. 2019, Megatron-LM; Narayanan et al. 2021):
  per block, the column-parallel qkv/up weights and biases and the row-parallel proj/down weights
  are divided by t; the row-parallel biases and the norms are replicated; each stage holds L/p blocks.
  The token embedding (vocab-parallel, ceil(V/t)·h) and position embedding (replicated) sit on the
  first stage; the final norm and the head on the last. With tied embeddings and p > 1 the last
  stage keeps its own copy of the word embedding (Megatron does; gradients are all-reduced).
  The estimate is for the stage that needs most.

Activations per block and micro-batch (Korthikanti et al. 2022, "Reducing Activation Recomputation
in Large Transformer Models", §4, Table 2), generalised from their 34·s·b·h + 5·a·s²·b bytes:
  replicated across TP:  norm inputs 2e·sbh + qkv input e·sbh + MLP input e·sbh + dropout masks 2·sbh
                         (= 10·sbh at e = 2 with dropout; masks only when dropout > 0)
  divided by t:          Q, K, V 3e·sbh + proj input e·sbh + MLP k·e·sbf (k = 2 GELU in/out,
                         4 SwiGLU gate/value/silu/product) (= 24·sbh at e = 2, f = 4h, GELU)
  attention core ÷ t:    softmax e·as²b (+ dropout mask as²b + dropout output e·as²b) = 5·as²b;
                         with flash attention only the fp32 log-sum-exp 4·asb
  sequence parallel also divides the replicated part by t. ``selective`` recomputation drops the
  attention core; ``full`` keeps only each block's input e·sbh (÷ t with SP) and needs one block's
  full activations while recomputing it.
  1F1B pipelining: the first stage holds min(p, micro-batches per step) micro-batches of its L/p
  blocks (the paper's "L·p/p = L" observation). Extras: embedding dropout mask sbh per in-flight
  micro-batch (first stage); output layer 2e·sbh + 4·sbV/t (fp32 log-probabilities; last stage).

Framework (CUDA context, NCCL buffers, cuBLAS workspaces): ``plan.framework_gib``, a stated allowance.
The budget is the GPU's memory less ``plan.headroom`` (a fraction kept free).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from clustertrain.plan.shape import ModelShape

GiB = 1024**3


@dataclass(frozen=True)
class Layout:
    """How one model's ranks split the work, and the memory-relevant training settings."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    micro_batch: int = 1
    grad_accum: int = 1               # micro-batches per optimizer step per rank
    zero_stage: int = 0
    recompute: str = "none"           # none | selective | full
    sequence_parallel: bool = False
    flash_attention: bool = True
    precision: str = "bf16"           # bf16 | fp32
    bf16_weights: str = "bf16"        # bf16 | fp32 (autocast)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes on the most loaded rank (``stage`` is its pipeline stage)."""

    stage: int
    params: int
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    buffers_bytes: int
    framework_bytes: int

    @property
    def model_states_bytes(self) -> int:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> int:
        return self.model_states_bytes + self.activations_bytes + self.buffers_bytes + self.framework_bytes


def structure_problems(shape: ModelShape, tp: int, pp: int) -> list[str]:
    """Reasons why tp/pp cannot split this model at all (independent of the node count)."""
    out = []
    if shape.heads % tp:
        ok = [d for d in range(1, shape.heads + 1) if shape.heads % d == 0]
        out.append(f"tp={tp} does not divide heads={shape.heads}; valid tp: {', '.join(map(str, ok))}")
    elif shape.ffn_dim % tp:
        out.append(f"tp={tp} does not divide ffn_dim={shape.ffn_dim}; choose a tp that divides both heads and ffn_dim")
    if shape.layers % pp:
        ok = [d for d in range(1, shape.layers + 1) if shape.layers % d == 0]
        out.append(f"pp={pp} does not divide layers={shape.layers}; valid pp: {', '.join(map(str, ok))}")
    return out


def stage_params(shape: ModelShape, tp: int, pp: int, stage: int) -> tuple[int, int]:
    """(parameters, parameter tensors) held by one rank of pipeline stage ``stage``."""
    h, f, m, s = shape.hidden, shape.ffn_dim, shape.mlp_factor, shape.seq_len
    split = 3 * h * h + 3 * h + m * f * h + m * f + h * h + f * h
    layer = split // tp + 2 * h + 2 * shape.norm_params
    params = (shape.layers // pp) * layer
    tensors = (shape.layers // pp) * (8 + 2 * shape.norm_tensors)
    vocab_shard = math.ceil(shape.vocab / tp) * h
    if stage == 0:
        params += vocab_shard + s * h
        tensors += 2
    if stage == pp - 1:
        params += shape.norm_params
        tensors += shape.norm_tensors
        if not shape.tie_embeddings or pp > 1:
            params += vocab_shard
            tensors += 1
    return params, tensors


def _state_bytes(layout: Layout) -> tuple[int, int, int, int]:
    """(weight, gradient, optimizer, autocast-cache) bytes per parameter."""
    if layout.precision == "fp32":
        return 4, 4, 8, 0
    if layout.bf16_weights == "fp32":
        return 4, 4, 8, 2
    return 2, 2, 12, 0


def layer_activation_bytes(shape: ModelShape, layout: Layout, recompute: str | None = None) -> float:
    """Activation bytes one block keeps for one micro-batch on one rank."""
    recompute = recompute or layout.recompute
    e = 2 if layout.precision == "bf16" else 4
    s, b, h, f, a, t = shape.seq_len, layout.micro_batch, shape.hidden, shape.ffn_dim, shape.heads, layout.tp
    sp = t if layout.sequence_parallel else 1
    sbh = s * b * h
    if recompute == "full":
        return e * sbh / sp
    mask = 1 if shape.dropout > 0 else 0
    k = 4 if shape.mlp == "swiglu" else 2
    replicated = 4 * e * sbh + 2 * mask * sbh
    split = 4 * e * sbh + k * e * s * b * f
    if layout.flash_attention:
        core = 4 * a * s * b
    else:
        core = e * a * s * s * b + mask * (1 + e) * a * s * s * b
    if recompute == "selective":
        core = 0
    return replicated / sp + split / t + core / t


def activation_bytes(shape: ModelShape, layout: Layout, stage: int) -> float:
    pp, t = layout.pp, layout.tp
    sp = t if layout.sequence_parallel else 1
    s, b, h = shape.seq_len, layout.micro_batch, shape.hidden
    e = 2 if layout.precision == "bf16" else 4
    in_flight = min(pp - stage, max(1, layout.grad_accum))
    total = in_flight * (shape.layers // pp) * layer_activation_bytes(shape, layout)
    if layout.recompute == "full":
        total += layer_activation_bytes(shape, layout, recompute="none")
    if stage == 0 and shape.dropout > 0:
        total += in_flight * s * b * h / sp
    if stage == pp - 1:
        total += 2 * e * s * b * h / sp + 4 * s * b * math.ceil(shape.vocab / t)
    return total


def estimate_memory(shape: ModelShape, layout: Layout, framework_gib: float = 0.0) -> MemoryEstimate:
    """Per-rank memory of the most loaded pipeline stage (see the module docstring for the formulas)."""
    wb, gb, ob, cache = _state_bytes(layout)
    d, z = layout.dp, layout.zero_stage
    best: MemoryEstimate | None = None
    for stage in sorted({0, layout.pp - 1}):
        params, tensors = stage_params(shape, layout.tp, layout.pp, stage)
        weights = wb * params / (d if z >= 3 else 1)
        grads = gb * params / (d if z >= 2 else 1)
        optim = ob * params / (d if z >= 1 else 1) + 4 * tensors
        buffers = cache * params
        if z == 0 and d > 1:
            buffers += gb * params  # DDP gradient buckets
        if z >= 3:
            split = 3 * shape.hidden**2 + 3 * shape.hidden + shape.mlp_factor * shape.ffn_dim * (shape.hidden + 1) \
                + shape.hidden**2 + shape.ffn_dim * shape.hidden
            buffers += 2 * wb * (split // layout.tp + 2 * shape.hidden + 2 * shape.norm_params)
        est = MemoryEstimate(
            stage=stage, params=params, weights_bytes=math.ceil(weights), grads_bytes=math.ceil(grads),
            optimizer_bytes=math.ceil(optim), activations_bytes=math.ceil(activation_bytes(shape, layout, stage)),
            buffers_bytes=math.ceil(buffers), framework_bytes=int(framework_gib * GiB),
        )
        if best is None or est.total_bytes > best.total_bytes:
            best = est
    assert best is not None
    return best


def memory_budget(gpu_memory_gib: float, headroom: float) -> int:
    """Bytes a rank may plan to use: the GPU's memory less the headroom fraction."""
    return int(gpu_memory_gib * GiB * (1.0 - headroom))
