"""Memory per rank of the built-in trainer for a :class:`~clustertrain.core.parallel_layout.ParallelLayout`
(a Megatron-LM model's: :mod:`clustertrain.plan.megatron_memory`, which reuses the activations per block below).

Notation: h hidden, f ffn_dim, a heads, s seq_len, b micro_batch, L layers, V vocab, t = tp,
d = dp, e = bytes per activation element (2 with ``param_dtype: bf16``, 4 with fp32).

Model states — counted, not estimated (:func:`trainer_state_bytes`; a test builds the real sharded
model on gloo ranks and compares with its local shards). Per parameter tensor of
:func:`clustertrain.core.model_shape.parameter_tensors`:
  1. tensor parallelism: the tensor's tp dim (``Shard(0)`` or ``Shard(1)``) is split over t;
  2. ``zero_stage: 3`` (FSDP2): dim 0 of that tp-local tensor is split over d with ``torch.chunk``
     semantics — rank 0 holds ceil(rows / d) rows, the last ranks may hold fewer or none;
     ``zero_stage: 0`` (DDP): every rank holds the whole tensor;
  3. bytes: parameters fp32 4, gradients fp32 4, AdamW ``exp_avg`` + ``exp_avg_sq`` fp32 8 per local
     element, plus AdamW's scalar fp32 ``step`` (4 bytes) per tensor. ``param_dtype: bf16`` changes
     only the compute copy (below), never these: the sharded fp32 tensors are the master weights.
  Tied embeddings are one tensor. Pipeline parallelism (pp > 1): a rank holds the tensors of its stages
  (:meth:`~clustertrain.core.parallel_layout.ParallelLayout.rank_stages`; the blocks of each stage by
  :func:`stage_split`, the trainer's own split): the embeddings on stage 0, the final norm and output layer on
  the last, its blocks in between; tp and FSDP2 then split each tensor as above, and the AdamW ``step`` counts
  per tensor the rank holds.

Transient buffers — stated allowances (:func:`buffer_bytes`), not counted tensors:
  DDP: gradient buckets 4 B/param when d > 1 (``gradient_as_bucket_view`` is off: the buckets are a
       second gradient-sized buffer) + the bf16 copy of the weights autocast caches during the
       forward pass, 2 B/param with ``param_dtype: bf16``.
  (A one-process run of ``zero_stage: 3`` has no process group, so FSDP2 is not applied and it is counted as
  DDP: autocast's bf16 copy, no buckets.)
  FSDP2: the gathered (unsharded, tp-local) parameters in the compute dtype of two blocks (the
       current one and the prefetched one; the trainer keeps the last block gathered into backward)
       plus the root group (embeddings, final norm, head: the root never reshards after forward);
       with ``reshard_after_forward: false`` every block stays gathered from forward to backward.
       Plus one block's unsharded gradients in ``reduce_dtype`` before their reduce-scatter.
       Under pipeline parallelism torch's ``PipelineStage`` runs every micro-batch's backward with
       ``set_reshard_after_backward(False)`` and ``set_requires_gradient_sync(False)`` and reduce-scatters once,
       after the step's last micro-batch: from its first backward to the step's end each block of the rank's
       stages stays gathered (compute dtype) and accumulates its unsharded gradient (``reduce_dtype``) — both
       counted for every block and stage root the rank holds (``reshard_after_forward`` is always false there).
       ``grad_sync: per_step`` without pipeline stages does the same to the whole model (all micro-batches but the
       last run with those two switches off): every block and the root gathered (compute dtype) with an unsharded
       gradient in ``reduce_dtype`` — the dtype FSDP2 accumulates an unreduced gradient in
       (``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``, ``to_accumulated_grad_if_needed``: the compute-dtype
       gradient is cast to ``reduce_dtype`` after each backward and the next ones added to it; with ``param_dtype ==
       reduce_dtype`` it stays the parameter's ``.grad``, the same bytes).

Activations per block and micro-batch (Korthikanti et al. 2022, "Reducing Activation Recomputation
in Large Transformer Models", §4, Table 2), generalised from their 34·s·b·h + 5·a·s²·b bytes:
  replicated across TP:  norm inputs 2e·sbh + q/k/v input e·sbh + MLP input e·sbh + dropout masks 2·sbh
                         (= 10·sbh at e = 2 with dropout; masks only when dropout > 0)
  divided by t:          Q e·sbh, K and V 2e·sbk + output-projection input e·sbh + MLP k·e·sbf (k = 2 GELU
                         in/out, 4 SwiGLU gate/up/silu/product) (= 24·sbh at e = 2, f = 4h, GELU, k = h)
                         — with grouped-query attention K and V are kv_heads x head_dim = k wide under
                         flash attention (the CUDA flash kernel takes fewer key/value heads as they are:
                         ``can_use_flash_attention`` accepts GQA, pytorch ``aten/src/ATen/native/transformers/
                         cuda/sdp_utils.cpp``), h wide materialised (the math kernel saves K and V after
                         ``repeat_interleave`` to every query head)
  attention core ÷ t:    softmax e·as²b (+ dropout mask as²b + dropout output e·as²b) = 5·as²b;
                         with flash attention only the fp32 log-sum-exp 4·asb
  ``sequence_parallel`` also divides the replicated part by t. ``recompute: selective`` drops the
  attention core; ``full`` keeps only each block's input e·sbh (÷ t with SP) and needs one block's
  full activations while recomputing it. Extras: embedding dropout mask sbh (÷ t with SP) when
  dropout > 0; output layer 2e·sbh (÷ t with SP) + 4·sbV/t (fp32 logits for the loss; with tp the
  logits stay vocabulary-sharded into the loss). Without pipeline parallelism one micro-batch is in flight.
  Rotary positions add nothing per micro-batch: the rotation's multiplies save only the cos/sin tables
  (``[s, head_dim]`` fp32 per block, not per micro-batch), and the rotated Q and K replace the unrotated ones as
  what attention saves. Linear biases save nothing (a linear saves its input either way). RMSNorm counts as
  LayerNorm (its input): on CUDA ``_fused_rms_norm`` saves the input and the fp32 1/rms (pytorch
  ``tools/autograd/derivatives.yaml``); the CPU build decomposes it and also keeps the normalised copy (e·sbh per
  norm, not counted). Not counted either: the norms' fp32 statistics (4·sb or 8·sb per norm, < 1/h of the rest).
  ``tests/unit/plan/test_shape_memory.py`` compares all of this with what autograd saves for a real block.

Pipeline stages (pp > 1; :func:`estimate_memory`): pipeline rank r holds the activations of the micro-batches in
flight on its stages at its peak (:func:`in_flight_chunks`, m = global_batch / (micro_batch x dp) per step):
``gpipe`` every one of the m (all forwards run before the first backward), ``1f1b`` min(m, pp - r) (its warm-up
forwards + 1), ``interleaved_1f1b`` min(m v, 2(pp - r - 1) + (v - 1) pp + 1) chunks of L/(pp v) blocks (torch's
``ScheduleInterleaved1F1B`` warm-up + 1, the same count as Megatron's). The first stage adds the embedding dropout
mask per micro-batch in flight, the last the output layer's inputs and fp32 logits for one micro-batch (its
backward follows its forward at once; ``gpipe``: for all m). The most loaded rank is the pipeline rank (dp and
tp rank 0) with the largest total; the planner reports that one.

Time (:mod:`clustertrain.plan.allocate`): a step takes (1 + (pp - 1) / (v m)) times its compute, the pipeline
bubble (Narayanan et al. 2021; ``gpipe`` and ``1f1b`` have v = 1).

Framework (CUDA context, NCCL buffers, cuBLAS workspaces): ``plan.framework_gib``, a stated allowance.
The budget is the GPU's memory less ``plan.headroom`` (a fraction kept free).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from clustertrain.core.model_shape import ModelShape, ParamTensor, parameter_tensors
from clustertrain.core.parallel_layout import ParallelLayout, stage_costs, stage_layers

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
    """Bytes on the most loaded rank; ``params``: the parameter elements it holds."""

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


_FIRST = ("tok_emb.weight", "pos_emb.weight")


@lru_cache(maxsize=256)
def _groups(shape: ModelShape, part: str) -> tuple[tuple[ParamTensor, int], ...]:
    """The tensors of ``part`` (``all``, ``block`` = block 0, ``root``; ``first`` = the embeddings of pipeline stage
    0, ``last`` = the final norm and output layer of the last stage) grouped by (shape, tp dim): the blocks are
    identical, so the planner's ~500 evaluations of a 7-model cluster count a handful of groups each."""
    keep = {"all": lambda t: True, "block": lambda t: t.block == 0, "root": lambda t: t.block is None,
            "first": lambda t: t.name in _FIRST, "last": lambda t: t.block is None and t.name not in _FIRST}[part]
    tensors = parameter_tensors(shape)
    if part == "last" and shape.tie_embeddings:  # pp > 1: the last stage's output layer is a tensor of its own
        tensors.append(ParamTensor("head.weight", (shape.vocab, shape.hidden), 0, None))
    counts: dict[tuple, list] = {}
    for t in tensors:
        if keep(t):
            counts.setdefault((t.shape, t.tp_dim), [t, 0])[1] += 1
    return tuple((t, n) for t, n in counts.values())


