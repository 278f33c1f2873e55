"""The ``pretrain_gpt.py`` argument list of a Megatron model, rendered from its project entry.

Data-driven: :data:`FLAGS` is one table of (option, project field, rule); :func:`megatron_args` walks it,
``docs/megatron.md``'s mapping table is generated from it (:func:`flag_table`), and
:func:`rendered_options` tells ``megatron.extra_args`` which options it must not repeat. Every option is
one Megatron-LM's parser accepts at :data:`~clustertrain.megatron.config.MEGATRON_TAG` (the flag list of
:mod:`clustertrain.megatron.flags`; a test runs the tag's own ``parse_args`` on every rendered list).

Mapping decisions (what the built-in GPT is, said in Megatron's words):

* init std 0.02, pre-norm, and the architecture of ``models[].model`` flag by flag, rendered explicitly where
  Megatron's default differs from the built-in trainer (dropout: Megatron's 0.1). Megatron-core 0.16.1 builds the
  same tensors in its own layout (one fused ``linear_qkv`` of (heads + 2 kv_heads) x head_dim rows, the
  pre-norms fused into the next linear with Transformer Engine): the parameter counts are the built-in GPT's;
* ``position: rope`` → ``--position-embedding-type rope --rotary-base <rope_theta>`` over the whole head
  (``--rotary-percent`` default 1.0). Megatron's default non-interleaved rotary (``rotary_interleaved`` False:
  ``_rotate_half`` in ``megatron/core/models/common/embeddings/rope_utils.py`` splits the head into halves,
  ``RotaryEmbedding.get_emb`` repeats the frequencies ``cat((f, f))``) pairs dimension i with i + head_dim/2, as
  Hugging Face Llama's ``rotate_half`` and the built-in GPT. ``--rotary-base`` is an ``int`` in the tag's parser,
  so a fractional ``rope_theta`` is refused for Megatron models (:mod:`clustertrain.megatron.rules`);
* ``rope_scaling`` → ``--use-rope-scaling --rope-scaling-factor F``: ``RotaryEmbedding._apply_scaling``
  (``megatron/core/models/common/embeddings/rotary_pos_embedding.py``) is Llama 3.1's with low_freq_factor 1,
  high_freq_factor 4 and original context 8192 fixed, and the tag's ``gpt_builders.py`` passes ``rope_scaling``
  but not the factor to ``GPTModel`` (default 8.0): only {factor 8, 1, 4, 8192} is expressible, anything else is
  refused. With ``megatron.transformer_impl: local`` rope renders ``--no-rope-fusion`` (the fused kernel is
  Transformer Engine's; ``TransformerConfig.__post_init__`` refuses the fusion without it);
* ``kv_heads`` below ``heads`` → ``--group-query-attention --num-query-groups <kv_heads>``; ``bias: false`` →
  ``--disable-bias-linear`` (Megatron's LayerNorm keeps its bias, as ours); ``norm_eps`` → ``--norm-epsilon``;
* ``zero_stage`` 1-3 → ``--use-distributed-optimizer`` (Megatron shards fp32 main weights and Adam states;
  parameters are not sharded); ``overlap_param_gather`` is rendered only with it (Megatron asserts that);
* ``recompute: selective`` → ``--recompute-activations`` (Megatron's selective = the attention core);
  ``full`` → ``--recompute-granularity full --recompute-method uniform --recompute-num-layers 1``;
* tokenizer ``byte`` → ``NullTokenizer --vocab-size 256``: Megatron's null tokenizer takes ids as they are and
  its end-of-document id is ``vocab_size`` = 256, the byte tokenizer's; a ``tokenizer.json`` →
  ``HuggingFaceTokenizer --tokenizer-model <its directory>``;
* ``model.vocab`` set → ``--padded-vocab-size`` (the embedding rows, as the built-in trainer); unset: Megatron
  pads the tokenizer's size to a multiple of 128 x tp itself;
* the preemption signal: ``--exit-signal-handler --exit-signal SIG<launch.signal>``: the batch script forwards
  Slurm's signal to every rank, Megatron saves and exits; ``--exit-duration-in-mins`` = (time limit - grace)
  in minutes, so Megatron saves and exits on its own before the time limit even if no signal comes;
* evaluation: ``--eval-iters 0`` when ``data.split`` has no validation part (Megatron would have nothing to read).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from clustertrain.megatron.config import BYTE_VOCAB_WITHOUT_EOD

if TYPE_CHECKING:
    from clustertrain.project import ModelEntry, Project



@dataclass(frozen=True)
class MegatronContext:
    """What the rendering reads besides the model entry: known at submit time."""

    project: "Project"
    entry: "ModelEntry"
    world: int
    run_dir: Path
    #: (weight, prefix) of each prepared source (one source: weight 1.0, rendered without a weight)
    data: tuple[tuple[float, Path], ...]
    tensorboard_dir: Path | None = None

    @property
    def dp(self) -> int:
        p = self.entry.parallelism
        return self.world // (p.tp * p.pp)

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"


def _tokenizer_type(c: MegatronContext) -> str:
    return "NullTokenizer" if c.entry.data.tokenizer == "byte" else "HuggingFaceTokenizer"


def tokenizer_dir(spec: str) -> Path | None:
    """The directory Megatron's HuggingFaceTokenizer loads for ``data.tokenizer`` (None for ``byte``)."""
    if spec == "byte":
        return None
    path = Path(spec.removeprefix("hf:"))
    return path if path.is_dir() else path.parent


