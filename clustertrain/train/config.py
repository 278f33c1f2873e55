"""Project-file sections owned by the trainer: ``models[].model`` (:class:`ArchConfig`),
``models[].training`` (:class:`TrainingConfig`) and ``models[].parallelism`` (:class:`ParallelismConfig`).

:mod:`clustertrain.project` composes them into a model entry; the trainer, the planner and the
preflights read them. Pure pydantic: importing this module imports no torch (it is read by the CLI).
"""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from clustertrain.core.schema import StrictModel


#: Named architectures (``models[].model.preset``): each field as the published model's own Hugging Face
#: ``config.json`` gives it (the repository named in :data:`PRESET_SOURCES`); any field given next to ``preset``
#: overrides the preset's. ``seq_len`` is the training context (the published models' pretraining context),
#: ``vocab`` the published embedding rows (the tokenizer must fit in them).
PRESETS: dict[str, dict] = {
    "llama3-8b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256, seq_len=8192,
                      position="rope", rope_theta=500000.0, norm="rmsnorm", norm_eps=1e-5, mlp="swiglu", bias=False,
                      tie_embeddings=False),
    "llama3-70b": dict(layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=128256, seq_len=8192,
                       position="rope", rope_theta=500000.0, norm="rmsnorm", norm_eps=1e-5, mlp="swiglu", bias=False,
                       tie_embeddings=False),
    "llama3.1-8b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256, seq_len=8192,
                        position="rope", rope_theta=500000.0, norm="rmsnorm", norm_eps=1e-5, mlp="swiglu", bias=False,
                        tie_embeddings=False,
                        rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_context=8192)),
    "llama3.2-1b": dict(layers=16, hidden=2048, heads=32, kv_heads=8, ffn_hidden=8192, vocab=128256, seq_len=8192,
                        position="rope", rope_theta=500000.0, norm="rmsnorm", norm_eps=1e-5, mlp="swiglu", bias=False,
                        tie_embeddings=True,
                        rope_scaling=dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_context=8192)),
    "llama2-7b": dict(layers=32, hidden=4096, heads=32, kv_heads=32, ffn_hidden=11008, vocab=32000, seq_len=4096,
                      position="rope", rope_theta=10000.0, norm="rmsnorm", norm_eps=1e-5, mlp="swiglu", bias=False,
                      tie_embeddings=False),
    "llama2-13b": dict(layers=40, hidden=5120, heads=40, kv_heads=40, ffn_hidden=13824, vocab=32000, seq_len=4096,
                       position="rope", rope_theta=10000.0, norm="rmsnorm", norm_eps=1e-5, mlp="swiglu", bias=False,
                       tie_embeddings=False),
    "smollm2-135m": dict(layers=30, hidden=576, heads=9, kv_heads=3, ffn_hidden=1536, vocab=49152, seq_len=2048,
                         position="rope", rope_theta=100000.0, norm="rmsnorm", norm_eps=1e-5, mlp="swiglu", bias=False,
                         tie_embeddings=True),
    "gpt2": dict(layers=12, hidden=768, heads=12, ffn_hidden=3072, vocab=50257, seq_len=1024, position="learned",
                 norm="layernorm", norm_eps=1e-5, mlp="gelu", bias=True, tie_embeddings=True),
}
#: where each preset's numbers come from (docs/models.md lists them)
PRESET_SOURCES: dict[str, str] = {
    "llama3-8b": "meta-llama/Meta-Llama-3-8B config.json; Llama 3 paper (Grattafiori et al. 2024) table 3",
    "llama3-70b": "meta-llama/Meta-Llama-3-70B config.json; Llama 3 paper table 3",
    "llama3.1-8b": "meta-llama/Llama-3.1-8B config.json (rope_scaling rope_type llama3)",
    "llama3.2-1b": "meta-llama/Llama-3.2-1B config.json (tied embeddings, rope_scaling factor 32)",
    "llama2-7b": "meta-llama/Llama-2-7b-hf config.json; Llama 2 paper (Touvron et al. 2023) table 1",
    "llama2-13b": "meta-llama/Llama-2-13b-hf config.json",
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M config.json",
    "gpt2": "openai-community/gpt2 config.json (GPT2LMHeadModel, gelu_new, n_ctx 1024)",
}