def _local_numel(shape: ModelShape, part: str, layout: ParallelLayout, rank: int = 0) -> int:
    return sum(n * _numel(local_shape(t, layout, rank)) for t, n in _groups(shape, part))


def _tensors(shape: ModelShape, part: str) -> int:
    return sum(n for _, n in _groups(shape, part))


@lru_cache(maxsize=256)
def stage_split(shape: ModelShape, stages: int) -> list[range]:
    """The blocks of each of ``stages`` pipeline stages — the trainer's split
    (:func:`clustertrain.train.parallel.pipeline.rank_layers`: ``stage_layers(arch.layers, stages, stage_costs(arch,
    vocab))``; ``stage_costs`` reads hidden, ffn_dim, seq_len and mlp, which a shape carries as the arch does)."""
    return stage_layers(shape.layers, stages, stage_costs(shape, shape.vocab))


@dataclass(frozen=True)
class RankParts:
    """What one rank holds of the model: its pipeline stages, their blocks, and whether it has the embeddings
    (stage 0) and the final norm and output layer (the last stage)."""

    stages: tuple[int, ...]
    blocks: tuple[int, ...]      # blocks per stage, in the order of ``stages``
    first: bool
    last: bool

    @property
    def layers(self) -> int:
        return sum(self.blocks)


