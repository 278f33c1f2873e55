"""What each training framework can do, as data: the planner computes a model's plan for what its
framework implements, never for a setting the framework lacks.

A model's framework today is always the built-in trainer (``clustertrain.train``): DDP over every
rank, fp32 weights, gradients and AdamW states with bf16 autocast on GPU, no tensor or pipeline
parallelism, no activation recomputation, attention through ``scaled_dot_product_attention`` (flash
kernels on GPU). When a model asks for more in its plan (``plan.zero_stage: 1``, ``models[].plan.tp: 2``,
``plan.bf16_weights: bf16``...) the planner plans with what the framework does and says so, one
:class:`Adjustment` per setting (see :func:`effective_settings`).

To add a framework (the FSDP2/TP trainer issue): add a :class:`Framework` to :data:`FRAMEWORKS` and
return it from :func:`framework_of` for the models that use it; nothing else in the planner changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Framework:
    """The settings a framework implements; the first entry of each tuple is what it does by default."""

    name: str
    description: str
    zero_stages: tuple[int, ...]          # optimizer/gradient/parameter sharding stages (0 = DDP)
    tp: tuple[int, ...]                   # tensor-parallel degrees; (1,) = none
    pp: tuple[int, ...]                   # pipeline-parallel degrees; (1,) = none
    weights: tuple[str, ...]              # bf16 training: "fp32" (fp32 weights under autocast) or "bf16" (+ fp32 master)
    recompute: tuple[str, ...]            # none | selective | full
    sequence_parallel: bool
    flash_attention: bool                 # attention without the s x s score matrix on GPU

    def supports(self, setting: str, value: Any) -> bool:
        allowed = {"zero_stage": self.zero_stages, "tp": self.tp, "pp": self.pp, "bf16_weights": self.weights,
                   "recompute": self.recompute, "sequence_parallel": (False, True) if self.sequence_parallel else (False,)}
        return value in allowed[setting]

    def default(self, setting: str) -> Any:
        return {"zero_stage": self.zero_stages[0], "tp": self.tp[0], "pp": self.pp[0], "bf16_weights": self.weights[0],
                "recompute": self.recompute[0], "sequence_parallel": False}[setting]

    def lacks(self) -> str:
        """What the framework does not offer, for hints ("ZeRO/FSDP sharding, tensor parallelism...")."""
        missing = []
        if max(self.zero_stages) == 0:
            missing.append("ZeRO/FSDP sharding")
        if self.tp == (1,):
            missing.append("tensor parallelism")
        if self.pp == (1,):
            missing.append("pipeline parallelism")
        if self.recompute == ("none",):
            missing.append("activation recomputation")
        return ", ".join(missing[:-1]) + (" or " if len(missing) > 1 else "") + missing[-1] if missing else ""


BUILTIN = Framework(
    name="builtin",
    description="the built-in trainer (clustertrain.train): DDP, fp32 weights and AdamW states, bf16 autocast on GPU",
    zero_stages=(0,), tp=(1,), pp=(1,), weights=("fp32",), recompute=("none",), sequence_parallel=False,
    flash_attention=True,
)

FRAMEWORKS: dict[str, Framework] = {BUILTIN.name: BUILTIN}

#: the settings a plan may ask for, with the project-file field that asks (``{model}`` = the model's index)
SETTINGS = {
    "zero_stage": ("models[{i}].plan.zero_stage", "plan.zero_stage"),
    "tp": ("models[{i}].plan.tp", "models[{i}].parallelism.tp"),
    "pp": ("models[{i}].plan.pp", "models[{i}].parallelism.pp"),
    "recompute": ("models[{i}].plan.recompute", "plan.recompute"),
    "sequence_parallel": ("models[{i}].plan.sequence_parallel", "plan.sequence_parallel"),
    "bf16_weights": (None, "plan.bf16_weights"),
}


def framework_of(entry: Any) -> Framework:
    """The framework that trains ``entry`` (a project ``ModelEntry``). Today every model uses the built-in trainer."""
    return BUILTIN


@dataclass(frozen=True)
class Adjustment:
    """A planned setting the framework lacks: ``field`` asked for ``asked``; the plan uses ``used``."""

    model: str
    field: str
    asked: Any
    used: Any
    framework: str

    def __str__(self) -> str:
        return (f"{self.field}: {_show(self.asked)} is not implemented by the {self.framework} framework; "
                f"planned with {_show(self.used)}")


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def effective_settings(project: Any, index: int, entry: Any) -> tuple[Framework, dict[str, Any], list[Adjustment]]:
    """The settings the plan computes with for model ``index``: each asked-for value the framework
    implements, else the framework's own; an :class:`Adjustment` for every value replaced. A value
    is "asked for" when the project file sets it (a default the framework lacks is not reported)."""
    fw = framework_of(entry)
    mp, pc, par = entry.plan, project.plan, entry.parallelism
    asked: dict[str, tuple[Any, str | None]] = {}
    for setting, (model_field, project_field) in SETTINGS.items():
        model_value = getattr(mp, setting, None) if model_field else None
        if model_value is not None:
            asked[setting] = (model_value, model_field.format(i=index))
        elif setting in ("tp", "pp"):
            value = getattr(par, setting)
            asked[setting] = (value, project_field.format(i=index) if value != 1 else None)
        else:
            value = getattr(pc, setting)
            asked[setting] = (value, project_field if value is not None and setting in pc.model_fields_set else None)
    used: dict[str, Any] = {}
    adjustments: list[Adjustment] = []
    for setting, (value, field) in asked.items():
        if value is not None and fw.supports(setting, value):
            used[setting] = value
            continue
        used[setting] = fw.default(setting)
        if field is not None and value is not None:
            adjustments.append(Adjustment(entry.name, field, value, used[setting], fw.name))
    return fw, used, adjustments