class RopeScaling(StrictModel):
    """Llama 3.1's rotary frequency scaling (Hugging Face ``rope_scaling: {rope_type: llama3, ...}``; Megatron-LM
    ``--use-rope-scaling --rope-scaling-factor``): wavelengths longer than ``original_context / low_freq_factor``
    are stretched by ``factor``, those shorter than ``original_context / high_freq_factor`` kept, those between
    interpolated."""

    factor: float = Field(8.0, gt=1.0, description="How much the long wavelengths are stretched.")
    low_freq_factor: float = Field(1.0, gt=0, description="Wavelengths above original_context / low_freq_factor are scaled.")
    high_freq_factor: float = Field(4.0, gt=0, description="Wavelengths below original_context / high_freq_factor are kept.")
    original_context: int = Field(8192, ge=1, description="The context the frequencies were trained at.")

    @model_validator(mode="after")
    def _check(self) -> "RopeScaling":
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(f"rope_scaling.high_freq_factor ({self.high_freq_factor}) must exceed low_freq_factor "
                             f"({self.low_freq_factor})")
        return self


#: the fields a model section must give itself unless ``preset`` supplies them
_SHAPE_FIELDS = ("layers", "hidden", "heads", "seq_len")


def _preset_or_shape(schema: dict) -> None:
    """JSON schema of ``models[].model``: ``preset`` fills in the shape (the ``_preset`` validator runs before
    the fields are required), so the schema asks for a preset or for the four shape fields, as loading does."""
    schema["required"] = [name for name in schema.get("required", []) if name not in _SHAPE_FIELDS]
    if not schema["required"]:
        del schema["required"]
    schema["anyOf"] = [{"required": ["preset"], "properties": {"preset": {"type": "string"}}},  # not `preset: null`
                       {"required": list(_SHAPE_FIELDS)}]


class ArchConfig(StrictModel):
    """The model's architecture (docs/models.md). The defaults are the classic GPT this trainer started with
    (learned positions, LayerNorm, GELU, biases, one key/value head per query head, tied embeddings), so older
    project files and checkpoints load unchanged; ``preset`` names a published shape (:data:`PRESETS`)."""

    model_config = ConfigDict(json_schema_extra=_preset_or_shape)
    #: how docs/project-file.md marks the fields a preset can supply (clustertrain/docs.py)
    doc_required: ClassVar[str] = "**required** unless `preset`"

    preset: str | None = Field(
        None, description="A named published architecture whose fields fill in what is not given here: "
        + ", ".join(PRESETS) + " (docs/models.md lists each with its source). Any field next to it overrides the preset's.",
    )
    layers: int = Field(..., ge=1, description="Transformer blocks.")
    hidden: int = Field(..., ge=8, description="Model width (d_model).")
    heads: int = Field(..., ge=1, description="Attention (query) heads; must divide `hidden`.")
    kv_heads: int | None = Field(
        None, ge=1, description="Key/value heads (grouped-query attention: each serves heads / kv_heads query heads); "
        "must divide `heads`. Default: `heads` (multi-head attention).",
    )
    seq_len: int = Field(..., ge=8, description="Context length in tokens (each sample is seq_len + 1 tokens).")
    vocab: int | None = Field(
        None, ge=2, description="Vocabulary size. Default: the tokenizer's vocabulary (rounded up to a multiple of 64)."
    )
    position: Literal["learned", "rope"] = Field(
        "learned", description="Positions: `learned` absolute embeddings (GPT-2) or `rope` rotary embeddings on queries "
        "and keys (Llama; the head dimension must be even).",
    )
    rope_theta: float = Field(10000.0, gt=0, description="Rotary base (`position: rope`): Llama 2 10000, Llama 3 500000.")
    rope_scaling: RopeScaling | None = Field(
        None, description="Llama 3.1 frequency scaling for long context (`position: rope`); unset: none.")
    ffn_hidden: int | None = Field(
        None, ge=8, description="MLP width. Default: 4 x hidden (gelu); swiglu: Llama's rule, 2/3 x 4 x hidden times "
        "`ffn_multiplier`, rounded up to a multiple of `ffn_multiple_of`.",
    )
    ffn_multiple_of: int = Field(64, ge=1, description="swiglu without `ffn_hidden`: round the MLP width up to a multiple "
                                 "of this (Llama's `multiple_of`: 256 for Llama 2, 1024 for Llama 3).")
    ffn_multiplier: float | None = Field(None, gt=0, description="swiglu without `ffn_hidden`: scale 2/3 x 4 x hidden by "
                                         "this before rounding (Llama's `ffn_dim_multiplier`, 1.3 for Llama 3 8B).")
    mlp: Literal["gelu", "swiglu"] = Field("gelu", description="MLP type.")
    norm: Literal["layernorm", "rmsnorm"] = Field("layernorm", description="Normalisation (pre-norm).")
    norm_eps: float = Field(1e-5, gt=0, lt=1, description="Epsilon of every norm (Llama 2/3: 1e-5; GPT-2: 1e-5).")
    bias: bool = Field(True, description="Biases on every linear layer (GPT-2, Megatron's default); false as Llama "
                       "(Megatron's --disable-bias-linear). LayerNorm keeps its bias either way.")
    tie_embeddings: bool = Field(True, description="Share the input embedding with the output projection.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout probability (residual and attention).")

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: object) -> object:
        if not isinstance(data, dict) or data.get("preset") is None:
            return data
        name = data["preset"]
        if name not in PRESETS:
            raise ValueError(f"preset {name!r} is unknown; use one of {', '.join(PRESETS)}, or give the fields yourself")
        return {**PRESETS[name], **data}

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_head_count(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def ffn_dim(self) -> int:
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        if self.mlp == "swiglu":
            width = 2 * 4 * self.hidden // 3
            if self.ffn_multiplier is not None:
                width = int(self.ffn_multiplier * width)
            return (width + self.ffn_multiple_of - 1) // self.ffn_multiple_of * self.ffn_multiple_of
        return 4 * self.hidden

    @model_validator(mode="after")
    def _check(self) -> "ArchConfig":
        if self.hidden % self.heads:
            raise ValueError(
                f"heads ({self.heads}) must divide hidden ({self.hidden}); e.g. heads={_divisor_near(self.hidden, self.heads)}"
            )
        if self.heads % self.kv_head_count:
            raise ValueError(f"kv_heads ({self.kv_heads}) must divide heads ({self.heads}) (each key/value head serves "
                             f"an equal group of query heads); e.g. kv_heads={_divisor_near(self.heads, self.kv_head_count)}")
        if self.position == "rope" and self.head_dim % 2:
            raise ValueError(f"position rope needs an even head dimension, but hidden / heads = {self.hidden} / "
                             f"{self.heads} = {self.head_dim}; choose heads so that hidden / heads is even")
        if self.position == "learned" and self.rope_scaling is not None:
            raise ValueError("rope_scaling needs position: rope; drop rope_scaling or set position: rope")
        return self


def _divisor_near(n: int, k: int) -> int:
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - k), d))