def rank_parts(shape: ModelShape, layout: ParallelLayout, rank: int = 0) -> RankParts:
    """The stages ``rank`` holds (:meth:`ParallelLayout.rank_stages`) and their blocks (:func:`stage_split`)."""
    if layout.pp == 1:
        return RankParts((0,), (shape.layers,), True, True)
    split = stage_split(shape, layout.stages)
    stages = tuple(layout.rank_stages(rank))
    return RankParts(stages, tuple(len(split[s]) for s in stages), 0 in stages, layout.stages - 1 in stages)


def _held_numel(shape: ModelShape, parts: RankParts, layout: ParallelLayout, rank: int = 0) -> int:
    """Local elements of the tensors of ``parts`` (whole model when it holds every stage: tied weights once)."""
    if parts.first and parts.last:
        return _local_numel(shape, "all", layout, rank)
    n = parts.layers * _local_numel(shape, "block", layout, rank)
    n += _local_numel(shape, "first", layout, rank) if parts.first else 0
    return n + (_local_numel(shape, "last", layout, rank) if parts.last else 0)


def trainer_state_bytes(shape: ModelShape, layout: ParallelLayout, rank: int = 0) -> StateBytes:
    """(parameter, gradient, optimizer) bytes that ``rank`` holds after an optimizer step — the sum over
    the local shards of the tensors of its pipeline stages, their fp32 gradients and AdamW states (module docstring)."""
    parts = rank_parts(shape, layout, rank)
    local = _held_numel(shape, parts, layout, rank)
    if parts.first and parts.last:
        tensors = shape.param_tensors()
    else:
        tensors = (parts.layers * _tensors(shape, "block") + (_tensors(shape, "first") if parts.first else 0)
                   + (_tensors(shape, "last") if parts.last else 0))
    return StateBytes(PARAM_BYTES * local, GRAD_BYTES * local, ADAM_BYTES * local + STEP_BYTES * tensors)


