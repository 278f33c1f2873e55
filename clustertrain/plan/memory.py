"""Memory per rank of the built-in trainer for a :class:`~clustertrain.train.layout.ParallelLayout`
(a Megatron-LM model's: :mod:`clustertrain.plan.megatron_memory`, which reuses the activations per block below).

Notation: h hidden, f ffn_dim, a heads, s seq_len, b micro_batch, L layers, V vocab, t = tp,
d = dp, e = bytes per activation element (2 with ``param_dtype: bf16``, 4 with fp32).

Model states — counted, not estimated (:func:`trainer_state_bytes`; a test builds the real sharded
model on gloo ranks and compares with its local shards). Per parameter tensor of
:func:`clustertrain.plan.shape.parameter_tensors`:
  1. tensor parallelism: the tensor's tp dim (``Shard(0)`` or ``Shard(1)``) is split over t;
  2. ``zero_stage: 3`` (FSDP2): dim 0 of that tp-local tensor is split over d with ``torch.chunk``
     semantics — rank 0 holds ceil(rows / d) rows, the last ranks may hold fewer or none;
     ``zero_stage: 0`` (DDP): every rank holds the whole tensor;
  3. bytes: parameters fp32 4, gradients fp32 4, AdamW ``exp_avg`` + ``exp_avg_sq`` fp32 8 per local
     element, plus AdamW's scalar fp32 ``step`` (4 bytes) per tensor. ``param_dtype: bf16`` changes
     only the compute copy (below), never these: the sharded fp32 tensors are the master weights.
  Tied embeddings are one tensor. The planner reports the most loaded rank, rank 0.

Transient buffers — stated allowances (:func:`buffer_bytes`), not counted tensors:
  DDP: gradient buckets 4 B/param when d > 1 (``gradient_as_bucket_view`` is off: the buckets are a
       second gradient-sized buffer) + the bf16 copy of the weights autocast caches during the
       forward pass, 2 B/param with ``param_dtype: bf16``.
  FSDP2: the gathered (unsharded, tp-local) parameters in the compute dtype of two blocks (the
       current one and the prefetched one; the trainer keeps the last block gathered into backward)
       plus the root group (embeddings, final norm, head: the root never reshards after forward);
       with ``reshard_after_forward: false`` every block stays gathered from forward to backward.
       Plus one block's unsharded gradients in ``reduce_dtype`` before their reduce-scatter.

Activations per block and micro-batch (Korthikanti et al. 2022, "Reducing Activation Recomputation
in Large Transformer Models", §4, Table 2), generalised from their 34·s·b·h + 5·a·s²·b bytes:
  replicated across TP:  norm inputs 2e·sbh + q/k/v input e·sbh + MLP input e·sbh + dropout masks 2·sbh
                         (= 10·sbh at e = 2 with dropout; masks only when dropout > 0)
  divided by t:          Q, K, V 3e·sbh + output-projection input e·sbh + MLP k·e·sbf (k = 2 GELU
                         in/out, 4 SwiGLU gate/up/silu/product) (= 24·sbh at e = 2, f = 4h, GELU)
  attention core ÷ t:    softmax e·as²b (+ dropout mask as²b + dropout output e·as²b) = 5·as²b;
                         with flash attention only the fp32 log-sum-exp 4·asb
  ``sequence_parallel`` also divides the replicated part by t. ``recompute: selective`` drops the
  attention core; ``full`` keeps only each block's input e·sbh (÷ t with SP) and needs one block's
  full activations while recomputing it. Extras: embedding dropout mask sbh (÷ t with SP) when
  dropout > 0; output layer 2e·sbh (÷ t with SP) + 4·sbV/t (fp32 logits for the loss; with tp the
  logits stay vocabulary-sharded into the loss). One micro-batch is in flight (no pipeline yet).

Framework (CUDA context, NCCL buffers, cuBLAS workspaces): ``plan.framework_gib``, a stated allowance.
The budget is the GPU's memory less ``plan.headroom`` (a fraction kept free).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from clustertrain.plan.shape import ModelShape, ParamTensor, parameter_tensors
from clustertrain.train.layout import ParallelLayout

GiB = 1024**3
#: bytes per element of a dtype name of ParallelLayout
DTYPE_BYTES = {"bf16": 2, "fp32": 4}
#: fp32 parameter + fp32 gradient + AdamW exp_avg and exp_avg_sq, per local element; AdamW step per tensor
PARAM_BYTES, GRAD_BYTES, ADAM_BYTES, STEP_BYTES = 4, 4, 8, 4


class StateBytes(NamedTuple):
    """Bytes of one rank's model states: parameters, gradients, optimizer (AdamW) states."""

    params: int
    grads: int
    optimizer: int


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes on the most loaded rank (rank 0); ``params``: the parameter elements it holds."""

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


def chunk_rows(rows: int, parts: int, index: int) -> int:
    """Rows of chunk ``index`` of ``torch.chunk(rows, parts)``: ceil(rows / parts) each, the last ones
    fewer, none past the end (FSDP2's and DTensor's ``Shard`` split)."""
    size = -(-rows // parts)
    return max(0, min(size, rows - index * size))


def local_shape(tensor: ParamTensor, layout: ParallelLayout, rank: int = 0) -> tuple[int, ...]:
    """The shape ``rank`` holds of ``tensor``: tp split of its tp dim, then (FSDP2) dp split of dim 0."""
    dims = list(tensor.shape)
    if tensor.tp_dim is not None and layout.tp > 1:
        dims[tensor.tp_dim] = chunk_rows(dims[tensor.tp_dim], layout.tp, layout.tp_rank(rank))
    if layout.fsdp and layout.dp > 1:
        dims[0] = chunk_rows(dims[0], layout.dp, layout.dp_rank(rank))
    return tuple(dims)


def _numel(dims: tuple[int, ...]) -> int:
    return math.prod(dims)


@lru_cache(maxsize=256)
def _groups(shape: ModelShape, part: str) -> tuple[tuple[ParamTensor, int], ...]:
    """The tensors of ``part`` (``all``, ``block`` = block 0, ``root``) grouped by (shape, tp dim): the blocks
    are identical, so the planner's ~500 evaluations of a 7-model cluster count a handful of groups each."""
    keep = {"all": lambda t: True, "block": lambda t: t.block == 0, "root": lambda t: t.block is None}[part]
    counts: dict[tuple, list] = {}
    for t in parameter_tensors(shape):
        if keep(t):
            counts.setdefault((t.shape, t.tp_dim), [t, 0])[1] += 1
    return tuple((t, n) for t, n in counts.values())