class TrainingConfig(StrictModel):
    max_steps: int = Field(..., description="Optimizer steps to train.")
    micro_batch: int = Field(8, ge=1, description="Samples per rank per forward/backward.")
    global_batch: int = Field(
        16, ge=1, description="Samples per optimizer step over all ranks; gradient accumulation makes up the rest."
    )
    lr: float = Field(3e-4, gt=0, description="Peak learning rate.")
    min_lr: float = Field(3e-5, ge=0, description="Learning rate at the end of the decay.")
    schedule: Literal["cosine", "linear", "constant"] = Field("cosine", description="Decay after warmup.")
    warmup_steps: int = Field(0, ge=0, description="Linear warmup steps from 0 to `lr`.")
    weight_decay: float = Field(0.1, ge=0, description="AdamW weight decay (not applied to norms and biases).")
    beta1: float = Field(0.9, ge=0, lt=1, description="AdamW beta1.")
    beta2: float = Field(0.95, ge=0, lt=1, description="AdamW beta2.")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    grad_clip: float = Field(1.0, ge=0, description="Clip the global gradient norm to this (0 = off).")
    seed: int = Field(1234, ge=0, description="Seed for initialisation, data order and dropout.")
    checkpoint_every: int = Field(100, ge=1, description="Save a checkpoint every N steps (and always at the end).")
    backup_every: int | None = Field(
        None, ge=1, description="Back up every Nth checkpoint (steps that are multiples of N x checkpoint_every) to "
        "storage.checkpoint_bucket in the background while training goes on; the last checkpoint of a run is always backed up. "
        "Unset: only that last one.",
    )
    async_checkpoint: bool = Field(
        True, description="Save checkpoints in the background (torch.distributed.checkpoint.async_save): training stalls only "
        "while the state is staged to CPU memory; the next save waits for the previous one. The last save of a run is synchronous.",
    )
    keep_last: int = Field(3, ge=1, description="Checkpoints kept; older ones are deleted after a successful save.")
    log_every: int = Field(10, ge=1, description="Log metrics every N steps.")
    init_from: str | None = Field(
        None, description="Continue training a Hugging Face model: its directory (config.json, model.safetensors or "
        "a sharded index, tokenizer.json; local or on a shared mount; relative to the project file) or an s3:// URL "
        "that `clustertrain export --to` published (fetched once to <datasets>/hf-<hash>/, checksum-verified). Its "
        "config.json must describe `model:` and its tokenizer.json encode like `data.tokenizer`; a run that starts "
        "without a checkpoint of its own loads its weights (any layout), a resume takes the run's checkpoint "
        "(docs/models.md).",
    )

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: object) -> object:
        if isinstance(data, dict) and "precision" in data:
            raise ValueError("precision moved to models[].parallelism.param_dtype (auto | bf16 | fp32), which the planner "
                             "reads too; replace training.precision with parallelism.param_dtype")
        return data

    @field_validator("init_from")
    @classmethod
    def _init_from(cls, v: str | None) -> str | None:
        if v is None:
            return v
        v = v.strip()
        scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", v)
        if not v or (scheme and scheme[1] != "s3") or v == "s3://" or v.startswith(("hf:", "hf://")):
            raise ValueError(f"init_from {v!r}: give a Hugging Face model directory (local or on a shared mount) or an "
                             "s3:// URL from `clustertrain export --to`; a model on the Hugging Face Hub is downloaded "
                             "first: `huggingface-cli download NAME --local-dir DIR`, then init_from: DIR")
        return v

    @field_validator("max_steps")
    @classmethod
    def _positive_steps(cls, v: int) -> int:
        if v <= 0:
            raise ValueError(f"max_steps must be a positive number of steps, got {v}")
        return v

    @model_validator(mode="after")
    def _check(self) -> "TrainingConfig":
        if self.global_batch % self.micro_batch:
            raise ValueError(
                f"global_batch ({self.global_batch}) must be a multiple of micro_batch ({self.micro_batch})"
            )
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr ({self.min_lr}) must not exceed lr ({self.lr})")
        return self