def buffer_bytes(shape: ModelShape, layout: ParallelLayout, rank: int = 0) -> int:
    """Transient bytes beyond the model states and activations on ``rank`` (allowances in the module docstring)."""
    parts = rank_parts(shape, layout, rank)
    if not layout.fsdp or layout.world == 1:  # one process: no mesh, so no FSDP2 (clustertrain.train.parallel): as DDP
        params = _held_numel(shape, parts, layout, rank)
        buckets = GRAD_BYTES * params if layout.dp > 1 else 0
        autocast = DTYPE_BYTES["bf16"] * params if layout.param_dtype == "bf16" else 0
        return buckets + autocast
    gathered_layout = ParallelLayout(world=layout.tp, dp=1, tp=layout.tp)  # what FSDP2 gathers: tp-local, not dp-sharded
    tp_rank = layout.tp_rank(rank)
    if layout.pp > 1 or layout.grad_sync == "per_step":  # every block and root: gathered, with an unsharded gradient
        held = _held_numel(shape, parts, gathered_layout, tp_rank)
        return (DTYPE_BYTES[layout.param_dtype] + DTYPE_BYTES[layout.reduce_dtype]) * held
    block = _local_numel(shape, "block", gathered_layout, tp_rank)
    root = _local_numel(shape, "root", gathered_layout, tp_rank)
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
    kv = shape.kv_dim if flash_attention else h   # K and V as attention saves them (module docstring)
    split = 2 * e * sbh + 2 * e * s * b * kv + k * e * s * b * f
    if flash_attention:
        core = 4 * a * s * b
    else:
        core = e * a * s * s * b + mask * (1 + e) * a * s * s * b
    if recompute == "selective":
        core = 0
    return replicated / sp + split / t + core / t