def _tokenizer_dir(c: MegatronContext) -> str | None:
    found = tokenizer_dir(c.entry.data.tokenizer)
    return None if found is None else str(found)


def _valid_share(split: str) -> float:
    parts = [float(x) for x in split.replace("/", ",").split(",") if x.strip()]
    return parts[1] if len(parts) > 1 else 0.0


def _data_path(c: MegatronContext) -> list[str]:
    if len(c.data) == 1:
        return [str(c.data[0][1])]
    return [w for weight, prefix in c.data for w in (f"{weight:g}", str(prefix))]


def _exit_minutes(c: MegatronContext) -> int | None:
    from clustertrain.launch.config import launch_config_of

    limit = c.project.cluster.time_limit_seconds
    if limit is None:
        return None
    return max(1, (limit - launch_config_of(c.project).signal_grace_s) // 60)


def _exit_signal(c: MegatronContext) -> str:
    from clustertrain.launch.config import launch_config_of

    return f"SIG{launch_config_of(c.project).signal}"


@dataclass(frozen=True)
class Flag:
    """One rendered option: ``value(ctx)`` is None (omitted), True (a bare switch), a list (several words after
    the option) or a value."""

    option: str
    field: str
    value: Callable[[MegatronContext], Any]
    note: str = ""


def _on(flag: bool) -> bool | None:
    return True if flag else None


def _rope(c: MegatronContext) -> bool:
    return c.entry.model.position == "rope"


def _gqa(c: MegatronContext) -> bool:
    return c.entry.model.kv_head_count < c.entry.model.heads


def _tensorboard_dir(c: MegatronContext) -> str | None:
    return str(c.tensorboard_dir) if c.tensorboard_dir and c.project.monitor.trackers.tensorboard else None


def _wandb(c: MegatronContext, what: str) -> str | None:
    """Megatron's own W&B options (core_v0.16.1 ``megatron/training/global_vars.py`` ``_set_wandb_writer``: its last
    rank calls ``wandb.init(dir=, name=, project=, entity=)`` when ``--wandb-project`` is set; there is no MLflow
    option in that tag)."""
    w = c.project.monitor.trackers.wandb
    if w is None:
        return None
    return {"project": w.project or c.project.name, "name": c.entry.name, "entity": w.entity,
            "dir": str(w.dir or c.run_dir)}[what]


def tracker_environment(project: "Project", entry: "ModelEntry", run_dir: Path) -> dict[str, str]:
    """What Megatron's ``wandb.init`` does not take as an option, set through W&B's own variables (wandb 0.31
    ``wandb/env.py``): ``WANDB_MODE`` (offline), ``WANDB_RUN_GROUP`` (the group, default the project name), and
    ``WANDB_RUN_ID`` + ``WANDB_RESUME=allow`` so a requeued or resumed job continues the same W&B run: the id is
    derived from the run directory (same directory, same run)."""
    w = project.monitor.trackers.wandb
    if w is None:
        return {}
    import hashlib

    run_id = hashlib.sha256(str(Path(run_dir).absolute()).encode()).hexdigest()[:12]
    env = {"WANDB_RUN_GROUP": w.group or project.name, "WANDB_RUN_ID": run_id, "WANDB_RESUME": "allow"}
    if w.mode == "offline":
        env["WANDB_MODE"] = "offline"
    return env


FLAGS: tuple[Flag, ...] = (
    # --- architecture
    Flag("--num-layers", "model.layers", lambda c: c.entry.model.layers),
    Flag("--hidden-size", "model.hidden", lambda c: c.entry.model.hidden),
    Flag("--num-attention-heads", "model.heads", lambda c: c.entry.model.heads),
    Flag("--group-query-attention", "model.kv_heads", lambda c: _on(_gqa(c)), "below model.heads"),
    Flag("--num-query-groups", "model.kv_heads", lambda c: c.entry.model.kv_head_count if _gqa(c) else None,
         "below model.heads: the key/value heads"),
    Flag("--ffn-hidden-size", "model.ffn_hidden", lambda c: c.entry.model.ffn_dim,
         "the built-in GPT's width: ffn_hidden, else 4 x hidden (gelu) or Llama's rule from ffn_multiplier and "
         "ffn_multiple_of (swiglu)"),
    Flag("--seq-length", "model.seq_len", lambda c: c.entry.model.seq_len),
    Flag("--max-position-embeddings", "megatron.max_position_embeddings",
         lambda c: c.entry.megatron_options.max_position_embeddings or c.entry.model.seq_len, "default model.seq_len"),
    Flag("--position-embedding-type", "model.position", lambda c: "rope" if _rope(c) else "learned_absolute",
         "`learned` → learned_absolute, `rope` → rope"),
    Flag("--rotary-base", "model.rope_theta", lambda c: int(c.entry.model.rope_theta) if _rope(c) else None,
         "rope: an integer (Megatron's parser takes an int)"),
    Flag("--use-rope-scaling", "model.rope_scaling", lambda c: _on(_rope(c) and c.entry.model.rope_scaling is not None),
         "set: Llama 3.1's scaling (Megatron fixes low_freq_factor 1, high_freq_factor 4, original_context 8192)"),
    Flag("--rope-scaling-factor", "model.rope_scaling.factor",
         lambda c: c.entry.model.rope_scaling.factor if _rope(c) and c.entry.model.rope_scaling is not None else None,
         "set: 8 (the only factor pretrain_gpt.py builds at the tag)"),
    Flag("--no-rope-fusion", "megatron.transformer_impl",
         lambda c: _on(_rope(c) and c.entry.megatron_options.transformer_impl == "local"),
         "rope with `local`: the fused rotary kernel is Transformer Engine's"),
    Flag("--swiglu", "model.mlp", lambda c: _on(c.entry.model.mlp == "swiglu"), "swiglu"),
    Flag("--normalization", "model.norm", lambda c: "RMSNorm" if c.entry.model.norm == "rmsnorm" else "LayerNorm"),
    Flag("--norm-epsilon", "model.norm_eps", lambda c: c.entry.model.norm_eps),
    Flag("--disable-bias-linear", "model.bias", lambda c: _on(not c.entry.model.bias),
         "false (norms keep theirs: LayerNorm's bias stays)"),
    Flag("--untie-embeddings-and-output-weights", "model.tie_embeddings", lambda c: _on(not c.entry.model.tie_embeddings),
         "false"),
    Flag("--hidden-dropout", "model.dropout", lambda c: c.entry.model.dropout, "Megatron's default is 0.1"),
    Flag("--attention-dropout", "model.dropout", lambda c: c.entry.model.dropout),
    Flag("--init-method-std", "(built-in GPT)", lambda c: 0.02, "the built-in GPT's init"),
    Flag("--padded-vocab-size", "model.vocab", lambda c: c.entry.model.vocab,
         "when set; unset: Megatron pads the tokenizer's size to a multiple of 128 x tp"),
    # --- tokenizer and data
    Flag("--tokenizer-type", "data.tokenizer", _tokenizer_type, "`byte` → NullTokenizer, a tokenizer.json → HuggingFaceTokenizer"),
    Flag("--vocab-size", "data.tokenizer", lambda c: BYTE_VOCAB_WITHOUT_EOD if c.entry.data.tokenizer == "byte" else None,
         "`byte`: 256 (the null tokenizer's end-of-document id is 256, the byte tokenizer's)"),
    Flag("--tokenizer-model", "data.tokenizer", _tokenizer_dir, "a tokenizer.json: its directory"),
    Flag("--data-path", "data.source / data.blend", _data_path,
         "the prepared prefix, or `W1 P1 W2 P2 ...` for a blend"),
    Flag("--split", "data.split", lambda c: c.entry.data.split.replace("/", ",")),
    # --- parallel layout and precision
    Flag("--tensor-model-parallel-size", "parallelism.tp", lambda c: c.entry.parallelism.tp),
    Flag("--pipeline-model-parallel-size", "parallelism.pp", lambda c: c.entry.parallelism.pp),
    Flag("--num-virtual-stages-per-pipeline-rank", "parallelism.virtual_stages",
         lambda c: c.entry.parallelism.virtual_stages if c.entry.parallelism.virtual_stages > 1 else None, "when > 1"),
    Flag("--sequence-parallel", "parallelism.sequence_parallel", lambda c: _on(c.entry.parallelism.sequence_parallel), "true"),
    Flag("--recompute-activations", "parallelism.recompute",
         lambda c: _on(c.entry.parallelism.recompute == "selective"), "selective"),
    Flag("--recompute-granularity", "parallelism.recompute",
         lambda c: "full" if c.entry.parallelism.recompute == "full" else None,
         "full (with --recompute-method uniform --recompute-num-layers 1)"),
    Flag("--recompute-method", "parallelism.recompute",
         lambda c: "uniform" if c.entry.parallelism.recompute == "full" else None, "full"),
    Flag("--recompute-num-layers", "parallelism.recompute",
         lambda c: 1 if c.entry.parallelism.recompute == "full" else None, "full"),
    Flag("--use-distributed-optimizer", "parallelism.zero_stage", lambda c: _on(c.entry.parallelism.zero_stage >= 1),
         "1, 2 or 3"),
    Flag("--overlap-grad-reduce", "megatron.overlap_grad_reduce", lambda c: _on(c.entry.megatron_options.overlap_grad_reduce),
         "true"),
    Flag("--overlap-param-gather", "megatron.overlap_param_gather",
         lambda c: _on(c.entry.megatron_options.overlap_param_gather and c.entry.parallelism.zero_stage >= 1),
         "true, with the distributed optimizer (zero_stage >= 1)"),
    Flag("--bf16", "parallelism.param_dtype", lambda c: _on(c.entry.parallelism.param_dtype != "fp32"),
         "auto or bf16 (Megatron trains on GPUs)"),
    Flag("--grad-reduce-in-bf16", "parallelism.reduce_dtype", lambda c: _on(c.entry.parallelism.reduce_dtype == "bf16"),
         "bf16"),
    Flag("--transformer-impl", "megatron.transformer_impl", lambda c: c.entry.megatron_options.transformer_impl),
    # --- optimisation and schedule
    Flag("--micro-batch-size", "training.micro_batch", lambda c: c.entry.training.micro_batch),
    Flag("--global-batch-size", "training.global_batch", lambda c: c.entry.training.global_batch),
    Flag("--train-iters", "training.max_steps", lambda c: c.entry.training.max_steps),
    Flag("--lr", "training.lr", lambda c: c.entry.training.lr),
    Flag("--min-lr", "training.min_lr", lambda c: c.entry.training.min_lr),
    Flag("--lr-warmup-iters", "training.warmup_steps", lambda c: c.entry.training.warmup_steps),
    Flag("--lr-decay-style", "training.schedule", lambda c: c.entry.training.schedule),
    Flag("--lr-decay-iters", "training.max_steps", lambda c: c.entry.training.max_steps, "decay over the whole run"),
    Flag("--weight-decay", "training.weight_decay", lambda c: c.entry.training.weight_decay),
    Flag("--adam-beta1", "training.beta1", lambda c: c.entry.training.beta1),
    Flag("--adam-beta2", "training.beta2", lambda c: c.entry.training.beta2),
    Flag("--adam-eps", "training.eps", lambda c: c.entry.training.eps),
    Flag("--clip-grad", "training.grad_clip", lambda c: c.entry.training.grad_clip, "0 = off"),
    Flag("--seed", "training.seed", lambda c: c.entry.training.seed),
    # --- checkpoints, logging, stop
    Flag("--save", "(run directory)", lambda c: str(c.checkpoints), "RUN_DIR/checkpoints"),
    Flag("--load", "(run directory)", lambda c: str(c.checkpoints), "RUN_DIR/checkpoints (resumes from the latest)"),
    Flag("--save-interval", "training.checkpoint_every", lambda c: c.entry.training.checkpoint_every),
    Flag("--log-interval", "training.log_every", lambda c: c.entry.training.log_every),
    Flag("--log-throughput", "(metrics)", lambda c: True, "TFLOP/s per GPU in each iteration line"),
    Flag("--eval-interval", "megatron.eval_interval", lambda c: c.entry.megatron_options.eval_interval),
    Flag("--eval-iters", "megatron.eval_iters",
         lambda c: c.entry.megatron_options.eval_iters if _valid_share(c.entry.data.split) > 0 else 0,
         "0 when data.split has no validation part"),
    Flag("--tensorboard-dir", "storage.tensorboard", _tensorboard_dir, "unless monitor.trackers.tensorboard: false"),
    Flag("--wandb-project", "monitor.trackers.wandb.project", lambda c: _wandb(c, "project"),
         "default: the project name; W&B from Megatron's last rank"),
    Flag("--wandb-exp-name", "(model name)", lambda c: _wandb(c, "name"), "with monitor.trackers.wandb"),
    Flag("--wandb-save-dir", "monitor.trackers.wandb.dir", lambda c: _wandb(c, "dir"), "default: RUN_DIR"),
    Flag("--wandb-entity", "monitor.trackers.wandb.entity", lambda c: _wandb(c, "entity")),
    Flag("--exit-signal-handler", "launch.signal", lambda c: True, "the stop signal saves and exits"),
    Flag("--exit-signal", "launch.signal", _exit_signal, "SIG + launch.signal"),
    Flag("--exit-duration-in-mins", "cluster.time_limit", _exit_minutes, "(time limit - launch.signal_grace_s) / 60"),
    Flag("--log-straggler", "megatron.log_straggler", lambda c: _on(c.entry.megatron_options.log_straggler), "true"),
)


def _words(option: str, value: Any) -> list[str]:
    if value is None or value is False:
        return []
    if value is True:
        return [option]
    if isinstance(value, (list, tuple)):
        return [option, *map(str, value)]
    if isinstance(value, float):
        return [option, repr(value)]
    return [option, str(value)]


def megatron_args(ctx: MegatronContext) -> list[str]:
    """The ``pretrain_gpt.py`` arguments of ``ctx.entry``: :data:`FLAGS`, then ``megatron.extra_args``."""
    out: list[str] = []
    for flag in FLAGS:
        out += _words(flag.option, flag.value(ctx))
    return out + list(ctx.entry.megatron_options.extra_args)


def rendered_options() -> dict[str, str]:
    """Every option clustertrain renders → the project field it comes from."""
    return {f.option: f.field for f in FLAGS}


def flag_table() -> list[tuple[str, str, str]]:
    """(option, project field, when / how) for docs/megatron.md."""
    return [(f.option, f.field, f.note) for f in FLAGS]


def rank_environment(entry: "ModelEntry") -> dict[str, str]:
    """Variables Megatron's ranks need besides the NCCL preset: ``CUDA_DEVICE_MAX_CONNECTIONS=1`` with tensor
    parallelism (Megatron asserts it before Blackwell, so the tp communication kernels are scheduled before
    the compute they overlap). Megatron-LM itself needs no PYTHONPATH: ``python <path>/pretrain_gpt.py`` puts
    ``<path>`` first on ``sys.path``."""
    return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if entry.parallelism.tp > 1 else {}


#: the per-rank wrapper: Megatron initialises torch.distributed from torchrun's variables, which srun does not
#: set; each task sets them from its own SLURM_* values (one shell per rank), then becomes the command.
RANK_WRAPPER = ('export RANK="$SLURM_PROCID" WORLD_SIZE="$SLURM_NTASKS" LOCAL_RANK="$SLURM_LOCALID" '
                'LOCAL_WORLD_SIZE="${SLURM_NTASKS_PER_NODE%%(*}" GROUP_RANK="$SLURM_NODEID"; exec "$@"')


def rank_command(python: str, entry: "ModelEntry", args: list[str]) -> list[str]:
    """What ``srun`` starts on every rank: ``bash -c RANK_WRAPPER megatron-rank python <path>/pretrain_gpt.py ARGS``
    (unquoted words; the batch script quotes each)."""
    script = f"{entry.megatron_options.path.rstrip('/')}/pretrain_gpt.py"
    return ["bash", "-c", RANK_WRAPPER, "megatron-rank", python, script, *args]


def command_line(words: list[str]) -> str:
    """One shell line of ``words`` (each quoted) — for logs and ``submit --dry-run``."""
    return " ".join(shlex.quote(w) for w in words)


def flag_table_markdown() -> str:
    """The mapping table of docs/megatron.md (between its ``<!-- flags -->`` markers; a test keeps them equal)."""
    rows = ["| Megatron-LM option | from | when / how |", "|---|---|---|"]
    rows += [f"| `{option}` | `{field}` | {note.replace('|', '/')} |" for option, field, note in flag_table()]
    return "\n".join(rows) + "\n"