ZERO_STAGES = {
    0: "replicate: DDP (every rank holds the whole model and its AdamW states)",
    3: "FSDP2 full shard: parameters, gradients and AdamW states sharded over the data-parallel ranks",
}
#: what ``zero_stage`` means for a Megatron-LM model (``models[].framework: megatron``)
MEGATRON_ZERO_STAGES = {
    0: "DDP: every data-parallel rank keeps fp32 main weights, gradients and Adam states",
    1: "Megatron's distributed optimizer (--use-distributed-optimizer): fp32 main weights and Adam states sharded over dp",
    2: "as 1 (the distributed optimizer also reduce-scatters gradients)",
    3: "as 1: Megatron-LM shards no parameters with its distributed optimizer (its FSDP paths are not offered)",
}


class ParallelismConfig(StrictModel):
    """How one model's ranks split the work — read by the planner and the trainer alike
    (:mod:`clustertrain.core.parallel_layout` resolves it against a world size). What only one framework can do is
    checked by :func:`builtin_problems` (the built-in trainer) or :mod:`clustertrain.megatron.rules`."""

    dp: int | Literal["auto"] = Field("auto", description="Data-parallel degree; `auto` = world size / (tp x pp).")
    tp: int = Field(1, ge=1, description="Tensor-parallel degree (DTensor: q/k/v and MLP column-wise, outputs row-wise, "
                    "vocabulary-sharded embedding and output layer). Divides heads, ffn width and the vocabulary; at most the GPUs of a node.")
    pp: int = Field(1, ge=1, description="Pipeline-parallel degree: the layers split into pp stages on consecutive groups "
                    "of dp x tp ranks (pp outermost). Built-in trainer: torch.distributed.pipelining, the embeddings on the "
                    "first stage and the output layer on the last, an uneven split by compute when the layers do not divide "
                    "(docs/training.md); `framework: megatron`: Megatron-LM's, equal stages.")
    virtual_stages: int = Field(
        1, ge=1, description="Virtual pipeline stages per pipeline rank (interleaved 1F1B; Megatron's "
        "`--num-virtual-stages-per-pipeline-rank`); needs pp > 1, `schedule: interleaved_1f1b` and the layers divisible "
        "by pp x virtual_stages. Without a `schedule`, virtual_stages > 1 selects `interleaved_1f1b`.",
    )
    schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] = Field(
        "1f1b", description="Pipeline schedule (pp > 1): `gpipe` (all forwards, then all backwards: every micro-batch's "
        "activations in flight), `1f1b` (at most pp micro-batches in flight on the first stage; needs at least pp "
        "micro-batches per step), `interleaved_1f1b` (virtual_stages > 1 chunks per rank: a smaller bubble; micro-batches "
        "a multiple of pp). Micro-batches per step = global_batch / (micro_batch x dp). Megatron: 1f1b, interleaved with "
        "virtual stages.",
    )
    zero_stage: int = Field(
        0, ge=0, le=3, description="How the data-parallel dimension shards. Built-in trainer: `0` = replicate (DDP), `3` = "
        "FSDP2 full shard (parameters, gradients and AdamW states split over dp); 1 and 2 are refused (FSDP2 has no honest "
        "equivalent: use 3 with `reshard_after_forward: false` for ZeRO-2-like communication); tp > 1 needs 3. "
        "`framework: megatron`: `0` = DDP, `1`-`3` = Megatron's distributed optimizer (fp32 main weights and Adam "
        "states sharded over dp; parameters are not).",
    )
    reshard_after_forward: bool = Field(
        True, description="FSDP2 (zero_stage 3): free each block's gathered parameters after its forward and gather them "
        "again for backward (less memory); `false` keeps them until backward (one all-gather less per block, ZeRO-2-like memory). "
        "Always false with pp > 1 (the stage keeps its blocks gathered until the step's end anyway; torchtitan's default).",
    )
    grad_sync: Literal["auto", "per_microbatch", "per_step"] = Field(
        "auto", description="When the built-in trainer's FSDP2 (zero_stage 3, pp 1) reduce-scatters the gradients of a "
        "step's micro-batches: `per_microbatch` after each one's backward (gradients sharded at once: the least memory), "
        "`per_step` once, after the last (FSDP2's set_requires_gradient_sync(False) and set_reshard_after_backward(False) "
        "on the others: 1/micro-batches of the traffic, but every block's gathered parameters and unsharded gradient, "
        "in reduce_dtype, held until the step's end). `auto`: per_microbatch there; `clustertrain plan` names per_step "
        "where it fits. DDP and pipeline stages always exchange once per step (per_step); Megatron's distributed "
        "optimizer too.",
    )
    recompute: Literal["none", "selective", "full"] = Field(
        "none", description="Activation checkpointing per block: `selective` recomputes the attention core "
        "(Korthikanti et al. 2022), `full` keeps only each block's input and recomputes the block in backward.",
    )
    sequence_parallel: bool = Field(
        False, description="Megatron sequence parallelism (tp > 1): norms, dropout and the residual stream split along the sequence."
    )
    compile: bool = Field(False, description="torch.compile each transformer block (needs a working compiler: "
                          "Triton on GPU, a C++ compiler on CPU). Built-in trainer only.")
    param_dtype: Literal["auto", "bf16", "fp32"] = Field(
        "auto", description="Compute dtype of the weights: `bf16` (FSDP2: bf16 gathered parameters over fp32 sharded master "
        "weights; DDP, and one process (no FSDP2 without a process group): bf16 autocast over fp32 weights; Megatron: "
        "`--bf16`) or `fp32`. `auto`: bf16 on GPUs, fp32 on CPU workers.",
    )
    reduce_dtype: Literal["fp32", "bf16"] = Field(
        "fp32", description="Dtype of the gradient reduction over dp (FSDP2, or Megatron's `--grad-reduce-in-bf16`; "
        "DDP reduces fp32 gradients)."
    )

    @model_validator(mode="before")
    @classmethod
    def _interleaved_by_default(cls, data: object) -> object:
        """virtual_stages > 1 without a schedule means the one schedule that takes them."""
        if isinstance(data, dict) and "schedule" not in data and isinstance(data.get("virtual_stages"), int) \
                and data["virtual_stages"] > 1:
            return {**data, "schedule": "interleaved_1f1b"}
        return data

    @model_validator(mode="after")
    def _check(self) -> "ParallelismConfig":
        if self.dp != "auto" and self.dp < 1:
            raise ValueError("dp must be 'auto' or a positive integer")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel needs tp > 1; set parallelism.tp or drop sequence_parallel")
        if self.virtual_stages > 1 and self.pp == 1:
            raise ValueError(f"virtual_stages={self.virtual_stages} needs pp > 1 (interleaved pipeline stages); "
                             "set parallelism.pp or drop virtual_stages")
        if self.schedule == "interleaved_1f1b" and self.virtual_stages == 1:
            raise ValueError("schedule interleaved_1f1b needs virtual_stages >= 2 (the chunks each pipeline rank "
                             "interleaves); set parallelism.virtual_stages, or schedule: 1f1b")
        if self.virtual_stages > 1 and self.schedule != "interleaved_1f1b":
            raise ValueError(f"virtual_stages={self.virtual_stages} runs only with schedule: interleaved_1f1b "
                             f"(not {self.schedule}); set parallelism.schedule: interleaved_1f1b or drop virtual_stages")
        return self


