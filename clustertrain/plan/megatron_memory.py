"""Memory per GPU and pipeline arithmetic of a Megatron-LM model (``models[].framework: megatron``), at
Megatron-LM core_v0.16.1 — what differs from the built-in trainer's :mod:`clustertrain.plan.memory`.

Megatron's own reference is ``megatron/training/theoretical_memory_usage.py`` (``compute_weight_and_optimizer_memory``,
``compute_activation_memory``, ``compute_activation_memory_without_sp``); this module follows its formulas where
the project gives the same inputs and counts exactly where it approximates (tests/unit/plan/test_megatron_plan.py
runs that file from the tag's source and compares). Notation as in :mod:`clustertrain.plan.memory`: h hidden,
f ffn_dim, a heads, s seq_len, b micro_batch, L layers, V padded vocabulary, t = tp, p = pp, v = virtual stages,
d = dp, m = micro-batches per step = global_batch / (b x d), e = bytes per activation element.

Model states — bytes per parameter the rank holds (Megatron's ``num_bytes_per_parameter``):
  ``--bf16`` (param_dtype bf16): bf16 weights 2 + main gradients 4 (fp32: Megatron accumulates and reduces in
  fp32; 2 with ``parallelism.reduce_dtype: bf16`` = ``--grad-reduce-in-bf16``) + fp32 main weights and Adam
  m, v 12. ``zero_stage`` 0: all on every rank, 18 B; 1-3 (``--use-distributed-optimizer``): the 12 B are
  sharded over dp (ceil(n / d) elements each), 2 + 4 + 12/d = Megatron's "6 + 12/dp". Parameters and gradients
  are never sharded over dp (Megatron's FSDP paths are not offered). fp32 params: 4 + 4 + Adam 8 (/d sharded).
  The bucket padding of the distributed optimizer (to multiples of lcm(d, 128) elements) is left out.

Which parameters a rank holds — counted from the model's tensors (:func:`clustertrain.core.model_shape.parameter_tensors`,
the same GPT Megatron is rendered to build, biases and learned positions included; Megatron's formula leaves
both out and divides norms and row-parallel biases by t, which Megatron replicates). Megatron's layout differs, not
its counts: one fused ``linear_qkv`` of (a + 2 k_h) x head_dim rows (k_h = ``kv_heads``, split over t as groups of
whole key/value heads) holds our q, k and v, and ``linear_fc1`` of 2f rows holds SwiGLU's gate and up; with
``bias: false`` (``--disable-bias-linear``) no linear has a bias, norms keep theirs; rope has no parameters
(``--position-embedding-type rope``: no position embedding). Tensor-parallel tensors split over t, each pipeline
stage L/p blocks; the first stage also the word (and learned position) embeddings, the last the final
norm and the output layer (V x h / t — with tied embeddings and p > 1 Megatron's last stage keeps its own copy of
the word embeddings for the output layer). The vocabulary, when ``model.vocab`` is unset, is the tokenizer's padded
to a multiple of 128 x t (``--make-vocab-size-divisible-by 128``; the ``byte`` tokenizer is Megatron's
NullTokenizer with 256 + 1 ids): :func:`megatron_vocab`.

Activations — Korthikanti et al. 2022 per block and micro-batch, :func:`clustertrain.plan.memory.layer_activation_bytes`
(Megatron's ``sbh(18 + 4f/h)/t`` with sequence parallel and selective recomputation, ``sbh(10 + 24/t)`` without
sequence parallel at f = 4h): divided by t, the replicated part too with sequence parallel; ``selective``
(``--recompute-activations``) drops the attention core; ``full`` keeps each block's input and one block's full
activations while it is recomputed. Without Transformer Engine (``megatron.transformer_impl: local``) attention
materialises the s x s scores (Megatron's unfused ``DotProductAttention``). Pipeline: stage r holds the
activations of min(m, p - r) micro-batches under 1F1B (the first stage min(m, p)); interleaved (v > 1) it holds
min(m v, 2(p - r - 1) + (v - 1)p + 1) model chunks of L/(p v) blocks — Megatron's schedule's warm-up + 1 — which
on the first stage is theoretical_memory_usage.py's penalty, L (1 + (p - 1)/(p v)) blocks. The first stage adds
per micro-batch in flight the token ids (8 s b) and the embedding dropout mask (s b h, / t with sequence parallel;
with dropout > 0); the last the final norm's and output layer's inputs 2e s b h (/ t with sequence parallel) and
the fp32 logits of the cross entropy 4 s b V / t (Megatron's ``vocab_parallel_cross_entropy`` upcasts).
No buffers beyond these: the gradient buffer is the main gradients, the parameter buffer the weights;
workspaces, the CUDA context and NCCL are ``plan.framework_gib``. The most loaded rank is the first or the last
pipeline stage, whichever needs more; the planner reports that one.

Time: the same FLOPs per token as the built-in trainer at the assumed MFU, plus the pipeline bubble: a step
takes (1 + (p - 1)/(v m)) times its compute (Narayanan et al. 2021, the interleaved 1F1B schedule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from clustertrain.plan.memory import (  # the pipeline arithmetic is shared with the built-in trainer's plan
    DTYPE_BYTES,
    GiB,
    MemoryEstimate,
    StateBytes,
    _local_numel,
    chunk_rows,
    in_flight_chunks,
    layer_activation_bytes,
)
from clustertrain.core.model_shape import ModelShape
from clustertrain.core.parallel_layout import ParallelLayout

#: Megatron's --make-vocab-size-divisible-by default: the vocabulary is padded to a multiple of this x tp
MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128
#: fp32 main weights + Adam m + v per parameter (bf16 training); with fp32 weights only m + v
MAIN_AND_ADAM_BYTES, ADAM_ONLY_BYTES = 12, 8
#: int64 token ids the embedding keeps per token
TOKEN_ID_BYTES = 8


@dataclass(frozen=True)
class MegatronMemory(MemoryEstimate):
    """:class:`MemoryEstimate` of the most loaded rank, plus which pipeline stage it is and how many
    micro-batches' activations that stage holds."""

    stage: str = "first"       # first | last (pp 1: the only stage, "first")
    in_flight: float = 1.0     # micro-batches whose activations the stage holds (fractional: interleaved chunks)


