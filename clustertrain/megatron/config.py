"""Project-file section owned by the Megatron-LM adapter: ``models[].megatron`` (:class:`MegatronConfig`).

Only what Megatron-LM has and the built-in trainer does not lives here; the architecture, training and
parallel layout of a Megatron model are the same ``models[].model`` / ``training`` / ``parallelism``
sections as for the built-in trainer (:mod:`clustertrain.megatron.args` maps them to flags). Pure pydantic.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from clustertrain.core.schema import StrictModel

#: the Megatron-LM release clustertrain renders for (flags, log format, checkpoint layout); the image clones it
MEGATRON_TAG = "core_v0.16.1"
MEGATRON_COMMIT = "55ac7082517c3878ae653c07c09c534b8aed49f6"
MEGATRON_REPO = "https://github.com/NVIDIA/Megatron-LM.git"
#: where the image puts the clone (``models[].megatron.path`` default)
MEGATRON_PATH = "/opt/megatron-lm"

FRAMEWORKS = ("clustertrain", "megatron")

#: Megatron's null tokenizer with this --vocab-size has its end-of-document id where the byte tokenizer has it
BYTE_VOCAB_WITHOUT_EOD = 256


class MegatronConfig(StrictModel):
    path: str = Field(
        MEGATRON_PATH, description="Megatron-LM's directory on the nodes (inside the image): the ranks run "
        "`<path>/pretrain_gpt.py` with `<path>` on PYTHONPATH. The image `clustertrain image build` writes clones "
        f"tag {MEGATRON_TAG} there when a model uses `framework: megatron`.",
    )
    transformer_impl: Literal["transformer_engine", "local"] = Field(
        "transformer_engine", description="`--transformer-impl`: `transformer_engine` (fused kernels, needs Transformer "
        "Engine in the image) or `local` (plain PyTorch layers).",
    )
    overlap_grad_reduce: bool = Field(
        True, description="`--overlap-grad-reduce`: reduce gradients bucket by bucket during backward (data-parallel > 1).")
    overlap_param_gather: bool = Field(
        True, description="`--overlap-param-gather`: gather the distributed optimizer's updated parameters during the next "
        "forward (needs `overlap_grad_reduce` and `parallelism.zero_stage` >= 1).",
    )
    max_position_embeddings: int | None = Field(
        None, ge=8, description="`--max-position-embeddings` (learned absolute positions, as the built-in GPT). Default: "
        "`model.seq_len`; must not be below it.",
    )
    eval_interval: int = Field(1000, ge=1, description="`--eval-interval` in iterations (used when `data.split` has a "
                               "validation part; otherwise evaluation is off: `--eval-iters 0`).")
    eval_iters: int = Field(10, ge=0, description="`--eval-iters`: validation iterations per evaluation.")
    log_straggler: bool = Field(False, description="`--log-straggler`: Megatron's straggler detector reports slow ranks.")
    extra_args: list[str] = Field(
        default_factory=list, description="More `pretrain_gpt.py` arguments, as a list of words (`[\"--use-flash-attn\"]`, "
        "`[\"--attention-dropout\", \"0.0\"]`). Each option must be one Megatron-LM's parser accepts at "
        f"{MEGATRON_TAG}, and not one clustertrain renders from the project (set that field instead).",
    )

    @field_validator("extra_args")
    @classmethod
    def _words(cls, v: list[str]) -> list[str]:
        for word in v:
            if any(c in word for c in "\n\r\0"):
                raise ValueError(f"extra_args word {word!r} contains a newline or NUL; pass each argument as one list item")
        return v

    @model_validator(mode="after")
    def _check(self) -> "MegatronConfig":
        if self.overlap_param_gather and not self.overlap_grad_reduce:
            raise ValueError("overlap_param_gather needs overlap_grad_reduce (Megatron asserts it); set both or neither")
        return self


def structure_problems(arch: Any, par: Any, mg: MegatronConfig) -> list[tuple[str, str]]:
    """(field, problem) for a Megatron model (its ``model``, ``parallelism`` and ``megatron`` sections) that
    Megatron would refuse on any cluster: the rule table of :mod:`clustertrain.megatron.rules`. Pure: ``Project``
    validation runs it on every ``framework: megatron`` model, so it lives with the section it checks."""
    out: list[tuple[str, str]] = []
    if arch.layers % par.pp:
        out.append(("parallelism.pp", f"pp={par.pp} does not divide model.layers={arch.layers} (Megatron gives each "
                                      f"pipeline stage the same number of layers); valid pp: {_divisors(arch.layers)}"))
    elif par.virtual_stages > 1 and (arch.layers // par.pp) % par.virtual_stages:
        per = arch.layers // par.pp
        out.append(("parallelism.virtual_stages", f"virtual_stages={par.virtual_stages} does not divide the {per} layers "
                                                  f"of each pipeline stage; valid: {_divisors(per)}"))
    if par.pp > 1 and par.schedule == "gpipe":
        out.append(("parallelism.schedule", "gpipe is the built-in trainer's; Megatron-LM runs 1f1b (interleaved_1f1b with "
                                            "virtual_stages > 1): set schedule: 1f1b"))
    if par.compile:
        out.append(("parallelism.compile", "compile is the built-in trainer's (torch.compile per block); Megatron-LM "
                                           "uses its own fused kernels: remove compile"))
    out += _rope_problems(arch)
    max_pos = mg.max_position_embeddings
    if max_pos is not None and arch.seq_len > max_pos:
        out.append(("megatron.max_position_embeddings", f"{max_pos} is below model.seq_len={arch.seq_len} (Megatron "
                                                        "asserts seq_length <= max_position_embeddings); raise it or "
                                                        "remove it (default: seq_len)"))
    return out


#: the one Llama 3.1 scaling pretrain_gpt.py builds at the tag: ``RotaryEmbedding._apply_scaling`` fixes
#: low_freq_factor 1, high_freq_factor 4 and original context 8192 (megatron/core/models/common/embeddings/
#: rotary_pos_embedding.py), and gpt_builders.py does not pass ``--rope-scaling-factor`` on (GPTModel's default 8)
MEGATRON_ROPE_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_context": 8192}


def _rope_problems(arch: Any) -> list[tuple[str, str]]:
    if arch.position != "rope":
        return []
    out: list[tuple[str, str]] = []
    if arch.rope_theta != int(arch.rope_theta):
        out.append(("model.rope_theta", f"{arch.rope_theta} is not a whole number, and Megatron-LM's --rotary-base takes "
                                        f"an integer at {MEGATRON_TAG}; use {round(arch.rope_theta)}"))
    scaling = arch.rope_scaling
    if scaling is not None:
        wrong = {k: getattr(scaling, k) for k, v in MEGATRON_ROPE_SCALING.items() if getattr(scaling, k) != v}
        if wrong:
            fixed = ", ".join(f"{k} {v:g}" for k, v in MEGATRON_ROPE_SCALING.items())
            given = ", ".join(f"{k} {v:g}" for k, v in wrong.items())
            out.append(("model.rope_scaling", f"Megatron-LM {MEGATRON_TAG} builds only Llama 3.1's scaling ({fixed}), "
                                              f"not {given}; use those values, drop rope_scaling, or framework: clustertrain"))
    return out


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