def microbatch_problems(par: ParallelismConfig, microbatches: int) -> list[tuple[str, str]]:
    """(field, problem) for a pipeline schedule that cannot run ``microbatches`` micro-batches per step
    (= global_batch / (micro_batch x dp)) — torch.distributed.pipelining's, as the built-in trainer runs them
    (``Schedule1F1B`` and ``ScheduleInterleaved1F1B`` raise on these; the interleaved rule is Megatron's stricter form)."""
    if par.pp == 1:
        return []
    fix = (f"raise training.global_batch to a multiple of {par.pp} x micro_batch x dp, lower micro_batch, "
           "or use schedule: gpipe" if par.schedule != "interleaved_1f1b" else
           f"make training.global_batch / (micro_batch x dp) a multiple of pp={par.pp}")
    if par.schedule == "1f1b" and microbatches < par.pp:
        return [("parallelism.schedule", f"1f1b needs at least pp={par.pp} micro-batches per step, but global_batch / "
                                         f"(micro_batch x dp) = {microbatches}; {fix}")]
    if par.schedule == "interleaved_1f1b" and microbatches % par.pp:
        return [("parallelism.schedule", f"interleaved_1f1b needs a multiple of pp={par.pp} micro-batches per step, but "
                                         f"global_batch / (micro_batch x dp) = {microbatches}; {fix}")]
    return []