def megatron_vocab(arch, tokenizer: str, tp: int) -> int:
    """The embedding rows Megatron builds: ``model.vocab`` (``--padded-vocab-size``) when set, else the tokenizer's
    size padded to a multiple of 128 x tp (``byte`` = NullTokenizer --vocab-size 256: 257 ids with its end-of-document)."""
    if arch.vocab is not None:
        return arch.vocab
    if tokenizer == "byte":
        from clustertrain.megatron.config import BYTE_VOCAB_WITHOUT_EOD

        size = BYTE_VOCAB_WITHOUT_EOD + 1
    else:
        from clustertrain.data.tokenizers import load_tokenizer

        size = load_tokenizer(tokenizer).vocab_size
    multiple = MAKE_VOCAB_SIZE_DIVISIBLE_BY * tp
    return -(-size // multiple) * multiple


def stage_params(shape: ModelShape, tp: int, pp: int, stage: int) -> int:
    """Parameter elements a rank of pipeline stage ``stage`` holds (tp-local; module docstring)."""
    tp_layout = ParallelLayout(world=tp, dp=1, tp=tp)
    n = shape.layers // pp * _local_numel(shape, "block", tp_layout)
    vocab_rows = chunk_rows(shape.vocab, tp, 0) * shape.hidden
    if stage == 0:
        n += vocab_rows + (shape.seq_len * shape.hidden if shape.position == "learned" else 0)
    if stage == pp - 1:
        n += shape.norm_params
        if not shape.tie_embeddings or pp > 1:
            n += vocab_rows
    return n


def megatron_state_bytes(params: int, layout: ParallelLayout) -> StateBytes:
    """(weights, main gradients, optimizer) bytes for ``params`` elements (module docstring); the optimizer
    holds the fp32 main weights and Adam m, v, sharded over dp with ``zero_stage`` >= 1."""
    bf16 = layout.param_dtype == "bf16"
    per = MAIN_AND_ADAM_BYTES if bf16 else ADAM_ONLY_BYTES
    shard = -(-params // layout.dp) if layout.zero_stage >= 1 else params
    return StateBytes(DTYPE_BYTES[layout.param_dtype] * params, DTYPE_BYTES[layout.reduce_dtype] * params, per * shard)


def stage_activation_bytes(shape: ModelShape, layout: ParallelLayout, micro_batch: int, m: int, virtual_stages: int,
                           flash_attention: bool, stage: int) -> tuple[float, float]:
    """(activation bytes, micro-batches in flight) of a rank of pipeline stage ``stage`` (module docstring)."""
    pp, vp = layout.pp, virtual_stages
    in_flight = in_flight_chunks(pp, vp, m, stage) / vp
    total = shape.layers / pp * in_flight * layer_activation_bytes(shape, layout, micro_batch, flash_attention)
    if layout.recompute == "full":
        total += layer_activation_bytes(shape, layout, micro_batch, flash_attention, recompute="none")
    sp = layout.tp if layout.sequence_parallel else 1
    sb = shape.seq_len * micro_batch
    e = DTYPE_BYTES[layout.param_dtype]
    if stage == 0:
        total += in_flight * (TOKEN_ID_BYTES * sb + (sb * shape.hidden / sp if shape.dropout > 0 else 0))
    if stage == pp - 1:
        total += 2 * e * sb * shape.hidden / sp + 4 * sb * math.ceil(shape.vocab / layout.tp)
    return total, in_flight


def stage_memory(shape: ModelShape, layout: ParallelLayout, stage: int, micro_batch: int = 1, m: int = 1,
                 virtual_stages: int = 1, flash_attention: bool = True, framework_gib: float = 0.0) -> MegatronMemory:
    """Memory of a rank of pipeline stage ``stage`` (0 = first, ``layout.pp - 1`` = last)."""
    params = stage_params(shape, layout.tp, layout.pp, stage)
    weights, grads, optim = megatron_state_bytes(params, layout)
    acts, in_flight = stage_activation_bytes(shape, layout, micro_batch, m, virtual_stages, flash_attention, stage)
    return MegatronMemory(
        params=params, weights_bytes=weights, grads_bytes=grads, optimizer_bytes=optim,
        activations_bytes=math.ceil(acts), buffers_bytes=0, framework_bytes=int(framework_gib * GiB),
        stage="first" if stage == 0 else "last", in_flight=in_flight,
    )


def estimate_megatron_memory(shape: ModelShape, layout: ParallelLayout, micro_batch: int = 1, m: int = 1,
                             virtual_stages: int = 1, flash_attention: bool = True,
                             framework_gib: float = 0.0) -> MegatronMemory:
    """Memory of the most loaded rank of a Megatron model: the first or the last pipeline stage, whichever needs more
    (``m``: micro-batches per step and data-parallel rank)."""
    stages = [0] if layout.pp == 1 else [0, layout.pp - 1]
    found = [stage_memory(shape, layout, s, micro_batch, m, virtual_stages, flash_attention, framework_gib) for s in stages]
    return max(found, key=lambda mem: mem.total_bytes)  # max keeps the first stage on a tie


def megatron_layout(layout: ParallelLayout, reduce_dtype: str) -> ParallelLayout:
    """``resolve_layout``'s layout with Megatron's gradient dtype: ``--grad-reduce-in-bf16`` applies with any
    zero_stage (the built-in trainer's DDP reduces fp32 only)."""
    from dataclasses import replace

    return replace(layout, reduce_dtype=reduce_dtype)


def megatron_layout_text(layout: ParallelLayout, virtual_stages: int = 1, memory: MegatronMemory | None = None) -> str:
    """The layout in Megatron's words: ``tp 2 x pp 4 (vp 2) x dp 11, distributed optimizer, sequence parallel,
    recompute selective, bf16``, plus the most loaded stage with pipelining."""
    pp = f"pp {layout.pp}" + (f" (vp {virtual_stages})" if virtual_stages > 1 else "")
    parts = [f"tp {layout.tp} x {pp} x dp {layout.dp}",
             "distributed optimizer" if layout.zero_stage >= 1 else "no distributed optimizer"]
    if layout.sequence_parallel:
        parts.append("sequence parallel")
    if layout.recompute != "none":
        parts.append(f"recompute {layout.recompute}")
    parts.append(layout.param_dtype + (" / bf16 grad reduce" if layout.reduce_dtype == "bf16" else ""))
    if memory is not None and layout.pp > 1:
        parts.append(f"most loaded: {memory.stage} stage, {memory.in_flight:g} micro-batches in flight")
    return ", ".join(parts)


def pipeline_problems(shape: ModelShape, pp: int, virtual_stages: int) -> list[tuple[str, str]]:
    """(field, problem) for a pipeline Megatron cannot build: layers not divisible by pp, or the layers of a stage
    by the virtual stages (also checked when the project is loaded, :mod:`clustertrain.megatron.rules`)."""
    if shape.layers % pp:
        return [("parallelism.pp", f"pp={pp} does not divide model.layers={shape.layers} (Megatron gives each pipeline "
                                   "stage the same number of layers)")]
    if virtual_stages > 1 and (shape.layers // pp) % virtual_stages:
        return [("parallelism.virtual_stages", f"virtual_stages={virtual_stages} does not divide the "
                                               f"{shape.layers // pp} layers of each pipeline stage")]
    return []
