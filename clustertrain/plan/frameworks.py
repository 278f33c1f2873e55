"""What each training framework can do, as data: a model's ``parallelism`` section is planned only
when its framework implements it; a setting it lacks makes the model infeasible, naming the field
(the trainer would refuse it too — the planner never plans a run that cannot start).

A model's framework is ``models[].framework``:

* ``clustertrain`` — the built-in trainer (``clustertrain.train``, :data:`BUILTIN`): DDP
  (``zero_stage: 0``) or FSDP2 full sharding (``zero_stage: 3``), tensor parallelism of any degree
  that splits the model (:func:`clustertrain.core.parallel_layout.structure_problems`) with sequence
  parallelism, any pp up to the layers (``torch.distributed.pipelining``: an uneven split by compute when pp does
  not divide them, :func:`clustertrain.core.parallel_layout.pipeline_problems`) with ``gpipe``, ``1f1b`` or interleaved
  virtual stages, activation recomputation ``none``/``selective``/``full``,
  bf16 or fp32 compute over fp32 master weights, attention through ``scaled_dot_product_attention``
  (flash kernels on GPU);
* ``megatron`` — Megatron-LM's ``pretrain_gpt.py`` (:data:`MEGATRON`): ``zero_stage`` 0 (DDP) or 1-3
  (its distributed optimizer), any tp, any pp that divides the layers with interleaved virtual
  stages, the same recomputation modes and sequence parallelism. Its memory and step time follow
  Megatron's own arithmetic (:mod:`clustertrain.plan.megatron_memory`), not the built-in trainer's.

To add a framework: add a :class:`Framework` to :data:`FRAMEWORKS` and return it from
:func:`framework_of` for the models that use it (its memory model: :func:`clustertrain.plan.allocate.evaluate`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Framework:
    """The ``parallelism`` settings a framework implements."""

    name: str
    description: str
    zero_stages: tuple[int, ...]          # 0 = replicate (DDP), 3 = full shard (FSDP2)
    max_tp: int | None                    # largest tensor-parallel degree; None = any that splits the model
    pp: tuple[int, ...] | None            # pipeline-parallel degrees; (1,) = none, None = any the model splits into
    recompute: tuple[str, ...]            # none | selective | full
    sequence_parallel: bool
    param_dtypes: tuple[str, ...]         # compute dtypes: bf16 | fp32
    flash_attention: bool                 # attention without the s x s score matrix on GPU
    virtual_stages: bool = False          # interleaved pipeline stages (parallelism.virtual_stages > 1)

    def problems(self, par: Any, param_dtype: str) -> list[tuple[str, str]]:
        """(field, problem) for each setting of ``par`` (a ``ParallelismConfig``; ``param_dtype`` resolved)
        that this framework does not implement."""
        out = []

        def lacks(field: str, value: Any, offers: str) -> None:
            out.append((f"parallelism.{field}", f"{field} {_show(value)} is not implemented by the {self.name} "
                                                f"framework ({offers})"))

        if par.zero_stage not in self.zero_stages:
            lacks("zero_stage", par.zero_stage, "zero_stage: " + " or ".join(map(str, self.zero_stages)))
        if self.max_tp is not None and par.tp > self.max_tp:
            lacks("tp", par.tp, f"tp up to {self.max_tp}")
        if self.pp is not None and par.pp not in self.pp:
            lacks("pp", par.pp, "pp: " + " or ".join(map(str, self.pp)))
        if par.virtual_stages > 1 and not self.virtual_stages:
            lacks("virtual_stages", par.virtual_stages, "no interleaved pipeline stages")
        if par.recompute not in self.recompute:
            lacks("recompute", par.recompute, "recompute: " + " | ".join(self.recompute))
        if par.sequence_parallel and not self.sequence_parallel:
            lacks("sequence_parallel", True, "no sequence parallelism")
        if param_dtype not in self.param_dtypes:
            lacks("param_dtype", param_dtype, "param_dtype: " + " | ".join(self.param_dtypes))
        return out

    def offers_tp(self, tp: int) -> bool:
        return self.max_tp is None or tp <= self.max_tp

    def summary(self) -> str:
        """``zero_stage 0/3, tp any, pp 1, recompute none/selective/full, sequence parallel, bf16/fp32 params``."""
        tp = "any" if self.max_tp is None else ("1" if self.max_tp == 1 else f"up to {self.max_tp}")
        pp = "any" if self.pp is None else "/".join(map(str, self.pp))
        pp += " (virtual stages)" if self.virtual_stages else ""
        return (f"zero_stage {'/'.join(map(str, self.zero_stages))}, tp {tp}, pp {pp}, "
                f"recompute {'/'.join(self.recompute)}{', sequence parallel' if self.sequence_parallel else ''}, "
                f"{'/'.join(self.param_dtypes)} params")


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


BUILTIN = Framework(
    name="builtin",
    description="the built-in trainer (clustertrain.train): DDP or FSDP2, DTensor tensor/sequence parallelism, "
                "torch.distributed.pipelining stages (gpipe, 1F1B, interleaved), activation checkpointing, fp32 master "
                "weights and AdamW states",
    zero_stages=(0, 3), max_tp=None, pp=None, recompute=("none", "selective", "full"), sequence_parallel=True,
    param_dtypes=("bf16", "fp32"), flash_attention=True, virtual_stages=True,
)

MEGATRON = Framework(
    name="megatron",
    description="Megatron-LM core_v0.16.1 (pretrain_gpt.py): bf16 weights over fp32 main weights, gradients and Adam "
                "states, the distributed optimizer with zero_stage >= 1, tensor/sequence/pipeline parallelism (1F1B, "
                "interleaved with virtual stages)",
    zero_stages=(0, 1, 2, 3), max_tp=None, pp=None, recompute=("none", "selective", "full"), sequence_parallel=True,
    param_dtypes=("bf16", "fp32"), flash_attention=True, virtual_stages=True,
)

FRAMEWORKS: dict[str, Framework] = {BUILTIN.name: BUILTIN, MEGATRON.name: MEGATRON}


def framework_of(entry: Any) -> Framework:
    """The framework that trains ``entry`` (a project ``ModelEntry``): :data:`MEGATRON` for ``framework: megatron``,
    else the built-in trainer."""
    return MEGATRON if getattr(entry, "framework", "clustertrain") == "megatron" else BUILTIN