def builtin_problems(par: ParallelismConfig, arch: ArchConfig | None = None) -> list[tuple[str, str]]:
    """(field, problem) for a layout the built-in trainer cannot run (whatever the world size); with ``arch``, also
    tied embeddings across pipeline stages (the stages' split: :func:`clustertrain.core.parallel_layout.pipeline_problems`)."""
    out: list[tuple[str, str]] = []
    if arch is not None and par.pp > 1:
        if arch.tie_embeddings:
            out.append(("model.tie_embeddings", f"true with pp={par.pp}: the embedding sits on the first pipeline stage and "
                                                "the output layer on the last, so the built-in trainer cannot share one "
                                                "tensor between them; set model.tie_embeddings: false (as Llama-style "
                                                "models do), or pp: 1"))
    if par.zero_stage in (1, 2):
        out.append(("parallelism.zero_stage",
                    f"zero_stage {par.zero_stage} is not offered by the built-in trainer: FSDP2 shards parameters, gradients "
                    "and optimizer states together; use zero_stage: 3 (add reshard_after_forward: false for ZeRO-2-like "
                    "traffic) or 0 (DDP), or framework: megatron (its distributed optimizer)"))
    if par.tp > 1 and par.zero_stage == 0:
        out.append(("parallelism.tp", f"tp={par.tp} needs zero_stage: 3 (FSDP2 over the data-parallel ranks): DDP does not "
                                      "take tensor-parallel (DTensor) parameters"))
    if par.compile and par.recompute == "selective" and par.tp > 1:
        out.append(("parallelism.compile", "compile with recompute: selective and tp > 1 fails in torch 2.13 (a tensor-parallel "
                                           "DTensor saved by the attention checkpoint inside a compiled block); use recompute: "
                                           "full, or compile: false"))
    if par.grad_sync == "per_microbatch" and (par.zero_stage != 3 or par.pp > 1):
        why = "DDP reduces once per step (no_sync until the last micro-batch)" if par.zero_stage != 3 else \
            f"pipeline stages (pp={par.pp}) reduce once per step (torch's PipelineStage)"
        out.append(("parallelism.grad_sync", f"per_microbatch applies to FSDP2 (zero_stage: 3) without pipeline stages; "
                                             f"{why}; drop grad_sync or set it to per_step"))
    if par.reduce_dtype == "bf16" and par.zero_stage == 0:
        out.append(("parallelism.reduce_dtype", "reduce_dtype bf16 needs zero_stage: 3 (DDP reduces fp32 gradients)"))
    return out