def microbatches(global_batch: int, micro_batch: int, dp: int) -> int:
    """Micro-batches per step and data-parallel rank (m); at least 1 (a batch that does not divide is refused elsewhere)."""
    return max(1, global_batch // (micro_batch * dp))


def in_flight_chunks(pp: int, virtual_stages: int, m: int, stage: int, schedule: str = "1f1b") -> int:
    """Model chunks (of L/(pp x vp) blocks; a whole stage without virtual stages) whose activations pipeline rank
    ``stage`` holds at its peak: ``gpipe`` all m; 1F1B warm-up + 1 (torch's ``Schedule1F1B`` and
    ``ScheduleInterleaved1F1B``, Megatron's ``get_pp_rank_microbatches``), never more than the step's m x vp."""
    if pp == 1:
        return 1
    if schedule == "gpipe":
        return m
    if virtual_stages == 1:
        return min(m, pp - stage)
    return min(m * virtual_stages, 2 * (pp - stage - 1) + (virtual_stages - 1) * pp + 1)


def pipeline_bubble(pp: int, virtual_stages: int, m: int) -> float:
    """The bubble of a pipelined step as a fraction of its compute: (pp - 1) / (vp x m) (GPipe and 1F1B: vp = 1);
    0 without pipelining."""
    return (pp - 1) / (virtual_stages * m) if pp > 1 else 0.0


def activation_bytes(shape: ModelShape, layout: ParallelLayout, micro_batch: int = 1, flash_attention: bool = True,
                     m: int = 1, pp_rank: int = 0) -> float:
    """Activation bytes on a rank of pipeline rank ``pp_rank`` at its peak: one micro-batch through the whole model
    without pipelining, the micro-batches its schedule keeps in flight on its stages with it (``m`` per step;
    module docstring)."""
    t = layout.tp
    sp = t if layout.sequence_parallel else 1
    sbh = shape.seq_len * micro_batch * shape.hidden
    e = DTYPE_BYTES[layout.param_dtype]
    parts = rank_parts(shape, layout, pp_rank * layout.dp * layout.tp)
    chunks = in_flight_chunks(layout.pp, layout.virtual_stages, m, pp_rank, layout.schedule)
    per_layer = layer_activation_bytes(shape, layout, micro_batch, flash_attention)
    if layout.pp == 1:
        held = shape.layers
    elif layout.schedule == "interleaved_1f1b":   # equal chunks (interleaving needs layers % (pp v) == 0)
        held = chunks * shape.layers / layout.stages
    else:
        held = chunks * parts.layers
    in_flight = chunks / layout.virtual_stages    # micro-batches' worth of the rank's stages
    total = held * per_layer
    if layout.recompute == "full":
        total += layer_activation_bytes(shape, layout, micro_batch, flash_attention, recompute="none")
    if parts.first and shape.dropout > 0:
        total += in_flight * sbh / sp
    if parts.last:
        logits = 2 * e * sbh / sp + 4 * shape.seq_len * micro_batch * math.ceil(shape.vocab / t)
        total += (m if layout.pp > 1 and layout.schedule == "gpipe" else 1) * logits
    return total


@dataclass(frozen=True)
class TrainerMemory(MemoryEstimate):
    """:class:`MemoryEstimate` of the built-in trainer's most loaded rank: its pipeline rank (0 without pipelining),
    the stages it holds, their blocks, and how many micro-batches' activations it holds at its peak."""

    pp_rank: int = 0
    stages: tuple[int, ...] = (0,)
    layers: int = 0
    in_flight: float = 1.0


def rank_memory(shape: ModelShape, layout: ParallelLayout, pp_rank: int = 0, micro_batch: int = 1,
                flash_attention: bool = True, framework_gib: float = 0.0, m: int = 1) -> TrainerMemory:
    """Memory of the first rank of pipeline rank ``pp_rank`` (dp and tp rank 0, the most loaded of its group)."""
    rank = pp_rank * layout.dp * layout.tp
    weights, grads, optim = trainer_state_bytes(shape, layout, rank)
    parts = rank_parts(shape, layout, rank)
    chunks = in_flight_chunks(layout.pp, layout.virtual_stages, m, pp_rank, layout.schedule)
    return TrainerMemory(
        params=weights // PARAM_BYTES, weights_bytes=weights, grads_bytes=grads, optimizer_bytes=optim,
        activations_bytes=math.ceil(activation_bytes(shape, layout, micro_batch, flash_attention, m, pp_rank)),
        buffers_bytes=buffer_bytes(shape, layout, rank), framework_bytes=int(framework_gib * GiB),
        pp_rank=pp_rank, stages=parts.stages, layers=parts.layers, in_flight=chunks / layout.virtual_stages,
    )


def estimate_memory(shape: ModelShape, layout: ParallelLayout, micro_batch: int = 1, flash_attention: bool = True,
                    framework_gib: float = 0.0, m: int = 1) -> TrainerMemory:
    """Memory of the most loaded rank for ``layout`` (formulas in the module docstring): rank 0 without pipeline
    parallelism, else the pipeline rank (dp and tp rank 0) that needs the most, ``m`` micro-batches per step."""
    found = [rank_memory(shape, layout, r, micro_batch, flash_attention, framework_gib, m) for r in range(layout.pp)]
    return max(found, key=lambda mem: mem.total_bytes)  # max keeps the earlier pipeline rank on a tie


def memory_budget(gpu_memory_gib: float, headroom: float) -> int:
    """Bytes a rank may plan to use: the GPU's memory less the headroom fraction."""
    return int(gpu_memory_gib * GiB * (1.0 - headroom))