def _local_numel(shape: ModelShape, part: str, layout: ParallelLayout, rank: int = 0) -> int:
    return sum(n * _numel(local_shape(t, layout, rank)) for t, n in _groups(shape, part))


def trainer_state_bytes(shape: ModelShape, layout: ParallelLayout, rank: int = 0) -> StateBytes:
    """(parameter, gradient, optimizer) bytes that ``rank`` holds after an optimizer step — the sum over
    the local shards of its parameters, their fp32 gradients and AdamW states (module docstring)."""
    assert layout.pp == 1, "pipeline stages are not modelled yet (parallelism.pp is 1)"
    local = _local_numel(shape, "all", layout, rank)
    return StateBytes(PARAM_BYTES * local, GRAD_BYTES * local, ADAM_BYTES * local + STEP_BYTES * shape.param_tensors())


def buffer_bytes(shape: ModelShape, layout: ParallelLayout) -> int:
    """Transient bytes beyond the model states and activations on rank 0 (allowances in the module docstring)."""
    if not layout.fsdp:
        params = _local_numel(shape, "all", layout)
        buckets = GRAD_BYTES * params if layout.dp > 1 else 0
        autocast = DTYPE_BYTES["bf16"] * params if layout.param_dtype == "bf16" else 0
        return buckets + autocast
    gathered_layout = ParallelLayout(world=layout.tp, dp=1, tp=layout.tp)  # what FSDP2 gathers: tp-local, not dp-sharded
    block = _local_numel(shape, "block", gathered_layout)
    root = _local_numel(shape, "root", gathered_layout)
    gathered_blocks = min(2, shape.layers) if layout.reshard_after_forward else shape.layers
    gathered = DTYPE_BYTES[layout.param_dtype] * (root + gathered_blocks * block)
    return gathered + DTYPE_BYTES[layout.reduce_dtype] * block


def layer_activation_bytes(shape: ModelShape, layout: ParallelLayout, micro_batch: int = 1, flash_attention: bool = True,
                           recompute: str | None = None) -> float:
    """Activation bytes one block keeps for one micro-batch on one rank (``recompute`` overrides the layout's)."""
    recompute = recompute or layout.recompute
    e = DTYPE_BYTES[layout.param_dtype]
    s, b, h, f, a, t = shape.seq_len, micro_batch, shape.hidden, shape.ffn_dim, shape.heads, layout.tp
    sp = t if layout.sequence_parallel else 1
    sbh = s * b * h
    if recompute == "full":
        return e * sbh / sp
    mask = 1 if shape.dropout > 0 else 0
    k = 4 if shape.mlp == "swiglu" else 2
    replicated = 4 * e * sbh + 2 * mask * sbh
    split = 4 * e * sbh + k * e * s * b * f
    if flash_attention:
        core = 4 * a * s * b
    else:
        core = e * a * s * s * b + mask * (1 + e) * a * s * s * b
    if recompute == "selective":
        core = 0
    return replicated / sp + split / t + core / t


def activation_bytes(shape: ModelShape, layout: ParallelLayout, micro_batch: int = 1, flash_attention: bool = True) -> float:
    """Activation bytes of one micro-batch through the whole model on one rank (module docstring)."""
    t = layout.tp
    sp = t if layout.sequence_parallel else 1
    sbh = shape.seq_len * micro_batch * shape.hidden
    e = DTYPE_BYTES[layout.param_dtype]
    total = shape.layers * layer_activation_bytes(shape, layout, micro_batch, flash_attention)
    if layout.recompute == "full":
        total += layer_activation_bytes(shape, layout, micro_batch, flash_attention, recompute="none")
    if shape.dropout > 0:
        total += sbh / sp
    return total + 2 * e * sbh / sp + 4 * shape.seq_len * micro_batch * math.ceil(shape.vocab / t)


def estimate_memory(shape: ModelShape, layout: ParallelLayout, micro_batch: int = 1, flash_attention: bool = True,
                    framework_gib: float = 0.0) -> MemoryEstimate:
    """Memory of rank 0 (the most loaded) for ``layout`` (formulas in the module docstring)."""
    weights, grads, optim = trainer_state_bytes(shape, layout)
    return MemoryEstimate(
        params=weights // PARAM_BYTES, weights_bytes=weights, grads_bytes=grads, optimizer_bytes=optim,
        activations_bytes=math.ceil(activation_bytes(shape, layout, micro_batch, flash_attention)),
        buffers_bytes=buffer_bytes(shape, layout), framework_bytes=int(framework_gib * GiB),
    )


def memory_budget(gpu_memory_gib: float, headroom: float) -> int:
    """Bytes a rank may plan to use: the GPU's memory less the headroom fraction."""
    return int(gpu_memory_gib * GiB * (1.0 - headroom))
